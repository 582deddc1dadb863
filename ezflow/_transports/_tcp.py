"""The TCP transport: one connection per (publisher, subscribing process).

The data server of a process binds the host its graph-server connection uses, on a
free port, and is advertised with every publisher it serves. Connections carry the
frames described in :mod:`._stream`, with ``TCP_NODELAY`` set on both ends (the
batching there already groups small messages; Nagle would only add latency). With TLS
settings (:class:`~ezflow._core._auth.Credentials`) both ends wrap the connection in TLS
and verify each other's certificate; the zero-copy writer is not used then.

A peer on another host can vanish without its socket closing (a cable, a black-holed
route, a powered-off machine): tcp connections carry heartbeats and TCP keepalive
(:mod:`ezflow._core._liveness`), and a peer silent for ``EZFLOW_HEARTBEAT_DEADLINE``
seconds is declared dead.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from typing import Any, ClassVar

from .._core._auth import Credentials
from .._core._config import Address, format_address
from .._core._liveness import tune_keepalive
from .._core._outlet import Outlet
from .._core._protocol import PublisherInfo
from ._base import Transport, TransportSettings
from ._stream import StreamTransport
from ._stream_channel import ChannelConnection
from ._stream_publish import PublisherConnection, StreamLink

__all__ = ["TcpTransport"]


def on_this_host(local: object, peer: object) -> bool:
    """Whether a connection between socket addresses *local* and *peer* (as
    ``getsockname`` / ``getpeername`` give them) stays on this host: the peer is a
    loopback address or this very address. False for anything else, unknown included."""
    if not (isinstance(local, tuple) and isinstance(peer, tuple) and local and peer):
        return False
    try:
        here = ipaddress.ip_address(str(local[0]).split("%")[0])
        there = ipaddress.ip_address(str(peer[0]).split("%")[0])
    except ValueError:
        return False
    if isinstance(there, ipaddress.IPv6Address) and there.ipv4_mapped is not None:
        there = there.ipv4_mapped
    if isinstance(here, ipaddress.IPv6Address) and here.ipv4_mapped is not None:
        here = here.ipv4_mapped
    return there.is_loopback or there == here


class TcpTransport(StreamTransport[Address]):
    """Data server for this process's publishers, and connector for its channels."""

    name: ClassVar[str] = "tcp"
    heartbeats: ClassVar[bool] = True

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        max_message_size: int,
        credentials: Credentials | None = None,
    ) -> None:
        super().__init__(max_message_size=max_message_size, credentials=credentials)
        self._host = host

    @classmethod
    def from_settings(cls, settings: TransportSettings) -> Transport:
        return cls(
            host=settings.host,
            max_message_size=settings.max_message_size,
            credentials=settings.credentials,
        )

    async def advertise(self, *, optional: bool = True) -> dict[str, Any]:
        """``{"address": [host, port]}``: every registration carries one (required)."""
        return {"address": list(await self.start())}

    async def listen(
        self, factory: Callable[[], PublisherConnection]
    ) -> tuple[asyncio.AbstractServer, Address]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            factory, self._host, 0, backlog=256, ssl=self.credentials.server_ssl
        )
        sockname = server.sockets[0].getsockname()
        return server, (sockname[0], sockname[1])

    async def connect(
        self, factory: Callable[[], ChannelConnection], publisher: PublisherInfo
    ) -> ChannelConnection:
        host, port = publisher.address
        _, connection = await asyncio.get_running_loop().create_connection(
            factory, host, port, ssl=self.credentials.client_ssl
        )
        return connection

    def where(self, publisher: PublisherInfo) -> str:
        return format_address(publisher.address)

    def make_link(
        self, connection: PublisherConnection, outlet: Outlet, hello: dict[str, Any]
    ) -> tuple[StreamLink, dict[str, Any]]:
        link, extra = super().make_link(connection, outlet, hello)
        # A channel on this host may be waiting for this very CPU, as over shm: a paced
        # publish hands off to it (ShmOptions.handoff). One on another host is not.
        transport = connection.transport
        if outlet.handoff and transport is not None:
            link.handoff = on_this_host(
                transport.get_extra_info("sockname"), transport.get_extra_info("peername")
            )
        return link, extra

    def tune(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tune_keepalive(sock, self.heartbeat_deadline or 0.0)
