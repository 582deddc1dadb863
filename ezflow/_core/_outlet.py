"""Outlets: the sending half of every publisher.

An :class:`Outlet` numbers messages, encodes each at most once however many channels it
feeds, and enforces flow control per :class:`Link` (one link per subscribing channel):

* a *lossless* link may hold at most ``max_in_flight`` unreleased messages and
  ``max_in_flight_bytes`` unreleased bytes (one message is always allowed, however
  large); ``publish`` waits until every lossless link has room, then sends to all links
  at once — a cancelled ``publish`` has sent nothing;
* a *leaky* link never makes ``publish`` wait. When it has no room, the message is
  *parked* (replacing, and counting as dropped, any message parked before) and sent as
  soon as the channel releases something — so a slow leaky subscriber always ends up
  with the newest message, and every message it misses is counted. The cumulative drop
  count travels with each message, so the subscriber's statistics include drops that
  happened on the publisher's side.

Stall policy: with a ``stall_timeout`` (off by default), a lossless link that has
released nothing for that many seconds while ``publish`` waits on it (its window or its
transport is full) is *cut*: removed from the outlet and its connection broken
(:meth:`Link.cut`), logged once and counted in ``PublisherStats.stalled_cut``; the
publish goes on for the other links. A link that keeps releasing, however slowly, is
never cut. The channel's process sees its publisher lost (not ended) and opens a new
channel once its subscribers are back (``ezflow._graph._routing``, "Rejoin"): a new
link, fed from the next message on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from time import time_ns
from typing import Any

import numpy as np

from . import _outlet_objects
from ._codec import Codec, EncodedMessage
from ._codec._format import _new_encoded
from ._compiled import RUSAGE_THREAD, voluntary_switches
from ._config import (
    PACED_GAP_NS,
    PUBLISH_YIELD_BYTES,
    PUBLISH_YIELD_EVERY,
)
from ._exceptions import ClosedResourceError, MessageTooLargeError
from ._outlet_objects import read_only, send_objects, yield_share
from ._telemetry import PUBLISH_HOOKS, Histogram, PublishEvent, emit
from ._tracing import TRACING, WireTrace, carry

__all__ = ["Link", "Outlet", "PublisherStats"]

log = logging.getLogger("ezflow.outlet")

# publish_nowait declines (so that publish yields) once this many went without a yield.
_YIELD_AFTER = PUBLISH_YIELD_EVERY - 1
_BODY_TYPES = frozenset((bytes, bytearray, memoryview))  # (publish_encoded_many's, exactly)
_sched_yield = getattr(os, "sched_yield", None)  # (not on Windows)
_RUSAGE_THREAD = RUSAGE_THREAD  # (Linux only)
# This thread's voluntary context switches so far (voluntary_switches_py says what they
# tell): the compiled twin where it is built.
_voluntary_switches = voluntary_switches


@dataclass(slots=True)
class PublisherStats:
    """Counters of one publisher."""

    messages: int = 0  #: messages published
    bytes: int = 0  #: encoded bytes (0 when no link needed encoding)
    encodes: int = 0  #: messages encoded (at most one per message; none when relayed)
    sends: int = 0  #: message x link hand-overs
    drops: int = 0  #: messages dropped on this side for leaky links that had no room
    wait_seconds: float = 0.0  #: time publish spent waiting for lossless consumers
    waits: int = 0  #: publishes that had to wait
    #: lossless channels cut because they released nothing for ``stall_timeout``
    stalled_cut: int = 0
    #: channels whose connection was closed because the peer fell silent (heartbeats)
    dead_channels: int = 0


class Link(ABC):
    """One outlet -> channel connection, implemented by each transport."""

    #: transport name ("local", "tcp", ...)
    transport: str = ""
    #: True when the link carries encoded bytes (and so needs ``EncodedMessage``)
    needs_encoding: bool = True
    #: True when the channel is another process on this host that a paced message may
    #: have woken on this very CPU: the outlet then yields the CPU once the message is
    #: written to every link (``ShmOptions.handoff``)
    handoff: bool = False
    #: True for a link that collects a loop turn's frames in a list (a stream link):
    #: what the one-call small publish needs of every link (see ``_links_updated``)
    queues_frames: bool = False

    # Slots: the one-call small publish (``ezflow._transports._stream_publish``,
    # ``publish_small``; its compiled twin reads them at fixed offsets).
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_parked",
        "drops",
        "lossless",
        "max_message_size",
        "outlet",
        "released_bytes",
        "released_count",
        "sent_bytes",
        "sent_count",
        "stalled",
        "traced",
    )

    def __init__(self, *, lossless: bool, max_message_size: int) -> None:
        self.lossless = lossless
        self.max_message_size = max_message_size
        self.sent_count = 0
        self.sent_bytes = 0
        self.released_count = 0
        self.released_bytes = 0
        self.drops = 0
        #: True while the transport cannot take more, whatever the in-flight window
        #: (its unsent backlog is over its bound): the link then has no room.
        self.stalled = False
        #: whether traced messages go to this link traced: False when the channel's
        #: process reports no trace hops (its telemetry is off), so that a trace
        #: does not count on hops that never come (see ezflow._graph._traces)
        self.traced = True
        self.outlet: Outlet | None = None
        self._parked: tuple[int, int, Any, EncodedMessage | None] | None = None

    @property
    def in_flight(self) -> int:
        return self.sent_count - self.released_count

    @property
    def in_flight_bytes(self) -> int:
        return self.sent_bytes - self.released_bytes

    def released(self, count: int, nbytes: int) -> None:
        """Record the channel's cumulative release figures and wake a waiting publish."""
        if count > self.released_count:
            self.released_count = count
            self.released_bytes = nbytes
            outlet = self.outlet
            if outlet is not None:
                if self._parked is not None and self.has_room(outlet):
                    self.flush_parked()
                outlet.wake()

    def has_room(self, outlet: Outlet) -> bool:
        """True while this link is not :attr:`stalled` and holds fewer than the outlet's
        in-flight limits. (``Outlet.publish_nowait`` inlines this rule; a differential
        test in tests/test_outlet.py pins the two together.)"""
        if self.stalled:
            return False
        count = self.sent_count - self.released_count
        return count < outlet.max_in_flight and (
            count == 0 or self.sent_bytes - self.released_bytes < outlet.max_in_flight_bytes
        )

    def park(self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage | None) -> None:
        """Keep *message* to send when room frees up; a message parked before is dropped."""
        if self._parked is not None:
            self.drops += 1
        self._parked = (seq, time_ns, message, encoded)

    def set_lossless(self, lossless: bool) -> None:
        if lossless and not self.lossless:
            # Everything sent before the channel became lossless is not held against it.
            self.released_count = self.sent_count
            self.released_bytes = self.sent_bytes
        self.lossless = lossless
        if lossless:
            self.flush_parked()
        if self.outlet is not None:
            self.outlet.wake()

    def flush_parked(self) -> None:
        """Send the parked message now, room or not (mode change, clean close)."""
        parked, self._parked = self._parked, None
        if parked is not None:
            self.send(*parked)
            if self.outlet is not None:
                self.outlet.stats.sends += 1

    @abstractmethod
    def send(self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage | None) -> None:
        """Send one message, carrying ``self.drops`` along. Never blocks; the outlet has
        already checked for room."""

    def send_small(self, seq: int, time_ns: int, message: Any, body: bytes) -> None:
        """:meth:`send` for a message whose whole encoded body is *body* (one small
        ``bytes``; see :meth:`Codec._encode_small`). Only called on links that
        :attr:`needs_encoding`. Transports override it with a shorter path; this one
        wraps *body* and calls :meth:`send`."""
        self.send(seq, time_ns, message, EncodedMessage([body], len(body)))

    def send_traced(
        self,
        seq: int,
        time_ns: int,
        message: Any,
        encoded: EncodedMessage | None,
        trace: WireTrace,
    ) -> None:
        """:meth:`send` for a traced message: the channel gets *trace* with it (see
        :mod:`ezflow._core._tracing`). Transports override it; this one sends the
        message untraced."""
        self.send(seq, time_ns, message, encoded)

    @abstractmethod
    def close(self) -> None:
        """Close the link (idempotent); the channel sees a clean end."""

    def cut(self) -> None:
        """Break the link at once, dropping what is unsent: the channel sees its
        publisher lost, not a clean end (the stall policy). The outlet has already
        removed the link. Transports whose :meth:`close` is not a clean end may keep
        this default."""
        self.close()

    def describe(self) -> str:
        """Who is at the other end, for log lines (the transport and peer address)."""
        return f"{self.transport} channel"


