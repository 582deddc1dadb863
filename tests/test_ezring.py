"""ezring v1 (docs/ezring.md): the C writer (c/ezflow_ring.h, compiled here with cc), the
Python RingWriter and RingReader, against each other, with real processes and signals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import mmap
import os
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _proc import Child
from _waiting import wait_until
from conftest import loop_kind

import ezflow
from ezflow import BrokenResourceError, ProtocolError
from ezflow._core._config import EZRING_CREATE_GRACE, EZRING_WATCH_INTERVAL
from ezflow._transports import _ezring
from ezflow._transports._ezring_files import (
    OFF_DROPPED,
    OFF_SCAN_COUNT,
    R_STATE,
    READER_ENTRY_SIZE,
    STATE_ACTIVE,
    ring_path,
)
from ezflow._transports._shm import sweep_shm_dir
from ezflow._transports._shmfiles import shm_dir
from ezflow.ezring import RingReader, RingWriter

C_DIR = Path(__file__).resolve().parent.parent / "c"
CC = shutil.which("cc") or shutil.which("gcc")
CXX = shutil.which("c++") or shutil.which("g++")


@pytest.fixture(scope="module")
def camera_writer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """c/examples/camera_writer.c compiled with warnings as errors (skip without cc)."""
    if CC is None:
        pytest.skip("no C compiler (cc) on this machine")
    out = tmp_path_factory.mktemp("ezring") / "camera_writer"
    subprocess.run(
        [
            *(CC, "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11", f"-I{C_DIR}"),
            *("-o", str(out), str(C_DIR / "examples" / "camera_writer.c")),
        ],
        check=True,
    )
    return out


def fresh_name() -> str:
    return f"t{os.getpid()}-{secrets.token_hex(4)}"


class CWriter:
    """A running camera_writer process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def stats(self) -> dict[str, int]:
        """Wait for the writer to finish; its final statistics line."""
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert await asyncio.wait_for(self.process.wait(), 10) == 0
        result: dict[str, int] = json.loads(line)
        return result


@pytest.fixture
async def start_c(camera_writer: Path) -> AsyncIterator[object]:
    started: list[asyncio.subprocess.Process] = []

    async def start(name: str, *args: object) -> CWriter:
        process = await asyncio.create_subprocess_exec(
            str(camera_writer),
            "--name",
            name,
            *map(str, args),
            stdout=asyncio.subprocess.PIPE,
        )
        started.append(process)
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), 10)
        assert ready.decode().strip() == f"ready {ring_path(name)}"
        return CWriter(process)

    yield start
    for process in started:
        if process.returncode is None:
            process.kill()
            await process.wait()
    sweep_shm_dir()


def frame_number(array: np.ndarray) -> int:
    return int(np.frombuffer(array.reshape(-1)[:8].tobytes(), "<u8")[0])


async def test_c_writer_lossless_reader_gets_every_published_frame_in_order_over_wraps(
    start_c: object,
) -> None:
    name = fresh_name()
    writer = await start_c(  # type: ignore[operator]
        name,
        "--slots",
        4,
        "--frame-size",
        4096,
        "--count",
        100,
        "--rate",
        1000,
        "--wait-readers",
        1,
    )
    async with await RingReader.open(name) as reader:
        seqs, numbers = [], []
        async for frame in reader:
            seqs.append(frame.seq)
            numbers.append(frame_number(frame.array))
            assert frame.array.shape == (4096,) and frame.array.dtype == np.uint8
            assert not frame.array.flags.writeable
            assert int(frame.array[-1]) == numbers[-1] & 0xFF and frame.lost == 0
            del frame
    stats = await writer.stats()
    assert seqs == list(range(1, stats["published"] + 1))
    assert numbers == sorted(set(numbers))
    assert stats["published"] + stats["dropped_full"] == 100
    assert stats["published"] >= 10 * 4  # wrapped around the 4 slots at least 10 times


async def test_c_writer_counts_drops_exactly_while_a_lossless_reader_holds_every_slot(
    start_c: object,
) -> None:
    name = fresh_name()
    writer = await start_c(  # type: ignore[operator]
        name, "--slots", 4, "--frame-size", 64, "--count", 50, "--wait-readers", 1
    )
    async with await RingReader.open(name) as reader:
        stats = await writer.stats()  # the reader reads nothing until the writer is done
        assert stats == {
            "published": 4,
            "dropped_full": 46,
            "readers_live": 1,
            "readers_reclaimed": 0,
        }
        numbers = [frame_number(frame.array) async for frame in reader]
    assert numbers == [0, 1, 2, 3]


