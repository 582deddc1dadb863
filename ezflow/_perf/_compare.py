"""Ratios between results: two runs (``ezflow perf compare``) or two frameworks of one
run (the peer table).

A run-to-run comparison looks at every cell both files measured and three figures:
msgs/s (higher is better), paced latency p50 and CPU per message (lower is better). The
*gain* of a figure is ``new/base`` for msgs/s and ``base/new`` for the others, so a gain
above 1 is always an improvement. A gain beyond ``1 ± noise`` is colored (green/red); a
gain below ``1/(1 + fail)`` is a regression and makes the command exit with status 1,
as is a cell that worked in the base run and fails in the new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

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
    verdict: str  #: "better", "worse", "same", "regression", "failed", "missing"

    @property
    def failing(self) -> bool:
        return self.verdict in ("regression", "failed")


def _verdict(gain: float, noise: float, fail: float) -> str:
    if gain < 1 / (1 + fail):
        return "regression"
    if gain < 1 / (1 + noise):
        return "worse"
    if gain > 1 + noise:
        return "better"
    return "same"


def compare(
    base: dict[str, Any], new: dict[str, Any], *, noise: float = 0.1, fail: float = 0.25
) -> list[Change]:
    """Every figure of every cell of *new* next to *base* (cells of *base* missing in
    *new* are reported as ``missing``, which does not fail)."""
    base_cells = {cell_key(cell): cell for cell in base["cells"]}
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
            verdict = "failed" if cell["status"] == "error" else "missing"
            changes.append(Change(key, reason, None, None, None, verdict))
            continue
        for metric, _, higher in FIGURES:
            old_value, new_value = before["metrics"][metric], cell["metrics"][metric]
            if not old_value or not new_value:
                changes.append(Change(key, metric, old_value, new_value, None, "same"))
                continue
            gain = new_value / old_value if higher else old_value / new_value
            changes.append(
                Change(key, metric, old_value, new_value, gain, _verdict(gain, noise, fail))
            )
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
            )
        )
    return rows
