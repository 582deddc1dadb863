"""What a hostile neighbour or an unlucky operator leaves in the shm directory (which is
world-writable): FIFOs, directories, symbolic links, sockets, another user's files,
truncated and oversized files, each under a segment's name and under a ring's name.

Every test gets a shm directory of its own (EZFLOW_SHM_DIR, inherited by its children),
filled by the ``hostile`` fixture; the whole suite also runs next to such entries
(conftest). Real processes throughout: a graph server, `ezflow serve`, publishers and
subscribers over shm, a ring writer, and a child that turns into another user.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _proc import ezflow_cli
from _waiting import wait_until

import ezflow
from ezflow import BrokenResourceError, ProtocolError
from ezflow._transports import scan_rings
from ezflow._transports._ezring_files import read_ring_header
from ezflow._transports._segment import ShmSegment
from ezflow._transports._shm import sweep_shm_dir
from ezflow._transports._shmfiles import RefusedShmFile, open_shm_file, shm_dir
from ezflow.ezring import RingReader, RingWriter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

SEGMENT = "ezflow-1-0-00000000000000{:02x}-hostile"  # pid 1 with another start: "dead"
KINDS = ("fifo", "directory", "symlink", "socket")
DESCRIBED = {
    "fifo": "a FIFO",
    "directory": "a directory",
    "symlink": "a symbolic link",
    "socket": "a socket",
}
AS_ROOT = os.geteuid() == 0


def make_entry(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path, 0o666)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        path.symlink_to("/etc/passwd")
    else:
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(str(path))


@pytest.fixture
def private_shm(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A shm directory of the test's own on the /dev/shm tmpfs (mode 1777, as /dev/shm)."""
    parent = Path(shm_dir())  # the run's private one (conftest): removed with it
    directory = parent / f"t{os.getpid()}-{time.monotonic_ns()}"
    directory.mkdir()
    directory.chmod(0o1777)
    monkeypatch.setenv("EZFLOW_SHM_DIR", str(directory))
    return directory


@pytest.fixture
def hostile(private_shm: Path) -> Iterator[dict[str, str]]:
    """A FIFO, a directory, a symbolic link and a socket, each under a segment's name and
    a ring's name (``ring-<kind>``), in the test's shm directory; the test checks none
    was removed."""
    made: dict[str, str] = {}
    for index, kind in enumerate(KINDS):
        for name in (SEGMENT.format(index), f"ezflow-ring-{kind}"):
            make_entry(private_shm / name, kind)
            made[name] = kind
    yield made
    assert all(os.path.lexists(private_shm / name) for name in made), "a foreign entry went"


def refused_lines(caplog: pytest.LogCaptureFixture, directory: Path) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith(f"ignoring {directory}/")
    ]


# -- the one way in -------------------------------------------------------------------------


def test_open_refuses_each_kind_at_once_and_says_what_it_is(
    hostile: dict[str, str], private_shm: Path
) -> None:
    for name, kind in hostile.items():
        started = time.monotonic()
        with pytest.raises(RefusedShmFile, match=DESCRIBED[kind]) as info:
            open_shm_file(str(private_shm / name), writable=True)
        assert time.monotonic() - started < 1  # a FIFO without a writer does not block
        assert info.value.path == str(private_shm / name)


def test_open_refuses_too_small_and_too_large_files(private_shm: Path) -> None:
    path = private_shm / "ezflow-ring-short"
    path.write_bytes(b"x" * 100)
    with pytest.raises(RefusedShmFile, match="100 bytes, fewer than the 384 expected"):
        open_shm_file(str(path), min_size=384)
    with pytest.raises(RefusedShmFile, match="100 bytes, more than the 64 expected"):
        open_shm_file(str(path), max_size=64)
    file = open_shm_file(str(path), min_size=100, max_size=100)
    os.close(file.fd)
    with pytest.raises(FileNotFoundError):
        open_shm_file(str(private_shm / "ezflow-ring-absent"))


def test_the_graph_servers_sweeps_log_each_foreign_entry_once_and_remove_none(
    hostile: dict[str, str], private_shm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "ezflow.shm")
    assert sweep_shm_dir(report=True) == []
    assert scan_rings(report=True) == {}
    assert sweep_shm_dir(report=True) == []  # again: nothing new is logged
    assert scan_rings(report=True) == {}
    lines = refused_lines(caplog, private_shm)
    assert len(lines) == len(set(lines)) == len(hostile), lines
    for name, kind in hostile.items():
        assert any(f"{private_shm}/{name}: it is {DESCRIBED[kind]}" in line for line in lines)
    # Sweeps of other processes (publishers) do not repeat it as warnings.
    caplog.clear()
    assert sweep_shm_dir() == []
    assert refused_lines(caplog, private_shm) == []


