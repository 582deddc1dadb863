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

Sending is batched without delaying a lone message: the first message of an event-loop
iteration is written at once (lowest latency for paced publishers). Unless it came
``_PACED_GAP_NS`` or more after the previous one written at once (a paced publisher,
which then schedules nothing), later ones are queued and handed to
``transport.writelines`` (one vectored write) at the end of the iteration, or as soon as
``_FLUSH_MESSAGES`` / ``_FLUSH_BYTES`` are queued, so that the subscriber starts working
while the publisher is still encoding. Small messages go out as one joined ``bytes``
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
further frame kinds through the ``*_frame`` hooks.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
import sys
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar, cast

from .._core._auth import Credentials, Initiator
from .._core._channel import Channel
from .._core._codec import EncodedMessage
from .._core._config import (
    CONNECT_TIMEOUT,
    DATA_WRITE_BUFFER_LIMIT,
    HANDSHAKE_MAX_FRAME_SIZE,
    HANDSHAKE_TIMEOUT,
    MAX_CHANNELS_PER_PUBLISHER,
    heartbeat_deadline_from_env,
)
from .._core._config import DATA_CLOSE_TIMEOUT as CLOSE_TIMEOUT
from .._core._config import PACED_GAP_NS as _PACED_GAP_NS
from .._core._config import STREAM_FLUSH_BYTES as _FLUSH_BYTES
from .._core._config import STREAM_FLUSH_MESSAGES as _FLUSH_MESSAGES
from .._core._exceptions import (
    AuthenticationError,
    BrokenResourceError,
    EzflowTimeoutError,
    ProtocolError,
)
from .._core._framing import (
    ACK,
    ACK_BODY,
    DATA,
    DATA_HEADER,
    DATA_PREFIX,
    END,
    HEARTBEAT,
    HEARTBEAT_BODY,
    HELLO,
    MODE,
    TRACE,
    WELCOME,
    FramedProtocol,
    frame,
)
from .._core._handshake import AcceptingHandshake, Challenge, refuse
from .._core._liveness import Heartbeat
from .._core._outlet import Link, Outlet
from .._core._peerlog import BadPeerLog
from .._core._protocol import PROTOCOL, PublisherInfo, field, pack_message, unpack_message
from .._core._tracing import TRACING, WireTrace
from ._base import Inbound, Transport
from ._writer import VectoredWriter, WriteHalf, vectored_writes_pay

__all__ = ["ChannelConnection", "PublisherConnection", "StreamLink", "StreamTransport"]

log = logging.getLogger("ezflow.stream")

HEADER_SIZE = DATA_HEADER.size
_DATA_PREFIX_SIZE = DATA_PREFIX.size
# A one-part message this small is joined to its header and written as one object.
_JOIN_BELOW = 4096
_END_FRAME = frame(bytes([END]))

AddressT = TypeVar("AddressT")


def control(kind: int, message: dict[str, Any]) -> bytes:
    """A handshake frame: the kind byte and a msgpack map."""
    return frame(bytes([kind]) + pack_message(message))


def unpack_control(body: bytes | memoryview) -> dict[str, Any]:
    return unpack_message(memoryview(body)[1:])


def heartbeat_frame(deadline: float) -> bytes:
    """A ``HEARTBEAT`` frame announcing *deadline* (seconds; 0: heartbeats off)."""
    return frame(HEARTBEAT_BODY.pack(HEARTBEAT, round(deadline * 1000)))


def heartbeat_received(heartbeat: Heartbeat | None, body: bytes | memoryview) -> None:
    """A ``HEARTBEAT`` frame arrived (its bytes already counted as life): learn the
    peer's deadline."""
    if len(body) != HEARTBEAT_BODY.size:
        raise ProtocolError(f"HEARTBEAT frame of {len(body)} bytes")
    _, milliseconds = HEARTBEAT_BODY.unpack(body)
    if heartbeat is not None:
        heartbeat.peer_announced(milliseconds / 1000)


# -- publisher side ------------------------------------------------------------------------


