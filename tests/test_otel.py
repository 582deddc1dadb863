"""OpenTelemetry export: hops as spans (ids, parent links, stage children, a hop from
another host), the 3-process pipeline's hops as linked traces, OtelExporter on a live
graph (spans once each, metrics, failed polls logged and survived), ``ezflow otel``
against a fake OTLP/HTTP collector, and OpenTelemetry staying out of the core."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import gzip
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import typer
from _proc import held_pipeline
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from typer.testing import CliRunner

import ezflow
from ezflow import otel
from ezflow._cli import _otel as cli_otel
from ezflow._core._config import TRACE_SERVER_KEEP
from ezflow._core._tracing import HOP_FIELDS, STAGES
from ezflow._graph._traces import stages_of

PACKAGE = Path(ezflow.__file__).parent
WALL = 1_700_000_000_000_000_000  # a wall_offset: monotonic 0 is this epoch time


pytestmark = pytest.mark.usefixtures("tracing_off")


def _hop(**fields: Any) -> dict[str, Any]:
    hop: dict[str, Any] = {
        "trace_id": 0xABCDEF,
        "parent_id": 0,
        "publisher_id": "pub",
        "subscriber": "sub",
        "transport": "shm",
        "pid": 100,
        "same_clock": True,
        "forwarded": 0,
        "process": "relay1",
        "wall_offset": WALL,
    }
    hop.update(fields)
    assert set(HOP_FIELDS) <= hop.keys()
    return hop


def _by_id(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {span.context.span_id: span for span in spans}


# -- hops to spans ---------------------------------------------------------------------------


def test_hops_become_linked_spans_with_a_child_per_known_stage() -> None:
    first = _hop(span_id=11, topic="/a", t_publish=1000, t_sent=1100, t_received=1300,
                 t_decoded=1350, t_taken=1500, t_done=1900)  # fmt: skip
    second = _hop(span_id=22, parent_id=11, topic="/b", transport="local", pid=200,
                  process="sink", t_publish=1900, t_sent=1950, t_received=1960,
                  t_decoded=1960, t_taken=2100, t_done=2600)  # fmt: skip
    # Its publisher ran on another host: publish and transport are on another clock.
    remote = _hop(span_id=33, parent_id=22, topic="/c", transport="tcp", pid=300,
                  same_clock=False, process="", t_publish=999_999, t_sent=1_000_100,
                  t_received=5000, t_decoded=5100, t_taken=5200, t_done=5600)  # fmt: skip
    unfinished = _hop(span_id=44, parent_id=33, topic="/d", t_publish=5600, t_sent=5650,
                      t_received=5700, t_decoded=5750, t_taken=5800, t_done=0)  # fmt: skip
    spans = otel.spans_from_hops([first, second, remote, unfinished])
    assert len(spans) == 3 + 5 + 5 + 3  # the unfinished hop is left out
    by_id = _by_id(spans)
    assert len(by_id) == len(spans)
    hop_spans = [s for s in spans if s.kind is SpanKind.CONSUMER]
    assert [s.name for s in hop_spans] == ["/a -> relay1", "/b -> sink", "/c -> pid 300"]

    for hop, span in zip((first, second, remote), hop_spans, strict=True):
        assert (span.context.trace_id, span.context.span_id) == (0xABCDEF, hop["span_id"])
        assert span.context.trace_flags.sampled and not span.context.is_remote
        if hop["parent_id"]:
            assert span.parent is not None and span.parent.is_remote
            assert (span.parent.trace_id, span.parent.span_id) == (0xABCDEF, hop["parent_id"])
            assert by_id[span.parent.span_id].kind is SpanKind.CONSUMER  # the parent hop
        else:
            assert span.parent is None
        start = hop["t_publish"] if hop["same_clock"] else hop["t_received"]
        assert (span.start_time, span.end_time) == (start + WALL, hop["t_done"] + WALL)
        attributes = dict(span.attributes or {})
        process = hop["process"] or f"pid {hop['pid']}"
        assert attributes["ezflow.process"] == process
        assert span.resource.attributes["service.name"] == process
        assert span.resource.attributes["process.pid"] == hop["pid"]
        for key in ("topic", "publisher_id", "subscriber", "transport", "pid"):
            assert attributes[f"ezflow.{key}"] == hop[key]
        known = {n: v for n, v in stages_of(hop).items() if v is not None}
        assert {k: v for k, v in attributes.items() if k.startswith("ezflow.stage.")} == {
            f"ezflow.stage.{n}": v for n, v in known.items()
        }
        children = [s for s in spans if s.parent is not None and s.parent == span.context]
        # One child per known stage, in order, each as long as its stage, end to end.
        assert [c.name for c in children] == list(known)
        for child in children:
            assert child.kind is SpanKind.INTERNAL
            assert child.context.span_id == otel.stage_span_id(hop["span_id"], child.name)
            assert child.end_time - child.start_time == known[child.name]
        assert children[0].start_time == span.start_time
        assert children[-1].end_time == span.end_time
        for before, after in itertools.pairwise(children):
            assert before.end_time == after.start_time

    assert [c.name for c in spans[1:6]] == list(STAGES)  # each hop, then its stages
    assert "ezflow.stage.publish" not in (hop_spans[2].attributes or {})
    # Ids are derived, so exporting the same hops again gives the same spans.
    again = otel.spans_from_hops([first, second, remote])
    assert [s.context.span_id for s in again] == [s.context.span_id for s in spans]
    assert all(otel.stage_span_id(s, n) for s in (0, 1, 2**64 - 1) for n in STAGES)
    mine = Resource({"service.name": "mine"})
    assert all(s.resource is mine for s in otel.spans_from_hops([first], mine))


# -- the 3-process pipeline, and `ezflow otel` on it -------------------------------------------


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The pipeline's result (its hops under "traces"), while its graph keeps running."""
    with held_pipeline(
        tmp_path_factory.mktemp("otel"),
        *("--hops", "3", "--frame", "1000B", "--count", "10", "--period", "0.01"),
    ) as result:
        yield result