def test_a_truncated_ring_is_refused_with_its_reason_once(
    private_shm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "ezflow.shm")
    with RingWriter.create("good", slot_size=64, topic="/good") as writer:
        (private_shm / "ezflow-ring-short").write_bytes(Path(writer.path).read_bytes()[:200])
        os.chmod(private_shm / "ezflow-ring-short", 0o600)
        for _ in range(2):
            assert set(scan_rings(report=True)) == {"good"}
        (line,) = refused_lines(caplog, private_shm)
        assert "ezflow-ring-short: it is not a usable ezring v1 ring" in line
        assert "smaller than a header" in line
        with pytest.raises(ProtocolError, match="smaller than a header"):
            read_ring_header("short")


async def test_an_oversized_ring_file_is_read_as_its_header_describes(private_shm: Path) -> None:
    with RingWriter.create("big", slot_size=64, slot_count=4) as writer:
        os.truncate(writer.path, writer.header.segment_size + (1 << 30))  # 1 GiB more
        async with await RingReader.open("big") as reader:
            assert writer.publish(np.arange(8, dtype="<u8"))
            assert (await reader.recv()).tolist() == list(range(8))


async def test_ring_readers_and_writers_refuse_a_foreign_entry_at_once(
    hostile: dict[str, str],
) -> None:
    for kind in KINDS:
        with pytest.raises(RefusedShmFile, match=f"cannot read ezring {kind}: it is"):
            await asyncio.wait_for(RingReader.open(kind, timeout=30), 2)
        with pytest.raises(RefusedShmFile, match=DESCRIBED[kind]):
            await asyncio.wait_for(asyncio.to_thread(read_ring_header, kind), 2)
        with pytest.raises(BrokenResourceError, match=f"is {DESCRIBED[kind]}"):
            RingWriter.create(kind, slot_size=64)


def test_a_segment_name_that_is_a_foreign_entry_is_not_attached(
    hostile: dict[str, str],
) -> None:
    for index, kind in enumerate(KINDS):
        with pytest.raises(BrokenResourceError, match=f"{DESCRIBED[kind]}.*use the tcp"):
            ShmSegment.attach(SEGMENT.format(index))


# -- a whole graph next to them -----------------------------------------------------------------


