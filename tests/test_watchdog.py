"""The suite's watchdog (tests/_watchdog.py): a hang that pytest-timeout cannot break -
here a fixture teardown that blocks SIGALRM and sleeps, as a thread stuck in C does -
becomes a failure with every thread's stack, within the test's timeout plus the grace."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import ClosingUvloop, uvloop

HANGING = """
import signal
import time

import pytest


@pytest.fixture
def stuck():
    yield
    # pytest-timeout's SIGALRM cannot reach us now, as in a thread stuck in C code.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)


def test_hangs_in_teardown(stuck):
    assert True


def test_after_it():
    assert True
"""


def test_a_hang_in_a_fixture_teardown_fails_with_every_stack(tmp_path: Path) -> None:
    """With xdist (as the suite runs) and without, side by side."""
    (tmp_path / "test_hang.py").write_text(HANGING)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),
        "EZFLOW_TEST_WATCHDOG_GRACE": "3",
    }
    started = time.monotonic()
    runs = {
        workers: subprocess.Popen(
            [
                *(sys.executable, "-m", "pytest", "-p", "_watchdog", "-p", "no:cacheprovider"),
                *("-o", "timeout=2", "-n", workers, "--rootdir", str(tmp_path)),
                str(tmp_path / "test_hang.py"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for workers in ("0", "1")
    }
    try:
        outputs = {workers: run.communicate(timeout=60)[0] for workers, run in runs.items()}
    finally:
        for run in runs.values():
            run.kill()
            run.communicate()
    took = time.monotonic() - started
    assert took < 30, f"the hang lasted {took:.0f} s"
    for workers, output in outputs.items():
        assert runs[workers].returncode != 0, output
        assert "+++ test watchdog: test test_hang.py::test_hangs_in_teardown has not" in output
        assert "most recent call first" in output and "in stuck" in output, output
    # xdist reports the crash as a failure and goes on with a new worker (the hung
    # test's call passed: its teardown is the failure).
    assert "worker 'gw0' crashed while running" in outputs["1"], outputs["1"]
    assert "1 failed, 2 passed" in outputs["1"], outputs["1"]


@pytest.mark.skipif(uvloop is None, reason="uvloop is not installed")
def test_a_leaked_uvloop_server_fails_loudly_instead_of_hanging_loop_close() -> None:
    """What hung the suite: a listening server left open (a failed graph-server start
    did that) made uvloop's close() spin forever under warnings-as-errors."""

    async def leak() -> None:
        await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)

    loop = ClosingUvloop()
    loop.run_until_complete(leak())
    started = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ResourceWarning, match="unclosed resource <TCPServer"):
            loop.close()
    assert loop.is_closed() and time.monotonic() - started < 5
