"""The stock units ezmsg users reach for (TerminateOnTimeout, TerminateOnTotal,
MessageGate) and ezmsg's message-log files read by ezflow (read_ezmsg_log, Replayer),
in real graphs; ezmsg's own encoder writes the log files when ezmsg is installed."""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _waiting import wait_until

import ezflow
from ezflow.units import (
    GateMessage,
    MessageGate,
    MessageGateSettings,
    Replayer,
    ReplayerSettings,
    TerminateOnTimeout,
    TerminateOnTimeoutSettings,
    TerminateOnTotal,
    TerminateOnTotalSettings,
    rate_limited,
    read_ezmsg_log,
)


class Numbers(ezflow.Unit):
    """Publishes 0..COUNT-1, 2 ms apart, then its output ends."""

    COUNT = 30
    OUTPUT = ezflow.OutputStream(int)

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> AsyncIterator[tuple[Any, int]]:
        async for i in rate_limited(500.0, self.COUNT):
            yield self.OUTPUT, i


class Collect(ezflow.Unit):
    INPUT = ezflow.InputStream()

    def initialize(self) -> None:
        self.received: list[Any] = []
        self.times: list[float] = []

    @ezflow.subscriber(INPUT)
    def on_message(self, message: Any) -> None:
        self.received.append(message)
        self.times.append(time.monotonic())


async def test_terminate_on_timeout_ends_once_input_is_idle(server: ezflow.GraphServer) -> None:
    source, collect = Numbers(), Collect()
    stop = TerminateOnTimeout(TerminateOnTimeoutSettings(time=0.3, poll_rate=20.0))
    async with ezflow.GraphRunner(
        SOURCE=source,
        COLLECT=collect,
        STOP=stop,
        connections=[(source.OUTPUT, collect.INPUT), (source.OUTPUT, stop.INPUT)],
        graph_address=server.address,
    ) as runner:
        await asyncio.wait_for(runner.wait(), 20)
        ended = time.monotonic()
    assert runner.completed_by == "STOP"
    assert collect.received == list(range(Numbers.COUNT))  # idle only after the last
    idle = ended - collect.times[-1]
    assert 0.3 <= idle < 3.0


async def test_terminate_on_timeout_waits_for_the_first_message(
    server: ezflow.GraphServer,
) -> None:
    # ezmsg's rule: no message yet is not idle.
    stop = TerminateOnTimeout(TerminateOnTimeoutSettings(time=0.05, poll_rate=50.0))
    async with ezflow.GraphRunner(STOP=stop, graph_address=server.address) as runner:
        await asyncio.sleep(0.4)  # a window: the unit may not end the graph in it
        assert runner.completed_by is None
        publisher = await runner.context.publisher("STOP/INPUT")
        await publisher.publish(1)
        await asyncio.wait_for(runner.wait(), 10)
    assert runner.completed_by == "STOP"


async def test_terminate_on_total_counts_messages_and_takes_a_new_total(
    server: ezflow.GraphServer,
) -> None:
    stop = TerminateOnTotal(TerminateOnTotalSettings(total=None))
    async with ezflow.GraphRunner(STOP=stop, graph_address=server.address) as runner:
        messages = await runner.context.publisher("STOP/INPUT_MESSAGE")
        totals = await runner.context.publisher("STOP/INPUT_TOTAL")
        for i in range(5):
            await messages.publish(np.zeros((7, 3)) + i)  # one message, whatever its shape
        await asyncio.sleep(0.2)  # a window: the unit may not end the graph in it
        assert runner.completed_by is None  # no total yet
        await totals.publish(5)  # already reached: ends at once
        await asyncio.wait_for(runner.wait(), 10)
    assert runner.completed_by == "STOP"
    assert stop.STATE.received == 5


def test_stock_settings_are_checked() -> None:
    with pytest.raises(ezflow.ConfigurationError, match="time=0"):
        TerminateOnTimeoutSettings(time=0)
    with pytest.raises(ezflow.ConfigurationError, match="total=-1"):
        TerminateOnTotalSettings(total=-1)
    with pytest.raises(ezflow.ConfigurationError, match="default_after=0"):
        MessageGateSettings(default_after=0)