# -- the registration race (docs/ezring.md, "Registration") ----------------------------
#
# A reader announces itself (cursor, then state) and reads write_seq again after a full
# barrier. The tests run the writer inside that barrier (_ezring.locked_elsewhere, the
# reader's barrier, hooked on its first call): the interleaving that once failed the test
# above at load 10, made deterministic.


def during_registration(monkeypatch: pytest.MonkeyPatch, step: Any) -> None:
    """Run *step(fd)* inside the first full barrier a RingReader takes (its
    registration's, between its announcement and its second look at write_seq)."""
    barrier = _ezring.locked_elsewhere
    calls: list[int] = []

    def hooked(fd: int, offset: int) -> bool:
        held = barrier(fd, offset)
        if not calls:
            calls.append(fd)
            step(fd)
        return held

    monkeypatch.setattr(_ezring, "locked_elsewhere", hooked)


def entry_of(writer: RingWriter, index: int = 0) -> int:
    return writer.header.reader_table + index * READER_ENTRY_SIZE


@pytest.mark.parametrize("case", ["seen", "seen-v1.0", "missed", "scan-under-way"])
async def test_a_ring_filled_while_a_reader_registers(
    monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The writer commits exactly slot_count frames (3..6 of a 4-slot ring) between a
    lossless reader's announcement and its second look at write_seq.

    seen: the writer's scans saw the reader, so the frames are intact and held: the
    reader gets every one (it skipped them before scan_count). seen-v1.0: the same
    from a writer that announces no scans (minor 0): the reader cannot tell, it starts
    after them (skipped, not lost: the v1.0 rule). missed: the loan of frame 7 scanned
    before the announcement (the entry hidden from the writer) and took frame 3's slot:
    the reader starts after frame 6. scan-under-way: a scan is announced and not over
    when the reader looks: it waits for its end, then finds frame 3 in its slot."""
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, slot_count=4) as writer:
        m = writer._m
        for i in range(2):  # before = 2
            assert writer.publish(np.full(8, i, "<u8"))
        if case == "seen-v1.0":
            struct.pack_into("<H", m.rw, 10, 0)  # minor 0

        def step(fd: int) -> None:
            word = m.load(entry_of(writer) + R_STATE)
            assert word & 0xFFFFFFFF == STATE_ACTIVE  # (announced)
            if case == "missed":
                m.store(entry_of(writer) + R_STATE, 0)
            for i in range(2, 6):
                assert writer.publish(np.full(8, i, "<u8"))  # write_seq 6 = before + 4
            if case == "missed":
                view = writer.loan(64)  # frame 7: frame 3's slot is taken
                assert view is not None
                np.frombuffer(view, "<u8")[:] = 6
                m.store(entry_of(writer) + R_STATE, word)
            elif case == "scan-under-way":
                scans = m.load(OFF_SCAN_COUNT)
                m.store(OFF_SCAN_COUNT, scans + 1)  # odd: under way, ...
                threading.Timer(0.05, m.store, (OFF_SCAN_COUNT, scans + 2)).start()  # ...over

        during_registration(monkeypatch, step)
        started = time.monotonic()
        async with await RingReader.open(name) as reader:
            waited = time.monotonic() - started
            if case == "missed":
                writer.commit(64, "<u8", (8,))
            else:
                assert writer.publish(np.full(8, 6, "<u8")) == (case == "seen-v1.0")
            frame = await asyncio.wait_for(reader.receive(), 5)
            first = (frame.seq, frame_number(frame.array))
            assert first == ((7, 6) if case in ("missed", "seen-v1.0") else (3, 2))
            if case in ("seen", "scan-under-way"):  # and the three after it
                del frame
                seqs = [(await asyncio.wait_for(reader.receive(), 5)).seq for _ in range(3)]
                assert seqs == [4, 5, 6]
                assert writer.stats().dropped_full == 1  # (frame 7: frame 3 was held)
            if case == "scan-under-way":
                assert waited >= 0.04  # (it waited for the scan's end)


async def test_a_scan_that_never_ends_makes_the_reader_start_after_the_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer announced a scan and stopped there (stopped or stuck while it lives):
    the registering reader waits no longer than its open timeout and starts after the
    frames it cannot tell are held (skipped, to be safe)."""
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, slot_count=4) as writer:
        m = writer._m

        def step(fd: int) -> None:
            for i in range(4):
                assert writer.publish(np.full(8, i, "<u8"))
            m.store(OFF_SCAN_COUNT, m.load(OFF_SCAN_COUNT) + 1)  # odd, for good

        during_registration(monkeypatch, step)
        started = time.monotonic()
        async with await RingReader.open(name, timeout=0.3) as reader:
            assert 0.25 <= time.monotonic() - started < 3
            m.store(OFF_SCAN_COUNT, m.load(OFF_SCAN_COUNT) + 1)
            assert writer.publish(np.full(8, 4, "<u8"))
            assert (await asyncio.wait_for(reader.receive(), 5)).seq == 5


