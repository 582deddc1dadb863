"""Trace hops as OpenTelemetry spans, channel telemetry as OpenTelemetry metrics.

Spans (:func:`spans_from_hops`): one ``CONSUMER`` span per finished hop, named
``"{topic} -> {process}"``, with the hop's own ids - trace id = ``trace_id`` (a 64-bit
id in OpenTelemetry's 128-bit field), span id = ``span_id``, parent = ``parent_id``
(the hop whose handler published the message; none for a first hop) - so the spans of
one message form the same tree in a tracing backend as in ``ezflow trace``. It runs
from ``t_publish`` to ``t_done`` (from ``t_received`` when the publisher ran on another
host: the publish and transport stages are then on a clock we cannot place) and has one
``INTERNAL`` child span per known stage, whose id is derived from the hop's span id and
the stage name (:func:`stage_span_id`): exporting a hop twice gives the same ids.
Times become wall-clock times with the ``wall_offset`` the reporting process sent with
the hop (its ``time_ns() - monotonic_ns()``), so they are as right as that process's
wall clock; a hop and its stages keep their exact monotonic durations.

Metrics (:class:`OtelExporter` with a meter provider): observable instruments read
from the latest ``graph_telemetry()`` the exporter fetched, when the meter provider
collects. Per channel (one publisher as received by one process over one transport;
attributes ``topic``, ``publisher_id``, ``transport``, ``process``, ``pid``):
``ezflow.channel.messages``, ``ezflow.channel.bytes`` and ``ezflow.channel.drops``
(overflow + upstream), cumulative counters, and ``ezflow.channel.latency.p50``
(publish -> deliver over the channel's life, seconds), a gauge. Per publisher
(``topic``, ``publisher_id``, ``process``, ``pid``): ``ezflow.publisher.messages``.
``pid`` tells apart processes of the same name (a restarted one is a new series).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Final

from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from .. import __version__
from .._core._config import (
    OTEL_DEFAULT_ENDPOINT,
    OTEL_POLL_INTERVAL,
    OTEL_REMEMBER,
    TRACE_SERVER_KEEP,
)
from .._core._exceptions import ClosedResourceError, ConfigurationError, EzflowError
from .._core._telemetry import ChannelSnapshot, ProcessSnapshot
from .._core._tracing import STAGE_BOUNDS
from .._graph._context import GraphContext
from .._graph._traces import hop_label, stages_of

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_INTERVAL",
    "DEFAULT_REMEMBER",
    "OtelExporter",
    "otlp_http_exporters",
    "spans_from_hops",
    "stage_span_id",
]

log = logging.getLogger("ezflow.otel")

#: Where an OpenTelemetry collector listens for OTLP over HTTP by default, seconds
#: between two polls, span ids remembered (the limits live in _core/_config.py).
DEFAULT_ENDPOINT: Final = OTEL_DEFAULT_ENDPOINT
DEFAULT_INTERVAL: Final = OTEL_POLL_INTERVAL
DEFAULT_REMEMBER: Final = OTEL_REMEMBER
#: A poll that keeps failing is logged at most once per this many seconds.
FAILURE_LOG_INTERVAL: Final = 60.0

_SCOPE: Final = InstrumentationScope("ezflow", __version__)
_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
Hop = Mapping[str, Any]


def stage_span_id(span_id: int, stage: str) -> int:
    """The span id of *stage*'s child span of the hop span *span_id*: the first 8 bytes
    of a BLAKE2b hash of both, never 0 (an invalid span id)."""
    digest = hashlib.blake2b(span_id.to_bytes(8, "little") + stage.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def _process_resource(process: str, pid: int, cache: dict[tuple[str, int], Resource]) -> Resource:
    # Each reporting process is its own service, so a tracing backend shows which
    # process took each hop. Built directly (not Resource.create): the resource is the
    # ezflow process's, not this exporter's (OTEL_SERVICE_NAME and the SDK's detectors
    # describe the exporting process).
    resource = cache.get((process, pid))
    if resource is None:
        resource = cache[process, pid] = Resource({"service.name": process, "process.pid": pid})
    return resource


def spans_from_hops(hops: Iterable[Hop], resource: Resource | None = None) -> list[ReadableSpan]:
    """One span per finished hop of *hops* (dicts as ``GraphContext.graph_traces()``
    returns them: the hop fields plus ``process`` and ``wall_offset``) followed by one
    child span per stage of it whose time is known (see the module docstring); hops
    still being handled (``t_done == 0``) are left out.

    *resource* is every span's resource; by default each span gets its process's:
    ``service.name`` = the process name (``pid N`` for a hop without one),
    ``process.pid``. Raises ``KeyError`` for a hop without a hop field or
    ``wall_offset``.
    """
    spans: list[ReadableSpan] = []
    resources: dict[tuple[str, int], Resource] = {}
    for hop in hops:
        if not hop["t_done"]:
            continue
        trace_id, span_id, parent_id = hop["trace_id"], hop["span_id"], hop["parent_id"]
        offset = hop["wall_offset"]
        stages = stages_of(hop)
        process = str(hop.get("process") or f"pid {hop['pid']}")
        context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=_SAMPLED)
        span_resource = (
            resource if resource is not None else _process_resource(process, hop["pid"], resources)
        )
        attributes: dict[str, Any] = {
            "messaging.system": "ezflow",
            "messaging.destination.name": hop["topic"],
            "ezflow.topic": hop["topic"],
            "ezflow.publisher_id": hop["publisher_id"],
            "ezflow.subscriber": hop["subscriber"],
            "ezflow.transport": hop["transport"],
            "ezflow.process": process,
            "ezflow.pid": hop["pid"],
        }
        attributes.update({f"ezflow.stage.{n}": v for n, v in stages.items() if v is not None})
        start = hop["t_publish"] if hop["same_clock"] else hop["t_received"]
        spans.append(
            ReadableSpan(
                name=hop_label(hop),
                context=context,
                parent=(
                    SpanContext(trace_id, parent_id, is_remote=True, trace_flags=_SAMPLED)
                    if parent_id
                    else None
                ),
                resource=span_resource,
                attributes=attributes,
                kind=SpanKind.CONSUMER,
                start_time=start + offset,
                end_time=hop["t_done"] + offset,
                instrumentation_scope=_SCOPE,
            )
        )
        for name, duration in stages.items():
            if duration is None:
                continue
            first, last = STAGE_BOUNDS[name]
            spans.append(
                ReadableSpan(
                    name=name,
                    context=SpanContext(
                        trace_id,
                        stage_span_id(span_id, name),
                        is_remote=False,
                        trace_flags=_SAMPLED,
                    ),
                    parent=context,
                    resource=span_resource,
                    attributes={"ezflow.stage": name},
                    kind=SpanKind.INTERNAL,
                    start_time=hop[first] + offset,
                    end_time=hop[last] + offset,
                    instrumentation_scope=_SCOPE,
                )
            )
    return spans


class _FailureLog:
    """Logs the failures of a repeating job without flooding: the first of a streak at
    once, then at most one line per ``FAILURE_LOG_INTERVAL`` seconds with the count of
    those not logged; the first success after a streak is logged once."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._failing = 0  #: failures in the current streak
        self._unlogged = 0
        self._next_log = 0.0

    def failed(self, reason: str, exc: BaseException | None = None) -> None:
        """One more failure, for *reason*; *exc* gets its traceback logged."""
        self._failing += 1
        now = time.monotonic()
        if now < self._next_log:
            self._unlogged += 1
            return
        self._next_log = now + FAILURE_LOG_INTERVAL
        more = f" (and {self._unlogged} more since the last line)" if self._unlogged else ""
        self._unlogged = 0
        log.warning(
            "%s failed: %s%s (further failures are logged at most every %.0f s)",
            self._what,
            reason,
            more,
            FAILURE_LOG_INTERVAL,
            exc_info=exc,
        )

    def succeeded(self) -> None:
        if self._failing:
            log.warning("%s works again after %d failed polls", self._what, self._failing)
        self._failing = self._unlogged = 0
        self._next_log = 0.0


