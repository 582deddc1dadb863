"""Channels and inboxes: the receiving half of every edge.

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

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import monotonic_ns, perf_counter_ns, time_ns
from typing import Any, NoReturn, cast

import numpy as np

from ._codec import Codec
from ._config import TIMING_SAMPLE_MASK
from ._exceptions import (
    ClosedResourceError,
    EndOfStream,
    ProtocolError,
    UndecodableMessageError,
)
from ._telemetry import DELIVER_HOOKS, DROP_HOOKS, DeliverEvent, DropEvent, Histogram, emit
from ._tracing import CURRENT, TRACING, Hop, WireTrace

__all__ = [
    "Attachment",
    "Channel",
    "ChannelStats",
    "Inbox",
    "SubscriberStats",
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
    decoded: int = 0  #: messages decoded (exactly one per received encoded message)
    decode_errors: int = 0  #: messages that could not be decoded (logged, released)
    #: time spent decoding, estimated from one message in 16 (``TIMING_SAMPLE_MASK``)
    decode_seconds: float = 0.0
    deliveries: int = 0  #: message x subscriber hand-overs
    upstream_drops: int = 0  #: messages the publisher dropped for this (leaky) channel
    overflow_drops: int = 0  #: its messages that leaky inboxes discarded (message x inbox)
    #: times this process reopened a channel to the publisher after one was cut (its
    #: connection broke without ``END``): carried over from channel to channel
    rejoins: int = 0


@dataclass(slots=True)
class SubscriberStats:
    """Counters of one subscriber's inbox."""

    received: int = 0  #: messages put into the inbox
    taken: int = 0  #: messages handed to the subscriber
    #: messages this (leaky) subscriber missed: ``dropped_overflow + dropped_upstream``
    dropped: int = 0
    dropped_overflow: int = 0  #: discarded by the inbox to keep only the newest ``queue``
    dropped_upstream: int = 0  #: dropped by a publisher that had no room for this inbox
    #: exceptions raised by the subscriber's ``on_message`` callback (each one logged)
    callback_errors: int = 0
    #: messages for this subscriber that could not be decoded: a lossless subscriber's
    #: ``recv()`` raised :class:`~ezflow.UndecodableMessageError` in the place of each;
    #: a leaky one counts each in ``dropped`` too; an ``on_message`` one logs each
    undecodable: int = 0
    #: publishers that fed this subscriber and ended (cleanly or not)
    publishers_ended: int = 0
    #: of those, publishers that went away without ending cleanly: their channel was
    #: lost (crash, cut, broken link) and the routes stopped listing them
    publishers_broken: int = 0
    #: times a publisher whose channel was lost (cut by a stall, a dead peer, a broken
    #: link) fed this subscriber again through a new channel, as a late joiner
    rejoins: int = 0


class Attachment:
    """The link between one channel and one inbox (internal bookkeeping)."""

    __slots__ = ("active", "channel", "consumed_seq", "first_seq", "inbox", "lossless")

    def __init__(self, channel: Channel, inbox: Inbox, first_seq: int) -> None:
        self.channel = channel
        self.inbox = inbox
        self.lossless = not inbox.leaky
        self.active = True
        self.first_seq = first_seq  # first seq this attachment can hold
        self.consumed_seq = first_seq - 1


class _Undecodable:
    """Takes the place, in a lossless inbox, of a message that could not be decoded.

    Unpacking it - which :meth:`Inbox.get_nowait` does with every item - raises the
    error: the subscriber's ``recv()`` raises in the message's place, and the message
    path needs no check of its own. (The channel released the message's window slot
    when decoding failed: nothing here holds the publisher back.)
    """

    __slots__ = ("error",)

    def __init__(self, error: UndecodableMessageError) -> None:
        self.error = error

    def __iter__(self) -> NoReturn:
        raise self.error


class _TracedItem:
    """Takes the place, in an inbox, of a traced message's ``(attachment, seq,
    message)``: unpacking it - which :meth:`Inbox.get_nowait` does with every item -
    starts the hop's handler stage in the task that takes it. Untraced messages stay
    plain tuples, so tracing costs the message path nothing."""

    __slots__ = ("attachment", "hop", "message", "seq")

    def __init__(self, hop: Hop, attachment: Attachment, seq: int, message: Any) -> None:
        self.hop = hop
        self.attachment = attachment
        self.seq = seq
        self.message = message

    def __iter__(self) -> Iterator[Any]:
        hop = self.hop
        hop.t_taken = monotonic_ns()
        hop.carries = True
        self.attachment.inbox._open_hop = hop
        CURRENT.set(hop)  # (in the context of the task taking it)
        return iter((self.attachment, self.seq, self.message))

    def __getitem__(self, index: int) -> Any:
        # (what inspects a queued item without taking it: an overflowing leaky inbox)
        return (self.attachment, self.seq, self.message)[index]


