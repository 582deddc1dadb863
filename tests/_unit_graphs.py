"""Units for the runner tests, and graphs to run as a script.

Imported by the tests (as ``_unit_graphs``) for in-process runners, and run as
``python tests/_unit_graphs.py SCENARIO JSON_ARGS`` to test ``ezflow.run`` itself
(signals, exit codes). Run as a script, these classes live in ``__main__``, so the unit
processes import this file the way they would import a user's script.

Units leave marker files in ``args["markers"]`` (``shutdown-SINK``, ``pid-SINK``, ...)
so a test can check what ran in which process.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

import ezflow


class MarkerSettings(ezflow.Settings):
    markers: str = ""


class Marked(ezflow.Unit):
    """Writes ``<what>-<path>`` files into the markers directory."""

    SETTINGS: MarkerSettings

    def mark(self, what: str, text: str = "") -> None:
        if self.SETTINGS.markers:
            name = f"{what}-{self.path.replace('/', '_')}"
            Path(self.SETTINGS.markers, name).write_text(text)

    def initialize(self) -> None:
        self.mark("pid", str(os.getpid()))

    def shutdown(self) -> None:
        self.mark("shutdown")


class FrameSource(ezflow.Unit):
    """Publishes 640x480 RGB frames filled with their index, from loaned shared memory."""

    OUTPUT = ezflow.OutputStream(
        object, shm=ezflow.ShmOptions(slot_count=4, slot_size=64 * 1024, max_bytes=64 << 20)
    )

    @ezflow.publisher(OUTPUT)
    async def frames(self) -> AsyncIterator[tuple[Any, Any]]:
        index = 0
        while True:
            frame = await self.loan(self.OUTPUT, (480, 640, 3))
            frame[...] = index % 256
            yield self.OUTPUT, frame
            index += 1
            await asyncio.sleep(0.002)


class Ticker(Marked):
    """Publishes 0, 1, 2, ... every 5 ms, forever."""

    OUTPUT = ezflow.OutputStream(int)

    @ezflow.publisher(OUTPUT)
    async def tick(self) -> AsyncIterator[tuple[Any, int]]:
        index = 0
        while True:
            yield self.OUTPUT, index
            index += 1
            await asyncio.sleep(0.005)


class SinkSettings(MarkerSettings):
    raise_after: int = 0  # raise ValueError after this many messages (0: never)


class SinkState(ezflow.State):
    received: int = 0


class Sink(Marked):
    """Counts messages; marks ``running`` at the first one."""

    SETTINGS: SinkSettings
    STATE: SinkState
    INPUT = ezflow.InputStream(int)

    @ezflow.subscriber(INPUT)
    async def on_message(self, message: int) -> None:
        self.STATE.received += 1
        if self.STATE.received == 1:
            self.mark("running")
        if self.SETTINGS.raise_after and self.STATE.received >= self.SETTINGS.raise_after:
            raise ValueError(f"boom from {self.path} at message {message}")


class CountSettings(ezflow.Settings):
    count: int
    init_delay: float = 0.0  # seconds initialize() takes (to test the start barrier)


class Counter(ezflow.Unit):
    """Publishes 0 .. count-1 as fast as subscribers take them, from the first moment."""

    SETTINGS: CountSettings
    OUTPUT = ezflow.OutputStream(int)

    @ezflow.publisher(OUTPUT)
    async def count(self) -> AsyncIterator[tuple[Any, int]]:
        for index in range(self.SETTINGS.count):
            yield self.OUTPUT, index


class ArraySource(ezflow.Unit):
    """Publishes *count* arrays of *size* bytes (large ones travel through shared-memory
    blocks), then ends."""

    SETTINGS: CountSettings
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def arrays(self) -> AsyncIterator[tuple[Any, np.ndarray]]:
        for index in range(self.SETTINGS.count):
            yield self.OUTPUT, np.full(256 * 1024, index, dtype=np.uint8)


class ArraySinkState(ezflow.State):
    received: int = 0


class ArraySink(ezflow.Unit):
    """Counts the arrays it receives, checking each one's fill."""

    STATE: ArraySinkState
    INPUT = ezflow.InputStream(np.ndarray)

    @ezflow.subscriber(INPUT)
    def on_array(self, message: np.ndarray) -> None:
        assert int(message[0]) == int(message[-1]) == self.STATE.received
        self.STATE.received += 1


