"""Terminal and markdown tables of perf results (rich; never imported by workers)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rich.table import Table

from ._compare import FIGURES, PEER_BAR, Change, PeerRow, variant_label
from ._noise import NO_CHANGE, Figure, samples_of
from ._spec import format_size

__all__ = [
    "compare_table",
    "floor_table",
    "fmt_cpu",
    "fmt_rate",
    "fmt_us",
    "peer_markdown",
    "peer_table",
    "reasons",
    "results_table",
]


def fmt_rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def fmt_us(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def fmt_cpu(value: float | None) -> str:
    """CPU seconds per message, shown in µs."""
    return "—" if value is None else f"{value * 1e6:,.2f}"


def _fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


#: (header, metric, format, shown in a compact table)
_COLUMNS: tuple[tuple[str, str, Callable[[Any], str], bool], ...] = (
    ("msgs/s", "msgs_per_s", fmt_rate, True),
    ("MB/s", "mb_per_s", lambda value: f"{value:,.1f}", False),
    ("p50 µs", "latency_p50_us", fmt_us, True),
    ("p99 µs", "latency_p99_us", fmt_us, True),
    ("max µs", "latency_max_us", fmt_us, False),
    ("loaded p50 µs", "loaded_latency_p50_us", fmt_us, False),
    ("CPU µs/msg", "cpu_s_per_msg", fmt_cpu, True),
    ("drops", "drops", lambda value: f"[red]{value}[/]" if value else "0", True),
)


def _variant(cell: dict[str, Any]) -> str:
    """The variant column: ``ordinary``, a variant label (ezflow), ``—`` outside p2p."""
    return variant_label(cell) or "—"


def _status(cell: dict[str, Any]) -> str:
    """The status column, with the crashes of the cell (retried or not) beside it."""
    status = cell["status"]
    style = {"error": "red", "unavailable": "dim"}.get(status)
    text = f"[{style}]{status}[/]" if style else status
    crashes = cell.get("crashes", 0)
    if crashes:
        text += f", [yellow]{crashes} crash{'es' if crashes > 1 else ''}[/]"
    return text


def _spread_text(cell: dict[str, Any], metric: str, fmt: Callable[[Any], str]) -> str:
    """A cell's figure: the median of its rounds, ``±`` half their range in percent."""
    found = samples_of(cell.get("repeats") or [], metric)
    if found is None:
        return fmt(cell["metrics"][metric])
    return found.text(fmt, compact=True)


#: The figures shown with the spread of their rounds (the others: the median).
_WITH_SPREAD = frozenset({"msgs_per_s", "latency_p50_us", "cpu_s_per_msg"})


def results_table(
    cells: Iterable[dict[str, Any]], title: str = "ezflow perf", *, compact: bool = False
) -> Table:
    """One row per (framework, cell): the median figures (msgs/s, p50 and CPU/msg with
    ``±`` half the range of the rounds, in percent), or its status (the reasons are in
    :func:`reasons`), and the crashes of its workers. A p2p cell shows its variant
    (``ordinary`` is the program users write). *compact* keeps the columns an
    80-column terminal holds."""
    columns = [column for column in _COLUMNS if column[3] or not compact]
    table = Table(
        title=title,
        title_justify="left",
        caption="median of the rounds, ±: half their range (min-max) in % of the median",
        caption_justify="left",
    )
    if compact:
        table.add_column("cell")
    else:
        for name in ("framework", "suite", "transport", "size", "N", "variant", "loop"):
            table.add_column(name, no_wrap=True)
    for header, *_ in columns:
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for cell in cells:
        size, n = format_size(cell["size"]), str(cell["clients"])
        variant = variant_label(cell)
        head = (
            (
                f"{cell['framework']} {cell['suite']}/{cell['transport']} {size} "
                + (variant if variant else f"N={n}"),
            )
            if compact
            else (
                cell["framework"],
                cell["suite"],
                cell["transport"],
                size,
                n,
                _variant(cell),
                cell.get("loop") or "—",
            )
        )
        metrics = cell["metrics"]
        if cell["status"] != "ok" or metrics is None:
            blanks = ("" for _ in columns)
            table.add_row(*head, *blanks, _status(cell))
            continue
        figures = (
            _spread_text(cell, metric, fmt)
            if metric in _WITH_SPREAD and metrics[metric] is not None
            else fmt(metrics[metric])
            for _, metric, fmt, _ in columns
        )
        table.add_row(*head, *figures, _status(cell))
    return table


def floor_table(floor: dict[str, Any]) -> Table | None:
    """The p2p floor of a run (None when it measured no p2p cell): per raw socket and
    size, the paced one-way time and the back-to-back rate, next to the socketpair
    round trip / 2 and one copy of the size."""
    paced = floor.get("paced_one_way_us")
    if not paced:
        return None
    rates = {
        (entry["over"], entry["size"]): entry["msgs_per_s"] for entry in floor["stream_msgs_per_s"]
    }
    halves = {entry["size"]: entry["p50"] / 2 for entry in floor["socketpair_rtt_us"]}
    copies = {entry["size"]: entry["us"] for entry in floor.get("memcpy_us", ())}
    table = Table(
        title="the raw floor of p2p: two processes, one raw socket, no framework",
        caption="unix is the floor of shm (and local), tcp of tcp",
        title_justify="left",
    )
    for name in ("socket", "size"):
        table.add_column(name, no_wrap=True)
    for name in ("msgs/s", "paced p50 µs", "paced p99 µs", "socketpair RTT/2 µs", "copy µs"):
        table.add_column(name, justify="right", no_wrap=True)
    for entry in paced:
        size = entry["size"]
        table.add_row(
            entry["over"], format_size(size), fmt_rate(rates.get((entry["over"], size))),
            fmt_us(entry["p50"]), fmt_us(entry["p99"]), fmt_us(halves.get(size)),
            fmt_us(copies.get(size)),
        )  # fmt: skip
    return table


