"""Shared fixtures: both event loops, a graph server per test, leak checks."""

from __future__ import annotations

import asyncio
import atexit
import compileall
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import pytest

import ezflow
from ezflow._core import _loop
from ezflow._core._config import ENV_SHM_DIR, ENV_WATCH_RINGS
from ezflow._core._exceptions import EzflowError
from ezflow._core._tracing import TRACING, set_own_rate
from ezflow._transports._ezring_files import PREFIX as RING_PREFIX
from ezflow._transports._ezring_files import read_ring_header
from ezflow._transports._shmfiles import owner_alive

# -- byte code ---------------------------------------------------------------------------
#
# A machine whose environment sets PYTHONDONTWRITEBYTECODE (container images do, and CI
# runs with the machine's environment) compiles ezflow's 45k lines from source in every
# process the suite starts - hundreds of unit processes, `ezflow` commands and perf
# workers, about 0.2 s each: an editable install leaves the package uncompiled. So the
# first process of the run compiles the package, the tests and the examples (a no-op when
# up to date) before it starts any other, and lets every process write the byte code of
# what else it imports. Python reads byte code whatever that variable says.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # (a pytest-xdist worker: the controller did it)
        return
    for tree in ("ezflow", "tests", "examples"):
        compileall.compile_dir(os.path.join(_ROOT, tree), quiet=1)
    compileall.compile_file(os.path.join(_ROOT, "_ezflow_cli.py"), quiet=1)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    # A shell starts a background job (`bash .ci/run &`) with SIGINT ignored, and every
    # process inherits that: Ctrl-C would do nothing in the children the Ctrl-C tests
    # start. A handler (not an ignore) is reset to the default in a child.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# -- how many workers ----------------------------------------------------------------------
#
# One more than the cores, at most 4: much of the suite waits (on child processes, sockets,
# routes, deadlines and leases), so one worker per core left cores idle. On 2 cores a third
# worker took a whole run from 405 to 281 s; the deadline tests allow for the load it adds.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(4, (cores or 1) + 1)


# -- the order files are handed out in ---------------------------------------------------
#
# pytest-xdist's loadfile gives each worker a whole file at a time, in the order of the
# collection (pyproject.toml: --no-loadscope-reorder; its own reordering, by number of
# tests, put test_waterfall.py - one test, 25 s - last: the other worker idled meanwhile).
# The longest files go first, so that the run ends on short ones and both workers finish
# together; the rest by number of tests, as xdist's reordering did. Seconds per file, all
# phases summed (`pytest -p no:randomly --durations=0`, 2 workers, load 3), kept roughly
# current: a file missing here only runs later than it could.
LONGEST_FILES = (
    # Each of the two that load the CPU most (perf runs and pip installs, many processes
    # at once) beside one that mostly waits (on routes, deadlines and leases), not beside
    # each other: side by side, test_perf_peers took 50 s instead of 30.
    "test_cli_perf.py",  # 37
    "test_zenoh.py",  # 57
    "test_trace_lease.py",  # 51
    "test_perf_peers.py",  # 47
    "test_liveness.py",  # 33
    "test_ezring.py",  # 30
    "test_waterfall.py",  # 28
    "test_ezmsg.py",  # 27
    "test_cli.py",  # 26
    "test_shm.py",  # 23
    "test_server.py",  # 20
    "test_cli_run.py",  # 18
    "test_cli_zenoh.py",  # 15
    "test_auth.py",  # 15
    "test_runner.py",  # 14
    "test_speedups.py",  # 13
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Reorder whole files: :data:`LONGEST_FILES` first, in that order, then the others
    by number of tests (most first); each file's tests keep their order."""
    counts: dict[str, int] = {}
    for item in items:
        counts[str(item.path)] = counts.get(str(item.path), 0) + 1
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}

    def key(item: pytest.Item) -> tuple[int, int, str]:
        path = str(item.path)
        return rank.get(item.path.name, len(rank)), -counts[path], path

    items.sort(key=key)