_ChannelValue = Callable[[ChannelSnapshot], int | float | None]


class OtelExporter:
    """Exports what a running graph records to OpenTelemetry: trace hops as spans to
    *span_exporter*, channel and publisher telemetry as metrics of *meter_provider*
    (either may be None: nothing of that kind).

    Each poll (:meth:`export_once`; :meth:`run` polls every *interval* seconds) reads
    the hops the graph server keeps through *context* and exports, as
    :func:`spans_from_hops` builds them, those it has not exported before; it remembers
    the span ids of the last *remember* hops exported (at least ``TRACE_SERVER_KEEP``,
    what one poll can return). It also fetches the graph's telemetry, which the
    instruments registered on *meter_provider* report when it collects (see the module
    docstring).

    Spans are built and exported on a thread of this exporter (one: *span_exporter* is
    never called concurrently), not on the event loop. A hop counts as exported once
    handed over: a failed export is logged and not retried (like the SDK's batch
    processor; the OTLP exporters retry transient failures themselves), and a cancelled
    poll may drop the hops it had taken. *span_exporter* and *meter_provider* stay the
    caller's to shut down.

    As an async context manager it runs :meth:`run` in a task until the block ends::

        async with OtelExporter(ctx, OTLPSpanExporter(), meter_provider):
            await ...
    """

    def __init__(
        self,
        context: GraphContext,
        span_exporter: SpanExporter | None,
        meter_provider: MeterProvider | None = None,
        *,
        interval: float = DEFAULT_INTERVAL,
        resource: Resource | None = None,
        remember: int = DEFAULT_REMEMBER,
    ) -> None:
        if (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not (interval > 0 and math.isfinite(interval))
        ):
            raise ConfigurationError(f"interval={interval!r} must be a number of seconds > 0")
        if isinstance(remember, bool) or not isinstance(remember, int) or remember < 0:
            raise ConfigurationError(f"remember={remember!r} must be a whole number")
        if remember < TRACE_SERVER_KEEP:
            raise ConfigurationError(
                f"remember={remember} is below the {TRACE_SERVER_KEEP} hops the graph server "
                "keeps (TRACE_SERVER_KEEP): hops would be exported twice; use at least that"
            )
        self.context = context
        self.interval = float(interval)
        self._span_exporter = span_exporter
        self._resource = resource
        self._exported_ids: set[int] = set()
        self._exported_order: deque[int] = deque()
        self._remember = remember
        #: hops handed to the span exporter so far, and exports it reported failed
        self.exported = 0
        self.failed_exports = 0
        #: the latest telemetry fetched (read by the metric callbacks on the meter
        #: provider's thread: replaced whole, never changed in place)
        self._processes: Mapping[str, ProcessSnapshot] = {}
        self._metrics = meter_provider is not None
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._failures = _FailureLog("ezflow otel: a poll of the graph server")
        self._export_failures = _FailureLog("ezflow otel: exporting spans")
        if meter_provider is not None:
            self._register_instruments(meter_provider)

    # -- polling -----------------------------------------------------------------------

    async def export_once(self) -> int:
        """One poll: export the hops not exported before and fetch the telemetry the
        metrics report. Returns the hops exported. Raises what the graph requests raise
        (:class:`~ezflow.ClosedResourceError` once the context is closed,
        :class:`~ezflow.BrokenResourceError` when the server is unreachable) and what
        *span_exporter* raises."""
        if self._closed:
            raise ClosedResourceError("this OtelExporter is closed")
        if self._metrics:
            processes = await self.context.graph_telemetry()
            if not self._closed:  # (closed meanwhile: its instruments stay silent)
                self._processes = processes
        if self._span_exporter is None:
            return 0
        fresh = self._take_fresh(await self.context.graph_traces())
        if not fresh:
            return 0
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ezflow-otel")
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, self._export, fresh)
        if result is not SpanExportResult.SUCCESS:
            self.failed_exports += 1
            self._export_failures.failed(f"the span exporter returned {result.name}")
        else:
            self._export_failures.succeeded()
        return len(fresh)

    def _take_fresh(self, hops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The finished hops of *hops* not exported before, now remembered as exported."""
        seen, order = self._exported_ids, self._exported_order
        fresh = [hop for hop in hops if hop["t_done"] and hop["span_id"] not in seen]
        for hop in fresh:
            seen.add(hop["span_id"])
            order.append(hop["span_id"])
        while len(order) > self._remember:
            seen.discard(order.popleft())
        self.exported += len(fresh)
        return fresh

    def _export(self, hops: list[dict[str, Any]]) -> SpanExportResult:
        # On the exporter's thread: building 6 spans per hop costs more than a poll
        # should take from the event loop.
        assert self._span_exporter is not None
        return self._span_exporter.export(spans_from_hops(hops, self._resource))

    async def run(self) -> None:
        """Poll every :attr:`interval` seconds until cancelled, or until the context
        closes (then return). A failed poll is logged (rate-limited) and the next one
        tries again."""
        while True:
            try:
                await self.export_once()
            except ClosedResourceError:
                return
            except Exception as exc:
                # Ours (graph unreachable, export refused) are one line; anything else
                # is a bug worth a traceback.
                expected = isinstance(exc, (EzflowError, OSError))
                self._failures.failed(f"{type(exc).__name__}: {exc}", None if expected else exc)
            else:
                self._failures.succeeded()
            await asyncio.sleep(self.interval)

    # -- lifetime ------------------------------------------------------------------------

    async def __aenter__(self) -> OtelExporter:
        if self._closed:
            raise ClosedResourceError("this OtelExporter is closed")
        if self._task is None:
            self._task = asyncio.ensure_future(self.run())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop polling (cancel :meth:`run` if :meth:`__aenter__` started it) and stop
        reporting metrics (instruments cannot be removed from a meter: theirs report
        nothing from now on). An export under way finishes on its thread. Idempotent."""
        self._closed = True
        self._processes = {}
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._executor is not None:
            # Not waiting: an exporter's retries can take its whole timeout.
            self._executor.shutdown(wait=False)

    # -- metrics -------------------------------------------------------------------------

    def _register_instruments(self, provider: MeterProvider) -> None:
        meter = provider.get_meter("ezflow", __version__)
        meter.create_observable_counter(
            "ezflow.channel.messages",
            [self._channel_callback(lambda ch: ch.messages)],
            unit="{message}",
            description="Messages a process received on a channel (one publisher, one "
            "transport), since the channel opened.",
        )
        meter.create_observable_counter(
            "ezflow.channel.bytes",
            [self._channel_callback(lambda ch: ch.bytes)],
            unit="By",
            description="Message bytes a process received on a channel, since it opened.",
        )
        meter.create_observable_counter(
            "ezflow.channel.drops",
            [self._channel_callback(lambda ch: ch.dropped_overflow + ch.dropped_upstream)],
            unit="{message}",
            description="Messages dropped for the subscribers of a channel: leaky inboxes "
            "full (overflow) or no room at the publisher (upstream).",
        )
        meter.create_observable_gauge(
            "ezflow.channel.latency.p50",
            [self._channel_callback(_latency_p50)],
            unit="s",
            description="Median publish -> deliver latency of a channel over its life.",
        )
        meter.create_observable_counter(
            "ezflow.publisher.messages",
            [self._publisher_messages],
            unit="{message}",
            description="Messages a publisher published, since it was created.",
        )

    def _channel_callback(
        self, value: _ChannelValue
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            observations = []
            for snapshot in self._processes.values():
                for ch in snapshot.channels:
                    measured = value(ch)
                    if measured is not None:
                        attributes: dict[str, str | int] = {
                            "topic": ch.topic,
                            "publisher_id": ch.publisher_id,
                            "transport": ch.transport,
                            "process": snapshot.name,
                            "pid": snapshot.pid,
                        }
                        observations.append(Observation(measured, attributes))
            return observations

        return observe

    def _publisher_messages(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(
                pub.messages,
                {
                    "topic": pub.topic,
                    "publisher_id": pub.publisher_id,
                    "process": snapshot.name,
                    "pid": snapshot.pid,
                },
            )
            for snapshot in self._processes.values()
            for pub in snapshot.publishers
        ]


def _latency_p50(channel: ChannelSnapshot) -> float | None:
    p50 = channel.latency.p50
    return None if p50 is None else p50 / 1e9


def otlp_http_exporters(
    endpoint: str = DEFAULT_ENDPOINT,
    *,
    interval: float = DEFAULT_INTERVAL,
    traces: bool = True,
    metrics: bool = True,
    resource: Resource | None = None,
) -> tuple[SpanExporter | None, SdkMeterProvider | None]:
    """OTLP over HTTP/protobuf to the collector at *endpoint* (its base URL: spans go
    to ``/v1/traces``, metrics to ``/v1/metrics``): a span exporter (when *traces*) and
    a meter provider exporting every *interval* seconds (when *metrics*), whose
    *resource* defaults to ``service.name=ezflow`` (``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` apply). Headers, timeouts and TLS come from the
    ``OTEL_EXPORTER_OTLP_*`` environment variables. Shut both down when done (the meter
    provider's shutdown exports the last figures)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
        OTLPMetricExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415

    base = endpoint.rstrip("/")
    span_exporter = OTLPSpanExporter(endpoint=f"{base}/v1/traces") if traces else None
    meter_provider = None
    if metrics:
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics"),
            export_interval_millis=interval * 1000,
        )
        meter_provider = SdkMeterProvider(
            metric_readers=[reader],
            resource=resource or Resource.create({"service.name": "ezflow"}),
        )
    return span_exporter, meter_provider