async def test_c_writer_that_fills_the_ring_during_registration_keeps_it_for_the_reader(
    start_c: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C writer (``--wait-readers 1``) sees the reader, fills the 4 slots and drops
    the other 46 frames, all between the reader's announcement and its second look at
    write_seq: the reader gets the 4 frames, in order (it got none before scan_count:
    the flake of the test above at load 10)."""
    name = fresh_name()
    writer = await start_c(  # type: ignore[operator]
        name, "--slots", 4, "--frame-size", 64, "--count", 50, "--wait-readers", 1
    )

    def step(fd: int) -> None:
        deadline = time.monotonic() + 20
        while struct.unpack("<Q", os.pread(fd, 8, OFF_DROPPED))[0] < 46:  # the writer is done
            assert time.monotonic() < deadline, "the C writer did not fill the ring"
            time.sleep(0.005)

    during_registration(monkeypatch, step)
    async with await RingReader.open(name) as reader:
        stats = await writer.stats()
        assert (stats["published"], stats["dropped_full"]) == (4, 46)
        numbers = [frame_number(frame.array) async for frame in reader]
    assert numbers == [0, 1, 2, 3]


async def test_kept_view_holds_its_slot_and_never_changes() -> None:
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, slot_count=4) as writer:
        async with await RingReader.open(name) as reader:
            for i in range(4):
                assert writer.publish(np.full(8, i, "<u8"))
            kept = (await reader.receive()).array
            for _ in range(3):
                await reader.receive()  # received and dropped at once: released
            # Slot 1 is still held by `kept`: the writer drops instead of overwriting it.
            assert not writer.publish(np.full(8, 99, "<u8"))
            assert writer.stats().dropped_full == 1
            assert kept.tolist() == [0] * 8
            with pytest.raises(ValueError, match="read-only"):
                kept[0] = 5
            del kept
            assert writer.publish(np.full(8, 4, "<u8"))
            frame = await reader.receive()
            assert frame.seq == 5 and frame.array.tolist() == [4] * 8
            assert "ezflow-ring-" + name not in sweep_shm_dir()  # its writer lives


def test_a_ring_file_being_created_is_not_swept_until_its_grace_has_passed() -> None:
    """A writer creates its ring file, then takes its lock: in between (a loaded machine
    can hold the two calls apart) the file is empty and unlocked, and a graph server's
    sweep took it for a dead writer's and removed it under the writer (a reader then
    waited for a ring that never appeared). Such a file is left alone for
    EZRING_CREATE_GRACE since it last changed; older, its creator died before it started,
    and the sweep removes it."""
    name = fresh_name()
    path = ring_path(name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)  # (as create() begins)
    try:
        assert "ezflow-ring-" + name not in sweep_shm_dir()
        assert os.path.exists(path)
        old = time.time() - EZRING_CREATE_GRACE - 1
        os.utime(path, (old, old))
        assert "ezflow-ring-" + name in sweep_shm_dir()
        assert not os.path.exists(path)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


async def test_lapped_leaky_reader_detects_it_and_never_holds_the_writer() -> None:
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, slot_count=4) as writer:
        async with await RingReader.open(name, lossless=False) as reader:
            for i in range(10):
                assert writer.publish(np.full(8, i, "<u8"), meta=b"m%d" % i)
            frames = [await reader.receive() for _ in range(3)]
            assert [f.seq for f in frames] == [8, 9, 10]
            assert [f.lost for f in frames] == [7, 0, 0] and reader.lost == 7
            assert [f.meta for f in frames] == [b"m7", b"m8", b"m9"]
            assert frames[0].array.tolist() == [7] * 8
            assert writer.stats().dropped_full == 0


async def test_writer_sigkill_ends_the_reader_with_an_error_and_is_swept(
    start_c: object,
) -> None:
    name = fresh_name()
    writer = await start_c(  # type: ignore[operator]
        name,
        "--slots",
        4,
        "--frame-size",
        64,
        "--count",
        10**9,
        "--rate",
        200,
        "--wait-readers",
        1,
    )
    async with await RingReader.open(name) as reader:
        await reader.receive()
        writer.process.send_signal(signal.SIGKILL)
        await writer.process.wait()
        with pytest.raises(BrokenResourceError, match="died"):
            while True:
                await asyncio.wait_for(reader.receive(), 5)
    assert "ezflow-ring-" + name in os.listdir(shm_dir())  # left by the dead writer
    assert "ezflow-ring-" + name in sweep_shm_dir()
    assert "ezflow-ring-" + name not in os.listdir(shm_dir())


READER_CHILD = """
import asyncio, sys
from ezflow.ezring import RingReader
async def main():
    reader = await RingReader.open(sys.argv[1])
    frame = await reader.receive()  # kept: its slot stays held
    print("got", frame.seq, flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


async def test_reader_sigkill_is_reclaimed_and_the_writer_never_blocks() -> None:
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, slot_count=4) as writer:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", READER_CHILD, name, stdout=asyncio.subprocess.PIPE
        )
        try:
            await wait_until(lambda: writer.stats().readers_live >= 1, "a reader joins")
            for i in range(4):
                assert writer.publish(np.full(8, i, "<u8"))
            assert child.stdout is not None
            assert (await asyncio.wait_for(child.stdout.readline(), 30)).split()[0] == b"got"
            assert not writer.publish(np.zeros(8, "<u8"))  # the live child holds slot 1
            child.send_signal(signal.SIGKILL)
            await child.wait()
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        assert writer.publish(np.zeros(8, "<u8"))  # reclaimed on this loan, no waiting
        assert writer.stats() == writer.stats().__class__(5, 1, 0, 1)


