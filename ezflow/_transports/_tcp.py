"""The TCP transport: one connection per (publisher, subscribing process).

Every process that publishes runs one data server (an asyncio server bound to the host
its graph-server connection uses). A channel connects to it, says which publisher it
wants (``HELLO``), gets ``WELCOME``, and from then on receives ``DATA`` frames and sends
back ``ACK`` frames with its cumulative release figures (coalesced: at most one per
event-loop iteration) and ``MODE`` when it turns lossless or leaky.

Sending is batched without delaying a lone message: the first message of an event-loop
iteration is written at once (lowest latency for paced publishers); later ones are queued
and handed to ``transport.writelines`` (one vectored write) at the end of the iteration,
or as soon as ``_FLUSH_MESSAGES`` / ``_FLUSH_BYTES`` are queued, so that the subscriber
starts working while the publisher is still encoding. On uvloop (and Python >= 3.12's
loop) the array buffers are not copied on the way out; Python 3.11's stock loop joins
the parts of a ``writelines`` call into one buffer.

Channels acknowledge releases as soon as a quarter of the publisher's window (sent in
``WELCOME``) has been released, else at the end of the event-loop iteration, so a
publisher rarely stalls on a full window while its subscriber is busy.
Receiving uses :class:`~ezflow._core._framing.FramedProtocol`: large frames are read
straight into their own buffer, and arrays are decoded as views into it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any, ClassVar, cast

from .._core._channel import Channel
from .._core._codec import EncodedMessage
from .._core._config import (
    CONNECT_TIMEOUT,
    HANDSHAKE_MAX_FRAME_SIZE,
    HANDSHAKE_TIMEOUT,
    MAX_CHANNELS_PER_PUBLISHER,
    Address,
    format_address,
)
from .._core._exceptions import BrokenResourceError, EzflowTimeoutError, ProtocolError
from .._core._framing import (
    ACK,
    ACK_BODY,
    DATA,
    DATA_HEADER,
    DATA_PREFIX,
    END,
    HELLO,
    MODE,
    WELCOME,
    FramedProtocol,
    frame,
)
from .._core._outlet import Link, Outlet
from .._core._protocol import PROTOCOL, PublisherInfo, field, pack_message, unpack_message
from ._base import Inbound, Transport

__all__ = ["TcpTransport"]

log = logging.getLogger("ezflow.tcp")

_HEADER_SIZE = DATA_HEADER.size
# Flush a batch early once this much is queued (see the module docstring).
_FLUSH_MESSAGES = 16
_FLUSH_BYTES = 256 * 1024
# Seconds a closing data connection may take to hand its last bytes to the kernel.
_CLOSE_TIMEOUT = 5.0
_END_FRAME = frame(bytes([END]))


def _tune(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _control(kind: int, message: dict[str, Any]) -> bytes:
    return frame(bytes([kind]) + pack_message(message))


def _unpack_control(body: bytes | memoryview) -> dict[str, Any]:
    return unpack_message(memoryview(body)[1:])


# -- publisher side ------------------------------------------------------------------------


class _TcpLink(Link):
    transport = "tcp"
    needs_encoding = True

    def __init__(self, connection: _PublisherConnection, *, lossless: bool, max_size: int) -> None:
        super().__init__(lossless=lossless, max_message_size=max_size)
        self._connection = connection
        self._loop = asyncio.get_running_loop()
        self._queued: list[bytes | memoryview] = []
        self._queued_messages = 0
        self._queued_bytes = 0
        self._flush_scheduled = False

    def send(self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage | None) -> None:
        assert encoded is not None
        size = encoded.nbytes
        self.sent_count += 1
        self.sent_bytes += size
        queued = self._queued
        queued.append(DATA_PREFIX.pack(_HEADER_SIZE + size, DATA, 0, seq, time_ns, self.drops))
        queued.extend(encoded.parts)
        if not self._flush_scheduled:
            # First message of this loop iteration: out now. The rest of the iteration's
            # messages are collected and flushed together by the callback.
            self._flush_scheduled = True
            self._loop.call_soon(self._end_of_iteration)
            self._flush()
            return
        self._queued_messages += 1
        self._queued_bytes += size
        if self._queued_messages >= _FLUSH_MESSAGES or self._queued_bytes >= _FLUSH_BYTES:
            self._flush()

    def _end_of_iteration(self) -> None:
        self._flush_scheduled = False
        self._flush()

    def _flush(self) -> None:
        queued, self._queued = self._queued, []
        self._queued_messages = self._queued_bytes = 0
        transport = self._connection.transport
        if queued and transport is not None and not transport.is_closing():
            transport.writelines(queued)

    def close(self) -> None:
        """Flush what is queued, then tell the channel this is a clean end.

        Only our sending side is shut down: we keep reading (the channel's last ACKs)
        until the channel, having read up to END, closes. Closing a socket with unread
        input would make the kernel reset the connection and throw away data the
        channel had not read yet.
        """
        self._flush()
        transport = self._connection.transport
        if transport is not None and not transport.is_closing():
            transport.write(_END_FRAME)
            if transport.can_write_eof():
                transport.write_eof()
            else:  # pragma: no cover - TCP transports can always half-close
                transport.close()


class _PublisherConnection(FramedProtocol):
    """A channel connected to one of this process's publishers."""

    def __init__(self, server: TcpTransport) -> None:
        super().__init__(HANDSHAKE_MAX_FRAME_SIZE)
        self._server = server
        self.link: _TcpLink | None = None
        self.outlet: Outlet | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        _tune(transport)
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT, self._late)

    def _late(self) -> None:
        if self.link is None:
            log.warning(
                "data server: closing connection from %s: no HELLO within %.0f s",
                self.peer_name(),
                HANDSHAKE_TIMEOUT,
            )
            self.abort()

    def frame_received(self, body: bytes | memoryview) -> None:
        if not body:
            raise ProtocolError("empty frame")
        kind = body[0]
        link = self.link
        if link is not None:
            if kind == ACK:
                if len(body) != ACK_BODY.size:
                    raise ProtocolError(f"ACK frame of {len(body)} bytes")
                _, count, nbytes = ACK_BODY.unpack(body)
                link.released(count, nbytes)
            elif kind == MODE:
                link.set_lossless(bool(_unpack_control(body).get("lossless")))
            else:
                raise ProtocolError(f"unexpected frame kind {kind} from a channel")
            return
        if kind != HELLO:
            raise ProtocolError(f"expected HELLO, got frame kind {kind}")
        hello = _unpack_control(body)
        if hello.get("protocol") != PROTOCOL:
            self._refuse(f"protocol {hello.get('protocol')!r} is not {PROTOCOL!r}")
            return
        publisher_id = field(hello, "publisher_id", str)
        max_size = field(hello, "max_message_size", int)
        outlet = self._server.outlets.get(publisher_id)
        if outlet is None or outlet.closed:
            self._refuse(f"no publisher {publisher_id!r} in this process")
            return
        if len(outlet.links) >= MAX_CHANNELS_PER_PUBLISHER:
            self._refuse(
                f"publisher {publisher_id!r} already feeds {MAX_CHANNELS_PER_PUBLISHER} "
                "channels (MAX_CHANNELS_PER_PUBLISHER)"
            )
            return
        if self._timer is not None:
            self._timer.cancel()
        self.link = _TcpLink(self, lossless=bool(hello.get("lossless")), max_size=max_size)
        self.outlet = outlet
        outlet.add_link(self.link)
        assert self.transport is not None
        welcome = {"op": "welcome", "ok": True, "max_in_flight": outlet.max_in_flight}
        self.transport.write(_control(WELCOME, welcome))

    def _refuse(self, reason: str) -> None:
        log.warning("data server: refusing channel from %s: %s", self.peer_name(), reason)
        assert self.transport is not None
        self.transport.write(_control(WELCOME, {"op": "welcome", "ok": False, "error": reason}))
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.closed.done():
            self.closed.set_result(None)
        self._server._connections.discard(self)
        if self.outlet is not None and self.link is not None:
            self.outlet.remove_link(self.link)


