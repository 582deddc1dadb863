"""Telemetry: per-channel counters and timings, hooks to attach your own sinks, and the
snapshot types that ``ezflow top`` and the Prometheus endpoint show.

::

    import ezflow.telemetry as telemetry

    class PrintDrops(telemetry.Hook):
        def on_drop(self, event: telemetry.DropEvent) -> None:
            print(f"{event.topic}: {event.count} dropped ({event.reason})")

    telemetry.add_hook(PrintDrops())
    telemetry.add_hook(telemetry.JsonLinesExporter("telemetry.jsonl"))

See docs/telemetry.md for what each figure means and what it costs.
"""

from __future__ import annotations

from ._core._telemetry import (
    ChannelSnapshot,
    DeliverEvent,
    DropEvent,
    DropReason,
    Histogram,
    HistogramSnapshot,
    Hook,
    JsonLinesExporter,
    ProcessSnapshot,
    PublisherSnapshot,
    PublishEvent,
    SubscriberSnapshot,
    add_hook,
    hooks,
    remove_hook,
)

__all__ = [
    "ChannelSnapshot",
    "DeliverEvent",
    "DropEvent",
    "DropReason",
    "Histogram",
    "HistogramSnapshot",
    "Hook",
    "JsonLinesExporter",
    "ProcessSnapshot",
    "PublishEvent",
    "PublisherSnapshot",
    "SubscriberSnapshot",
    "add_hook",
    "hooks",
    "remove_hook",
]
