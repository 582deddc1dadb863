"""Tracing: the TRACE frame, sampled messages through every hop on every transport (with
parent links, stage times that add up, messages unchanged), nothing when off, the
3-process pipeline against an independent end-to-end measurement, ``ezflow trace``
(tables, --json, --sample) and the graph server's keeping of hops."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _proc import ezflow_cli, held_pipeline
from conftest import loop_kind
from rich.console import Console

import ezflow
from ezflow import ConfigurationError, ProtocolError
from ezflow._core._config import ENV_TRACE, TRACE_SERVER_KEEP
from ezflow._core._tracing import (
    CLOCK_ID,
    STAGES,
    TRACING,
    WireTrace,
    apply_lease,
    check_rows,
    hop_stages,
)
from ezflow._graph._traces import REPORTED_FIELDS, end_to_end, paths_of, stages_of, summarize

pytestmark = pytest.mark.usefixtures("tracing_off")


# -- the wire and the settings ---------------------------------------------------------------


def test_a_trace_frame_round_trips_and_a_wrong_one_is_a_protocol_error() -> None:
    wire = WireTrace(2**64 - 1, 7, 123, clock=CLOCK_ID)
    frame = wire.frame()
    assert int.from_bytes(frame[:4], "little") == len(frame) - 4 == 48
    back = WireTrace.from_frame(frame[4:])
    assert (back.trace_id, back.parent_id, back.t_publish, back.clock) == (
        2**64 - 1,
        7,
        123,
        CLOCK_ID,
    )
    assert back.t_sent == wire.t_sent > 0
    with pytest.raises(ProtocolError, match="TRACE frame of 47 bytes"):
        WireTrace.from_frame(frame[4:-1])


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_a_bad_rate_is_a_clear_error(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"0 \(tracing off\) or a whole number"):
        ezflow.set_trace_rate(bad)
    assert TRACING.rate == 0


def test_a_bad_environment_rate_is_reported_by_the_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_TRACE, "often")
    with pytest.raises(ConfigurationError, match="EZFLOW_TRACE='often'"):
        ezflow.GraphContext(("127.0.0.1", 1))


def test_malformed_hop_rows_are_refused() -> None:
    good = [1, 2, 0, "/t", "p", "s", "tcp", 9, True, 1, 2, 3, 4, 5, 6, 0]
    assert check_rows([good]) == [good]
    for bad in ([good[:-1]], [[*good[:3], 4, *good[4:]]], [[*good[:8], 1, *good[9:]]], ["x"]):
        with pytest.raises(ProtocolError):
            check_rows(bad)


def test_stages_of_a_hop_from_another_host_leave_out_the_other_clock() -> None:
    row = [1, 2, 0, "/t", "p", "s", "tcp", 9, False, 10, 20, 1000, 1010, 1050, 1100, 0]
    assert hop_stages(row) == {
        "publish": None,
        "transport": None,
        "decode": 10,
        "queue": 40,
        "handler": 50,
    }


def test_a_units_input_loop_starts_no_trace_of_its_own() -> None:
    """Its publishes are caused by what it takes: sampling is the sources' (a relay of
    an untraced message publishes untraced; one of a traced message carries it on)."""
    import contextvars  # noqa: PLC0415

    from ezflow._core._tracing import HANDLING, carry  # noqa: PLC0415

    class Publisher:
        trace_countdown = 1

    ezflow.set_trace_rate(1)
    assert carry(Publisher()) is not None

    def in_a_loop() -> object:
        HANDLING.set(True)
        return carry(Publisher())

    assert contextvars.copy_context().run(in_a_loop) is None


# -- in one process, every transport ---------------------------------------------------------


def _message(i: int) -> Any:
    kinds = [
        (i, "tuple", np.arange(i, dtype=np.float32)),
        {"seq": i, "blob": bytes([i % 256]) * (i * 7)},
        (i, np.full(300_000, i, np.uint8)),  # out of line over shm
        [i, None, 1.5],
    ]
    return kinds[i % len(kinds)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _collect(sub: ezflow.Subscriber, count: int) -> asyncio.Future[list[Any]]:
    """Take *count* messages in a task of its own (a task's publishes carry on the trace
    of the last traced message it took, until it asks for the next: a sink must not
    be the source's task), then ask once more, which ends the last hop."""

    async def take() -> list[Any]:
        got = [await sub.recv() for _ in range(count)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sub.recv(), 0.01)
        return got

    return asyncio.ensure_future(take())


@pytest.mark.parametrize("transport", ["local", "shm", "tcp"])
async def test_a_relay_chain_records_linked_hops_and_delivers_the_same_messages(
    server: ezflow.GraphServer, transport: str
) -> None:
    ezflow.set_trace_rate(1)
    async with ezflow.GraphContext(server.address) as ctx:
        first = await ctx.publisher("/first", transport=transport)
        relay_in = await ctx.subscriber("/first", transport=transport)
        second = await ctx.publisher("/second", transport=transport)
        sink = await ctx.subscriber("/second", transport=transport)
        await first.wait_for_channels()
        await second.wait_for_channels()

        async def relay() -> None:
            for _ in range(8):
                await second.publish(await relay_in.recv())

        relaying = asyncio.ensure_future(relay())
        taking = _collect(sink, 8)
        for i in range(8):
            await first.publish(_message(i))
            await asyncio.sleep(0.001)
        await relaying
        got = await taking
    assert all(_same(_message(i), m) for i, m in enumerate(got))
    hops = await _server_hops(server, 16)
    paths = paths_of(hops)
    assert len(paths) == 8
    for path in paths:
        assert [h["topic"] for h in path] == ["/first", "/second"]
        assert path[1]["parent_id"] == path[0]["span_id"] and path[0]["parent_id"] == 0
        assert all(h["transport"] == transport for h in path)
        stages = [stages_of(h) for h in path]
        assert all(v is not None and v >= 0 for s in stages for v in s.values())
        # Contiguous: the relay's handler ends where its publish starts.
        assert path[0]["t_done"] == path[1]["t_publish"]
        along = sum(sum(s.values()) for s in stages) - stages[-1]["handler"]  # type: ignore[arg-type, operator]
        assert along == end_to_end(path)
        if transport == "local":
            assert stages[0]["decode"] == 0


async def _server_hops(server: ezflow.GraphServer, count: int) -> list[dict[str, Any]]:
    """The hops the graph server keeps, once it has *count* (the last ones come with the
    report of a closing context, which it reads on this loop)."""
    fields = REPORTED_FIELDS
    for _ in range(200):
        if len(server.trace_hops) >= count:
            break
        await asyncio.sleep(0.01)
    return [dict(zip(fields, row, strict=True)) for row in server.trace_hops]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_traced_and_untraced_messages_arrive_the_same(
    server: ezflow.GraphServer, transport: str
) -> None:
    """The traced path against the general one: every message, in order, unchanged,
    whether one in three is traced or none is; off records nothing at all."""
    for rate in (0, 3):
        ezflow.set_trace_rate(rate)
        async with ezflow.GraphContext(server.address) as ctx:
            pub = await ctx.publisher(f"/diff{rate}", transport=transport)
            sub = await ctx.subscriber(f"/diff{rate}", transport=transport)
            await pub.wait_for_channels()
            for i in range(24):  # back to back: TRACE frames among batched ones
                await pub.publish(_message(i))
            got = [await sub.recv() for _ in range(24)]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sub.recv(), 0.01)
        assert all(_same(_message(i), m) for i, m in enumerate(got))
        hops = await _server_hops(server, 0 if rate == 0 else 8)
        assert len(hops) == (0 if rate == 0 else 8)
        if rate == 0:
            assert not TRACING.active


