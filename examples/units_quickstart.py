"""Declarative quickstart: a sine generator and a scaler, as units, in one process.

The graph from the README: SINE publishes blocks of samples, SCALE doubles them, CHECK
verifies every block arrived in order and ends the graph after the last one.

    python examples/units_quickstart.py --blocks 200
    ezflow run examples/units_quickstart.py:graph
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

import ezflow
from ezflow.units import rate_limited


class SineSettings(ezflow.Settings):
    rate: float = 10_000.0  # samples per second
    block: int = 100  # samples per block
    blocks: int = 100  # blocks, then stop


class Sine(ezflow.Unit):
    SETTINGS: SineSettings
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> AsyncIterator[tuple[Any, np.ndarray]]:
        s = self.SETTINGS
        async for i in rate_limited(s.rate / s.block, s.blocks):
            t = (i * s.block + np.arange(s.block)) / s.rate
            yield self.OUTPUT, np.sin(2 * np.pi * 5.0 * t)


class Scale(ezflow.Unit):
    INPUT = ezflow.InputStream(np.ndarray)
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_samples(self, msg: np.ndarray) -> AsyncIterator[tuple[Any, np.ndarray]]:
        yield self.OUTPUT, msg * 2.0


class CheckSettings(ezflow.Settings):
    blocks: int = 100


class CheckState(ezflow.State):
    received: int = 0
    peak: float = 0.0


class Check(ezflow.Unit):
    SETTINGS: CheckSettings
    STATE: CheckState
    INPUT = ezflow.InputStream(np.ndarray)

    @ezflow.subscriber(INPUT)
    def on_samples(self, msg: np.ndarray) -> None:
        self.STATE.received += 1
        self.STATE.peak = max(self.STATE.peak, float(np.max(np.abs(msg))))
        if self.STATE.received == self.SETTINGS.blocks:
            raise ezflow.NormalTermination  # ends the whole graph normally

    def shutdown(self) -> None:
        print(f"received {self.STATE.received} blocks, peak {self.STATE.peak:.3f}")


def graph(blocks: int = 100) -> dict[str, Any]:
    """The graph, as the keyword arguments of ezflow.run: what
    `ezflow run examples/units_quickstart.py:graph` runs."""
    sine = Sine(SineSettings(blocks=blocks))
    scale, check = Scale(), Check(CheckSettings(blocks=blocks))
    return {
        "components": {"SINE": sine, "SCALE": scale, "CHECK": check},
        "connections": [(sine.OUTPUT, scale.INPUT), (scale.OUTPUT, check.INPUT)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=100, help="blocks to publish")
    args = parser.parse_args()
    # An embedded graph server on a free port.
    ezflow.run(**graph(args.blocks), graph_address="127.0.0.1:0")


if __name__ == "__main__":
    main()
