"""The publisher half of a stream connection (:mod:`._stream` tells the protocol, the
batching and the backpressure): :class:`StreamLink` sends one outlet's messages to one
channel, :class:`PublisherConnection` is a channel connected to this process's data
server."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import sys
from collections.abc import Callable
from time import time_ns
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .._core import _outlet, _outlet_objects
from .._core._channel_local import compiled_deliver_local
from .._core._codec import Codec, EncodedMessage
from .._core._codec._templates import _Template
from .._core._compiled import SPEEDUPS
from .._core._config import (
    DATA_WRITE_BUFFER_LIMIT,
    HANDSHAKE_MAX_FRAME_SIZE,
    HANDSHAKE_TIMEOUT,
    MAX_CHANNELS_PER_PUBLISHER,
    SHM_COPY_NT_BYTES,
)
from .._core._config import PACED_GAP_NS as _PACED_GAP_NS
from .._core._config import (
    PUBLISH_YIELD_BYTES as _YIELD_BYTES,
)
from .._core._config import STREAM_FLUSH_BYTES as _FLUSH_BYTES
from .._core._config import STREAM_FLUSH_MESSAGES as _FLUSH_MESSAGES
from .._core._exceptions import (
    AuthenticationError,
    BrokenResourceError,
    ProtocolError,
)
from .._core._framing import (
    ACK,
    ACK_BODY,
    DATA,
    DATA_PREFIX,
    END,
    HEARTBEAT,
    HELLO,
    MODE,
    WELCOME,
    FramedProtocol,
    frame,
)
from .._core._handshake import AcceptingHandshake, Challenge, refuse
from .._core._liveness import Heartbeat
from .._core._outlet import _YIELD_AFTER, Link, Outlet, PublisherStats
from .._core._protocol import PROTOCOL, field
from .._core._telemetry import PUBLISH_HOOKS, PublishEvent
from .._core._tracing import TRACING, TraceState, WireTrace
from ._local import _LocalLink
from ._stream_frames import (
    HEADER_SIZE,
    control,
    heartbeat_frame,
    heartbeat_received,
    unpack_control,
)
from ._writer import VectoredWriter, WriteHalf, vectored_writes_pay

if TYPE_CHECKING:
    from ._stream import StreamTransport

__all__ = ["PublisherConnection", "StreamLink", "publish_small", "publish_small_py"]

log = logging.getLogger("ezflow.stream")

# A one-part message this small is joined to its header and written as one object.
_JOIN_BELOW = 4096
_END_FRAME = frame(bytes([END]))


class StreamLink(Link):
    """Sends one outlet's messages to one channel over a stream, batched.

    A message larger than :attr:`out_of_line_above` is first offered to
    :meth:`send_out_of_line` (the shm transport's shared memory); every other message,
    and one that hook declines, goes inline as a ``DATA`` frame.
    """

    needs_encoding = True
    queues_frames = True
    #: Messages (encoded bytes) above this size are offered to :meth:`send_out_of_line`.
    out_of_line_above: int = sys.maxsize

    # (slots: see Link; publish_small's compiled twin reads them at fixed offsets)
    __slots__ = (
        "_flush_scheduled",
        "_loop",
        "_queued",
        "_queued_bytes",
        "_queued_messages",
        "_written_ns",
        "connection",
        "inline_sends",
    )

    def __init__(self, connection: PublisherConnection, *, lossless: bool, max_size: int) -> None:
        super().__init__(lossless=lossless, max_message_size=max_size)
        self.connection = connection
        self._loop = asyncio.get_running_loop()
        self._queued: list[bytes | memoryview] = []
        self._queued_messages = 0
        self._queued_bytes = 0
        self._flush_scheduled = False
        self._written_ns = 0  # publish time (time.time_ns) of the last message sent
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
        # (paced: the first message of this loop iteration, PACED_GAP_NS or more after
        # the previous one)
        paced = not self._flush_scheduled and time_ns - self._written_ns >= _PACED_GAP_NS
        self._written_ns = time_ns
        if paced:
            # Out now, in as few calls as possible, and nothing scheduled (whatever runs
            # before a paced publisher's loop sleeps again delays a subscriber on this
            # CPU).
            out = self.connection.out
            if out is not None and not out.is_closing():
                if len(parts) == 1 and size <= _JOIN_BELOW:
                    out.write(head + parts[0])
                else:
                    out.writelines([head, *parts])
            return
        if not self._flush_scheduled:
            # A burst's first of this iteration: its messages, this one too, are written
            # together at its end (or at the flush bounds): one write, one wake-up of
            # the subscriber, where a write of this one alone costs both again.
            self._flush_scheduled = True
            self._loop.call_soon(self._end_of_iteration)
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
        if size > self.out_of_line_above:
            self.send(seq, time_ns, message, EncodedMessage([body], size))
            return
        if not self._flush_scheduled:
            if time_ns - self._written_ns >= _PACED_GAP_NS:
                # Paced: out at once, nothing scheduled.
                out = self.connection.out
                if out is None or out.is_closing():
                    self.send(seq, time_ns, message, EncodedMessage([body], size))
                    return
                self.sent_count += 1
                self.sent_bytes += size
                self.inline_sends += 1
                out.write(
                    DATA_PREFIX.pack(HEADER_SIZE + size, DATA, 0, seq, time_ns, self.drops) + body
                )
                self._written_ns = time_ns
                return
            # The first message of a burst's loop iteration: the turn's batch begins.
            self._flush_scheduled = True
            self._loop.call_soon(self._end_of_iteration)
        # A burst: queued as one frame (send() and _queued_one, inlined).
        self._written_ns = time_ns
        self.sent_count += 1
        self.sent_bytes += size
        self.inline_sends += 1
        self._queued.append(
            DATA_PREFIX.pack(HEADER_SIZE + size, DATA, 0, seq, time_ns, self.drops) + body
        )
        self._queued_messages += 1
        self._queued_bytes += size
        if self._queued_messages >= _FLUSH_MESSAGES or self._queued_bytes >= _FLUSH_BYTES:
            self.flush()

    def set_backlogged(self, backlogged: bool) -> None:
        """Whether the connection's unsent backlog is over its bound (the link is then
        :attr:`stalled`)."""
        self.stalled = backlogged

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
        # The loop has turned since this link queued (the publishing task awaited:
        # another of its outlets yielded, or anything else): what the outlet's next yield
        # is for has happened, so its count starts again. A task that publishes to two
        # topics in turn then yields once a turn, not twice in a row (the second turn
        # writing one message and waking its subscriber for it).
        outlet = self.outlet
        if outlet is not None:
            outlet._unyielded = outlet._unyielded_bytes = 0
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


def publish_small_py(outlet: Outlet, message: Any) -> bool:
    """Publish *message* in one call on the common path of a small message and return
    True; else change nothing and return False (then ``Outlet.publish_nowait``, and
    ``Outlet.publish`` if that declines, which decide what the unusual case needs).

    The common path: the outlet is open and would not yield now (``publish_nowait``'s
    rule), tracing is off and no publish hook is attached, every link is a stream link
    (``queues_frames``) with room in its in-flight window (a lossless link would wait, a
    leaky one park) and not stalled, *message* is of the shape the outlet's codec
    encoded last (its cached template) and its body is at most the smallest
    ``max_message_size`` and no link's ``out_of_line_above``; and either

    * every link is already collecting this loop turn's frames (its first frame of the
      turn went through ``send_small``, which queues a burst's and schedules the turn's
      flush) and a handoff outlet's message is not paced (``Outlet._hand_off``). Then,
      exactly as ``publish_nowait`` -> ``_send_small`` -> ``StreamLink.send_small``
      would: the next seq, one DATA frame (header + body) queued on every link (a link's
      queue flushed at ``STREAM_FLUSH_MESSAGES`` / ``STREAM_FLUSH_BYTES``), the links'
      sent and inline counters, the outlet's yield counters and its statistics; or
    * the message is paced: one link, not collecting, last written ``PACED_GAP_NS`` or
      more ago (a write within the gap is a burst's first message, which ``send_small``
      answers by collecting the turn), its connection's write half open. Then, as the
      same calls would: the next seq, the frame written at once (not while the write
      half is closing), the link's counters and write time, ``Outlet._hand_off`` for a
      handoff outlet (called: it decides and yields), the outlet's yield counters and
      statistics.

    ``publish_small`` is this function's compiled twin (``_speedups.PublishPath``) when
    the extension is built; tests/test_speedups.py pins the two together: the same
    return values, frames, counters and errors.
    """
    if outlet._closed or outlet._unyielded >= _YIELD_AFTER:
        return False
    limit = outlet._fast_limit
    if limit < 0 or outlet._unyielded_bytes >= _YIELD_BYTES or TRACING.active or PUBLISH_HOOKS:
        return False
    links = outlet._links
    max_count = outlet.max_in_flight
    max_bytes = outlet.max_in_flight_bytes
    paced = False
    for link in links:
        if link.stalled:
            return False
        if not link._flush_scheduled:  # type: ignore[attr-defined]
            # The one link's first message of a loop turn, written at once: paced, or
            # (written within the paced gap) a burst's, for send_small, which schedules
            # the turn's flush.
            if len(links) != 1 or time_ns() - link._written_ns < _PACED_GAP_NS:  # type: ignore[attr-defined]
                return False
            paced = True
        count = link.sent_count - link.released_count
        if count >= max_count or (count and link.sent_bytes - link.released_bytes >= max_bytes):
            return False
    codec = outlet.codec
    template = codec._last_template
    if template is None or template.kind is not type(message):
        return False
    body = template.encode_small(message, codec._limit)
    if body is None:
        return False
    size = len(body)
    if size > limit:
        return False
    for link in links:
        if size > link.out_of_line_above:  # type: ignore[attr-defined]
            return False
    now = time_ns()
    handoff = outlet._handoff
    if paced:
        link = links[0]
        out = link.connection.out  # type: ignore[attr-defined]
        if out is None:
            return False
    elif handoff and now - outlet._sent_ns >= _PACED_GAP_NS:
        return False
    outlet._seq = seq = outlet._seq + 1
    if paced:
        # (send_small's write at once of a paced message, then _send_small's handoff)
        link.sent_count += 1
        link.sent_bytes += size
        link.inline_sends += 1  # type: ignore[attr-defined]
        if not out.is_closing():
            out.write(DATA_PREFIX.pack(HEADER_SIZE + size, DATA, 0, seq, now, link.drops) + body)
        link._written_ns = now  # type: ignore[attr-defined]
        if handoff:
            outlet._hand_off(now)
    else:
        for link in links:
            link._written_ns = now  # type: ignore[attr-defined]
            link.sent_count += 1
            link.sent_bytes += size
            link.inline_sends += 1  # type: ignore[attr-defined]
            link._queued.append(  # type: ignore[attr-defined]
                DATA_PREFIX.pack(HEADER_SIZE + size, DATA, 0, seq, now, link.drops) + body
            )
            link._queued_messages += 1  # type: ignore[attr-defined]
            link._queued_bytes += size  # type: ignore[attr-defined]
            if (
                link._queued_messages >= _FLUSH_MESSAGES  # type: ignore[attr-defined]
                or link._queued_bytes >= _FLUSH_BYTES  # type: ignore[attr-defined]
            ):
                link.flush()  # type: ignore[attr-defined]
        if handoff:
            outlet._sent_ns = time_ns()
    outlet._unyielded += 1
    outlet._unyielded_bytes += size
    stats = outlet.stats
    stats.messages += 1
    stats.encodes += 1
    stats.bytes += size
    stats.sends += len(links)
    return True


def compiled_publish_small(
    speedups: ModuleType | None = SPEEDUPS,
    *,
    tracing: TraceState = TRACING,
    hooks: list[Callable[[PublishEvent], object]] = PUBLISH_HOOKS,
) -> Callable[[Outlet, Any], bool] | None:
    """``publish_small_py``'s compiled twin (``_speedups.PublishPath``) of *speedups*,
    the active extension by default; None where no extension is active. *tracing* and
    *hooks*: what it checks for tracing and publish hooks (the process's, by default:
    ``publish_small_py`` reads this module's ``TRACING`` and ``PUBLISH_HOOKS``). An
    outlet whose one link is a local one takes ``_local.publish_local_py``'s compiled
    twin instead (a branch of the same call)."""
    path = compiled_publish_path(speedups, tracing=tracing, hooks=hooks)
    if path is None:
        return None
    publish: Callable[[Outlet, Any], bool] = path.publish
    return publish


def compiled_publish_path(
    speedups: ModuleType | None,
    *,
    tracing: TraceState,
    hooks: list[Callable[[PublishEvent], object]],
) -> Any:
    """The ``_speedups.PublishPath`` of *speedups* (None: none): its ``publish`` is
    :func:`compiled_publish_small`'s, its ``relay`` ``_local.relay_local_py``'s twin."""
    if speedups is None:
        return None
    deliver = compiled_deliver_local(speedups)
    # The paced handoff is done in C while Outlet._hand_off would run just that: these
    # functions, looked up where it looks them up (see _speedups.c, handoff_here).
    switches = getattr(speedups, "voluntary_switches", None)
    sched_yield = getattr(os, "sched_yield", None)
    handoff = {}
    if switches is not None and sched_yield is not None:
        handoff = {
            "handoff_globals": vars(_outlet),
            "hand_off": Outlet._hand_off,
            "switches": switches,
            "sched_yield": sched_yield,
            "clock": time_ns,
        }
    path = speedups.PublishPath(
        Outlet,
        StreamLink,
        PublisherStats,
        Codec,
        _Template,
        tracing,
        hooks,
        _YIELD_AFTER,
        _YIELD_BYTES,
        _PACED_GAP_NS,
        _FLUSH_MESSAGES,
        _FLUSH_BYTES,
        DATA,
        HEADER_SIZE,
        **handoff,
        # (an outlet whose one link is a local one: _local.publish_local_py's twin)
        local_link_type=_LocalLink,
        local_deliver=deliver,
        # (the relay's bound: below it a body's yield share is its size, yield_share)
        relay_share_below=SHM_COPY_NT_BYTES,
    )
    return path


#: The one-call small publish this process runs (``Publisher.publish`` tries it first):
#: the compiled twin of ``publish_small_py``, or None on the pure-Python path, where
#: ``publish_nowait`` alone is cheaper than this function and then ``publish_nowait``
#: for the messages it declines (measured: docs/architecture.md, "The compiled hot
#: path").
#: The same path's one-call sends of a relayed message (Outlet.publish_encoded_many) to
#: a local link and to stream links fill the core's slots for them (one path built at
#: import, not one for each).
_PATH = compiled_publish_path(SPEEDUPS, tracing=TRACING, hooks=PUBLISH_HOOKS)
publish_small: Callable[[Outlet, Any], bool] | None = getattr(_PATH, "publish", None)
_outlet_objects.relay_local = getattr(_PATH, "relay", None)
_outlet_objects.relay_stream = getattr(_PATH, "relay_stream", None)


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
        #: why the connection goes was logged already (a dead peer, a failed write)
        self._loss_logged = False
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
        self._loss_logged = True
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
            self.link.set_backlogged(True)

    def resume_writing(self) -> None:
        """The backlog drained to a quarter of the limit: send what a leaky link
        parked, and wake a waiting publish."""
        link, outlet = self.link, self.outlet
        if link is not None:
            link.set_backlogged(False)
        if link is not None and outlet is not None and link.outlet is outlet:
            if link.has_room(outlet):
                link.flush_parked()
            outlet.wake()

    def _write_failed(self, exc: OSError) -> None:
        # As the transport does on a send error: only this connection goes, and
        # connection_lost removes the link (this line is its one log line).
        outlet, link = self.outlet, self.link
        if outlet is None or link is None:
            log.info(
                "%s data server: connection to %s failed while sending: %s",
                self.server.name,
                self.describe_peer(),
                exc,
            )
        else:
            log.info(
                "publisher %s on topic %r: dropped the %s: sending failed (%s) with %d "
                "messages unreleased",
                outlet.publisher_id,
                outlet.topic,
                link.describe(),
                exc,
                link.in_flight,
            )
        self._loss_logged = True
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
        outlet, link = self.outlet, self.link
        if outlet is not None and link is not None:
            if not self._loss_logged and not outlet.closed and link in outlet.links:
                # The channel's end closed it: its process exited or was killed, or it
                # unsubscribed (the two look alike from here). One line: INFO when it
                # broke or left messages unreleased, else DEBUG. (A cut, a dead peer or
                # a failed write logged already.)
                unreleased = link.in_flight
                log.log(
                    logging.INFO if unreleased or exc is not None else logging.DEBUG,
                    "publisher %s on topic %r: dropped the %s: its connection closed "
                    "(%s) with %d messages unreleased",
                    outlet.publisher_id,
                    outlet.topic,
                    link.describe(),
                    exc or "by the channel",
                    unreleased,
                )
            outlet.remove_link(link)
            self.server.link_lost(self, outlet, link)
