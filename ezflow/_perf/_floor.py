"""The raw floor of the machine, measured in the same run as the suites.

* :func:`socketpair_rtt` — round trips of a fixed-size message between this process
  and a child over ``socket.socketpair()``, both on uvloop (asyncio when uvloop is
  missing) with plain ``BufferedProtocol``s; the child echoes each *complete* message
  (store and forward, as one pub/sub hop would), so RTT/2 is the one-way floor of a
  hop between two processes at that size;
* :func:`memcpy_bandwidth` — bytes per second numpy copies between two 64 MiB buffers
  of random data (beyond any cache): the ceiling of every copy a transport makes;
* :func:`memcpy_seconds` — what one copy of a message of a given size costs (the
  floor of a transport that copies each message once, e.g. into shared memory);
* :func:`paced_one_way` and :func:`stream_rate` — the like-for-like floors of the p2p
  suite's two phases, over a Unix socketpair (``unix``, next to shm) or a TCP loopback
  connection (``tcp``): a child sends timestamped messages every *period* seconds and
  this process takes the time once each has arrived in full (both processes idle in
  between, as a paced publisher and its subscriber are), or the child writes
  messages back to back, one ``transport.write`` each under the transport's flow
  control, and this process counts them from the first read to the last.

``python -m ezflow._perf._floor echo|pace|send FD SIZE [COUNT PERIOD | SECONDS]`` are
the child's roles, on the event loop ezflow picks (uvloop when installed); a child
ends by itself when its socket closes, so an interrupted parent never leaves it
behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

__all__ = [
    "memcpy_bandwidth",
    "memcpy_seconds",
    "paced_one_way",
    "socketpair_rtt",
    "stream_rate",
]

_CHILD_TIMEOUT = 30.0
_STAMP = struct.Struct("=q")
#: Bytes :class:`_Counter` reads at a time.
_RECV_CHUNK = 256 * 1024


class _FixedSize(asyncio.BufferedProtocol):
    """Reads a stream of *size*-byte messages into one reusable buffer."""

    def __init__(self, size: int) -> None:
        self.buffer = bytearray(np.random.default_rng().integers(0, 256, size, dtype=np.uint8))
        self.view = memoryview(self.buffer)
        self.filled = 0
        self.transport: Any = None  # uvloop's transports do not derive from asyncio's
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == len(self.buffer):
            self.filled = 0
            self.complete()

    def complete(self) -> None:
        raise NotImplementedError

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class _Echo(_FixedSize):
    def complete(self) -> None:
        # The next message comes only after the parent has this one in full: the
        # buffer can be reused at once.
        self.transport.write(self.buffer)


class _Pinger(_FixedSize):
    def __init__(self, size: int, total: int) -> None:
        super().__init__(size)
        self.total = total
        self.rtt_ns: list[int] = []
        self.sent_at = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def ping(self) -> None:
        self.sent_at = time.perf_counter_ns()
        self.transport.write(self.buffer)

    def complete(self) -> None:
        self.rtt_ns.append(time.perf_counter_ns() - self.sent_at)
        if len(self.rtt_ns) < self.total:
            self.ping()
        elif not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"echo child went away: {exc}"))


def _connected_pair(over: str) -> tuple[socket.socket, socket.socket]:
    """Two connected stream sockets: a Unix socketpair (``unix``) or the two ends of a
    TCP loopback connection with Nagle off (``tcp``)."""
    if over == "unix":
        return socket.socketpair()
    if over != "tcp":
        raise ValueError(f"over={over!r}: use 'unix' or 'tcp'")
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    for sock in (client, accepted):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return accepted, client


@contextlib.asynccontextmanager
async def _with_child(
    protocol: asyncio.BaseProtocol, role: str, *args: int | float, over: str = "unix"
) -> AsyncIterator[asyncio.BaseTransport]:
    """Connect *protocol* to one end of a :func:`_connected_pair`, start a child in
    *role* on the other end; on the way out close the connection (the child's cue to
    end), wait a few seconds for the child, then kill it: it never outlives the block."""
    loop = asyncio.get_running_loop()
    parent_sock, child_sock = _connected_pair(over)
    process: asyncio.subprocess.Process | None = None
    transport: asyncio.BaseTransport | None = None
    try:
        with child_sock:
            fd = child_sock.fileno()
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, role, str(fd), *map(str, args),
                pass_fds=(fd,), start_new_session=True,
            )  # fmt: skip
        transport, _ = await loop.create_connection(lambda: protocol, sock=parent_sock)
        yield transport
    finally:
        if transport is not None:
            transport.close()
        else:
            parent_sock.close()
        if process is not None:
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(process.wait(), 5.0)
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()


async def socketpair_rtt(size: int, round_trips: int, warmup: int) -> list[int]:
    """Round-trip times (ns) of *round_trips* ping-pongs of *size* bytes with a child
    process over a socketpair, after *warmup* unrecorded ones. The child always ends."""
    pinger = _Pinger(size, warmup + round_trips)
    async with _with_child(pinger, "echo", size):
        pinger.ping()
        await asyncio.wait_for(pinger.done, _CHILD_TIMEOUT)
    return pinger.rtt_ns[warmup:]


class _StampReceiver(_FixedSize):
    """Receiving side of :func:`paced_one_way`: the arrival time of each complete
    message minus the send time in its first 8 bytes."""

    def __init__(self, size: int, total: int) -> None:
        super().__init__(size)
        self.total = total
        self.one_way_ns: list[int] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def complete(self) -> None:
        self.one_way_ns.append(time.perf_counter_ns() - _STAMP.unpack_from(self.buffer)[0])
        if len(self.one_way_ns) == self.total and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"pacing child went away: {exc}"))


async def paced_one_way(
    size: int, count: int, warmup: int, *, period: float = 0.001, over: str = "unix"
) -> list[int]:
    """One-way times (ns) of *count* messages of *size* bytes (at least 8) that a child
    sends every *period* seconds over *over* (``unix`` or ``tcp``), after *warmup*
    unrecorded ones. The child always ends."""
    receiver = _StampReceiver(size, warmup + count)
    async with _with_child(receiver, "pace", size, warmup + count, period, over=over):
        await asyncio.wait_for(receiver.done, (warmup + count) * period * 3 + _CHILD_TIMEOUT)
    return receiver.one_way_ns[warmup:]


class _Counter(asyncio.BufferedProtocol):
    """Receiving side of :func:`stream_rate`: bytes from the first read to the end."""

    def __init__(self) -> None:
        self.scratch = memoryview(bytearray(_RECV_CHUNK))
        self.received = 0
        self.first_bytes = 0
        self.first_ns = self.last_ns = 0
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.scratch

    def buffer_updated(self, nbytes: int) -> None:
        now = time.perf_counter_ns()
        if not self.received:
            self.first_ns, self.first_bytes = now, nbytes
        self.received += nbytes
        self.last_ns = now

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def stream_rate(size: int, seconds: float, *, over: str = "unix") -> float:
    """Messages/s of *size* bytes a child writes back to back for *seconds* over
    *over* (``unix`` or ``tcp``), counted here from the first read to the last (the
    bytes of the first read excluded). The child always ends."""
    counter = _Counter()
    async with _with_child(counter, "send", size, seconds, over=over):
        await asyncio.wait_for(counter.closed, seconds + _CHILD_TIMEOUT)
    elapsed = (counter.last_ns - counter.first_ns) / 1e9
    return (counter.received - counter.first_bytes) / size / elapsed if elapsed > 0 else 0.0


def memcpy_bandwidth(nbytes: int = 64 * 1024 * 1024, seconds: float = 0.3) -> float:
    """Bytes per second of ``numpy.copyto`` between two *nbytes* random buffers, the
    best of repeated copies over about *seconds*."""
    source = np.random.default_rng().integers(0, 256, nbytes, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)  # fault the pages in first
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        started = time.perf_counter()
        np.copyto(target, source)
        elapsed = time.perf_counter() - started
        best = max(best, nbytes / elapsed)
        if time.perf_counter() >= deadline:
            return best


def memcpy_seconds(size: int, *, budget: int = 64 * 1024 * 1024, rounds: int = 5) -> float:
    """Seconds one ``numpy.copyto`` of *size* random bytes takes: the median over
    *rounds* of batches that copy about *budget* bytes in all (many copies per batch
    for small sizes, so that the clock's resolution does not count)."""
    source = np.random.default_rng().integers(0, 256, size, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)  # fault the pages in first
    batch = max(1, budget // rounds // size)
    timings = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        for _ in range(batch):
            np.copyto(target, source)
        timings.append((time.perf_counter_ns() - started) / batch / 1e9)
    return float(np.median(timings))


class _Sender(asyncio.Protocol):
    """Sending side of the child roles: the transport's flow control, and its end."""

    def __init__(self) -> None:
        self.resumed: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self.resumed = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        resumed, self.resumed = self.resumed, None
        if resumed is not None and not resumed.done():
            resumed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.resume_writing()
        if not self.closed.done():
            self.closed.set_result(None)


async def _child(role: str, fd: int, size: int, args: list[str]) -> None:
    """The child's *role* on the inherited socket *fd* (see the module docstring)."""
    sock = socket.socket(fileno=fd)
    loop = asyncio.get_running_loop()
    if role == "echo":
        _, echo = await loop.create_connection(lambda: _Echo(size), sock=sock)
        await echo.closed
        return
    transport, sender = await loop.create_connection(_Sender, sock=sock)
    payload = np.random.default_rng().integers(0, 256, size, dtype=np.uint8).tobytes()
    if role == "pace":
        count, period = int(args[0]), float(args[1])
        tail = payload[_STAMP.size :]  # immutable: safe to hand over without a copy
        due = time.monotonic()
        for _ in range(count):
            if sender.closed.done():
                return
            transport.writelines([_STAMP.pack(time.perf_counter_ns()), tail])
            due += period
            await asyncio.sleep(max(0.0, due - time.monotonic()))
    else:  # send
        stop = time.perf_counter() + float(args[0])
        while time.perf_counter() < stop and not sender.closed.done():
            transport.write(payload)
            if sender.resumed is not None:
                await sender.resumed
    transport.close()  # flushes what is buffered first
    await sender.closed


if __name__ == "__main__":
    if sys.argv[1:2] not in (["echo"], ["pace"], ["send"]) or len(sys.argv) < 4:
        sys.exit("usage: python -m ezflow._perf._floor echo|pace|send FD SIZE [ARGS]")
    from .._core._loop import run_coroutine

    run_coroutine(_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]))
