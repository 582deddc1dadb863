"""VectoredWriter, and the publisher side of the stream transports writing through it.

The writer alone, on real socket pairs: what goes in comes out whole and in order
(hypothesis, against the joined parts: what ``transport.writelines`` is specified to
send), partial sends resume, more than IOV_MAX parts, pause/resume around the limit,
EOF, a peer that resets, no descriptor left open.

Then the transports, with real subscriber processes: large and mixed messages arrive
byte-exact with a reader that keeps stopping, a stopped subscriber makes a lossless
publisher wait and a leaky link stay bounded, a killed subscriber closes only its
connection, a clean close delivers everything and then END, and on the stock loop a
4 MiB array is never copied on its way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import numpy as np
import pytest
from _children import mixed_payload
from _proc import Child
from _transport_of import shm_of, tcp_of
from _waiting import wait_until
from conftest import loop_kind
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ezflow
from ezflow._core._codec import Codec
from ezflow._core._config import DATA_WRITE_BUFFER_LIMIT, PUBLISH_YIELD_BYTES
from ezflow._core._framing import DATA, DATA_HEADER, END, HELLO
from ezflow._core._protocol import PROTOCOL, pack_message
from ezflow._transports._stream import PublisherConnection, StreamTransport
from ezflow._transports._writer import IOV_MAX, VectoredWriter

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
    uvloop = None

MiB = 1024 * 1024


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def _described(fds: set[int]) -> dict[int, str]:
    details = {}
    for fd in fds:
        with contextlib.suppress(OSError):  # (gone by now: the listing's own)
            details[fd] = os.readlink(f"/proc/self/fd/{fd}")
    return details


@contextlib.contextmanager
def no_new_descriptors() -> Iterator[None]:
    """The block leaves no file descriptor open that was not open before it."""
    before = open_fds()
    yield
    leaked = _described(open_fds() - before)
    assert not leaked, f"descriptors left open: {leaked}"


@contextlib.asynccontextmanager
async def no_descriptors_left() -> AsyncIterator[None]:
    """:func:`no_new_descriptors` for a block whose transports close in the loop's
    next turns (connection_lost runs from call_soon): allow them a second."""
    before = open_fds()
    yield
    for _ in range(100):
        leaked = _described(open_fds() - before)
        if not leaked:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"descriptors left open: {leaked}")


@contextlib.contextmanager
def socket_pair(sndbuf: int = 16 * 1024) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected non-blocking Unix stream pair with a small send buffer (so that
    writes of more than a few KiB are partial)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        for sock in (a, b):
            sock.setblocking(False)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
        yield a, b
    finally:
        a.close()
        b.close()


class Events:
    """Records the writer's callbacks."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.errors: list[OSError] = []

    def writer(self, sock: socket.socket, high: int = 1 << 30) -> VectoredWriter:
        return VectoredWriter(
            asyncio.get_running_loop(),
            sock,
            high=high,
            pause=lambda: self.log.append("pause"),
            resume=lambda: self.log.append("resume"),
            failed=self.errors.append,
        )


async def read_all(sock: socket.socket, *, chunk: int = 65536, slow: bool = False) -> bytes:
    """Everything *sock* receives until EOF; *slow*: small reads with pauses between."""
    loop = asyncio.get_running_loop()
    out = bytearray()
    reads = 0
    while True:
        data = await loop.sock_recv(sock, chunk)
        if not data:
            return bytes(out)
        out += data
        reads += 1
        if slow and reads % 16 == 0:
            await asyncio.sleep(0.001)


# -- the writer alone ----------------------------------------------------------------------

# A part: mostly small, sometimes large enough to fill the socket several times over.
_parts = st.one_of(
    st.binary(min_size=0, max_size=64),
    st.integers(min_value=1, max_value=300 * 1024).map(os.urandom),
)
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), _parts),
        st.tuples(st.just("writelines"), st.lists(_parts, min_size=0, max_size=12)),
        st.tuples(st.just("yield"), st.just(b"")),
    ),
    min_size=1,
    max_size=25,
)


def _loops() -> list[Any]:
    return [asyncio.new_event_loop] + ([uvloop.new_event_loop] if uvloop is not None else [])


