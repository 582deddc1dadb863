"""End of stream (low level): a subscriber ends once every publisher that fed it ended.

Unit-level and whole-graph scenarios (end_when_done, draining on stop) are further down.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from _eos_graphs import (
    ENV_RECORD,
    CountSettings,
    Numbers,
    Relay,
    Sink,
    SinkSettings,
    burst,
    chains,
)
from conftest import without_shm_notices

import ezflow
from ezflow.units import Replayer

GRAPHS = str(Path(__file__).with_name("_eos_graphs.py"))


async def _drain(sub: ezflow.Subscriber, timeout: float = 10) -> list[object]:
    async def collect() -> list[object]:
        return [message async for message in sub]

    return await asyncio.wait_for(collect(), timeout)


@pytest.mark.parametrize("transport", ["local", "shm", "tcp"])
async def test_async_for_ends_after_the_last_message(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    sub = await ctx.subscriber("/eos/one", transport=transport)
    leaky = await ctx.subscriber("/eos/one", transport=transport, leaky=True, queue=500)

    async def publish() -> None:
        async with await ctx.publisher("/eos/one", max_in_flight=8) as pub:
            for i in range(300):
                await pub.publish(i)

    publishing = asyncio.ensure_future(publish())
    assert await _drain(sub) == list(range(300))  # (backpressure: received meanwhile)
    await publishing
    assert sub.ended
    # Told once per end: afterwards recv() waits for a publisher that may come.
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(sub.recv(), 0.05)
    with pytest.raises(ezflow.WouldBlock):
        sub.recv_nowait()
    assert (sub.statistics().publishers_ended, sub.statistics().publishers_broken) == (1, 0)
    assert [leaky.recv_nowait() for _ in range(300)] == list(range(300))
    with pytest.raises(ezflow.EndOfStream):
        leaky.recv_nowait()
    with pytest.raises(asyncio.QueueEmpty):
        leaky.recv_nowait()


async def test_end_waits_for_every_publisher(ctx: ezflow.GraphContext) -> None:
    sub = await ctx.subscriber("/eos/two")
    first = await ctx.publisher("/eos/two")
    second = await ctx.publisher("/eos/two", transport="tcp")
    await first.publish("a")
    await first.aclose()
    assert await asyncio.wait_for(sub.recv(), 5) == "a"
    assert not sub.ended  # the tcp publisher may still publish
    receiving = asyncio.ensure_future(sub.recv())
    await second.publish("b")
    assert await asyncio.wait_for(receiving, 5) == "b"
    await second.aclose()
    assert await _drain(sub) == []


async def test_a_publisher_routed_before_the_end_keeps_the_stream_open(
    ctx: ezflow.GraphContext,
) -> None:
    sub = await ctx.subscriber("/eos/late")
    first = await ctx.publisher("/eos/late")
    await first.publish(1)
    late = await ctx.publisher("/eos/other", transport="tcp")
    await ctx.connect("/eos/other", "/eos/late")  # routes now list `late` for sub
    await first.aclose()
    assert await asyncio.wait_for(sub.recv(), 5) == 1
    assert not sub.ended
    await late.publish(2)
    await late.aclose()
    assert await _drain(sub) == [2]


async def test_subscriber_without_publisher_keeps_waiting(ctx: ezflow.GraphContext) -> None:
    async with await ctx.publisher("/eos/gone") as pub:
        await pub.publish(0)
    # Created after the only publisher ended: it never had one, so one may still come.
    sub = await ctx.subscriber("/eos/gone")
    waiting = asyncio.ensure_future(sub.recv())
    await asyncio.sleep(0.1)  # a window: the subscriber may not end in it
    assert not waiting.done() and not sub.ended
    async with await ctx.publisher("/eos/gone") as pub:
        await pub.publish(1)
    assert await asyncio.wait_for(waiting, 5) == 1
    assert await _drain(sub) == []


async def test_closed_subscriber_still_raises_closed(ctx: ezflow.GraphContext) -> None:
    sub = await ctx.subscriber("/eos/closed")
    async with await ctx.publisher("/eos/closed") as pub:
        await pub.publish(0)
    await sub.aclose()
    assert sub.recv_nowait() == 0
    with pytest.raises(ezflow.ClosedResourceError):
        await sub.recv()


# -- units and graphs (real processes) ------------------------------------------------------


def _run(runner: ezflow.GraphRunner, timeout: float = 60) -> None:
    async def run() -> None:
        async with runner:
            await asyncio.wait_for(runner.wait(), timeout)

    ezflow.lowlevel.run_coroutine(run())


def test_complete_ends_the_source_only_and_every_message_arrives() -> None:
    """Issue 13's graph: a source publishes 2,000 and raises Complete, two relays each
    in their own process, a sink ends the graph with NormalTermination after 2,000:
    exactly 2,000 in order, 20 times - as 20 independent chains, 5 per graph (a graph
    start costs more than its 5 chains; the last sink of a graph to get its 2,000 ends
    it)."""
    count, width = 2000, 5
    for run in range(4):
        settings = SinkSettings(end_after=count, group=f"complete{run}", group_size=width)
        (components, connections, processes), sinks = chains(count, width, settings)
        runner = ezflow.GraphRunner(
            components,
            connections=connections,
            process_components=processes,
            graph_address="127.0.0.1:0",
        )
        _run(runner)
        assert [sink.received == list(range(count)) for sink in sinks] == [True] * width
        assert runner.completed_by is not None and runner.completed_by.startswith("SINK")


def test_end_when_done_ends_the_graph_by_itself() -> None:
    (components, connections, processes), sinks = chains(2000, 1, SinkSettings())
    runner = ezflow.GraphRunner(
        components,
        connections=connections,
        process_components=processes,
        graph_address="127.0.0.1:0",
        end_when_done=True,
    )
    _run(runner)  # returns: nothing raised NormalTermination, nothing failed
    assert runner.completed_by is None
    assert sinks[0].received == list(range(2000))


def test_end_when_done_through_the_cli(tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ezflow",
            "run",
            "--end-when-done",
            "--address",
            "127.0.0.1:0",
            f"{GRAPHS}:chain_from_env",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, ENV_RECORD: str(record)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(record.read_text()) == list(range(2000))


def test_replayer_through_three_processes_ends_when_done(tmp_path: Path) -> None:
    path = tmp_path / "numbers.rec"
    codec = ezflow.lowlevel.Codec()
    with path.open("wb") as file:
        file.write(msgpack.packb({"format": "ezflow-recording", "version": 1, "created": 0.0}))
        for i in range(500):
            file.write(msgpack.packb([i * 1000, codec.encode(i).to_bytes()]))
    replayer, relay, sink = Replayer(path=str(path), rate="max"), Relay(), Sink(SinkSettings())
    runner = ezflow.GraphRunner(
        REPLAY=replayer,
        RELAY=relay,
        SINK=sink,
        connections=[(replayer.OUTPUT, relay.INPUT), (relay.OUTPUT, sink.INPUT)],
        process_components=[replayer, relay],
        graph_address="127.0.0.1:0",
        end_when_done=True,
    )
    _run(runner)
    assert sink.received == list(range(500))


def _start(scenario: str, outdir: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, GRAPHS, scenario, str(outdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **env},
    )


def _wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"exited ({process.returncode}): {process.communicate()[1]}")
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.02)


def test_sigint_during_a_burst_delivers_everything_accepted(tmp_path: Path) -> None:
    process = _start("burst", tmp_path)
    try:
        _wait_for(tmp_path / "running", process)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 0, err
    sent = int((tmp_path / "running.sent").read_text())
    received = json.loads((tmp_path / "received.json").read_text())
    # Every message the source published got through both edges, in order (the one
    # being published when it was cancelled may have gone too).
    assert sent >= 100
    assert received == list(range(len(received)))
    assert len(received) in (sent, sent + 1)
    assert "drain short" not in err


def test_second_sigint_stops_at_once(tmp_path: Path) -> None:
    # A sink that takes 0.2 s per message: draining what is in flight would take ~25 s.
    process = _start("slow", tmp_path, EZFLOW_DRAIN_TIMEOUT="60")
    try:
        _wait_for(tmp_path / "running", process)
        process.send_signal(signal.SIGINT)
        time.sleep(0.3)
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert elapsed < 10, err
    # ezflow.run raised KeyboardInterrupt, printed nothing: the script died of SIGINT
    # (a shell says 130), after one line saying what the stop cut.
    assert process.returncode == -signal.SIGINT, err
    err = without_shm_notices(err)
    assert err.count("stopped now: ") == 1, err
    assert "message(s) received and not handled were cut" in err
    assert "Traceback" not in err


async def test_drain_timeout_cuts_and_counts_in_one_line(
    server: ezflow.GraphServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    components, connections, _ = burst(tmp_path, 0.05)
    runner = ezflow.GraphRunner(
        components,
        connections=connections,
        graph_address=server.address,
        force_single_process=True,
        drain_timeout=0.3,
    )
    async with runner:
        watch = await runner.context.subscriber("BURST/OUTPUT", leaky=True)
        await asyncio.wait_for(watch.recv(), 10)  # flowing: the slow sink has a backlog
        started = time.monotonic()
        await runner.stop()
    assert time.monotonic() - started < 3
    lines = [r.getMessage() for r in caplog.records if "drain short" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("the drain timeout (0.3 s) cut the graph's drain short: ")
    assert "main: " in lines[0]


class Functions(ezflow.Unit):
    """Complete ends one function: `first` stops after 3 messages, `every` goes on;
    `five` returns after 5 messages (OUTPUT ends); `pause` raises Complete at once."""

    INPUT = ezflow.InputStream(int)
    OUTPUT = ezflow.OutputStream(int)

    def initialize(self) -> None:
        self.first: list[int] = []
        self.every: list[int] = []

    @ezflow.subscriber(INPUT)
    def take_first(self, value: int) -> None:
        self.first.append(value)
        if len(self.first) == 3:
            raise ezflow.Complete

    @ezflow.subscriber(INPUT)
    async def take_every(self, value: int) -> None:
        self.every.append(value)

    @ezflow.publisher(OUTPUT)
    async def five(self) -> AsyncIterator[tuple[Any, int]]:
        for i in range(5):
            yield self.OUTPUT, i

    @ezflow.task
    async def pause(self) -> None:
        raise ezflow.Complete


async def test_complete_ends_one_function_and_outputs_end(server: ezflow.GraphServer) -> None:
    source, unit, sink = Numbers(CountSettings(10)), Functions(), Sink(SinkSettings())
    runner = ezflow.GraphRunner(
        SOURCE=source,
        UNIT=unit,
        SINK=sink,
        connections=[(source.OUTPUT, unit.INPUT), (unit.OUTPUT, sink.INPUT)],
        graph_address=server.address,
        force_single_process=True,
        end_when_done=True,
    )
    async with runner:
        # Ends by itself: SOURCE's end ends UNIT's input; then nothing may publish to
        # UNIT/OUTPUT (`five` returned, `pause` raised Complete), so SINK's input ends.
        await asyncio.wait_for(runner.wait(), 20)
    assert runner.completed_by is None  # Complete ended functions, not the graph
    assert unit.first == [0, 1, 2]
    assert unit.every == list(range(10))
    assert sink.received == [0, 1, 2, 3, 4]


class _CountingSink(ezflow.Unit):
    INPUT = ezflow.InputStream(int)

    def initialize(self) -> None:
        self.taken: list[int] = []

    @ezflow.subscriber(INPUT)
    async def take(self, value: int) -> None:
        self.taken.append(value)


async def test_a_unit_process_that_reads_its_start_and_stop_together_still_drains(
    server: ezflow.GraphServer,
) -> None:
    """A unit process that reads the parent's start and stop in one go (a burst that
    ended the graph while that process was busy) still starts its input loops, so that
    the drain delivers what its lossless edges accepted, instead of cutting all of it.
    The process's serving coroutine, on this loop, with the parent's side of its control
    socket played here."""
    from ezflow._units._process import _frame, _read_frame, _serve  # noqa: PLC0415

    sink = _CountingSink()
    sink.path = "SINK"
    ours, theirs = socket.socketpair()
    boot = {"address": list(server.address), "name": "p-sink", "drain": 5.0}
    loop = asyncio.get_running_loop()
    serving = asyncio.ensure_future(_serve(theirs, boot, [sink], None))
    reader, writer = await asyncio.open_connection(sock=ours)
    try:
        said = await asyncio.wait_for(_read_frame(reader), 10)
        assert said is not None and said["op"] == "ready", said
        async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
            pub = await ctx.publisher("SINK/INPUT")
            await asyncio.wait_for(pub.wait_for_channels(1), 10)
            for i in range(200):  # accepted by the lossless edge, before the start
                await asyncio.wait_for(pub.publish(i), 5)
            writer.write(_frame({"op": "start"}) + _frame({"op": "stop", "drain": 5.0}))
            await asyncio.sleep(0.1)
        code = await asyncio.wait_for(serving, 15)
        assert code == 0
        assert sink.taken == list(range(200))
    finally:
        serving.cancel()
        loop.remove_signal_handler(signal.SIGTERM)  # (the process's own, set by _serve)
        writer.close()