class LongNumbers(Numbers):
    """Numbers for 4 s: still publishing when a test reopens a gate on a loaded machine
    (30 numbers end 40 ms after the tenth)."""

    COUNT = 2000


async def test_message_gate_in_its_own_process(server: ezflow.GraphServer) -> None:
    # Starts open, closes by itself after 10 messages (default_after), and a
    # GateMessage opens it again; the gate runs in a process of its own.
    source, collect = LongNumbers(), Collect()
    gate = MessageGate(MessageGateSettings(start_open=True, default_open=False, default_after=10))
    async with ezflow.GraphRunner(
        SOURCE=source,
        GATE=gate,
        COLLECT=collect,
        connections=[(source.OUTPUT, gate.INPUT), (gate.OUTPUT, collect.INPUT)],
        process_components=[gate],
        graph_address=server.address,
    ) as runner:
        assert "GATE" in runner.processes
        for _ in range(200):
            if len(collect.received) >= 10:
                break
            await asyncio.sleep(0.01)
        control = await runner.context.publisher("GATE/INPUT_GATE")
        await control.publish(GateMessage(open=True))
        await asyncio.sleep(0.3)
        await runner.stop()
    received = collect.received
    assert received[:10] == list(range(10))
    later = received[10:]
    assert later and later == sorted(later) and later[0] > 10  # reopened mid-stream
    assert len(later) <= 10  # and closed again after 10 more


async def test_message_gate_takes_a_bool_and_refuses_anything_else(
    server: ezflow.GraphServer,
) -> None:
    gate, collect = MessageGate(), Collect()  # ezmsg's default: closed
    async with ezflow.GraphRunner(
        GATE=gate,
        COLLECT=collect,
        connections=[(gate.OUTPUT, collect.INPUT)],
        graph_address=server.address,
    ) as runner:
        data = await runner.context.publisher("GATE/INPUT")
        control = await runner.context.publisher("GATE/INPUT_GATE")
        await data.publish("dropped")
        await control.publish(True)
        await wait_until(lambda: gate.STATE.open, "the gate opens")
        await data.publish("passed")
        await wait_until(lambda: collect.received, "a message passes the gate")
        await control.publish("open please")
        with pytest.raises(ezflow.UnitError, match="INPUT_GATE takes a GateMessage or a bool"):
            await asyncio.wait_for(runner.wait(), 10)
    assert collect.received == ["passed"]
    assert gate.STATE.discarded == 1 and gate.STATE.passed == 1


# -- ezmsg message logs ---------------------------------------------------------------------


def _array(value: np.ndarray) -> dict[str, Any]:
    return {
        "_type": "_ndarray",
        "dtype": str(value.dtype),
        "shape": list(value.shape),
        "data": base64.b64encode(np.ascontiguousarray(value).data).decode("ascii"),
    }


def write_log_by_hand(path: Path, messages: list[Any]) -> None:
    """The format as ezmsg's messagecodec writes it (arrays and plain JSON only)."""
    lines = [{"ts": 1000.0, "obj": {"_type": "ezmsg.util.messagecodec:LogStart"}}]
    for i, message in enumerate(messages):
        obj = _array(message) if isinstance(message, np.ndarray) else message
        lines.append({"ts": 1000.5 + i * 0.25, "obj": obj})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_read_ezmsg_log_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    write_log_by_hand(path, [np.arange(6.0).reshape(2, 3), {"k": [1, 2]}, "text"])
    records = list(read_ezmsg_log(str(path)))
    assert [offset for offset, _ in records] == [0.0, 0.25, 0.5]
    np.testing.assert_array_equal(records[0][1], np.arange(6.0).reshape(2, 3))
    assert records[1][1] == {"k": [1, 2]} and records[2][1] == "text"