async def test_c_writer_reclaims_a_killed_reader(start_c: object) -> None:
    name = fresh_name()
    writer = await start_c(  # type: ignore[operator]
        name,
        "--slots",
        4,
        "--frame-size",
        64,
        "--count",
        60,
        "--rate",
        300,
        "--wait-readers",
        1,
    )
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", READER_CHILD, name, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert (await asyncio.wait_for(child.stdout.readline(), 30)).split()[0] == b"got"
        child.send_signal(signal.SIGKILL)
        await child.wait()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    stats = await writer.stats()
    assert stats["readers_reclaimed"] == 1 and stats["readers_live"] == 0
    assert stats["published"] + stats["dropped_full"] == 60 and stats["published"] > 4


async def test_unknown_major_is_refused_and_a_newer_minor_accepted() -> None:
    name = fresh_name()
    with (
        RingWriter.create(name, slot_size=64) as writer,
        open(writer.path, "r+b") as f,  # noqa: ASYNC230 - a tmpfs file, opened once
        mmap.mmap(f.fileno(), 0) as raw,
    ):
        struct.pack_into("<H", raw, 10, 9)  # minor 9: fields we do not know are skipped
        async with await RingReader.open(name) as reader:
            assert reader.header.minor == 9
        struct.pack_into("<H", raw, 8, 2)  # major 2
        with pytest.raises(ProtocolError, match="major version 2 is not supported"):
            await RingReader.open(name)
        struct.pack_into("<Q", raw, 0, 0x1234)
        with pytest.raises(ProtocolError, match="not an ezring segment"):
            await RingReader.open(name, timeout=0)


