"""``ezflow otel``: a running graph's traced hops and channel metrics to an
OpenTelemetry collector over OTLP/HTTP (needs ``ezflow-pubsub[otel]``; docs/tracing.md).

OpenTelemetry is imported when the command runs, so ``ezflow --help`` works without
the extra.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .._core._config import OTEL_DEFAULT_ENDPOINT, OTEL_POLL_INTERVAL, format_address
from ._connection import (
    AddressOption,
    fail,
    graph_context,
    resolve_address,
    run_async,
    until_stopped,
)

__all__ = ["otel"]


def otel(
    address: AddressOption = None,
    endpoint: Annotated[
        str,
        typer.Option(
            "--endpoint",
            envvar="OTEL_EXPORTER_OTLP_ENDPOINT",
            show_envvar=True,
            help="The collector's OTLP/HTTP base URL: spans go to ENDPOINT/v1/traces, "
            "metrics to ENDPOINT/v1/metrics.",
        ),
    ] = OTEL_DEFAULT_ENDPOINT,
    interval: Annotated[
        float,
        typer.Option(
            "--interval",
            min=0.1,
            help="Seconds between two polls of the graph server and two metric exports.",
        ),
    ] = OTEL_POLL_INTERVAL,
    traces: Annotated[
        bool, typer.Option("--traces/--no-traces", help="Export the traced hops as spans.")
    ] = True,
    metrics: Annotated[
        bool,
        typer.Option("--metrics/--no-metrics", help="Export the channel and publisher metrics."),
    ] = True,
) -> None:
    """Export a running graph's traces and metrics to OpenTelemetry, until Ctrl-C.

    Every traced hop becomes a span with the hop's own trace, span and parent ids (a
    message's hops form one trace) and a child span per stage: publish, transport,
    decode, queue, handler. Per channel: ezflow.channel.messages, .bytes, .drops and
    .latency.p50; per publisher: ezflow.publisher.messages. Headers, timeouts and TLS
    for the collector come from the OTEL_EXPORTER_OTLP_* environment variables.

    Tracing is off unless the graph runs with `ezflow run --trace N` (or
    EZFLOW_TRACE=N); `ezflow trace --sample N` turns it on for a while.

    Examples:

        ezflow otel

        ezflow otel --endpoint http://collector:4318 --interval 5 --no-metrics
    """
    if not (traces or metrics):
        fail("--no-traces and --no-metrics leave nothing to export", 2)
    where = resolve_address(address)
    try:
        from .._otel._export import OtelExporter, otlp_http_exporters  # noqa: PLC0415

        span_exporter, meter_provider = otlp_http_exporters(
            endpoint, interval=interval, traces=traces, metrics=metrics
        )
    except ImportError as exc:
        fail(f"ezflow otel needs OpenTelemetry: pip install 'ezflow-pubsub[otel]' ({exc})", 2)

    async def main() -> None:
        async with (
            graph_context(where, "ezflow otel") as context,
            OtelExporter(context, span_exporter, meter_provider, interval=interval),
        ):
            what = " and ".join(k for k, on in (("traces", traces), ("metrics", metrics)) if on)
            typer.echo(
                f"exporting the {what} of {format_address(where)} to {endpoint} every "
                f"{interval:g} s; Ctrl-C stops"
            )
            await until_stopped()

    try:
        run_async(main)
    finally:
        # The meter provider's shutdown exports the figures collected since the last
        # export; both give up after their exporter's timeout when the collector is gone.
        if meter_provider is not None:
            meter_provider.shutdown()
        if span_exporter is not None:
            span_exporter.shutdown()