# -- a private, hostile shm directory ---------------------------------------------------
#
# Every test process (each xdist worker, or the one process with -n 0) points ezflow at a
# private directory on the /dev/shm tmpfs (EZFLOW_SHM_DIR, inherited by every child: unit
# processes, `ezflow` commands, the C writers), so the suite's segments and rings never
# mix with other users' or other runs', and so the leak checks below see only ours. The
# directory holds, for the whole run, what a hostile neighbour leaves in /dev/shm under
# ezflow's names - a FIFO, a directory, a symbolic link and a socket, each named like a
# segment (of a dead owner: the sweeper looks at it) and like a ring - so every test runs
# next to them and code that trips on one is caught. Its name does not start with
# "ezflow" (other runs' leak checks list /dev/shm).
SHM_PARENT = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
SHM_PREFIX = "pytest-ezflow-shm."


def _remove_orphaned_shm_dirs() -> None:
    """Private directories of earlier runs whose process has died (killed workers)."""
    for entry in os.listdir(SHM_PARENT):
        if not entry.startswith(SHM_PREFIX):
            continue
        try:
            pid = int(entry[len(SHM_PREFIX) :].split(".")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(SHM_PARENT, entry), ignore_errors=True)
        except (ValueError, PermissionError):
            continue


def _make_hostile(directory: str) -> dict[str, str]:
    """Put a FIFO, a directory, a symbolic link and a socket under segment and ring names
    into *directory*; return their names and kinds."""
    made: dict[str, str] = {}
    # pid 1 runs, but not with start time 0: to the sweeper these segments' owner is dead.
    for index, (kind, suffix) in enumerate(
        [("fifo", "fifo"), ("dir", "directory"), ("link", "symlink"), ("sock", "socket")]
    ):
        for name in (f"ezflow-1-0-{index:016x}-{suffix}", f"ezflow-ring-hostile-{suffix}"):
            path = os.path.join(directory, name)
            if kind == "fifo":
                os.mkfifo(path, 0o666)
            elif kind == "dir":
                os.mkdir(path, 0o777)
            elif kind == "link":
                os.symlink("/etc/passwd", path)
            else:
                with socket.socket(socket.AF_UNIX) as listener:
                    listener.bind(path)
            made[name] = kind
    if os.geteuid() == 0:
        # Another user's regular files under the same names (only root can make them
        # here): never opened for writing, never removed.
        for name in ("ezflow-1-0-00000000000000ff-others", "ezflow-ring-hostile-others"):
            path = os.path.join(directory, name)
            with open(path, "wb") as f:
                f.write(bytes(8192))
            os.chown(path, 65534, 65534)
            os.chmod(path, 0o666)
            made[name] = "others"
    return made


_remove_orphaned_shm_dirs()
SHM_DIR = tempfile.mkdtemp(prefix=f"{SHM_PREFIX}{os.getpid()}.", dir=SHM_PARENT)
os.chmod(SHM_DIR, 0o1777)  # as /dev/shm itself: other users (tests) may create here
os.environ[ENV_SHM_DIR] = SHM_DIR
HOSTILE_ENTRIES = _make_hostile(SHM_DIR)
atexit.register(shutil.rmtree, SHM_DIR, ignore_errors=True)


def pytest_unconfigure(config: Any) -> None:
    # (xdist workers end with os._exit: no atexit there)
    shutil.rmtree(SHM_DIR, ignore_errors=True)


def without_shm_notices(text: str) -> str:
    """*text* (a process's stderr) without the lines its graph server logged about the
    run's hostile shm entries (one each: tests/test_shmfiles.py checks those lines)."""
    notice = f"ignoring {SHM_DIR}/"
    return "".join(line for line in text.splitlines(keepends=True) if notice not in line)


def shm_entries() -> set[str]:
    """The names in the run's shm directory now, but for the hostile entries."""
    return set(os.listdir(SHM_DIR)) - HOSTILE_ENTRIES.keys()