async def test_sixteen_lossless_readers_each_get_every_frame(start_c: object) -> None:
    name = fresh_name()
    writer = await start_c(  # type: ignore[operator]
        name,
        "--slots",
        8,
        "--frame-size",
        256,
        "--count",
        40,
        "--rate",
        400,
        "--max-readers",
        16,
        "--wait-readers",
        16,
    )
    readers = [await RingReader.open(name) for _ in range(16)]
    try:
        with pytest.raises(BrokenResourceError, match="all 16 reader entries in use"):
            await RingReader.open(name)

        async def drain(reader: RingReader) -> list[int]:
            return [frame.seq async for frame in reader]

        results = await asyncio.gather(*(drain(reader) for reader in readers))
    finally:
        for reader in readers:
            await reader.aclose()
    stats = await writer.stats()
    assert stats["published"] + stats["dropped_full"] == 40
    assert all(seqs == list(range(1, stats["published"] + 1)) for seqs in results)


async def test_python_and_c_writers_produce_the_same_frames(start_c: object) -> None:
    size, count = 256, 6
    c_name, py_name = fresh_name(), fresh_name()
    writer = await start_c(  # type: ignore[operator]
        c_name,
        "--slots",
        8,
        "--frame-size",
        size,
        "--count",
        count,
        "--wait-readers",
        1,
        "--max-readers",
        4,
        "--topic",
        "/diff",
    )
    async with await RingReader.open(c_name) as reader:
        c_header = reader.header
        c_frames = [
            (f.seq, f.array.dtype.str, f.array.shape, f.array.tobytes()) async for f in reader
        ]
    await writer.stats()
    with RingWriter.create(
        py_name, slot_size=size, slot_count=8, max_readers=4, topic="/diff"
    ) as py:
        async with await RingReader.open(py_name) as reader:
            for n in range(count):
                data = np.full(size, n & 0xFF, np.uint8)
                data[:8] = np.frombuffer(struct.pack("<Q", n), np.uint8)
                assert py.publish(data)
            py_frames = [
                (f.seq, f.array.dtype.str, f.array.shape, f.array.tobytes())
                for f in [await reader.receive() for _ in range(count)]
            ]
            py_header = reader.header
    assert c_frames == py_frames
    skip = {"writer_pid", "writer_start", "created_ns"}
    assert {k: getattr(c_header, k) for k in c_header.__slots__ if k not in skip} == {
        k: getattr(py_header, k) for k in py_header.__slots__ if k not in skip
    }


@pytest.fixture(scope="module")
def cpp_writer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """c/examples/cpp_writer.cpp (the C++ wrapper) compiled with -Werror -std=c++17."""
    if CXX is None:
        pytest.skip("no C++ compiler on this machine")
    binary = tmp_path_factory.mktemp("ezring_cpp") / "cpp_writer"
    subprocess.run(
        [
            *(CXX, "-O1", "-Wall", "-Wextra", "-Werror", "-std=c++17", f"-I{C_DIR}"),
            *("-o", str(binary), str(C_DIR / "examples" / "cpp_writer.cpp")),
        ],
        check=True,
    )
    return binary


async def test_cpp_wrapper_compiles_and_publishes_shaped_frames(cpp_writer: Path) -> None:
    binary = cpp_writer
    name = fresh_name()
    process = await asyncio.create_subprocess_exec(
        str(binary), name, "3", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        await asyncio.wait_for(process.stdout.readline(), 10)
        async with await RingReader.open(name) as reader:
            frames = [frame.array.copy() async for frame in reader]
            assert reader.topic == "/cpp"
        assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    expected = np.arange(32, dtype="<f4").reshape(4, 8)
    assert len(frames) == 3
    for n, frame in enumerate(frames):
        np.testing.assert_array_equal(frame, expected + 1000 * n)


async def test_attached_ring_feeds_every_subscriber_of_its_topic(
    server: ezflow.GraphServer,
) -> None:
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, slot_count=8, topic="/cam") as writer:
        async with ezflow.GraphContext(server.address) as ctx:
            publisher_id = await ctx.attach_ring(name)  # topic from the ring's header
            first = await ctx.subscriber("/cam")
            second = await ctx.subscriber("/cam", leaky=True, queue=8)
            await wait_until(lambda: writer.stats().readers_live >= 1, "a reader joins")
            for n in range(5):
                assert writer.publish(np.full(8, n, "<u8"))
            for subscriber in (first, second):
                for n in range(5):
                    array = await asyncio.wait_for(subscriber.recv(), 5)
                    assert array.tolist() == [n] * 8 and not array.flags.writeable
            (info,) = ctx.channels
            assert (info.publisher_id, info.topic, info.transport) == (
                publisher_id,
                "/cam",
                "ezring",
            )
            assert info.statistics.messages == 5
            (listed,) = server.snapshot()["publishers"]
            assert (listed["id"], listed["topic"], listed["transport"]) == (
                publisher_id,
                "/cam",
                "ezring",
            )