async def test_a_graph_runs_next_to_them(
    hostile: dict[str, str], private_shm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A graph server (embedded), a pair over shm and a ring-fed subscriber all work;
    each entry is logged once, by the server."""
    caplog.set_level(logging.WARNING, "ezflow.shm")
    async with ezflow.GraphContext(("127.0.0.1", 0)) as ctx:
        pub = await ctx.publisher("/pair")
        sub = await ctx.subscriber("/pair", transport="shm")
        child_env = {**os.environ}
        assert child_env["EZFLOW_SHM_DIR"] == str(private_shm)
        for n in range(3):
            await pub.publish(np.full(1 << 16, n, np.uint8))  # out of line: a block segment
            assert (await asyncio.wait_for(sub.recv(), 10)).sum() == n << 16
        assert [c.transport for c in ctx.channels] == ["shm"]
        with RingWriter.create("cam", slot_size=64, topic="/cam") as writer:
            await ctx.attach_ring("cam")
            frames = await ctx.subscriber("/cam")
            await wait_until(lambda: writer.stats().readers_live >= 1, "a reader joins")
            assert writer.publish(np.arange(8, dtype="<u8"))
            assert (await asyncio.wait_for(frames.recv(), 10)).tolist() == list(range(8))
        for kind in KINDS:  # attaching a foreign entry fails at once, precisely
            with pytest.raises(RefusedShmFile, match=DESCRIBED[kind]):
                await asyncio.wait_for(ctx.attach_ring(kind), 5)
    lines = refused_lines(caplog, private_shm)
    assert len(lines) == len(set(lines)) == len(hostile), lines


def test_ezflow_serve_starts_and_logs_each_entry_once(
    hostile: dict[str, str], private_shm: Path
) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "ezflow", "serve", "--address", "127.0.0.1:0", "--watch-rings"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as serve:
        try:
            # Started (its start sweep is done) once it says where it listens: a process
            # start may take seconds on a loaded machine, so wait for that line first.
            assert serve.stdout is not None
            ready, _, _ = select.select([serve.stdout], [], [], 60)
            listening = serve.stdout.readline() if ready else ""
            time.sleep(2)  # several ring scans (EZRING_WATCH_INTERVAL): nothing logged again
        finally:
            serve.terminate()
            said, output = serve.communicate(timeout=20)
        said = listening + said
    ignored = [line for line in output.splitlines() if "ignoring " + str(private_shm) in line]
    assert len(ignored) == len(set(ignored)) == len(hostile), output
    assert "127.0.0.1:" in said, said
    assert serve.returncode == 0, output


def test_a_failed_start_leaves_no_listening_socket() -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            metrics_port = taken.getsockname()[1]
            server = ezflow.GraphServer(("127.0.0.1", 0), metrics_port=metrics_port)
            with pytest.raises(OSError):
                await server.start()
        # The graph port it had bound was closed: nothing of ours listens any more.
        listening = Path("/proc/net/tcp").read_text()  # noqa: ASYNC240 - procfs
        assert not any(
            line.split()[3] == "0A" and int(line.split()[9]) in own_inodes()
            for line in listening.splitlines()[1:]
        )

    ezflow.lowlevel.run_coroutine(main())


def own_inodes() -> set[int]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


# -- another user's files ---------------------------------------------------------------------


CHILD_AS_NOBODY = """
import os
from ezflow._transports._ezring import RingWriter
from ezflow._transports._segment import ShmSegment
os.setgid(65534)  # (imports first: the interpreter's files may be root's alone)
os.setuid(65534)
writer = RingWriter.create("others", slot_size=64, topic="/others")
writer.publish(b"12345678")
os.chmod(writer.path, 0o666)  # writable by anyone: still not opened for writing
segment = ShmSegment.create(4096, tag="others")
os.chmod(segment._path, 0o666)
print(writer.path, segment._path, flush=True)
os._exit(0)  # a crash: neither is closed or unlinked, their owner is dead
"""


@pytest.mark.skipif(not AS_ROOT, reason="making another user's files needs root")
def test_another_users_stale_ring_and_segment_are_never_opened_for_writing_or_removed(
    private_shm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "ezflow.shm")
    made = subprocess.run(
        [sys.executable, "-c", CHILD_AS_NOBODY],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    ring, segment = made.stdout.split()
    try:
        before = {p: (Path(p).read_bytes(), os.stat(p).st_mtime_ns) for p in (ring, segment)}
        assert sweep_shm_dir(report=True) == []  # stale by every other measure
        assert scan_rings(report=True) == {}
        for path in (ring, segment):
            with pytest.raises(RefusedShmFile, match="belongs to uid 65534"):
                open_shm_file(path, writable=True)
        after = {p: (Path(p).read_bytes(), os.stat(p).st_mtime_ns) for p in (ring, segment)}
        assert after == before
        lines = refused_lines(caplog, private_shm)
        assert len(lines) == len(set(lines)) == 2, lines
        assert all("belongs to uid 65534" in line for line in lines)
    finally:
        for path in (ring, segment):
            os.unlink(path)


def test_a_relative_shm_dir_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EZFLOW_SHM_DIR", "dev/shm")
    with pytest.raises(ezflow.ConfigurationError, match="EZFLOW_SHM_DIR='dev/shm' must be an"):
        ezflow.GraphContext(("127.0.0.1", 0))
    done = ezflow_cli("serve", "--address", "127.0.0.1:0")
    assert done.returncode != 0
    assert "EZFLOW_SHM_DIR='dev/shm' must be an absolute path" in done.stderr


async def test_a_missing_shm_dir_falls_back_to_tcp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EZFLOW_SHM_DIR", str(tmp_path / "missing"))
    async with ezflow.GraphContext(("127.0.0.1", 0)) as ctx:
        pub = await ctx.publisher("/fallback")
        sub = await ctx.subscriber("/fallback", transport="shm")
        await pub.publish(np.arange(4))
        assert (await asyncio.wait_for(sub.recv(), 10)).tolist() == [0, 1, 2, 3]
        assert [c.transport for c in ctx.channels] == ["tcp"]
