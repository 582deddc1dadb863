"""The ezmsg-sigproc pipeline for tests/test_ezmsg.py (importable by unit processes).

Imports ezmsg-sigproc: import this module only after ``pytest.importorskip("ezmsg.sigproc")``.
"""

from __future__ import annotations

import ezmsg.core as ez
from _ezmsg_graphs import Sink, Source, blocks
from ezmsg.sigproc.butterworthfilter import (
    ButterworthFilter,
    ButterworthFilterSettings,
    ButterworthFilterTransformer,
)
from ezmsg.sigproc.downsample import Downsample, DownsampleSettings, DownsampleTransformer
from ezmsg.util.messages.axisarray import AxisArray

FILTER = ButterworthFilterSettings(order=4, cutoff=40.0)
DOWNSAMPLE = DownsampleSettings(factor=2)


def expected() -> list[AxisArray]:
    """The same sigproc processors, called directly on the same blocks."""
    butter = ButterworthFilterTransformer(FILTER)
    down = DownsampleTransformer(DOWNSAMPLE)
    return [down(butter(block)) for block in blocks()]


class PipelineSystem(ez.Collection):
    """The pipeline as ezmsg's Collection-based system class, filter and downsampler
    each in its own process."""

    SOURCE = Source()
    FILTER = ButterworthFilter()
    DOWNSAMPLE = Downsample()
    SINK = Sink()

    def configure(self) -> None:
        self.FILTER.apply_settings(FILTER)
        self.DOWNSAMPLE.apply_settings(DOWNSAMPLE)

    def network(self) -> ez.NetworkDefinition:
        return (
            (self.SOURCE.OUTPUT_SIGNAL, self.FILTER.INPUT_SIGNAL),
            (self.FILTER.OUTPUT_SIGNAL, self.DOWNSAMPLE.INPUT_SIGNAL),
            (self.DOWNSAMPLE.OUTPUT_SIGNAL, self.SINK.INPUT_SIGNAL),
        )

    def process_components(self) -> tuple[ez.Component, ...]:
        return (self.FILTER, self.DOWNSAMPLE)


__all__ = ["DOWNSAMPLE", "FILTER", "ButterworthFilter", "Downsample", "PipelineSystem", "expected"]
