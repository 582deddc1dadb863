"""``ezflow perf peers``: ezflow's ordinary p2p program next to every peer, one table.

The CLI (``ezflow/_cli/_perf.py``) parses the options and shows progress; this module
decides what runs (:func:`prepare`), makes sure every peer has its venv
(:func:`._install.ensure`), and turns the results document of the runner into the
table (:func:`table_rows`, :func:`rich_table`, :func:`markdown`):

* one row per metric x size x transport: back-to-back msgs/s, paced p50 and p99
  one-way latency (µs), medians of the repeats;
* columns: ezflow (the ordinary program: tuple message, plain ``asyncio.run``,
  ``recv()``), each peer, then ``ezflow/PEER`` for each peer - ezflow's figure divided
  by the peer's, so > 1 is better for msgs/s and < 1 is better for latency, the way
  the issue's bars are written -, the raw floor of the machine for that size (msgs/s:
  back to back on a raw socket, Unix next to shm and tcp next to tcp; latency: a
  message every period on that socket, the paced one-way floor, or socketpair round
  trip / 2 in older results files), one memcpy of that size, and the crashes of every
  framework in that cell (the runner retries a crashed worker and counts it; a count
  here means figures came from a later attempt, or none came).

Uses rich: never imported by workers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rich.table import Table

from .._noise import Figure, ratio_range, samples_of
from .._spec import QUICK, STANDARD, Cell, Plan, SpecError, Variant, format_size, parse_size
from ._install import PEERS, resolve

__all__ = [
    "DEFAULT_SIZES",
    "METRICS",
    "QUICK_SIZES",
    "TRANSPORTS",
    "Request",
    "Row",
    "failures",
    "markdown",
    "notes",
    "prepare",
    "rich_table",
    "table_rows",
]

#: Sizes of a full peers run (``frame``: the 3840x2160x3 uint8 frame at 10 ms pacing).
DEFAULT_SIZES: Final = ("64B", "1MiB", "frame")
#: Sizes of ``--quick``.
QUICK_SIZES: Final = ("64B", "1MiB")
#: Transports the peers are measured over (two processes each).
TRANSPORTS: Final = ("shm", "tcp")
#: (metric key in the results, row label, True when more is better).
METRICS: Final = (
    ("msgs_per_s", "msgs/s back-to-back", True),
    ("latency_p50_us", "p50 µs paced one-way", False),
    ("latency_p99_us", "p99 µs paced one-way", False),
)


def peer_names() -> list[str]:
    """What ``--peers`` accepts: each peer, and each flavour of a peer that has them."""
    names = []
    for peer in PEERS.values():
        names.append(peer.name)
        if peer.flavours:
            names.extend(peer.frameworks)
    return names


@dataclass(frozen=True, slots=True)
class Request:
    """What one ``ezflow perf peers`` run measures."""

    peers: tuple[str, ...]
    cells: tuple[Cell, ...]
    plan: Plan


def _split(values: Iterable[str] | None, default: Sequence[str]) -> list[str]:
    items = [part.strip() for value in values or () for part in value.split(",")]
    return list(dict.fromkeys(item for item in items if item)) or list(default)


def prepare(
    peers: Iterable[str] | None = None,
    sizes: Iterable[str] | None = None,
    transports: Iterable[str] | None = None,
    repeats: int | None = None,
    *,
    quick: bool = False,
) -> Request:
    """The cells and plan of a run: the ordinary p2p cell for every size x transport,
    on ezflow and each of *peers* (names of :data:`._install.PEERS`, comma-separated
    or repeated; all of them by default). Raises :class:`SpecError` (one line for the
    user) for an unknown peer, transport or size, or a bad repeat count."""
    chosen = _split(peers, tuple(PEERS))
    try:
        resolve(chosen)
    except KeyError as exc:
        raise SpecError(
            f"unknown peer {exc.args[0]!r}; use one of {', '.join(peer_names())}"
        ) from None
    chosen_transports = _split(transports, TRANSPORTS)
    for transport in chosen_transports:
        if transport not in TRANSPORTS:
            raise SpecError(
                f"unknown transport {transport!r} for peers; use one of {', '.join(TRANSPORTS)}"
            )
    texts = _split(sizes, QUICK_SIZES if quick else DEFAULT_SIZES)
    chosen_sizes = list(dict.fromkeys(parse_size(text) for text in texts))
    base = QUICK if quick else STANDARD
    plan = base if repeats is None else dataclasses.replace(base, repeats=repeats)
    cells = tuple(
        Cell("p2p", transport, size, 1, Variant())
        for transport in chosen_transports
        for size in chosen_sizes
    )
    return Request(tuple(chosen), cells, plan)


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the table: a metric of one size over one transport."""

    metric: str
    label: str
    higher_is_better: bool
    size: int
    transport: str
    #: Per framework (ezflow first): the median figure, or None with a status note.
    values: dict[str, float | None]
    status: dict[str, str]
    #: ezflow's figure / each peer's (None when either is missing).
    ratios: dict[str, float | None]
    floor: float | None
    #: One memcpy of a message of this size, µs.
    memcpy_us: float | None
    #: Crashes counted per framework in this cell (the same for its three metrics).
    crashes: dict[str, int]
    #: Per framework: the rounds of the figure (median and range), None when missing.
    figures: dict[str, Figure | None] = dataclasses.field(default_factory=dict)
    #: ezflow / each peer over the rounds' ranges: (lowest, highest), None when missing.
    ratio_ranges: dict[str, tuple[float, float] | None] = dataclasses.field(default_factory=dict)

    def lead(self, name: str) -> str | None:
        """Whether ezflow is ``"ahead"`` of peer *name* in this row, ``"behind"``, or
        ``"even"`` (the ratio's range over the rounds holds 1: inside the noise)."""
        ratio, spread = self.ratios.get(name), self.ratio_ranges.get(name)
        if ratio is None:
            return None
        low, high = spread if spread is not None else (ratio, ratio)
        if low <= 1 <= high:
            return "even"
        ahead = low > 1 if self.higher_is_better else high < 1
        return "ahead" if ahead else "behind"


