"""Raw socket floors for the ezflow benchmarks: no framework, just two Python processes.

Both ends use plain asyncio Protocols (``BufferedProtocol``, reading straight into a
preallocated buffer) on uvloop by default, so the figures are the best a Python process
pair can hope for on this machine:

* :func:`pingpong_rtt` — round trips of a fixed-size message over ``socket.socketpair()``
  (or TCP loopback); the child echoes each *complete* message back (store and forward,
  as a pub/sub hop would), so ``RTT / 2`` is the one-way floor for that size;
* :func:`paced_one_way` — one-way latency over TCP loopback (or a Unix stream socket)
  of messages sent every 1 ms, timestamped by the sender (both processes idle in
  between, as in a paced pub/sub benchmark);
* :func:`stream_rate` — one-way throughput over TCP loopback (or a Unix stream socket)
  with one ``transport.write`` per message and the transport's own flow control
  (``pause_writing``/``resume_writing``).

Run ``python perf/_floor.py [--loop asyncio]`` for a standalone measurement. The
``echo``, ``send`` and ``pace`` sub-commands are the roles of the child processes; a
child ends by itself when the parent's socket goes away, so an interrupted parent never
leaves one behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import statistics
import struct
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import uvloop

__all__ = [
    "LOOPS",
    "Rate",
    "new_event_loop",
    "paced_one_way",
    "pingpong_rtt",
    "run",
    "stream_rate",
]

T = TypeVar("T")

#: Event loops a floor can run on.
LOOPS = ("uvloop", "asyncio")

_SCRIPT = str(Path(__file__).resolve())
_RECV_CHUNK = 256 * 1024
_CHILD_TIMEOUT = 30.0
_STAMP = struct.Struct("=q")


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new event loop of *kind* (``"uvloop"`` or ``"asyncio"``)."""
    if kind == "uvloop":
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    if kind == "asyncio":
        return asyncio.new_event_loop()
    raise ValueError(f"unknown event loop {kind!r}; use one of {', '.join(LOOPS)}")


def run(main: Coroutine[Any, Any, T], loop: str = "uvloop") -> T:
    """Run *main* to completion on a new event loop of kind *loop*, like
    :func:`asyncio.run`. On Ctrl-C the coroutine is cancelled and its ``finally``
    blocks (which end child processes) run before the interrupt propagates."""
    event_loop = new_event_loop(loop)
    task = event_loop.create_task(main)
    try:
        return event_loop.run_until_complete(task)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                event_loop.run_until_complete(task)
        event_loop.close()


def _set_nodelay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on TCP transports (a no-op for Unix sockets)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _spawn(
    loop: str, *args: str, pass_fds: tuple[int, ...] = ()
) -> asyncio.subprocess.Process:
    """Start this script as a child process in one of its roles."""
    return await asyncio.create_subprocess_exec(
        sys.executable, _SCRIPT, "--loop", loop, *args, pass_fds=pass_fds
    )


async def _reap(process: asyncio.subprocess.Process) -> None:
    """Wait briefly for *process* to exit by itself, then kill it."""
    try:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(process.wait(), 5.0)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# -- round trip --------------------------------------------------------------------------


class _FixedSizeProtocol(asyncio.BufferedProtocol):
    """Reads a stream of *size*-byte messages into one reusable buffer; subclasses act
    in :meth:`buffer_updated` once ``self._filled == size``."""

    def __init__(self, size: int) -> None:
        self._buffer = memoryview(bytearray(size))
        self._filled = 0
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport: cast, don't check.
        self._transport = cast(asyncio.Transport, transport)
        _set_nodelay(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer[self._filled :]


class _Pinger(_FixedSizeProtocol):
    """Sends one message, waits for the complete echo, records the round trip, repeats."""

    def __init__(self, size: int, total: int) -> None:
        super().__init__(size)
        self._payload = os.urandom(size)
        self._total = total
        self._sent_at = 0
        self.rtt_ns: list[int] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def ping(self) -> None:
        """Send the next message and start its clock."""
        assert self._transport is not None
        self._sent_at = time.perf_counter_ns()
        self._transport.write(self._payload)

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._filled < len(self._buffer):
            return
        self.rtt_ns.append(time.perf_counter_ns() - self._sent_at)
        self._filled = 0
        if len(self.rtt_ns) < self._total:
            self.ping()
        elif not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"echo child went away: {exc}"))


