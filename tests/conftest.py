"""Shared fixtures: both event loops, a graph server per test, leak checks."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import pytest

import ezflow
from ezflow._core._config import ENV_WATCH_RINGS
from ezflow._core._exceptions import EzflowError
from ezflow._core._tracing import TRACING, set_own_rate
from ezflow._transports._ezring import PREFIX as RING_PREFIX
from ezflow._transports._ezring import read_ring_header

# Graph servers of the tests (embedded, `ezflow serve` children) do not register rings
# by themselves: every live ring of this user - another test's, in a parallel worker -
# would show up in their exact counts. Ring-watching tests ask for it (watch_rings=True).
os.environ[ENV_WATCH_RINGS] = "0"

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
    uvloop = None


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Any]:
    """Run every async test on the stock asyncio loop and on uvloop."""
    factories: dict[str, Any] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


def loop_kind() -> str:
    """'uvloop' or 'asyncio': the loop the running test uses (children copy it)."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def _ezflow_segments() -> set[str]:
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith("ezflow")}
    except FileNotFoundError:  # pragma: no cover - no /dev/shm on this OS
        return set()


def _ours_or_orphaned(name: str) -> bool:
    """Whether a segment was left by this process or by one that has gone (our children
    are checked separately); segments of other live processes - another test run on
    the same machine - are theirs to clean up."""
    if name.startswith(RING_PREFIX):
        # A ring's name is the user's: its writer's pid is in its header.
        try:
            pid = read_ring_header(name[len(RING_PREFIX) :]).writer_pid
        except EzflowError:
            return not os.path.exists(f"/dev/shm/{name}")  # closed meanwhile: not a leak
    else:
        try:
            pid = int(name.split("-")[1])
        except (IndexError, ValueError):
            return True
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry))
    return found


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test leaves no ezflow shared-memory segment and no child process behind."""
    shm_before = _ezflow_segments()
    children_before = _children(os.getpid())
    yield
    deadline = time.monotonic() + 5
    while True:
        stray = _children(os.getpid()) - children_before
        leaked = {name for name in _ezflow_segments() - shm_before if _ours_or_orphaned(name)}
        if not (stray or leaked) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in stray:
        os.kill(pid, signal.SIGKILL)
    assert not stray, f"test left child processes running: {sorted(stray)}"
    assert not leaked, f"test left shared-memory segments: {sorted(leaked)}"


@pytest.fixture
async def server() -> AsyncIterator[ezflow.GraphServer]:
    """A graph server on a free loopback port, closed after the test."""
    # Not watching rings: other tests' rings (same user, same /dev/shm) would show up.
    async with ezflow.GraphServer(("127.0.0.1", 0), watch_rings=False) as graph_server:
        yield graph_server


@pytest.fixture
async def ctx(server: ezflow.GraphServer) -> AsyncIterator[ezflow.GraphContext]:
    async with ezflow.GraphContext(server.address, auto_start=False) as context:
        yield context


@pytest.fixture
def tracing_off() -> Iterator[None]:
    """The test starts and ends with this process tracing nothing (for the tests of
    tracing: ``pytestmark = pytest.mark.usefixtures("tracing_off")``)."""

    def reset() -> None:
        set_own_rate(0, "default")
        TRACING.lease = None
        TRACING.update()
        TRACING.active = False
        TRACING.hops.clear()

    reset()
    yield
    reset()
