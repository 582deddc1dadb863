"""Noise: every figure is the median of several rounds, shown with its spread, and a
difference inside the noise is called "no change".

A *figure* (:class:`Figure`) is what the rounds of one cell measured for one metric:
its median, and its spread, the lowest and the highest round (min-max: with 3 to 5
rounds an interval estimate such as a bootstrap would say no more than the range
does). On a shared machine the rounds of one run differ by tens of percent, and two
runs differ by more (the raw floor of the same code measured 297 k and 1.11 M msgs/s
on two days): only figures of one run, measured in alternation, are compared as
ratios, and two runs are compared with their noise.

Two figures of the same cell (two runs, two git refs, or ezflow and a peer) differ,
by :func:`verdict`, only when both hold:

* their ranges do not overlap, and
* their gain (new/base, inverted for figures where lower is better) is beyond the
  *noise band*: a factor (:func:`spread_factor`: 2 with at least 5 rounds per side, 3
  with fewer, whose ranges underestimate the noise more) times the typical spread of
  the comparison (the median, over every compared cell, of the wider of the two
  relative ranges, :func:`typical_spread`), and at least the given floor
  (``--noise``).

Otherwise it is ``"no change"``. The factor makes a comparison of one ref against
itself (every difference is noise) come out as no change in every cell: simulated
noise (normal or heavy-tailed, cells of unequal noise) flags one cell among 18 in
about one comparison in a thousand, with 4 or 5 rounds per side (one round alone has
no spread: only the floor applies then).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "NO_CHANGE",
    "SPREAD_FACTOR",
    "Figure",
    "figure",
    "ratio_range",
    "samples_of",
    "spread_factor",
    "typical_spread",
    "verdict",
]

#: How many times the typical spread a gain must exceed to count as a change, with at
#: least :data:`MANY_ROUNDS` rounds per side; fewer rounds: :data:`FEW_ROUNDS_FACTOR`.
SPREAD_FACTOR: Final = 2.0
FEW_ROUNDS_FACTOR: Final = 3.0
MANY_ROUNDS: Final = 5
#: The verdict for a difference inside the noise.
NO_CHANGE: Final = "no change"


@dataclass(frozen=True, slots=True)
class Figure:
    """The rounds of one figure: their median and range."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    @property
    def log_spread(self) -> float:
        """``log(high / low)``: the relative width of the range (0 for one round)."""
        return math.log(self.high / self.low) if self.low > 0 else 0.0

    @property
    def half_spread_percent(self) -> float:
        """Half the range, in percent of the median (the ``±`` of the tables)."""
        median = self.median
        return 50.0 * (self.high - self.low) / median if median else 0.0

    def text(self, fmt: Callable[[float], str], *, compact: bool = False) -> str:
        """``median (low-high)``, or ``median ±N%`` when *compact*; the median alone
        for a single round."""
        if len(self.samples) < 2:
            return fmt(self.median)
        if compact:
            return f"{fmt(self.median)} ±{self.half_spread_percent:.0f}%"
        return f"{fmt(self.median)} ({fmt(self.low)}-{fmt(self.high)})"


def figure(samples: Iterable[float | None]) -> Figure | None:
    """The figure of *samples* (the rounds that measured it; None ones are left out),
    or None when no round did."""
    kept = tuple(float(value) for value in samples if value is not None)
    return Figure(kept) if kept else None


def typical_spread(pairs: Iterable[tuple[Figure, Figure]]) -> float:
    """The median over *pairs* of the wider of the two relative ranges
    (:attr:`Figure.log_spread`): how much the rounds of this comparison vary."""
    widths = [max(base.log_spread, new.log_spread) for base, new in pairs]
    return float(statistics.median(widths)) if widths else 0.0


def spread_factor(rounds: int) -> float:
    """The noise band's factor for figures of *rounds* rounds (the fewer side's)."""
    return SPREAD_FACTOR if rounds >= MANY_ROUNDS else FEW_ROUNDS_FACTOR


def verdict(
    base: Figure,
    new: Figure,
    *,
    higher_is_better: bool,
    floor: float,
    spread: float,
) -> tuple[float | None, str]:
    """(gain, verdict) of *new* against *base*: the gain is ``new/base`` (``base/new``
    when lower is better), so above 1 is better; the verdict is ``"better"`` or
    ``"worse"`` when the ranges do not overlap and ``|log gain|`` exceeds
    ``max(log(1 + floor), factor * spread)`` (*spread*: :func:`typical_spread` of the
    comparison; the factor: :func:`spread_factor` of the fewer rounds), else
    :data:`NO_CHANGE`."""
    before, after = base.median, new.median
    if before <= 0 or after <= 0:
        return None, NO_CHANGE
    gain = after / before if higher_is_better else before / after
    overlap = base.low <= new.high and new.low <= base.high
    rounds = min(len(base.samples), len(new.samples))
    band = max(math.log1p(floor), spread_factor(rounds) * spread)
    if overlap or abs(math.log(gain)) <= band:
        return gain, NO_CHANGE
    return gain, "better" if gain > 1 else "worse"


def ratio_range(ours: Figure, theirs: Figure) -> tuple[float, float, float] | None:
    """(median ratio, lowest, highest) of *ours* / *theirs* over their ranges: the
    ratio of the medians, and the ratios of the extremes (``ours.low / theirs.high``
    to ``ours.high / theirs.low``). None when a side has a zero."""
    if theirs.median <= 0 or theirs.low <= 0:
        return None
    return (ours.median / theirs.median, ours.low / theirs.high, ours.high / theirs.low)


def samples_of(repeats: Sequence[dict[str, float | None]], metric: str) -> Figure | None:
    """The figure of *metric* over a results cell's ``repeats``."""
    return figure(repeat.get(metric) for repeat in repeats)