class _Echo(_FixedSizeProtocol):
    """Child side of :func:`pingpong_rtt`: echoes every complete *size*-byte message."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._filled == len(self._buffer):
            self._filled = 0
            # Safe to reuse the buffer: the next message only comes after this one has
            # been received in full by the parent.
            assert self._transport is not None
            self._transport.write(self._buffer)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def pingpong_rtt(
    size: int = 64,
    round_trips: int = 2000,
    warmup: int = 200,
    *,
    over: str = "socketpair",
    loop: str = "uvloop",
) -> list[int]:
    """Round-trip times (ns) of *round_trips* ping-pongs of *size* bytes between this
    process and a child, after *warmup* unrecorded ones.

    *over* is ``"socketpair"`` (a ``socket.socketpair()``, the reference floor) or
    ``"tcp"`` (a TCP loopback connection with ``TCP_NODELAY``, what ezflow's tcp
    transport rides on). This process must be running an event loop; the child runs one
    of kind *loop*.
    """
    event_loop = asyncio.get_running_loop()
    process: asyncio.subprocess.Process | None = None
    transport: asyncio.BaseTransport | None = None
    parent_sock: socket.socket | None = None
    try:
        if over == "socketpair":
            parent_sock, child_sock = socket.socketpair()
            with child_sock:
                fd = str(child_sock.fileno())
                process = await _spawn(
                    loop, "echo", "--fd", fd, "--size", str(size), pass_fds=(child_sock.fileno(),)
                )
        elif over == "tcp":
            with socket.create_server(("127.0.0.1", 0)) as listener:
                listener.setblocking(False)
                port = str(listener.getsockname()[1])
                process = await _spawn(loop, "echo", "--port", port, "--size", str(size))
                parent_sock, _ = await asyncio.wait_for(
                    event_loop.sock_accept(listener), _CHILD_TIMEOUT
                )
        else:
            raise ValueError(f"over={over!r}: use 'socketpair' or 'tcp'")
        transport, pinger = await event_loop.create_connection(
            lambda: _Pinger(size, warmup + round_trips), sock=parent_sock
        )
        parent_sock = None  # the transport owns it now
        pinger.ping()
        await asyncio.wait_for(pinger.done, _CHILD_TIMEOUT)
        return pinger.rtt_ns[warmup:]
    finally:
        if transport is not None:
            transport.close()
        if parent_sock is not None:
            parent_sock.close()
        if process is not None:
            await _reap(process)


# -- throughput --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rate:
    """A throughput measurement: *messages* of *size* bytes received in *seconds*."""

    size: int
    messages: float
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        """Messages per second."""
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Megabytes (10**6 bytes) of payload per second."""
        return self.msgs_per_s * self.size / 1e6