class StreamLink(Link):
    """Sends one outlet's messages to one channel over a stream, batched.

    A message larger than :attr:`out_of_line_above` is first offered to
    :meth:`send_out_of_line` (the shm transport's shared memory); every other message,
    and one that hook declines, goes inline as a ``DATA`` frame.
    """

    needs_encoding = True
    #: Messages (encoded bytes) above this size are offered to :meth:`send_out_of_line`.
    out_of_line_above: int = sys.maxsize

    def __init__(self, connection: PublisherConnection, *, lossless: bool, max_size: int) -> None:
        super().__init__(lossless=lossless, max_message_size=max_size)
        self.connection = connection
        self._loop = asyncio.get_running_loop()
        self._queued: list[bytes | memoryview] = []
        self._queued_messages = 0
        self._queued_bytes = 0
        self._flush_scheduled = False
        self._written_ns = 0  # publish time (time.time_ns) of the last message written at once
        self.inline_sends = 0  #: messages sent as DATA frames

    def send(self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage | None) -> None:
        # One function down to the write: this is the per-message path of a publisher.
        assert encoded is not None
        size = encoded.nbytes
        self.sent_count += 1
        self.sent_bytes += size
        if size > self.out_of_line_above and self.send_out_of_line(seq, time_ns, message, encoded):
            return
        self.inline_sends += 1
        head = DATA_PREFIX.pack(HEADER_SIZE + size, DATA, 0, seq, time_ns, self.drops)
        parts = encoded.parts
        if not self._flush_scheduled:
            # First message of this loop iteration: out now, in as few calls as possible.
            out = self.connection.out
            if out is not None and not out.is_closing():
                if len(parts) == 1 and size <= _JOIN_BELOW:
                    out.write(head + parts[0])
                else:
                    out.writelines([head, *parts])
            if time_ns - self._written_ns < _PACED_GAP_NS:
                # A burst: collect the rest of this iteration's messages and write them
                # together at its end. A paced publisher schedules nothing (whatever
                # runs before its loop sleeps again delays a subscriber on this CPU).
                self._flush_scheduled = True
                self._loop.call_soon(self._end_of_iteration)
            self._written_ns = time_ns
            return
        queued = self._queued
        queued.append(head)
        queued.extend(parts)
        self._queued_one(size)

    def send_traced(
        self,
        seq: int,
        time_ns: int,
        message: Any,
        encoded: EncodedMessage | None,
        trace: WireTrace,
    ) -> None:
        # A TRACE frame right before the message's own frame, queued with it so that
        # nothing comes between them; written with it in one call unless a batch of
        # this loop iteration is being collected anyway.
        self._queued.append(trace.frame())
        if self._flush_scheduled:
            self.send(seq, time_ns, message, encoded)
            return
        self._flush_scheduled = True  # (send queues)
        try:
            self.send(seq, time_ns, message, encoded)
        finally:
            self._flush_scheduled = False
        self.flush()
        self._written_ns = time_ns

    def send_small(self, seq: int, time_ns: int, message: Any, body: bytes) -> None:
        # send(), for one small bytes body written at once: the paced publisher's path,
        # where every attribute and call counts (caches are cold after each sleep).
        size = len(body)
        out = self.connection.out
        if (
            self._flush_scheduled
            or size > self.out_of_line_above
            or out is None
            or out.is_closing()
        ):
            self.send(seq, time_ns, message, EncodedMessage([body], size))
            return
        self.sent_count += 1
        self.sent_bytes += size
        self.inline_sends += 1
        out.write(DATA_PREFIX.pack(HEADER_SIZE + size, DATA, 0, seq, time_ns, self.drops) + body)
        if time_ns - self._written_ns < _PACED_GAP_NS:
            self._flush_scheduled = True
            self._loop.call_soon(self._end_of_iteration)
        self._written_ns = time_ns

    def send_out_of_line(
        self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage
    ) -> bool:
        """Send a message above :attr:`out_of_line_above` some other way than inline,
        and return True; return False (having sent nothing) to send it inline."""
        return False

    def queue_frame(self, data: bytes) -> None:
        """Queue one complete frame (length prefix included) as one message."""
        self._queued.append(data)
        self._queued_one(len(data))

    def _queued_one(self, size: int) -> None:
        if not self._flush_scheduled:
            # First frame of this loop iteration (queue_frame): out now. The rest of the
            # iteration's messages are collected and flushed together by the callback.
            self._flush_scheduled = True
            self._loop.call_soon(self._end_of_iteration)
            self.flush()
            return
        self._queued_messages += 1
        self._queued_bytes += size
        if self._queued_messages >= _FLUSH_MESSAGES or self._queued_bytes >= _FLUSH_BYTES:
            self.flush()

    def _end_of_iteration(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        queued, self._queued = self._queued, []
        self._queued_messages = self._queued_bytes = 0
        out = self.connection.out
        if queued and out is not None and not out.is_closing():
            out.writelines(queued)

    def cut(self) -> None:
        """Abort the connection: the channel sees its publisher lost (stall policy)."""
        self.connection.abort()

    def describe(self) -> str:
        connection = self.connection
        return f"{connection.server.name} channel from {connection.describe_peer()}"

    def close(self) -> None:
        """Flush what is queued, then tell the channel this is a clean end.

        Only our sending side is shut down: we keep reading (the channel's last ACKs)
        until the channel, having read up to END, closes. Closing a socket with unread
        input would make the kernel reset the connection and throw away data the
        channel had not read yet.
        """
        self.flush()
        out = self.connection.out
        if out is not None and not out.is_closing():
            out.write(_END_FRAME)
            self.connection.eof_sent = True
            if out.can_write_eof():
                out.write_eof()
            elif self.connection.transport is not None:  # pragma: no cover - stream
                self.connection.transport.close()  # sockets can always half-close


class PublisherConnection(FramedProtocol):
    """A channel connected to one of this process's publishers.

    Until the handshake is done, the transport writes (``WELCOME`` or a refusal). From
    ``WELCOME`` on, everything goes through :attr:`out`: on the stock asyncio loop a
    :class:`~._writer.VectoredWriter` (zero-copy ``sendmsg``; the transport only reads),
    elsewhere the transport itself, whose ``writelines`` copies nothing there. Either way
    the unsent backlog is bounded the same way (:meth:`pause_writing`).
    """

    def __init__(self, server: StreamTransport[Any]) -> None:
        super().__init__(HANDSHAKE_MAX_FRAME_SIZE)
        self.server = server
        self.link: StreamLink | None = None
        self.outlet: Outlet | None = None
        #: where the link writes, from the handshake on (None before)
        self.out: WriteHalf | None = None
        #: the zero-copy writer, when :attr:`out` is one
        self.writer: VectoredWriter | None = None
        self._handshake = AcceptingHandshake(server.credentials.token, "data", peer="channel")
        #: heartbeats, from WELCOME on, on transports that use them (tcp)
        self.heartbeat: Heartbeat | None = None
        #: END was written and our sending side shut down: nothing more may be written
        self.eof_sent = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # Counted from here, not from the factory: under TLS the factory runs before the
        # TLS handshake, and one that fails never calls connection_made nor _lost.
        self.server.connections.add(self)
        self.server.tune(transport)
        self._handshake.arm(HANDSHAKE_TIMEOUT, self._late)

    def describe_peer(self) -> str:
        """The channel's address, or its process id on a local socket (which has no
        address on the connecting side)."""
        peer = self.peer_name()
        if peer not in ("", "None"):
            return peer
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        peercred = getattr(socket, "SO_PEERCRED", None)
        if sock is not None and peercred is not None:
            try:
                pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, peercred, 12))
            except OSError:
                pass
            else:
                return f"pid {pid}"
        return "a local socket"

    def _late(self, reason: str) -> None:
        self._refuse(reason, cause="timeout")

    def protocol_error(self, exc: ProtocolError) -> None:
        outlet = self.outlet
        if self.link is None or outlet is None:
            self._refuse(str(exc), cause="protocol")  # (the refusal tells it why)
            return
        # Past the handshake the data protocol has no frame to say why: only close.
        self.server.bad_peers(
            "frame",
            "closing channel from %s to publisher %s on topic %r: %s",
            self.describe_peer(),
            outlet.publisher_id,
            outlet.topic,
            exc,
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
                link.set_lossless(bool(unpack_control(body).get("lossless")))
            elif kind == HEARTBEAT:
                heartbeat_received(self.heartbeat, body)
            else:
                self.server.channel_frame(self, link, kind, body)
            return
        if kind != HELLO:
            raise ProtocolError(f"expected HELLO, got frame kind {kind}")
        hello = self._authenticate(unpack_control(body))
        if hello is None:
            return
        publisher_id = field(hello, "publisher_id", str)
        field(hello, "max_message_size", int)
        outlet = self.server.outlets.get(publisher_id)
        if outlet is None or outlet.closed:
            self._refuse(f"no publisher {publisher_id!r} in this process")
            return
        if len(outlet.links) >= MAX_CHANNELS_PER_PUBLISHER:
            self._refuse(
                f"publisher {publisher_id!r} already feeds {MAX_CHANNELS_PER_PUBLISHER} "
                "channels (MAX_CHANNELS_PER_PUBLISHER)"
            )
            return
        try:
            link, extra = self.server.make_link(self, outlet, hello)
        except BrokenResourceError as exc:
            self._refuse(str(exc))
            return
        link.traced = hello.get("traces") is not False
        self._handshake.admit()
        out = self.out = self._open_write_half()
        self.link = link
        self.outlet = outlet
        outlet.add_link(link)
        welcome = {
            "op": "welcome",
            "ok": True,
            "max_in_flight": outlet.max_in_flight,
            "max_in_flight_bytes": outlet.max_in_flight_bytes,
            **extra,
        }
        out.write(control(WELCOME, welcome))
        deadline = self.server.heartbeat_deadline
        if deadline is not None:
            self.heartbeat = Heartbeat(self, deadline)

    # -- heartbeats (see ezflow._core._liveness) ----------------------------------------

    def sent_mark(self) -> int:
        link = self.link
        return 0 if link is None else link.sent_count

    def send_heartbeat(self, deadline: float) -> None:
        if not self.eof_sent:  # (after END the channel only reads up to it and closes)
            out = self.out
            if out is not None and not out.is_closing():
                out.write(heartbeat_frame(deadline))

    def peer_silent(self, silence: float, deadline: float) -> None:
        outlet = self.outlet
        if outlet is not None:
            outlet.stats.dead_channels += 1
        self.server.bad_peers(
            "silent",
            "publisher %s on topic %r: %s channel from %s silent for %.1f s (heartbeat "
            "deadline %g s): declaring it dead and closing its connection",
            "?" if outlet is None else outlet.publisher_id,
            "?" if outlet is None else outlet.topic,
            self.server.name,
            self.describe_peer(),
            silence,
            deadline,
        )
        self.abort()

    def _authenticate(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """One handshake map: the ``HELLO`` to serve once the channel is authenticated,
        or ``None`` (challenged, or refused and closing). :class:`ProtocolError` for
        anything but ``auth`` after a challenge."""
        if not self._handshake.started and message.get("protocol") != PROTOCOL:
            self._refuse(f"protocol {message.get('protocol')!r} is not {PROTOCOL!r}")
            return None
        try:
            step = self._handshake.receive(message)
        except AuthenticationError as exc:
            self._refuse(str(exc), cause="auth")
            return None
        if isinstance(step, Challenge):
            assert self.transport is not None
            self.transport.write(control(WELCOME, step.message))
            return None
        return step

    def _open_write_half(self) -> WriteHalf:
        """What writes from the handshake on (see the class docstring)."""
        transport = self.transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if (
            sock is not None
            and vectored_writes_pay(loop)
            and not transport.get_write_buffer_size()
            # Under TLS every byte must go through the transport (it encrypts).
            and transport.get_extra_info("sslcontext") is None
        ):
            try:
                self.writer = VectoredWriter(
                    loop,
                    sock,
                    high=DATA_WRITE_BUFFER_LIMIT,
                    pause=self.pause_writing,
                    resume=self.resume_writing,
                    failed=self._write_failed,
                )
            except OSError as exc:  # (no descriptor left: EMFILE)
                log.warning(
                    "%s data server: writing to %s through the event loop's transport "
                    "(copies large messages): %s",
                    self.server.name,
                    self.peer_name(),
                    exc,
                )
            else:
                return self.writer
        transport.set_write_buffer_limits(high=DATA_WRITE_BUFFER_LIMIT)
        return transport

    def pause_writing(self) -> None:
        """The unsent backlog went above ``DATA_WRITE_BUFFER_LIMIT``: the link has no
        room until it drains (a lossless publish waits, a leaky link parks): it is
        ``stalled``."""
        if self.link is not None:
            self.link.stalled = True

    def resume_writing(self) -> None:
        """The backlog drained to a quarter of the limit: send what a leaky link
        parked, and wake a waiting publish."""
        link, outlet = self.link, self.outlet
        if link is not None:
            link.stalled = False
        if link is not None and outlet is not None and link.outlet is outlet:
            if link.has_room(outlet):
                link.flush_parked()
            outlet.wake()

    def _write_failed(self, exc: OSError) -> None:
        # As the transport does on a send error: only this connection goes, and
        # connection_lost removes the link.
        log.info(
            "%s data server: connection to %s failed while sending: %s",
            self.server.name,
            self.peer_name(),
            exc,
        )
        self.abort()

    def send_frame(self, body: bytes) -> None:
        """Write one frame through :attr:`out` (after the handshake, never the
        transport: bytes must not interleave with the writer's)."""
        out = self.out
        if out is not None and not out.is_closing():
            out.write(frame(body))

    def abort(self) -> None:
        """Close at once, dropping unsent data (``connection_lost`` follows)."""
        if self.writer is not None:
            self.writer.close()  # the transport's abort leaves our descriptor open
        super().abort()

    def _refuse(self, reason: str, *, cause: str = "refused") -> None:
        """Refuse the channel in its handshake: logged per *cause* (rate-limited), and
        told in a ``WELCOME`` refusal unless it leaves what we send unread."""
        self.server.bad_peers(cause, "refusing channel from %s: %s", self.describe_peer(), reason)
        self._broken = True  # whatever else arrived with it is not read
        refusal = {"op": "welcome", "ok": False, "cause": cause, "error": reason}
        refuse(self.transport, control(WELCOME, refusal))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        if self.writer is not None:
            self.writer.close()
        self._handshake.cancel()
        if not self.closed.done():
            self.closed.set_result(None)
        self.server.connections.discard(self)
        if self.outlet is not None and self.link is not None:
            self.outlet.remove_link(self.link)
            self.server.link_lost(self, self.outlet, self.link)


# -- subscriber side -----------------------------------------------------------------------


class _TracedDelivery:
    """Stands in for a connection's channel between a TRACE frame and the message frame
    it applies to: delivers that message traced, then puts the channel back."""

    __slots__ = ("_channel", "_connection", "_trace")

    def __init__(self, connection: ChannelConnection, trace: WireTrace) -> None:
        self._connection = connection
        self._channel = connection.channel
        self._trace = trace

    def deliver_body(
        self, seq: int, body: bytes | memoryview, upstream_drops: int = 0, sent_ns: int = 0
    ) -> None:
        channel = self._connection.channel = self._channel
        channel.deliver_body_traced(self._trace, seq, body, upstream_drops, sent_ns)

    def __getattr__(self, name: str) -> Any:
        # Anything else (a second TRACE frame, the connection's bookkeeping) sees the
        # channel itself.
        return getattr(self._channel, name)


class ChannelConnection(FramedProtocol):
    """This process's channel, connected to a publisher elsewhere."""

    def __init__(
        self,
        channel: Channel,
        publisher: PublisherInfo,
        max_size: int,
        on_lost: Callable[[], None],
    ) -> None:
        super().__init__(max_size + HEADER_SIZE)
        self.channel = channel
        self.publisher = publisher
        self.max_size = max_size
        self.welcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._on_lost: Callable[[], None] | None = on_lost
        self._ack_scheduled = False
        self._released = (0, 0)
        self._acked = (0, 0)
        self._ack_every = 1
        self._ack_bytes = 1
        self.ended = False
        #: the authenticating side of the handshake (replaced by the transport)
        self.initiator = Initiator(None, "data", f"publisher {publisher.publisher_id}")
        self._challenged = False
        #: heartbeat deadline of the transport (set by it; None: no heartbeats)
        self.heartbeat_deadline: float | None = None
        self.heartbeat: Heartbeat | None = None
        #: called once when the publisher is declared dead (set by the transport)
        self.on_dead: Callable[[], None] | None = None
        self._dead = False

    def hello(self) -> dict[str, Any]:
        """The HELLO map; subclasses may add fields."""
        return {
            "op": "hello",
            "protocol": PROTOCOL,
            "publisher_id": self.publisher.publisher_id,
            "lossless": self.channel.lossless,
            "max_message_size": self.max_size,
            # (whether this process reports trace hops: else it asks for no traces)
            "traces": TRACING.reporters > 0,
            **self.initiator.hello_fields(),
        }

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        cast(asyncio.Transport, transport).write(control(HELLO, self.hello()))

    def buffer_updated(self, nbytes: int) -> None:
        # A read that is exactly one DATA frame (what a paced publisher sends) is
        # delivered straight from the read buffer, with one copy; anything else takes
        # the general path.
        self.heard = True
        reader = self._reader
        if nbytes >= _DATA_PREFIX_SIZE and not reader.end and reader.big is None:
            # (the reader held nothing: see FrameReader; tests/test_stream.py pins this
            # to the general path, FramedProtocol.buffer_updated)
            data = reader.view
            size, kind, _, seq, sent_ns, drops = DATA_PREFIX.unpack_from(data)
            if (
                kind == DATA
                and size + 4 == nbytes
                and size <= reader.max_frame_size
                and not self._broken
            ):
                self.channel.deliver_body(
                    seq, data[_DATA_PREFIX_SIZE:nbytes].tobytes(), drops, sent_ns
                )
                return
        super().buffer_updated(nbytes)

    def frame_received(self, body: bytes | memoryview) -> None:
        kind = body[0] if body else 0
        if kind == DATA:
            if len(body) < HEADER_SIZE:
                raise ProtocolError(f"DATA frame of {len(body)} bytes")
            _, _, seq, sent_ns, drops = DATA_HEADER.unpack_from(body)
            self.channel.deliver_body(seq, memoryview(body)[HEADER_SIZE:], drops, sent_ns)
        elif kind == TRACE:
            # The next message frame is traced: its delivery goes through a stand-in
            # for the channel (no check on the message path of untraced messages).
            self.channel = cast(Channel, _TracedDelivery(self, WireTrace.from_frame(body)))
        elif kind == END:
            # Everything the publisher sent came before END: close our side now, which
            # also tells the publisher its last messages arrived.
            self.ended = True
            self.channel.end()
            if self.transport is not None:
                self.transport.close()
        elif kind == WELCOME and not self.welcome.done():
            reply = unpack_control(body)
            try:
                if reply.get("op") == "challenge" and not self._challenged:
                    self._challenged = True
                    answer = self.initiator.answer(reply)
                    assert self.transport is not None
                    self.transport.write(control(HELLO, {"op": "auth", **answer}))
                    return
                if reply.get("ok") and not self._challenged:
                    self.initiator.welcomed_without_challenge()
            except AuthenticationError as exc:
                self.welcome.set_exception(exc)
                if self._challenged and self.transport is not None:
                    # Tell the publisher first, so that it logs the attempt too.
                    self.transport.write(control(HELLO, {"op": "error", "cause": "auth"}))
                    self.transport.close()
                else:
                    self.abort()
                return
            if reply.get("ok"):
                try:
                    self.welcomed(reply)
                except BrokenResourceError as exc:
                    self.welcome.set_exception(exc)
                    return
                window = reply.get("max_in_flight")
                if isinstance(window, int) and window > 0:
                    self._ack_every = max(1, window // 4)
                window = reply.get("max_in_flight_bytes")
                if isinstance(window, int) and window > 0:
                    self._ack_bytes = max(1, window // 4)
                self.channel.on_release = self._on_release
                self.channel.on_mode_change = self._on_mode_change
                self.welcome.set_result(None)
                if self.heartbeat_deadline is not None:
                    self.heartbeat = Heartbeat(self, self.heartbeat_deadline)
            elif reply.get("cause") == "auth":
                self.welcome.set_exception(
                    AuthenticationError(
                        f"publisher {self.publisher.publisher_id} on topic "
                        f"{self.publisher.topic!r} refused our token: {reply.get('error')}; "
                        "give every process of the graph the same token"
                    )
                )
            else:
                self.welcome.set_exception(
                    BrokenResourceError(f"publisher refused the channel: {reply.get('error')}")
                )
        elif kind == HEARTBEAT:
            heartbeat_received(self.heartbeat, body)
        else:
            self.publisher_frame(kind, body)

    def welcomed(self, reply: dict[str, Any]) -> None:
        """The publisher accepted the channel with *reply*; raise
        :class:`BrokenResourceError` to turn that into a failed handshake."""

    def publisher_frame(self, kind: int, body: bytes | memoryview) -> None:
        """A frame kind this class does not handle arrived from the publisher."""
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
        acked_count, acked_bytes = self._acked
        if count - acked_count >= self._ack_every or nbytes - acked_bytes >= self._ack_bytes:
            self._send_ack()
        elif not self._ack_scheduled:
            self._ack_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_ack)

    def _scheduled_ack(self) -> None:
        self._ack_scheduled = False
        if self._released[0] > self._acked[0]:
            self._send_ack()

    def _send_ack(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            count, nbytes = self._acked = self._released
            transport.write(frame(ACK_BODY.pack(ACK, count, nbytes)))

    # -- heartbeats (see ezflow._core._liveness) ----------------------------------------

    def sent_mark(self) -> int:
        return self._acked[0]

    def send_heartbeat(self, deadline: float) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(heartbeat_frame(deadline))

    def peer_silent(self, silence: float, deadline: float) -> None:
        self._dead = True
        self.channel.lost(
            f"the publisher fell silent for {silence:.1f} s (heartbeat deadline {deadline:g} s)"
        )
        log.warning(
            "publisher %s on topic %r at %s silent for %.1f s (heartbeat deadline %g s): "
            "declaring it dead and closing the channel",
            self.publisher.publisher_id,
            self.publisher.topic,
            self.peer_name(),
            silence,
            deadline,
        )
        if self.on_dead is not None:
            self.on_dead()
        self.abort()

    def _on_mode_change(self, lossless: bool) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(control(MODE, {"op": "mode", "lossless": lossless}))

    def close(self) -> None:
        self._on_lost = None
        self.channel.on_release = None
        self.channel.on_mode_change = None
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        if not self.welcome.done():
            self.welcome.set_exception(
                BrokenResourceError(
                    f"publisher {self.publisher.publisher_id} closed the connection during "
                    "the handshake (TLS on one end only? set EZFLOW_TLS_* on both)"
                )
            )
        on_lost, self._on_lost = self._on_lost, None
        # Before a successful handshake there is no channel to lose: open_channel
        # raises instead.
        if on_lost is not None and self.channel.on_release == self._on_release:
            if self.ended:
                log.debug("publisher %s ended cleanly", self.publisher.publisher_id)
            elif not self._dead:  # (peer_silent logged it, and lost the channel)
                log.info(
                    "publisher %s on topic %r went away without closing (%s)",
                    self.publisher.publisher_id,
                    self.publisher.topic,
                    exc or "connection closed",
                )
                # Nothing more comes over this connection, but the publisher has not
                # ended: it may have cut us (stall_timeout, heartbeats) or the link
                # broke. The router reopens the channel while the routes list it, and
                # the subscribers' streams end (broken) if the routes drop it.
                self.channel.lost(f"its connection broke without END ({exc or 'closed'})")
            on_lost()


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