def _ordinary(cell: dict[str, Any]) -> bool:
    variant = cell.get("variant")
    return cell["suite"] == "p2p" and (variant is None or Variant(**variant).is_default)


def _floor(document: dict[str, Any], metric: str, size: int, transport: str) -> float | None:
    """The raw floor of *metric* at *size* on the raw socket next to *transport* (Unix
    next to shm, tcp next to tcp): for msgs/s, messages of that size written back to
    back, else one memcpy per message when the run did not measure the stream; for
    latency, a message of that size every period, both processes idle in between (the
    paced one-way floor: what the paced cells are), else - a results file from before
    that was measured - half the socketpair round trip."""
    floor = document["floor"]
    over = "unix" if transport == "shm" else "tcp"
    if metric == "msgs_per_s":
        for entry in floor.get("stream_msgs_per_s", []):
            if entry["size"] == size and entry["over"] == over:
                return float(entry["msgs_per_s"])
        copy = _memcpy_us(document, size)
        return 1e6 / copy if copy else None
    key = "p50" if metric == "latency_p50_us" else "p99"
    for entry in floor.get("paced_one_way_us", []):
        if entry["size"] == size and entry["over"] == over:
            return float(entry[key])
    for entry in floor["socketpair_rtt_us"]:
        if entry["size"] == size:
            return float(entry[key]) / 2
    return None


def _memcpy_us(document: dict[str, Any], size: int) -> float | None:
    """Microseconds of one numpy copy of *size* bytes (measured, or from the bandwidth)."""
    floor = document["floor"]
    for entry in floor.get("memcpy_us", []):
        if entry["size"] == size:
            return float(entry["us"])
    bandwidth = floor.get("memcpy_gb_per_s")
    return size / (bandwidth * 1e3) if bandwidth else None


def _rounds(cell: dict[str, Any] | None, metric: str) -> Figure | None:
    """The rounds of *metric* in *cell* (None when it has no figures)."""
    if cell is None or cell["status"] != "ok" or cell["metrics"] is None:
        return None
    found = samples_of(cell.get("repeats") or [], metric)
    value = cell["metrics"].get(metric)
    return found if found is not None else (None if value is None else Figure((value,)))


def frameworks(document: dict[str, Any]) -> list[str]:
    """ezflow, then the peers, in the order of the run."""
    names = [framework["name"] for framework in document["frameworks"]]
    return ["ezflow", *(name for name in names if name != "ezflow")]