def _check_pipeline_traces(hop_spans: list[Any], stage_parents: dict[int, list[Any]]) -> None:
    """10 traces of 3 hops, each the parent of the next, 5 stages each within it.
    *hop_spans* are (trace_id, span_id, parent_id, topic, start, end); *stage_parents*
    maps a hop's span id to its stage spans' (name, start, end)."""
    traces: dict[int, list[Any]] = defaultdict(list)
    for span in hop_spans:
        traces[span[0]].append(span)
    assert len(traces) == 10
    for trace in traces.values():
        trace.sort(key=lambda s: s[3])
        assert [s[3] for s in trace] == ["/hop0", "/hop1", "/hop2"]
        assert trace[0][2] == 0
        assert [s[2] for s in trace[1:]] == [s[1] for s in trace[:-1]]
        for _, span_id, _, _, start, end in trace:
            stages = sorted(stage_parents[span_id], key=lambda s: s[1])
            assert [s[0] for s in stages] == list(STAGES)
            assert all(start <= s_start <= s_end <= end for _, s_start, s_end in stages)


def test_the_pipelines_hops_export_as_linked_traces(pipeline: dict[str, Any]) -> None:
    hops = pipeline["traces"]
    assert len(hops) == 30
    exporter = InMemorySpanExporter()
    assert exporter.export(otel.spans_from_hops(hops)) is SpanExportResult.SUCCESS
    spans = exporter.get_finished_spans()
    assert len(spans) == 30 * 6
    hop_spans = [
        (
            s.context.trace_id,
            s.context.span_id,
            s.parent.span_id if s.parent else 0,
            (s.attributes or {})["ezflow.topic"],
            s.start_time,
            s.end_time,
        )
        for s in spans
        if s.kind is SpanKind.CONSUMER
    ]
    stage_parents: dict[int, list[Any]] = defaultdict(list)
    for s in spans:
        if s.kind is SpanKind.INTERNAL:
            assert s.parent is not None
            stage_parents[s.parent.span_id].append((s.name, s.start_time, s.end_time))
    _check_pipeline_traces(hop_spans, stage_parents)
    # Each hop is its taking process's: relay 1 takes /hop0, relay 2 /hop1, the sink /hop2.
    services = {
        (s.attributes or {})["ezflow.topic"]: s.resource.attributes["service.name"]
        for s in spans
        if s.kind is SpanKind.CONSUMER
    }
    assert services == {"/hop0": "relay1", "/hop1": "relay2", "/hop2": "source+sink"}
    # Wall-clock times: within a minute of now.
    assert all(abs(s.start_time - time.time_ns()) < 60e9 for s in spans)