def _release_taken(attachment: Attachment, seq: int) -> None:
    """Release message *seq*, taken from *attachment*'s inbox, unless the attachment was
    detached meanwhile (detaching already stopped it holding anything)."""
    if attachment.active:
        attachment.channel.release(attachment, seq)


class Inbox:
    """A subscriber's queue of messages, fed by one or more channels.

    Lossless inboxes are bounded by the publishers' ``max_in_flight`` windows (a channel
    cannot deliver more than that many unreleased messages). Leaky inboxes hold at most
    ``maxlen`` messages and discard the oldest, counting each drop. *name* (the
    subscriber id) labels drop events. :attr:`handler_time` is a histogram (ns) of the
    time from a message being taken until the subscriber asks for the next one, sampled
    (one message in 16).

    With a *callback*, the inbox queues nothing: each message is passed to
    ``callback(message)`` as it is delivered, synchronously, and counts as taken (and
    released) when the callback returns. An exception from the callback is logged with
    its traceback and counted in ``stats.callback_errors``; delivery goes on with the
    next message. :attr:`handler_time` then times the callback itself (sampled).
    """

    __slots__ = (
        "_at_end",
        "_broken",
        "_callback",
        "_closed",
        "_drop_hooks",
        "_end_told",
        "_ended",
        "_feeds",
        "_had_publisher",
        "_handed_ns",
        "_items",
        "_lost",
        "_open_hop",
        "_routed",
        "_waiter",
        "handler_time",
        "leaky",
        "maxlen",
        "name",
        "stats",
    )

    def __init__(
        self,
        *,
        leaky: bool = False,
        maxlen: int | None = None,
        name: str = "",
        callback: Callable[[Any], object] | None = None,
    ) -> None:
        if leaky and callback is None and (maxlen is None or maxlen < 1):
            raise ValueError("a leaky inbox needs maxlen >= 1")
        self.name = name
        self._callback = callback
        self._drop_hooks = DROP_HOOKS
        self._handed_ns = 0  # perf_counter_ns when the last message was taken, 0: none
        self._open_hop: Hop | None = None  # the traced message being handled, if any
        self.handler_time = Histogram()
        self.leaky = leaky
        self.maxlen = maxlen if leaky and callback is None else None
        self._items: deque[tuple[Attachment, int, Any]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self.stats = SubscriberStats()
        # End of stream (see the module docstring): publishers that feed this inbox,
        # publishers whose channel was lost (they may rejoin; a lost one being reopened
        # is in both), publishers that ended (of which: broken, ended only because the
        # routes dropped them while lost), the publishers the routes list.
        self._feeds: set[str] = set()
        self._lost: set[str] = set()
        self._ended: set[str] = set()
        self._broken: set[str] = set()
        self._routed: frozenset[str] = frozenset()
        self._had_publisher = False
        self._at_end = False
        self._end_told = False  # EndOfStream was raised for the present end

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def callback(self) -> Callable[[Any], object] | None:
        """The callback messages are handed to, or None for a queueing inbox."""
        return self._callback

    def put(self, attachment: Attachment, seq: int, message: Any) -> None:
        if self._closed:
            return
        callback = self._callback
        if callback is not None:
            started = 0 if seq & TIMING_SAMPLE_MASK else perf_counter_ns()
            try:
                callback(message)
            except Exception:
                self._callback_failed(attachment.channel)
            stats = self.stats  # counted when the callback returns: it is called sooner
            stats.received += 1
            stats.taken += 1
            if started:
                spent = perf_counter_ns() - started
                self.handler_time.buckets[spent.bit_length()] += 1  # Histogram.record
                self.handler_time.total += spent
            if attachment.lossless and attachment.active:
                attachment.channel.release(attachment, seq)
            return
        items = self._items
        if self.maxlen is not None and len(items) >= self.maxlen:
            # The oldest message goes; it is counted against the channel it came from.
            dropped_from = items.popleft()[0].channel
            dropped_from.stats.overflow_drops += 1
            stats = self.stats
            stats.dropped += 1
            stats.dropped_overflow += 1
            if self._drop_hooks:
                emit(
                    self._drop_hooks,
                    DropEvent(
                        dropped_from.topic, dropped_from.publisher_id, self.name, "overflow", 1
                    ),
                )
        items.append((attachment, seq, message))
        self.stats.received += 1
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def put_undecodable(self, error: UndecodableMessageError, lossless: bool) -> None:
        """A message for this inbox could not be decoded (*error*).

        A queueing inbox fed by a *lossless* attachment queues the error in the
        message's place: the ``get`` that would have returned the message raises it. A
        leaky attachment counts it as dropped (``"undecodable"`` drop event), and an
        ``on_message`` inbox (which has no ``get`` to raise from) only counts it; both
        log, rate-limited, and delivery goes on.
        """
        if self._closed:
            return
        stats = self.stats
        stats.undecodable += 1
        if lossless and self._callback is None:
            # A 3-tuple to mypy: get_nowait unpacks every item, which raises this one.
            self._items.append(cast("tuple[Attachment, int, Any]", _Undecodable(error)))
            waiter = self._waiter
            if waiter is not None:
                self._waiter = None
                if not waiter.done():
                    waiter.set_result(None)
            return
        if not lossless:
            stats.dropped += 1
            if self._drop_hooks:
                emit(
                    self._drop_hooks,
                    DropEvent(error.topic, error.publisher_id, self.name, "undecodable", 1),
                )
        count = stats.undecodable
        if count <= 5 or count % 1000 == 0:
            log.warning(
                "subscriber %s %s (%d so far): %s",
                self.name,
                "skips a message" if lossless else "drops a message",
                count,
                error,
            )

    def _callback_failed(self, channel: Channel) -> None:
        """Log the exception being handled (from the callback) and count it."""
        stats = self.stats
        stats.callback_errors += 1
        count = stats.callback_errors
        if count <= 5 or count % 1000 == 0:
            log.exception(
                "on_message of subscriber %s raised on a message of topic %r from publisher "
                "%s (%d so far; delivery goes on)",
                self.name,
                channel.topic,
                channel.publisher_id,
                count,
            )

    def get_nowait(self, loop: asyncio.AbstractEventLoop | None = None) -> Any:
        """Take the oldest message; ``IndexError`` when empty; raises
        :class:`~ezflow.UndecodableMessageError` (and takes it) when that message could
        not be decoded.

        A lossless subscriber's message is released at once, or - given the running
        *loop* - as soon as the caller yields to it (the same loop iteration), so that
        the release bookkeeping does not delay the caller.
        """
        if self._open_hop is not None:
            self._finish_hop()  # asking for the next message ends the handler stage
        attachment, seq, message = self._items.popleft()
        stats = self.stats
        stats.taken += 1
        if self._handed_ns:
            # The subscriber asks for this message: the sampled one before it is done.
            spent = perf_counter_ns() - self._handed_ns
            handler = self.handler_time  # Histogram.record, inlined (no maximum kept)
            handler.buckets[spent.bit_length()] += 1
            handler.total += spent
            self._handed_ns = 0
        elif not seq & TIMING_SAMPLE_MASK:
            self._handed_ns = perf_counter_ns()  # time this one's handler
        if attachment.lossless and attachment.active:
            if loop is None:
                attachment.channel.release(attachment, seq)
            else:
                loop.call_soon(_release_taken, attachment, seq)
        return message

    async def get(self) -> Any:
        """Wait for and take the oldest message.

        Raises :class:`ClosedResourceError` once the inbox is closed and empty, and
        :class:`~ezflow.UndecodableMessageError` in the place of a message that could
        not be decoded, and :class:`EndOfStream` once it is :attr:`at_end` - once per
        end: called again, it waits (for a publisher that may be routed to it later).
        Cancellation-safe: a cancelled ``get`` takes nothing.
        """
        if not self._items:
            # The subscriber is done with the previous message: its handler time ends
            # here, not when the next message arrives.
            if self._handed_ns:
                spent = perf_counter_ns() - self._handed_ns
                self.handler_time.buckets[spent.bit_length()] += 1
                self.handler_time.total += spent
                self._handed_ns = 0
            if self._open_hop is not None:
                self._finish_hop()
        loop = None
        while not self._items:
            if self._closed:
                raise ClosedResourceError("this subscriber is closed")
            if self._at_end and not self._end_told:
                self._end_told = True
                raise self.end_of_stream()
            loop = asyncio.get_running_loop()
            waiter = self._waiter
            if waiter is None or waiter.done():
                waiter = self._waiter = loop.create_future()
            await waiter
        # Woken by a delivery (a paced stream): hand the message over first.
        return self.get_nowait(loop)

    def holds(self, channel: Channel) -> bool:
        """True while a message that *channel* delivered is still queued here (one pass
        over the queue: for the rare checks of a cut channel, not the message path)."""
        for item in self._items:
            # (an undecodable message's stand-in has no attachment: it holds nothing)
            if not isinstance(item, _Undecodable) and item[0].channel is channel:
                return True
        return False

    def mark_traced(self, attachment: Attachment, seq: int, hop: Hop) -> None:
        """Message *seq*, just put by *attachment*'s channel, is traced as *hop*."""
        items = self._items
        if items:
            last = items[-1]
            if type(last) is tuple and last[0] is attachment and last[1] == seq:
                items[-1] = cast("tuple[Attachment, int, Any]", _TracedItem(hop, *last))

    def _finish_hop(self) -> None:
        hop = self._open_hop
        assert hop is not None
        self._open_hop = None
        hop.finish(monotonic_ns())
        if CURRENT.get() is hop:
            CURRENT.set(None)

    def close(self) -> None:
        """Stop accepting messages and wake a waiting :meth:`get`. Messages already
        queued can still be taken. A traced message being handled is done."""
        self._closed = True
        if self._open_hop is not None:
            self._finish_hop()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._waiter = None

    # -- end of stream -------------------------------------------------------------------

    @property
    def at_end(self) -> bool:
        """True when nothing is queued, the inbox had a publisher, every publisher that
        fed it has ended, and the routes list no publisher that has not ended. Not
        final: a publisher routed later makes it wait again."""
        return self._at_end and not self._items

    @property
    def had_publisher(self) -> bool:
        """True once a publisher fed this inbox or was routed to it."""
        return self._had_publisher

    @property
    def ended_publishers(self) -> frozenset[str]:
        """Ids of the publishers that fed this inbox and ended."""
        return frozenset(self._ended)

    @property
    def lost_publishers(self) -> frozenset[str]:
        """Ids of the publishers whose channel was lost and that have not rejoined (nor
        ended) yet."""
        return frozenset(self._lost)

    def fed_by(self, publisher_id: str) -> None:
        """A channel of *publisher_id* starts feeding this inbox. A publisher that ended
        cleanly stays ended (it never publishes again); one that ended broken - lost,
        then dropped by the routes - is lost again (it came back), so that
        :meth:`rejoined` counts it and its end is not counted twice."""
        if publisher_id in self._broken:
            self._broken.discard(publisher_id)
            self._ended.discard(publisher_id)
            self._lost.add(publisher_id)
            self.stats.publishers_ended -= 1
            self.stats.publishers_broken -= 1
        if publisher_id not in self._ended:
            self._feeds.add(publisher_id)
            self._had_publisher = True
            self._update_end()

    def rejoined(self, publisher_id: str, *, count: bool = True) -> bool:
        """The channel of *publisher_id* that started feeding this inbox is open: if the
        publisher was lost, it is not any more, and true is returned; with *count*
        (its channel had been open before: a rejoin, not a late first open), that is
        counted in ``stats.rejoins``."""
        if publisher_id in self._lost and publisher_id in self._feeds:
            self._lost.discard(publisher_id)
            if count:
                self.stats.rejoins += 1
            self._update_end()
            return True
        return False

    def publisher_lost(self, publisher_id: str) -> None:
        """The channel of *publisher_id* broke without an end: it no longer feeds this
        inbox, but it has not ended either (see the module docstring). Idempotent."""
        if publisher_id in self._feeds:
            self._feeds.discard(publisher_id)
            self._lost.add(publisher_id)
            self._update_end()

    def publisher_ended(self, publisher_id: str, *, broken: bool = False) -> None:
        """*publisher_id* ended, after every message it sent here was put (*broken*:
        it went away without ending cleanly). Idempotent."""
        if publisher_id in self._ended:
            return
        self._ended.add(publisher_id)
        self._feeds.discard(publisher_id)
        self._lost.discard(publisher_id)
        self._had_publisher = True
        self.stats.publishers_ended += 1
        if broken:
            self._broken.add(publisher_id)
            self.stats.publishers_broken += 1
        self._update_end()

    def routed(self, publisher_ids: frozenset[str], *, keep_lost: bool = False) -> None:
        """The latest routes list *publisher_ids* as feeding this inbox. A lost
        publisher they do not list has ended, broken - unless *keep_lost* (the routes
        may be incomplete: just after a reconnection to the graph server)."""
        self._routed = publisher_ids
        if publisher_ids:
            self._had_publisher = True
        if not keep_lost:
            for gone in self._lost - publisher_ids:
                self.publisher_ended(gone, broken=True)
        self._update_end()

    def tell_end(self) -> bool:
        """True (once per end) when the inbox is :attr:`at_end` and that was not told
        yet: the caller raises :meth:`end_of_stream`."""
        if self.at_end and not self._end_told:
            self._end_told = True
            return True
        return False

    def end_of_stream(self) -> EndOfStream:
        """The error :meth:`get` raises at the end."""
        broken = self.stats.publishers_broken
        how = f" ({broken} of them went away without ending cleanly)" if broken else ""
        return EndOfStream(
            f"subscriber {self.name}: every publisher that fed it has ended{how} and none "
            "that may still publish is routed to it"
        )

    def _update_end(self) -> None:
        at_end = (
            self._had_publisher
            and not self._feeds
            and not self._lost
            and self._routed <= self._ended
        )
        if at_end != self._at_end:
            self._at_end = at_end
            self._end_told = False
            if at_end:
                self._wake()


class Channel:
    """Receives one publisher's messages once, decodes once, fans out to local inboxes.

    *on_release* is called (synchronously) whenever the cumulative released count grows;
    the transport forwards it to the publisher, coalescing as it sees fit. Besides
    :attr:`stats`, :attr:`latency` (publish -> deliver of every message, when the
    transport passes the publish time) and :attr:`decode_time` (sampled: one message in
    16) are histograms in nanoseconds.
    """

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
        self.on_mode_change = on_mode_change
        # A tuple, replaced on attach and detach: delivery iterates it while a callback
        # may (indirectly) change it.
        self._attachments: tuple[Attachment, ...] = ()
        self._lossless = 0
        # Pending entries [seq, remaining_holders, nbytes], in seq order, plus an index.
        self._pending: deque[list[int]] = deque()
        self._pending_by_seq: dict[int, list[int]] = {}
        self._pending_bytes = 0
        self._last_seq = 0
        self._released_count = 0
        self._released_bytes = 0
        self._closed = False
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
        raises."""
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
                # Each subscriber is told: a lossless one raises, the others log.
                self._undecodable(exc)
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
                stats.decode_seconds += decode_ns * (TIMING_SAMPLE_MASK + 1) * 1e-9
                self.decode_time.buckets[decode_ns.bit_length()] += 1  # Histogram.record
                self.decode_time.total += decode_ns
            self.deliver(seq, message, len(body), upstream_drops, sent_ns, now, decode_ns)
        else:
            self.deliver(seq, message, len(body), upstream_drops, sent_ns)

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
        TRACING.active = True  # (publishes from here on carry traces on)
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
            entry = [seq, self._lossless, nbytes]
            self._pending.append(entry)
            self._pending_by_seq[seq] = entry
            self._pending_bytes += nbytes
        else:
            self._released_count += 1
            self._released_bytes += nbytes
        attachments = self._attachments
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

    def _undecodable(self, exc: ProtocolError) -> None:
        """Tell every attached inbox, in the undecodable message's place (one error
        object per inbox: each is raised where that subscriber takes it)."""
        for attachment in self._attachments:
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
        entry = self._pending_by_seq.get(seq)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0 and self._pending[0] is entry:
            self._advance()

    def _advance(self) -> None:
        pending = self._pending
        advanced = False
        while pending and pending[0][1] <= 0:
            seq, _, nbytes = pending.popleft()
            del self._pending_by_seq[seq]
            self._pending_bytes -= nbytes
            self._released_count += 1
            self._released_bytes += nbytes
            advanced = True
        if advanced:
            self._notify_release()

    def _notify_release(self) -> None:
        callback = self.on_release
        if callback is not None:
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
        self._pending_by_seq.clear()
