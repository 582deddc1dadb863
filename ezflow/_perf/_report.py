"""A self-contained HTML report of one results file: inline SVG charts, no dependency.

One chart per suite, with two panels side by side (msgs/s and paced one-way latency
p50, log scales) and one legend. Its x axis is what the suite varies: N (sinks, sources
or relays) for the graph suites when the run measured several, else the message size
(p2p always). A line per framework, transport and p2p variant (and size, when a graph
suite's x is N and the run had several); the line style says the transport (local
dotted, shm solid, tcp dashed). The latency panel has the raw floor of the same run as
a grey dashed line only where it applies: for the edges that cross a process (shm,
tcp; a local cell is no socket and beats it), per socket for p2p (its paced one-way
figure over a unix or tcp socket) and the socketpair round trip / 2 for the graph
suites. Then the tables: every cell, the peer ratios when the run had a peer, the floor
and the environment. At the top, a one-screen summary: what each suite measures, what
the columns mean, the floor, and (given a base run) the biggest regressions and gains;
the plan of the run as a small table.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._compare import FIGURES, PEER_BAR, Change, compare, peer_rows, variant_label
from ._noise import NO_CHANGE, samples_of
from ._spec import SUITE_DESCRIPTIONS, SUITES, format_size

__all__ = ["GRAPH_SUITES", "Panel", "Series", "plan_table", "render", "suite_chart", "svg_chart"]

_PANEL_W, _PANEL_H = 420, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 40, 40
_COLORS = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
    "#8c564b", "#17becf", "#e377c2", "#bcbd22", "#7f7f7f",
)  # fmt: skip
_FLOOR_COLOR = "#888888"
#: Line style per transport (the floor has its own).
_DASHES = {"local": "2 3", "shm": "", "tcp": "7 4"}
#: The floors' line styles: of the socket under shm (unix), of tcp, of the socketpair.
_FLOOR_DASHES = {"floor:shm": "4 3", "floor:tcp": "9 3 2 3", "floor": "4 3"}
_LEGEND_ROW = 17


@dataclass(frozen=True)
class Series:
    """One line of a chart: its label, points (x, y), and style: a transport
    (``local``, ``shm``, ``tcp``: dotted, solid, dashed) or ``floor``."""

    label: str
    points: list[tuple[float, float]]
    style: str = "shm"
    #: Lines of one group share a colour (one framework and variant over several
    #: transports); None: the label.
    group: str | None = None


@dataclass(frozen=True)
class Panel:
    title: str
    y_label: str
    series: list[Series]


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:,.2f}"


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _log_ticks(low: float, high: float) -> list[float]:
    """Powers of ten covering [low, high] (at least two)."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    if first == last:
        last += 1
    return [10.0**k for k in range(first, last + 1)]


