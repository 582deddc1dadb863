"""The telemetry reporter reads a narrow view (ReportSource), not a GraphContext."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ezflow._core._codec import Codec
from ezflow._core._outlet import Outlet
from ezflow._core._tracing import TRACING
from ezflow._graph import _reporter
from ezflow._graph._reporter import TelemetryReporter
from ezflow._graph._routing import ChannelRecord


class Source:
    """A ReportSource with one publisher's outlet and no channels."""

    name = "view"

    def __init__(self, outlet: Outlet) -> None:
        self.outlet = outlet
        self.sent: list[dict[str, Any]] = []

    def channel_records(self) -> Iterable[ChannelRecord]:
        return ()

    def outlets(self) -> Iterable[Outlet]:
        return (self.outlet,)

    def shm_in_use(self, outlet: Outlet) -> int:
        return 3

    def send_report(self, snapshot: dict[str, Any]) -> bool:
        self.sent.append(snapshot)
        return True


def test_reporter_snapshots_and_sends_what_its_source_gives() -> None:
    outlet = Outlet(
        "p-view", "/view", Codec(max_message_size=1 << 20), max_in_flight=4, max_in_flight_bytes=1
    )
    source = Source(outlet)
    reporter = TelemetryReporter(source, 1.0)
    snapshot = reporter.report()
    assert snapshot.name == "view"
    assert [(p.publisher_id, p.topic, p.shm_in_use) for p in snapshot.publishers] == [
        ("p-view", "/view", 3)
    ]
    assert snapshot.channels == ()
    (sent,) = source.sent
    # The snapshot, plus the process's trace hops (none here) and trace rates.
    trace = sent.pop("trace")
    assert sent == snapshot.to_wire() and reporter.reports_sent == 1
    assert trace["hops"] == [] and trace["interval"] == 1.0
    assert trace["state"] == TRACING.state()


def test_reporter_module_does_not_import_the_context() -> None:
    tree = ast.parse(Path(_reporter.__file__).read_text())
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name.endswith("_context") for name in imported), imported
