"""A framed connection on a real loopback socket, for tests of ``FramedProtocol``
(tests/test_framing.py) and of its heartbeat (tests/test_liveness.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from ezflow._core._framing import FramedProtocol

ReceiverT = TypeVar("ReceiverT", bound="Receiver")


class Receiver(FramedProtocol):
    """Collects frames and counts the reads the event loop hands it."""

    def __init__(self) -> None:
        super().__init__(max_frame_size=1 << 24)
        self.frames: list[bytes] = []
        self.reads = 0
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def buffer_updated(self, nbytes: int) -> None:
        self.reads += 1
        super().buffer_updated(nbytes)

    def frame_received(self, body: bytes | memoryview) -> None:
        self.frames.append(bytes(body))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)

    def low_water(self) -> int:
        """The mark the kernel holds reads back for on the receiving socket."""
        assert self.transport is not None
        sock = self.transport.get_extra_info("socket")
        return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))


@contextlib.asynccontextmanager
async def receiving(
    protocol: Callable[[], ReceiverT],
) -> AsyncIterator[tuple[ReceiverT, socket.socket]]:
    """A *protocol* (a Receiver) behind a real TCP listener on loopback, and a
    non-blocking client socket connected to it; both closed on leaving."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[ReceiverT] = loop.create_future()

    def make() -> ReceiverT:
        receiver = protocol()
        accepted.set_result(receiver)
        return receiver

    server = await loop.create_server(make, "127.0.0.1", 0)
    client = socket.socket()
    client.setblocking(False)
    try:
        await loop.sock_connect(client, server.sockets[0].getsockname())
        receiver = await asyncio.wait_for(accepted, 5)
        yield receiver, client
    finally:
        client.close()
        server.close()
        await server.wait_closed()
        if accepted.done():
            transport = accepted.result().transport
            if transport is not None:
                transport.abort()
