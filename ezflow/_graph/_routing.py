"""Routing: turning the graph server's routes into channels of this process.

The graph server pushes, for every subscriber of a client, the publishers that feed it.
A :class:`Router` reconciles those routes with the channels this process has: one
:class:`~ezflow._core._channel.Channel` per (publisher, transport) that any local
subscriber listens to, opened on the transport the context's
:class:`~ezflow._transports.TransportSet` chooses per edge, and closed when nobody
listens any more. A channel that cannot open on a transport with a fall-back (shm: tcp)
moves to that one, as the set says. Applying the same routes twice changes nothing, so
routes can be re-applied after any change without duplicating a channel.

After a reconnection to the graph server (possibly a new one), :meth:`Router.hold`
keeps the channels that exist for a grace period even when the new server's routes do
not list their publishers: the publishers' processes are re-registering too, and closing
a channel that still receives data would lose what is published meanwhile.

Rejoin: a channel whose connection breaks without ``END`` - its publisher cut it
(``stall_timeout``) or declared it dead (heartbeats), a link went down, this side
declared the publisher dead - is *lost*, not ended (only a clean ``END`` ends a
publisher for good). While the routes list its publisher for a subscriber here, the
router opens it again, as a new channel that receives from then on (a late joiner):
first once the lossless subscribers it fed have taken what it delivered (a subscriber
still stuck is not fed again only to be cut again), after ``REJOIN_MIN_DELAY``, then
with a backoff doubling to ``REJOIN_MAX_DELAY`` while attempts fail. A rejoin is logged
(one line: topic, publisher, how it was lost) and counted (``ChannelStats.rejoins``,
``SubscriberStats.rejoins``). A channel that fails to open at all is retried the same
way. When the routes drop a lost publisher, the attempts stop, and the subscribers it
fed count it as ended, broken.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .._core._channel import Attachment, Channel, ChannelStats, Inbox
from .._core._codec import Codec
from .._core._config import REJOIN_MAX_DELAY, REJOIN_MIN_DELAY
from .._core._deprecation import warn_deprecated
from .._core._exceptions import EzflowError
from .._core._protocol import PublisherInfo
from .._transports import Inbound, TransportSet
from ._subscriber import Subscriber

__all__ = ["ChannelInfo", "ChannelRecord", "Router", "RoutesAck"]

#: Called with a routes version once the channels match it (sends ``routes_applied`` on
#: the connection the routes came from, if it is still the current one).
RoutesAck = Callable[[int], None]

log = logging.getLogger("ezflow.context")


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """A snapshot of one channel of a context (see :attr:`GraphContext.channels`)."""

    publisher_id: str
    topic: str
    transport: str
    subscribers: int
    lossless: bool
    pending: int
    #: the channel's counters when the snapshot was taken
    statistics: ChannelStats

    @property
    def stats(self) -> ChannelStats:
        """Deprecated (removed in the next release): use :attr:`statistics`."""
        warn_deprecated("ChannelInfo.stats", "ChannelInfo.statistics")
        return self.statistics


@dataclass(eq=False)
class ChannelRecord:
    """One channel of this process and what it needs: the transport's inbound half and
    the attachment of every local subscriber it feeds."""

    key: tuple[str, str]  # (publisher id, transport)
    channel: Channel
    inbound: Inbound | None = None
    attachments: dict[str, Attachment] = field(default_factory=dict)


def _no_ack(version: int) -> None:
    """Routes re-applied to reopen a lost channel were acknowledged already."""


@dataclass(eq=False)
class _Lost:
    """A publisher whose channel to this process was lost (or could not open) while
    the routes list it: reopened with backoff (see the module docstring)."""

    topic: str
    reason: str  #: how it was lost, for the rejoin's log line
    since: float  #: loop time of the loss
    #: a channel to it was open before (a rejoin); false: it never opened yet
    cut: bool
    delay: float = REJOIN_MIN_DELAY  #: the pause before the next attempt (before jitter)
    attempts: int = 0  #: attempts to reopen it that failed
    #: the next attempt may open it (the timer fired and its subscribers caught up)
    due: bool = False
    timer: asyncio.TimerHandle | None = None
    #: each lost channel with the lossless inboxes it fed: reopened only once those
    #: hold nothing more from it
    waiting: list[tuple[Channel, list[Inbox]]] = field(default_factory=list)


@dataclass(eq=False)
class _Rejoins:
    """The rejoins of one publisher's channels in this process (while it is routed)."""

    count: int  #: so far: each new channel carries it (ChannelStats.rejoins)
    delay: float  #: the pause (before jitter) the last one had reached
    at: float  #: loop time of the last one


