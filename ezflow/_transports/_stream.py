"""What the socket transports (tcp, shm) share: one stream per (publisher, channel).

Every process that publishes runs one data server per socket transport. A channel
connects to it, says which publisher it wants (``HELLO``), gets ``WELCOME``, and from
then on receives ``DATA`` frames (and, over shm, ``SHM_DATA`` notifications) and sends
back ``ACK`` frames with its cumulative release figures (coalesced) and ``MODE`` when
it turns lossless or leaky. A publisher that closes on purpose sends ``END`` and
half-closes; the channel closes once it has read up to there.

Authentication (:mod:`ezflow._core._auth`): ``HELLO`` carries the channel's ``nonce``.
A data server with a token answers it with a ``WELCOME`` frame whose map is
``{"op": "challenge", "nonce", "proof"}``; the channel checks the proof and sends a
``HELLO`` frame ``{"op": "auth", "proof"}``, and only then comes the real ``WELCOME``
(or a refusal with ``"cause": "auth"``). A connection that breaks the protocol or is
late in its handshake gets such a refusal too (``"cause"``: ``"protocol"``,
``"timeout"``); past the handshake one is only closed (no frame says why). Refused and
bad connections are logged per cause, rate-limited
(:class:`~ezflow._core._peerlog.BadPeerLog`): ``timeout``, ``protocol``, ``auth`` and
``refused`` before the handshake, ``frame`` (a malformed frame) and ``silent`` (past the
heartbeat deadline) after it.

Sending is batched without delaying a lone message: a message sent ``_PACED_GAP_NS`` or
more after the previous one on its connection (a paced publisher) is written at once and
schedules nothing (lowest latency). In a burst,
the iteration's messages, its first one too, are queued and handed to
``transport.writelines`` (one vectored write) at the end of the iteration, or as soon as
``_FLUSH_MESSAGES`` / ``_FLUSH_BYTES`` are queued, so that the subscriber starts working
on large bodies while the publisher is still encoding. Small messages go out as one joined ``bytes``
object. Array buffers are never copied on the way out: uvloop's ``writelines`` is
vectored, and on the stock asyncio loop (whose ``writelines`` joins the parts) a
:class:`~._writer.VectoredWriter` writes the connection instead, from the handshake on.
On both, a connection's unsent backlog is bounded by ``DATA_WRITE_BUFFER_LIMIT``: above
it the link has no room (:meth:`PublisherConnection.pause_writing`).

Channels acknowledge releases as soon as a quarter of the publisher's window (messages
or bytes, both sent in ``WELCOME``) has been released, else at the end of the event-loop
iteration, so a publisher rarely stalls on a full window while its subscriber is busy.
Receiving uses :class:`~ezflow._core._framing.FramedProtocol`: large frames are read
straight into their own buffer, and arrays are decoded as views into it.

Subclasses (:mod:`._tcp`, :mod:`._shm`) say how to listen and connect, and may handle
further frame kinds through the ``*_frame`` hooks. The publisher half of a connection
lives in :mod:`._stream_publish`, the channel half in :mod:`._stream_channel`, what both
write and read in :mod:`._stream_frames`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from .._core._auth import Credentials, Initiator
from .._core._channel import Channel
from .._core._config import (
    CONNECT_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    heartbeat_deadline_from_env,
)
from .._core._config import DATA_CLOSE_TIMEOUT as CLOSE_TIMEOUT
from .._core._exceptions import (
    AuthenticationError,
    BrokenResourceError,
    EzflowTimeoutError,
    ProtocolError,
)
from .._core._outlet import Outlet
from .._core._peerlog import BadPeerLog
from .._core._protocol import PublisherInfo, field
from ._base import Inbound, Transport
from ._stream_channel import ChannelConnection
from ._stream_publish import PublisherConnection, StreamLink

__all__ = ["StreamTransport"]

log = logging.getLogger("ezflow.stream")

AddressT = TypeVar("AddressT")


class _StreamInbound(Inbound):
    def __init__(self, connection: ChannelConnection, transport: str) -> None:
        self._connection = connection
        self.transport = transport  # type: ignore[misc]

    def close(self) -> None:
        self._connection.close()


class StreamTransport(Transport, Generic[AddressT]):
    """Data server for this process's publishers, and connector for its channels.

    Subclasses implement :meth:`listen`, :meth:`connect` and :meth:`where`, and may
    override the hooks (:meth:`tune`, :meth:`make_link`, :meth:`channel_frame`,
    :meth:`link_lost`, :meth:`new_channel_connection`).
    """

    name: ClassVar[str]
    #: Whether connections carry heartbeats (``HEARTBEAT`` frames, both ways): a peer
    #: on another host can vanish without its socket closing; one on this host cannot.
    heartbeats: ClassVar[bool] = False

    def __init__(self, *, max_message_size: int, credentials: Credentials | None = None) -> None:
        self.max_message_size = max_message_size
        #: token (required of every channel) and TLS settings; none by default
        self.credentials = Credentials() if credentials is None else credentials
        #: bad connections to the data server, logged per cause, rate-limited
        self.bad_peers = BadPeerLog(log, f"{self.name} data server")
        #: ``EZFLOW_HEARTBEAT_DEADLINE`` when this transport uses heartbeats, else None
        self.heartbeat_deadline: float | None = (
            heartbeat_deadline_from_env() if self.heartbeats else None
        )
        #: publishers this process's channels declared dead (silent past the deadline)
        self.dead_publishers = 0
        self.outlets: dict[str, Outlet] = {}
        self.connections: set[PublisherConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._address: AddressT | None = None
        self._starting: asyncio.Lock | None = None

    @property
    def address(self) -> AddressT | None:
        """Where the data server listens (``None`` until it has started)."""
        return self._address

    async def start(self) -> AddressT:
        """Start the data server if it is not running; return its address."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._address is None:
                self._server, self._address = await self.listen(self._new_connection)
                log.debug("%s data server listening on %s", self.name, self._address)
        return self._address

    def _new_connection(self) -> PublisherConnection:
        return PublisherConnection(self)

    # -- what subclasses provide ------------------------------------------------------

    @abstractmethod
    async def listen(
        self, factory: Callable[[], PublisherConnection]
    ) -> tuple[asyncio.AbstractServer, AddressT]:
        """Start listening for channels; return the server and its address."""

    @abstractmethod
    async def connect(
        self, factory: Callable[[], ChannelConnection], publisher: PublisherInfo
    ) -> ChannelConnection:
        """Open a stream to *publisher*'s data server (raise ``OSError`` on failure)."""

    @abstractmethod
    def where(self, publisher: PublisherInfo) -> str:
        """The publisher's data-server address, for error messages."""

    def tune(self, transport: asyncio.BaseTransport) -> None:
        """Set socket options on a new connection (either side)."""

    def make_link(
        self, connection: PublisherConnection, outlet: Outlet, hello: dict[str, Any]
    ) -> tuple[StreamLink, dict[str, Any]]:
        """The link for an accepted HELLO, and extra WELCOME fields. Raise
        :class:`BrokenResourceError` to refuse the channel with that reason."""
        return (
            StreamLink(
                connection,
                lossless=bool(hello.get("lossless")),
                max_size=field(hello, "max_message_size", int),
            ),
            {},
        )

    def channel_frame(
        self, connection: PublisherConnection, link: StreamLink, kind: int, body: bytes | memoryview
    ) -> None:
        """A frame other than ACK / MODE from a channel past its handshake."""
        raise ProtocolError(f"unexpected frame kind {kind} from a channel")

    def link_lost(self, connection: PublisherConnection, outlet: Outlet, link: StreamLink) -> None:
        """*link*'s connection is gone (after ``outlet.remove_link``)."""

    def new_channel_connection(
        self, channel: Channel, publisher: PublisherInfo, on_lost: Callable[[], None]
    ) -> ChannelConnection:
        return ChannelConnection(channel, publisher, self.max_message_size, on_lost)

    def _channel_connection(
        self, channel: Channel, publisher: PublisherInfo, on_lost: Callable[[], None]
    ) -> ChannelConnection:
        connection = self.new_channel_connection(channel, publisher, on_lost)
        connection.heartbeat_deadline = self.heartbeat_deadline
        connection.on_dead = self._publisher_dead
        return connection

    def _publisher_dead(self) -> None:
        self.dead_publishers += 1

    # -- Transport ------------------------------------------------------------------------

    def add_outlet(self, outlet: Outlet, options: Any = None) -> None:
        self.outlets[outlet.publisher_id] = outlet

    def remove_outlet(self, outlet: Outlet) -> None:
        if self.outlets.get(outlet.publisher_id) is outlet:
            del self.outlets[outlet.publisher_id]

    async def open_channel(
        self, channel: Channel, publisher: PublisherInfo, *, on_lost: Callable[[], None]
    ) -> Inbound:
        where = (
            f"publisher {publisher.publisher_id} on topic {publisher.topic!r} at "
            f"{self.where(publisher)}"
        )
        initiator = Initiator(self.credentials.token, "data", where)

        def factory() -> ChannelConnection:
            connection = self._channel_connection(channel, publisher, on_lost)
            connection.initiator = initiator
            return connection

        try:
            connection = await asyncio.wait_for(self.connect(factory, publisher), CONNECT_TIMEOUT)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise EzflowTimeoutError(
                f"cannot connect to {where} within {CONNECT_TIMEOUT} s"
            ) from exc
        except ssl.SSLError as exc:
            raise AuthenticationError(
                f"TLS handshake with {where} failed: {exc.reason or exc}; both ends need "
                "certificates signed by the same CA (EZFLOW_TLS_CERT/_KEY/_CA)"
            ) from exc
        except OSError as exc:
            raise BrokenResourceError(f"cannot connect to {where}: {exc}") from exc
        try:
            await asyncio.wait_for(asyncio.shield(connection.welcome), HANDSHAKE_TIMEOUT)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            connection.close()
            raise EzflowTimeoutError(f"{where} did not answer HELLO in time") from exc
        except BaseException:
            connection.close()
            raise
        return _StreamInbound(connection, self.name)

    async def wait_closed(self, outlet: Outlet) -> None:
        """After ``outlet.close()``: wait (at most ``CLOSE_TIMEOUT``) until every channel
        it fed has read up to ``END`` and closed its connection."""
        closing = [c.closed for c in self.connections if c.outlet is outlet and not c.closed.done()]
        if closing:
            await asyncio.wait(closing, timeout=CLOSE_TIMEOUT)

    async def aclose(self) -> None:
        """Close every outlet (each channel gets what was published, then ``END``), stop
        listening, and wait up to ``CLOSE_TIMEOUT`` for each channel to read up to
        ``END`` before aborting connections that are still not done. Cancelled while
        waiting, it aborts them at once."""
        for outlet in list(self.outlets.values()):
            outlet.close()
        self.outlets.clear()
        self.bad_peers.close()
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self.connections):
            if connection.link is None:
                connection.abort()  # still in its handshake: nothing to deliver
        closing = [c.closed for c in self.connections if not c.closed.done()]
        try:
            if closing:
                _, late = await asyncio.wait(closing, timeout=CLOSE_TIMEOUT)
                if late:
                    log.warning(
                        "%d %s subscriber connections did not take their last messages "
                        "within %.0f s; closing them anyway",
                        len(late),
                        self.name,
                        CLOSE_TIMEOUT,
                    )
        finally:
            # Also when cancelled while waiting: nothing stays open.
            for connection in list(self.connections):
                connection.abort()
            self.connections.clear()
        if server is not None:
            try:
                await asyncio.wait_for(server.wait_closed(), 2.0)
            except (TimeoutError, asyncio.TimeoutError):
                log.debug("%s data server still closing after 2 s", self.name)
