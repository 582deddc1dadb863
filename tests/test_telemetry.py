"""Telemetry: histograms, hooks and events, drops by reason, the periodic report to the
graph server (bounded, never blocking, surviving the server), the JSON-lines exporter,
the Prometheus endpoint, and exact counters across real processes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _proc import Child
from _prometheus import http_get, parse_exposition
from conftest import loop_kind

import ezflow
from ezflow import ConfigurationError, telemetry
from ezflow._core._channel import Channel, Inbox
from ezflow._core._codec import Codec
from ezflow._core._config import BAD_PEER_LOG_FIRST, MAX_TELEMETRY_REPORT_SIZE
from ezflow._core._exceptions import ProtocolError
from ezflow._core._telemetry import (
    HISTOGRAM_BUCKETS,
    Histogram,
    bucket_bounds,
    bucket_index,
)
from ezflow._graph import _metrics
from ezflow._graph._client import GraphClient
from ezflow._graph._metrics import render

# -- histograms ------------------------------------------------------------------------


def test_buckets_tile_the_integers() -> None:
    previous_high = 0
    for index in range(HISTOGRAM_BUCKETS):
        low, high = bucket_bounds(index)
        assert low == previous_high and high > low
        previous_high = high
        assert bucket_index(low) == index and bucket_index(high - 1) == index
        assert high <= 2 * max(low, 1)  # log2: a bucket spans at most a factor of two
        assert bucket_index(high - 1) == (high - 1).bit_length()  # what the hot path uses
    assert previous_high == 2**64
    assert bucket_index(2**70) == HISTOGRAM_BUCKETS - 1


def test_histogram_quantiles() -> None:
    rng = random.Random(5)
    values = sorted(int(rng.lognormvariate(10, 1.5)) for _ in range(20_000))
    histogram = telemetry.Histogram()
    for value in values:
        histogram.record(value)
    snap = histogram.snapshot()
    assert (snap.count, snap.total, snap.max) == (len(values), sum(values), values[-1])
    for q in (0.01, 0.5, 0.9, 0.99):
        true = values[round(q * len(values)) - 1]
        assert true / 2 <= snap.quantile(q) <= true * 2  # within its log2 bucket
    # Interpolation within a bucket: close for values spread evenly.
    even = telemetry.Histogram()
    for value in range(1000, 3000):
        even.record(value)
    assert even.snapshot().p50 == pytest.approx(2000, rel=0.1)
    assert even.snapshot().p99 == pytest.approx(2980, rel=0.1)
    # Inline recording keeps no maximum: the top of the highest bucket stands for it.
    inline = telemetry.Histogram()
    inline.buckets[(1500).bit_length()] += 1
    assert inline.snapshot().max == 2047
    assert telemetry.HistogramSnapshot().p50 is None
    histogram.record(-5)  # a clock step counts as 0
    assert histogram.snapshot().buckets[0] == (0, 1)


def test_histogram_interval_and_wire_round_trip() -> None:
    histogram = telemetry.Histogram()
    for value in (100, 200, 300):
        histogram.record(value)
    first = histogram.snapshot()
    for value in (10_000, 20_000):
        histogram.record(value)
    recent = histogram.snapshot().since(first)
    assert (recent.count, recent.total) == (2, 30_000)
    assert 8192 <= recent.p50 < 16384  # the bucket of 10_000
    wire = json.loads(json.dumps(histogram.snapshot().to_wire()))
    assert telemetry.HistogramSnapshot.from_wire(wire) == histogram.snapshot()
    for bad in (None, {"count": 1}, {**wire, "buckets": [[999, 1]]}, {**wire, "max": True}):
        with pytest.raises(ProtocolError):
            telemetry.HistogramSnapshot.from_wire(bad)


# -- hooks and channel counters (one process) --------------------------------------------


class Recorder(telemetry.Hook):
    """Keeps every event it is given."""

    def __init__(self) -> None:
        self.published: list[telemetry.PublishEvent] = []
        self.delivered: list[telemetry.DeliverEvent] = []
        self.dropped: list[telemetry.DropEvent] = []
        self.snapshots: list[telemetry.ProcessSnapshot] = []

    def on_publish(self, event: telemetry.PublishEvent) -> None:
        self.published.append(event)

    def on_deliver(self, event: telemetry.DeliverEvent) -> None:
        self.delivered.append(event)

    def on_drop(self, event: telemetry.DropEvent) -> None:
        self.dropped.append(event)

    def on_snapshot(self, snapshot: telemetry.ProcessSnapshot) -> None:
        self.snapshots.append(snapshot)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    hook = Recorder()
    telemetry.add_hook(hook)
    try:
        yield hook
    finally:
        telemetry.remove_hook(hook)
    assert telemetry.hooks() == ()


def test_only_the_methods_a_hook_defines_are_registered() -> None:
    from ezflow._core import _telemetry  # noqa: PLC0415

    class SnapshotsOnly(telemetry.Hook):
        def on_snapshot(self, snapshot: telemetry.ProcessSnapshot) -> None:
            pass

    hook = SnapshotsOnly()
    telemetry.add_hook(hook)
    telemetry.add_hook(hook)  # twice: once
    try:
        assert telemetry.hooks() == (hook,)
        assert len(_telemetry.SNAPSHOT_HOOKS) == 1
        assert not (_telemetry.DELIVER_HOOKS or _telemetry.PUBLISH_HOOKS or _telemetry.DROP_HOOKS)
    finally:
        telemetry.remove_hook(hook)
    assert not _telemetry.SNAPSHOT_HOOKS
    with pytest.raises(TypeError, match="not a telemetry hook"):
        telemetry.add_hook(object())


async def test_events_and_counters_on_a_local_channel(
    ctx: ezflow.GraphContext, recorder: Recorder
) -> None:
    pub = await ctx.publisher("/t/local")
    subs = [await ctx.subscriber("/t/local") for _ in range(2)]
    for i in range(20):
        await pub.publish(np.full(3, i))
        for sub in subs:
            await sub.recv()
            await asyncio.sleep(0)  # "handler" time
    assert [e.seq for e in recorder.published] == list(range(1, 21))
    assert all(e.topic == "/t/local" and e.channels == 1 for e in recorder.published)
    assert [e.seq for e in recorder.delivered] == list(range(1, 21))
    assert {(e.transport, e.subscribers, e.decode_ns) for e in recorder.delivered} == {
        ("local", 2, 0)
    }
    snap = ctx.telemetry()
    (channel,) = snap.channels
    assert (channel.messages, channel.deliveries, channel.drops, channel.queue_depth) == (
        20,
        40,
        0,
        0,
    )
    assert channel.transport == "local" and channel.lossless
    assert {s.subscriber_id for s in channel.subscribers} == {s.id for s in subs}
    for sub_snap in channel.subscribers:
        assert (sub_snap.received, sub_snap.taken) == (20, 20)
        assert sub_snap.handler.count == 1  # sampled: message 16's handler time
    (publisher,) = snap.publishers
    assert (publisher.messages, publisher.channels, publisher.drops) == (20, 1, 0)
    assert snap.pid == os.getpid() and snap.name == ctx.name
    # The stats dataclasses stay flat numbers (benchmarks dump them as JSON).
    for stats in (pub.statistics(), subs[0].statistics(), ctx.channels[0].statistics):
        json.dumps(dataclasses.asdict(stats))


async def test_a_failing_hook_never_breaks_delivery(
    ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(telemetry.Hook):
        def on_deliver(self, event: telemetry.DeliverEvent) -> None:
            raise RuntimeError("hook bug")

    hook = Broken()
    telemetry.add_hook(hook)
    try:
        pub = await ctx.publisher("/t/broken")
        sub = await ctx.subscriber("/t/broken")
        await pub.publish(1)
        assert await sub.recv() == 1
    finally:
        telemetry.remove_hook(hook)
    assert "telemetry hook" in caplog.text and "hook bug" in caplog.text


async def test_overflow_drops_are_counted_by_reason(
    ctx: ezflow.GraphContext, recorder: Recorder
) -> None:
    pub = await ctx.publisher("/t/overflow")
    leaky = await ctx.subscriber("/t/overflow", leaky=True, queue=3)
    for i in range(10):
        await pub.publish(i)
    assert [leaky.recv_nowait() for _ in range(3)] == [7, 8, 9]
    stats = leaky.statistics()
    assert (stats.dropped, stats.dropped_overflow, stats.dropped_upstream) == (7, 7, 0)
    assert sum(e.count for e in recorder.dropped) == 7
    assert {(e.reason, e.subscriber_id, e.topic) for e in recorder.dropped} == {
        ("overflow", leaky.id, "/t/overflow")
    }
    (channel,) = ctx.telemetry().channels
    assert (channel.dropped_overflow, channel.dropped_upstream) == (7, 0)
    assert channel.subscribers[0].leaky


def test_latency_and_decode_times_come_from_the_publish_time() -> None:
    codec = Codec()
    channel = Channel("p-1", "/t", codec, transport="tcp")
    inbox = Inbox()
    channel.attach(inbox)
    body = codec.encode(np.arange(4.0)).to_bytes()
    sent = time.time_ns() - 5_000_000  # published 5 ms ago
    channel.deliver_body(1, body, 0, sent)
    for seq in range(2, 33):
        channel.deliver_body(seq, body)  # publish time unknown: no latency sample
    latency, decode = channel.latency.snapshot(), channel.decode_time.snapshot()
    assert latency.count == 1
    assert 5_000_000 <= latency.max < 5_000_000 + 1_000_000_000
    assert decode.count == 2  # sampled: one in 16
    assert channel.stats.decoded == 32 and channel.stats.decode_seconds > 0


async def test_upstream_drops_reach_the_subscriber_counters(
    ctx: ezflow.GraphContext, recorder: Recorder
) -> None:
    # tcp, max_in_flight 1, a subscriber that never reads until the end: the publisher
    # parks and replaces, counting upstream drops that travel with the next message.
    pub = await ctx.publisher("/t/upstream", transport="tcp", max_in_flight=1)
    sub = await ctx.subscriber("/t/upstream", leaky=True, queue=1000)
    for i in range(50):
        await pub.publish(i)
    received: list[int] = []
    while True:
        try:
            received.append(await asyncio.wait_for(sub.recv(), 0.5))
        except (TimeoutError, asyncio.TimeoutError):
            break
    assert received[-1] == 49
    missed = 50 - len(received)
    assert sub.statistics().dropped_upstream == missed == pub.statistics().drops
    assert sub.statistics().dropped_overflow == 0
    upstream = [e for e in recorder.dropped if e.reason == "upstream"]
    assert sum(e.count for e in upstream) == missed
    (channel,) = ctx.telemetry().channels
    assert channel.dropped_upstream == missed and channel.transport == "tcp"


# -- reporting to the graph server --------------------------------------------------------


@pytest.fixture
async def reporting(server: ezflow.GraphServer) -> AsyncIterator[ezflow.GraphContext]:
    async with ezflow.GraphContext(
        server.address, auto_start=False, telemetry_interval=0.05
    ) as context:
        yield context


async def _wait_reported(
    ctx: ezflow.GraphContext, check: Any, timeout: float = 10
) -> dict[str, telemetry.ProcessSnapshot]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = await ctx.graph_telemetry()
        if check(found):
            return found
        assert asyncio.get_running_loop().time() < deadline, f"not reported: {found}"
        await asyncio.sleep(0.05)


async def test_the_server_keeps_the_latest_snapshot_per_client(
    server: ezflow.GraphServer, reporting: ezflow.GraphContext, recorder: Recorder
) -> None:
    pub = await reporting.publisher("/t/report")
    sub = await reporting.subscriber("/t/report")
    for i in range(30):
        await pub.publish(i)
        await sub.recv()

    def has_all(found: dict[str, telemetry.ProcessSnapshot]) -> bool:
        return any(c.messages == 30 for s in found.values() for c in s.channels)

    found = await _wait_reported(reporting, has_all)
    (snap,) = found.values()
    assert snap.publishers[0].messages == 30 and snap.name == reporting.name
    assert recorder.snapshots, "on_snapshot hooks get the periodic snapshot"
    assert list(server.telemetry()) == list(found)
    text = render(server.telemetry().items())
    families = parse_exposition(text)
    (sample,) = families["ezflow_channel_messages_total"]["samples"]
    assert sample[1]["topic"] == "/t/report" and sample[2] == 30


async def test_on_message_exceptions_are_reported_per_subscriber(
    server: ezflow.GraphServer, reporting: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []

    def on_message(message: int) -> None:
        seen.append(message)
        if message % 3 == 0:
            raise ValueError(f"cannot handle {message}")

    pub = await reporting.publisher("/t/errors")
    sub = await reporting.subscriber("/t/errors", on_message=on_message)
    quiet = await reporting.subscriber("/t/errors")
    for i in range(30):
        await pub.publish(i)
        await quiet.recv()
    assert sub.statistics().callback_errors == 10 and len(seen) == 30

    def reported(found: dict[str, telemetry.ProcessSnapshot]) -> bool:
        return any(
            s.callback_errors == 10
            for p in found.values()
            for c in p.channels
            for s in c.subscribers
        )

    found = await _wait_reported(reporting, reported)
    (channel,) = next(iter(found.values())).channels
    assert sorted(s.callback_errors for s in channel.subscribers) == [0, 10]
    samples = parse_exposition(render(server.telemetry().items()))[
        "ezflow_subscriber_callback_errors_total"
    ]["samples"]
    assert sorted(value for _, _, value in samples) == [0.0, 10.0]
    assert "cannot handle 0" in caplog.text


def test_a_report_without_callback_errors_reads_as_zero() -> None:
    """Reports of versions that did not send the field still parse; a wrong type does not."""
    snapshot = telemetry.SubscriberSnapshot(
        "s-1", False, 0, 5, 5, 0, 0, Histogram().snapshot(), callback_errors=2
    )
    wire = snapshot.to_wire()
    assert telemetry.SubscriberSnapshot.from_wire(wire) == snapshot
    del wire["callback_errors"]
    assert telemetry.SubscriberSnapshot.from_wire(wire).callback_errors == 0
    with pytest.raises(ProtocolError, match="callback_errors"):
        telemetry.SubscriberSnapshot.from_wire({**wire, "callback_errors": "2"})


def test_rejoins_travel_with_a_channel_report_and_reach_prometheus() -> None:
    """A channel's ``rejoins`` (tests/test_liveness.py counts them for real) go on the
    wire, read as 0 from versions that did not send them, and are a Prometheus counter."""
    empty = Histogram().snapshot()
    channel = telemetry.ChannelSnapshot(
        "p-1", "/t", "tcp", True, 5, 50, 5, 0, 0, 0, 0, 0, empty, empty, 0.0, 1.0, 10.0, rejoins=3
    )
    wire = channel.to_wire()
    assert wire["rejoins"] == 3 and telemetry.ChannelSnapshot.from_wire(wire) == channel
    del wire["rejoins"]
    assert telemetry.ChannelSnapshot.from_wire(wire).rejoins == 0
    with pytest.raises(ProtocolError, match="rejoins"):
        telemetry.ChannelSnapshot.from_wire({**wire, "rejoins": "3"})
    process = dataclasses.replace(_snapshot(), channels=(channel,))
    family = parse_exposition(render([("c1", process)]))["ezflow_channel_rejoins_total"]
    assert family["type"] == "counter"
    [(_, labels, value)] = family["samples"]
    assert value == 3.0 and labels["publisher"] == "p-1" and labels["transport"] == "tcp"


async def test_reporting_survives_the_server_going_away(server: ezflow.GraphServer) -> None:
    async with ezflow.GraphContext(
        server.address, auto_start=False, telemetry_interval=0.05
    ) as context:
        pub = await context.publisher("/t/gone")
        await server.aclose()
        await asyncio.sleep(0.3)
        await pub.publish(1)  # publishing never depended on the server
        reporter = context._reporter
        assert reporter.reports_skipped >= 2
        assert context._report_task is not None and not context._report_task.done()
        assert context.telemetry().publishers[0].messages == 1


async def test_reports_are_bounded_and_malformed_ones_ignored(
    server: ezflow.GraphServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = await GraphClient.connect(
        server.address, name="raw", on_routes=lambda v, r: None, on_lost=lambda e: None
    )
    try:
        too_big = {"blob": "x" * (MAX_TELEMETRY_REPORT_SIZE + 1)}
        assert not client.send_report(too_big)  # refused before sending
        assert client.send_report({"name": "bad"})  # malformed: sent, ignored there
        await client.request("ping")  # the connection survives
        assert server.ignored_reports == 1
        assert server.telemetry() == {}
        assert "ignoring a telemetry report" in caplog.text
    finally:
        client.close()


def test_telemetry_interval_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="telemetry_interval"):
        ezflow.GraphContext(telemetry_interval=0.001)
    monkeypatch.setenv("EZFLOW_TELEMETRY_INTERVAL", "soon")
    with pytest.raises(ConfigurationError, match="EZFLOW_TELEMETRY_INTERVAL"):
        ezflow.GraphContext()


# -- exporters -----------------------------------------------------------------------------


def _snapshot(name: str = "p") -> telemetry.ProcessSnapshot:
    return telemetry.ProcessSnapshot(name=name, pid=1, hostname="h", time=1.0, interval=1.0)


def test_json_lines_exporter_appends_and_rotates(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    line = _snapshot("p0").to_json() + "\n"  # every line has this length
    exporter = telemetry.JsonLinesExporter(path, max_bytes=len(line) * 3)
    for i in range(5):
        exporter.on_snapshot(_snapshot(f"p{i}"))
    exporter.close()
    current = [json.loads(x)["name"] for x in path.read_text().splitlines()]
    rotated = [json.loads(x)["name"] for x in Path(f"{path}.1").read_text().splitlines()]
    assert rotated == ["p0", "p1", "p2"] and current == ["p3", "p4"]
    assert telemetry.ProcessSnapshot.from_wire(json.loads(line)) == _snapshot("p0")
    with pytest.raises(ConfigurationError):
        telemetry.JsonLinesExporter(path, max_bytes=0)


async def test_prometheus_endpoint() -> None:
    async with ezflow.GraphServer(("127.0.0.1", 0), metrics_port=0) as server:
        async with ezflow.GraphContext(
            server.address, auto_start=False, telemetry_interval=0.05
        ) as context:
            pub = await context.publisher("/t/prom")
            sub = await context.subscriber("/t/prom", transport="tcp")
            for i in range(25):
                await pub.publish(np.full(16, i))
                await sub.recv()
            await _wait_reported(
                context, lambda f: any(c.messages == 25 for s in f.values() for c in s.channels)
            )
            assert server.metrics_address is not None
            host, port = server.metrics_address
            url = f"http://{host}:{port}"
            status, body = await asyncio.to_thread(http_get, f"{url}/metrics")
            assert status == 200
            families = parse_exposition(body)
            messages = families["ezflow_channel_messages_total"]["samples"]
            assert [(s[1]["topic"], s[1]["transport"], s[2]) for s in messages] == [
                ("/t/prom", "tcp", 25.0)
            ]
            drops = families["ezflow_channel_drops_total"]["samples"]
            assert {s[1]["reason"] for s in drops} == {"overflow", "upstream"}
            (count,) = [
                s
                for s in families["ezflow_channel_latency_seconds"]["samples"]
                if s[0].endswith("_count")
            ]
            assert families["ezflow_publisher_messages_total"]["samples"][0][2] == 25.0
            assert count[2] in (0.0, 25.0)  # 25 once the transports pass the publish time
            assert (await asyncio.to_thread(http_get, f"{url}/nothing"))[0] == 404
        await _raw_requests(host, port)


async def _raw_requests(host: str, port: int) -> None:
    async def ask(data: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(data)
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return answer

    assert (await ask(b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
    assert (await ask(b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
    assert (await ask(b"GET /" + b"x" * 20_000 + b" HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 431")


async def test_bad_requests_to_the_metrics_endpoint_are_answered_and_logged_bounded(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bad request gets the status that says why; the log holds at most
    BAD_PEER_LOG_FIRST lines per cause, and the summary at close counts the rest."""
    if loop_kind() == "uvloop":
        pytest.skip("the log limit does not depend on the event loop; once is enough")
    monkeypatch.setattr(_metrics, "METRICS_REQUEST_TIMEOUT", 0.3)
    async with ezflow.GraphServer(("127.0.0.1", 0), metrics_port=0) as server:
        assert server.metrics_address is not None
        gate = asyncio.Semaphore(8)  # (below MAX_METRICS_CONNECTIONS)

        async def ask(data: bytes) -> bytes:
            async with gate:
                reader, writer = await asyncio.open_connection(*server.metrics_address)
                writer.write(data)
                answer = await asyncio.wait_for(reader.read(), 5)
                writer.close()
                return answer

        bad = [b"POST /metrics HTTP/1.1\r\n\r\n", b"garbage\r\n\r\n", b"GET /x HTTP/1.1\r\n\r\n"]
        answers = await asyncio.gather(*(ask(bad[i % 3]) for i in range(300)))
        assert {a.split(b"\r\n", 1)[0] for a in answers} == {
            b"HTTP/1.1 405 Method Not Allowed",
            b"HTTP/1.1 400 Bad Request",
            b"HTTP/1.1 404 Not Found",
        }
        assert answers[2].endswith(b"no b'/x', try /metrics\n")
        late = await ask(b"GET /metrics HTTP/1.1\r\n")  # the head never ends
        assert late.startswith(b"HTTP/1.1 408 Request Timeout")
        assert b"METRICS_REQUEST_TIMEOUT" in late
        assert (await ask(b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200")
    lines = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("metrics server: ")
    ]
    assert len(lines) == BAD_PEER_LOG_FIRST + 1 + 1, lines  # request, timeout, summary
    assert lines[-1] == (
        f"metrics server: {300 - BAD_PEER_LOG_FIRST} more bad connections closed "
        f"(request {300 - BAD_PEER_LOG_FIRST}); totals so far: request 300, timeout 1"
    )


# -- exact counts across real processes --------------------------------------------------


async def test_counters_match_exact_counts_across_processes(
    server: ezflow.GraphServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher process, two subscribers in this process: 200 messages published,
    one channel receives (and decodes) 200 and delivers 400, as the publisher's and
    this process's reports to the server say."""
    monkeypatch.setenv("EZFLOW_TELEMETRY_INTERVAL", "0.05")
    address = "{}:{}".format(*server.address)
    async with ezflow.GraphContext(server.address, auto_start=False) as context:
        subs = [await context.subscriber("/t/exact") for _ in range(2)]
        child = await Child.start(
            "publish", loop_kind(), address=address, topic="/t/exact", count=200, size=32
        )
        try:
            publisher_id = (await child.event("ready"))["publisher_id"]
            for i in range(200):  # both in step: lossless, they hold the publisher back
                for sub in subs:
                    assert (await sub.recv())[0] == i

            def complete(found: dict[str, telemetry.ProcessSnapshot]) -> bool:
                pubs = [p for s in found.values() for p in s.publishers]
                chans = [c for s in found.values() for c in s.channels]
                return [p.messages for p in pubs] == [200] and [c.messages for c in chans] == [200]

            found = await _wait_reported(context, complete)
            (publisher,) = [p for s in found.values() for p in s.publishers]
            (channel,) = [c for s in found.values() for c in s.channels]
            assert publisher.publisher_id == channel.publisher_id == publisher_id
            assert (channel.deliveries, channel.drops, channel.decode_errors) == (400, 0, 0)
            assert channel.transport == "shm" and channel.decode.count == 200 // 16
            assert channel.bytes == publisher.bytes
            assert [s.taken for s in channel.subscribers] == [200, 200]
        finally:
            await child.aclose()


async def test_leaky_drop_counts_match_the_real_drops(
    server: ezflow.GraphServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast publisher process, a slow leaky subscriber here: what the subscriber did
    not get is exactly what telemetry counts as dropped (by reason, summed)."""
    monkeypatch.setenv("EZFLOW_TELEMETRY_INTERVAL", "0.05")
    address = "{}:{}".format(*server.address)
    count = 300
    async with ezflow.GraphContext(server.address, auto_start=False) as context:
        sub = await context.subscriber("/t/leaky", leaky=True, queue=4)
        child = await Child.start(
            "publish", loop_kind(), address=address, topic="/t/leaky", count=count, size=256
        )
        try:
            await child.event("ready")
            got: list[int] = []
            while True:
                try:
                    message = await asyncio.wait_for(sub.recv(), 1.0)
                except (TimeoutError, asyncio.TimeoutError):
                    break
                got.append(int(message[0]))
                await asyncio.sleep(0.002)  # slow
            assert got == sorted(set(got)) and got[-1] == count - 1
            real_drops = count - len(got)
            assert real_drops > 0

            def settled(found: dict[str, telemetry.ProcessSnapshot]) -> bool:
                chans = [c for s in found.values() for c in s.channels]
                return len(chans) == 1 and chans[0].subscribers[0].taken == len(got)

            found = await _wait_reported(context, settled)
            (channel,) = [c for s in found.values() for c in s.channels]
            (subscriber,) = channel.subscribers
            assert subscriber.dropped_overflow + subscriber.dropped_upstream == real_drops
            assert channel.dropped_overflow + channel.dropped_upstream == real_drops
            assert sub.statistics().dropped == real_drops
            assert subscriber.leaky and not channel.lossless
        finally:
            await child.aclose()


@pytest.mark.parametrize("transport", ["local", "shm", "tcp"])
async def test_every_transport_hands_the_publish_time_to_the_channel(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    """Latency needs the publish time each transport carries: local in the call, shm and
    tcp in every DATA / SHM_DATA header (inline and zero-copy alike)."""
    pub = await ctx.publisher(f"/lat/{transport}")
    sub = await ctx.subscriber(f"/lat/{transport}", transport=transport)
    for size in (16, 200_000):  # shm: inline, then through shared memory
        await pub.publish(np.zeros(size, np.uint8))
        await sub.recv()
    (channel,) = [c for c in ctx.telemetry().channels if c.topic == f"/lat/{transport}"]
    assert channel.transport == transport
    assert channel.latency.count == 2
    assert 0 < channel.latency.max < 10_000_000_000
