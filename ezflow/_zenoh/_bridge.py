"""The Zenoh bridge: ezflow topics exported to Zenoh key expressions and key expressions
imported into ezflow topics, against a running graph (a :class:`~ezflow.GraphContext`).

Payload: the message's ezflow codec body, as the receiving graph would get it over tcp,
with Zenoh encoding :data:`ENCODING`; the attachment is a msgpack map ``{"v": 1,
"seq": n, "t": publish time (unix ns, CLOCK_REALTIME), "drops": messages the exporter
dropped so far}``. The importer counts a gap in ``seq`` as messages lost between the
hosts, and ``t`` gives a cross-host latency (as good as the hosts' clock sync).

Flow control, per mapping:

* **leaky** (default): the exporter's ezflow subscriber keeps the newest *queue*
  messages, Zenoh drops when its link is busy (``CongestionControl.DROP``), and the
  importer keeps the newest *queue* samples; every drop is counted.
* **lossless**: the exporter's subscriber is lossless, its Zenoh publisher is
  ``RELIABLE`` with ``CongestionControl.BLOCK`` (``put`` waits, in a worker thread, while
  the link is busy), and the importer holds at most *queue* samples: when they are all
  taken, Zenoh's delivery thread waits for a slot, so Zenoh's reliable link, and then the
  exporter, wait too. Nothing is dropped while the Zenoh path stays up. Limits: samples
  in flight when a router or link goes down are lost (the importer counts the gap and
  logs it); the exporter does not keep a window to resend them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack
import zenoh

from .._core._codec import Codec
from .._core._config import ZENOH_EXPORT_BATCH, ZENOH_QUEUE
from .._core._exceptions import ClosedResourceError, ConfigurationError, EndOfStream
from .._graph._context import GraphContext
from .._units._component import Unit
from .._units._decorators import task
from .._units._host import graph_context_of
from .._units._settings import Settings
from ._fleet import announce, fleet_key
from ._keys import expand_host, imported_topic, topic_to_key
from ._session import ZenohSettings, open_session

__all__ = [
    "ENCODING",
    "Export",
    "Import",
    "MappingStats",
    "ZenohBridge",
    "ZenohBridgeSettings",
    "ZenohBridgeUnit",
]

log = logging.getLogger("ezflow.zenoh")

#: The Zenoh encoding of a bridged payload.
ENCODING = "application/x-ezflow-codec;v=1"


@dataclass(frozen=True)
class Export:
    """Publish ezflow *topic* on Zenoh *key* (``{host}`` is replaced by the bridge's host
    name; default: ``ezflow/{host}/`` and the escaped topic)."""

    topic: str
    key: str | None = None
    lossless: bool = False
    queue: int = ZENOH_QUEUE
    encoding: str = "ezflow"


@dataclass(frozen=True)
class Import:
    """Publish the samples of Zenoh *key* (wildcards allowed) on ezflow *topic*. With a
    wildcard, *topic* is a prefix: the part of the sample's key after the key's literal
    prefix is unescaped and appended (``fleet/*/camera`` → ``/robots`` gives
    ``/robots/robot1/camera`` for ``fleet/robot1/camera``)."""

    key: str
    topic: str
    lossless: bool = False
    queue: int = ZENOH_QUEUE
    encoding: str = "ezflow"


@dataclass
class MappingStats:
    """Counters of one mapping."""

    messages: int = 0  #: exported, or imported and published
    bytes: int = 0
    dropped_local: int = 0  #: dropped by this end's queue (leaky)
    lost_remote: int = 0  #: gaps in the importer's sequence: lost between hosts
    dropped_remote: int = 0  #: drops the exporter reported (its leaky queue)
    latency_ns: collections.deque[int] = field(
        default_factory=lambda: collections.deque(maxlen=1024)
    )

    def latency_p50_us(self) -> float | None:
        """Median publish → import latency of the latest samples (cross-host clocks)."""
        if not self.latency_ns:
            return None
        ordered = sorted(self.latency_ns)
        return ordered[len(ordered) // 2] / 1e3


def _check_queue(queue: int, what: str) -> None:
    if queue < 1:
        raise ConfigurationError(f"{what}: queue={queue} must be >= 1")


class ZenohBridge:
    """Exports and imports topics of the graph *context* is on, through a Zenoh session
    opened from *zenoh* settings: ``async with ZenohBridge(ctx, settings, exports=[...],
    imports=[...]) as bridge``. With *fleet*, it also announces the graph in that fleet
    domain (``ezflow graph --fleet``; see :mod:`._fleet`). Leaving it stops every mapping
    and closes the session (cancellation-safe). :attr:`stats` has each mapping's
    counters. A mapping whose ezflow topic ends stops; a failure in one mapping is logged
    and stops that mapping only."""

    def __init__(
        self,
        context: GraphContext,
        zenoh_settings: ZenohSettings,
        *,
        exports: list[Export] | tuple[Export, ...] = (),
        imports: list[Import] | tuple[Import, ...] = (),
        host: str | None = None,
        fleet: str | None = None,
    ) -> None:
        self._context = context
        self.fleet = fleet
        if fleet is not None:
            fleet_key(fleet)  # checks the domain now
        self._settings = zenoh_settings
        self.host = host or socket.gethostname()
        for mapping in (*exports, *imports):
            _check_queue(mapping.queue, repr(mapping))
        self.exports = tuple(exports)
        self.imports = tuple(imports)
        self.stats: dict[str, MappingStats] = {}
        self._codec = Codec()
        self._tasks: list[asyncio.Task[None]] = []
        self._closers: list[Callable[[], None]] = []
        self._session: Any = None
        self._session_cm: Any = None
        self._announcer: Any = None

    def summary(self) -> dict[str, dict[str, Any]]:
        """:attr:`stats` as plain data, by mapping (latency: the median of the latest
        samples, in microseconds)."""
        return {
            name: {
                "messages": stats.messages,
                "bytes": stats.bytes,
                "dropped_local": stats.dropped_local,
                "lost_remote": stats.lost_remote,
                "dropped_remote": stats.dropped_remote,
                "latency_p50_us": stats.latency_p50_us(),
            }
            for name, stats in self.stats.items()
        }

    def export_key(self, export: Export) -> str:
        """The key expression *export* publishes on."""
        if export.key is None:
            return topic_to_key(export.topic, expand_host("ezflow/{host}", self.host))
        return expand_host(export.key, self.host)

    async def __aenter__(self) -> ZenohBridge:
        self._session_cm = open_session(self._settings)
        self._session = await self._session_cm.__aenter__()
        try:
            if self.fleet is not None:
                self._announcer = announce(
                    self._session, self.fleet, self.host, self._context, self.summary
                )
                await self._announcer.__aenter__()
            for export in self.exports:
                await self._start_export(export)
            for mapping in self.imports:
                self._start_import(mapping)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every mapping and close the session. Idempotent."""
        pending, self._tasks = self._tasks, []
        for mapping_task in pending:
            mapping_task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        announcer, self._announcer = self._announcer, None
        if announcer is not None:
            await announcer.__aexit__(None, None, None)
        closers, self._closers = self._closers, []
        for close in closers:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(close)
        cm, self._session_cm = self._session_cm, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    # -- export --------------------------------------------------------------------------

    async def _start_export(self, export: Export) -> None:
        key = self.export_key(export)
        publisher = self._session.declare_publisher(
            key,
            encoding=zenoh.Encoding(ENCODING),
            congestion_control=(
                zenoh.CongestionControl.BLOCK if export.lossless else zenoh.CongestionControl.DROP
            ),
            reliability=zenoh.Reliability.RELIABLE,
        )
        self._closers.append(publisher.undeclare)
        subscriber = (
            await self._context.subscriber(export.topic)  # bounded by the publisher's window
            if export.lossless
            else await self._context.subscriber(export.topic, leaky=True, queue=export.queue)
        )
        stats = self.stats[f"export {export.topic} -> {key}"] = MappingStats()
        self._tasks.append(
            asyncio.ensure_future(self._export(export, subscriber, publisher, stats))
        )
        log.info("exporting %s as %s (%s)", export.topic, key, _kind(export.lossless))

    async def _export(
        self, export: Export, subscriber: Any, publisher: Any, stats: MappingStats
    ) -> None:
        seq = 0
        ended = False
        try:
            while not ended:
                # One message (waiting), then whatever else is queued, up to a batch:
                # one trip to the worker thread per batch, not per message.
                batch = []
                try:
                    batch.append(await subscriber.recv())
                    while len(batch) < ZENOH_EXPORT_BATCH:
                        batch.append(subscriber.recv_nowait())
                except asyncio.QueueEmpty:
                    pass
                except (EndOfStream, ClosedResourceError):
                    ended = True
                puts = []
                for message in batch:
                    body = b"".join(bytes(part) for part in self._codec.encode(message).parts)
                    drops = subscriber.stats.dropped
                    meta = {"v": 1, "seq": seq, "t": time.time_ns(), "drops": drops}
                    puts.append((body, msgpack.packb(meta)))
                    seq += 1
                if export.lossless:  # BLOCK: put may wait for the link
                    await asyncio.to_thread(_put_all, publisher, puts)
                else:
                    _put_all(publisher, puts)
                stats.messages += len(puts)
                stats.bytes += sum(len(body) for body, _ in puts)
                stats.dropped_local = subscriber.stats.dropped
            log.info("export of %s: the topic ended", export.topic)
            await self._send_end(publisher, seq, stats.dropped_local)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("export of %s failed; it stops (the other mappings go on)", export.topic)
        finally:
            with contextlib.suppress(Exception):
                await subscriber.aclose()

    async def _send_end(self, publisher: Any, seq: int, drops: int) -> None:
        # The end marker: an empty payload whose attachment says where the sequence
        # ended, sent reliably (BLOCK) even on a leaky mapping, so the importer counts
        # the samples Zenoh dropped at the tail and ends its topic too.
        attachment = msgpack.packb(
            {"v": 1, "seq": seq, "t": time.time_ns(), "drops": drops, "end": True}
        )
        key = str(publisher.key_expr)
        await asyncio.to_thread(
            self._session.put,
            key,
            b"",
            attachment=attachment,
            congestion_control=zenoh.CongestionControl.BLOCK,
            encoding=zenoh.Encoding(ENCODING),
        )

    # -- import --------------------------------------------------------------------------

    def _start_import(self, mapping: Import) -> None:
        loop = asyncio.get_running_loop()
        key = expand_host(mapping.key, self.host)
        literal = key.split("*")[0].rsplit("/", 1)[0] if "*" in key else None
        pending: collections.deque[Any] = collections.deque()
        wake = asyncio.Event()
        stats = self.stats[f"import {key} -> {mapping.topic}"] = MappingStats()
        slots = threading.Semaphore(mapping.queue) if mapping.lossless else None
        closed = threading.Event()
        skipped: dict[str, int] = {}  # per key: samples the leaky queue dropped

        def push(item: tuple[str, bytes, bytes | None]) -> None:  # on the loop
            # Leaky: keep the newest; an end marker (empty body) is never dropped. What
            # is dropped here is counted here, not again as a gap in the sequence.
            if slots is None and item[1] and len(pending) >= mapping.queue:
                dropped = pending.popleft()
                stats.dropped_local += 1
                skipped[dropped[0]] = skipped.get(dropped[0], 0) + 1
            pending.append(item)
            wake.set()

        def on_sample(sample: Any) -> None:  # on a Zenoh thread: never blocks the loop
            attachment = sample.attachment
            item = (
                str(sample.key_expr),
                sample.payload.to_bytes(),
                None if attachment is None else attachment.to_bytes(),
            )
            if slots is not None:
                # Lossless: wait here for room, so that Zenoh's reliable link waits too.
                while not slots.acquire(timeout=0.2):
                    if closed.is_set():
                        return
            with contextlib.suppress(RuntimeError):  # the loop closed: we are stopping
                loop.call_soon_threadsafe(push, item)

        subscriber = self._session.declare_subscriber(key, on_sample)

        def close() -> None:
            closed.set()
            subscriber.undeclare()

        self._closers.append(close)
        task = asyncio.ensure_future(
            self._import(
                mapping,
                literal=literal,
                pending=pending,
                wake=wake,
                slots=slots,
                stats=stats,
                skipped=skipped,
            )
        )
        self._tasks.append(task)
        log.info("importing %s as %s (%s)", key, mapping.topic, _kind(mapping.lossless))

    def _topic_of(self, mapping: Import, literal: str | None, key: str) -> str:
        if literal is None:
            return mapping.topic
        return imported_topic(mapping.topic, key, literal)

    async def _import(
        self,
        mapping: Import,
        *,
        literal: str | None,
        pending: collections.deque[Any],
        wake: asyncio.Event,
        slots: threading.Semaphore | None,
        stats: MappingStats,
        skipped: dict[str, int],
    ) -> None:
        publishers: dict[str, Any] = {}
        expected: dict[str, int] = {}
        try:
            while True:
                while not pending:
                    wake.clear()
                    await wake.wait()
                key, body, attachment = pending.popleft()
                meta = msgpack.unpackb(attachment) if attachment is not None else {}
                if meta.get("end"):
                    _count_gap(key, meta, expected, stats, skipped)
                    if slots is not None:
                        slots.release()
                    publisher = publishers.pop(self._topic_of(mapping, literal, key), None)
                    if publisher is not None:  # the end crosses over: subscribers see it
                        await publisher.aclose()
                    expected.pop(key, None)
                    continue
                try:
                    message = self._codec.decode(body)
                    topic = self._topic_of(mapping, literal, key)
                except Exception as exc:
                    log.warning(
                        "import of %s: a sample on %s was refused: %s", mapping.key, key, exc
                    )
                    if slots is not None:
                        slots.release()
                    continue
                if meta:
                    _count_gap(key, meta, expected, stats, skipped)
                    stats.latency_ns.append(time.time_ns() - int(meta.get("t", 0)))
                publisher = publishers.get(topic)
                if publisher is None:
                    publisher = publishers[topic] = await self._context.publisher(topic)
                try:
                    await publisher.publish(message)
                finally:
                    if slots is not None:
                        slots.release()
                stats.messages += 1
                stats.bytes += len(body)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("import of %s failed; it stops (the other mappings go on)", mapping.key)
        finally:
            for publisher in publishers.values():
                with contextlib.suppress(Exception):
                    await publisher.aclose()


def _count_gap(
    key: str,
    meta: dict[str, Any],
    expected: dict[str, int],
    stats: MappingStats,
    skipped: dict[str, int],
) -> None:
    """Count a gap in *key*'s sequence, less what our own queue dropped (*skipped*), as
    samples lost between the hosts (the first sample seen of a key sets where counting
    starts)."""
    seq = int(meta.get("seq", -1))
    gap = seq - expected.get(key, seq) - skipped.pop(key, 0)
    if gap > 0:
        stats.lost_remote += gap
        log.warning("import of %s: %d messages lost between hosts", key, gap)
    expected[key] = seq + 1
    stats.dropped_remote = int(meta.get("drops", 0))


def _put_all(publisher: Any, puts: list[tuple[bytes, bytes]]) -> None:
    for body, attachment in puts:
        publisher.put(body, attachment=attachment)


def _kind(lossless: bool) -> str:
    return "lossless" if lossless else "leaky"


# -- as a unit of a graph -------------------------------------------------------------------


class ZenohBridgeSettings(Settings):
    """A :class:`ZenohBridgeUnit`'s settings: the session's (``mode``, ``connect``,
    ``listen``, ``config_file``, as :class:`ZenohSettings`), the mappings, and the fleet
    domain and host name (as :class:`ZenohBridge`)."""

    mode: Literal["peer", "client"] = "client"
    connect: tuple[str, ...] = ()
    listen: tuple[str, ...] = ()
    config_file: str | None = None
    exports: tuple[Export, ...] = ()
    imports: tuple[Import, ...] = ()
    fleet: str | None = None
    host: str | None = None

    def __post_init__(self) -> None:
        self.zenoh_settings()  # checks the endpoints and mode now, where they are written
        mappings: list[Export | Import] = [*self.exports, *self.imports]
        for mapping in mappings:
            _check_queue(mapping.queue, repr(mapping))

    def zenoh_settings(self) -> ZenohSettings:
        return ZenohSettings(
            mode=self.mode,
            connect=tuple(self.connect),
            listen=tuple(self.listen),
            config_file=self.config_file,
        )


class ZenohBridgeUnit(Unit):
    """A :class:`ZenohBridge` as a unit of a graph: put it in ``ezflow.run(...)`` (in a
    process of its own if you like) and it bridges its settings' mappings on the graph the
    unit runs on, until the graph stops. It has no streams: the topics it exports and
    imports are named in its settings. It never finishes by itself, so a graph run with
    ``end_when_done`` waits for it: end such graphs with ``NormalTermination``."""

    SETTINGS: ZenohBridgeSettings

    @task
    async def bridge(self) -> None:
        settings: ZenohBridgeSettings = self.SETTINGS
        async with ZenohBridge(
            graph_context_of(self),
            settings.zenoh_settings(),
            exports=settings.exports,
            imports=settings.imports,
            fleet=settings.fleet,
            host=settings.host,
        ) as bridge:
            self.bridge_stats = bridge.stats  # inspectable while the graph runs
            await asyncio.Event().wait()  # until the graph stops and cancels this task