def table_rows(document: dict[str, Any]) -> list[Row]:
    """The rows of the peers table of *document* (a results file with p2p cells of the
    ordinary program): metric x size x transport, in the order the cells ran."""
    names = frameworks(document)
    cells: dict[tuple[str, int, str], dict[str, Any]] = {}
    order: list[tuple[str, int]] = []
    for cell in document["cells"]:
        if not _ordinary(cell):
            continue
        key = (cell["transport"], cell["size"])
        if key not in order:
            order.append(key)
        cells[cell["transport"], cell["size"], cell["framework"]] = cell
    rows = []
    for metric, label, higher in METRICS:
        for transport, size in sorted(order, key=lambda key: (key[1], key[0])):
            values: dict[str, float | None] = {}
            status: dict[str, str] = {}
            crashes: dict[str, int] = {}
            for name in names:
                cell = cells.get((transport, size, name))
                if cell is None:
                    values[name], status[name] = None, "not run"
                    continue
                crashes[name] = int(cell.get("crashes", 0))
                metrics = cell["metrics"] if cell["status"] == "ok" else None
                values[name] = None if metrics is None else metrics.get(metric)
                status[name] = cell["status"]
            ours = values.get("ezflow")
            ratios = {
                name: ours / theirs if ours is not None and theirs else None
                for name, theirs in values.items()
                if name != "ezflow"
            }
            figures = {name: _rounds(cells.get((transport, size, name)), metric) for name in names}
            ranges: dict[str, tuple[float, float] | None] = {}
            for name in names[1:]:
                mine, theirs_figure = figures.get("ezflow"), figures.get(name)
                found = (
                    None
                    if mine is None or theirs_figure is None
                    else ratio_range(mine, theirs_figure)
                )
                ranges[name] = None if found is None else (found[1], found[2])
            rows.append(
                Row(
                    metric,
                    label,
                    higher,
                    size,
                    transport,
                    values,
                    status,
                    ratios,
                    _floor(document, metric, size, transport),
                    _memcpy_us(document, size),
                    crashes,
                    figures,
                    ranges,
                )
            )
    return rows


def _format(row: Row) -> Callable[[float], str]:
    if row.metric == "msgs_per_s":
        return lambda value: f"{value:,.0f}"
    return lambda value: f"{value:,.1f}"


def _figure(row: Row, name: str, *, compact: bool = False) -> str:
    """The median of the rounds with their range (``±`` half of it when *compact*)."""
    value = row.values.get(name)
    if value is None:
        state = row.status.get(name, "not run")
        return "—" if state == "ok" else state
    found = row.figures.get(name)
    if found is None:
        return _format(row)(value)
    return found.text(_format(row), compact=compact)


#: How each lead is shown: style, and a word after the ratio.
_LEADS = {"ahead": ("green", ""), "behind": ("red", ""), "even": ("yellow", " even")}


def _ratio(row: Row, name: str, *, spread: bool = True) -> tuple[str, str]:
    """The ratio as text (with its range over the rounds) and its style: green where
    ezflow is ahead beyond the noise, red behind, yellow even (inside the noise)."""
    ratio = row.ratios.get(name)
    if ratio is None:
        return "—", "dim"
    style, word = _LEADS[row.lead(name) or "even"]
    text = f"{ratio:.2f}x"
    bounds = row.ratio_ranges.get(name)
    if spread and bounds is not None and bounds[0] != bounds[1]:
        text += f" ({bounds[0]:.2f}-{bounds[1]:.2f})"
    return text + word, style


def _floor_text(row: Row) -> str:
    if row.floor is None:
        return "—"
    return f"{row.floor:,.0f}" if row.metric == "msgs_per_s" else f"{row.floor:,.1f}"


def _memcpy_text(row: Row) -> str:
    return "—" if row.memcpy_us is None else f"{row.memcpy_us:,.1f}"


def _crashes(row: Row) -> str:
    counted = [f"{name} {count}" for name, count in row.crashes.items() if count]
    return ", ".join(counted) or "0"