async def test_a_subscriber_in_another_process_reads_an_attached_ring(
    server: ezflow.GraphServer,
) -> None:
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, slot_count=8) as writer:
        async with ezflow.GraphContext(server.address) as ctx:
            await ctx.attach_ring(name, topic="/frames")
            child = await Child.start(
                "collect", loop_kind(), address=list(server.address), topic="/frames", count=3
            )
            try:
                await child.event("ready")
                await wait_until(lambda: writer.stats().readers_live >= 1, "a reader joins")
                for n in range(3):
                    assert writer.publish(np.arange(4, dtype="<i4") + n)
                done = await child.event("done")
                assert done["values"] == [[n, n + 1, n + 2, n + 3] for n in range(3)]
                assert await child.stop() == 0
            finally:
                child.kill()
                await child.process.wait()


async def test_a_view_dropped_in_another_thread_releases_its_slot() -> None:
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, slot_count=2) as writer:
        async with await RingReader.open(name) as reader:
            assert writer.publish(np.zeros(8, "<u8"))
            assert writer.publish(np.ones(8, "<u8"))
            views = [(await reader.receive()).array for _ in range(2)]
            assert not writer.publish(np.zeros(8, "<u8"))  # both slots held
            await asyncio.to_thread(views.clear)  # the last references die in a worker
            for _ in range(100):  # the release is handed back to the loop's thread
                if writer.publish(np.full(8, 2, "<u8")):
                    break
                await asyncio.sleep(0.01)
            assert (await reader.receive()).array.tolist() == [2] * 8


@pytest.fixture
async def watching() -> AsyncIterator[ezflow.GraphServer]:
    """A graph server that watches rings (the shared `server` fixture does not: every
    ring of this user on the machine would show up in other tests)."""
    async with ezflow.GraphServer(("127.0.0.1", 0), watch_rings=True) as graph_server:
        yield graph_server


