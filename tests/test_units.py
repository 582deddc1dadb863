"""Stock units (ezflow.units): recorder/replayer, TerminateAfter, Clock, DebugLog,
rate_limited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ezflow
from ezflow.units import (
    Clock,
    DebugLog,
    Recorder,
    Replayer,
    TerminateAfter,
    TerminateAfterSettings,
    rate_limited,
    read_recording,
)


class Blocks(ezflow.Unit):
    """Publishes `COUNT` messages 5 ms apart: arrays, then a dict, alternately."""

    COUNT = 40
    OUTPUT = ezflow.OutputStream()

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> AsyncIterator[tuple[Any, Any]]:
        async for i in rate_limited(200.0, self.COUNT):
            yield self.OUTPUT, np.arange(4.0) + i if i % 2 == 0 else {"index": i, "tag": "x"}


class Collect(ezflow.Unit):
    INPUT = ezflow.InputStream()

    def initialize(self) -> None:
        self.received: list[Any] = []
        self.times: list[float] = []

    @ezflow.subscriber(INPUT)
    def on_message(self, message: Any) -> None:
        self.received.append(message)
        self.times.append(time.monotonic())


def expected(i: int) -> Any:
    return np.arange(4.0) + i if i % 2 == 0 else {"index": i, "tag": "x"}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return bool(a == b)


async def test_recorder_replayer_round_trip(server: ezflow.GraphServer, tmp_path: Path) -> None:
    path = str(tmp_path / "blocks.rec")
    count = Blocks.COUNT
    source, recorder, stop = Blocks(), Recorder(path=path), TerminateAfter(count=count)
    async with ezflow.GraphRunner(
        SOURCE=source,
        RECORD=recorder,
        STOP=stop,
        connections=[(source.OUTPUT, recorder.INPUT), (source.OUTPUT, stop.INPUT)],
        process_components=[source],
        graph_address=server.address,
    ) as runner:
        await asyncio.wait_for(runner.wait(), 20)
    records = list(read_recording(path))
    assert len(records) == count
    assert all(same(message, expected(i)) for i, (_, message) in enumerate(records))
    offsets = [offset for offset, _ in records]
    assert offsets == sorted(offsets)
    recorded_span = offsets[-1] - offsets[0]
    assert recorded_span > 0.1  # 40 messages 5 ms apart

    for rate in ("recorded", "max"):
        replayer, collect = Replayer(path=path, rate=rate, complete=False), Collect()
        stop = TerminateAfter(count=count)
        async with ezflow.GraphRunner(
            REPLAY=replayer,
            COLLECT=collect,
            STOP=stop,
            connections=[(replayer.OUTPUT, collect.INPUT), (replayer.OUTPUT, stop.INPUT)],
            process_components=[replayer],
            graph_address=server.address,
        ) as runner:
            await asyncio.wait_for(runner.wait(), 20)
        assert len(collect.received) == count, rate
        assert all(same(m, expected(i)) for i, m in enumerate(collect.received)), rate
        span = collect.times[-1] - collect.times[0]
        if rate == "recorded":
            assert span > 0.8 * recorded_span
        else:
            assert span < 0.5 * recorded_span


def test_read_recording_refuses_other_files(tmp_path: Path) -> None:
    path = tmp_path / "not.rec"
    path.write_bytes(b"\x93\x01\x02\x03")
    with pytest.raises(ezflow.ProtocolError, match="is not an ezflow recording"):
        list(read_recording(str(path)))


async def test_terminate_after_timeout(server: ezflow.GraphServer) -> None:
    stop = TerminateAfter(seconds=0.2)
    started = time.monotonic()
    async with ezflow.GraphRunner(STOP=stop, graph_address=server.address) as runner:
        await asyncio.wait_for(runner.wait(), 10)
    assert 0.2 <= time.monotonic() - started < 5
    assert runner.completed_by == "STOP"


def test_terminate_after_needs_a_limit() -> None:
    with pytest.raises(ezflow.ConfigurationError, match="count=N"):
        TerminateAfterSettings()
    with pytest.raises(ezflow.ConfigurationError, match="must be >= 1"):
        TerminateAfterSettings(count=0)


async def test_clock_and_debug_log(
    server: ezflow.GraphServer, capsys: pytest.CaptureFixture[str]
) -> None:
    clock, log, collect = Clock(rate=500.0, count=5, complete=True), DebugLog(name="TAP"), Collect()
    async with ezflow.GraphRunner(
        CLOCK=clock,
        LOG=log,
        COLLECT=collect,
        connections=[(clock.OUTPUT, log.INPUT), (log.OUTPUT, collect.INPUT)],
        graph_address=server.address,
    ) as runner:
        await asyncio.wait_for(runner.wait(), 10)
    assert runner.completed_by == "CLOCK"
    assert collect.received == [0, 1, 2, 3, 4]  # passed through, in order
    out = capsys.readouterr().out
    assert "TAP LOG: 0\n" in out and "TAP LOG: 4\n" in out


async def test_rate_limited_paces_without_bursts() -> None:
    started = time.monotonic()
    ticks = [i async for i in rate_limited(200.0, 20)]
    assert ticks == list(range(20))
    assert time.monotonic() - started >= 19 / 200.0 * 0.9
    # A consumer that falls behind does not get a burst afterwards.
    gaps = []
    last = time.monotonic()
    async for i in rate_limited(100.0, 6):
        now = time.monotonic()
        gaps.append(now - last)
        last = now
        if i == 1:
            await asyncio.sleep(0.1)  # ten periods late
    # The schedule restarted at the late tick (2) instead of catching up ten periods: the
    # three ticks after it span about three periods. (Not each gap: a tick that the load
    # delays by less than a period is followed by the next one at once, on schedule.)
    assert sum(gaps[3:]) > 3 * 0.01 * 0.8
    with pytest.raises(ezflow.ConfigurationError, match="positive"):
        async for _ in rate_limited(0):
            pass