def test_a_bad_line_names_file_and_line_after_the_good_ones(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    write_log_by_hand(path, [1, 2, 3])
    with path.open("a") as file:
        file.write('{"ts": 1002.0, "obj": {"_type": "_ndarray", "dtype": "<f8", "da')  # cut
    read: list[Any] = []
    with pytest.raises(ezflow.ProtocolError, match=rf"{path}, line 5: not a message"):
        for _, message in read_ezmsg_log(str(path)):
            read.append(message)
    assert read == [1, 2, 3]  # nothing before the bad line is lost


def test_pickled_objects_need_consent(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    pickled = {"_type": "_pickle", "data": base64.b64encode(pickle.dumps({1, 2})).decode()}
    write_log_by_hand(path, [pickled])
    with pytest.raises(ezflow.ProtocolError, match="allow_pickle=True"):
        list(read_ezmsg_log(str(path)))
    assert [m for _, m in read_ezmsg_log(str(path), allow_pickle=True)] == [{1, 2}]


def test_a_class_that_cannot_be_imported_is_named(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    write_log_by_hand(path, [{"_type": "no_such_pkg.mod:Thing", "x": 1}])
    with pytest.raises(ezflow.ProtocolError, match=r"line 2: class no_such_pkg.mod:Thing cannot"):
        list(read_ezmsg_log(str(path)))
    write_log_by_hand(path, [{"_type": "pathlib:Path", "x": 1}])  # importable, not a dataclass
    with pytest.raises(ezflow.ProtocolError, match="not a dataclass; refusing"):
        list(read_ezmsg_log(str(path)))


@pytest.fixture
def ezmsg_log(tmp_path: Path) -> tuple[Path, list[Any]]:
    """A log written with ezmsg's own encoder: AxisArrays (dataclasses with arrays inside)
    and a dict, after ezmsg's LogStart line."""
    pytest.importorskip("ezmsg.util.messagelogger", reason="needs ezflow-pubsub[ezmsg]")
    from ezmsg.util.messagecodec import LogStart, MessageEncoder  # noqa: PLC0415
    from ezmsg.util.messages.axisarray import AxisArray  # noqa: PLC0415

    messages: list[Any] = [
        AxisArray(
            np.arange(12.0).reshape(4, 3) + i,
            dims=["time", "ch"],
            axes={"time": AxisArray.TimeAxis(fs=100.0, offset=i * 0.04)},
            key=f"block{i}",
        )
        for i in range(3)
    ] + [{"event": "end"}]
    path = tmp_path / "ezmsg.log"
    with path.open("w") as file:
        for i, obj in enumerate([LogStart(), *messages]):
            file.write(json.dumps({"ts": 50.0 + i * 0.01, "obj": obj}, cls=MessageEncoder) + "\n")
    return path, messages


def test_read_a_log_written_by_ezmsg(ezmsg_log: tuple[Path, list[Any]]) -> None:
    path, messages = ezmsg_log
    records = list(read_ezmsg_log(str(path)))
    assert len(records) == len(messages)
    for (_, got), want in zip(records[:3], messages[:3], strict=True):
        assert type(got) is type(want) and got.dims == want.dims and got.key == want.key
        np.testing.assert_array_equal(got.data, want.data)
        assert got.axes["time"].gain == pytest.approx(want.axes["time"].gain)
        assert got.axes["time"].offset == pytest.approx(want.axes["time"].offset)
    assert records[3][1] == {"event": "end"}


async def test_replayer_plays_an_ezmsg_log(
    server: ezflow.GraphServer, ezmsg_log: tuple[Path, list[Any]]
) -> None:
    path, messages = ezmsg_log
    replayer = Replayer(ReplayerSettings(path=str(path), rate="max", complete=True))
    collect = Collect()
    async with ezflow.GraphRunner(
        REPLAY=replayer,
        COLLECT=collect,
        connections=[(replayer.OUTPUT, collect.INPUT)],
        graph_address=server.address,
    ) as runner:
        await asyncio.wait_for(runner.wait(), 20)
    assert runner.completed_by == "REPLAY"
    received = collect.received
    assert len(received) == len(messages)
    for got, want in zip(received[:3], messages[:3], strict=True):
        assert got.key == want.key and got.dims == want.dims  # AxisArray, carried by ezflow
        np.testing.assert_array_equal(got.data, want.data)
    assert received[3] == {"event": "end"}
