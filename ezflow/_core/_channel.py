"""Channels and inboxes: the receiving half of every edge (:class:`Inbox` lives in
:mod:`._inbox`).

A :class:`Channel` exists once per (process, publisher) however many local subscribers
listen to that publisher. The transport hands it each message once — an object (local
transport) or an encoded body (tcp) — the channel decodes it once and puts the *same*
object into the :class:`Inbox` of every attached subscriber.

Flow control is accounted here. Every message delivered while at least one *lossless*
subscriber is attached stays *pending* until each of those subscribers has taken it out
of its inbox; the channel reports the cumulative count and bytes it has released, and the
publisher uses those figures to keep at most ``max_in_flight`` messages (and
``max_in_flight_bytes`` bytes) unreleased per channel. Leaky subscribers never hold
anything back: their inbox keeps the newest ``queue`` messages and counts every drop.

End of stream: a transport calls :meth:`Channel.end` once its publisher has ended, after
every message of that publisher was delivered. A connection that breaks without ``END``
(a ``stall_timeout`` cut, a peer declared dead by heartbeats, a broken link, a crashed
publisher) is not an end: the channel is *lost* (:meth:`Channel.lost`), and its
publisher stays lost for each inbox until a new channel to it feeds the inbox again (a
rejoin, counted in ``SubscriberStats.rejoins``) or the routes stop listing it - then it
has ended, *broken*. Each inbox keeps which publishers fed it, which are lost and which
ended, plus the publishers the latest routes list for it; it is at its end when it had a
publisher, every publisher that fed it ended, none is lost, no routed publisher is still
live, and nothing is queued. No marker travels through the queue: an end is recorded
when every message before it is already queued, so "ended and nothing queued" already
means "everything before the end was taken".

Telemetry (docs/telemetry.md): counters live in :class:`ChannelStats` and
:class:`SubscriberStats`, log2 histograms on the channel (``latency``, ``decode_time``)
and the inbox (``handler_time``), recorded inline (a ``bit_length`` and a list index).
Per message, a channel reads the wall clock once, after decoding, for the publish ->
deliver latency (from the publish time the transport passes in). Decode time and handler
time (from taking a message to asking for the next) are sampled, one message in 16 (by
sequence number): one more clock read per 16 messages on each side. Hook events are
built only while a hook is registered.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic_ns, time_ns
from types import ModuleType
from typing import Any

import numpy as np

from . import _inbox
from ._channel_encoded import deliver_run_encoded, put_encoded
from ._channel_run import run_frames
from ._codec import Codec, EncodedMessage
from ._compiled import SPEEDUPS
from ._config import TIMING_SAMPLE_MASK
from ._exceptions import (
    ClosedResourceError,
    ProtocolError,
    UndecodableMessageError,
)
from ._inbox import NOTHING, Attachment, Inbox, SubscriberStats
from ._telemetry import DELIVER_HOOKS, DROP_HOOKS, DeliverEvent, DropEvent, Histogram, emit
from ._tracing import CURRENT, TRACING, Hop, WireTrace

__all__ = [
    "Channel",
    "ChannelStats",
]

log = logging.getLogger("ezflow.channel")

# Handler and decode times are sampled: messages whose sequence number ``n`` has
# ``n & TIMING_SAMPLE_MASK == 0`` (one in 16) are timed, and decode_seconds is scaled by
# ``TIMING_SAMPLE_MASK + 1``. Latency is recorded for every message.

# Called with (released_count, released_bytes), both cumulative since the channel opened.
ReleaseCallback = Callable[[int, int], None]


@dataclass(slots=True)
class ChannelStats:
    """Counters of one channel (inspect with ``Channel.stats``)."""

    messages: int = 0  #: messages received from the publisher
    bytes: int = 0  #: encoded bytes received (0 for the local transport)
    #: messages decoded (exactly one per received encoded message, none when every
    #: subscriber attached takes encoded bodies)
    decoded: int = 0
    decode_errors: int = 0  #: messages that could not be decoded (logged, released)
    #: time spent decoding, estimated from one message in 16 (``TIMING_SAMPLE_MASK``)
    decode_seconds: float = 0.0
    deliveries: int = 0  #: message x subscriber hand-overs
    upstream_drops: int = 0  #: messages the publisher dropped for this (leaky) channel
    overflow_drops: int = 0  #: its messages that leaky inboxes discarded (message x inbox)
    #: times this process reopened a channel to the publisher after one was cut (its
    #: connection broke without ``END``): carried over from channel to channel
    rejoins: int = 0


class Channel:
    """Receives one publisher's messages once, decodes once, fans out to local inboxes.

    *on_release* is called (synchronously) whenever the cumulative released count grows;
    the transport forwards it to the publisher, coalescing as it sees fit; it is not
    called while both released figures stay below :attr:`release_quiet_count` and
    :attr:`release_quiet_bytes` (set by a transport that reads :attr:`released` at the
    end of the loop iteration anyway; 0, 0: every release calls). Besides
    :attr:`stats`, :attr:`latency` (publish -> deliver of every message, when the
    transport passes the publish time) and :attr:`decode_time` (sampled: one message in
    16) are histograms in nanoseconds.
    """

    # Slots: the compiled take of a queued message reads and writes the release
    # bookkeeping at fixed offsets (_inbox.take_queued_py's twin, _speedups.TakePath).
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_attachments",
        "_body",
        "_broken",
        "_closed",
        "_drop_hooks",
        "_encoded",
        "_ended",
        "_error_logged",
        "_last_seq",
        "_lossless",
        "_pending",
        "_pending_bytes",
        "_released_bytes",
        "_released_count",
        "codec",
        "decode_time",
        "latency",
        "lost_reason",
        "on_encoded_change",
        "on_mode_change",
        "on_release",
        "publisher_id",
        "release_quiet_bytes",
        "release_quiet_count",
        "run_end",
        "stats",
        "topic",
        "transport",
    )

    def __init__(
        self,
        publisher_id: str,
        topic: str,
        codec: Codec,
        *,
        on_release: ReleaseCallback | None = None,
        on_mode_change: Callable[[bool], None] | None = None,
        transport: str = "",
    ) -> None:
        self.publisher_id = publisher_id
        self.topic = topic
        #: this channel's own codec state (its hints: the kind it decoded last)
        self.codec = codec._for_stream()
        self.transport = transport  # for telemetry: "local", "shm", "tcp"
        self._drop_hooks = DROP_HOOKS
        self.stats = ChannelStats()
        self.latency = Histogram()
        self.decode_time = Histogram()
        self.on_release = on_release
        #: no *on_release* call while both released figures stay below these (see above)
        self.release_quiet_count = 0
        self.release_quiet_bytes = 0
        self.on_mode_change = on_mode_change
        #: called with True when a first encoded subscriber attaches, False when the
        #: last one leaves (a local link then asks its outlet for bodies, or stops)
        self.on_encoded_change: Callable[[bool], None] | None = None
        # A tuple, replaced on attach and detach: delivery iterates it while a callback
        # may (indirectly) change it.
        self._attachments: tuple[Attachment, ...] = ()
        self._lossless = 0
        # Encoded inboxes attached (Subscriber encoded=True), and the body of the message
        # being delivered while some are (deliver hands it to them; see deliver_body).
        self._encoded = 0
        self._body: bytes | memoryview | EncodedMessage | None = None
        # Pending entries [seq, remaining_holders, nbytes], in seq order (an inbox takes
        # a channel's messages in order: the one released is nearly always the first).
        self._pending: deque[list[int]] = deque()
        self._pending_bytes = 0
        self._last_seq = 0
        self._released_count = 0
        self._released_bytes = 0
        self._closed = False
        #: the index after the last frame :meth:`deliver_run` delivered
        self.run_end = 0
        self._error_logged = 0
        self._ended = False
        self._broken = False
        #: how the connection to the publisher broke without an end (:meth:`lost`), or
        #: None while it has not
        self.lost_reason: str | None = None

    # -- attachments -------------------------------------------------------------------

    @property
    def lossless(self) -> bool:
        """True while at least one lossless subscriber is attached."""
        return self._lossless > 0

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        return self._attachments

    @property
    def released(self) -> tuple[int, int]:
        """(count, bytes) released so far, cumulative."""
        return self._released_count, self._released_bytes

    @property
    def pending(self) -> int:
        """Messages delivered but not yet taken by every lossless subscriber."""
        return len(self._pending)

    def attach(self, inbox: Inbox) -> Attachment:
        """Start handing messages to *inbox*, from the next message received on."""
        if self._closed:
            raise ClosedResourceError("channel is closed")
        attachment = Attachment(self, inbox, self._last_seq + 1)
        inbox.fed_by(self.publisher_id)
        if self._ended:
            inbox.publisher_ended(self.publisher_id, broken=self._broken)
        elif self.lost_reason is not None:
            inbox.publisher_lost(self.publisher_id)
        was_lossless = self.lossless
        self._attachments = (*self._attachments, attachment)
        if attachment.encoded:
            self._encoded += 1
            if self._encoded == 1 and self.on_encoded_change is not None:
                self.on_encoded_change(True)
        if attachment.lossless:
            self._lossless += 1
        if self.lossless != was_lossless and self.on_mode_change is not None:
            self.on_mode_change(self.lossless)
        return attachment

    def detach(self, attachment: Attachment) -> None:
        """Stop handing messages to this attachment's inbox. Messages already in the inbox
        stay there (they were accepted) but no longer hold the publisher back."""
        if not attachment.active:
            return
        attachment.active = False
        self._attachments = tuple(a for a in self._attachments if a is not attachment)
        if attachment.encoded:
            self._encoded -= 1
            if not self._encoded and self.on_encoded_change is not None:
                self.on_encoded_change(False)
        if not attachment.lossless:
            return
        self._lossless -= 1
        for entry in self._pending:
            if entry[0] > attachment.consumed_seq and entry[0] >= attachment.first_seq:
                entry[1] -= 1
        self._advance()
        if not self.lossless and self.on_mode_change is not None and not self._closed:
            self.on_mode_change(False)

    # -- delivery ------------------------------------------------------------------------

    def deliver_body(
        self, seq: int, body: bytes | memoryview, upstream_drops: int = 0, sent_ns: int = 0
    ) -> None:
        """Decode an encoded message once and deliver it. *sent_ns* is the publish time
        (``time.time_ns()`` of the publisher, 0 when unknown) for the latency histogram.

        A body that cannot be decoded is counted (``decode_errors``) and released at
        once, and each attached inbox is told in the message's place
        (:meth:`Inbox.put_undecodable`): a lossless subscriber's ``recv()`` raises
        :class:`~ezflow.UndecodableMessageError` there, a leaky one counts a drop and
        logs (rate-limited; the channel logs when no inbox is attached). This never
        raises.

        Encoded inboxes attached (``Inbox(encoded=True)``): they get *body* itself (a
        ``memoryview`` made read-only), whether it decodes or not; when every attached
        inbox is one, nothing is decoded at all (``stats.decoded`` does not count it)."""
        if self._encoded:
            if isinstance(body, memoryview) and not body.readonly:
                body = body.toreadonly()  # (it reaches user code: as a decoded array is)
            self._body = body  # (deliver hands it to them)
            if self._encoded == len(self._attachments):
                self.deliver(seq, body, len(body), upstream_drops, sent_ns)
                return
        if seq & TIMING_SAMPLE_MASK and type(body) is bytes:  # (not a timed one)
            # A message of the kind decoded last (a paced stream): the codec's shortcuts
            # (Codec.decode's first lines), inlined - with caches cold, a call costs a
            # microsecond. Pinned to Codec.decode by tests/test_channel.py.
            codec = self.codec
            hint = codec._last_array
            if hint is not None and len(body) == hint[0] and body.startswith(hint[1]):
                if hint[5] >= 0:
                    message: Any = np.frombuffer(body, hint[4], hint[5], hint[2])
                else:
                    message = np.ndarray(hint[3], hint[4], body, hint[2])
                self.stats.decoded += 1
                self.deliver(seq, message, hint[0], upstream_drops, sent_ns)
                return
            layout = codec._last_layout
            if layout is not None and len(body) == layout.size:
                message = layout.decode(body)
                if message is not None:
                    self.stats.decoded += 1
                    self.deliver(seq, message, layout.size, upstream_drops, sent_ns)
                    return
        stats = self.stats
        # Decode time is sampled: one clock read before decoding one message in 16; the
        # one after serves latency too.
        started = 0 if seq & TIMING_SAMPLE_MASK else time_ns()
        try:
            message = self.codec.decode(body)
        except ProtocolError as exc:
            stats.decode_errors += 1
            stats.messages += 1
            stats.bytes += len(body)
            self._last_seq = seq
            self._released_count += 1
            self._released_bytes += len(body)
            self._notify_release()
            if self._attachments:
                # Each subscriber is told: a lossless one raises, the others log (and
                # encoded ones get the body: they decode nothing).
                self._undecodable(exc, seq)
            elif self._error_logged < 5 or stats.decode_errors % 1000 == 0:
                self._error_logged += 1
                log.error(
                    "a message from publisher %s on topic %r cannot be decoded (%d so far): %s",
                    self.publisher_id,
                    self.topic,
                    stats.decode_errors,
                    exc,
                )
            return
        stats.decoded += 1
        if started:
            now = time_ns()
            decode_ns = now - started
            if decode_ns > 0:  # (not across a wall-clock step)
                self.decode_time.buckets[decode_ns.bit_length()] += 1  # Histogram.record
                self._add_decode_time(decode_ns)
            self.deliver(seq, message, len(body), upstream_drops, sent_ns, now, decode_ns)
        else:
            self.deliver(seq, message, len(body), upstream_drops, sent_ns)

    def deliver_run(self, frames: list[tuple[int, int, bytes, int, int]], index: int) -> int:
        """Deliver ``frames[index:]`` - a read's small DATA frames, ``(frame end, seq,
        body, upstream drops, sent_ns)`` each, in order - as :meth:`deliver_body` would
        one by one, up to the first frame that needs its general path; return that
        frame's index (``len(frames)`` once all are delivered): the caller hands it to
        :meth:`deliver_body` and calls this again for the rest. Returns -1, having
        delivered nothing, when the run cannot apply to this channel now (an inbox with
        a bound or closed; a deliver hook; no learned layout, or the first frame is not
        of it): the caller delivers the read frame by frame.

        The run (the same bookkeeping as :meth:`deliver`, once per read instead of once
        per message): each body of the layout decoded last with no new upstream drop is
        decoded and queued in every attached inbox (an ``on_message`` inbox's callback
        called with it, as :meth:`Inbox.put` calls it), the decode of one in 16 (by
        sequence number) timed as :meth:`deliver_body` times it; the clock is read once
        for the latency of the run's messages,
        the counters and histograms are added once, every inbox's waiting ``get`` is
        woken once, and a leaky channel reports its release once. :attr:`run_end` is the
        index after the last frame delivered, also when an exception escapes.
        ``tests/test_channel.py`` pins it to :meth:`deliver_body`.
        """
        self.run_end = index
        if self._encoded:
            if self._encoded != len(self._attachments) or DELIVER_HOOKS:
                return -1
            return deliver_run_encoded(self, frames, index)
        codec = self.codec
        layout = codec._last_layout
        if layout is None or DELIVER_HOOKS:
            return -1
        hint = codec._last_array  # (deliver_body tries it first: a body of its size)
        if hint is not None and hint[0] == layout.size:
            return -1
        attachments = self._attachments
        for attachment in attachments:
            inbox = attachment.inbox
            if inbox.maxlen is not None or inbox._closed:
                return -1
            # An on_message inbox runs only alone: its callback may close or detach
            # inboxes, which a run's appends (and lossless count), taken at its start,
            # would not see for the other ones.
            if inbox._callback is not None and len(attachments) > 1:
                return -1
        size = layout.size
        lossless = self._lossless
        # The callback's messages are collected, and it is called with each after the
        # run's bookkeeping (below; Inbox.put's order: counted as each call returns).
        calls: list[tuple[Attachment, int, Any]] = []
        appends = [
            (
                attachment,
                attachment.inbox._items.append
                if attachment.inbox._callback is None
                else calls.append,
            )
            for attachment in attachments
        ]
        end = len(frames)
        progress = [index, 0, 0]  # (where an exception leaves the run: run_frames sets it)
        try:
            i, latency_total, decode_total = run_frames(
                frames,
                index,
                size,
                layout.decode,
                self.stats.upstream_drops,
                lossless,
                self._pending.append,
                appends,
                self.latency.buckets,
                time_ns(),
                TIMING_SAMPLE_MASK,
                progress,
                time_ns,
                self.decode_time.buckets,
            )
        except BaseException:
            i, latency_total, decode_total = progress
            raise
        finally:
            if decode_total:  # (run_frames recorded the buckets)
                self._add_decode_time(decode_total)
            self.end_run(frames, index, i, (i - index) * size, latency_total, decoded=True)
            if calls and i > index:  # (also after an exception: they were counted)
                self.stats.deliveries -= calls[0][0].inbox.call_run(calls, frames[i - 1][1])
        if i == index and i < end:
            return -1  # (not of the layout: the read goes frame by frame)
        return i

    def end_run(
        self,
        frames: list[tuple[int, int, bytes, int, int]],
        index: int,
        end: int,
        nbytes: int,
        latency_total: int,
        *,
        decoded: bool,
    ) -> None:
        """The bookkeeping of a run that delivered ``frames[index:end]`` (*nbytes* of
        bodies, *latency_total* recorded in the histogram's buckets already), once for
        the run (see :meth:`deliver_run`, and ``_channel_encoded.deliver_run_encoded``,
        whose messages are not *decoded*): :attr:`run_end`, the counters, every inbox's
        waiting ``get`` woken once, and a leaky channel's release reported once."""
        self.run_end = end
        count = end - index
        if not count:
            return
        self._last_seq = frames[end - 1][1]
        stats = self.stats
        if decoded:
            stats.decoded += count
        stats.messages += count
        stats.bytes += nbytes
        attachments = self._attachments
        stats.deliveries += count * len(attachments)
        self.latency.total += latency_total
        lossless = self._lossless
        if lossless:
            self._pending_bytes += nbytes
        for attachment in attachments:
            inbox = attachment.inbox
            if inbox._callback is not None:
                continue  # (counted as each call returned)
            inbox.stats.received += count
            waiter = inbox._waiter
            if waiter is not None:
                inbox._waiter = None
                if not waiter.done():
                    waiter.set_result(None)
        if not lossless:
            self._released_count += count
            self._released_bytes += nbytes
            self._notify_release()

    def deliver_body_traced(
        self,
        trace: WireTrace,
        seq: int,
        body: bytes | memoryview,
        upstream_drops: int,
        sent_ns: int,
    ) -> None:
        """:meth:`deliver_body` for a traced message (*trace* came with it): records a
        :class:`~ezflow._core._tracing.Hop` for every attached subscriber."""
        received = monotonic_ns()
        if self._encoded:
            if isinstance(body, memoryview) and not body.readonly:
                body = body.toreadonly()  # (it reaches user code: as a decoded array is)
            self._body = body
            if self._encoded == len(self._attachments):  # (nothing to decode)
                self.deliver_traced(trace, seq, body, len(body), upstream_drops, sent_ns)
                return
        try:
            message = self.codec.decode(body)
        except ProtocolError:
            self.deliver_body(seq, body, upstream_drops, sent_ns)  # (counts and tells)
            return
        self.stats.decoded += 1
        self.deliver_traced(
            trace, seq, message, len(body), upstream_drops, sent_ns, received, monotonic_ns()
        )

    def deliver_traced(  # noqa: PLR0917 - deliver's arguments and the stage times
        self,
        trace: WireTrace,
        seq: int,
        message: Any,
        nbytes: int,
        upstream_drops: int,
        sent_ns: int,
        received_ns: int = 0,
        decoded_ns: int = 0,
    ) -> None:
        """:meth:`deliver` for a traced message (*trace* came with it), received and
        decoded at *received_ns* and *decoded_ns* (``monotonic_ns``; now when 0, as for
        the local transport): each attached subscriber's take of it is a hop. An
        ``on_message`` callback handles it during this call: its hop's queue stage is
        0 and its handler stage ends when every local callback of this message returned
        (or at the first publish it caused)."""
        TRACING.carrying = TRACING.active = True  # (publishes from here on carry traces on)
        attachments = self._attachments  # (a callback may attach or detach meanwhile)
        if not received_ns:
            received_ns = decoded_ns = monotonic_ns()
        hops = [
            Hop(
                trace,
                self.topic,
                self.publisher_id,
                attachment.inbox.name,
                self.transport,
                received_ns,
                decoded_ns,
            )
            for attachment in attachments
        ]
        called = [
            hop
            for hop, attachment in zip(hops, attachments, strict=True)
            if attachment.inbox.callback is not None
        ]
        token = None
        if called:
            for hop in called:
                hop.t_taken = decoded_ns
                hop.carries = hop.called = True
            token = CURRENT.set(called[0])
        try:
            self.deliver(seq, message, nbytes, upstream_drops, sent_ns)
        finally:
            if token is not None:
                CURRENT.reset(token)
        now = monotonic_ns()
        for hop in called:
            hop.finish(now)
        for hop, attachment in zip(hops, attachments, strict=True):
            if attachment.inbox.callback is None:
                attachment.inbox.mark_traced(attachment, seq, hop)

    def _add_decode_time(self, sampled_ns: int) -> None:
        """Add *sampled_ns* of timed decodes (one message in ``TIMING_SAMPLE_MASK + 1``)
        to the decode histogram's total and, scaled to every message, to
        ``stats.decode_seconds``."""
        self.stats.decode_seconds += sampled_ns * (TIMING_SAMPLE_MASK + 1) * 1e-9
        self.decode_time.total += sampled_ns

    def deliver(  # noqa: PLR0917 - the message path: positional arguments are cheapest
        self,
        seq: int,
        message: Any,
        nbytes: int = 0,
        upstream_drops: int = 0,
        sent_ns: int = 0,
        now_ns: int = 0,
        decode_ns: int = 0,
    ) -> None:
        """Hand *message* (already decoded) to every attached inbox.

        *upstream_drops* is the publisher's cumulative count of messages it dropped for
        this channel; the increase is added to the drop count of every attached leaky
        inbox, so subscriber statistics show every message they missed. *sent_ns* is the
        publish time (``time.time_ns()`` at the publisher; 0 when unknown), *now_ns* the
        time of delivery when the caller has it already (else it is read here), and
        *decode_ns* the decode time (for hooks).
        """
        stats = self.stats
        if upstream_drops > stats.upstream_drops:
            self._upstream_dropped(upstream_drops - stats.upstream_drops)
            stats.upstream_drops = upstream_drops
        if sent_ns and not now_ns:
            now_ns = time_ns()  # the time of delivery: before any handler runs
        self._last_seq = seq
        if self._lossless:
            self._pending.append([seq, self._lossless, nbytes])
            self._pending_bytes += nbytes
        else:
            self._released_count += 1
            self._released_bytes += nbytes
        attachments = self._attachments
        if self._encoded:
            put_encoded(self, seq, message)
        else:
            for attachment in attachments:
                attachment.inbox.put(attachment, seq, message)
        # Counters and histograms after the hand-over: an on_message callback (called
        # by put) gets the message a little sooner.
        stats.messages += 1
        stats.bytes += nbytes
        stats.deliveries += len(attachments)
        if sent_ns:
            # Histogram.record, inlined (no maximum kept): the message path.
            latency_ns = now_ns - sent_ns
            if latency_ns > 0:
                latency = self.latency
                latency.buckets[latency_ns.bit_length()] += 1
                latency.total += latency_ns
            else:  # the clocks of two hosts disagree
                self.latency.buckets[0] += 1
        if not self._lossless:
            self._notify_release()
        if DELIVER_HOOKS:
            emit(
                DELIVER_HOOKS,
                DeliverEvent(
                    self.topic,
                    self.publisher_id,
                    self.transport,
                    seq,
                    nbytes,
                    len(attachments),
                    now_ns - sent_ns if sent_ns else None,
                    decode_ns,
                ),
            )

    def _undecodable(self, exc: ProtocolError, seq: int = 0) -> None:
        """Tell every attached inbox, in the undecodable message's place (one error
        object per inbox: each is raised where that subscriber takes it); an encoded
        inbox gets the body (message *seq*, already released) instead."""
        body, self._body = self._body, None
        for attachment in self._attachments:
            if body is not None and attachment.encoded:
                attachment.inbox.put(attachment, seq, body)
                continue
            error = UndecodableMessageError(self.topic, self.publisher_id, str(exc))
            error.__cause__ = exc
            attachment.inbox.put_undecodable(error, attachment.lossless)

    def _upstream_dropped(self, missed: int) -> None:
        for attachment in self._attachments:
            if not attachment.lossless:
                inbox_stats = attachment.inbox.stats
                inbox_stats.dropped += missed
                inbox_stats.dropped_upstream += missed
                if self._drop_hooks:
                    emit(
                        self._drop_hooks,
                        DropEvent(
                            self.topic,
                            self.publisher_id,
                            attachment.inbox.name,
                            "upstream",
                            missed,
                        ),
                    )

    def release(self, attachment: Attachment, seq: int) -> None:
        """Called by an inbox when a lossless subscriber takes message *seq*."""
        attachment.consumed_seq = seq
        pending = self._pending
        if not pending:
            return
        entry = pending[0]
        if entry[0] == seq:  # (the first: nearly always)
            entry[1] -= 1
            if entry[1] <= 0:
                if len(pending) > 1 and pending[1][1] <= 0:
                    self._advance()  # (more than this one)
                    return
                # _advance of this one entry, inlined
                pending.popleft()
                nbytes = entry[2]
                self._pending_bytes -= nbytes
                count = self._released_count = self._released_count + 1
                released_bytes = self._released_bytes = self._released_bytes + nbytes
                callback = self.on_release
                if callback is not None and (
                    count >= self.release_quiet_count or released_bytes >= self.release_quiet_bytes
                ):
                    callback(count, released_bytes)
            return
        # Not the first (another inbox, or a release deferred to the loop, holds it):
        # where it is when no seq is missing between (only undecodable messages and
        # leaky spells leave gaps), else found in order.
        index = seq - entry[0]
        if 0 < index < len(pending) and pending[index][0] == seq:
            pending[index][1] -= 1
            return
        for entry in pending:
            if entry[0] >= seq:
                if entry[0] == seq:
                    entry[1] -= 1
                return

    def _advance(self) -> None:
        # (a wake-up's deferred release of its first message advances over the whole
        # run taken meanwhile: counted in locals, stored once)
        pending = self._pending
        popleft = pending.popleft
        count = nbytes = 0
        while pending and pending[0][1] <= 0:
            nbytes += popleft()[2]
            count += 1
        if count:
            self._pending_bytes -= nbytes
            self._released_count += count
            self._released_bytes += nbytes
            self._notify_release()

    def _notify_release(self) -> None:
        callback = self.on_release
        if callback is not None and (
            self._released_count >= self.release_quiet_count
            or self._released_bytes >= self.release_quiet_bytes
        ):
            callback(self._released_count, self._released_bytes)

    @property
    def ended(self) -> bool:
        """True once the publisher has ended (:meth:`end`)."""
        return self._ended

    def end(self, *, broken: bool = False) -> None:
        """The publisher ended: every message it sent was delivered (*broken*: it went
        away without saying so, e.g. its process died). Tells every attached inbox
        (and any attached later). Idempotent."""
        if self._ended:
            return
        self._ended = True
        self._broken = broken
        for attachment in self._attachments:
            attachment.inbox.publisher_ended(self.publisher_id, broken=broken)

    def lost(self, reason: str) -> None:
        """The connection to the publisher broke without an end; *reason* says how (a
        ``stall_timeout`` cut, a peer declared dead, a broken link). Nothing more comes
        through this channel, and every attached inbox (and any attached later) is
        told that the publisher is lost, not ended: it may rejoin through a new channel
        (see the module docstring). Ignored once ended or lost."""
        if self._ended or self.lost_reason is not None:
            return
        self.lost_reason = reason
        for attachment in self._attachments:
            attachment.inbox.publisher_lost(self.publisher_id)

    def close(self) -> None:
        """Detach every inbox; the inboxes themselves stay open (they may be fed by
        other channels)."""
        self._closed = True
        for attachment in self._attachments:
            self.detach(attachment)
        self._pending.clear()


def compiled_take_queued(speedups: ModuleType | None = SPEEDUPS) -> Callable[[Inbox], Any] | None:
    """``_inbox.take_queued_py``'s compiled twin (``_speedups.TakePath``) of *speedups*, the
    active extension by default; None where no extension is active."""
    if speedups is None:
        return None
    path = speedups.TakePath(
        Inbox, Attachment, Channel, SubscriberStats, Histogram, deque, NOTHING, TIMING_SAMPLE_MASK
    )
    take: Callable[[Inbox], Any] = path.take
    return take


# Inbox.get takes a queued message through the compiled twin where it is built; on the
# pure-Python path it keeps its own inlined code (a call to take_queued_py would cost
# one Python frame more).
_inbox.take_queued = compiled_take_queued()