# -- subscriber side -----------------------------------------------------------------------


class _ChannelConnection(FramedProtocol):
    """This process's channel, connected to a publisher elsewhere."""

    def __init__(
        self,
        channel: Channel,
        publisher: PublisherInfo,
        max_size: int,
        on_lost: Callable[[], None],
    ) -> None:
        super().__init__(max_size + _HEADER_SIZE)
        self.channel = channel
        self.publisher = publisher
        self._max_size = max_size
        self.welcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._on_lost: Callable[[], None] | None = on_lost
        self._ack_scheduled = False
        self._released = (0, 0)
        self._acked_count = 0
        self._ack_every = 1
        self._ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        _tune(transport)
        cast(asyncio.Transport, transport).write(
            _control(
                HELLO,
                {
                    "op": "hello",
                    "protocol": PROTOCOL,
                    "publisher_id": self.publisher.publisher_id,
                    "lossless": self.channel.lossless,
                    "max_message_size": self._max_size,
                },
            )
        )

    def frame_received(self, body: bytes | memoryview) -> None:
        kind = body[0] if body else 0
        if kind == DATA:
            if len(body) < _HEADER_SIZE:
                raise ProtocolError(f"DATA frame of {len(body)} bytes")
            _, _, seq, _, drops = DATA_HEADER.unpack_from(body)
            self.channel.deliver_body(seq, memoryview(body)[_HEADER_SIZE:], drops)
        elif kind == END:
            # Everything the publisher sent came before END: close our side now, which
            # also tells the publisher its last messages arrived.
            self._ended = True
            if self.transport is not None:
                self.transport.close()
        elif kind == WELCOME and not self.welcome.done():
            reply = _unpack_control(body)
            if reply.get("ok"):
                window = reply.get("max_in_flight")
                if isinstance(window, int) and window > 0:
                    self._ack_every = max(1, window // 4)
                self.channel.on_release = self._on_release
                self.channel.on_mode_change = self._on_mode_change
                self.welcome.set_result(None)
            else:
                self.welcome.set_exception(
                    BrokenResourceError(f"publisher refused the channel: {reply.get('error')}")
                )
        else:
            raise ProtocolError(f"unexpected frame kind {kind} from a publisher")

    def protocol_error(self, exc: ProtocolError) -> None:
        log.error(
            "closing connection to publisher %s on topic %r: %s",
            self.publisher.publisher_id,
            self.publisher.topic,
            exc,
        )
        self.abort()

    def _on_release(self, count: int, nbytes: int) -> None:
        self._released = (count, nbytes)
        if count - self._acked_count >= self._ack_every:
            self._send_ack()
        elif not self._ack_scheduled:
            self._ack_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_ack)

    def _scheduled_ack(self) -> None:
        self._ack_scheduled = False
        if self._released[0] > self._acked_count:
            self._send_ack()

    def _send_ack(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            count, nbytes = self._released
            self._acked_count = count
            transport.write(frame(ACK_BODY.pack(ACK, count, nbytes)))

    def _on_mode_change(self, lossless: bool) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(_control(MODE, {"op": "mode", "lossless": lossless}))

    def close(self) -> None:
        self._on_lost = None
        self.channel.on_release = None
        self.channel.on_mode_change = None
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.welcome.done():
            self.welcome.set_exception(
                BrokenResourceError(
                    f"publisher {self.publisher.publisher_id} closed the connection during "
                    "the handshake"
                )
            )
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            if self._ended:
                log.debug("publisher %s ended cleanly", self.publisher.publisher_id)
            else:
                log.info(
                    "publisher %s on topic %r went away without closing (%s)",
                    self.publisher.publisher_id,
                    self.publisher.topic,
                    exc or "connection closed",
                )
            on_lost()


class _TcpInbound(Inbound):
    transport = "tcp"

    def __init__(self, connection: _ChannelConnection) -> None:
        self._connection = connection

    def close(self) -> None:
        self._connection.close()


class TcpTransport(Transport):
    """Data server for this process's publishers, and connector for its channels."""

    name: ClassVar[str] = "tcp"

    def __init__(self, *, host: str = "127.0.0.1", max_message_size: int) -> None:
        self._host = host
        self.max_message_size = max_message_size
        self.outlets: dict[str, Outlet] = {}
        self._server: asyncio.AbstractServer | None = None
        self._address: Address | None = None
        self._connections: set[_PublisherConnection] = set()
        self._starting: asyncio.Lock | None = None

    @property
    def address(self) -> Address | None:
        """Where the data server listens (``None`` until the first publisher)."""
        return self._address

    async def start(self) -> Address:
        """Start the data server if it is not running; return its address."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._address is None:
                loop = asyncio.get_running_loop()
                self._server = await loop.create_server(
                    self._new_connection, self._host, 0, backlog=256
                )
                sockname = self._server.sockets[0].getsockname()
                self._address = (sockname[0], sockname[1])
                log.debug("data server listening on %s", format_address(self._address))
        return self._address

    def _new_connection(self) -> _PublisherConnection:
        connection = _PublisherConnection(self)
        self._connections.add(connection)
        return connection

    def add_outlet(self, outlet: Outlet) -> None:
        self.outlets[outlet.publisher_id] = outlet

    def remove_outlet(self, outlet: Outlet) -> None:
        if self.outlets.get(outlet.publisher_id) is outlet:
            del self.outlets[outlet.publisher_id]

    async def open_channel(
        self, channel: Channel, publisher: PublisherInfo, *, on_lost: Callable[[], None]
    ) -> Inbound:
        loop = asyncio.get_running_loop()
        host, port = publisher.address
        where = f"publisher {publisher.publisher_id} on topic {publisher.topic!r} at " + (
            format_address(publisher.address)
        )
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _ChannelConnection(channel, publisher, self.max_message_size, on_lost),
                    host,
                    port,
                ),
                CONNECT_TIMEOUT,
            )
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise EzflowTimeoutError(
                f"cannot connect to {where} within {CONNECT_TIMEOUT} s"
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
        return _TcpInbound(connection)

    async def wait_closed(self, outlet: Outlet) -> None:
        """After ``outlet.close()``: wait (at most ``_CLOSE_TIMEOUT``) until every channel
        it fed has read up to ``END`` and closed its connection."""
        closing = [
            c.closed for c in self._connections if c.outlet is outlet and not c.closed.done()
        ]
        if closing:
            await asyncio.wait(closing, timeout=_CLOSE_TIMEOUT)

    async def aclose(self) -> None:
        """Close every outlet (each channel gets what was published, then ``END``), stop
        listening, and wait up to ``_CLOSE_TIMEOUT`` for each channel to read up to
        ``END`` before aborting connections that are still not done. Cancelled while
        waiting, it aborts them at once."""
        for outlet in list(self.outlets.values()):
            outlet.close()
        self.outlets.clear()
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self._connections):
            if connection.link is None:
                connection.abort()  # still in its handshake: nothing to deliver
        closing = [c.closed for c in self._connections if not c.closed.done()]
        try:
            if closing:
                _, late = await asyncio.wait(closing, timeout=_CLOSE_TIMEOUT)
                if late:
                    log.warning(
                        "%d subscriber connections did not take their last messages within "
                        "%.0f s; closing them anyway",
                        len(late),
                        _CLOSE_TIMEOUT,
                    )
        finally:
            # Also when cancelled while waiting: nothing stays open.
            for connection in list(self._connections):
                connection.abort()
            self._connections.clear()
        if server is not None:
            try:
                await asyncio.wait_for(server.wait_closed(), 2.0)
            except (TimeoutError, asyncio.TimeoutError):
                log.debug("data server still closing after 2 s")