async def _through(
    make: str, operations: list[tuple[str, Any]], slow: bool, memoryviews: bool
) -> bytes:
    """What a socket peer receives when *operations* go through a VectoredWriter
    (*make* ``"writer"``) or the event loop's own transport (``"transport"``)."""
    loop = asyncio.get_running_loop()
    events = Events()
    transport: asyncio.BaseTransport | None = None
    with socket_pair() as (a, b):
        out: VectoredWriter | asyncio.WriteTransport
        if make == "writer":
            out = events.writer(a)
        else:
            transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
            out = cast(asyncio.WriteTransport, transport)
        reader = asyncio.ensure_future(read_all(b, chunk=4096 if slow else 65536, slow=slow))
        for op, arg in operations:
            if op == "write":
                out.write(memoryview(arg) if memoryviews else arg)
            elif op == "writelines":
                out.writelines([memoryview(p) if memoryviews else p for p in arg])
            else:
                await asyncio.sleep(0)
        out.write_eof()
        got = await asyncio.wait_for(reader, 30)
        if isinstance(out, VectoredWriter):
            out.close()
        elif transport is not None:
            transport.close()
            await asyncio.sleep(0)  # (its connection_lost closes its socket)
    assert events.errors == []
    return got


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=_operations, slow=st.booleans(), memoryviews=st.booleans())
def test_the_writer_sends_what_the_transport_sends(
    operations: list[tuple[str, Any]], slow: bool, memoryviews: bool
) -> None:
    """Differential: any mix of write / writelines / loop turns, with a reader fast or
    slow, arrives through the writer exactly as through the loop's own transport (the
    general path): the parts joined, in order, then EOF."""
    expected = b"".join(b"".join(arg) if op == "writelines" else arg for op, arg in operations)

    async def scenario() -> None:
        assert await _through("writer", operations, slow, memoryviews) == expected
        assert await _through("transport", operations, slow, memoryviews) == expected

    for factory in _loops():
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(scenario())


async def test_partial_sends_resume_without_copying_and_close_the_descriptor() -> None:
    data = np.random.default_rng(0).integers(0, 255, 3 * MiB, dtype=np.uint8)
    with no_new_descriptors(), socket_pair() as (a, b):
        events = Events()
        writer = events.writer(a)
        reader = asyncio.ensure_future(read_all(b, slow=True))
        writer.writelines([b"head", memoryview(data.data), b"tail"])
        assert writer.partial_sends == 1
        assert 0 < writer.get_write_buffer_size() < 3 * MiB + 8
        writer.write_eof()
        assert writer.is_closing()
        got = await asyncio.wait_for(reader, 30)
        assert got == b"head" + data.tobytes() + b"tail"
        writer.close()
        writer.close()  # idempotent


async def test_more_parts_than_iov_max_in_one_call() -> None:
    parts: list[bytes | memoryview] = [bytes([i % 251]) * (1 + i % 7) for i in range(3 * IOV_MAX)]
    with socket_pair(sndbuf=4096) as (a, b):
        events = Events()
        writer = events.writer(a)
        reader = asyncio.ensure_future(read_all(b))
        writer.writelines(list(parts))
        writer.writelines(list(parts))  # behind the first, while it waits
        writer.write_eof()
        got = await asyncio.wait_for(reader, 30)
        writer.close()
    assert got == b"".join(parts) * 2


async def test_pause_above_the_limit_resume_at_a_quarter() -> None:
    high = 256 * 1024
    with socket_pair() as (a, b):
        events = Events()
        writer = events.writer(a, high=high)
        writer.write(bytes(high))
        assert events.log == []  # at the limit, not above it (some went to the kernel)
        writer.writelines([bytes(high), bytes(high)])
        assert events.log == ["pause"]
        writer.write(b"x")
        assert events.log == ["pause"]  # once
        reader = asyncio.ensure_future(read_all(b, slow=True))
        while writer.get_write_buffer_size() > high // 4:
            assert events.log == ["pause"]
            await asyncio.sleep(0.001)
        await wait_until(lambda: events.log != ["pause"], "the writer resumes")
        assert events.log == ["pause", "resume"]
        writer.write_eof()
        assert len(await asyncio.wait_for(reader, 30)) == 3 * high + 1
        writer.close()


async def test_a_peer_that_resets_fails_the_writer_once_and_nothing_raises() -> None:
    with no_new_descriptors(), socket_pair() as (a, b):
        events = Events()
        writer = events.writer(a)
        writer.write(bytes(MiB))  # mostly waiting
        # Close with unread data: the kernel resets the connection.
        b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        b.close()
        for _ in range(100):
            if events.errors:
                break
            writer.write(b"more")
            await asyncio.sleep(0.01)
        assert len(events.errors) == 1
        assert isinstance(events.errors[0], (BrokenPipeError, ConnectionResetError))
        assert writer.is_closing()
        assert writer.get_write_buffer_size() == 0
        writer.writelines([b"ignored"])
        writer.write_eof()
        assert len(events.errors) == 1


# -- the transports, with real subscriber processes ----------------------------------------