def _fmt_tick(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _x_label(x_axis: str, value: float) -> str:
    return f"N={value:g}" if x_axis == "N" else format_size(int(value))


def svg_chart(title: str, x_axis: str, panels: Sequence[Panel]) -> str:
    """Panels side by side sharing one x axis (``"N"`` or ``"size"``, log scale, a tick
    per measured value) and one legend below them, as one ``<svg>`` element; lines in
    the same colour across panels. A panel without figures says so."""
    labels = list(dict.fromkeys(s.label for panel in panels for s in panel.series))
    styles = {s.label: s.style for panel in panels for s in panel.series}
    groups = {s.label: s.group or s.label for panel in panels for s in panel.series}
    palette: dict[str, str] = {}
    colors: dict[str, str] = {}
    for label in labels:
        if styles[label].startswith("floor"):
            colors[label] = _FLOOR_COLOR
        else:
            group = groups[label]
            palette.setdefault(group, _COLORS[len(palette) % len(_COLORS)])
            colors[label] = palette[group]
    xs = sorted({x for panel in panels for s in panel.series for x, y in s.points if y > 0})
    width = _PANEL_W * len(panels)
    columns = max(1, width // 260)
    rows = -(-len(labels) // columns)
    height = _PANEL_H + 10 + _LEGEND_ROW * rows
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
        f'height="{height}" role="img" aria-label="{_esc(title)}">',
        f'<text x="{width / 2}" y="16" text-anchor="middle" class="t">{_esc(title)}</text>',
    ]
    for index, panel in enumerate(panels):
        out.append(_svg_panel(panel, index * _PANEL_W, xs, x_axis, colors))
    for index, label in enumerate(labels):
        col, row = index % columns, index // columns
        x = _LEFT + col * (width - _LEFT) / columns
        y = _PANEL_H + 10 + row * _LEGEND_ROW
        dash = _dash(styles[label])
        out.append(
            f'<g class="legend"><line x1="{x:.1f}" x2="{x + 24:.1f}" y1="{y:.1f}" '
            f'y2="{y:.1f}" stroke="{colors[label]}" stroke-width="2"{dash}/>'
            f'<text x="{x + 30:.1f}" y="{y + 4:.1f}">{_esc(label)}</text></g>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _dash(style: str) -> str:
    dash = _FLOOR_DASHES.get(style) or _DASHES.get(style, "")
    return f' stroke-dasharray="{dash}"' if dash else ""


def _svg_panel(
    panel: Panel, left: float, xs: list[float], x_axis: str, colors: dict[str, str]
) -> str:
    plot_w, plot_h = _PANEL_W - _LEFT - _RIGHT, _PANEL_H - _TOP - _BOTTOM
    x0, top = left + _LEFT, _TOP
    points = [p for s in panel.series for p in s.points if p[1] > 0]
    out = [
        f'<g class="panel"><text x="{x0 + plot_w / 2:.1f}" y="{top - 8}" '
        f'text-anchor="middle" class="p">{_esc(panel.title)}</text>',
        f'<rect x="{x0}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>',
    ]
    if not points or not xs:
        out.append(
            f'<text x="{x0 + plot_w / 2:.1f}" y="{top + plot_h / 2:.1f}" '
            'text-anchor="middle" class="empty">no figures</text></g>'
        )
        return "\n".join(out)
    spread = 2.0 if x_axis == "size" else 1.25
    x_low, x_high = (xs[0] / spread, xs[-1] * spread) if len(xs) > 1 else (xs[0] / 4, xs[0] * 4)
    y_ticks = _log_ticks(min(y for _, y in points), max(y for _, y in points))
    y_low, y_high = y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return x0 + plot_w * math.log(x / x_low) / math.log(x_high / x_low)

    def sy(y: float) -> float:
        return top + plot_h * (1 - math.log(y / y_low) / math.log(y_high / y_low))

    for tick in y_ticks:
        y = sy(tick)
        out.append(
            f'<line x1="{x0}" x2="{x0 + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt_tick(tick)}</text>'
        )
    for x in xs:
        px = sx(x)
        out.append(
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{top}" y2="{top + plot_h}" class="grid"/>'
            f'<text x="{px:.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
            f"{_esc(_x_label(x_axis, x))}</text>"
        )
    middle = top + plot_h / 2
    out.append(
        f'<text x="{left + 14}" y="{middle}" transform="rotate(-90 {left + 14} {middle})" '
        f'text-anchor="middle">{_esc(panel.y_label)}</text>'
    )
    for series in panel.series:
        good = sorted((x, y) for x, y in series.points if y > 0)
        if not good:
            continue
        color = colors[series.label]
        kind = "floor" if series.style.startswith("floor") else "line"
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
        out.append(
            f'<polyline class="{kind}" points="{path}" fill="none" stroke="{color}" '
            f'stroke-width="2"{_dash(series.style)}><title>{_esc(series.label)}</title>'
            "</polyline>"
        )
        if kind == "line":
            out.extend(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in good
            )
    out.append("</g>")
    return "\n".join(out)


#: The graph suites: their charts draw N on the x axis when the run measured several.
GRAPH_SUITES = tuple(suite for suite in SUITES if suite != "p2p")
#: The socket of the p2p floor for each transport that crosses a process.
_P2P_SOCKET = {"shm": "unix", "tcp": "tcp"}


def _line_label(cell: dict[str, Any], parts: Sequence[str]) -> str:
    words = {
        "framework": cell["framework"],
        "transport": cell["transport"],
        "variant": variant_label(cell),
        "size": format_size(cell["size"]),
        "N": f"N={cell['clients']}",
    }
    return " ".join(words[part] for part in parts if words[part])


def _varying(cells: list[dict[str, Any]], key: Any) -> bool:
    return len({key(cell) for cell in cells}) > 1


def suite_chart(suite: str, cells: list[dict[str, Any]], floor: dict[str, Any]) -> str:
    """The chart of *suite* (its measured cells of every transport and framework)."""
    ok = [cell for cell in cells if cell["status"] == "ok" and cell["metrics"]]
    by_n = suite in GRAPH_SUITES and _varying(ok, lambda c: c["clients"])
    x_axis = "N" if by_n else "size"
    parts = ["framework"] if _varying(ok, lambda c: c["framework"]) else []
    parts.append("transport")
    if suite == "p2p" and _varying(ok, variant_label):
        parts.append("variant")
    if by_n and _varying(ok, lambda c: c["size"]):
        parts.append("size")
    if not by_n and _varying(ok, lambda c: c["clients"]):
        parts.append("N")

    def lines(metric: str) -> list[Series]:
        found: dict[str, list[tuple[float, float]]] = {}
        style: dict[str, str] = {}
        group: dict[str, str] = {}
        for cell in ok:
            value = cell["metrics"].get(metric)
            if value:
                label = _line_label(cell, parts)
                x = float(cell["clients"] if by_n else cell["size"])
                found.setdefault(label, []).append((x, float(value)))
                style[label] = cell["transport"]
                group[label] = _line_label(cell, [p for p in parts if p != "transport"])
        return [Series(label, found[label], style[label], group[label]) for label in sorted(found)]

    latency = lines("latency_p50_us")
    latency.extend(_floors(suite, ok, floor, by_n))
    what = "N" if by_n else "message size"
    single = sorted({cell["clients"] for cell in ok})
    note = (
        f" (N={single[0]} only: -n 1 -n 2 -n 4 -n 8 draws N)"
        if suite in GRAPH_SUITES and len(single) == 1
        else ""
    )
    return svg_chart(
        f"{suite}: against {what}{note}",
        x_axis,
        [Panel("msgs/s (back to back)", "msgs/s", lines("msgs_per_s")),
         Panel("latency p50 (paced, one way)", "µs", latency)],
    )  # fmt: skip


def _floors(
    suite: str, cells: list[dict[str, Any]], floor: dict[str, Any], by_n: bool
) -> list[Series]:
    """The floor lines of a latency panel: none unless a cell crosses a process (a
    local cell is no socket and beats it)."""
    crossing = sorted({c["transport"] for c in cells if c["transport"] in _P2P_SOCKET})
    if not crossing:
        return []
    sizes = sorted({cell["size"] for cell in cells})
    paced = {(e["over"], e["size"]): e["p50"] for e in floor.get("paced_one_way_us", ())}
    rtt = {e["size"]: e["p50"] / 2 for e in floor.get("socketpair_rtt_us", ())}
    if suite == "p2p" and paced:
        found = []
        for transport in crossing:
            socket = _P2P_SOCKET[transport]
            points = [(float(s), paced[socket, s]) for s in sizes if (socket, s) in paced]
            if points:
                found.append(
                    Series(f"floor: raw {socket} socket, paced", points, f"floor:{transport}")
                )
        return found
    if by_n:
        ns = sorted({float(cell["clients"]) for cell in cells})
        return [
            Series(
                f"floor at {format_size(size)}: socketpair RTT/2",
                [(n, rtt[size]) for n in ns],
                "floor",
            )
            for size in sizes
            if size in rtt
        ]
    points = [(float(size), rtt[size]) for size in sizes if size in rtt]
    return [Series("floor: socketpair RTT/2", points, "floor")] if points else []


def _cell_rows(cells: list[dict[str, Any]]) -> str:
    rows = []
    for cell in cells:
        head = "".join(
            f"<td>{_esc(value)}</td>"
            for value in (cell["framework"], cell["suite"], cell["transport"],
                          format_size(cell["size"]), cell["clients"],
                          variant_label(cell) or "—", cell.get("loop") or "—",
                          cell["processes"], cell.get("crashes", 0))
        )  # fmt: skip
        metrics = cell["metrics"]
        if cell["status"] != "ok" or metrics is None:
            rows.append(
                f'<tr class="{cell["status"]}">{head}<td colspan="8">'
                f"{_esc(cell['status'])}: {_esc(cell['reason'])}</td></tr>"
            )
            continue
        values = [
            _with_range(cell, "msgs_per_s", lambda v: f"{v:,.0f}"),
            f"{metrics['mb_per_s']:,.1f}",
            _with_range(cell, "latency_p50_us", lambda v: f"{v:,.1f}"),
            *(
                "—" if metrics[key] is None else f"{metrics[key]:,.1f}"
                for key in ("latency_p99_us", "latency_max_us", "loaded_latency_p50_us")
            ),
            _with_range(cell, "cpu_s_per_msg", lambda v: f"{v * 1e6:,.2f}"),
            str(metrics["drops"]),
        ]
        rows.append(f"<tr>{head}{''.join(f'<td class=n>{v}</td>' for v in values)}</tr>")
    return "\n".join(rows)


def _with_range(cell: dict[str, Any], metric: str, fmt: Any) -> str:
    """The median of the rounds and, under it, their range (min-max)."""
    value = cell["metrics"][metric]
    if value is None:
        return "—"
    found = samples_of(cell.get("repeats") or [], metric)
    if found is None or len(found.samples) < 2:
        return str(fmt(value))
    return f"{fmt(value)}<br><small>{fmt(found.low)}-{fmt(found.high)}</small>"


def _peer_section(document: dict[str, Any]) -> str:
    rows = peer_rows(document)
    if not rows:
        return ""
    body = []
    for row in rows:

        def ratio(value: float | None, bounds: tuple[float, float] | None = None) -> str:
            if value is None:
                return "—"
            if bounds is None or bounds[0] == bounds[1]:
                return f"{value:.2f}x"
            return f"{value:.2f}x<br><small>{bounds[0]:.2f}-{bounds[1]:.2f}</small>"

        met = row.meets_bar
        verdict = row.note or ("—" if met is None else ("pass" if met else "miss"))
        body.append(
            f'<tr class="{"pass" if met else "miss" if met is False else ""}">'
            f"<td>{_esc(row.suite)}</td><td>{_esc(row.transport)}</td><td>{_esc(format_size(row.size))}</td>"
            f"<td>{row.clients}</td><td>{_esc(row.peer)}</td>"
            f"<td class=n>{ratio(row.msgs_ratio, row.msgs_range)}</td>"
            f"<td class=n>{ratio(row.p50_ratio, row.p50_range)}</td>"
            f"<td>{_esc(verdict)}</td></tr>"
        )
    return (
        f"<h2>ezflow against its peers</h2><p>Same run, cell by cell. Bar: msgs/s ratio ≥ "
        f"{PEER_BAR[0]:g}x and latency p50 ratio ≤ {PEER_BAR[1]:g}x.</p>"
        "<table><tr><th>suite</th><th>transport</th><th>size</th><th>N</th><th>peer</th>"
        "<th>msgs/s ezflow/peer</th><th>p50 ezflow/peer</th><th>bar</th></tr>"
        + "\n".join(body)
        + "</table>"
    )


_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 7px}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.error td{color:#b00}tr.unavailable td{color:#888}
tr.pass td{background:#e9f7ec}tr.miss td{background:#fbeaea}
.plots{display:flex;flex-direction:column;gap:18px}svg{font-size:11px;background:#fff}
svg .t{font-size:14px;font-weight:600}svg .p{font-size:12px;font-weight:600}
svg .frame{fill:none;stroke:#999}svg .grid{stroke:#eee}svg .empty{fill:#888}
table.plan td{font-size:12px}table.plan td.k{color:#555}
.summary{background:#f6f8fa;border:1px solid #ddd;padding:0 1em;max-width:70em}
.summary h3{margin:.6em 0 .2em}.summary ul{margin:.2em 0}
"""


#: What the columns of the tables mean (the summary at the top of the report).
_COLUMNS = (
    ("msgs/s", "messages per second summed over the sinks, published back to back"),
    ("MB/s", "the same in payload megabytes"),
    ("p50 / p99 / max µs", "one-way latency publish -> handled, with messages paced apart"),
    ("loaded p50 µs", "the same while the back-to-back stream runs"),
    ("CPU µs/msg", "CPU time of every process of the cell, per message delivered"),
    ("drops", "messages lost (leaky edges only; lossless cells must show 0)"),
)
#: How many of the biggest regressions and gains the summary names.
SUMMARY_CHANGES = 3


def _figure(metric: str, value: float | None) -> str:
    if value is None:
        return "—"
    if metric == "cpu_s_per_msg":
        return f"{value * 1e6:,.2f} µs"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _change_line(change: Change) -> str:
    framework, suite, transport, size, clients, variant = change.key
    label = dict((metric, name) for metric, name, _ in FIGURES).get(change.metric, change.metric)
    where = f"{framework} {suite} {transport} {format_size(size)} N={clients}"
    where += f" {variant}" if variant else ""
    gain = change.gain or 0.0
    return (
        f"<li>{_esc(where)}: {_esc(label)} {_figure(change.metric, change.base)} → "
        f"{_figure(change.metric, change.new)} "
        f"(<b>{gain:.2f}x</b> {'better' if gain >= 1 else 'worse'})</li>"
    )


def _loads(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def _summary(document: dict[str, Any], base: dict[str, Any] | None) -> str:
    """One screen: what the suites measure, what the columns mean, the floor, and the
    biggest regressions and gains against *base* (when given)."""
    suites = sorted({cell["suite"] for cell in document["cells"]}, key=SUITES.index)
    measured = "".join(
        f"<li><b>{_esc(suite)}</b>: {_esc(SUITE_DESCRIPTIONS[suite])}</li>" for suite in suites
    )
    columns = "".join(f"<li><b>{_esc(n)}</b>: {_esc(text)}</li>" for n, text in _COLUMNS)
    rtt = document["floor"]["socketpair_rtt_us"]
    floor = (
        "the raw floor measured in the same run: a socketpair round trip / 2 of "
        + ", ".join(f"{entry['p50'] / 2:.1f} µs at {format_size(entry['size'])}" for entry in rtt)
        + ", and memcpy; a figure near its floor has little left to win"
        if rtt
        else "no floor was measured in this run"
    )
    if base is None:
        changes = (
            "<p>No base run given: <code>ezflow perf report RESULTS --base OLD</code> "
            "names the biggest regressions and gains here.</p>"
        )
    else:
        compared = [c for c in compare(base, document) if c.gain and c.base and c.new]
        ranked = sorted(compared, key=lambda c: c.gain or 1.0)
        worst = [c for c in ranked if c.verdict in ("worse", "regression")][:SUMMARY_CHANGES]
        best = [c for c in reversed(ranked) if c.verdict == "better"][:SUMMARY_CHANGES]
        quiet = sum(1 for c in compared if c.verdict == NO_CHANGE)
        changes = (
            f"<h3>Biggest regressions against the base ({_esc(base.get('created', '?'))})</h3>"
            f"<ul>{''.join(map(_change_line, worst)) or '<li>none</li>'}</ul>"
            f"<h3>Biggest gains</h3><ul>{''.join(map(_change_line, best)) or '<li>none</li>'}</ul>"
            f"<p>{quiet} of {len(compared)} figures: {NO_CHANGE} (inside the noise: the "
            "ranges of their rounds overlap, or the gain is within 2-3 times the typical "
            "spread of the comparison).</p>"
        )
    env = document["environment"]
    before, after = env.get("load_before"), env.get("load_after")
    load = (
        f"load averages (1, 5, 15 min) {_loads(before)} at the start, {_loads(after)} at the end"
        if before and after
        else "the load was not recorded"
    )
    rounds = document["plan"]["repeats"]
    noise = (
        f"<h3>Noise</h3><p>Every figure is the median of {rounds} round(s), measured in "
        "alternation (each cell once per round, the frameworks of a cell back to back); "
        "the tables show the range of the rounds under it. Ratios within this run are "
        "what it measures. <b>Figures from different runs are not comparable</b>: the "
        "machine, its load and its other jobs change between runs (compare this run's "
        f"floor with the other's; here, {_esc(load)}). Compare two runs with "
        "<code>ezflow perf compare</code>, which calls a difference inside the noise "
        f"&quot;{NO_CHANGE}&quot;.</p>"
    )
    return (
        '<section class="summary"><h2>Summary</h2>'
        f"<h3>What was measured</h3><ul>{measured}</ul>"
        f"<h3>The columns</h3><ul>{columns}</ul>"
        f"<h3>The floor</h3><p>{_esc(floor)}.</p>{noise}{changes}</section>"
    )


#: What each field of a plan means, in the order the table shows them.
_PLAN_FIELDS = (
    ("duration", "back-to-back seconds per cell"),
    ("count", "back-to-back messages per source at most"),
    ("min_messages", "p2p: back-to-back messages at least"),
    ("max_duration", "p2p: back-to-back seconds at most"),
    ("warmup", "warm-up seconds"),
    ("latency_samples", "paced messages per source"),
    ("latency_seconds", "paced phase seconds at most"),
    ("period", "pacing of small messages (s)"),
    ("repeats", "rounds"),
    ("floor_round_trips", "floor round trips"),
    ("loan", "shm publishers loan buffers"),
    ("shm_inline_limit", "shm inline limit (bytes)"),
)


def _plan_value(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def plan_table(plan: dict[str, Any]) -> str:
    """The plan of a run as a small table (three settings a row), with what each means;
    fields this report does not know follow under their own name."""
    known = dict(_PLAN_FIELDS)
    entries = [(known[key], plan[key]) for key, _ in _PLAN_FIELDS if key in plan]
    entries += [(key, value) for key, value in plan.items() if key not in known]
    rows = []
    for start in range(0, len(entries), 3):
        cells = "".join(
            f'<td class="k">{_esc(label)}</td><td class=n>{_esc(_plan_value(value))}</td>'
            for label, value in entries[start : start + 3]
        )
        rows.append(f"<tr>{cells}</tr>")
    return f'<table class="plan"><caption>plan</caption>{"".join(rows)}</table>'


def _command(document: dict[str, Any]) -> str:
    command = document.get("command")
    if not command:
        return ""
    text = " ".join(map(str, command)) if isinstance(command, list) else str(command)
    return f" · <code>{_esc(text)}</code>"


def render(
    document: dict[str, Any], *, title: str = "results", base: dict[str, Any] | None = None
) -> str:
    """The HTML page for *document* (a validated results file); with *base* (an
    earlier results file) its summary names the biggest regressions and gains."""
    cells: list[dict[str, Any]] = document["cells"]
    floor = document["floor"]
    sections = [
        suite_chart(suite, [cell for cell in cells if cell["suite"] == suite], floor)
        for suite in SUITES
        if any(cell["suite"] == suite and cell["status"] == "ok" for cell in cells)
    ]
    env = document["environment"]
    frameworks = ", ".join(
        f"{fw['name']} {fw['version']} ({fw['event_loop']})" for fw in document["frameworks"]
    )
    copies = {entry["size"]: entry["us"] for entry in floor.get("memcpy_us", ())}
    rtts = "".join(
        f"<tr><td>{_esc(format_size(entry['size']))}</td><td class=n>{entry['p50']:.1f}</td>"
        f"<td class=n>{entry['p99']:.1f}</td><td class=n>{entry['p50'] / 2:.1f}</td>"
        f"<td class=n>{_us(copies.get(entry['size']))}</td></tr>"
        for entry in floor["socketpair_rtt_us"]
    )
    rates = {(e["over"], e["size"]): e["msgs_per_s"] for e in floor.get("stream_msgs_per_s", ())}
    paced = "".join(
        f"<tr><td>{_esc(entry['over'])}</td><td>{_esc(format_size(entry['size']))}</td>"
        f"<td class=n>{rates.get((entry['over'], entry['size']), 0):,.0f}</td>"
        f"<td class=n>{entry['p50']:.1f}</td><td class=n>{entry['p99']:.1f}</td></tr>"
        for entry in floor.get("paced_one_way_us", ())
    )
    p2p_floor = (
        "<h3>p2p floor: one raw socket between two processes</h3><table><tr><th>socket</th>"
        "<th>size</th><th>msgs/s</th><th>paced p50 µs</th><th>paced p99 µs</th></tr>"
        f"{paced}</table>"
        if paced
        else ""
    )
    memcpy = floor["memcpy_gb_per_s"]
    revision = (env["git_revision"] or "unknown") + (" (dirty)" if env["git_dirty"] else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ezflow perf: {_esc(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>ezflow perf: {_esc(title)}</h1>
<p>{_esc(document["created"])} · {_esc(frameworks)} · {_esc(env["cpu_model"])},
{env["cores"]} cores · Python {_esc(env["python"])} · git {_esc(revision)} ·
{document["wall_seconds"]:.0f} s{_command(document)}</p>
{plan_table(document["plan"])}
{_summary(document, base)}
<h2>Charts</h2>
<p>One chart per suite: msgs/s summed over the sinks, back to back, and one-way latency
p50 with messages paced apart, against N (the graph suites, when the run measured several
N) or the message size. A line per framework, transport and variant: local dotted, shm
solid, tcp dashed. Grey dashed: the raw floor of the same run, drawn only for the edges
that cross a process (p2p: a raw unix or tcp socket, paced; the graph suites: a
socketpair round trip / 2); a local cell is no socket and beats it.</p>
<div class="plots">{"".join(sections) or "<p>No cell was measured.</p>"}</div>
{_peer_section(document)}
<h2>Every cell</h2>
<table><tr><th>framework</th><th>suite</th><th>transport</th><th>size</th><th>N</th>
<th>variant</th><th>loop</th><th>processes</th><th>crashes</th>
<th>msgs/s</th><th>MB/s</th><th>p50 µs</th><th>p99 µs</th><th>max µs</th><th>loaded p50 µs</th>
<th>CPU µs/msg</th><th>drops</th></tr>
{_cell_rows(cells)}
</table>
<h2>Raw floor (same run)</h2>
<p>memcpy: {"—" if memcpy is None else f"{memcpy:.1f} GB/s"}</p>
<table><tr><th>size</th><th>socketpair RTT p50 µs</th><th>p99 µs</th>
<th>one-way floor µs</th><th>one copy µs</th></tr>{rtts}</table>
{p2p_floor}
<h2>Environment</h2>
<pre>{_esc(json.dumps(env, indent=1))}</pre>
</body></html>
"""
