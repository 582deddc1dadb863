"""The Zenoh bridge: ezflow topics exported to Zenoh key expressions and key expressions
imported into ezflow topics, against a running graph (a :class:`~ezflow.GraphContext`).

What a sample carries is docs/wire-format.md (and :mod:`._wire`); how each side moves
data is :mod:`._export` and :mod:`._import`. Here: the mappings' settings, the bridge
that runs them - each under a supervisor that restarts it with a backoff when it fails
(a bad sample is only refused and counted, it never fails a mapping) - and its stop:
:meth:`ZenohBridge.drain` delivers what was received within ``drain_timeout`` and counts
what it cuts (``lost_in_flight``).

Flow control, per mapping:

* **leaky** (default): the exporter's ezflow subscriber keeps the newest *queue*
  messages, Zenoh drops when its link is busy (``CongestionControl.DROP``), and the
  importer keeps the newest *queue* samples (``ZENOH_QUEUE`` unless the mapping names
  one); every drop is counted.
* **lossless**: the exporter's subscriber is lossless, its Zenoh publisher is
  ``RELIABLE`` with ``CongestionControl.BLOCK`` (``put`` waits, in the export's thread,
  while the link is busy), and the importer acknowledges room for *queue* messages
  (its window: ``ZENOH_LOSSLESS_QUEUE``, 2048, unless the mapping names one) and holds
  at most that many samples and ``ZENOH_QUEUE_BYTES``: when they are all taken, Zenoh's
  delivery thread waits for room (bounded: ``ZENOH_IMPORT_STALL``), so Zenoh's reliable
  link, then the exporter's put, then its ezflow subscriber and the publishing unit
  wait too. Nothing is dropped while the Zenoh path stays up. Limits: samples in flight
  when a router or link goes down are lost (the importer counts the gap and logs it);
  the exporter keeps no window to resend them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from typing import Any, Literal

from .._core._codec import Codec
from .._core._config import (
    SHUTDOWN_TIMEOUT,
    check_drain_timeout,
    drain_timeout_from_env,
)
from .._core._exceptions import ConfigurationError
from .._graph._context import GraphContext
from .._units._component import Unit
from .._units._decorators import task
from .._units._host import graph_context_of
from .._units._settings import Settings
from ._export import ExportRun
from ._fleet import announce, fleet_key
from ._import import ImportRun
from ._keys import expand_host, topic_to_key
from ._mapping import MappingStats, queue_of, supervise
from ._session import ZenohSettings, open_session
from ._wire import ENCODING

__all__ = [
    "ENCODING",
    "ENCODINGS",
    "Export",
    "Import",
    "MappingStats",
    "ZenohBridge",
    "ZenohBridgeSettings",
    "ZenohBridgeUnit",
]

log = logging.getLogger("ezflow.zenoh")

#: What a mapping's samples hold (``Export.encoding``, ``Import.encoding``): ``"ezflow"``,
#: ezflow codec bodies (any message); ``"raw"``, the bytes of a bytes-like message;
#: ``"json"``, a JSON text (UTF-8).
ENCODINGS = ("ezflow", "raw", "json")


def _check_encoding(mapping: Export | Import) -> None:
    if mapping.encoding not in ENCODINGS:
        raise ConfigurationError(
            f"{mapping!r}: encoding={mapping.encoding!r} is not one of "
            f"{', '.join(repr(e) for e in ENCODINGS)}"
        )


@dataclass(frozen=True)
class Export:
    """Publish ezflow *topic* on Zenoh *key* (``{host}`` is replaced by the bridge's host
    name; default: ``ezflow/{host}/`` and the escaped topic). *lossless*: wait for the
    importers' room (acknowledgements) instead of dropping; *queue*: messages a leaky
    export keeps (the newest; None: ``ZENOH_QUEUE``). *encoding* (one of
    :data:`ENCODINGS`): what a sample holds; ConfigurationError for another value."""

    topic: str
    key: str | None = None
    lossless: bool = False
    queue: int | None = None
    encoding: str = "ezflow"

    def __post_init__(self) -> None:
        _check_encoding(self)


@dataclass(frozen=True)
class Import:
    """Publish the samples of Zenoh *key* (wildcards allowed) on ezflow *topic*. With a
    wildcard, *topic* is a prefix: the part of the sample's key after the key's literal
    prefix is unescaped and appended (``fleet/*/camera`` → ``/robots`` gives
    ``/robots/robot1/camera`` for ``fleet/robot1/camera``). *queue*: samples it holds
    (a batch is one; and at most ``ZENOH_QUEUE_BYTES``): a leaky import keeps the newest
    (None: ``ZENOH_QUEUE``), a lossless one acknowledges room for *queue* messages (its
    window; None: ``ZENOH_LOSSLESS_QUEUE``). *encoding* (one of
    :data:`ENCODINGS`): what a sample holds; ConfigurationError for another value."""

    key: str
    topic: str
    lossless: bool = False
    queue: int | None = None
    encoding: str = "ezflow"

    def __post_init__(self) -> None:
        _check_encoding(self)


def _check_queue(queue: int | None, what: str) -> None:
    if queue is not None and queue < 1:
        raise ConfigurationError(f"{what}: queue={queue} must be >= 1")


_Run = ExportRun | ImportRun


class ZenohBridge:
    """Exports and imports topics of the graph *context* is on, through a Zenoh session
    opened from *zenoh* settings: ``async with ZenohBridge(ctx, settings, exports=[...],
    imports=[...]) as bridge``. With *fleet*, it also announces the graph in that fleet
    domain (``ezflow graph --fleet``; see :mod:`._fleet`).

    :attr:`stats` has each mapping's counters and state. A bad sample is refused and
    counted (``refused``, by cause), never more; a mapping that fails otherwise restarts
    with a backoff (state ``restarting``) and the others go on; an export whose topic
    ends stays armed for the topic's next publisher. Leaving the ``async with`` normally
    (or :meth:`aclose`) first drains (:meth:`drain`, within *drain_timeout* seconds:
    default ``EZFLOW_DRAIN_TIMEOUT`` or 5 s); leaving it on an error or cancellation
    stops at once. Cancellation-safe."""

    def __init__(
        self,
        context: GraphContext,
        zenoh_settings: ZenohSettings,
        *,
        exports: list[Export] | tuple[Export, ...] = (),
        imports: list[Import] | tuple[Import, ...] = (),
        host: str | None = None,
        fleet: str | None = None,
        drain_timeout: float | None = None,
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
        self.drain_timeout = (
            drain_timeout_from_env()
            if drain_timeout is None
            else check_drain_timeout(drain_timeout)
        )
        self.stats: dict[str, MappingStats] = {}
        self._codec = Codec()
        self._runs: list[_Run] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._session: Any = None
        self._session_cm: Any = None
        self._announcer: Any = None
        self._drained = False

    def summary(self) -> dict[str, dict[str, Any]]:
        """:attr:`stats` as plain data, by mapping: its state (and why), counters,
        refusals by cause, and the latency (the median of the latest samples, in
        microseconds)."""
        for run in self._runs:
            if isinstance(run, ImportRun):
                run.sync()
            run.update_state()
        return {name: stats.to_wire() for name, stats in self.stats.items()}

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
                key = self.export_key(export)
                name = f"export {export.topic} -> {key}"
                stats = self.stats[name] = MappingStats()
                run: _Run = ExportRun(
                    export,
                    key,
                    session=self._session,
                    context=self._context,
                    codec=self._codec,
                    stats=stats,
                    name=name,
                )
                self._runs.append(run)
                await run.open()
                log.info("exporting %s as %s (%s)", export.topic, key, _kind(export))
            for mapping in self.imports:
                key = expand_host(mapping.key, self.host)
                name = f"import {key} -> {mapping.topic}"
                stats = self.stats[name] = MappingStats()
                run = ImportRun(
                    mapping,
                    key,
                    session=self._session,
                    context=self._context,
                    codec=self._codec,
                    stats=stats,
                    name=name,
                )
                self._runs.append(run)
                await run.open()
                log.info("importing %s as %s (%s)", key, mapping.topic, _kind(mapping))
            for run in self._runs:
                self._tasks.append(
                    asyncio.ensure_future(
                        supervise(run.name, run.stats, run.run, run.progress, run.recover)
                    )
                )
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            await self.aclose()
        else:
            await self._close()

    async def aclose(self) -> None:
        """Drain (:meth:`drain`), then stop every mapping and close the session.
        Idempotent."""
        try:
            await self.drain()
        finally:
            await self._close()

    async def drain(self) -> None:
        """Stop taking data in and deliver what was taken, within :attr:`drain_timeout`:
        exports put what their subscribers queued and send their end markers; imports stop
        receiving, publish what they queued and wait for the graph to take it. What the
        timeout cuts is counted in ``lost_in_flight`` (one warning line). Once."""
        if self._drained or not self._runs:
            return
        self._drained = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        undeclares = [
            asyncio.ensure_future(asyncio.to_thread(run.stop_receiving))
            for run in self._runs
            if isinstance(run, ImportRun)
        ]
        for run in self._runs:
            if isinstance(run, ExportRun):
                await run.start_drain()
        try:
            # Until Zenoh ran every import's last callback, and every mapping
            # handed on what it holds.
            while loop.time() < deadline and (  # noqa: ASYNC110 - threads' and peers' counters
                not all(undeclare.done() for undeclare in undeclares)
                or any(
                    run.busy or (isinstance(run, ExportRun) and run.queued) for run in self._runs
                )
            ):
                await asyncio.sleep(0.01)
            await self._cancel_tasks()
            await asyncio.gather(*(run.finish(deadline) for run in self._runs))
        finally:
            for run in self._runs:
                if isinstance(run, ImportRun):
                    run.close_queue()
            await asyncio.gather(*undeclares, return_exceptions=True)
            for run in self._runs:
                if isinstance(run, ImportRun):
                    run.count_cut()  # (what reached the import after the cut)
        cut = {name: s.lost_in_flight for name, s in self.stats.items() if s.lost_in_flight}
        if cut:
            log.warning(
                "the bridge stopped with messages in flight (drain_timeout %g s): %s",
                self.drain_timeout,
                ", ".join(f"{name}: {n}" for name, n in cut.items()),
            )

    async def _cancel_tasks(self) -> None:
        pending, self._tasks = self._tasks, []
        for mapping_task in pending:
            mapping_task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _close(self) -> None:
        """Stop every mapping and close the session, without draining. Idempotent."""
        await self._cancel_tasks()
        runs, self._runs = self._runs, []
        for run in runs:
            with contextlib.suppress(Exception):
                await run.close()
        announcer, self._announcer = self._announcer, None
        if announcer is not None:
            await announcer.__aexit__(None, None, None)
        cm, self._session_cm = self._session_cm, None
        if cm is not None:
            await cm.__aexit__(None, None, None)
        for run in runs:
            if isinstance(run, ExportRun):
                await run.join()


def _kind(mapping: Export | Import) -> str:
    kind = "lossless" if mapping.lossless else f"leaky, queue {queue_of(False, mapping.queue)}"
    return kind if mapping.encoding == "ezflow" else f"{kind}, {mapping.encoding}"


# -- as a unit of a graph -------------------------------------------------------------------


class ZenohBridgeSettings(Settings):
    """A :class:`ZenohBridgeUnit`'s settings: the session's (``mode``, ``connect``,
    ``listen``, ``config_file``, as :class:`ZenohSettings`), the mappings, and the fleet
    domain and host name (as :class:`ZenohBridge`), and the drain timeout (seconds; None:
    ``EZFLOW_DRAIN_TIMEOUT`` or 5 s, and at most ``SHUTDOWN_TIMEOUT`` - 1 s, so that
    the unit's ``shutdown()`` waits for the drain within its own bound)."""

    mode: Literal["peer", "client"] = "client"
    connect: tuple[str, ...] = ()
    listen: tuple[str, ...] = ()
    config_file: str | None = None
    exports: tuple[Export, ...] = ()
    imports: tuple[Import, ...] = ()
    fleet: str | None = None
    host: str | None = None
    drain_timeout: float | None = None

    def __post_init__(self) -> None:
        self.zenoh_settings()  # checks the endpoints and mode now, where they are written
        if self.drain_timeout is not None:
            check_drain_timeout(self.drain_timeout)
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
    process of its own, or in the process of the units it bridges: their edges to it are
    then local, docs/fleets.md) and it bridges its settings' mappings on the graph the
    unit runs on, until the graph stops. It has no streams: the topics it exports and
    imports are named in its settings. It never finishes by itself, so a graph run with
    ``end_when_done`` waits for it: end such graphs with ``NormalTermination``.

    When the graph stops, the bridge drains (:meth:`ZenohBridge.drain`) while the graph
    drains its own inputs: exports put what they queued, imports publish what they
    received; ``shutdown()`` waits for it (the settings' ``drain_timeout``) and what it
    cuts is counted in ``lost_in_flight``."""

    SETTINGS: ZenohBridgeSettings

    @task
    async def bridge(self) -> None:
        settings: ZenohBridgeSettings = self.SETTINGS
        drain_timeout = settings.drain_timeout
        if drain_timeout is None:
            drain_timeout = min(drain_timeout_from_env(), max(0.0, SHUTDOWN_TIMEOUT - 1.0))
        bridge = ZenohBridge(
            graph_context_of(self),
            settings.zenoh_settings(),
            exports=settings.exports,
            imports=settings.imports,
            fleet=settings.fleet,
            host=settings.host,
            drain_timeout=drain_timeout,
        )
        await bridge.__aenter__()
        self.bridge_stats = bridge.stats  # inspectable while the graph runs
        try:
            await asyncio.Event().wait()  # until the graph stops and cancels this task
        except asyncio.CancelledError:
            # The graph stops: drain while it drains its inputs; shutdown() waits.
            self._ezflow_bridge_closing: asyncio.Future[None] | None = asyncio.ensure_future(
                bridge.aclose()
            )
            raise
        except BaseException:
            await bridge.__aexit__(Exception, None, None)  # (stops at once)
            raise

    async def shutdown(self) -> None:
        """Wait for the bridge's drain and close (bounded by its drain timeout)."""
        closing: asyncio.Future[None] | None = getattr(self, "_ezflow_bridge_closing", None)
        if closing is not None:
            self._ezflow_bridge_closing = None
            await closing