def reasons(cells: Iterable[dict[str, Any]]) -> list[str]:
    """One line per distinct reason a cell has no figures (or a worker of it crashed),
    with the cells it applies to."""
    found: dict[str, list[str]] = {}
    for cell in cells:
        size = format_size(cell["size"])
        variant = variant_label(cell)
        label = f"{cell['framework']} {cell['suite']}/{cell['transport']}/{size}"
        label += f"/{variant}" if variant else ""
        if cell["status"] != "ok":
            found.setdefault(f"{cell['status']}: {cell['reason']}", []).append(label)
        elif cell.get("crashes"):
            # The crashes of a cell that has figures anyway (retried, or after them).
            for reason in cell.get("crash_reasons", ()):
                found.setdefault(f"crash: {reason}", []).append(label)
    return [f"{reason} ({', '.join(labels)})" for reason, labels in found.items()]


_STYLES = {"better": "green", "worse": "red", "regression": "bold red", "failed": "bold red"}


def _side(figure: Figure | None, value: float | None, fmt: Callable[[Any], str]) -> str:
    if figure is not None:
        return figure.text(fmt, compact=True)
    return fmt(value) if value is not None else "—"


def compare_table(changes: list[Change], base: str, new: str) -> Table:
    """Per-cell gains of *new* over *base* (> 1 is better), each side the median of its
    rounds with ``±`` half their range; colored beyond the noise."""
    table = Table(
        title=f"{new} against {base} (gain > 1 is better)",
        title_justify="left",
        caption=f"{NO_CHANGE}: inside the noise (the rounds' ranges overlap, or the gain is "
        "within 2-3 times the comparison's typical spread, and --noise). Figures from two "
        "runs compare only on the same machine under similar load.",
        caption_justify="left",
    )
    for name in ("framework", "suite", "transport", "size", "N", "variant", "figure"):
        table.add_column(name, no_wrap=True)
    for name in ("base", "new", "gain"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("verdict")
    labels = {metric: label for metric, label, _ in FIGURES}
    formats = {"msgs_per_s": fmt_rate, "latency_p50_us": fmt_us, "cpu_s_per_msg": fmt_cpu}
    for change in changes:
        framework, suite, transport, size, clients, variant = change.key
        style = _STYLES.get(change.verdict, "")
        fmt = formats.get(change.metric, fmt_rate)
        verdict = f"[{style}]{change.verdict}[/]" if style else change.verdict
        table.add_row(
            framework, suite, transport, format_size(size), str(clients), variant or "—",
            labels.get(change.metric, change.metric),
            _side(change.base_figure, change.base, fmt),
            _side(change.new_figure, change.new, fmt),
            f"[{style}]{change.gain:.2f}x[/]" if change.gain is not None and style
            else _fmt_ratio(change.gain),
            verdict,
        )  # fmt: skip
    return table


def _bar(row: PeerRow) -> str:
    met = row.meets_bar
    return "—" if met is None else ("pass" if met else "miss")


def peer_table(rows: list[PeerRow]) -> Table:
    """ezflow against each peer, cell by cell, with the ratios and the bar."""
    table = Table(
        title="ezflow against its peers, same run, cell by cell",
        caption=f"bar: msgs/s ratio ≥ {PEER_BAR[0]:g}x and p50 ratio ≤ {PEER_BAR[1]:g}x",
        title_justify="left",
    )
    for name in ("suite", "transport", "size", "N", "peer"):
        table.add_column(name, no_wrap=True)
    for name in ("ezflow msgs/s", "peer msgs/s", "ratio", "ezflow p50 µs", "peer p50 µs", "ratio"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("bar")
    for row in rows:
        bar = _bar(row)
        style = {"pass": "green", "miss": "red"}.get(bar, "dim")
        table.add_row(
            row.suite, row.transport, format_size(row.size), str(row.clients), row.peer,
            fmt_rate(row.ezflow_msgs), fmt_rate(row.peer_msgs), _fmt_ratio(row.msgs_ratio),
            fmt_us(row.ezflow_p50), fmt_us(row.peer_p50), _fmt_ratio(row.p50_ratio),
            f"[{style}]{bar if row.note is None else row.note}[/]",
        )  # fmt: skip
    return table


def peer_markdown(rows: list[PeerRow]) -> str:
    """The peer table as GitHub markdown (for docs/perf.md)."""
    lines = [
        "| suite | transport | size | N | peer | ezflow msgs/s | peer msgs/s | ratio "
        "| ezflow p50 µs | peer p50 µs | ratio | bar |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.suite} | {row.transport} | {format_size(row.size)} | {row.clients} "
            f"| {row.peer} | {fmt_rate(row.ezflow_msgs)} | {fmt_rate(row.peer_msgs)} "
            f"| {_fmt_ratio(row.msgs_ratio)} | {fmt_us(row.ezflow_p50)} "
            f"| {fmt_us(row.peer_p50)} | {_fmt_ratio(row.p50_ratio)} "
            f"| {_bar(row) if row.note is None else row.note} |"
        )
    return "\n".join(lines) + "\n"
