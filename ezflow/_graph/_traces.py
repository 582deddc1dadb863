"""Trace hops assembled into pipeline paths: what ``ezflow trace``, ``ezflow perf
waterfall`` and the OpenTelemetry export read.

A *trace* is every hop recorded for one sampled message and what it caused (see
:mod:`ezflow._core._tracing`): hops link to the hop whose handler published them
(``parent_id`` = that hop's ``span_id``; 0 for the first hop). A *path* is one chain
from a first hop to a last one (a hop no recorded hop has as parent); traces that fork
(a publisher with subscribers in several processes) give one path per branch. Paths
with the same sequence of hops - topic, subscribing process and subscriber - are one
pipeline path; :func:`summarize` gives each its stage quantiles.

End to end, for a path, runs from the first hop's publish to the last hop's take (its
subscriber has the message): the sum of every stage of every hop but the last hop's
handler. Hops whose publisher ran on another host have unknown publish and transport
stages (different clocks); such a path has no end-to-end figure.

A trace is *incomplete* when some of its hops were not reported (:func:`missing_of`):
its ``start`` is missing when a hop's parent hop is not among the hops (not reported
yet, lost with a report, overwritten, or reported before the window read), its ``end``
when a hop sent the trace on (``forwarded``: one per receiving process per publish) to
more places than hops of it were reported. Its paths are cut short and their end to end
means nothing: :func:`summarize` leaves incomplete traces out of the pipeline paths, and
:func:`incomplete_of` counts them, per fragment.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from .._core._exceptions import ProtocolError
from .._core._tracing import HOP_FIELDS, STAGES, hop_stages

if TYPE_CHECKING:
    from rich.text import Text

__all__ = [
    "REPORTED_FIELDS",
    "STAGE_STYLES",
    "Fragment",
    "HopSummary",
    "IncompleteSummary",
    "PathSummary",
    "Quantiles",
    "hops_from_reply",
    "incomplete_of",
    "missing_of",
    "paths_of",
    "quantiles",
    "stage_bar",
    "summarize",
    "traces_of",
]

Hop = Mapping[str, Any]

#: The fields of a hop as the graph server gives it (``traces``): the hop's own, then
#: the name of the process that reported it and that process's ``time_ns() -
#: monotonic_ns()``.
REPORTED_FIELDS: Final = (*HOP_FIELDS, "process", "wall_offset")


def hops_from_reply(reply: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The hops of a ``traces`` reply as dicts (oldest first); :class:`ProtocolError`
    when it is not one."""
    fields, rows = reply.get("fields"), reply.get("hops")
    if not isinstance(fields, list) or not isinstance(rows, list):
        raise ProtocolError("the graph server sent a malformed traces reply")
    if not all(isinstance(row, list) and len(row) == len(fields) for row in rows):
        raise ProtocolError("the graph server sent a traces reply with malformed hops")
    return [dict(zip(fields, row, strict=True)) for row in rows]


#: One colour per stage (rich and CSS names alike), in waterfall bars and legends.
STAGE_STYLES = {
    "publish": "magenta",
    "transport": "red",
    "decode": "yellow",
    "queue": "cyan",
    "handler": "green",
}


@dataclass(frozen=True, slots=True)
class Quantiles:
    """p50 and p99 (nearest rank) of some durations, in ns; None without values."""

    p50: int | None
    p99: int | None
    count: int

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "p50_us": None if self.p50 is None else round(self.p50 / 1e3, 3),
            "p99_us": None if self.p99 is None else round(self.p99 / 1e3, 3),
            "count": self.count,
        }


def stage_bar(offset: float, length: float | None, scale: float, style: str) -> Text:
    """A waterfall bar: *length* ns starting *offset* ns in, at *scale* cells per ns, in
    *style* (at least one cell when there is a length; empty when it is unknown).

    Presentation, drawn by ``ezflow trace`` and ``ezflow perf waterfall``: rich is
    imported here, when a bar is drawn, so that importing ezflow (every unit process)
    does not import rich (tests/test_startup.py). It is not in ``_cli`` because
    ``_perf`` draws it too and imports only downward."""
    from rich.text import Text  # noqa: PLC0415 - see above

    if length is None:
        return Text("")
    start = round(offset * scale)
    cells = max(1, round((offset + length) * scale) - start) if length > 0 else 0
    text = Text(" " * start)
    text.append("█" * cells, style=style)
    return text