class _Collector(ThreadingHTTPServer):
    """A fake OTLP/HTTP collector: keeps each request's path and body."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CollectorHandler)
        self.received: list[tuple[str, bytes]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _CollectorHandler(BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.server.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[_Collector]:
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _received(collector: _Collector) -> tuple[list[Any], dict[str, list[Any]]]:
    """Every span the collector got, and every metric data point by metric name."""
    spans: list[Any] = []
    points: dict[str, list[Any]] = defaultdict(list)
    for path, body in list(collector.received):
        if path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            spans += [
                span
                for resource_spans in request.resource_spans
                for scope_spans in resource_spans.scope_spans
                for span in scope_spans.spans
            ]
        elif path == "/v1/metrics":
            metrics = ExportMetricsServiceRequest.FromString(body)
            for resource_metrics in metrics.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        points[metric.name] += list(getattr(metric, kind).data_points)
    return spans, points


def _attributes(point: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in point.attributes}


def test_ezflow_otel_exports_a_running_graph_over_otlp_http(
    pipeline: dict[str, Any], collector: _Collector
) -> None:
    # (and before it runs, neither ezflow nor its CLI has loaded OpenTelemetry)
    command = (
        "import sys, typer, ezflow._cli._app; from ezflow._cli._otel import otel; "
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]; "
        "assert not loaded, loaded; typer.run(otel)"
    )
    env = {**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    process = subprocess.Popen(
        [sys.executable, "-c", command, "--address", pipeline["address"],
         "--endpoint", collector.endpoint + "/", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            spans, points = _received(collector)
            messages = {
                _attributes(p)["topic"]: p.as_int for p in points["ezflow.channel.messages"]
            }
            if len(spans) >= 30 * 6 and all(messages.get(f"/hop{i}", 0) > 10 for i in range(3)):
                break
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"{len(spans)} spans, messages {messages}"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert f"to {collector.endpoint}/ every 0.2 s" in out
    # Each hop once, with the ids of the graph's hops; stages under their hop.
    assert len(spans) == 30 * 6
    ids = {int.from_bytes(s.span_id, "big") for s in spans}
    assert {hop["span_id"] for hop in pipeline["traces"]} <= ids
    hop_spans = []
    stage_parents: dict[int, list[Any]] = defaultdict(list)
    for span in spans:
        parent = int.from_bytes(span.parent_span_id, "big") if span.parent_span_id else 0
        topic = {kv.key: kv.value.string_value for kv in span.attributes}.get("ezflow.topic")
        start, end = span.start_time_unix_nano, span.end_time_unix_nano
        if topic is None:
            stage_parents[parent].append((span.name, start, end))
        else:
            trace_id = int.from_bytes(span.trace_id, "big")
            hop_spans.append((trace_id, int.from_bytes(span.span_id, "big"), parent, topic,
                              start, end))  # fmt: skip
    _check_pipeline_traces(hop_spans, stage_parents)
    for name in ("ezflow.channel.bytes", "ezflow.channel.drops", "ezflow.publisher.messages"):
        assert points[name], name
    processes = {_attributes(p)["process"] for p in points["ezflow.channel.latency.p50"]}
    assert processes == {"relay1", "relay2", "source+sink"}


def test_ezflow_otel_without_the_extra_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ezflow._otel._export", None)  # as if not installed
    app = typer.Typer()
    app.command()(cli_otel.otel)
    result = CliRunner().invoke(app, ["--address", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ezflow otel needs OpenTelemetry: pip install")
    assert "'ezflow-pubsub[otel]'" in result.stderr
    assert result.stderr.count("\n") == 1
    nothing = CliRunner().invoke(app, ["--no-traces", "--no-metrics"])
    assert nothing.exit_code == 2 and "leave nothing to export" in nothing.stderr


# -- OtelExporter on a live graph ------------------------------------------------------------


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = defaultdict(list)
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points[metric.name] += list(metric.data.data_points)
    return points


async def test_the_exporter_sends_each_hop_once_and_the_channel_metrics() -> None:
    ezflow.set_trace_rate(1)
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    async with ezflow.GraphContext(("127.0.0.1", 0), telemetry_interval=0.1) as ctx:
        pub = await ctx.publisher("/otel/live", transport="tcp")
        sub = await ctx.subscriber("/otel/live")
        for i in range(5):  # (all before the first recv: each message starts a trace)
            await pub.publish(i)
        for i in range(5):
            assert await sub.recv() == i
        with contextlib.suppress(TimeoutError):  # (the last hop ends at the next recv)
            await asyncio.wait_for(sub.recv(), 0.05)
        exporter = otel.OtelExporter(ctx, spans, MeterProvider(metric_readers=[reader]))
        deadline = asyncio.get_running_loop().time() + 5
        exported = 0
        while True:
            exported += await exporter.export_once()
            points = _points(reader)
            published = [
                p.value
                for p in points["ezflow.publisher.messages"]
                if p.attributes["topic"] == "/otel/live"
            ]
            if exported >= 5 and published == [5]:
                break
            assert asyncio.get_running_loop().time() < deadline, (exported, dict(points))
            await asyncio.sleep(0.05)
        assert exported == 5 and exporter.exported == 5
        assert await exporter.export_once() == 0  # nothing twice
        finished = spans.get_finished_spans()
        assert len(finished) == 5 * 6
        hop_spans = [s for s in finished if s.kind is SpanKind.CONSUMER]
        assert len({s.context.trace_id for s in hop_spans}) == 5
        assert all(s.parent is None for s in hop_spans)
        for span in hop_spans:
            attributes = span.attributes or {}
            assert attributes["ezflow.transport"] == "tcp"
            assert attributes["ezflow.process"] == ctx.name
            assert attributes["ezflow.topic"] == "/otel/live"

        def channel(name: str) -> list[Any]:
            return [p for p in points[name] if p.attributes["topic"] == "/otel/live"]

        (messages,) = channel("ezflow.channel.messages")
        assert messages.value == 5
        assert dict(messages.attributes) == {
            "topic": "/otel/live",
            "publisher_id": pub.id,
            "transport": "tcp",
            "process": ctx.name,
            "pid": os.getpid(),
        }
        (size,) = channel("ezflow.channel.bytes")
        assert size.value > 0
        assert [p.value for p in channel("ezflow.channel.drops")] == [0]
        (latency,) = channel("ezflow.channel.latency.p50")
        assert 0 < latency.value < 1
        await exporter.aclose()
        assert not _points(reader)  # a closed exporter reports nothing
        with pytest.raises(ezflow.ClosedResourceError):
            await exporter.export_once()


class _FakeGraph:
    """What OtelExporter asks of a GraphContext, failing on cue."""

    def __init__(self, replies: list[Any]) -> None:
        self.replies = replies

    async def graph_telemetry(self) -> dict[str, Any]:
        return {}

    async def graph_traces(self) -> list[dict[str, Any]]:
        reply = self.replies.pop(0) if self.replies else ezflow.ClosedResourceError("closed")
        if isinstance(reply, BaseException):
            raise reply
        return list(reply)


async def test_a_failed_poll_is_logged_once_and_the_next_one_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hop = _hop(span_id=7, topic="/t", t_publish=1, t_sent=2, t_received=3, t_decoded=4,
               t_taken=5, t_done=6)  # fmt: skip
    gone = ezflow.BrokenResourceError("no graph server")
    graph = _FakeGraph([gone, gone, [hop], [hop], [hop, {**hop, "span_id": 8}]])
    spans = InMemorySpanExporter()
    exporter = otel.OtelExporter(graph, spans, interval=0.001)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "ezflow.otel"):
        await asyncio.wait_for(exporter.run(), 5)  # returns once the context is closed
    assert [s.context.span_id for s in spans.get_finished_spans() if s.parent is None] == [7, 8]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # the second failure within the minute is not logged
    assert "BrokenResourceError: no graph server" in lines[0]
    assert "works again after 2 failed polls" in lines[1]
    await exporter.aclose()


async def test_the_exporter_as_a_context_manager_polls_until_the_block_ends() -> None:
    hop = _hop(span_id=9, topic="/t", t_publish=1, t_sent=2, t_received=3, t_decoded=4,
               t_taken=5, t_done=6)  # fmt: skip
    graph = _FakeGraph([[hop]] * 1000)
    spans = InMemorySpanExporter()
    async with otel.OtelExporter(graph, spans, interval=0.01) as exporter:  # type: ignore[arg-type]
        for _ in range(500):
            if spans.get_finished_spans():
                break
            await asyncio.sleep(0.01)
    left = len(graph.replies)
    await asyncio.sleep(0.05)  # a window: no reply may come in it
    assert len(graph.replies) == left  # stopped
    assert exporter.exported == 1 and len(spans.get_finished_spans()) == 6


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"interval": 0}, "interval=0 must be a number of seconds > 0"),
        ({"interval": float("nan")}, "interval=nan"),
        ({"remember": TRACE_SERVER_KEEP - 1}, "TRACE_SERVER_KEEP"),
    ],
)
def test_bad_exporter_options_are_clear_errors(option: dict[str, Any], match: str) -> None:
    with pytest.raises(ezflow.ConfigurationError, match=match):
        otel.OtelExporter(_FakeGraph([]), None, **option)  # type: ignore[arg-type]


# -- packaging -------------------------------------------------------------------------------


def test_opentelemetry_is_imported_only_by_the_otel_modules() -> None:
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "opentelemetry" for name in names):
                assert relative.startswith(("_otel/", "otel.py")), f"{relative} imports it"
    # (at run time: see test_ezflow_otel_exports_a_running_graph_over_otlp_http)


def test_the_public_module_exports_its_names() -> None:
    assert set(otel.__all__) == {n for n in vars(otel) if not n.startswith("_")} - {"annotations"}