async def wait_for_publishers(
    server: ezflow.GraphServer, topic: str, count: int, timeout: float = 20.0
) -> list[dict[str, object]]:
    """The server's publishers of *topic* once there are *count* of them (the watcher
    scans every EZRING_WATCH_INTERVAL: a generous limit for a loaded machine)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = [p for p in server.snapshot()["publishers"] if p["topic"] == topic]
        if len(found) == count:
            return found
        assert asyncio.get_running_loop().time() < deadline, f"publishers of {topic}: {found}"
        await asyncio.sleep(0.05)


async def test_server_finds_a_new_ring_by_itself_and_forgets_it_when_closed(
    watching: ezflow.GraphServer,
) -> None:
    name = fresh_name()
    topic = f"/watched/{name}"
    child = await Child.start(
        "collect", loop_kind(), address=list(watching.address), topic=topic, count=3
    )
    try:
        await child.event("ready")
        with RingWriter.create(name, slot_size=64, slot_count=8, topic=topic) as writer:
            (listed,) = await wait_for_publishers(watching, topic, 1)  # no attach_ring
            assert listed["transport"] == "ezring"
            await wait_until(lambda: writer.stats().readers_live >= 1, "a reader joins")
            for n in range(3):
                assert writer.publish(np.arange(4, dtype="<i4") + n)
            done = await child.event("done")
            assert done["values"] == [[n, n + 1, n + 2, n + 3] for n in range(3)]
        await wait_for_publishers(watching, topic, 0)  # the closed ring is unregistered
        assert await child.stop() == 0
    finally:
        child.kill()
        await child.process.wait()


async def test_attach_ring_of_a_watched_ring_makes_no_second_publisher(
    watching: ezflow.GraphServer,
) -> None:
    name = fresh_name()
    topic = f"/watched/{name}"
    with RingWriter.create(name, slot_size=64, slot_count=8, topic=topic):
        await wait_for_publishers(watching, topic, 1)
        async with ezflow.GraphContext(watching.address) as ctx:
            publisher_id = await ctx.attach_ring(name)
            (listed,) = await wait_for_publishers(watching, topic, 1)
            assert listed["id"] == publisher_id
            await asyncio.sleep(3 * EZRING_WATCH_INTERVAL)
            (listed,) = await wait_for_publishers(watching, topic, 1)  # still only the one
            assert listed["id"] == publisher_id
        # Detached by its context: the server registers it again by itself.
        deadline = asyncio.get_running_loop().time() + 5
        while True:
            (listed,) = await wait_for_publishers(watching, topic, 1)
            if listed["id"] != publisher_id:
                break
            assert asyncio.get_running_loop().time() < deadline, "not registered again"
            await asyncio.sleep(0.05)


async def test_watch_rings_false_registers_nothing() -> None:
    name = fresh_name()
    topic = f"/watched/{name}"
    async with ezflow.GraphServer(("127.0.0.1", 0), watch_rings=False) as quiet:
        with RingWriter.create(name, slot_size=64, slot_count=8, topic=topic):
            await asyncio.sleep(3 * EZRING_WATCH_INTERVAL)  # a window: nothing registers
            assert quiet.snapshot()["publishers"] == []


async def test_top_shows_a_watched_ring_with_its_published_and_dropped_counts(
    watching: ezflow.GraphServer,
) -> None:
    name = fresh_name()
    topic = f"/watched/{name}"
    where = f"{watching.address[0]}:{watching.address[1]}"
    with RingWriter.create(name, slot_size=64, slot_count=8, topic=topic) as writer:
        # A lossless reader that reads nothing holds every slot: the writer drops.
        async with await RingReader.open(name):
            for n in range(10):
                writer.publish(np.full(8, n, "<u8"))
            stats = writer.stats()
            assert stats.dropped_full > 0 and stats.readers_live == 1
            (listed,) = await wait_for_publishers(watching, topic, 1)
            rows = await top_rows(where, topic, stats.published)
        (row,) = rows
        assert (row["publisher_id"], row["drops"], row["channels"]) == (
            listed["id"],
            stats.dropped_full,
            1,
        )


async def top_rows(where: str, topic: str, published: int) -> list[dict[str, object]]:
    """`ezflow top --once --json` rows of *topic* once they show *published* messages."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:  # until a scan after the publishing reached the telemetry
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "ezflow", "top", "--once", "--json", "--address", where],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        rows: list[dict[str, object]] = [
            p for p in json.loads(done.stdout)["publishers"] if p["topic"] == topic
        ]
        if rows and rows[0]["messages"] == published:
            return rows
        assert asyncio.get_running_loop().time() < deadline, rows
        await asyncio.sleep(EZRING_WATCH_INTERVAL)


# -- a ring-fed stream ends like every other ----------------------------------------------


async def recv_until_end(subscriber: ezflow.Subscriber, timeout: float = 10.0) -> list[int]:
    """Frame numbers received until EndOfStream (which must come within *timeout*)."""
    numbers = []
    with pytest.raises(ezflow.EndOfStream):
        while True:
            numbers.append(frame_number(await asyncio.wait_for(subscriber.recv(), timeout)))
    return numbers


async def kill_mid_stream(
    subscriber: ezflow.Subscriber, writer: CWriter, caplog: pytest.LogCaptureFixture
) -> float:
    """Receive a few frames, SIGKILL the writer; seconds from the kill to EndOfStream."""
    for _ in range(5):
        await asyncio.wait_for(subscriber.recv(), 10)
    writer.process.kill()
    await writer.process.wait()
    killed = asyncio.get_running_loop().time()
    numbers = await recv_until_end(subscriber)
    ended = asyncio.get_running_loop().time() - killed
    assert numbers == sorted(numbers)  # what was committed before the kill, in order
    return ended


