"""A self-contained HTML report of one results file: inline SVG plots, no dependency.

For each suite and transport two plots against message size (log-log): msgs/s and
paced one-way latency p50, one line per framework and N (p2p: per framework and
variant, ``ordinary`` being the program users write), the latency plot with the
socketpair floor (RTT/2) of each size as a dashed line. Then the tables: every cell,
the peer ratios when the run had a peer, the floor and the environment. At the top, a
one-screen summary: what each suite measures, what the columns mean, the floor, and
(given a base run) the biggest regressions and gains.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

from ._compare import FIGURES, PEER_BAR, Change, compare, peer_rows, variant_label
from ._noise import NO_CHANGE, samples_of
from ._spec import SUITE_DESCRIPTIONS, SUITES, TRANSPORTS, format_size

__all__ = ["render"]

_WIDTH, _HEIGHT = 440, 270
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 28, 40
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")

Series = tuple[str, list[tuple[float, float]], bool]  # label, points, dashed


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


def svg_plot(title: str, y_label: str, series: Sequence[Series]) -> str:
    """A log-log line plot of *series* against message size, as an ``<svg>`` element."""
    points = [point for _, line, _ in series for point in line if point[1] > 0]
    if not points:
        return f'<p class="empty">{_esc(title)}: no figures</p>'
    xs = sorted({x for x, _ in points})
    x_low, x_high = (xs[0] / 2, xs[-1] * 2) if len(xs) > 1 else (xs[0] / 4, xs[0] * 4)
    y_ticks = _log_ticks(min(y for _, y in points), max(y for _, y in points))
    y_low, y_high = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def sx(x: float) -> float:
        return _LEFT + plot_w * math.log(x / x_low) / math.log(x_high / x_low)

    def sy(y: float) -> float:
        return _TOP + plot_h * (1 - math.log(y / y_low) / math.log(y_high / y_low))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" '
        f'height="{_HEIGHT + 18 * len(series)}" role="img" aria-label="{_esc(title)}">',
        f'<text x="{_WIDTH / 2}" y="16" text-anchor="middle" class="t">{_esc(title)}</text>',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>',
    ]
    for tick in y_ticks:
        y = sy(tick)
        out.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        )
        out.append(
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt_tick(tick)}</text>'
        )
    for x in xs:
        px = sx(x)
        out.append(
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{_TOP}" y2="{_TOP + plot_h}" class="grid"/>'
        )
        label = _esc(format_size(int(x)))
        out.append(
            f'<text x="{px:.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle">{label}</text>'
        )
    out.append(
        f'<text x="14" y="{_TOP + plot_h / 2}" transform="rotate(-90 14 {_TOP + plot_h / 2})" '
        f'text-anchor="middle">{_esc(y_label)}</text>'
    )
    for index, (label, line, dashed) in enumerate(series):
        color = _COLORS[index % len(_COLORS)]
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        good = sorted((x, y) for x, y in line if y > 0)
        if good:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
            )
            for x, y in good:
                out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>')
        legend_y = _HEIGHT + 18 * index + 4
        out.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + 24}" y1="{legend_y}" y2="{legend_y}" '
            f'stroke="{color}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{_LEFT + 30}" y="{legend_y + 4}">{_esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _series(cells: list[dict[str, Any]], metric: str) -> list[Series]:
    lines: dict[str, list[tuple[float, float]]] = {}
    for cell in cells:
        value = cell["metrics"][metric] if cell["status"] == "ok" else None
        if value:
            variant = variant_label(cell) or f"N={cell['clients']}"
            label = f"{cell['framework']} {variant}"
            lines.setdefault(label, []).append((float(cell["size"]), float(value)))
    return [(label, points, False) for label, points in sorted(lines.items())]


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
.plots{display:flex;flex-wrap:wrap;gap:12px}svg{font-size:11px;background:#fff}
svg .t{font-size:13px;font-weight:600}svg .frame{fill:none;stroke:#999}svg .grid{stroke:#eee}
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


def render(
    document: dict[str, Any], *, title: str = "results", base: dict[str, Any] | None = None
) -> str:
    """The HTML page for *document* (a validated results file); with *base* (an
    earlier results file) its summary names the biggest regressions and gains."""
    cells: list[dict[str, Any]] = document["cells"]
    floor = document["floor"]
    floor_line = [(float(entry["size"]), entry["p50"] / 2) for entry in floor["socketpair_rtt_us"]]
    sections = []
    for suite in SUITES:
        for transport in TRANSPORTS:
            chosen = [c for c in cells if c["suite"] == suite and c["transport"] == transport]
            if not any(cell["status"] == "ok" for cell in chosen):
                continue
            name = f"{suite} over {transport}"
            rate = svg_plot(f"{name}: msgs/s", "msgs/s", _series(chosen, "msgs_per_s"))
            latency_series = _series(chosen, "latency_p50_us")
            latency_series.append(("floor: socketpair RTT/2", floor_line, True))
            latency = svg_plot(f"{name}: latency p50", "µs", latency_series)
            sections.append(f'<div class="plots">{rate}{latency}</div>')
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
{document["wall_seconds"]:.0f} s · plan <code>{_esc(json.dumps(document["plan"]))}</code></p>
{_summary(document, base)}
<h2>Plots</h2>
<p>msgs/s: summed over the sinks, back-to-back. Latency: one-way, paced, median; dashed:
the raw socketpair floor (round trip / 2) of the same size.</p>
{"".join(sections) or "<p>No cell was measured.</p>"}
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