# Graph servers of the tests (embedded, `ezflow serve` children) do not register rings
# by themselves: every live ring of this user - another test's, in a parallel worker -
# would show up in their exact counts. Ring-watching tests ask for it (watch_rings=True).
os.environ[ENV_WATCH_RINGS] = "0"

# Nothing the tests start uses the default graph address, 127.0.0.1:25990: a graph the
# developer runs there (or another worker's test) would be joined by the test's processes.
# Every program that names no address starts its own graph server on a free port.
os.environ["EZFLOW_GRAPH_ADDRESS"] = "127.0.0.1:0"

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
    uvloop = None  # type: ignore[assignment]


if uvloop is not None:

    class ClosingUvloop(uvloop.Loop):
        """uvloop, whose ``close()`` cannot hang on a leaked handle.

        uvloop's close warns ``unclosed resource <TCPServer ...>`` (ResourceWarning) for
        each handle still open, from inside the callback that closes it; with warnings as
        errors (this suite) the warning raises there, the handle is never closed, and
        close() then waits in ``uv_run`` forever - out of reach of pytest-timeout. Here
        the warnings are only recorded while uvloop closes everything, and raised after,
        so a leak still fails its test (as an error in its teardown), at once.
        """

        def close(self) -> None:
            import warnings  # noqa: PLC0415 - only here

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                super().close()
            for warning in caught:
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Any]:
    """Run every async test on the stock asyncio loop and on uvloop."""
    factories: dict[str, Any] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None:
        factories["uvloop"] = ClosingUvloop
    return factories


def loop_kind() -> str:
    """'uvloop' or 'asyncio': the loop the running test uses (children copy it)."""
    return _loop.loop_kind(asyncio.get_running_loop())


def ezflow_segments() -> set[str]:
    """The ezflow segments and rings in the run's shm directory now."""
    return {name for name in shm_entries() if name.startswith("ezflow")}


_SEGMENT_NAME = re.compile(r"ezflow-(?P<pid>[0-9]+)-(?P<start>[0-9]+)-[0-9a-f]{16}(?:-.*)?")


def _leaked(name: str) -> bool:
    """Whether shm entry *name* is a leak: made by this process, or by one that has gone
    (exited, a zombie, or its pid now another process's: each name carries its maker's
    pid and start time, a ring's header its writer's). Entries of live processes are
    theirs to remove: our children are checked separately, a module fixture's processes
    outlive the test by design."""
    if name.startswith(RING_PREFIX):
        try:
            header = read_ring_header(name[len(RING_PREFIX) :])
        except EzflowError:  # not (or no longer) an initialised ring: a leak if it stays
            return os.path.lexists(os.path.join(SHM_DIR, name))
        pid, start = header.writer_pid, header.writer_start
    else:
        found = _SEGMENT_NAME.fullmatch(name)
        if found is None:
            return True  # no ezflow code makes such a name
        pid, start = int(found["pid"]), int(found["start"])
    return pid == os.getpid() or not owner_alive(pid, start)


def leaked_segments(before: set[str]) -> set[str]:
    """The entries of :func:`ezflow_segments` not in *before* that are leaks."""
    return {name for name in ezflow_segments() - before if _leaked(name)}


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
    shm_before = ezflow_segments()
    children_before = _children(os.getpid())
    yield
    deadline = time.monotonic() + 5
    while True:
        stray = _children(os.getpid()) - children_before
        leaked = leaked_segments(shm_before)
        if not (stray or leaked) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in stray:
        os.kill(pid, signal.SIGKILL)
    assert not stray, f"test left child processes running: {sorted(stray)}"
    assert not leaked, f"test left shared-memory segments: {sorted(leaked)}"
    # Nothing of the hostile neighbour's was removed (or replaced).
    missing = {name for name in HOSTILE_ENTRIES if not os.path.lexists(os.path.join(SHM_DIR, name))}
    assert not missing, f"test removed entries that are not ezflow's: {sorted(missing)}"


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
        TRACING.active = TRACING.carrying = False
        TRACING.hops.clear()

    reset()
    yield
    reset()
