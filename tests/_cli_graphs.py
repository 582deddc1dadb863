"""Graphs for the CLI tests, run with ``ezflow run tests/_cli_graphs.py:OBJECT``.

``TICKER`` is the known graph of the inspection tests: SOURCE publishes an array every
20 ms (an absolute schedule: 50 Hz), RELAY (in a process of its own) doubles it, SINK
takes it::

    TICKER/SOURCE/OUTPUT -> TICKER/RELAY/INPUT
    TICKER/RELAY/OUTPUT  -> TICKER/SINK/INPUT

The functions return graphs that end in a known way (for exit codes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

import ezflow

#: Messages per second of TICKER's source.
RATE = 50.0


class Source(ezflow.Unit):
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def tick(self) -> AsyncIterator[tuple[Any, np.ndarray]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        i = 0
        while True:
            deadline += 1 / RATE
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            yield self.OUTPUT, np.arange(i, i + 4, dtype=np.float64)
            i += 1


class Relay(ezflow.Unit):
    INPUT = ezflow.InputStream(np.ndarray)
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def relay(self, msg: np.ndarray) -> AsyncIterator[tuple[Any, np.ndarray]]:
        yield self.OUTPUT, msg * 2.0


class Sink(ezflow.Unit):
    INPUT = ezflow.InputStream(np.ndarray)

    @ezflow.subscriber(INPUT)
    def take(self, msg: np.ndarray) -> None:
        pass


class Ticker(ezflow.Collection):
    SOURCE = Source()
    RELAY = Relay()
    SINK = Sink()

    def network(self) -> Any:
        return [(self.SOURCE.OUTPUT, self.RELAY.INPUT), (self.RELAY.OUTPUT, self.SINK.INPUT)]

    def process_components(self) -> Any:
        return [self.RELAY]


TICKER = Ticker()


class Finishes(ezflow.Unit):
    @ezflow.task
    async def finish(self) -> None:
        await asyncio.sleep(0.05)
        raise ezflow.NormalTermination


class Fails(ezflow.Unit):
    @ezflow.task
    async def fail(self) -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("the unit failed on purpose")


class Dies(ezflow.Unit):
    @ezflow.task
    async def die(self) -> None:
        await asyncio.sleep(0.05)
        os._exit(3)


def complete() -> dict[str, Any]:
    """Ends normally (a unit raises NormalTermination)."""
    return {"components": {"DONE": Finishes()}}


def failing() -> tuple[dict[str, Any], list[Any]]:
    """Ends with a UnitError."""
    return {"BROKEN": Fails()}, []


def dying() -> dict[str, Any]:
    """Ends with a ProcessDiedError: the unit's own process exits."""
    unit = Dies()
    return {"components": {"DIES": unit}, "process_components": [unit]}


NOT_A_GRAPH = 42


# -- Ctrl-C and failures, as users meet them ------------------------------------------

#: Directory where units of SLOW write ``shutdown-<path>`` when their shutdown() ran.
ENV_MARKERS = "EZFLOW_TEST_MARKERS"


def _mark(unit: ezflow.Unit) -> None:
    directory = os.environ.get(ENV_MARKERS)
    if directory:
        with open(os.path.join(directory, "shutdown-" + unit.path.replace("/", "-")), "w"):
            pass


class Flood(ezflow.Unit):
    OUTPUT = ezflow.OutputStream(int)

    @ezflow.publisher(OUTPUT)
    async def flood(self) -> AsyncIterator[tuple[Any, int]]:
        i = 0
        while True:
            yield self.OUTPUT, i
            i += 1

    def shutdown(self) -> None:
        _mark(self)


class Slow(ezflow.Unit):
    """Takes 0.2 s per message: a drain of what the flood queued takes long."""

    INPUT = ezflow.InputStream(int)

    @ezflow.subscriber(INPUT)
    async def take(self, value: int) -> None:
        await asyncio.sleep(0.2)

    def shutdown(self) -> None:
        _mark(self)


def slow() -> dict[str, Any]:
    """A source flooding a slow sink in its own process: stopping it drains for long."""
    flood, sink = Flood(), Slow()
    return {
        "components": {"FLOOD": flood, "SINK": sink},
        "connections": [(flood.OUTPUT, sink.INPUT)],
        "process_components": [sink],
    }


@dataclasses.dataclass
class Reading:  # deliberately not registered
    value: float


class SendsUnregistered(ezflow.Unit):
    OUTPUT = ezflow.OutputStream()

    @ezflow.publisher(OUTPUT)
    async def send(self) -> AsyncIterator[tuple[Any, Reading]]:
        yield self.OUTPUT, Reading(1.0)  # the line a failure names


class Takes(ezflow.Unit):
    INPUT = ezflow.InputStream()

    @ezflow.subscriber(INPUT)
    def take(self, message: Any) -> None:
        pass


def unregistered() -> dict[str, Any]:
    """Ends with a UnitError: a unit in its own process yields an unregistered class."""
    source, sink = SendsUnregistered(), Takes()
    return {
        "components": {"SOURCE": source, "SINK": sink},
        "connections": [(source.OUTPUT, sink.INPUT)],
        "process_components": [source],
    }