class Router:
    """The channels of one GraphContext, kept in line with the latest routes.

    *subscribers* is the context's live map of its subscribers (read, never changed
    here). Routes arrive through :meth:`offer`; :meth:`run` applies the newest one at a
    time (a burst of updates is applied once) and acknowledges its version.
    """

    def __init__(
        self,
        *,
        codec: Codec,
        transports: TransportSet,
        env_transport: str | None,
        subscribers: Mapping[str, Subscriber],
    ) -> None:
        self._codec = codec
        self._transports = transports
        self.host_id = transports.host_id
        self._env_transport = env_transport
        self._subscribers = subscribers
        self.channels: dict[tuple[str, str], ChannelRecord] = {}
        # Publishers whose channel saw their clean END: the routes may list them a
        # little longer (they unregister after their channels read END); never reopen
        # those. Publishers whose channel was lost instead are reopened (rejoin).
        self._ended: set[str] = set()
        self._lost: dict[str, _Lost] = {}
        self._rejoins: dict[str, _Rejoins] = {}
        self._routes: tuple[int, dict[str, Any], RoutesAck] | None = None
        self._latest: tuple[int, dict[str, Any], RoutesAck] | None = None
        self._routes_ready = asyncio.Event()
        # Channels kept although routes omit them, until the hold timer fires.
        self._held: set[tuple[str, str]] = set()
        self._hold_timer: asyncio.TimerHandle | None = None

    # -- routes in -----------------------------------------------------------------------

    def offer(self, version: int, message: dict[str, Any], ack: RoutesAck) -> None:
        """Routes *version* arrived: :meth:`run` applies them (superseding older ones
        not applied yet), then calls *ack* with *version*."""
        self._routes = self._latest = (version, message, ack)
        self._routes_ready.set()

    def hold(self, seconds: float) -> None:
        """The context reconnected to a graph server: for *seconds*, keep every channel
        that exists now even when routes do not list it (its publisher's process may
        not have re-registered yet); a channel whose publisher ends or whose
        connection breaks still closes at once. Then the latest routes are applied
        again, closing what they do not list. Routes offered before this call are
        forgotten (they came from the previous connection)."""
        loop = asyncio.get_running_loop()
        self._held = set(self.channels)
        self._latest = None
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        self._hold_timer = loop.call_later(seconds, self._release_held)

    def _release_held(self) -> None:
        self._hold_timer = None
        self._held.clear()
        if self._latest is not None and self._routes is None:
            self._routes = self._latest
            self._routes_ready.set()

    async def run(self) -> None:
        """Apply routes as they are offered, until cancelled; a failure is logged and
        the next routes are applied as usual. Each is acknowledged after."""
        while True:
            await self._routes_ready.wait()
            self._routes_ready.clear()
            if self._routes is None:
                continue
            (version, message, ack), self._routes = self._routes, None
            try:
                await self.apply(message)
            except EzflowError as exc:
                log.error("could not apply routes version %d: %s", version, exc)
            except Exception:
                log.exception("could not apply routes version %d", version)
            ack(version)

    # -- channels ------------------------------------------------------------------------

    def infos(self) -> list[ChannelInfo]:
        """A snapshot of every channel, one per (publisher, transport)."""
        return [
            ChannelInfo(
                publisher_id=record.key[0],
                topic=record.channel.topic,
                transport=record.key[1],
                subscribers=len(record.attachments),
                lossless=record.channel.lossless,
                pending=record.channel.pending,
                statistics=replace(record.channel.stats),
            )
            for record in self.channels.values()
        ]

    def detach(self, subscriber_id: str) -> None:
        """Take *subscriber_id* off every channel; close the channels nobody listens to."""
        for record in list(self.channels.values()):
            attachment = record.attachments.pop(subscriber_id, None)
            if attachment is not None:
                record.channel.detach(attachment)
            if not record.attachments:
                self.close_record(record)

    def close(self) -> None:
        """Close every channel (the context is closing)."""
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        for lost in self._lost.values():
            if lost.timer is not None:
                lost.timer.cancel()
        self._lost.clear()
        for record in list(self.channels.values()):
            self.close_record(record)

    def choose_transport(self, publisher: PublisherInfo, subscriber: Subscriber) -> str:
        """The transport of the edge *publisher* -> *subscriber*: forced by the
        subscriber, else the publisher, else ``EZFLOW_TRANSPORT``, else automatic (see
        :meth:`TransportSet.choose`: local in the same process and loop; else shm on the
        same host when both processes can use it; else tcp; an attached ezring ring
        always through "ezring"). A forced choice that cannot work falls back to the
        automatic one, with a warning logged once per edge."""
        wanted = subscriber.transport or publisher.transport or self._env_transport
        return self._transports.choose(publisher, wanted, subscriber.id, subscriber.topic)

    async def apply(self, message: dict[str, Any]) -> None:
        """Reconcile the channels with the routes *message* (idempotent)."""
        publishers = {
            pub_id: PublisherInfo.from_wire(info)
            for pub_id, info in dict(message.get("publishers") or {}).items()
        }
        wanted: dict[tuple[str, str], list[Subscriber]] = {}
        routes = dict(message.get("subscribers") or {})
        # Just after a reconnection the routes may not list every live publisher yet.
        holding = self._hold_timer is not None
        for sub_id, known in self._subscribers.items():
            # Which publishers may still feed it: part of its end of stream.
            known._inbox.routed(
                frozenset(p for p in routes.get(sub_id, ()) if p in publishers),
                keep_lost=holding,
            )
        for sub_id, pub_ids in routes.items():
            subscriber = self._subscribers.get(sub_id)
            if subscriber is None or subscriber.closed:
                continue
            for pub_id in pub_ids:
                info = publishers.get(pub_id)
                if info is None or pub_id in self._ended:
                    continue
                key = (pub_id, self.choose_transport(info, subscriber))
                wanted.setdefault(key, []).append(subscriber)
        if not holding:
            self._forget_unrouted({key[0] for key in wanted}, publishers)
        # Detach what is no longer routed; close channels nobody listens to. A held
        # channel (see hold) that routes omit entirely stays as it is for now.
        self._held -= wanted.keys()
        for key, record in list(self.channels.items()):
            if key in self._held:
                continue
            keep = {s.id for s in wanted.get(key, ())}
            for sub_id in [s for s in record.attachments if s not in keep]:
                record.channel.detach(record.attachments.pop(sub_id))
            if not record.attachments:
                self.close_record(record)
        # Attach to existing channels; open the missing ones concurrently.
        opening = []
        for key, subscribers in wanted.items():
            existing = self.channels.get(key)
            if existing is None:
                lost = self._lost.get(key[0])
                if lost is not None and not lost.due:
                    continue  # reopened when its timer says (_rejoin_due)
                opening.append(self._open_record(key, publishers[key[0]], subscribers))
                continue
            for subscriber in subscribers:
                if subscriber.id not in existing.attachments and not subscriber.closed:
                    existing.attachments[subscriber.id] = existing.channel.attach(subscriber._inbox)
        if opening:
            await asyncio.gather(*opening)

    async def _open_record(
        self, key: tuple[str, str], info: PublisherInfo, subscribers: list[Subscriber]
    ) -> None:
        channel = Channel(info.publisher_id, info.topic, self._codec, transport=key[1])
        record = ChannelRecord(key, channel)
        self.channels[key] = record
        for subscriber in subscribers:
            record.attachments[subscriber.id] = channel.attach(subscriber._inbox)
        while True:
            try:
                record.inbound = await self._transports.get(record.key[1]).open_channel(
                    channel, info, on_lost=lambda: self._lost_record(record)
                )
            except EzflowError as exc:
                if self.channels.get(record.key) is record:
                    fallback = self._transports.fall_back(record.key[1], info, exc)
                    if fallback is not None:
                        if self._move_record(record, info, fallback):
                            continue  # the same record, now over the fall-back
                        return  # joined the channel this process has to it there already
                self._open_failed(record, exc)
                return
            break
        assert record.inbound is not None
        if self.channels.get(record.key) is not record:
            # Closed (context closing, subscribers gone, lost) while we were connecting.
            record.inbound.close()
            return
        self._opened(record, self._lost.pop(info.publisher_id, None))

    def _move_record(self, record: ChannelRecord, info: PublisherInfo, transport: str) -> bool:
        """The channel to *info* could not open on its transport (said by the set):
        turn *record* into one over *transport*; true if it is to be opened there,
        false if it joined an existing channel to the same publisher there instead."""
        del self.channels[record.key]
        record.key = (info.publisher_id, transport)
        record.channel.transport = transport
        existing = self.channels.get(record.key)
        if existing is None:
            self.channels[record.key] = record
            return True
        # Another channel to it over that transport exists already: join it.
        for sub_id, attachment in list(record.attachments.items()):
            record.channel.detach(attachment)
            subscriber = self._subscribers.get(sub_id)
            if subscriber is not None and sub_id not in existing.attachments:
                existing.attachments[sub_id] = existing.channel.attach(subscriber._inbox)
        record.attachments.clear()
        record.channel.close()
        return False

    def _lost_record(self, record: ChannelRecord) -> None:
        channel = record.channel
        if channel.ended:
            self._ended.add(record.key[0])
        elif self.channels.get(record.key) is record:
            channel.lost("its feed stopped")  # (when the transport did not say how)
            self._lose(record.key[0], channel, record.attachments.values(), cut=True)
        record.inbound = None
        self.close_record(record)

    # -- rejoin (see the module docstring) -------------------------------------------------

    def _lose(
        self, publisher_id: str, channel: Channel, attachments: Iterable[Attachment], *, cut: bool
    ) -> None:
        """*channel* to *publisher_id* was lost (*cut*) or could not open: reopen it
        when due (while the routes list it)."""
        reason = channel.lost_reason or "its feed stopped"
        lost = self._lost.get(publisher_id)
        if lost is None:
            now = asyncio.get_running_loop().time()
            lost = self._lost[publisher_id] = _Lost(channel.topic, reason, now, cut)
            rejoins = self._rejoins.get(publisher_id)
            if rejoins is not None and now - rejoins.at < REJOIN_MAX_DELAY:
                # Lost again right after it rejoined (flapping): go on with the backoff.
                lost.delay = min(rejoins.delay * 2, REJOIN_MAX_DELAY)
        else:
            lost.reason = reason
            lost.cut = lost.cut or cut
        lost.due = False
        lost.waiting.append((channel, [a.inbox for a in attachments if a.lossless]))
        self._schedule_rejoin(publisher_id, lost)

    def _schedule_rejoin(self, publisher_id: str, lost: _Lost) -> None:
        if lost.timer is not None:
            lost.timer.cancel()
        pause = random.uniform(lost.delay / 2, lost.delay)
        lost.timer = asyncio.get_running_loop().call_later(pause, self._rejoin_due, publisher_id)

    def _rejoin_due(self, publisher_id: str) -> None:
        """The pause before reopening *publisher_id*'s channel is over: reopen it now if
        the lossless subscribers it fed took everything it delivered, else look again
        after a longer pause."""
        lost = self._lost.get(publisher_id)
        if lost is None:
            return
        lost.timer = None
        lost.waiting = [
            (channel, still)
            for channel, inboxes in lost.waiting
            if (still := [i for i in inboxes if not i.closed and i.holds(channel)])
        ]
        if lost.waiting:
            lost.delay = min(lost.delay * 2, REJOIN_MAX_DELAY)
            self._schedule_rejoin(publisher_id, lost)
            return
        lost.due = True
        # The routes have not changed (the server pushes changes only): apply the
        # latest ones again, which opens what is missing. Before any routes of this
        # connection arrived (just reconnected), the next routes will.
        if self._latest is not None and self._routes is None:
            version, message, _ = self._latest
            self._routes = (version, message, _no_ack)
            self._routes_ready.set()

    def _open_failed(self, record: ChannelRecord, error: EzflowError) -> None:
        """Opening *record*'s channel failed: try again later, while routed."""
        publisher_id = record.key[0]
        if self.channels.get(record.key) is record:
            lost = self._lost.get(publisher_id)
            if lost is None or lost.attempts == 0:
                log.info(
                    "cannot %s the channel to publisher %s on topic %r: %s; retrying (pauses "
                    "up to %g s) while the routes list it",
                    "open" if lost is None or not lost.cut else "reopen",
                    publisher_id,
                    record.channel.topic,
                    error,
                    REJOIN_MAX_DELAY,
                )
            else:
                log.debug(
                    "attempt %d to reopen the channel to publisher %s failed: %s",
                    lost.attempts + 1,
                    publisher_id,
                    error,
                )
            # (Its subscribers' inboxes take the publisher for lost, not ended.)
            if lost is None:
                record.channel.lost(f"its channel could not open ({error})")
                self._lose(publisher_id, record.channel, (), cut=False)
                self._lost[publisher_id].attempts = 1
            else:
                record.channel.lost(lost.reason)
                lost.attempts += 1
                lost.delay = min(lost.delay * 2, REJOIN_MAX_DELAY)
                lost.due = False
                self._schedule_rejoin(publisher_id, lost)
        self.close_record(record)

    def _opened(self, record: ChannelRecord, lost: _Lost | None) -> None:
        """*record*'s channel is open: if its publisher was *lost* (or had ended broken
        for a subscriber, and came back), its subscribers rejoined: count and log it."""
        if lost is not None and lost.timer is not None:
            lost.timer.cancel()
        publisher_id, transport = record.key
        cut = lost is None or lost.cut
        rejoining = sum(
            attachment.inbox.rejoined(publisher_id, count=cut)
            for attachment in record.attachments.values()
        )
        if lost is None and not rejoining:
            return  # an ordinary first open
        if not cut:
            assert lost is not None
            log.info(
                "opened the channel to publisher %s on topic %r over %s after %d failed attempts",
                publisher_id,
                lost.topic,
                transport,
                lost.attempts,
            )
            return
        now = asyncio.get_running_loop().time()
        rejoins = self._rejoins.get(publisher_id)
        if rejoins is None:
            rejoins = self._rejoins[publisher_id] = _Rejoins(0, REJOIN_MIN_DELAY, now)
        rejoins.count += 1
        rejoins.at = now
        record.channel.stats.rejoins = rejoins.count
        if lost is None:
            log.info(
                "rejoined publisher %s on topic %r over %s: it had been lost, then no longer "
                "routed here; %d subscribers receive from now on, as late joiners",
                publisher_id,
                record.channel.topic,
                transport,
                rejoining,
            )
            return
        rejoins.delay = lost.delay
        log.info(
            "rejoined publisher %s on topic %r over %s, %.1f s after its channel was lost "
            "(%s; %d failed attempts since): %d subscribers receive from now on, as late "
            "joiners",
            publisher_id,
            lost.topic,
            transport,
            now - lost.since,
            lost.reason,
            lost.attempts,
            rejoining,
        )

    def _forget_unrouted(self, routed: set[str], publishers: Mapping[str, Any]) -> None:
        """The latest routes (complete: not held) feed no subscriber here from the
        publishers outside *routed*: stop reopening those, and forget what was kept
        about the ones the routes no longer list at all."""
        for publisher_id in [p for p in self._lost if p not in routed]:
            lost = self._lost.pop(publisher_id)
            if lost.timer is not None:
                lost.timer.cancel()
            log.debug(
                "publisher %s on topic %r, lost (%s), is no longer routed here: not reopening it",
                publisher_id,
                lost.topic,
                lost.reason,
            )
        self._ended.intersection_update(publishers)
        for publisher_id in [p for p in self._rejoins if p not in publishers]:
            del self._rejoins[publisher_id]

    def close_record(self, record: ChannelRecord) -> None:
        """Close *record*'s channel and inbound half and forget it."""
        if self.channels.get(record.key) is record:
            del self.channels[record.key]
        record.attachments.clear()
        record.channel.close()
        inbound, record.inbound = record.inbound, None
        if inbound is not None:
            inbound.close()
