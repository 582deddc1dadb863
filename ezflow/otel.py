"""Traces and channel metrics of a running graph to OpenTelemetry: ``pip install
'ezflow-pubsub[otel]'`` (docs/tracing.md).

::

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from ezflow.otel import OtelExporter

    async with ezflow.GraphContext() as ctx, OtelExporter(ctx, OTLPSpanExporter()):
        ...  # every traced hop of the graph becomes a span, polled every 2 s

Each traced hop (``ezflow.set_trace_rate``, ``EZFLOW_TRACE``, ``ezflow run --trace``)
is a span with the hop's own trace, span and parent ids, and a child span per stage
(publish, transport, decode, queue, handler); :func:`spans_from_hops` builds them from
``GraphContext.graph_traces()``. Given a meter provider, :class:`OtelExporter` also
reports the channel counters ``ezflow top`` shows (``ezflow.channel.messages``,
``.bytes``, ``.drops``, ``.latency.p50``, ``ezflow.publisher.messages``). Or, as a
process next to a running graph: ``ezflow otel --endpoint http://collector:4318``.
"""

from __future__ import annotations

try:
    import opentelemetry.sdk.trace as _sdk_trace  # noqa: F401 - only to fail early, with the fix
except ImportError as exc:  # pragma: no cover - the CI installs the extra
    raise ImportError(
        "ezflow.otel needs the OpenTelemetry SDK: pip install 'ezflow-pubsub[otel]'"
    ) from exc

from ._otel._export import (
    DEFAULT_ENDPOINT,
    DEFAULT_INTERVAL,
    DEFAULT_REMEMBER,
    OtelExporter,
    otlp_http_exporters,
    spans_from_hops,
    stage_span_id,
)

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_INTERVAL",
    "DEFAULT_REMEMBER",
    "OtelExporter",
    "otlp_http_exporters",
    "spans_from_hops",
    "stage_span_id",
]