def quantiles(values: Iterable[int | None]) -> Quantiles:
    known = sorted(v for v in values if v is not None)
    if not known:
        return Quantiles(None, None, 0)

    def rank(q: float) -> int:
        return known[min(len(known) - 1, max(0, round(q * len(known) + 0.5) - 1))]

    return Quantiles(rank(0.5), rank(0.99), len(known))


def _row_of(hop: Hop) -> list[Any]:
    return [hop[name] for name in HOP_FIELDS]


def stages_of(hop: Hop) -> dict[str, int | None]:
    """*hop*'s stage durations (ns) by name (see :func:`~ezflow._core._tracing.hop_stages`)."""
    return hop_stages(_row_of(hop))


def _total(stages: Mapping[str, int | None]) -> int | None:
    known = [v for v in stages.values() if v is not None]
    return sum(known) if len(known) == len(stages) else None


def traces_of(hops: Iterable[Hop]) -> dict[int, list[Hop]]:
    """*hops* by trace id (each trace's hops in the order given)."""
    by_trace: dict[int, list[Hop]] = defaultdict(list)
    for hop in hops:
        by_trace[hop["trace_id"]].append(hop)
    return by_trace


def missing_of(trace: Sequence[Hop]) -> tuple[str, ...]:
    """What is missing of one trace's hops: ``("start",)``, ``("end",)``, both, or
    ``()`` for a complete trace (see the module docstring). A receiving process is one
    delivery of a hop's publish however many of its subscribers took it: deliveries
    are told apart by sending publisher, publish time and receiving process. Hops of an
    ezflow without ``forwarded`` count as sending nothing on."""
    spans = {hop["span_id"] for hop in trace}
    deliveries: dict[int, set[tuple[Any, ...]]] = defaultdict(set)
    start = False
    for hop in trace:
        parent = hop["parent_id"]
        if not parent:
            continue
        if parent in spans:
            deliveries[parent].add(
                (hop["publisher_id"], hop["t_publish"], hop["pid"], hop.get("process"))
            )
        else:
            start = True
    end = any(hop.get("forwarded", 0) > len(deliveries.get(hop["span_id"], ())) for hop in trace)
    return ("start",) * start + ("end",) * end


def paths_of(hops: Iterable[Hop]) -> list[list[Hop]]:
    """Every path of every trace in *hops*, each first hop first. A hop whose parent is
    not among *hops* (not reported yet, or overwritten) starts a path of its own."""
    paths: list[list[Hop]] = []
    for trace in traces_of(hops).values():
        spans = {hop["span_id"]: hop for hop in trace}
        children: dict[int, list[Hop]] = defaultdict(list)
        roots = []
        for hop in trace:
            if hop["parent_id"] in spans:
                children[hop["parent_id"]].append(hop)
            else:
                roots.append(hop)
        for root in sorted(roots, key=lambda h: h["t_publish"]):
            stack: list[list[Hop]] = [[root]]
            while stack:
                path = stack.pop()
                below = children.get(path[-1]["span_id"])
                if not below:
                    paths.append(path)
                    continue
                stack.extend([*path, child] for child in below)
    paths.sort(key=lambda p: p[0]["t_publish"])
    return paths


def end_to_end(path: Sequence[Hop]) -> int | None:
    """First publish to last take, in ns; None when a hop crossed hosts."""
    if not all(hop["same_clock"] for hop in path):
        return None
    return int(path[-1]["t_taken"] - path[0]["t_publish"])


def hop_label(hop: Hop) -> str:
    """What identifies a hop of a pipeline path: topic, and who took it."""
    process = hop.get("process") or f"pid {hop['pid']}"
    return f"{hop['topic']} -> {process}"


def _process(hop: Hop) -> str:
    return str(hop.get("process") or f"pid {hop['pid']}")


def path_name(path: Sequence[Hop]) -> str:
    """A path as ``ezflow trace`` names it: the first topic, then each hop's process."""
    if not path:
        return ""
    return " -> ".join([path[0]["topic"], *(_process(h) for h in path)])


@dataclass(frozen=True, slots=True)
class HopSummary:
    """One hop of a pipeline path, over every trace that took it."""

    topic: str
    process: str
    subscriber: str
    transport: str
    stages: dict[str, Quantiles]
    total: Quantiles

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "process": self.process,
            "subscriber": self.subscriber,
            "transport": self.transport,
            "stages": {name: q.to_json() for name, q in self.stages.items()},
            "total": self.total.to_json(),
        }