class Outlet:
    """The sending half of one publisher."""

    #: whether a paced publish to channels on this host may end with a CPU yield (the
    #: publisher's ``ShmOptions.handoff``; each link says whether it leads to this host)
    handoff: bool = True
    # Slots: the one-call small publish (``ezflow._transports._stream_publish``,
    # ``publish_small``; its compiled twin reads them at fixed offsets).
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_closed",
        "_fast_limit",
        "_handoff",
        "_links",
        "_links_changed",
        "_sent_ns",
        "_seq",
        "_slept",
        "_small_limit",
        "_unyielded",
        "_unyielded_bytes",
        "_waiter",
        "codec",
        "max_in_flight",
        "max_in_flight_bytes",
        "publisher_id",
        "stall_timeout",
        "stats",
        "topic",
        "trace_countdown",
        "wait_time",
    )

    def __init__(
        self,
        publisher_id: str,
        topic: str,
        codec: Codec,
        *,
        max_in_flight: int,
        max_in_flight_bytes: int,
        stall_timeout: float | None = None,
    ) -> None:
        self.publisher_id = publisher_id
        self.topic = topic
        #: this publisher's own codec state (its hints: the kind it encoded last)
        self.codec = codec._for_stream()
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        #: seconds a lossless link may release nothing while publish waits on it before
        #: it is cut (None: wait forever)
        self.stall_timeout = stall_timeout
        self.stats = PublisherStats()
        #: each wait of ``publish`` for lossless consumers (backpressure), ns
        self.wait_time = Histogram()
        self._links: list[Link] = []
        self._seq = 0
        self._waiter: asyncio.Future[None] | None = None
        self._unyielded = 0  # publishes in a row that did not yield to the loop
        self._unyielded_bytes = 0  # bytes they encoded
        self._closed = False
        self._links_changed: asyncio.Event | None = None
        # Largest body that every link takes, or -1 when some link does not encode (a
        # local one): what publish_nowait's small-message path checks. See _links_updated.
        self._small_limit = -1
        # _small_limit when every link queues_frames (stream links), else -1: what the
        # one-call small publish checks (ezflow._transports._stream_publish).
        self._fast_limit = -1
        self._handoff = False  # some link is a handoff link (and the OS can yield)
        # time_ns() once the last message was sent, after any handoff (for handoffs)
        self._sent_ns = 0
        # _voluntary_switches() at the last paced-looking publish or wait for room: tells
        # a publisher that slept from one that was busy or preempted (see _hand_off).
        self._slept = -1
        #: messages until the next one that starts a trace (see _tracing.carry)
        self.trace_countdown = 1

    @property
    def links(self) -> tuple[Link, ...]:
        return tuple(self._links)

    @property
    def closed(self) -> bool:
        return self._closed

    def add_link(self, link: Link) -> None:
        if self._closed:
            link.close()
            raise ClosedResourceError("publisher is closed")
        link.outlet = self
        self._links.append(link)
        self._links_updated()
        self._notify_links_changed()

    def remove_link(self, link: Link) -> None:
        if link in self._links:
            self._links.remove(link)
            link.outlet = None
            self._links_updated()
            self.wake()
            self._notify_links_changed()

    def link_changed(self, link: Link) -> None:
        """Called by *link* when what the outlet reads of it for every publish changed
        (:attr:`Link.needs_encoding`): the outlet's choice of publish path follows."""
        if link in self._links:
            self._links_updated()

    def _links_updated(self) -> None:
        links = self._links
        if all(link.needs_encoding for link in links):
            self._small_limit = min((link.max_message_size for link in links), default=0)
        else:
            self._small_limit = -1
        self._fast_limit = (
            self._small_limit if links and all(link.queues_frames for link in links) else -1
        )
        self._handoff = (
            _sched_yield is not None
            and _RUSAGE_THREAD is not None
            and any(link.handoff for link in links)
        )

    def _notify_links_changed(self) -> None:
        event = self._links_changed
        if event is not None:
            event.set()
            self._links_changed = None

    async def wait_for_links(self, count: int) -> None:
        """Wait until at least *count* channels are connected."""
        while len(self._links) < count:
            if self._closed:
                raise ClosedResourceError("publisher is closed")
            event = self._links_changed
            if event is None:
                event = self._links_changed = asyncio.Event()
            await event.wait()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _blocked(self) -> bool:
        # A plain loop: this runs on every publish and any() would add a generator.
        for link in self._links:  # noqa: SIM110
            if link.lossless and not link.has_room(self):
                return True
        return False

    async def publish(self, message: Any, encoded: EncodedMessage | None = None) -> None:
        """Send *message* to every connected channel.

        Waits while any lossless channel has ``max_in_flight`` messages (or
        ``max_in_flight_bytes`` bytes) unreleased. Raises :class:`ClosedResourceError`
        after :meth:`close`, :class:`~ezflow.UnregisteredTypeError` (a ``TypeError``) for
        a message the codec cannot encode, and :class:`MessageTooLargeError` when the
        encoded message exceeds this publisher's or a receiving channel's limit — in each
        case before anything was sent. Cancellation while waiting sends nothing.

        With a ``stall_timeout``, a lossless channel that released nothing for that
        long while this waits on it is cut (see the module docstring) and the publish
        goes on for the others.

        A publish that did not have to wait yields to the event loop once every
        ``PUBLISH_YIELD_EVERY`` messages or ``PUBLISH_YIELD_BYTES`` encoded bytes
        (``PUBLISH_YIELD_LARGE_BYTES`` of messages of 1 MiB up to 4 MiB) published
        since the loop last turned, so that a tight publishing loop cannot starve the
        other tasks of its loop (a leaky subscriber in the same process would never run
        otherwise) and reads its channels' releases often. (A data connection that
        queued messages in a turn starts its outlet's count again when the loop comes
        round: a task publishing to several outlets yields once for all of them.)
        """
        if self._closed:
            raise ClosedResourceError("publisher is closed")
        # (tracing: the publish stage starts at the call, before any wait for room)
        trace = carry(self) if TRACING.active else None
        if self._blocked():
            self._unyielded = self._unyielded_bytes = 0
            await self._wait_for_room()
        else:
            self._unyielded += 1
            if (
                self._unyielded >= PUBLISH_YIELD_EVERY
                or self._unyielded_bytes >= PUBLISH_YIELD_BYTES
            ):
                self._unyielded = self._unyielded_bytes = 0
                await asyncio.sleep(0)
                if self._blocked():  # things may have changed meanwhile
                    await self._wait_for_room()
        self.send_now(message, trace, encoded)

    async def publish_encoded_many(
        self, messages: Sequence[Any], bodies: Sequence[bytes | memoryview]
    ) -> None:
        """:meth:`publish` ``messages[i]`` with its body ``bodies[i]`` (a relay's:
        links that carry bytes send it as it is, local ones get the message), for each
        *i* in order, as one call of :meth:`publish` per message would - the same frames,
        counters, waits and errors - with one room check (and wait) per run of messages
        instead of a coroutine and a check each: every message that has room is sent
        before the next wait.

        Raises ``ValueError`` when the two sequences differ in length and ``TypeError``
        for a body that is not a ``bytes``, ``bytearray`` or ``memoryview`` (before
        anything is sent); :class:`ClosedResourceError` and
        :class:`MessageTooLargeError` as :meth:`publish` does for the message they
        concern, naming its index: the messages before it were published, it and those
        after it not. Cancelled while waiting, the messages before the wait were
        published (``stats.messages`` counts them), the rest not."""
        count = len(messages)
        if len(bodies) != count:
            raise ValueError(
                f"publish_encoded_many got {count} messages and {len(bodies)} bodies: "
                "give one encoded body per message"
            )
        for index, body in enumerate(() if set(map(type, bodies)) <= _BODY_TYPES else bodies):
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise TypeError(
                    f"body {index} given to publish_encoded_many is a "
                    f"{type(body).__name__}: each body must be bytes, bytearray or a "
                    "memoryview (what Codec().encode(message).to_bytes() makes)"
                )
        index = 0
        try:
            while index < count:
                if self._closed:
                    raise ClosedResourceError("publisher is closed")
                # publish's room check, wait and yield: once per run.
                if self._blocked():
                    self._unyielded = self._unyielded_bytes = 0
                    await self._wait_for_room()
                elif (
                    self._unyielded >= PUBLISH_YIELD_EVERY
                    or self._unyielded_bytes >= PUBLISH_YIELD_BYTES
                ):
                    self._unyielded = self._unyielded_bytes = 0
                    await asyncio.sleep(0)
                    if self._blocked():
                        await self._wait_for_room()
                # The run: each message while every lossless link has room for it
                # (_blocked, over the lossless links, inlined: once a message).
                links = self._links
                lossless = [link for link in links if link.lossless]
                max_count, max_bytes = self.max_in_flight, self.max_in_flight_bytes
                # Every link takes a small bytes body as one (none local, none traced):
                # _send_small, publish_nowait's path; no link takes bodies (all local,
                # none traced, no publish hooks): send_objects; else send_now.
                small = -1 if TRACING.active else self._small_limit
                objects = (
                    small < 0
                    and not TRACING.active
                    and not PUBLISH_HOOKS
                    and not self._handoff
                    and not any(link.needs_encoding for link in links)
                )
                relay = _outlet_objects.relay_local if objects else None
                stream = _outlet_objects.relay_stream
                while True:
                    body = bodies[index]
                    if relay is not None and relay(self, messages[index], len(body)):
                        pass  # (sent as send_objects would, in one compiled call)
                    elif objects:
                        send_objects(self, links, messages[index], len(body))
                    elif type(body) is bytes and len(body) <= small:
                        if stream is None or not stream(self, messages[index], body):
                            self._send_small(links, messages[index], body, relayed=True)
                    else:
                        self.send_now(
                            messages[index],
                            carry(self) if TRACING.active else None,
                            _new_encoded(EncodedMessage, ([body], len(body))),
                        )
                    index += 1
                    self._unyielded += 1
                    if (
                        index == count
                        or self._unyielded >= PUBLISH_YIELD_EVERY
                        or self._unyielded_bytes >= PUBLISH_YIELD_BYTES
                    ):
                        break
                    full = False
                    for link in lossless:
                        in_flight = link.sent_count - link.released_count
                        if (
                            link.stalled
                            or in_flight >= max_count
                            or (in_flight and link.sent_bytes - link.released_bytes >= max_bytes)
                        ):
                            full = True
                            break
                    if full:
                        break
        except (ClosedResourceError, MessageTooLargeError) as exc:
            raise type(exc)(
                f"message {index} of the {count} given to publish_encoded_many: {exc} "
                f"(the {index} before it were published, none after it)"
            ) from exc

    def publish_nowait(self, message: Any) -> bool:
        """Send *message* now and return True when :meth:`publish` would neither wait
        nor yield; else send nothing and return False (then await :meth:`publish`).

        The same checks and errors as :meth:`publish`, without creating a coroutine:
        the latency of a paced publisher.
        """
        if self._closed:
            raise ClosedResourceError("publisher is closed")
        if self._unyielded >= _YIELD_AFTER or self._unyielded_bytes >= PUBLISH_YIELD_BYTES:
            return False
        links = self._links
        # _blocked() and Link.has_room, inlined: with caches cold (a paced publisher),
        # every call on this path costs a microsecond or so.
        for link in links:
            if link.lossless:
                if link.stalled:
                    return False
                count = link.sent_count - link.released_count
                if count >= self.max_in_flight or (
                    count and link.sent_bytes - link.released_bytes >= self.max_in_flight_bytes
                ):
                    return False
        self._unyielded += 1
        if TRACING.active:
            trace = carry(self)
            if trace is not None:
                self.send_now(message, trace)
                return True
        if self._small_limit >= 0:
            # A small array, or container of a cached shape: one bytes body. (Arrays
            # call _small_array_body directly: one call less on a paced array's path.)
            if type(message) is np.ndarray:
                body = self.codec._small_array_body(message)
            else:
                body = self.codec._encode_small(message)
            if body is not None and len(body) <= self._small_limit:
                self._send_small(links, message, body)
                return True
        self.send_now(message)
        return True

    def _send_small(
        self, links: list[Link], message: Any, body: bytes, *, relayed: bool = False
    ) -> None:
        # send_now for a small message that every link (none local) takes as *body*
        # (*relayed*: the caller's body, not encoded here: not counted in encodes).
        self._seq = seq = self._seq + 1
        now = time_ns()
        sends = drops = 0
        for link in links:
            if link.lossless or link.has_room(self):
                link.send_small(seq, now, message, body)
                sends += 1
            else:
                before = link.drops
                link.park(seq, now, message, EncodedMessage([body], len(body)))
                drops += link.drops - before
        if self._handoff:
            self._hand_off(now)
        # (a relay's body may be large: it counts as send_now counts it; a body this
        # path encoded is small, its share its size)
        self._unyielded_bytes += yield_share(len(body)) if relayed else len(body)
        stats = self.stats
        stats.messages += 1
        stats.encodes += not relayed
        stats.bytes += len(body)
        stats.sends += sends
        stats.drops += drops
        if PUBLISH_HOOKS:
            emit(
                PUBLISH_HOOKS,
                PublishEvent(self.topic, self.publisher_id, seq, len(body), len(links), now),
            )

    async def wait_for_room(self) -> None:
        """Return once no lossless channel is full (at once if none is): what
        :meth:`publish` waits for. Raises :class:`ClosedResourceError` after
        :meth:`close`; cancellation-safe."""
        if self._closed:
            raise ClosedResourceError("publisher is closed")
        if self._blocked():
            await self._wait_for_room()

    async def _wait_for_room(self) -> None:
        started = time.perf_counter_ns()
        self.stats.waits += 1
        loop = asyncio.get_running_loop()
        # Per blocking link: its released_count when first seen blocked in this wait,
        # and the loop time since when it has not moved (the stall policy).
        marks: dict[Link, tuple[int, float]] = {}
        timer: asyncio.TimerHandle | None = None
        try:
            while self._blocked():
                if self._closed:
                    raise ClosedResourceError("publisher is closed")
                waiter = self._waiter
                if waiter is None or waiter.done():
                    waiter = self._waiter = loop.create_future()
                if self.stall_timeout is not None:
                    next_check = self._cut_stalled(marks, loop.time())
                    if not self._blocked():
                        break
                    timer = loop.call_at(next_check, self.wake)
                try:
                    await waiter
                finally:
                    if timer is not None:
                        timer.cancel()
                        timer = None
        finally:
            waited = time.perf_counter_ns() - started
            self.wait_time.record(waited)
            self.stats.wait_seconds += waited / 1e9
            # Waiting for room is not idling: the message sent next is not paced, and
            # its subscribers, being behind, need no handoff.
            self._sent_ns = time_ns()
            if self._handoff:
                self._slept = _voluntary_switches()

    def _cut_stalled(self, marks: dict[Link, tuple[int, float]], now: float) -> float:
        """Cut every lossless link that blocks the publisher and released nothing for
        ``stall_timeout`` seconds of this wait; return the loop time of the next check."""
        timeout = self.stall_timeout
        assert timeout is not None
        next_check = now + timeout
        for link in list(self._links):
            if not link.lossless or link.has_room(self):
                marks.pop(link, None)
                continue
            mark = marks.get(link)
            if mark is None or mark[0] != link.released_count:
                mark = marks[link] = (link.released_count, now)
            since = mark[1]
            if now - since >= timeout:
                marks.pop(link, None)
                self.cut(link, now - since)
            else:
                next_check = min(next_check, since + timeout)
        return next_check

    def cut(self, link: Link, stalled_for: float) -> None:
        """Disconnect the lossless *link* that released nothing for *stalled_for*
        seconds (the stall policy): counted, logged once, the channel sees its
        publisher lost."""
        if link not in self._links:
            return
        self.stats.stalled_cut += 1
        log.warning(
            "publisher %s on topic %r: cutting the lossless %s: it released nothing for "
            "%.1f s while the publisher waited on it (stall_timeout=%g s; %d messages "
            "unreleased)",
            self.publisher_id,
            self.topic,
            link.describe(),
            stalled_for,
            self.stall_timeout,
            link.in_flight,
        )
        self.remove_link(link)
        link.cut()

    def send_now(
        self, message: Any, trace: WireTrace | None = None, encoded: EncodedMessage | None = None
    ) -> None:
        """Send without waiting for room (used after the room check), carrying *trace*
        to every link with room (a message parked for a leaky link travels untraced).
        *encoded*: *message*'s body when the caller has it already (a relay); links that
        carry bytes send it as it is, local ones get *message*."""
        if self._closed:
            raise ClosedResourceError("publisher is closed")
        links = self._links
        relayed = encoded is not None  # (not encoded here: not counted in encodes)
        local_message = message
        need_local = False
        for link in links:
            if link.needs_encoding:
                if encoded is None:
                    encoded = self.codec.encode(message)
                if encoded.nbytes > link.max_message_size:
                    raise MessageTooLargeError(
                        f"message of {encoded.nbytes} bytes is larger than the "
                        f"max_message_size of {link.max_message_size} bytes of a subscriber "
                        f"of topic {self.topic!r}; raise it there (option max_message_size "
                        "or EZFLOW_MAX_MESSAGE_SIZE)"
                    )
            else:
                need_local = True
        if encoded is None:
            self.codec.validate(message)
        if need_local and type(message) is np.ndarray and message.flags.writeable:
            local_message = read_only(message)
        self._seq = seq = self._seq + 1
        now = time_ns()
        sends = drops = traced = 0
        for link in links:
            link_message = message if link.needs_encoding else local_message
            if link.lossless or link.has_room(self):
                if trace is None:
                    link.send(seq, now, link_message, encoded)
                elif link.traced:
                    link.send_traced(seq, now, link_message, encoded, trace)
                    traced += 1
                else:
                    link.send(seq, now, link_message, encoded)
                sends += 1
            else:
                before = link.drops
                link.park(seq, now, link_message, encoded)
                drops += link.drops - before
        if self._handoff:
            self._hand_off(now)
        if trace is not None and trace.cause is not None:
            # (the hop this carries on: so many deliveries of its trace follow from it)
            trace.cause.forwarded += traced
        # Counted once the message is on its way (the first write is latency).
        stats = self.stats
        stats.messages += 1
        nbytes = 0
        if encoded is not None:
            nbytes = encoded.nbytes
            stats.encodes += not relayed
            stats.bytes += nbytes
            self._unyielded_bytes += yield_share(nbytes)  # (nothing, for no bytes)
        stats.sends += sends
        stats.drops += drops
        if PUBLISH_HOOKS:
            emit(
                PUBLISH_HOOKS,
                PublishEvent(self.topic, self.publisher_id, seq, nbytes, len(links), now),
            )

    def _hand_off(self, started: int) -> None:
        """After a message that started at *started* (``time_ns``) went to every link:
        yield the CPU if the publish was paced (``ShmOptions.handoff``).

        Paced: it started ``PACED_GAP_NS`` or more after the previous message was
        sent, and the publisher's thread slept (blocked: its event loop was idle) since
        the last paced-looking publish or wait for room. A gap that was work (a producer
        filling large frames back to back) or preemption on a loaded machine is not
        idleness: that publisher's subscriber is behind, not waiting for this CPU. The
        context-switch count costs a system call, so it is read only for publishes that
        pass the gap test. The subscriber a paced message woke may be waiting for this
        very CPU: let it run now, not after the rest of our event-loop turn. The send
        time is read *after* the yield, so the time given away never makes the next
        publish look paced: a burst yields at most once, at its first message.
        """
        if started - self._sent_ns >= PACED_GAP_NS:
            slept = _voluntary_switches()
            if slept != self._slept:
                _sched_yield()  # type: ignore[misc]
                # (sched_yield counts as an involuntary switch: no need to read again)
            self._slept = slept
        self._sent_ns = time_ns()

    def close(self) -> None:
        """Close every link (each channel sees a clean end) and refuse further publishes."""
        if self._closed:
            return
        self._closed = True
        for link in list(self._links):
            link.flush_parked()
            link.close()
        self._links.clear()
        self.wake()
        self._notify_links_changed()
