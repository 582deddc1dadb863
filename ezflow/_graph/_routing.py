"""Routing: turning the graph server's routes into channels of this process.

The graph server pushes, for every subscriber of a client, the publishers that feed it.
A :class:`Router` reconciles those routes with the channels this process has: one
:class:`~ezflow._core._channel.Channel` per (publisher, transport) that any local
subscriber listens to, opened on the transport chosen per edge (local, shm, tcp) and
closed when nobody listens any more. Applying the same routes twice changes nothing, so
routes can be re-applied after any change without duplicating a channel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._core._channel import Attachment, Channel, ChannelStats
from .._core._codec import Codec
from .._core._exceptions import EzflowError
from .._core._protocol import PublisherInfo
from .._transports._base import Inbound, Transport
from .._transports._local import LocalTransport
from .._transports._shm import ShmTransport
from .._transports._tcp import TcpTransport
from ._subscriber import Subscriber

__all__ = ["ChannelInfo", "ChannelRecord", "Router"]

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
    stats: ChannelStats


@dataclass(eq=False)
class ChannelRecord:
    """One channel of this process and what it needs: the transport's inbound half and
    the attachment of every local subscriber it feeds."""

    key: tuple[str, str]  # (publisher id, transport)
    channel: Channel
    inbound: Inbound | None = None
    attachments: dict[str, Attachment] = field(default_factory=dict)


class Router:
    """The channels of one GraphContext, kept in line with the latest routes.

    *subscribers* is the context's live map of its subscribers (read, never changed
    here). Routes arrive through :meth:`offer`; :meth:`run` applies the newest one at a
    time (a burst of updates is applied once) and calls *applied* with its version.
    """

    def __init__(
        self,
        *,
        codec: Codec,
        local: LocalTransport,
        tcp: TcpTransport,
        shm: ShmTransport | None,
        host_id: str,
        env_transport: str | None,
        subscribers: Mapping[str, Subscriber],
    ) -> None:
        self._codec = codec
        self._local = local
        self._tcp = tcp
        self._shm = shm
        self.host_id = host_id
        self._env_transport = env_transport
        self._subscribers = subscribers
        self.channels: dict[tuple[str, str], ChannelRecord] = {}
        # Publishers whose shm edges failed to open: their edges use tcp from then on.
        self._shm_refused: set[str] = set()
        self._warned: set[tuple[str, str]] = set()
        # Publishers whose channel saw their end: the routes may list them a little
        # longer (they unregister after their channels read END); never reopen those.
        self._ended: set[str] = set()
        self._routes: tuple[int, dict[str, Any]] | None = None
        self._routes_ready = asyncio.Event()

    # -- routes in -----------------------------------------------------------------------

    def offer(self, version: int, message: dict[str, Any]) -> None:
        """Routes *version* arrived: :meth:`run` applies them (superseding older ones
        not applied yet)."""
        self._routes = (version, message)
        self._routes_ready.set()

    async def run(self, applied: Callable[[int], None]) -> None:
        """Apply routes as they are offered, until cancelled; a failure is logged and
        the next routes are applied as usual. *applied* is called after each."""
        while True:
            await self._routes_ready.wait()
            self._routes_ready.clear()
            assert self._routes is not None
            version, message = self._routes
            try:
                await self.apply(message)
            except EzflowError as exc:
                log.error("could not apply routes version %d: %s", version, exc)
            except Exception:
                log.exception("could not apply routes version %d", version)
            applied(version)

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
                stats=record.channel.stats,
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
        for record in list(self.channels.values()):
            self.close_record(record)

    def choose_transport(self, publisher: PublisherInfo, subscriber: Subscriber) -> str:
        """local in the same process and loop; else shm on the same host when both
        processes can use it; else tcp. A forced choice that cannot work falls back to
        the automatic one, with a warning logged once per edge."""
        wanted = subscriber.transport or publisher.transport or self._env_transport
        if wanted == "tcp":
            return "tcp"
        local = LocalTransport.reachable(publisher.publisher_id)
        shm = (
            self._shm is not None
            and publisher.shm_address is not None
            and publisher.host_id == self.host_id
            and publisher.publisher_id not in self._shm_refused
        )
        if wanted == "shm" and shm:
            return "shm"
        chosen = "local" if local else "shm" if shm else "tcp"
        if wanted is not None and wanted != chosen:
            key = (publisher.publisher_id, subscriber.id)
            if key not in self._warned:
                self._warned.add(key)
                reason = (
                    "the publisher is in another process"
                    if wanted == "local"
                    else "shared memory cannot be used between these processes"
                    " (another host, no /dev/shm, or it failed before)"
                )
                log.warning(
                    "transport %r asked for %s -> %s, but %s; using %s",
                    wanted,
                    publisher.topic,
                    subscriber.topic,
                    reason,
                    chosen,
                )
        return chosen

    def _transport(self, name: str) -> Transport:
        if name == "local":
            return self._local
        if name == "shm":
            assert self._shm is not None
            return self._shm
        return self._tcp

    async def apply(self, message: dict[str, Any]) -> None:
        """Reconcile the channels with the routes *message* (idempotent)."""
        publishers = {
            pub_id: PublisherInfo.from_wire(info)
            for pub_id, info in dict(message.get("publishers") or {}).items()
        }
        wanted: dict[tuple[str, str], list[Subscriber]] = {}
        routes = dict(message.get("subscribers") or {})
        for sub_id, known in self._subscribers.items():
            # Which publishers may still feed it: part of its end of stream.
            known._inbox.routed(frozenset(p for p in routes.get(sub_id, ()) if p in publishers))
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
        # Detach what is no longer routed; close channels nobody listens to.
        for key, record in list(self.channels.items()):
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
                record.inbound = await self._transport(record.key[1]).open_channel(
                    channel, info, on_lost=lambda: self._lost_record(record)
                )
            except EzflowError as exc:
                if record.key[1] == "shm" and self.channels.get(record.key) is record:
                    if self._fall_back_to_tcp(record, info, exc):
                        continue  # the same record, now over tcp
                    return  # joined the tcp channel this process has to it already
                log.warning("cannot open a channel to %s: %s", info.publisher_id, exc)
                self.close_record(record)
                return
            break
        if self.channels.get(record.key) is not record:
            # Closed (context closing, subscribers gone) while we were connecting.
            record.inbound.close()

    def _fall_back_to_tcp(
        self, record: ChannelRecord, info: PublisherInfo, error: EzflowError
    ) -> bool:
        """The shm channel to *info* could not open: say so once, and turn *record* into
        a tcp one; true if it is to be opened over tcp, false if it joined an existing
        tcp channel to the same publisher instead."""
        if info.publisher_id not in self._shm_refused:
            self._shm_refused.add(info.publisher_id)
            log.warning(
                "cannot use shared memory for publisher %s on topic %r (%s); its edges to "
                "this process use tcp",
                info.publisher_id,
                info.topic,
                error,
            )
        del self.channels[record.key]
        record.key = (info.publisher_id, "tcp")
        record.channel.transport = "tcp"
        existing = self.channels.get(record.key)
        if existing is None:
            self.channels[record.key] = record
            return True
        # Another channel to it over tcp exists already: join it.
        for sub_id, attachment in list(record.attachments.items()):
            record.channel.detach(attachment)
            subscriber = self._subscribers.get(sub_id)
            if subscriber is not None and sub_id not in existing.attachments:
                existing.attachments[sub_id] = existing.channel.attach(subscriber._inbox)
        record.attachments.clear()
        record.channel.close()
        return False

    def _lost_record(self, record: ChannelRecord) -> None:
        if record.channel.ended:
            self._ended.add(record.key[0])
        record.inbound = None
        self.close_record(record)

    def close_record(self, record: ChannelRecord) -> None:
        """Close *record*'s channel and inbound half and forget it."""
        if self.channels.get(record.key) is record:
            del self.channels[record.key]
        record.attachments.clear()
        record.channel.close()
        inbound, record.inbound = record.inbound, None
        if inbound is not None:
            inbound.close()
