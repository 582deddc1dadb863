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
import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.fixture
def stuck():
    # A child of its own session, as a test's program would start one: the watchdog
    # kills it with the worker (its pid goes to the file CHILD_PID names).
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    with open(os.environ["CHILD_PID"], "a") as out:
        out.write(f"{child.pid}\\n")
    yield
    # pytest-timeout's SIGALRM cannot reach us now, as in a thread stuck in C code.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)


def test_hangs_in_teardown(stuck):
    assert True


def test_after_it():
    assert True
"""


OTHER = """
def test_a():
    assert True


def test_b():
    assert True
"""


def test_a_hang_in_a_fixture_teardown_fails_with_every_stack(tmp_path: Path) -> None:
    """Without xdist, and with it as the suite runs it (pyproject.toml's addopts: two
    workers, loadfile, no worker restart), side by side. With xdist the run must end: a
    replaced worker made pytest-xdist's loadfile scheduling deadlock at the end of the
    run (pytest-dev/pytest-xdist#1378), a hang the watchdog itself caused."""
    (tmp_path / "test_hang.py").write_text(HANGING)
    (tmp_path / "test_other.py").write_text(OTHER)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),
        "EZFLOW_TEST_WATCHDOG_GRACE": "1",
        "CHILD_PID": str(tmp_path / "child-pids"),
    }
    suite = ("-n", "2", "--dist", "loadfile", "--max-worker-restart", "0")
    started = time.monotonic()
    runs = {
        name: subprocess.Popen(
            [
                *(sys.executable, "-m", "pytest", "-p", "_watchdog", "-p", "no:cacheprovider"),
                *("-o", "timeout=2", *options, "--rootdir", str(tmp_path)),
                str(tmp_path / "test_hang.py"),
                str(tmp_path / "test_other.py"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for name, options in (("plain", ("-n", "0")), ("xdist", suite))
    }
    try:
        outputs = {name: run.communicate(timeout=60)[0] for name, run in runs.items()}
    finally:
        for run in runs.values():
            run.kill()
            run.communicate()
    took = time.monotonic() - started
    assert took < 30, f"the hang lasted {took:.0f} s"
    for name, output in outputs.items():
        assert runs[name].returncode != 0, output
        assert "+++ test watchdog: test test_hang.py::test_hangs_in_teardown has not" in output
        assert "most recent call first" in output and "in stuck" in output, output
    # xdist reports the crash as a failure; the other worker's file still runs.
    assert "worker 'gw0' crashed while running" in outputs["xdist"] or (
        "worker 'gw1' crashed while running" in outputs["xdist"]
    ), outputs["xdist"]
    assert "worker restarting disabled" in outputs["xdist"], outputs["xdist"]
    assert "1 failed, 3 passed" in outputs["xdist"], outputs["xdist"]
    # The child each hung test started (in a session of its own) went with it.
    pids = [int(line) for line in (tmp_path / "child-pids").read_text().split()]
    assert len(pids) == 2, pids
    for output in outputs.values():
        assert "+++ test watchdog: killed the processes it started: [" in output, output
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline, f"children of the hung tests still run: {pids}"
        time.sleep(0.05)


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