@pytest.mark.parametrize("how", ["attach_ring", "watched"])
async def test_sigkilled_c_writer_ends_its_subscribers_stream_and_its_file_goes(
    how: str,
    start_c: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = fresh_name()
    topic = f"/ring/{name}"
    async with (
        ezflow.GraphServer(("127.0.0.1", 0), watch_rings=how == "watched") as server,
        ezflow.GraphContext(server.address, auto_start=False) as ctx,
    ):
        sub = await ctx.subscriber(topic)
        writer = await start_c(  # type: ignore[operator]
            name,
            "--topic",
            topic,
            "--frame-size",
            64,
            "--count",
            10**9,
            "--rate",
            500,
            "--wait-readers",
            1,
        )
        if how == "attach_ring":
            await ctx.attach_ring(name)
        ended = await kill_mid_stream(sub, writer, caplog)
        assert ended < 2.0, f"EndOfStream {ended:.2f} s after the kill"
        assert (sub.statistics().publishers_ended, sub.statistics().publishers_broken) == (1, 1)
        lines = [r.getMessage() for r in caplog.records if r.name == "ezflow.ezring"]
        assert any(
            f"ezring {name} feeding topic {topic!r} ended" in line and "died" in line
            for line in lines
        ), lines
        # The dead writer's file: removed by the reader that saw it die (and by a
        # watching server's next scan), not left for the next server start.
        deadline = asyncio.get_running_loop().time() + 4 * EZRING_WATCH_INTERVAL + 2
        while os.path.exists(ring_path(name)):  # noqa: ASYNC240 - a tmpfs stat
            assert asyncio.get_running_loop().time() < deadline, "the dead ring stays"
            await asyncio.sleep(0.05)


async def test_closed_c_ring_ends_the_stream_cleanly_after_every_frame(
    server: ezflow.GraphServer,
    ctx: ezflow.GraphContext,
    start_c: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", "ezflow.ezring")
    name = fresh_name()
    topic = f"/ring/{name}"
    sub = await ctx.subscriber(topic)
    writer = await start_c(  # type: ignore[operator]
        name,
        "--topic",
        topic,
        "--frame-size",
        64,
        "--count",
        50,
        "--rate",
        1000,
        "--slots",
        64,
        "--wait-readers",
        1,
    )
    await ctx.attach_ring(name)
    assert await recv_until_end(sub) == list(range(50))  # ezr_close() after the last
    assert (sub.statistics().publishers_ended, sub.statistics().publishers_broken) == (1, 0)
    assert (await writer.stats())["published"] == 50
    assert any(
        f"ezring {name} feeding topic {topic!r} ended after 50 frames: its writer closed it"
        in r.getMessage()
        for r in caplog.records
    )
    assert not os.path.exists(ring_path(name))  # noqa: ASYNC240 - a tmpfs stat


async def test_a_watched_ring_whose_writer_restarts_is_a_new_publisher(
    watching: ezflow.GraphServer, start_c: object
) -> None:
    name = fresh_name()
    topic = f"/ring/{name}"
    async with ezflow.GraphContext(watching.address, auto_start=False) as ctx:
        ids = []
        for _ in range(2):  # the same name, a writer after another
            # (the first writer's registration gone: a subscriber made while it is still
            # listed reads that ended stream and ends, as it should)
            await wait_for_publishers(watching, topic, 0)
            sub = await ctx.subscriber(topic)
            writer = await start_c(  # type: ignore[operator]
                name,
                "--topic",
                topic,
                "--frame-size",
                64,
                "--count",
                10,
                "--rate",
                200,
                "--slots",
                16,
                "--wait-readers",
                1,
            )
            deadline = asyncio.get_running_loop().time() + 20  # (the watcher, on a loaded machine)
            while (listed := await wait_for_publishers(watching, topic, 1))[0]["id"] in ids:
                assert asyncio.get_running_loop().time() < deadline, "not registered anew"
                await asyncio.sleep(0.05)
            ids.append(listed[0]["id"])
            assert await recv_until_end(sub) == list(range(10))
            await writer.stats()
            await sub.aclose()
        assert ids[0] != ids[1]


async def test_a_publisher_of_a_ring_never_reads_the_next_writers_ring_of_that_name(
    server: ezflow.GraphServer, ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    """The registration stands for one writer: another ring under the same name (the
    first writer gone, a new one started) is another stream, never read through it
    (which would deliver its frames twice next to the new publisher)."""
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, topic="/again"):
        await ctx.attach_ring(name)
    with RingWriter.create(name, slot_size=64, topic="/again") as second:
        sub = await ctx.subscriber("/again")
        with pytest.raises(ezflow.EndOfStream):
            await asyncio.wait_for(sub.recv(), 10)
        assert (sub.statistics().publishers_ended, sub.statistics().publishers_broken) == (1, 1)
        assert second.stats().readers_live == 0  # it was let go at once
        assert second.publish(np.zeros(8, "<u8"))
        await asyncio.sleep(0.2)  # a window: nothing may arrive in it
        assert sub.statistics().received == 0
    assert any("made a new ring under the name" in r.getMessage() for r in caplog.records)