async def test_an_on_message_callback_carries_the_trace_on(server: ezflow.GraphServer) -> None:
    ezflow.set_trace_rate(1)
    async with ezflow.GraphContext(server.address) as ctx:
        out = await ctx.publisher("/out", transport="tcp")
        sink = await ctx.subscriber("/out", transport="tcp")
        pub = await ctx.publisher("/in", transport="tcp")

        forwarding = set()

        def forward(message: Any) -> None:
            # A task copies the context: the callback's trace goes with it.
            task = asyncio.ensure_future(out.publish(message))
            forwarding.add(task)
            task.add_done_callback(forwarding.discard)

        await ctx.subscriber("/in", transport="tcp", on_message=forward)
        await pub.wait_for_channels()
        await out.wait_for_channels()
        taking = _collect(sink, 3)
        for i in range(3):
            await pub.publish(i)
            await asyncio.sleep(0.001)
        assert await taking == [0, 1, 2]
    paths = paths_of(await _server_hops(server, 6))
    assert sorted(len(p) for p in paths) == [2, 2, 2]
    assert all(p[0]["topic"] == "/in" and p[1]["parent_id"] == p[0]["span_id"] for p in paths)
    assert all(p[0]["t_taken"] == p[0]["t_decoded"] for p in paths)  # no queue for a callback


