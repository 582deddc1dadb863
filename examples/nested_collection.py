"""A nested Collection: a smoothing pipeline packaged as one component.

PIPELINE is a Collection with its own INPUT/OUTPUT streams and settings; inside, SMOOTH
(moving average) feeds GAIN, which runs in a process of its own. The collection's
streams are relays: ezflow connects COUNTER -> PIPELINE/SMOOTH and PIPELINE/GAIN ->
PRINTER directly, without copying messages. Halfway through, CONTROL sends GAIN new
settings through its INPUT_SETTINGS stream.

    python examples/nested_collection.py --count 40
    ezflow run examples/nested_collection.py:graph --set PIPELINE.width=2
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Iterable
from typing import Any

import ezflow
from ezflow.units import rate_limited


class CounterSettings(ezflow.Settings):
    count: int = 40


class Counter(ezflow.Unit):
    SETTINGS: CounterSettings
    OUTPUT = ezflow.OutputStream(float)

    @ezflow.publisher(OUTPUT)
    async def count(self) -> AsyncIterator[tuple[Any, float]]:
        async for i in rate_limited(100.0, self.SETTINGS.count):
            yield self.OUTPUT, float(i)


class SmoothSettings(ezflow.Settings):
    width: int = 4


class SmoothState(ezflow.State):
    window: list[float]


class Smooth(ezflow.Unit):
    SETTINGS: SmoothSettings
    STATE: SmoothState
    INPUT = ezflow.InputStream(float)
    OUTPUT = ezflow.OutputStream(float)

    def initialize(self) -> None:
        self.STATE.window = []

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_value(self, value: float) -> AsyncIterator[tuple[Any, float]]:
        window = self.STATE.window
        window.append(value)
        del window[: -self.SETTINGS.width]
        yield self.OUTPUT, sum(window) / len(window)


class GainSettings(ezflow.Settings):
    gain: float = 1.0


class Gain(ezflow.Unit):
    SETTINGS: GainSettings
    INPUT = ezflow.InputStream(float)
    OUTPUT = ezflow.OutputStream(float)

    def on_settings(self, settings: ezflow.Settings) -> None:
        print(f"{self.path}: gain is now {self.SETTINGS.gain}", flush=True)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_value(self, value: float) -> AsyncIterator[tuple[Any, float]]:
        yield self.OUTPUT, value * self.SETTINGS.gain


class PipelineSettings(ezflow.Settings):
    width: int = 4
    gain: float = 1.0


class Pipeline(ezflow.Collection):
    SETTINGS: PipelineSettings
    INPUT = ezflow.InputStream(float)
    OUTPUT = ezflow.OutputStream(float)
    SMOOTH = Smooth()
    GAIN = Gain()

    def configure(self) -> None:
        self.SMOOTH.apply_settings(SmoothSettings(width=self.SETTINGS.width))
        self.GAIN.apply_settings(GainSettings(gain=self.SETTINGS.gain))

    def network(self) -> Iterable[tuple[Any, Any]]:
        return [
            (self.INPUT, self.SMOOTH.INPUT),
            (self.SMOOTH.OUTPUT, self.GAIN.INPUT),
            (self.GAIN.OUTPUT, self.OUTPUT),
        ]

    def process_components(self) -> Iterable[ezflow.Component]:
        return [self.GAIN]


class Control(ezflow.Unit):
    """Sends new gain settings after `count // 2` values."""

    SETTINGS: CounterSettings
    INPUT = ezflow.InputStream(float)
    SETTINGS_OUT = ezflow.OutputStream(GainSettings)

    def initialize(self) -> None:
        self.seen = 0

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(SETTINGS_OUT)
    async def on_value(self, value: float) -> AsyncIterator[tuple[Any, GainSettings]]:
        self.seen += 1
        if self.seen == self.SETTINGS.count // 2:
            yield self.SETTINGS_OUT, GainSettings(gain=10.0)


class PrinterState(ezflow.State):
    received: int = 0
    last: float = 0.0


class Printer(ezflow.Unit):
    SETTINGS: CounterSettings
    STATE: PrinterState
    INPUT = ezflow.InputStream(float)

    @ezflow.subscriber(INPUT)
    def on_value(self, value: float) -> None:
        self.STATE.received += 1
        self.STATE.last = value
        if self.STATE.received == self.SETTINGS.count:
            raise ezflow.NormalTermination

    def shutdown(self) -> None:
        print(f"printer: {self.STATE.received} values, last {self.STATE.last:.2f}")


def graph(count: int = 40) -> dict[str, Any]:
    """The graph, as the keyword arguments of ezflow.run: what
    `ezflow run examples/nested_collection.py:graph` runs."""
    counting = CounterSettings(count=count)
    counter, pipeline = Counter(counting), Pipeline(PipelineSettings(width=4, gain=1.0))
    control, printer = Control(counting), Printer(counting)
    return {
        "components": {
            "COUNTER": counter,
            "PIPELINE": pipeline,
            "CONTROL": control,
            "PRINTER": printer,
        },
        "connections": [
            (counter.OUTPUT, pipeline.INPUT),
            (pipeline.OUTPUT, printer.INPUT),
            (counter.OUTPUT, control.INPUT),
            # A unit's settings are a stream too: CONTROL reconfigures GAIN at run time.
            (control.SETTINGS_OUT, pipeline.GAIN.INPUT_SETTINGS),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=40, help="values to send")
    args = parser.parse_args()
    # An embedded graph server on a free port.
    ezflow.run(**graph(args.count), graph_address="127.0.0.1:0")


if __name__ == "__main__":
    main()