def connections(ctx: ezflow.GraphContext, transport: str) -> list[PublisherConnection]:
    server: StreamTransport[Any] | None = tcp_of(ctx) if transport == "tcp" else shm_of(ctx)
    assert server is not None
    return [c for c in server.connections if c.link is not None]


def backlog(connection: PublisherConnection) -> int:
    assert connection.out is not None
    return connection.out.get_write_buffer_size()


@contextlib.asynccontextmanager
async def subscriber_child(
    server: ezflow.GraphServer, topic: str, transport: str, count: int, sizes: list[int]
) -> AsyncIterator[Child]:
    """A process with one subscriber checking ``mixed_payload(i, sizes)`` for i < count."""
    child = await Child.start(
        "subscribers",
        loop_kind(),
        address=list(server.address),
        topic=topic,
        subs=1,
        count=count,
        sizes=sizes,
        transport=transport,
    )
    try:
        await child.event("ready")
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGCONT)
        await child.aclose()


def uses_the_writer() -> bool:
    return loop_kind() == "asyncio"


@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_large_and_mixed_messages_arrive_exact_with_a_stopping_reader(
    server: ezflow.GraphServer, transport: str
) -> None:
    # 1 MiB, several MiB, small, a slot-sized one and inline ones (shm), in turn.
    sizes = [MiB, 4 * MiB, 17, 300 * 1024, 5, 64 * 1024 - 1, 3 * MiB + 7]
    count = 70
    async with (
        no_descriptors_left(),
        subscriber_child(server, "/w/mixed", transport, count, sizes) as child,
        ezflow.GraphContext(server.address, auto_start=False) as ctx,
    ):
        pub = await ctx.publisher("/w/mixed", transport=transport)
        await pub.wait_for_channels(1)
        (connection,) = connections(ctx, transport)
        assert (connection.writer is not None) == uses_the_writer()
        for i in range(count):
            if i % 10 == 0:
                os.kill(child.pid, signal.SIGSTOP)  # the reader stops ...
                asyncio.get_running_loop().call_later(0.05, os.kill, child.pid, signal.SIGCONT)
            await pub.publish(mixed_payload(i, sizes))
        done = await child.event("done", timeout=40)
        assert done["errors"] == [] and done["received"] == [count]
        if transport == "tcp" and connection.writer is not None:
            assert connection.writer.partial_sends > 0
        await child.stop()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_a_stopped_subscriber_makes_a_lossless_publisher_wait(
    server: ezflow.GraphServer, transport: str
) -> None:
    """With an in-flight window far above the write limit, the write limit holds the
    publisher; everything arrives once the subscriber reads again."""
    sizes = [MiB] if transport == "tcp" else [60 * 1024]  # (shm: inline, on the socket)
    count = 400
    async with (
        subscriber_child(server, "/w/stop", transport, count, sizes) as child,
        ezflow.GraphContext(server.address, auto_start=False) as ctx,
    ):
        pub = await ctx.publisher(
            "/w/stop", transport=transport, max_in_flight=100_000, max_in_flight_bytes=1 << 40
        )
        await pub.wait_for_channels(1)
        (connection,) = connections(ctx, transport)
        os.kill(child.pid, signal.SIGSTOP)
        sent = 0
        with pytest.raises(asyncio.TimeoutError):
            while sent < count:
                await asyncio.wait_for(pub.publish(mixed_payload(sent, sizes)), 1.0)
                sent += 1
        assert 0 < sent < count
        assert pub.statistics().waits >= 1
        assert backlog(connection) <= DATA_WRITE_BUFFER_LIMIT + PUBLISH_YIELD_BYTES + max(sizes)
        os.kill(child.pid, signal.SIGCONT)
        for i in range(sent, count):
            await pub.publish(mixed_payload(i, sizes))
        done = await child.event("done", timeout=40)
        assert done["errors"] == [] and done["received"] == [count]
        await child.stop()


def control(kind: int, message: dict[str, Any]) -> bytes:
    body = bytes([kind]) + pack_message(message)
    return struct.pack("<I", len(body)) + body


def hello(publisher_id: str, *, lossless: bool) -> bytes:
    return control(
        HELLO,
        {
            "op": "hello",
            "protocol": PROTOCOL,
            "publisher_id": publisher_id,
            "lossless": lossless,
            "max_message_size": 64 * MiB,
        },
    )


