"""The graph server's ring watcher: live ezring rings (docs/ezring.md) as publishers.

Every ``EZRING_WATCH_INTERVAL`` the server has it :meth:`~RingWatcher.scan` the shm
directory (in a worker thread: file I/O) for live rings of its own user - removing the
files of rings whose writer died on the way - and :meth:`~RingWatcher.update` the
registry: each live ring with a valid topic in its header is a publisher of that topic,
owned by :attr:`Registry.watcher <._registry.Registry.watcher>`, until the ring is
closed, its writer dies or its file is gone. A ring some client attached explicitly
(``GraphContext.attach_ring``) is left to that client. :meth:`~RingWatcher.telemetry`
reports the watched rings as one more process.

The interface is those three methods; how rings are found is the *scan* function the
watcher is given (default :func:`sweep_and_scan_rings`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .._core._protocol import check_topic
from .._core._telemetry import HistogramSnapshot, ProcessSnapshot, PublisherSnapshot
from .._transports import LiveRing, scan_rings, sweep_stale_rings
from ._registry import Registry

__all__ = ["RingWatcher", "ring_publisher", "sweep_and_scan_rings"]

log = logging.getLogger("ezflow.server")


def ring_publisher(name: str, ring: LiveRing) -> str:
    """The publisher id of a watched ring: one per writer (the ring's creation time), so a
    writer that restarts under the same name is a new publisher, not the one that ended."""
    return f"p-ring-{name}-{ring.header.created_ns:x}"


def sweep_and_scan_rings() -> dict[str, LiveRing]:
    """Remove the files of dead writers' rings, then find the live ones (file I/O: in a
    worker thread)."""
    sweep_stale_rings(report=True)
    return scan_rings(report=True)


class RingWatcher:
    """Keeps *registry*'s watched publishers those of the live rings (see the module
    docstring); *scan* finds them (blocking: run in a worker thread)."""

    def __init__(
        self, registry: Registry, scan: Callable[[], dict[str, LiveRing]] = sweep_and_scan_rings
    ) -> None:
        self._registry = registry
        self._scan = scan
        self._bad_topics: set[str] = set()  # rings whose topic was refused (logged once)
        # The latest scan and the one before (wall-clock time, rings): rates.
        self._latest: tuple[float, dict[str, LiveRing]] = (0.0, {})
        self._previous: tuple[float, dict[str, LiveRing]] = (0.0, {})

    async def scan(self) -> dict[str, LiveRing]:
        """The live rings by name, found in a worker thread (no file I/O on the loop)."""
        rings = await asyncio.to_thread(self._scan)
        self._previous, self._latest = self._latest, (time.time(), rings)
        return rings

    def update(self, rings: dict[str, LiveRing], address: tuple[str, int]) -> bool:
        """Make the watched publishers those of *rings* (live rings by name; their
        publishers' data address: *address*, the server's); return whether anything
        changed."""
        registry = self._registry
        changed = False
        for name, pub_id in registry.watched().items():
            ring = rings.get(name)
            if ring is None or pub_id != ring_publisher(name, ring):
                changed |= registry.unwatch(pub_id)
                log.info("graph server: ezring %s is gone, unregistered", name)
        attached = registry.attached_rings()
        for name, ring in rings.items():
            header = ring.header
            if name in attached or not header.topic:
                continue  # a client attached it, or no topic to publish it under
            try:
                topic = check_topic(header.topic)
            except ValueError as error:
                if name not in self._bad_topics:  # (once per ring name)
                    self._bad_topics.add(name)
                    log.warning("graph server: ezring %s is not registered: %s", name, error)
                continue
            registry.watch(ring_publisher(name, ring), topic, address, name, header.created_ns)
            changed = True
            log.info("graph server: ezring %s registered as a publisher of %r", name, topic)
        return changed

    def telemetry(self) -> ProcessSnapshot | None:
        """The watched rings as a process snapshot (``None`` when there are none): a
        publisher each (messages: frames published, drops: frames dropped with every
        slot held, channels: live readers)."""
        registry = self._registry
        watched = registry.watched()
        if not watched:
            return None
        now, rings = self._latest
        then, before = self._previous
        interval = now - then if then else 0.0
        publishers = []
        for name, pub_id in sorted(watched.items()):
            ring = rings.get(name)
            pub = registry.publishers.get(pub_id)
            if ring is None or pub is None:
                continue
            stats = ring.stats
            old = before.get(name)
            rate = (
                (stats.published - old.stats.published) / interval
                if old is not None and interval > 0
                else 0.0
            )
            publishers.append(
                PublisherSnapshot(
                    publisher_id=pub_id,
                    topic=pub.topic,
                    channels=stats.readers_live,
                    messages=stats.published,
                    bytes=0,  # a ring does not count bytes
                    drops=stats.dropped_full,
                    waits=0,  # a ring writer never waits: it drops
                    wait=HistogramSnapshot(),
                    shm_in_use=0,
                    msgs_per_s=rate,
                    bytes_per_s=0.0,
                )
            )
        client = registry.watcher
        return ProcessSnapshot(
            name=client.name,
            pid=client.pid,
            hostname=client.hostname,
            time=now,
            interval=interval,
            publishers=tuple(publishers),
        )