@dataclass(frozen=True, slots=True)
class PathSummary:
    """One pipeline path: its hops and end-to-end latency over every trace of it, plus
    the stages of its most recent traces (ns; newest last)."""

    hops: list[HopSummary]
    end_to_end: Quantiles
    traces: int
    recent: list[list[dict[str, int | None]]] = field(default_factory=list)

    @property
    def name(self) -> str:
        if not self.hops:
            return ""
        return " -> ".join([self.hops[0].topic, *(h.process for h in self.hops)])

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.name,
            "traces": self.traces,
            "end_to_end": self.end_to_end.to_json(),
            "hops": [hop.to_json() for hop in self.hops],
            "recent": [
                [{k: None if v is None else round(v / 1e3, 3) for k, v in hop.items()} for hop in t]
                for t in self.recent
            ],
        }


@dataclass(frozen=True, slots=True)
class Fragment:
    """What was reported of incomplete traces: one cut-short path, how many incomplete
    traces have it, and what they miss (``start``, ``end``)."""

    path: str
    traces: int
    missing: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "traces": self.traces,
            "missing": list(self.missing),
            "incomplete": True,
        }


@dataclass(frozen=True, slots=True)
class IncompleteSummary:
    """The incomplete traces among some hops: how many, with how many hops, and their
    fragments (most frequent first)."""

    traces: int = 0
    hops: int = 0
    fragments: list[Fragment] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "hops": self.hops,
            "fragments": [fragment.to_json() for fragment in self.fragments],
        }


def _finished(hops: Iterable[Hop]) -> dict[int, list[Hop]]:
    # (a hop still being handled has no handler time yet: left out)
    return traces_of(hop for hop in hops if hop["t_done"])


def incomplete_of(hops: Iterable[Hop]) -> IncompleteSummary:
    """The incomplete traces of *hops* (:func:`missing_of`; finished hops only), with
    their fragments: what :func:`summarize` leaves out."""
    count = hop_count = 0
    grouped: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    for trace in _finished(hops).values():
        missing = missing_of(trace)
        if not missing:
            continue
        count += 1
        hop_count += len(trace)
        for name in {path_name(path) for path in paths_of(trace)}:
            grouped[name, missing] += 1
    fragments = [
        Fragment(path=name, traces=traces, missing=missing)
        for (name, missing), traces in grouped.items()
    ]
    fragments.sort(key=lambda f: (-f.traces, f.path))
    return IncompleteSummary(traces=count, hops=hop_count, fragments=fragments)


def summarize(hops: Iterable[Hop], *, recent: int = 5) -> list[PathSummary]:
    """The pipeline paths of the complete traces of *hops* with their stage quantiles,
    busiest first; each keeps the stages of its *recent* newest traces. Only finished
    hops count (a hop still being handled has no handler time yet and is left out);
    incomplete traces are left out (:func:`incomplete_of` counts them)."""
    complete = [hop for trace in _finished(hops).values() if not missing_of(trace) for hop in trace]
    grouped: dict[tuple[tuple[str, str, str], ...], list[list[Hop]]] = defaultdict(list)
    for path in paths_of(complete):
        key = tuple((h["topic"], str(h.get("process", h["pid"])), h["subscriber"]) for h in path)
        grouped[key].append(path)
    summaries = []
    for instances in grouped.values():
        first = instances[0]
        hop_summaries = []
        for index, hop in enumerate(first):
            stages = [stages_of(path[index]) for path in instances]
            totals = [_total(s) for s in stages]
            hop_summaries.append(
                HopSummary(
                    topic=hop["topic"],
                    process=str(hop.get("process") or f"pid {hop['pid']}"),
                    subscriber=hop["subscriber"],
                    transport=hop["transport"],
                    stages={name: quantiles(s[name] for s in stages) for name in STAGES},
                    total=quantiles(totals),
                )
            )
        summaries.append(
            PathSummary(
                hops=hop_summaries,
                end_to_end=quantiles(end_to_end(path) for path in instances),
                traces=len(instances),
                recent=[[stages_of(hop) for hop in path] for path in instances[-recent:]],
            )
        )
    summaries.sort(key=lambda s: -s.traces)
    return summaries
