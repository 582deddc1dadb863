"""The channel half of a stream connection (:mod:`._stream` tells the protocol and the
acknowledgements): :class:`ChannelConnection` is this process's channel, connected to a
publisher elsewhere."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

from .._core._auth import Initiator
from .._core._channel import Channel
from .._core._codec import SMALL_BODY
from .._core._compiled import SPEEDUPS
from .._core._config import LARGE_ACK_DELAY
from .._core._exceptions import (
    AuthenticationError,
    BrokenResourceError,
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
    HELLO,
    MODE,
    TRACE,
    WELCOME,
    FramedProtocol,
    FrameReader,
    frame,
)
from .._core._liveness import Heartbeat
from .._core._loop import ready_queue, run_lone_wake
from .._core._protocol import PROTOCOL, PublisherInfo
from .._core._tracing import TRACING, WireTrace
from ._stream_frames import (
    HEADER_SIZE,
    control,
    heartbeat_frame,
    heartbeat_received,
    unpack_control,
)

__all__ = ["ChannelConnection"]

log = logging.getLogger("ezflow.stream")

_DATA_PREFIX_SIZE = DATA_PREFIX.size
# Bodies up to this size are handed to the channel as bytes (see frame_received).
_SLICE_BELOW = SMALL_BODY + HEADER_SIZE
_Frames = list[tuple[int, int, bytes, int, int]]


def _small_frames_py(
    data: memoryview, start: int, end: int, max_frame_size: int, slice_below: int
) -> _Frames:
    """The whole small DATA frames at the front of ``data[start:end]``, in order, as
    ``(frame end, seq, body, drops, sent_ns)`` with the body copied to ``bytes``: up to
    the first frame that is not DATA, is incomplete, is shorter than a DATA header or
    longer than *slice_below* or *max_frame_size* (the frame reader's general path
    takes that one and the rest). Raises ``ValueError`` unless ``0 <= start <= end <=
    len(data)``.

    ``_speedups.small_frames`` is its compiled twin (tests/test_speedups.py pins them
    together); :data:`_small_frames` is the one this process runs.
    """
    if not 0 <= start <= end <= len(data):
        raise ValueError(f"frames at {start}..{end} of a buffer of {len(data)} bytes")
    frames = []
    while end - start >= _DATA_PREFIX_SIZE:
        size, kind, _, seq, sent_ns, drops = DATA_PREFIX.unpack_from(data, start)
        frame_end = start + 4 + size
        if (
            kind != DATA
            or frame_end > end
            or size > slice_below
            or size > max_frame_size
            or size < HEADER_SIZE
        ):
            break
        body = data[start + _DATA_PREFIX_SIZE : frame_end].tobytes()
        frames.append((frame_end, seq, body, drops, sent_ns))
        start = frame_end
    return frames


_small_frames: Callable[[memoryview, int, int, int, int], _Frames] = (
    _small_frames_py if SPEEDUPS is None else SPEEDUPS.small_frames
)


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


def _leave(reader: FrameReader, start: int, end: int) -> None:
    """The read loop took the frames before *start*: the reader keeps *start*..*end*."""
    if start == end:
        reader.front = reader.end = 0
    else:
        reader.front, reader.end = start, end


class ChannelConnection(FramedProtocol):
    """This process's channel, connected to a publisher elsewhere."""

    #: Seconds an ACK short of a quarter window waits while large bodies arrive (0: one
    #: loop iteration at a time; see _on_release)
    large_ack_delay: float = LARGE_ACK_DELAY

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
        self._loop = asyncio.get_running_loop()
        self.welcome: asyncio.Future[None] = self._loop.create_future()
        self._on_lost: Callable[[], None] | None = on_lost
        self._ack_scheduled = False
        # On the stock asyncio loop, the end-of-iteration ACK is a handle built once and
        # appended to the loop's ready queue (ezflow._core._loop.ready_queue: a paced
        # stream schedules one for every message); elsewhere, call_soon.
        ready = self._ready = ready_queue(self._loop)
        self._ack_soon: Callable[[], object] = (
            functools.partial(self._loop.call_soon, self._scheduled_ack)
            if ready is None
            else functools.partial(
                ready.append,
                asyncio.Handle(self._scheduled_ack, (), self._loop, contextvars.Context()),
            )
        )
        #: reads of large bodies so far (into a large frame's own buffer; shm: its
        #: notifications): while they keep coming, the end-of-iteration ACK waits
        self.large_reads = 0
        self._ack_mark = 0
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

    # The small DATA frames at the front of the read buffer (one, from a paced publisher;
    # dozens, from a burst) are delivered straight from it, one copy each, in one loop;
    # whatever else is there (a control frame, a large, short or incomplete frame, a
    # frame over the limit) takes the general path, in order. Two forms of the one
    # loop: with the C extension, _speedups.small_frames splits the read in one call
    # and Channel.deliver_run delivers each run of frames of one layout in one call;
    # without, the loop splits as it goes (building the list _small_frames_py returns
    # would cost a paced stream 0.2 us a message). tests/test_stream.py pins either to
    # the general path (FramedProtocol's), for any split of any stream; the pure form
    # runs there under EZFLOW_PURE_PYTHON=1 (tests/test_speedups.py).

    def _buffer_updated_compiled(self, nbytes: int) -> None:
        self.heard = True
        reader = self._reader
        if reader.big is not None or self._broken:
            self.large_reads += 1
            super().buffer_updated(nbytes)
            ready = self._ready
            if ready:  # (the stock loop, with a handle queued: see the end)
                run_lone_wake(self._loop, ready)
            return
        start = reader.front
        end = reader.end + nbytes
        frames = _small_frames(reader.view, start, end, reader.max_frame_size, _SLICE_BELOW)
        count = len(frames)
        index = 0
        try:
            while index < count:
                channel = self.channel
                upto = count
                # Runs of the layout decoded last, in one call each (deliver_run); not
                # for one frame (a paced stream: deliver_body is shorter), nor through a
                # traced message's stand-in.
                if count - index > 1 and type(channel) is Channel:
                    try:
                        run = channel.deliver_run(frames, index)
                    finally:
                        if channel.run_end > index:  # (taken, as the reader does)
                            index = channel.run_end
                            start = frames[index - 1][0]
                    if run >= 0:
                        if index == count or self._broken:
                            break
                        upto = index + 1  # (the frame the run left: the general path)
                while index < upto:  # (frame by frame)
                    if self._broken:  # (a delivery broke the connection: mypy cannot tell)
                        break  # type: ignore[unreachable]
                    frame_end, seq, body, drops, sent_ns = frames[index]
                    start = frame_end  # (taken before it is handed on, as the reader does)
                    index += 1
                    self.channel.deliver_body(seq, body, drops, sent_ns)
                if self._broken:
                    break  # type: ignore[unreachable]
        finally:
            _leave(reader, start, end)  # (whatever happens, no frame is handed on twice)
        if reader.end:  # what is left, parsed by the reader (with nothing new read)
            large = reader.large
            super().buffer_updated(0)
            if reader.large != large:  # (a large frame began, or came whole)
                self.large_reads += 1
        ready = self._ready
        if ready:  # (the stock loop, with a handle queued)
            # A task waiting for what this read delivered runs now, not an iteration
            # of the loop later (run_lone_wake: when nothing else is due first).
            run_lone_wake(self._loop, ready)

    def _buffer_updated_pure(self, nbytes: int) -> None:
        self.heard = True
        reader = self._reader
        if reader.big is not None or self._broken:
            self.large_reads += 1
            super().buffer_updated(nbytes)
            ready = self._ready
            if ready:
                run_lone_wake(self._loop, ready)
            return
        data = reader.view
        start = reader.front
        end = reader.end + nbytes
        try:
            while end - start >= _DATA_PREFIX_SIZE:
                size, kind, _, seq, sent_ns, drops = DATA_PREFIX.unpack_from(data, start)
                frame_end = start + 4 + size
                if (
                    kind != DATA
                    or frame_end > end
                    or size > _SLICE_BELOW
                    or size > reader.max_frame_size
                    or size < HEADER_SIZE
                    or self._broken
                ):
                    break
                body = data[start + _DATA_PREFIX_SIZE : frame_end].tobytes()
                start = frame_end  # (taken before it is handed on, as the reader does)
                self.channel.deliver_body(seq, body, drops, sent_ns)
        finally:
            _leave(reader, start, end)  # (whatever happens, no frame is handed on twice)
        if reader.end:  # what is left, parsed by the reader (with nothing new read)
            large = reader.large
            super().buffer_updated(0)
            if reader.large != large:  # (a large frame began, or came whole)
                self.large_reads += 1
        ready = self._ready
        if ready:
            run_lone_wake(self._loop, ready)

    buffer_updated = _buffer_updated_pure if SPEEDUPS is None else _buffer_updated_compiled

    def frame_received(self, body: bytes | memoryview) -> None:
        kind = body[0] if body else 0
        if kind == DATA:
            if len(body) < HEADER_SIZE:
                raise ProtocolError(f"DATA frame of {len(body)} bytes")
            _, _, seq, sent_ns, drops = DATA_HEADER.unpack_from(body)
            # A small body as bytes: slicing copies a few bytes, and a bytes body takes
            # the channel's inlined decode of a known layout (a memoryview does not).
            self.channel.deliver_body(
                seq,
                body[HEADER_SIZE:]
                if type(body) is bytes and len(body) <= _SLICE_BELOW
                else memoryview(body)[HEADER_SIZE:],
                drops,
                sent_ns,
            )
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

    # ACKs: at once when a quarter of either window was released since the last one;
    # else at the end of the event-loop iteration - unless large bodies are still
    # arriving (a read into a large frame's buffer, a shm notification, since the
    # release): then over tcp LARGE_ACK_DELAY later (large_ack_delay), over shm one
    # iteration later, and so on, until none arrived meanwhile. A stream of 1 MiB
    # messages was acknowledged message by message (one write for the channel, one
    # wake and read for the publisher each); now every quarter window, and soon after
    # it pauses. (Over tcp, frames read a frame a read leave iterations without a read
    # between them, hence the delay; over shm, ACKs also open the block window, which
    # a small window of large blocks reaches before a quarter of the message window.)
    # A connection that never read a large body: as before.
    #
    # While an ACK is scheduled, the channel is told not to call back until a quarter
    # window is reached (its quiet marks): the scheduled ACK reads the channel's released
    # figures when it goes. A subscriber whose takes release one message at a time (the
    # second of two topics read in turn; a task that yields between takes without
    # waiting) called back on every message for nothing.

    def _on_release(self, count: int, nbytes: int) -> None:
        acked_count, acked_bytes = self._acked
        if count - acked_count >= self._ack_every or nbytes - acked_bytes >= self._ack_bytes:
            self._send_ack()
        elif not self._ack_scheduled:
            self._ack_scheduled = True
            self._quiet_after(acked_count, acked_bytes)
            if self.large_reads and self.large_ack_delay:
                self._ack_mark = self.large_reads
                self._loop.call_later(self.large_ack_delay, self._scheduled_ack)
            else:
                # (a connection that read large bodies looks at least once more: this
                # iteration's reads run after the callback)
                self._ack_mark = self.large_reads - 1 if self.large_reads else 0
                self._ack_soon()

    def _scheduled_ack(self) -> None:
        if self.large_reads != self._ack_mark and self.transport is not None:
            self._ack_mark = self.large_reads  # (still arriving: look again later)
            if self.large_ack_delay:
                self._loop.call_later(self.large_ack_delay, self._scheduled_ack)
            else:
                self._ack_soon()
            return
        self._ack_scheduled = False
        channel = self.channel
        channel.release_quiet_count = channel.release_quiet_bytes = 0
        if channel._released_count > self._acked[0]:
            self._send_ack()

    def _send_ack(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            channel = self.channel
            count, nbytes = self._acked = channel.released
            transport.write(frame(ACK_BODY.pack(ACK, count, nbytes)))
            if self._ack_scheduled:
                self._quiet_after(count, nbytes)

    def _quiet_after(self, count: int, nbytes: int) -> None:
        # The channel's quiet marks while an ACK is scheduled: the next quarter window
        # from the figures last acknowledged.
        channel = self.channel
        channel.release_quiet_count = count + self._ack_every
        channel.release_quiet_bytes = nbytes + self._ack_bytes

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
        self.channel.release_quiet_count = self.channel.release_quiet_bytes = 0
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