def rich_table(document: dict[str, Any], title: str = "ezflow perf peers") -> Table:
    """The peers table of *document* for the terminal."""
    names = frameworks(document)
    peers = names[1:]
    table = Table(
        title=f"{title}: the ordinary p2p program, medians of "
        f"{document['plan']['repeats']} round(s), same run",
        caption="± : half the range of the rounds, in % of the median. ezflow/PEER = "
        "ezflow's figure / the peer's (its range over the rounds): > 1 is ahead for "
        "msgs/s, < 1 for latency; 'even' when the range holds 1 (inside the noise). "
        "floor: back-to-back on a raw socket (msgs/s; unix next to shm), socketpair round "
        "trip / 2 (latency). memcpy µs: one copy of a message of that size. Figures of "
        "different runs are not comparable: compare ratios within a run.",
        title_justify="left",
        caption_justify="left",
    )
    for header in ("metric", "size", "transport"):
        table.add_column(header, no_wrap=True)
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    for name in peers:
        table.add_column(f"ezflow/{name}", justify="right", no_wrap=True)
    table.add_column("floor", justify="right", no_wrap=True)
    table.add_column("memcpy µs", justify="right", no_wrap=True)
    table.add_column("crashes", no_wrap=True)
    for row in table_rows(document):
        ratios = [_ratio(row, name) for name in peers]
        crashes = _crashes(row)
        table.add_row(
            row.label,
            format_size(row.size),
            row.transport,
            *(_figure(row, name, compact=True) for name in names),
            *(f"[{style}]{text}[/]" for text, style in ratios),
            _floor_text(row),
            _memcpy_text(row),
            crashes if crashes == "0" else f"[yellow]{crashes}[/]",
        )
    return table


def markdown(document: dict[str, Any]) -> str:
    """The peers table of *document* as GitHub markdown (for docs/perf.md): per metric,
    a table with a row per framework (and the floor) and a column per size and
    transport, each figure the median of the rounds with their range; then the ratios
    ezflow / peer with theirs, marked ``even`` where the range holds 1."""
    names = frameworks(document)
    peers = names[1:]
    rows = table_rows(document)
    out: list[str] = []
    for metric, label, _ in METRICS:
        chosen = [row for row in rows if row.metric == metric]
        if not chosen:
            continue
        columns = [f"{format_size(row.size)} {row.transport}" for row in chosen]
        align = "|---|" + "---:|" * len(columns)
        out += [f"**{label}**", "", "| | " + " | ".join(columns) + " |", align]
        for name in names:
            out.append(f"| {name} | " + " | ".join(_figure(row, name) for row in chosen) + " |")
        out.append("| floor | " + " | ".join(_floor_text(row) for row in chosen) + " |")
        out += ["", f"**ezflow / peer, {label}**", "", "| | " + " | ".join(columns) + " |"]
        out.append(align)
        for name in peers:
            ratios = " | ".join(_ratio(row, name)[0] for row in chosen)
            out.append(f"| ezflow / {name} | {ratios} |")
        out.append("")
    crashes = {name: 0 for name in names}
    for row in rows:
        if row.metric == METRICS[0][0]:
            for name, count in row.crashes.items():
                crashes[name] += count
    counted = [f"{name} {count}" for name, count in crashes.items() if count]
    out.append(f"Crashes: {', '.join(counted) or 'none'}.")
    return "\n".join(out) + "\n"


def notes(document: dict[str, Any]) -> list[str]:
    """One line per cell without figures (why), per crash reason kept, per cell whose
    workers left files in /dev/shm that the runner removed, and per such file kept."""
    lines = []
    for cell in document["cells"]:
        if not _ordinary(cell):
            continue
        where = f"{cell['framework']} {cell['transport']}/{format_size(cell['size'])}"
        if cell["status"] != "ok":
            lines.append(f"{where}: {cell['status']}: {cell['reason']}")
        for reason in cell.get("crash_reasons", []):
            lines.append(f"{where}: crashed: {reason}")
        swept = cell.get("swept", [])
        if swept:
            megabytes = sum(item["bytes"] for item in swept) / 1e6
            lines.append(
                f"{where}: removed {len(swept)} files its workers left in /dev/shm "
                f"({megabytes:,.1f} MB)"
            )
        for item in cell.get("unswept", []):
            lines.append(f"{where}: left /dev/shm/{item['name']}: {item['why']}")
    return lines


def failures(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells that failed (status ``error``, after every retry)."""
    return [cell for cell in document["cells"] if cell["status"] == "error"]
