"""Inboxes: a subscriber's queue of messages, fed by one or more channels.

An :class:`Inbox` belongs to one subscriber; each :class:`~._channel.Channel` feeding it
holds an :class:`Attachment` to it. How channels account flow control and when an inbox
is at its end of stream is told in :mod:`ezflow._core._channel`'s docstring: the two
modules are the receiving half of every edge, split by class.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import monotonic_ns, perf_counter_ns
from typing import TYPE_CHECKING, Any, Final, NoReturn, cast

from ._config import TIMING_SAMPLE_MASK, WAKE_QUEUE_SCAN
from ._exceptions import ClosedResourceError, EndOfStream, UndecodableMessageError
from ._loop import WakeHandle, ready_queue
from ._telemetry import DROP_HOOKS, DropEvent, Histogram, emit
from ._tracing import CURRENT, Hop

if TYPE_CHECKING:
    from ._channel import Channel

__all__ = [
    "Attachment",
    "Inbox",
    "SubscriberStats",
]

log = logging.getLogger("ezflow.channel")  # (the channel's: inbox and channel log as one)


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

    __slots__ = ("active", "channel", "consumed_seq", "encoded", "first_seq", "inbox", "lossless")

    def __init__(self, channel: Channel, inbox: Inbox, first_seq: int) -> None:
        self.channel = channel
        self.inbox = inbox
        self.lossless = not inbox.leaky
        self.encoded = inbox.encoded  # it takes encoded bodies (see Inbox)
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
    """Release message *seq*, taken from *attachment*'s inbox by a get that deferred its
    release to the loop. Meanwhile a later message may have been taken and released at
    once: its mark (``consumed_seq``) stays. And the attachment may have been detached:
    detaching let go of every message after the mark, so *seq* is released here only
    when it is at or before the mark (else it was let go already)."""
    consumed = attachment.consumed_seq
    if attachment.active or seq <= consumed:
        attachment.channel.release(attachment, seq)
        if consumed > seq:
            attachment.consumed_seq = consumed


def _ignore(*args: object) -> None:
    """What the wake-up handle of an inbox runs before its first wake-up: nothing."""


#: The compiled take of a queued message (``_channel.compiled_take_queued``, installed
#: by ezflow._core._channel when the extension is built; :func:`take_queued_py` is its
#: reference twin), or None; and what it returns when it took nothing.
take_queued: Callable[[Inbox], Any] | None = None
NOTHING: Final = object()


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

    An *encoded* inbox is handed each message's encoded body (what ``Codec.encode``
    makes of it: ``bytes``, or a read-only ``memoryview``) instead of the decoded
    object; the channel decides what to hand over (``Channel.deliver``), the inbox
    queues, releases and counts it as any message. One that :attr:`takes_parts` (set by
    its owner: the Zenoh export, which copies bodies into its samples) may be handed a
    local publisher's body as the parts ``Codec.encode`` made (an ``EncodedMessage``,
    referencing the published array: not joined into one buffer first).
    """

    __slots__ = (
        "_at_end",
        "_broken",
        "_callback",
        "_closed",
        "_deferred",
        "_drop_hooks",
        "_end_told",
        "_ended",
        "_feeds",
        "_had_publisher",
        "_handed_ns",
        "_items",
        "_loop",
        "_lost",
        "_open_hop",
        "_ready",
        "_release_handle",
        "_routed",
        "_waiter",
        "_wake_handle",
        "encoded",
        "handler_time",
        "leaky",
        "maxlen",
        "name",
        "stats",
        "takes_parts",
    )

    def __init__(
        self,
        *,
        leaky: bool = False,
        maxlen: int | None = None,
        name: str = "",
        callback: Callable[[Any], object] | None = None,
        encoded: bool = False,
    ) -> None:
        if leaky and callback is None and (maxlen is None or maxlen < 1):
            raise ValueError("a leaky inbox needs maxlen >= 1")
        self.name = name
        self.encoded = encoded
        self.takes_parts = False
        self._callback = callback
        self._drop_hooks = DROP_HOOKS
        self._handed_ns = 0  # perf_counter_ns when the last message was taken, 0: none
        self._open_hop: Hop | None = None  # the traced message being handled, if any
        self.handler_time = Histogram()
        self.leaky = leaky
        self.maxlen = maxlen if leaky and callback is None else None
        self._items: deque[tuple[Attachment, int, Any]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # The loop a get() last waited on; on the stock asyncio loop, its ready queue
        # and a handle built once that runs the releases deferred to it (_deferred),
        # appended there when the first is deferred (see ezflow._core._loop.ready_queue:
        # with the caches cold, call_soon costs a woken get several microseconds).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: deque[asyncio.Handle] | None = None
        self._release_handle: asyncio.Handle | None = None
        self._wake_handle: asyncio.Handle | None = None
        self._deferred: list[tuple[Attachment, int]] = []
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
        if self._callback is not None:
            self._call(attachment, seq, message)
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
                ready = self._ready
                callbacks = waiter._callbacks if ready is not None else None
                handle = self._wake_handle
                if (
                    callbacks
                    and len(callbacks) == 1
                    and ready is not None
                    and handle is not None
                    and len(ready) <= WAKE_QUEUE_SCAN
                    and handle not in ready
                ):
                    # On the stock loop: set_result, with the waiting task's wake-up
                    # queued as its call_soon would queue it (a handle running the
                    # callback with the waiter, in the callback's context), but in the
                    # handle this inbox keeps for it (not queued: it ran).
                    callback, context = callbacks[0]
                    waiter.remove_done_callback(callback)
                    waiter.set_result(None)
                    handle._callback = callback  # type: ignore[attr-defined]
                    handle._args = (waiter,)
                    handle._context = context  # type: ignore[attr-defined]
                    ready.append(handle)
                else:
                    waiter.set_result(None)

    def _call(self, attachment: Attachment, seq: int, message: Any) -> None:
        """Hand *message* to the callback (a callback inbox's :meth:`put`, once it is
        open; also ``Channel.deliver_run``'s): counted as received and taken when it
        returns, its time sampled, released (lossless)."""
        started = 0 if seq & TIMING_SAMPLE_MASK else perf_counter_ns()
        try:
            self._callback(message)  # type: ignore[misc]
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

    def call_run(self, calls: list[tuple[Attachment, int, Any]], last: int) -> int:
        """Call the callback with each message of a run of ``Channel.deliver_run`` (this
        inbox the channel's only one), *calls* up to message *last* (those the run
        delivered), as :meth:`put` would have: not once the inbox is closed. Returns how
        many went to no inbox: those after the callback detached its subscriber (the
        channel counts one delivery less for each)."""
        for n, (attachment, seq, message) in enumerate(calls):
            if seq > last:
                break
            if not attachment.active:
                return sum(1 for call in calls[n:] if call[1] <= last)
            if not self._closed:
                self._call(attachment, seq, message)
        return 0

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
            elif loop is self._loop and self._release_handle is not None:
                deferred = self._deferred
                deferred.append((attachment, seq))
                if len(deferred) == 1:  # (else the handle is queued already)
                    ready = self._ready
                    assert ready is not None
                    ready.append(self._release_handle)
            else:
                loop.call_soon(_release_taken, attachment, seq)
        return message

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """A get() waits on *loop*, not the loop before (if any): what get_nowait(loop)
        and put need to know of it (see ``__init__``)."""
        if self._deferred:
            self._release_deferred()  # (deferred to a loop that may not run them now)
        self._loop = loop
        self._ready = ready = ready_queue(loop)
        if ready is None:
            self._release_handle = self._wake_handle = None
        else:
            empty = contextvars.Context()
            self._release_handle = asyncio.Handle(self._release_deferred, (), loop, empty)
            self._wake_handle = WakeHandle(_ignore, (), loop, empty)

    def _release_deferred(self) -> None:
        """Release what woken takes deferred to the loop, in the order they were taken."""
        deferred, self._deferred = self._deferred, []
        for attachment, seq in deferred:
            _release_taken(attachment, seq)

    async def get(self) -> Any:
        """Wait for and take the oldest message.

        Raises :class:`ClosedResourceError` once the inbox is closed and empty, and
        :class:`~ezflow.UndecodableMessageError` in the place of a message that could
        not be decoded, and :class:`EndOfStream` once it is :attr:`at_end` - once per
        end: called again, it waits (for a publisher that may be routed to it later).
        Cancellation-safe: a cancelled ``get`` takes nothing.
        """
        take = take_queued
        if take is not None:
            # Something queued, on the compiled path: taken in one call (or NOTHING: the
            # code below decides).
            message = take(self)
            if message is not NOTHING:
                return message
        items = self._items
        if items and self._open_hop is None:
            # Something is queued (a burst): get_nowait() without a loop, inlined - no
            # suspension, one call fewer. tests/test_channel.py pins it to get_nowait.
            attachment, seq, message = items.popleft()
            self.stats.taken += 1
            if self._handed_ns:
                spent = perf_counter_ns() - self._handed_ns
                handler = self.handler_time
                handler.buckets[spent.bit_length()] += 1
                handler.total += spent
                self._handed_ns = 0
            elif not seq & TIMING_SAMPLE_MASK:
                self._handed_ns = perf_counter_ns()
            if attachment.lossless and attachment.active:
                attachment.channel.release(attachment, seq)
            return message
        if not items:
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
            if loop is not self._loop:
                self._adopt(loop)
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


def take_queued_py(inbox: Inbox) -> Any:
    """Take *inbox*'s oldest queued message as :meth:`Inbox.get` does and return it, or
    return :data:`NOTHING` having changed nothing when the general path must decide: an
    empty queue, a traced message being handled (``_open_hop``) or queued, an
    undecodable one, or a lossless release whose entry is not where
    :meth:`Channel.release` looks first (the first pending entry, or the one at its seq's
    distance from it) or that would release the next entry too (``Channel._advance``).

    Taken: ``stats.taken``, the handler-time sample (``Inbox.get_nowait``'s rule), and
    for a lossless active attachment :meth:`Channel.release` of the first pending entry
    (its count, and once it reaches 0 the entry's removal, the release counters and
    ``on_release`` but below the quiet marks). ``_speedups.TakePath.take`` is its twin;
    tests/test_speedups.py pins the two together and tests/test_channel.py pins
    ``Inbox.get`` to ``get_nowait``."""
    items = inbox._items
    if not items or inbox._open_hop is not None:
        return NOTHING
    item = items[0]
    if type(item) is not tuple:
        return NOTHING
    attachment, seq, _ = item
    if attachment.lossless and attachment.active:
        pending = attachment.channel._pending
        if pending:
            entry = pending[0]
            if entry[0] != seq:
                # Not the first (a release deferred to the loop holds it): where it is
                # when no seq is missing between (Channel.release's rule), else NOTHING.
                index = seq - entry[0]
                if not 0 < index < len(pending) or pending[index][0] != seq:
                    return NOTHING
            elif entry[1] <= 1 and len(pending) > 1 and pending[1][1] <= 0:
                return NOTHING
    # The general path itself, on the cases the checks above leave: the take, its
    # handler-time sample, and Channel.release (without _advance) at once.
    return inbox.get_nowait()