async def test_a_leaky_inbox_drops_traced_messages_like_any(server: ezflow.GraphServer) -> None:
    ezflow.set_trace_rate(1)
    async with ezflow.GraphContext(server.address) as ctx:
        pub = await ctx.publisher("/leaky", transport="local")
        sub = await ctx.subscriber("/leaky", transport="local", leaky=True, queue=2)
        await pub.wait_for_channels()
        for i in range(5):
            await pub.publish(i)
        assert [sub.recv_nowait(), sub.recv_nowait()] == [3, 4]
        assert sub.statistics().dropped_overflow == 3


async def test_a_context_that_closes_reports_its_last_hops(server: ezflow.GraphServer) -> None:
    """A process that ends within a report interval of its last traced message still
    leaves its hops at the graph server (its context's close reports them)."""
    ezflow.set_trace_rate(1)
    async with (
        ezflow.GraphContext(server.address, telemetry_interval=3600) as sender,
        ezflow.GraphContext(server.address, telemetry_interval=3600) as receiver,
    ):
        pub = await sender.publisher("/brief", transport="tcp")
        sub = await receiver.subscriber("/brief", transport="tcp")
        await pub.wait_for_channels()
        for i in range(3):
            await pub.publish(i)
        assert [await sub.recv() for _ in range(3)] == [0, 1, 2]
    assert not TRACING.hops  # reported at close, not waiting for an hour
    async with ezflow.GraphContext(server.address) as reader:
        hops = await reader.graph_traces()
    assert sorted(h["topic"] for h in hops) == ["/brief"] * 3
    assert all(h["t_done"] for h in hops)  # the last one finished when its inbox closed