class _Counter(asyncio.BufferedProtocol):
    """Receiving side of :func:`stream_rate`: counts bytes from the first to the last."""

    def __init__(self, expected: int, max_seconds: float) -> None:
        self._scratch = memoryview(bytearray(_RECV_CHUNK))
        self._expected = expected
        self._max_ns = int(max_seconds * 1e9)
        self._received = 0
        self._first_ns = 0
        self._first_bytes = 0
        self._transport: asyncio.Transport | None = None
        self.result: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport: cast, don't check.
        self._transport = cast(asyncio.Transport, transport)
        _set_nodelay(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        now = time.perf_counter_ns()
        if not self._received:
            self._first_ns, self._first_bytes = now, nbytes
        self._received += nbytes
        elapsed = now - self._first_ns
        if (self._received >= self._expected or elapsed >= self._max_ns) and not self.result.done():
            # Bytes after the first read, over the time since the first read.
            self.result.set_result((self._received - self._first_bytes, elapsed))
            assert self._transport is not None
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.result.done():
            self.result.set_exception(ConnectionError(f"sender went away early: {exc}"))


class _Sender(asyncio.Protocol):
    """Sending side of :func:`stream_rate`: tracks the transport's flow control."""

    def __init__(self) -> None:
        self._resumed: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self._resumed = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed is not None and not resumed.done():
            resumed.set_result(None)

    async def room(self) -> None:
        """Wait while the transport is paused."""
        if self._resumed is not None:
            await self._resumed

    def connection_lost(self, exc: Exception | None) -> None:
        self.resume_writing()
        if not self.closed.done():
            self.closed.set_result(None)


async def _from_sender(
    receiver: asyncio.BaseProtocol,
    done: asyncio.Future[T],
    loop: str,
    *args: str,
    timeout: float,
    over: str = "tcp",
) -> T:
    """Serve *receiver* on a TCP loopback port (``over="tcp"``) or an abstract Unix
    socket (``"unix"``), start a child sending to it (``ARGS --port PORT`` or ``ARGS
    --unix NAME``) and return what *done* resolves to."""
    event_loop = asyncio.get_running_loop()
    if over == "unix":
        name = f"ezflow-floor-{secrets.token_hex(8)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind("\0" + name)
        sock.listen(1)
        sock.setblocking(False)
        server = await event_loop.create_unix_server(lambda: receiver, sock=sock)
        where = ("--unix", name)
    else:
        server = await event_loop.create_server(lambda: receiver, "127.0.0.1", 0)
        where = ("--port", str(server.sockets[0].getsockname()[1]))
    process: asyncio.subprocess.Process | None = None
    try:
        process = await _spawn(loop, *args, *where)
        return await asyncio.wait_for(done, timeout)
    finally:
        server.close()
        if process is not None:
            await _reap(process)


async def stream_rate(
    size: int, count: int, *, max_seconds: float = 5.0, loop: str = "uvloop", over: str = "tcp"
) -> Rate:
    """Throughput over TCP loopback (``over="unix"``: a Unix stream socket) of *count*
    messages of *size* bytes, written by a child process one ``transport.write`` each as
    fast as flow control allows, measured at the receiving end (this process) from the
    first read to the last, or until *max_seconds*.
    """
    counter = _Counter(size * count, max_seconds)
    args = ("send", "--size", str(size), "--count", str(count))
    nbytes, elapsed_ns = await _from_sender(
        counter, counter.result, loop, *args, timeout=max_seconds + _CHILD_TIMEOUT, over=over
    )
    return Rate(size=size, messages=nbytes / size, seconds=elapsed_ns / 1e9)


# -- paced one-way latency ---------------------------------------------------------------


class _StampReceiver(_FixedSizeProtocol):
    """Receiving side of :func:`paced_one_way`: reads each message into one buffer and
    records its arrival time minus the send time in its first 8 bytes."""

    def __init__(self, size: int, total: int) -> None:
        super().__init__(size)
        self._total = total
        self.one_way_ns: list[int] = []
        self.done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._filled < len(self._buffer):
            return
        now = time.perf_counter_ns()
        self._filled = 0
        self.one_way_ns.append(now - _STAMP.unpack_from(self._buffer)[0])
        if len(self.one_way_ns) == self._total and not self.done.done():
            self.done.set_result(self.one_way_ns)
            assert self._transport is not None
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"sender went away early: {exc}"))


async def paced_one_way(
    size: int = 64,
    count: int = 1000,
    warmup: int = 100,
    *,
    period: float = 0.001,
    loop: str = "uvloop",
    over: str = "tcp",
) -> list[int]:
    """One-way times (ns) of *count* messages of *size* bytes sent over TCP loopback
    (``over="unix"``: a Unix stream socket) by a child process every *period* seconds,
    after *warmup* unrecorded ones.

    The child writes ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared by the
    processes of one host) into the first 8 bytes; this process subtracts it from its
    own clock once the whole message has arrived. Unlike :func:`pingpong_rtt`, both
    processes sleep between messages, as a paced publisher and its subscriber do.
    """
    receiver = _StampReceiver(size, warmup + count)
    args = ("pace", "--size", str(size), "--count", str(warmup + count), "--period", str(period))
    timeout = (warmup + count) * period * 3 + _CHILD_TIMEOUT
    samples = await _from_sender(receiver, receiver.done, loop, *args, timeout=timeout, over=over)
    return samples[warmup:]


# -- child roles and the standalone measurement ------------------------------------------


async def _echo_child(fd: int | None, port: int | None, size: int) -> None:
    """Echo over the inherited socketpair end *fd*, or over TCP to 127.0.0.1:*port*."""
    event_loop = asyncio.get_running_loop()
    if fd is not None:
        sock = socket.socket(fileno=fd)
    else:
        assert port is not None
        sock = socket.create_connection(("127.0.0.1", port))
    _, echo = await event_loop.create_connection(lambda: _Echo(size), sock=sock)
    await echo.closed