class Relay(ezflow.Unit):
    INPUT = ezflow.InputStream(int)
    OUTPUT = ezflow.OutputStream(int)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def relay(self, message: int) -> AsyncIterator[tuple[Any, int]]:
        yield self.OUTPUT, message


class CheckerState(ezflow.State):
    expected: int = 0
    out_of_order: int = 0
    pid: int = 0


class Checker(ezflow.Unit):
    """Expects 0 .. count-1 in order; raises NormalTermination after the last."""

    SETTINGS: CountSettings
    STATE: CheckerState
    INPUT = ezflow.InputStream(int)

    async def initialize(self) -> None:
        self.STATE.pid = os.getpid()
        await asyncio.sleep(self.SETTINGS.init_delay)

    @ezflow.subscriber(INPUT)
    def on_message(self, message: int) -> None:
        state = self.STATE
        if message != state.expected:
            state.out_of_order += 1
        state.expected = message + 1
        if state.expected == self.SETTINGS.count:
            raise ezflow.NormalTermination


class GainSettings(ezflow.Settings):
    gain: float = 1.0


class GainState(ezflow.State):
    gain: float = 0.0
    updates: int = 0


class Gain(ezflow.Unit):
    """OUTPUT = INPUT * gain, where gain changes only through initialize/on_settings."""

    SETTINGS: GainSettings
    STATE: GainState
    INPUT = ezflow.InputStream(float)
    OUTPUT = ezflow.OutputStream(float)

    def initialize(self) -> None:
        self.STATE.gain = self.SETTINGS.gain

    async def on_settings(self, settings: ezflow.Settings) -> None:
        assert isinstance(settings, GainSettings)
        self.STATE.gain = settings.gain
        self.STATE.updates += 1

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def scale(self, message: float) -> AsyncIterator[tuple[Any, float]]:
        yield self.OUTPUT, message * self.STATE.gain


class Window(Marked):
    """A @main method: runs in its process's main thread for `seconds`, then returns
    (which ends the graph)."""

    SETTINGS: SinkSettings

    @ezflow.main
    def show(self) -> None:
        import threading  # noqa: PLC0415

        self.mark("main-thread", str(threading.current_thread() is threading.main_thread()))
        deadline = time.monotonic() + 0.3
        while self.running and time.monotonic() < deadline:
            time.sleep(0.01)


class DiesInInitialize(ezflow.Unit):
    """Its process exits abruptly (no cleanup, no report) while initializing."""

    def initialize(self) -> None:
        os._exit(3)


def forever(args: dict[str, Any]) -> None:
    """TICKER (this process) -> SINK (own process) and MONITOR (this process)."""
    markers = args["markers"]
    ticker = Ticker(MarkerSettings(markers))
    sink = Sink(SinkSettings(markers, raise_after=args.get("raise_after", 0)))
    monitor = Sink(SinkSettings(markers))
    ezflow.run(
        components={"TICKER": ticker, "SINK": sink, "MONITOR": monitor},
        connections=[(ticker.OUTPUT, sink.INPUT), (ticker.OUTPUT, monitor.INPUT)],
        process_components=[sink],
        graph_address=args["address"],
    )


def with_main(args: dict[str, Any]) -> None:
    """A @main unit here and another in its own process; the first to return ends it."""
    markers = args["markers"]
    here, there = Window(SinkSettings(markers)), Window(SinkSettings(markers))
    ezflow.run(
        HERE=here,
        THERE=there,
        process_components=[there],
        graph_address=args["address"],
    )


if __name__ == "__main__":
    scenario, arguments = sys.argv[1], json.loads(sys.argv[2])
    {"forever": forever, "with_main": with_main}[scenario](arguments)
    print("run returned", flush=True)