# -- three processes, and `ezflow trace` -------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The 3-hop pipeline of ``ezflow perf waterfall``: this source+sink process and two
    relay processes, tracing 1 in 1, 2 MB frames every 20 ms; held alive for
    ``ezflow trace`` until the test module ends."""
    with held_pipeline(
        tmp_path_factory.mktemp("pipeline"),
        *("--hops", "3", "--frame", "2000000B", "--count", "30", "--period", "0.02"),
    ) as result:
        yield result


def test_a_three_process_pipeline_records_every_stage_of_every_message(
    pipeline: dict[str, Any],
) -> None:
    hops = pipeline["traces"]
    paths = paths_of(hops)
    assert len(paths) == 30
    assert len({h["pid"] for h in hops}) == 3  # every hop taken in a process of its own
    ratios = []
    for path, measured in zip(paths, pipeline["end_to_end_ns"], strict=True):
        assert [h["topic"] for h in path] == ["/hop0", "/hop1", "/hop2"]
        assert [h["process"] for h in path] == ["relay1", "relay2", "source+sink"]
        stages = [stages_of(h) for h in path]
        assert all(isinstance(v, int) and v >= 0 for s in stages for v in s.values()), stages
        along = sum(sum(s.values()) for s in stages) - stages[-1]["handler"]  # type: ignore[arg-type, operator]
        traced = end_to_end(path)
        assert along == traced
        # The pipeline's own stopwatch (before publish at the source, after recv at
        # the sink) holds the traced path: the stages account for its time.
        assert traced is not None and 0 < traced <= measured
        ratios.append(traced / measured)
    assert statistics.median(ratios) >= 0.95, ratios


def test_ezflow_trace_json_lists_the_path_and_its_stages(pipeline: dict[str, Any]) -> None:
    result = ezflow_cli("trace", "--json", "--address", pipeline["address"])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["stages"] == list(STAGES)
    (path,) = report["paths"]
    assert path["path"] == "/hop0 -> relay1 -> relay2 -> source+sink"
    assert path["traces"] == 30
    assert [h["topic"] for h in path["hops"]] == ["/hop0", "/hop1", "/hop2"]
    for hop in path["hops"]:
        assert hop["transport"] == "shm"
        for stage in STAGES:
            assert hop["stages"][stage]["count"] == 30
            assert hop["stages"][stage]["p50_us"] <= hop["stages"][stage]["p99_us"]
    assert path["end_to_end"]["p50_us"] > 0 and len(path["recent"]) == 5


def test_ezflow_trace_draws_the_waterfall(pipeline: dict[str, Any]) -> None:
    from ezflow._cli._trace import render_paths  # noqa: PLC0415

    console = Console(record=True, width=120, color_system="truecolor")
    console.print(render_paths(summarize(pipeline["traces"]), title="t"))
    text = console.export_text(clear=False)
    assert "/hop0 -> relay1 -> relay2 -> source+sink  (30 traced" in text
    for line in ("1. /hop0 -> relay1 (shm)", "2. /hop1 -> relay2 (shm)", "3. /hop2 -> source+sink"):
        assert line in text
    bars = [line for line in text.splitlines() if "█" in line and "stages" not in line]
    assert len(bars) == 15  # a bar per stage per hop
    # Each bar starts where the one before it ended or later: a waterfall.
    starts = [line.index("█") for line in bars]
    assert starts == sorted(starts) and starts[-1] > starts[0]
    html = console.export_html(inline_styles=True)
    for colour in ("#800080", "#800000", "#808000", "#008080", "#008000"):  # a stage each
        assert f"color: {colour}" in html
    # The real command prints the same tables.
    result = ezflow_cli("trace", "--address", pipeline["address"])
    assert result.returncode == 0 and "3. /hop2 -> source+sink (shm)" in result.stdout


async def test_ezflow_trace_sample_turns_tracing_on_for_a_while(
    server: ezflow.GraphServer,
) -> None:
    if loop_kind() == "uvloop":
        pytest.skip("the command's sampling does not depend on this loop; once is enough")
    async with ezflow.GraphContext(server.address, telemetry_interval=0.1) as ctx:
        pub = await ctx.publisher("/sampled", transport="tcp")
        sub = await ctx.subscriber("/sampled", transport="tcp")
        await pub.wait_for_channels()
        running = True

        async def publish() -> None:
            while running:
                await pub.publish(0)
                await asyncio.sleep(0.002)

        async def take() -> None:
            while running:
                await sub.recv()

        tasks = [asyncio.ensure_future(publish()), asyncio.ensure_future(take())]
        address = f"{server.address[0]}:{server.address[1]}"
        cli = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ezflow", "trace", "--sample", "5", "--duration", "0.6"),
            *("--json", "--address", address),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        talking = asyncio.ensure_future(cli.communicate())
        seen_rate = None
        while not talking.done():
            if TRACING.lease is not None:
                seen_rate = seen_rate or TRACING.lease.rate
            await asyncio.wait([talking], timeout=0.05)
        out, err = talking.result()
        running = False
        await tasks[0]
        await pub.publish(0)  # (wakes the taker)
        await tasks[1]
    assert cli.returncode == 0, err
    assert seen_rate == 5
    assert TRACING.lease is None and server.trace_lease is None  # ended
    (path,) = json.loads(out)["paths"]
    assert path["hops"][0]["topic"] == "/sampled" and path["traces"] >= 5


async def test_ezflow_trace_without_traces_says_how_to_get_some(
    server: ezflow.GraphServer,
) -> None:
    if loop_kind() == "uvloop":
        pytest.skip("the command's message does not depend on this loop; once is enough")
    address = f"{server.address[0]}:{server.address[1]}"
    cli = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "ezflow", "trace", "--address", address),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = await cli.communicate()
    assert cli.returncode == 1
    assert "no traced messages" in err.decode() and "ezflow run --trace N" in err.decode()
    assert "--sample 100" in err.decode()


def test_the_graph_server_keeps_the_newest_hops_and_refuses_malformed_ones() -> None:
    server = ezflow.GraphServer(("127.0.0.1", 0))
    client: Any = SimpleNamespace(name="proc")
    rows = [[i, i + 1, 0, "/t", "p", "s", "tcp", 9, True, 1, 2, 3, 4, 5, 6, 0] for i in range(10)]
    for _ in range(TRACE_SERVER_KEEP // 10 + 1):
        server._trace_reported(client, {"offset": 42, "hops": rows})
    assert len(server.trace_hops) == TRACE_SERVER_KEEP
    assert server.trace_hops[-1] == [*rows[-1], "proc", 42]
    for bad in ({"hops": rows}, {"offset": 1, "hops": [rows[0][:5]]}, ["x"]):
        with pytest.raises(ProtocolError):
            server._trace_reported(client, bad)


# -- `ezflow top`: each channel's stage split ---------------------------------------------------


def _top_json(address: str) -> dict[str, Any]:
    result = ezflow_cli("top", "--once", "--json", "--address", address)
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def test_ezflow_top_json_gives_each_channel_its_stage_split(pipeline: dict[str, Any]) -> None:
    channels = {row["topic"]: row for row in _top_json(pipeline["address"])["channels"]}
    # The same p50s as `ezflow trace` gives each hop of the path (nearest rank, ns).
    (path,) = summarize(pipeline["traces"])
    for hop in path.hops:
        row = channels[hop.topic]
        assert row["process"] == hop.process
        assert row["traced"] == 30
        assert list(row["stages_p50_us"]) == list(STAGES)
        for stage in STAGES:
            p50 = row["stages_p50_us"][stage]
            assert p50 is not None and p50 >= 0, row["stages_p50_us"]
            assert hop.stages[stage].p50 is not None
            assert p50 == pytest.approx(hop.stages[stage].p50 / 1e3)
    assert sorted(channels) == ["/hop0", "/hop1", "/hop2"]


def test_ezflow_top_shows_the_stages_column(pipeline: dict[str, Any]) -> None:
    result = ezflow_cli("top", "--once", "--address", pipeline["address"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "topic" in line)  # the channel table's
    assert [cell.strip() for cell in header.split("┃")][-2] == "stages", header
    for topic in ("/hop0", "/hop1", "/hop2"):
        row = next(line for line in lines if line.startswith(f"│ {topic} "))
        # The bar (a stage's initial per cell, by its share), then the sum of the p50s.
        bar, total = row.split("│")[-2].strip().split(" ", 1)
        assert len(bar) == 10 and set(bar) <= set("ptdqh"), row
        assert total.split(" ")[1] in ("ns", "µs", "ms") and float(total.split(" ")[0]) > 0


def test_ezflow_top_fits_80_columns_and_drops_the_stages_first(pipeline: dict[str, Any]) -> None:
    from ezflow._cli._top import _tables  # noqa: PLC0415

    snapshot = _top_json(pipeline["address"])

    def render(width: int) -> str:
        console = Console(width=width, record=True)
        console.print(_tables(snapshot, pipeline["address"], width))
        return console.export_text()

    text = render(80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text  # no cell cut short
    assert "stages" in text.split("not shown for width: ")[1].splitlines()[0]
    # One cell narrower than the whole channel table: only the stages go.
    wide = render(1000)
    assert "not shown" not in wide and "stages" in wide
    table_width = max(len(line.rstrip()) for line in wide.splitlines())
    narrower = render(table_width - 1)
    assert "not shown for width: stages (widen, or --json)" in narrower


async def test_ezflow_top_without_traced_hops_shows_no_stages(
    server: ezflow.GraphServer,
) -> None:
    if loop_kind() == "uvloop":
        pytest.skip("what the command shows does not depend on this loop; once is enough")
    from ezflow._cli._top import _tables, fetch_traces, rows  # noqa: PLC0415

    async with ezflow.GraphContext(server.address, telemetry_interval=0.1) as ctx:
        pub = await ctx.publisher("/untraced", transport="tcp")
        await ctx.subscriber("/untraced", transport="tcp")
        await pub.wait_for_channels()
        address = f"{server.address[0]}:{server.address[1]}"
        report: dict[str, Any] = {}
        for _ in range(50):  # until the context reported its channel
            cli = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "ezflow", "top", "--once", "--json"),
                *("--address", address),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            out, err = await cli.communicate()
            assert cli.returncode == 0, err
            report = json.loads(out)
            if report["channels"]:
                break
            await asyncio.sleep(0.1)
    (row,) = report["channels"]
    assert row["traced"] == 0 and row["stages_p50_us"] == dict.fromkeys(STAGES)
    console = Console(width=400, record=True)
    console.print(_tables(report, address, 400))
    line = next(line for line in console.export_text().splitlines() if "/untraced" in line)
    assert line.split("│")[-2].strip() == "-", line

    # A server that refuses `traces` (older than tracing) or answers it malformed: top
    # shows its telemetry without stages instead of failing.
    class Refusing:
        def __init__(self, reply: dict[str, Any] | None) -> None:
            self.reply = reply

        async def request(self, op: str, **_: Any) -> dict[str, Any]:
            assert op == "traces"
            if self.reply is None:
                raise ezflow.GraphError("graph server refused 'traces': unknown op")
            return self.reply

    for reply in (None, {"fields": None, "hops": []}):
        client: Any = Refusing(reply)
        assert await fetch_traces(client) == []
    assert rows({}, time.time(), []) == {"channels": [], "publishers": []}


async def test_a_process_that_only_sampled_stops_looking_for_traces_when_its_rate_ends(
    server: ezflow.GraphServer,
) -> None:
    """A publisher's process traced (its own rate, or the graph's lease from
    ``ezflow trace --sample``, also one whose command was killed halfway) and its rate
    is back to 0: it looks for traces no more, so its burst goes the one-call compiled
    publish again (before, it stayed off for the process's life once any rate had been
    set). A process that received a traced message keeps looking: a handler of one may
    still publish, carrying its trace on."""
    from ezflow._graph import _publisher  # noqa: PLC0415

    compiled = _publisher._publish_small
    took = [0]

    def counting(outlet: Any, message: Any) -> bool:
        assert compiled is not None
        fast = compiled(outlet, message)
        took[0] += fast
        return fast

    async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
        pub = await ctx.publisher("/sampled", transport="tcp")
        sub = await ctx.subscriber("/sampled", transport="tcp")
        alone = await ctx.publisher("/sampled/alone")
        await pub.wait_for_channels(1)

        async def burst() -> int:
            took[0] = 0

            async def take() -> None:
                for _ in range(200):
                    await sub.recv()

            async def give() -> None:
                for i in range(200):  # (a lossless window: the other task takes them)
                    await pub.publish((0, i, 0, np.zeros(16, np.float32)))

            await asyncio.wait_for(asyncio.gather(give(), take()), 10)
            return took[0]

        with pytest.MonkeyPatch.context() as patch:
            if compiled is not None:
                patch.setattr(_publisher, "_publish_small", counting)
            for start, end in (
                (lambda: ezflow.set_trace_rate(1000), lambda: ezflow.set_trace_rate(0)),
                (
                    lambda: apply_lease({"id": "L1", "rate": 1000, "remaining": 30}),
                    lambda: apply_lease(None),  # (ended by the server)
                ),
                (
                    lambda: apply_lease({"id": "L2", "rate": 1000, "remaining": 0}),
                    lambda: TRACING.expire(time.monotonic_ns() + 10**12),  # (ran out)
                ),
            ):
                start()
                assert TRACING.active
                for i in range(10):  # sampled (to no subscriber: none is received here)
                    await alone.publish((0, i, 0, np.zeros(16, np.float32)))
                end()
                assert not TRACING.active and TRACING.rate == 0
                if compiled is not None:
                    assert await burst() > 150  # (the first of each loop turn aside)
            # A traced message received here: this process carries traces on for good.
            ezflow.set_trace_rate(1)
            await pub.publish((0, -1, 0, np.zeros(16, np.float32)))
            await asyncio.wait_for(sub.recv(), 5)
            ezflow.set_trace_rate(0)
            assert TRACING.carrying and TRACING.active
            if compiled is not None:
                assert await burst() == 0
