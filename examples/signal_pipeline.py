"""A multi-process numpy signal pipeline: generator -> band-pass -> spectrum -> sink.

GENERATOR publishes blocks of a signal made of 7 Hz, 50 Hz and 180 Hz tones plus noise;
BANDPASS (own process) keeps 30-80 Hz with a windowed-sinc FIR filter that carries its
state across blocks; SPECTRUM (own process) publishes the spectrum of the latest two
seconds as a registered dataclass; SINK prints the dominant frequency. Edges between
processes use shared memory (tcp where shm is not available).

    python examples/signal_pipeline.py --duration 2
    ezflow run examples/signal_pipeline.py:graph
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

import ezflow
from ezflow.units import rate_limited


@ezflow.message(name="examples.signal_pipeline.Spectrum")  # one name in every process
@dataclasses.dataclass(frozen=True)
class Spectrum:
    peak_hz: float
    magnitudes: np.ndarray  # travels out-of-band, zero-copy


class GeneratorSettings(ezflow.Settings):
    rate: float = 1000.0  # samples per second
    block: int = 100  # samples per block
    blocks: int = 20


class Generator(ezflow.Unit):
    SETTINGS: GeneratorSettings
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> AsyncIterator[tuple[Any, np.ndarray]]:
        s = self.SETTINGS
        noise = np.random.default_rng(7)
        # Faster than real time (x10): the example should finish in a few seconds.
        async for i in rate_limited(10 * s.rate / s.block, s.blocks):
            t = (i * s.block + np.arange(s.block)) / s.rate
            signal = (
                np.sin(2 * np.pi * 7 * t)
                + np.sin(2 * np.pi * 50 * t)
                + np.sin(2 * np.pi * 180 * t)
                + 0.2 * noise.standard_normal(s.block)
            )
            yield self.OUTPUT, signal


class BandPassSettings(ezflow.Settings):
    rate: float = 1000.0
    low_hz: float = 30.0
    high_hz: float = 80.0
    taps: int = 201


class BandPassState(ezflow.State):
    kernel: np.ndarray
    history: np.ndarray


class BandPass(ezflow.Unit):
    SETTINGS: BandPassSettings
    STATE: BandPassState
    INPUT = ezflow.InputStream(np.ndarray)
    OUTPUT = ezflow.OutputStream(np.ndarray)

    def initialize(self) -> None:
        s = self.SETTINGS
        n = np.arange(s.taps) - (s.taps - 1) / 2
        high = 2 * s.high_hz / s.rate * np.sinc(2 * s.high_hz / s.rate * n)
        low = 2 * s.low_hz / s.rate * np.sinc(2 * s.low_hz / s.rate * n)
        self.STATE.kernel = (high - low) * np.hamming(s.taps)
        self.STATE.history = np.zeros(s.taps - 1)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_block(self, block: np.ndarray) -> AsyncIterator[tuple[Any, np.ndarray]]:
        # Received arrays are read-only views: build a new array, never modify `block`.
        padded = np.concatenate([self.STATE.history, block])
        self.STATE.history = padded[len(block) :]
        yield self.OUTPUT, np.convolve(padded, self.STATE.kernel, mode="valid")


class SpectrumSettings(ezflow.Settings):
    rate: float = 1000.0
    window: int = 2000  # samples in each spectrum


class SpectrumState(ezflow.State):
    samples: np.ndarray


class SpectrumUnit(ezflow.Unit):
    SETTINGS: SpectrumSettings
    STATE: SpectrumState
    INPUT = ezflow.InputStream(np.ndarray)
    OUTPUT = ezflow.OutputStream(Spectrum)

    def initialize(self) -> None:
        self.STATE.samples = np.zeros(self.SETTINGS.window)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_block(self, block: np.ndarray) -> AsyncIterator[tuple[Any, Spectrum]]:
        samples = np.concatenate([self.STATE.samples[len(block) :], block])
        self.STATE.samples = samples
        magnitudes = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
        peak = float(np.fft.rfftfreq(len(samples), 1 / self.SETTINGS.rate)[np.argmax(magnitudes)])
        yield self.OUTPUT, Spectrum(peak_hz=peak, magnitudes=magnitudes)


class SinkSettings(ezflow.Settings):
    blocks: int = 20


class SinkState(ezflow.State):
    received: int = 0
    peak_hz: float = 0.0


class Sink(ezflow.Unit):
    SETTINGS: SinkSettings
    STATE: SinkState
    INPUT = ezflow.InputStream(Spectrum)

    @ezflow.subscriber(INPUT)
    def on_spectrum(self, spectrum: Spectrum) -> None:
        self.STATE.received += 1
        self.STATE.peak_hz = spectrum.peak_hz
        if self.STATE.received == self.SETTINGS.blocks:
            raise ezflow.NormalTermination

    def shutdown(self) -> None:
        print(
            f"{self.STATE.received} spectra received; dominant frequency after the "
            f"band-pass: {self.STATE.peak_hz:.1f} Hz"
        )


def graph(duration: float = 2.0) -> dict[str, Any]:
    """The graph, as the keyword arguments of ezflow.run: what
    `ezflow run examples/signal_pipeline.py:graph` runs (*duration* seconds of signal)."""
    blocks = max(1, int(duration * 1000.0 / 100))
    generator = Generator(GeneratorSettings(blocks=blocks))
    bandpass, spectrum, sink = BandPass(), SpectrumUnit(), Sink(SinkSettings(blocks=blocks))
    return {
        "components": {
            "GENERATOR": generator,
            "BANDPASS": bandpass,
            "SPECTRUM": spectrum,
            "SINK": sink,
        },
        "connections": [
            (generator.OUTPUT, bandpass.INPUT),
            (bandpass.OUTPUT, spectrum.INPUT),
            (spectrum.OUTPUT, sink.INPUT),
        ],
        "process_components": [bandpass, spectrum],  # three processes in all
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds of signal")
    args = parser.parse_args()
    ezflow.run(**graph(args.duration), graph_address="127.0.0.1:0")


if __name__ == "__main__":
    main()
