"""ezmsg vs ezflow on one ezmsg-sigproc graph: ``ezflow perf sigproc``.

(``python -m ezflow._perf._ezmsg_sigproc`` is the same, kept as an alias.) Needs the
``ezmsg`` extra. The same ezmsg system class, unmodified, run by ``ez.run`` and
by ``ezflow.run`` in turn (``--rounds`` times each, alternating; medians reported), in the
same process layout: a source and a sink in the calling process, ``ButterworthFilter``
and ``Downsample`` each in its own process. The source publishes ``--blocks`` AxisArray
blocks (``--samples`` x ``--channels`` float64, made before timing) as fast as the
graph takes them; the sink times from its first block to its last and writes the figure
to a file. Printed: AxisArray blocks/s at the sink (input blocks per second), per
framework and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import ezmsg.core as ez
import numpy as np
from ezmsg.sigproc.butterworthfilter import ButterworthFilter, ButterworthFilterSettings
from ezmsg.sigproc.downsample import Downsample, DownsampleSettings
from ezmsg.util.messages.axisarray import AxisArray

RATE = 1000.0
#: A run's deadline (seconds): 2000 blocks take a few seconds on either framework.
RUN_TIMEOUT = 600.0
#: How much of a failed run's output its error shows (the last lines).
ERROR_LINES = 20


class SigprocError(RuntimeError):
    """A run of the graph failed or did not end in time, or an option is out of range."""


class SourceSettings(ez.Settings):
    blocks: int = 2000
    samples: int = 50
    channels: int = 8


class Source(ez.Unit):
    SETTINGS = SourceSettings
    OUTPUT_SIGNAL = ez.OutputStream(AxisArray)

    @ez.publisher(OUTPUT_SIGNAL)
    async def generate(self) -> AsyncGenerator[Any, None]:
        s = self.SETTINGS
        rng = np.random.default_rng(0)
        blocks = [
            AxisArray(
                rng.standard_normal((s.samples, s.channels)),
                dims=["time", "ch"],
                axes={"time": AxisArray.TimeAxis(fs=RATE, offset=i * s.samples / RATE)},
            )
            for i in range(s.blocks)
        ]
        for block in blocks:
            yield self.OUTPUT_SIGNAL, block
        raise ez.Complete


class SinkSettings(ez.Settings):
    blocks: int = 2000
    result: str = ""


class SinkState(ez.State):
    seen: int = 0
    first: float = 0.0


class Sink(ez.Unit):
    SETTINGS = SinkSettings
    STATE = SinkState
    INPUT_SIGNAL = ez.InputStream(AxisArray)

    @ez.subscriber(INPUT_SIGNAL)
    async def on_signal(self, message: AxisArray) -> None:
        self.STATE.seen += 1
        if self.STATE.seen == 1:
            self.STATE.first = time.perf_counter()
        if self.STATE.seen == self.SETTINGS.blocks:
            seconds = time.perf_counter() - self.STATE.first
            figure = json.dumps({"blocks": self.SETTINGS.blocks - 1, "seconds": seconds})
            await asyncio.to_thread(Path(self.SETTINGS.result).write_text, figure)
            raise ez.NormalTermination


class PipelineSettings(ez.Settings):
    source: SourceSettings
    sink: SinkSettings


class Pipeline(ez.Collection):
    SETTINGS = PipelineSettings
    SOURCE = Source()
    FILTER = ButterworthFilter(ButterworthFilterSettings(order=4, cutoff=100.0))
    DOWNSAMPLE = Downsample(DownsampleSettings(factor=2))
    SINK = Sink()

    def configure(self) -> None:
        self.SOURCE.apply_settings(self.SETTINGS.source)
        self.SINK.apply_settings(self.SETTINGS.sink)

    def network(self) -> ez.NetworkDefinition:
        return (
            (self.SOURCE.OUTPUT_SIGNAL, self.FILTER.INPUT_SIGNAL),
            (self.FILTER.OUTPUT_SIGNAL, self.DOWNSAMPLE.INPUT_SIGNAL),
            (self.DOWNSAMPLE.OUTPUT_SIGNAL, self.SINK.INPUT_SIGNAL),
        )

    def process_components(self) -> tuple[ez.Component, ...]:
        return (self.FILTER, self.DOWNSAMPLE)


def _run_once(framework: str, blocks: int, samples: int, channels: int) -> float:
    """One run in a fresh interpreter (neither framework leaves state behind); blocks/s."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        sizes = ["--blocks", str(blocks), "--samples", str(samples), "--channels", str(channels)]
        one = [sys.executable, "-m", __spec__.name, "--one", framework, "--result", result]
        try:
            done = subprocess.run(
                [*one, *sizes],
                check=False,
                timeout=RUN_TIMEOUT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        except subprocess.TimeoutExpired:
            raise SigprocError(
                f"the {framework} run did not end within {RUN_TIMEOUT:.0f} s"
            ) from None
        if done.returncode != 0 or not os.path.exists(result):
            tail = "\n".join(done.stderr.splitlines()[-ERROR_LINES:])
            raise SigprocError(
                f"the {framework} run failed (exit {done.returncode}); its last lines:\n{tail}"
            )
        with open(result) as f:
            figure = json.load(f)
    return float(figure["blocks"] / figure["seconds"])


def _one(framework: str, result: str, blocks: int, samples: int, channels: int) -> None:
    system = Pipeline(
        PipelineSettings(
            source=SourceSettings(blocks=blocks, samples=samples, channels=channels),
            sink=SinkSettings(blocks=blocks, result=result),
        )
    )
    if framework == "ezmsg":
        ez.run(SYSTEM=system)
    else:
        import ezflow  # noqa: PLC0415 - only the ezflow side needs it

        ezflow.run(SYSTEM=system, graph_address="127.0.0.1:0")


def run(blocks: int = 2000, samples: int = 50, channels: int = 8, rounds: int = 3) -> None:
    """Run the graph *rounds* times on each framework, alternating, and print the medians;
    raises :class:`SigprocError` for an option out of range or a failed run."""
    for name, value, least in (
        ("--blocks", blocks, 2),  # the sink times from its first block to its last
        ("--samples", samples, 2),  # Downsample halves each block
        ("--channels", channels, 1),
        ("--rounds", rounds, 1),
    ):
        if value < least:
            raise SigprocError(f"{name} {value}: must be at least {least}")
    figures: dict[str, list[float]] = {"ezmsg": [], "ezflow": []}
    for _ in range(rounds):
        for framework, rates in figures.items():
            rates.append(_run_once(framework, blocks, samples, channels))
    ezmsg_rate = statistics.median(figures["ezmsg"])
    ezflow_rate = statistics.median(figures["ezflow"])
    print(
        f"source -> ButterworthFilter -> Downsample -> sink, {blocks} AxisArray blocks "
        f"of {samples}x{channels} float64, medians of {rounds} rounds"
    )
    print(f"  ezmsg {ez.__version__:>10}: {ezmsg_rate:8.0f} blocks/s  {figures['ezmsg']}")
    print(f"  ezflow           : {ezflow_rate:8.0f} blocks/s  {figures['ezflow']}")
    print(f"  ezflow / ezmsg   : {ezflow_rate / ezmsg_rate:.2f}x")


def main(argv: list[str] | None = None) -> None:
    """``python -m ezflow._perf._ezmsg_sigproc``: the alias of ``ezflow perf sigproc``
    (and, with the hidden ``--one``, one run in a fresh interpreter)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=["ezmsg", "ezflow"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        _one(args.one, args.result, args.blocks, args.samples, args.channels)
        return
    try:
        run(args.blocks, args.samples, args.channels, args.rounds)
    except SigprocError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