async def test_a_leaky_channel_that_stops_reading_stays_bounded(ctx: ezflow.GraphContext) -> None:
    """A leaky channel that never reads, under a window that bounds nothing: the
    publisher never waits, and the link's backlog stays within the write limit."""
    pub = await ctx.publisher("/w/leak", max_in_flight=100_000, max_in_flight_bytes=1 << 40)
    address = await tcp_of(ctx).start()
    _, writer = await asyncio.open_connection(*address)
    try:
        writer.write(hello(pub.id, lossless=False))  # then never reads a byte
        await pub.wait_for_channels(1)
        (connection,) = connections(ctx, "tcp")
        big = np.ones(MiB, dtype=np.uint8)
        peak = 0
        for _ in range(120):  # far more than the limit
            await asyncio.wait_for(pub.publish(big), 5)
            peak = max(peak, backlog(connection))
        assert pub.statistics().waits == 0
        assert pub.statistics().drops > 0
        assert peak <= DATA_WRITE_BUFFER_LIMIT + MiB + 64
    finally:
        writer.close()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_a_killed_subscriber_closes_only_its_connection(
    server: ezflow.GraphServer, transport: str
) -> None:
    sizes = [MiB, 100, 2 * MiB] if transport == "tcp" else [60 * 1024, 100]
    count = 60
    async with (
        no_descriptors_left(),
        subscriber_child(server, "/w/kill", transport, count, sizes) as survivor,
        subscriber_child(server, "/w/kill", transport, count, sizes) as victim,
        ezflow.GraphContext(server.address, auto_start=False) as ctx,
    ):
        pub = await ctx.publisher("/w/kill", transport=transport)
        await pub.wait_for_channels(2)
        os.kill(victim.pid, signal.SIGSTOP)  # a backlog builds up for it ...
        for i in range(count):
            if i == count // 3:
                os.kill(victim.pid, signal.SIGKILL)  # ... and it dies with it
            await asyncio.wait_for(pub.publish(mixed_payload(i, sizes)), 10)
        done = await survivor.event("done", timeout=40)
        assert done["errors"] == [] and done["received"] == [count]
        for _ in range(200):
            if pub.channels == 1:
                break
            await asyncio.sleep(0.01)
        assert pub.channels == 1
        assert len(connections(ctx, transport)) == 1
        await survivor.stop()


async def test_a_clean_close_delivers_everything_then_end(ctx: ezflow.GraphContext) -> None:
    """A slow raw reader: every DATA frame, in order and byte-exact, then END, then EOF."""
    codec = Codec()
    pub = await ctx.publisher("/w/close", max_in_flight=100_000, max_in_flight_bytes=1 << 40)
    address = await tcp_of(ctx).start()
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(hello(pub.id, lossless=False))
        await pub.wait_for_channels(1)
        (size,) = struct.unpack("<I", await reader.readexactly(4))
        await reader.readexactly(size)  # WELCOME
        sizes = [MiB, 3, 2 * MiB + 1, 70_000]
        messages = [mixed_payload(i, sizes) for i in range(12)]  # below the write limit
        for message in messages:
            await pub.publish(message)
        pub_closed = asyncio.ensure_future(pub.aclose())
        frames: list[bytes] = []
        while True:
            head = await asyncio.wait_for(reader.read(4), 10)
            if not head:
                break
            (size,) = struct.unpack("<I", head + await reader.readexactly(4 - len(head)))
            body = bytearray()
            while len(body) < size:
                body += await reader.read(min(size - len(body), 8192))
                await asyncio.sleep(0)  # slowly
            frames.append(bytes(body))
        # As a channel does once it has read up to END: close, which is what the
        # publisher's close waits for (else it gives up after CLOSE_TIMEOUT).
        writer.close()
        await asyncio.wait_for(pub_closed, 10)
    finally:
        writer.close()
    assert [f[0] for f in frames] == [DATA] * len(messages) + [END]
    for i, (message, frame) in enumerate(zip(messages, frames, strict=False)):
        _, _, seq, _, _ = DATA_HEADER.unpack_from(frame)
        assert seq == i + 1
        decoded = codec.decode(frame[DATA_HEADER.size :])
        assert isinstance(decoded, np.ndarray) and np.array_equal(decoded, message)


async def test_publishing_large_arrays_copies_nothing(server: ezflow.GraphServer) -> None:
    """On the stock loop a 4 MiB array goes to the socket from its own memory: the
    publisher's traced allocations stay far below one message."""
    size, count = 4 * MiB, 24
    async with (
        subscriber_child(server, "/w/copy", "tcp", count, [size]) as child,
        ezflow.GraphContext(server.address, auto_start=False) as ctx,
    ):
        pub = await ctx.publisher("/w/copy", transport="tcp")
        await pub.wait_for_channels(1)
        messages = [mixed_payload(i, [size]) for i in range(count)]
        await pub.publish(messages[0])
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            for message in messages[1:]:
                await pub.publish(message)
            done = await child.event("done", timeout=40)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert done["errors"] == []
        assert peak < size // 4, f"{peak} bytes allocated while publishing {size}-byte arrays"
        await child.stop()
