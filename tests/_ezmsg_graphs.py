"""ezmsg units and systems for tests/test_ezmsg.py (importable by unit processes).

Imports ezmsg (not ezmsg-sigproc: tests/_sigproc_graphs.py has what needs it, so the
others run with ezmsg alone, 3.9 included): import this module only after
``pytest.importorskip("ezmsg.core")``.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import ezmsg.core as ez
import numpy as np
from ezmsg.util.messages.axisarray import AxisArray

import ezflow

RATE = 500.0
BLOCKS = 12
BLOCK = 50
CHANNELS = 3


def blocks() -> Iterator[AxisArray]:
    """The signal: deterministic noise, in AxisArray blocks along ``time``."""
    rng = np.random.default_rng(7)
    for index in range(BLOCKS):
        yield AxisArray(
            rng.standard_normal((BLOCK, CHANNELS)),
            dims=["time", "ch"],
            axes={"time": AxisArray.TimeAxis(fs=RATE, offset=index * BLOCK / RATE)},
            attrs={"block": index},
            key="source",
        )


class SourceSettings(ez.Settings):
    blocks: int = BLOCKS


class Source(ez.Unit):
    """An ezmsg publisher: the blocks, then ezmsg's Complete (ends just this function)."""

    SETTINGS = SourceSettings
    OUTPUT_SIGNAL = ez.OutputStream(AxisArray)

    @ez.publisher(OUTPUT_SIGNAL)
    async def generate(self) -> AsyncGenerator[Any, None]:
        for block in blocks():
            yield self.OUTPUT_SIGNAL, block
        raise ez.Complete


class SinkState(ez.State):
    received: list[AxisArray]


class Sink(ez.Unit):
    """An ezmsg subscriber that keeps what it receives (in the calling process)."""

    STATE = SinkState
    INPUT_SIGNAL = ez.InputStream(AxisArray)

    async def initialize(self) -> None:
        self.STATE.received = []
        self.received = self.STATE.received

    @ez.subscriber(INPUT_SIGNAL)
    async def on_signal(self, message: AxisArray) -> None:
        self.STATE.received.append(message)


class EzflowSink(ezflow.Unit):
    """An ezflow subscriber, for a graph mixing both kinds of units."""

    INPUT = ezflow.InputStream(AxisArray)

    def initialize(self) -> None:
        self.received: list[AxisArray] = []

    @ezflow.subscriber(INPUT)
    def on_signal(self, message: AxisArray) -> None:
        self.received.append(message)


__all__ = [
    "EzflowSink",
    "Sink",
    "Source",
    "blocks",
]


class LifecycleSettings(ez.Settings):
    limit: int = 100


class LifecycleState(ez.State):
    count: int = 0


class Lifecycle(ez.Unit):
    """Settings through its own INPUT_SETTINGS subscriber (as ezmsg-baseproc's units do),
    a task, a thread, a subscriber ending the graph with ezmsg's NormalTermination, shutdown."""

    SETTINGS = LifecycleSettings
    STATE = LifecycleState
    INPUT_SETTINGS = ez.InputStream(LifecycleSettings)
    INPUT = ez.InputStream(int)

    async def initialize(self) -> None:
        self.limits: list[int] = []
        self.applied = asyncio.Event()
        self.task_ran = False
        self.thread_ran = False
        self.shut_down = False

    @ez.subscriber(INPUT_SETTINGS)
    async def on_settings(self, msg: LifecycleSettings) -> None:
        self.apply_settings(msg)
        self.limits.append(msg.limit)
        self.applied.set()

    @ez.task
    async def note(self) -> None:
        self.task_ran = True

    with warnings.catch_warnings():  # ezmsg 3.10 deprecates @thread (it still runs them)
        warnings.simplefilter("ignore", DeprecationWarning)

        @ez.thread
        def work(self) -> None:
            self.thread_ran = True

    @ez.subscriber(INPUT)
    async def on_number(self, number: int) -> None:
        self.STATE.count += 1
        if self.STATE.count == self.SETTINGS.limit:
            raise ez.NormalTermination

    async def shutdown(self) -> None:
        self.shut_down = True
