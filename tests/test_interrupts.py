"""A Ctrl-C that Python swallows is not lost (ezflow/_core/_interrupts.py).

A SIGINT handler's exception raised inside a weakref callback (importlib's module locks
have one, so any import can be there) is printed as "Exception ignored" and the program
goes on. These tests put a Ctrl-C exactly there: a weakref callback that raises SIGINT,
fired at a chosen moment, in a child process (signals are the main thread's).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import without_shm_notices

ROOT = Path(__file__).resolve().parent.parent

#: Defines swallowed_ctrl_c(): a Ctrl-C whose handler runs inside a weakref callback.
SWALLOW = """
import signal, weakref

class _Doomed:
    pass

def swallowed_ctrl_c():
    doomed = _Doomed()
    ref = weakref.ref(doomed, lambda _: signal.raise_signal(signal.SIGINT))
    del doomed  # the callback runs here; what the handler raises in it is swallowed
    return ref
"""


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SWALLOW) + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def test_python_itself_loses_a_ctrl_c_raised_in_a_weakref_callback() -> None:
    # What the latch is for: with Python's own handler, the program goes on.
    result = _run("""
        swallowed_ctrl_c()
        print("went on")
    """)
    assert result.returncode == 0 and result.stdout == "went on\n"
    assert "Exception ignored" in result.stderr and "KeyboardInterrupt" in result.stderr


def test_the_latch_raises_a_swallowed_ctrl_c_again_when_restored_and_prints_nothing() -> None:
    result = _run("""
        from ezflow._core._interrupts import InterruptLatch
        latch = InterruptLatch(lambda: SystemExit(130))
        assert latch.install()
        swallowed_ctrl_c()
        print("went on", latch.interrupted)
        latch.restore()
        print("not reached")
    """)
    assert result.returncode == 130, result.stderr
    assert result.stdout == "went on True\n"
    assert without_shm_notices(result.stderr) == ""


def test_a_ctrl_c_swallowed_while_ezflow_imports_exits_130_quietly() -> None:
    # The failure CI met: a Ctrl-C while ezflow imported, swallowed by importlib's
    # module-lock callback, and the program ran on. Here the callback fires when
    # ezflow's import reaches numpy (an import hook drops the last reference).
    result = _run("""
        import sys
        held = [None]

        class Finder:
            def find_spec(self, name, path=None, target=None):
                if name == "numpy" and held[0] is None:
                    held[0] = swallowed_ctrl_c()
                return None

        sys.meta_path.insert(0, Finder())
        import ezflow
        print("imported")
    """)
    assert result.returncode == 130, result.stderr
    assert result.stdout == ""
    assert without_shm_notices(result.stderr) == ""


def test_the_latch_stays_out_of_the_way_where_it_does_not_apply() -> None:
    # A program with a SIGINT handler of its own keeps it while ezflow imports.
    result = _run("""
        import signal
        seen = []
        signal.signal(signal.SIGINT, lambda *_: seen.append(1))
        import ezflow
        assert signal.getsignal(signal.SIGINT).__name__ == "<lambda>"
        signal.raise_signal(signal.SIGINT)
        print("handled", seen)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "handled [1]\n"


def test_ezflow_run_takes_over_a_ctrl_c_swallowed_before_it_started() -> None:
    # ezflow run's latch holds a Ctrl-C swallowed while the target imported; run()
    # takes it over: the graph stops before it starts, with the one line a first
    # Ctrl-C prints.
    result = _run("""
        import ezflow
        from ezflow._core._interrupts import InterruptLatch

        class Forever(ezflow.Unit):
            @ezflow.task
            async def spin(self):
                import asyncio
                while True:
                    await asyncio.sleep(1)

        with InterruptLatch(KeyboardInterrupt).installed() as latch:
            swallowed_ctrl_c()
            assert latch.interrupted
            ezflow.run(FOREVER=Forever(), graph_address="127.0.0.1:0")
            print("returned", latch.interrupted)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "returned False\n"
    lines = without_shm_notices(result.stderr).splitlines()
    assert lines == ["stopping: draining up to 5 s; Ctrl-C again to stop now"], result.stderr
