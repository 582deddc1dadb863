"""Ratios between results: two runs (``ezflow perf compare``) or two frameworks of one
run (the peer table).

A run-to-run comparison looks at every cell both files measured and three figures:
msgs/s (higher is better), paced latency p50 and CPU per message (lower is better). The
*gain* of a figure is ``new/base`` of the medians for msgs/s and ``base/new`` for the
others, so a gain above 1 is always an improvement. Each figure has the spread of its
rounds (:mod:`._noise`): a difference inside the noise - ranges that overlap, or a gain
within the comparison's noise band (2-3 times its typical spread, at least ``noise``) - is
``"no change"``; beyond it, ``"better"`` or ``"worse"``. A worse figure whose gain is
below ``1/(1 + fail)`` is a regression and makes the command exit with status 1, as is
a cell that worked in the base run and fails in the new one.

Figures from two runs are only comparable when the runs measured the same thing on the
same machine under similar load (the results hold the load averages): a run's floor
next to the other's says how far the machine itself moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ._noise import NO_CHANGE, Figure, ratio_range, samples_of, typical_spread, verdict
from ._spec import Variant

__all__ = [
    "FIGURES",
    "PEER_BAR",
    "Change",
    "PeerRow",
    "cell_key",
    "compare",
    "peer_rows",
    "variant_label",
]

#: (metric, label, higher is better)
FIGURES: Final = (
    ("msgs_per_s", "msgs/s", True),
    ("latency_p50_us", "p50 µs", False),
    ("cpu_s_per_msg", "CPU/msg", False),
)
#: The issue's bar for ezflow against a peer: msgs/s ratio at least, p50 ratio at most.
PEER_BAR: Final = (3.0, 0.5)

CellKey = tuple[str, str, str, int, int, str]


def variant_label(cell: dict[str, Any]) -> str:
    """The p2p variant of a results cell as :attr:`._spec.Variant.label` (``ordinary``
    for the ordinary program), or ``""`` outside p2p (files older than p2p included)."""
    variant = cell.get("variant")
    return "" if variant is None else Variant.from_json(variant).label


def cell_key(cell: dict[str, Any]) -> CellKey:
    """(framework, suite, transport, size, clients, variant label): what identifies a
    cell."""
    return (
        cell["framework"],
        cell["suite"],
        cell["transport"],
        cell["size"],
        cell["clients"],
        variant_label(cell),
    )


@dataclass(frozen=True, slots=True)
class Change:
    """One figure of one cell in both runs (or a cell whose status changed)."""

    key: CellKey
    metric: str
    base: float | None
    new: float | None
    gain: float | None  #: > 1 is better; None when a side has no figure
    #: "better", "worse", "no change", "regression", "failed", "missing"
    verdict: str
    #: The rounds of each side (None for a cell without figures).
    base_figure: Figure | None = None
    new_figure: Figure | None = None

    @property
    def failing(self) -> bool:
        return self.verdict in ("regression", "failed")


def _figure(cell: dict[str, Any], metric: str) -> Figure | None:
    """The rounds of *metric* in *cell* (its median alone when it kept no rounds)."""
    found = samples_of(cell.get("repeats") or [], metric)
    if found is None and cell["metrics"][metric] is not None:
        found = Figure((float(cell["metrics"][metric]),))
    return found


def compare(
    base: dict[str, Any], new: dict[str, Any], *, noise: float = 0.1, fail: float = 0.25
) -> list[Change]:
    """Every figure of every cell of *new* next to *base* (cells of *base* missing in
    *new* are reported as ``missing``, which does not fail); see the module for the
    verdicts."""
    base_cells = {cell_key(cell): cell for cell in base["cells"]}
    measured: list[tuple[CellKey, str, bool, Figure | None, Figure | None]] = []
    changes: list[Change] = []
    seen: set[CellKey] = set()
    for cell in new["cells"]:
        key = cell_key(cell)
        seen.add(key)
        before = base_cells.get(key)
        if before is None or before["status"] != "ok":
            continue  # nothing to compare against
        if cell["status"] != "ok":
            reason = cell["reason"] or cell["status"]
            state = "failed" if cell["status"] == "error" else "missing"
            changes.append(Change(key, reason, None, None, None, state))
            continue
        for metric, _, higher in FIGURES:
            measured.append((key, metric, higher, _figure(before, metric), _figure(cell, metric)))
    spread = typical_spread((b, n) for _, _, _, b, n in measured if b is not None and n is not None)
    for key, metric, higher, before_figure, after_figure in measured:
        if before_figure is None or after_figure is None:
            old_value = None if before_figure is None else before_figure.median
            new_value = None if after_figure is None else after_figure.median
            changes.append(Change(key, metric, old_value, new_value, None, NO_CHANGE))
            continue
        gain, said = verdict(
            before_figure, after_figure, higher_is_better=higher, floor=noise, spread=spread
        )
        if said == "worse" and gain is not None and gain < 1 / (1 + fail):
            said = "regression"
        changes.append(
            Change(
                key, metric, before_figure.median, after_figure.median, gain, said,
                before_figure, after_figure,
            )
        )  # fmt: skip
    for key, before in base_cells.items():
        if key not in seen and before["status"] == "ok":
            changes.append(Change(key, "not measured", None, None, None, "missing"))
    return changes


@dataclass(frozen=True, slots=True)
class PeerRow:
    """ezflow against one peer in one cell of one run."""

    suite: str
    transport: str
    size: int
    clients: int
    peer: str
    ezflow_msgs: float | None
    peer_msgs: float | None
    ezflow_p50: float | None
    peer_p50: float | None
    note: str | None  #: why a side has no figures
    #: The ratios over the rounds' ranges (lowest, highest), None when unknown.
    msgs_range: tuple[float, float] | None = None
    p50_range: tuple[float, float] | None = None

    @property
    def msgs_ratio(self) -> float | None:
        """ezflow msgs/s / peer msgs/s (higher is better for ezflow)."""
        if self.ezflow_msgs is None or not self.peer_msgs:
            return None
        return self.ezflow_msgs / self.peer_msgs

    @property
    def p50_ratio(self) -> float | None:
        """ezflow p50 / peer p50 (lower is better for ezflow)."""
        if self.ezflow_p50 is None or not self.peer_p50:
            return None
        return self.ezflow_p50 / self.peer_p50

    @property
    def meets_bar(self) -> bool | None:
        msgs, p50 = self.msgs_ratio, self.p50_ratio
        if msgs is None or p50 is None:
            return None
        return msgs >= PEER_BAR[0] and p50 <= PEER_BAR[1]


def peer_rows(document: dict[str, Any]) -> list[PeerRow]:
    """ezflow next to every other framework of *document*, cell by cell."""
    cells = {cell_key(cell): cell for cell in document["cells"]}
    rows = []
    for key, cell in cells.items():
        framework, suite, transport, size, clients, variant = key
        if framework == "ezflow":
            continue
        ours = cells.get(("ezflow", suite, transport, size, clients, variant))
        notes = [
            f"{side['framework']}: {side['reason'] or side['status']}"
            for side in (ours, cell)
            if side is not None and side["status"] != "ok"
        ]
        mine = ours["metrics"] if ours is not None and ours["status"] == "ok" else None
        theirs = cell["metrics"] if cell["status"] == "ok" else None
        ranges: list[tuple[float, float] | None] = []
        for metric in ("msgs_per_s", "latency_p50_us"):
            a = None if mine is None or ours is None else _figure(ours, metric)
            b = None if theirs is None else _figure(cell, metric)
            found = None if a is None or b is None else ratio_range(a, b)
            ranges.append(None if found is None else (found[1], found[2]))
        rows.append(
            PeerRow(
                suite,
                transport,
                size,
                clients,
                framework,
                mine["msgs_per_s"] if mine else None,
                theirs["msgs_per_s"] if theirs else None,
                mine["latency_p50_us"] if mine else None,
                theirs["latency_p50_us"] if theirs else None,
                "; ".join(notes) or None,
                ranges[0],
                ranges[1],
            )
        )
    return rows
