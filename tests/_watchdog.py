"""A pytest plugin that turns any hang into a failure with every thread's stack.

pytest-timeout (``timeout`` in pyproject.toml, signal method) fails a test that runs too
long - when the signal can reach Python code. It cannot when the main thread waits in C
without returning to the interpreter: a uvloop ``loop.close()`` spinning in
``uv_run`` on a handle it failed to close, a blocking ``open`` of a FIFO, a lock taken
in an extension. Those hangs used to last until CI's 90-minute limit, with no stack.

This watchdog covers every phase of every test (setup, call, teardown) and the time
between tests. When a test has run for its own timeout plus ``EZFLOW_TEST_WATCHDOG_GRACE``
seconds (45 by default), or the whole process for ``EZFLOW_TEST_SESSION_LIMIT`` (1800),
it writes which test hangs and the stack of every thread to the process's real stderr
(not pytest's capture) and ends the process with exit code 70. Under xdist the
controller then reports "worker crashed while running <test>" - a failure - and goes on
with a new worker; without xdist the run ends, failed.

Two layers, so that the dump happens even if the hung code holds the GIL: a Python
thread (names the test, dumps the stacks, exits) and, ``_FALLBACK`` seconds later,
faulthandler's C watchdog thread (stacks, exit), which needs no GIL.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Generator
from typing import Any, TextIO

import pytest

_GRACE = float(os.environ.get("EZFLOW_TEST_WATCHDOG_GRACE", "45"))
_SESSION_LIMIT = float(os.environ.get("EZFLOW_TEST_SESSION_LIMIT", "1800"))
_FALLBACK = 15.0
_EXIT_CODE = 70

# The real stderr, duplicated before pytest captures fd 2.
_out: TextIO = os.fdopen(os.dup(2), "w", buffering=1)


class _Watchdog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._deadline = float("inf")
        self._what = ""
        self._session_end = time.monotonic() + _SESSION_LIMIT
        threading.Thread(target=self._watch, name="test-watchdog", daemon=True).start()

    def arm(self, seconds: float, what: str) -> None:
        """From now on, *what* may take *seconds* (capped by the session's limit)."""
        deadline = min(time.monotonic() + seconds, self._session_end)
        with self._wake:
            self._deadline, self._what = deadline, what
            self._wake.notify()
        faulthandler.dump_traceback_later(
            max(1.0, deadline - time.monotonic() + _FALLBACK), exit=True, file=_out
        )

    def _watch(self) -> None:
        with self._wake:
            while True:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wake.wait(min(remaining, 3600.0))
            what = self._what
        _out.write(
            f"\n+++ test watchdog: {what} has not finished within its limit; the stack "
            f"of every thread follows, then this process (pid {os.getpid()}) exits "
            f"with code {_EXIT_CODE} +++\n"
        )
        _out.flush()
        faulthandler.dump_traceback(file=_out, all_threads=True)
        # The processes the hung test started go with it: a child holding the pipes or
        # the ports of later tests would outlive the run (a hung program's graph server).
        killed = []
        for pid in _descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        _out.write(f"+++ test watchdog: killed the processes it started: {killed} +++\n")
        _out.flush()
        os._exit(_EXIT_CODE)


def _descendants(root: int) -> list[int]:
    """The pids of *root*'s children, theirs, and so on (from /proc: each process's
    parent), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # (gone meanwhile)
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


_watchdog: _Watchdog | None = None


def _limit(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    timeout: Any = None
    if marker is not None:
        timeout = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    if timeout is None:
        timeout = item.config.getini("timeout")
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        seconds = 0.0
    # pytest-timeout's limit covers setup, call and teardown together, as this does.
    return (seconds if seconds > 0 else 300.0) + _GRACE


def pytest_sessionstart(session: pytest.Session) -> None:
    global _watchdog
    _watchdog = _Watchdog()
    _watchdog.arm(_SESSION_LIMIT, "the test session (outside any test)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    assert _watchdog is not None
    _watchdog.arm(_limit(item), f"test {item.nodeid}")
    yield
    _watchdog.arm(_SESSION_LIMIT, "the test session (outside any test)")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _watchdog is not None:
        _watchdog.arm(_SESSION_LIMIT, "the end of the test session")
    # The interpreter's own exit (atexit, thread joins) may hang too: faulthandler's
    # watchdog stays armed until the process is gone.
    sys.stderr.flush()