async def _connect(where: int | str) -> tuple[asyncio.Transport, _Sender]:
    """Connect a :class:`_Sender` to 127.0.0.1:*where* (a port) or the abstract Unix
    socket *where* (a name)."""
    event_loop = asyncio.get_running_loop()
    if isinstance(where, str):
        # uvloop takes an abstract address only through a connected socket.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        await event_loop.sock_connect(sock, "\0" + where)
        connected = await event_loop.create_unix_connection(_Sender, sock=sock)
    else:
        connected = await event_loop.create_connection(_Sender, "127.0.0.1", where)
    transport, sender = connected
    _set_nodelay(transport)
    return transport, sender


async def _send_child(where: int | str, size: int, count: int) -> None:
    """Child of :func:`stream_rate`: write *count* messages as fast as allowed."""
    transport, sender = await _connect(where)
    payload = os.urandom(size)
    for _ in range(count):
        await sender.room()
        if sender.closed.done():
            return  # the receiver has seen enough
        transport.write(payload)
    transport.close()  # flushes what is buffered first
    await sender.closed


async def _pace_child(where: int | str, size: int, count: int, period: float) -> None:
    """Child of :func:`paced_one_way`: send a timestamped message every *period*."""
    transport, sender = await _connect(where)
    tail = os.urandom(size - _STAMP.size)  # immutable: safe to hand over without a copy
    for _ in range(count):
        if sender.closed.done():
            return
        transport.writelines([_STAMP.pack(time.perf_counter_ns()), tail])
        await asyncio.sleep(period)
    transport.close()
    await sender.closed


def _p50_p99_us(samples_ns: list[int]) -> str:
    """Median and 99th percentile of *samples_ns*, formatted in µs."""
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered) / 1e3:8.1f} µs, p99 {p99 / 1e3:8.1f} µs"


async def _measure(loop: str) -> None:
    """The standalone measurement: every floor, printed."""
    sizes = ((64, 2000), (1 << 20, 300))
    for over in ("socketpair", "tcp"):
        for size, count in sizes:
            rtt = await pingpong_rtt(size, count, over=over, loop=loop)
            print(f"{over:>10} ping-pong RTT     {size:>8} B: {_p50_p99_us(rtt)}")
    for over in ("unix", "tcp"):
        for size, count in sizes:
            one_way = await paced_one_way(size, count // 2, loop=loop, over=over)
            print(f"{over:>10} one-way, 1 ms pacing {size:>8} B: {_p50_p99_us(one_way)}")
    for over in ("unix", "tcp"):
        for size, count in ((64, 200_000), (1 << 20, 2000)):
            rate = await stream_rate(size, count, loop=loop, over=over)
            print(
                f"{over:>10} stream            {size:>8} B: {rate.msgs_per_s:11,.0f} msgs/s, "
                f"{rate.mb_per_s:,.1f} MB/s"
            )


def main(argv: list[str] | None = None) -> None:
    """Command line: a standalone floor measurement, or one of the child roles."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=LOOPS, default="uvloop")
    roles = parser.add_subparsers(dest="role")
    echo = roles.add_parser("echo", help="(child) echo complete messages")
    where = echo.add_mutually_exclusive_group(required=True)
    where.add_argument("--fd", type=int, help="an inherited socketpair end")
    where.add_argument("--port", type=int, help="connect to 127.0.0.1:PORT")
    echo.add_argument("--size", type=int, required=True)
    send = roles.add_parser("send", help="(child) stream messages to the parent")
    to = send.add_mutually_exclusive_group(required=True)
    to.add_argument("--port", type=int, help="connect to 127.0.0.1:PORT")
    to.add_argument("--unix", help="connect to the abstract Unix socket NAME")
    send.add_argument("--size", type=int, required=True)
    send.add_argument("--count", type=int, required=True)
    pace = roles.add_parser("pace", help="(child) send timestamped messages to the parent")
    to = pace.add_mutually_exclusive_group(required=True)
    to.add_argument("--port", type=int, help="connect to 127.0.0.1:PORT")
    to.add_argument("--unix", help="connect to the abstract Unix socket NAME")
    pace.add_argument("--size", type=int, required=True)
    pace.add_argument("--count", type=int, required=True)
    pace.add_argument("--period", type=float, required=True)
    args = parser.parse_args(argv)
    if args.role == "echo":
        run(_echo_child(args.fd, args.port, args.size), args.loop)
    elif args.role == "send":
        run(_send_child(args.unix or args.port, args.size, args.count), args.loop)
    elif args.role == "pace":
        run(_pace_child(args.unix or args.port, args.size, args.count, args.period), args.loop)
    else:
        run(_measure(args.loop), args.loop)


if __name__ == "__main__":
    main()
