"""The raw floor of the machine, measured in the same run as the suites.

* :func:`socketpair_rtt` — round trips of a fixed-size message between this process
  and a child over ``socket.socketpair()``, both on uvloop (asyncio when uvloop is
  missing) with plain ``BufferedProtocol``s; the child echoes each *complete* message
  (store and forward, as one pub/sub hop would), so RTT/2 is the one-way floor of a
  hop between two processes at that size;
* :func:`memcpy_bandwidth` — bytes per second numpy copies between two 64 MiB buffers
  of random data (beyond any cache): the ceiling of every copy a transport makes.

``python -m ezflow._perf._floor echo FD SIZE`` is the child's role; it ends by itself
when its socket closes, so an interrupted parent never leaves it behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from typing import Any

import numpy as np

__all__ = ["memcpy_bandwidth", "socketpair_rtt"]

_CHILD_TIMEOUT = 30.0


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


async def socketpair_rtt(size: int, round_trips: int, warmup: int) -> list[int]:
    """Round-trip times (ns) of *round_trips* ping-pongs of *size* bytes with a child
    process over a socketpair, after *warmup* unrecorded ones. The child always ends."""
    loop = asyncio.get_running_loop()
    parent_sock, child_sock = socket.socketpair()
    process: asyncio.subprocess.Process | None = None
    transport: asyncio.BaseTransport | None = None
    try:
        with child_sock:
            fd = child_sock.fileno()
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, "echo", str(fd), str(size),
                pass_fds=(fd,), start_new_session=True,
            )  # fmt: skip
        transport, pinger = await loop.create_connection(
            lambda: _Pinger(size, warmup + round_trips), sock=parent_sock
        )
        pinger.ping()
        await asyncio.wait_for(pinger.done, _CHILD_TIMEOUT)
        return pinger.rtt_ns[warmup:]
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


async def _echo_child(fd: int, size: int) -> None:
    sock = socket.socket(fileno=fd)
    _, echo = await asyncio.get_running_loop().create_connection(lambda: _Echo(size), sock=sock)
    await echo.closed


if __name__ == "__main__":
    if sys.argv[1:2] != ["echo"] or len(sys.argv) != 4:
        sys.exit("usage: python -m ezflow._perf._floor echo FD SIZE")
    from .._core._loop import run_coroutine

    run_coroutine(_echo_child(int(sys.argv[2]), int(sys.argv[3])))
