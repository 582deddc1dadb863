"""``ezflow trace``: where the time of a running graph goes, per pipeline path, hop and
stage - a waterfall of its traced messages (docs/tracing.md); and the trace rate of each
process (``--rate``), with the graph's lease that ``--sample`` takes and ``--rate 0``
ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .._core._config import (
    MIN_TELEMETRY_INTERVAL,
    TRACE_FLUSH_MARGIN,
    TRACE_FLUSH_MAX_WAIT,
    TRACE_LEASE_GRACE,
    TRACE_LEASE_MAX,
    check_trace_lease_duration,
    format_address,
)
from .._core._exceptions import ConfigurationError
from .._core._telemetry import format_ns
from .._core._tracing import STAGES, check_trace_rate
from .._graph._client import GraphClient
from .._graph._traces import (
    STAGE_STYLES,
    IncompleteSummary,
    PathSummary,
    hops_from_reply,
    incomplete_of,
    stage_bar,
    summarize,
)
from ._connection import AddressOption, console, errors, fail, graph_client, resolve_address
from ._connection import run_async as run_command

__all__ = [
    "STAGE_STYLES",
    "fetch_hops",
    "rates_json",
    "render_incomplete",
    "render_paths",
    "render_rates",
    "trace",
]

_BAR_WIDTH = 40

#: What ``--rate 0`` does, said in its output (docs/tracing.md says the same).
CLEARS = (
    "--rate 0 ends the graph's lease only: a process's own rate (EZFLOW_TRACE, "
    "set_trace_rate, ezflow run --trace) is its own and stays"
)


async def fetch_hops(client: GraphClient) -> list[dict[str, Any]]:
    """Every trace hop the graph server keeps, as dicts (oldest first)."""
    return hops_from_reply(await client.request("traces"))


def window(reply: dict[str, Any], since: int) -> tuple[list[dict[str, Any]], int]:
    """The hops of a ``traces`` *reply* of the traces with a hop reported since hop
    index *since* (what a lease taken then sampled, with the earlier hops of traces it
    caught running), and how many hops reported since are no longer kept."""
    hops = hops_from_reply(reply)
    first = int(reply.get("received") or 0) - len(hops)  # (the oldest kept's index)
    caught = {hop["trace_id"] for hop in hops[max(0, since - first) :]}
    return [hop for hop in hops if hop["trace_id"] in caught], max(0, first - since)


def _us(ns: int | None) -> str:
    return "-" if ns is None else format_ns(ns)


def render_paths(
    paths: Sequence[PathSummary],
    *,
    title: str = "",
    incomplete: IncompleteSummary | None = None,
) -> RenderableType:
    """The waterfall of every path: per hop, a row per stage (p50, p99, and a bar at its
    p50 offset along the path) and the hop total; then the incomplete traces, if any."""
    parts: list[RenderableType] = []
    if title:
        parts.append(Text(title, style="bold"))
    legend = Text("stages: ")
    for name in STAGES:
        legend.append("█ ", style=STAGE_STYLES[name])
        legend.append(f"{name}  ")
    parts.append(legend)
    for path in paths:
        e2e = path.end_to_end
        table = Table(
            title=f"{path.name}  ({path.traces} traced; end to end p50 {_us(e2e.p50)}, "
            f"p99 {_us(e2e.p99)})",
            title_justify="left",
            expand=False,
        )
        table.add_column("hop / stage")
        table.add_column("p50", justify="right")
        table.add_column("p99", justify="right")
        table.add_column("waterfall (p50)", no_wrap=True)
        # The bars share one scale: the sum of every stage's p50 along the path.
        span = sum(
            q.p50 or 0
            for i, hop in enumerate(path.hops)
            for name, q in hop.stages.items()
            if not (name == "handler" and i == len(path.hops) - 1)
        )
        last_handler = (path.hops[-1].stages["handler"].p50 or 0) if path.hops else 0
        scale = _BAR_WIDTH / max(1, span + last_handler)
        offset = 0
        for index, hop in enumerate(path.hops, 1):
            table.add_row(
                Text(f"{index}. {hop.topic} -> {hop.process} ({hop.transport})", style="bold"),
                _us(hop.total.p50),
                _us(hop.total.p99),
                "",
            )
            for name in STAGES:
                q = hop.stages[name]
                table.add_row(
                    f"   {name}",
                    _us(q.p50),
                    _us(q.p99),
                    stage_bar(offset, q.p50 or 0, scale, STAGE_STYLES[name]),
                )
                offset += q.p50 or 0
        parts.append(table)
    if incomplete is not None and incomplete.traces:
        parts.append(render_incomplete(incomplete))
    return Group(*parts)


def render_incomplete(incomplete: IncompleteSummary) -> RenderableType:
    """The incomplete traces: a table of their fragments (what was reported of them),
    left out of the paths and their end-to-end figures."""
    heading = Text(
        f"incomplete traces: {incomplete.traces} ({incomplete.hops} hops) - not all their "
        "hops were reported (cut by the end of sampling, a lost report, or overwritten at "
        "the server); left out of the paths above",
        style="bold",
    )
    table = Table(expand=False)
    table.add_column("fragment (incomplete)")
    table.add_column("traces", justify="right")
    table.add_column("missing")
    for fragment in incomplete.fragments:
        table.add_row(
            fragment.path,
            str(fragment.traces),
            " and ".join(f"its {part}" for part in fragment.missing),
        )
    return Group(heading, table)


def paths_json(
    paths: Sequence[PathSummary],
    address: str,
    hops: int,
    incomplete: IncompleteSummary | None = None,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What ``--json`` prints (times in microseconds)."""
    incomplete = incomplete or IncompleteSummary()
    report: dict[str, Any] = {
        "address": address,
        "hops": hops,
        "stages": list(STAGES),
        "traces": sum(path.traces for path in paths),
        "paths": [path.to_json() for path in paths],
        "incomplete": incomplete.to_json(),
    }
    if sampling is not None:
        report["sampling"] = sampling
    return report


# -- rates -------------------------------------------------------------------------------


def _rate(rate: int | None) -> str:
    if rate is None:
        return "?"
    return "off" if rate == 0 else "every message" if rate == 1 else f"1 in {rate}"


def _process_name(process: dict[str, Any]) -> str:
    return f"{process.get('name') or process.get('client_id')} (pid {process.get('pid')})"


def _lease_line(lease: dict[str, Any]) -> str:
    return (
        f"graph lease {lease['id']}: {_rate(lease['rate'])} for {lease['duration']:g} s, "
        f"{lease['remaining']:.1f} s left (asked by {lease['by']}); each process also ends it "
        f"by itself at most {TRACE_LEASE_GRACE:g} s after that"
    )


def _source(state: dict[str, Any], age: float) -> str:
    if state["lease"] is not None:
        left = max(0.0, (state["left"] or 0.0) - age)
        return f"graph lease {state['lease']} (ends by itself in {left:.1f} s at the latest)"
    own = state["own_source"]
    return "own: default (EZFLOW_TRACE unset)" if own == "default" else f"own: {own}"


def rates_json(address: str, reply: dict[str, Any], *, cleared: bool = False) -> dict[str, Any]:
    """What ``--rate --json`` prints: the lease, the last one that ended
    (``last_ended``: ``id``, ``rate``, ``ago``, ``how``) and every process's rates
    (``rate`` in force, ``source`` ``"lease"`` or ``"own"``, ``own``, ``own_source``,
    ``lease``, ``lease_left`` in seconds, ``age``: seconds since the process said so);
    for ``--rate 0`` also ``cleared`` (the lease it ended), ``clears`` and
    ``unconfirmed``."""
    processes = []
    for process in reply.get("processes") or ():
        state = process.get("state")
        age = process.get("age") or 0.0
        entry = {
            "client_id": process.get("client_id"),
            "name": process.get("name"),
            "pid": process.get("pid"),
            "hostname": process.get("hostname"),
        }
        if state is None:
            entry.update(
                rate=None,
                source=None,
                own=None,
                own_source=None,
                lease=None,
                lease_left=None,
                age=None,
            )
        else:
            entry.update(
                rate=state["rate"],
                source="own" if state["lease"] is None else "lease",
                own=state["own"],
                own_source=state["own_source"],
                lease=state["lease"],
                lease_left=None
                if state["left"] is None
                else round(max(0.0, state["left"] - age), 3),
                age=age,
            )
        processes.append(entry)
    report: dict[str, Any] = {
        "address": address,
        "lease": reply.get("lease"),
        "processes": processes,
    }
    if "ended" in reply and not cleared:
        report["last_ended"] = reply["ended"]  # (id, rate, ago, how)
    if cleared:
        report["cleared"] = reply.get("ended")
        report["clears"] = CLEARS
        report["unconfirmed"] = reply.get("unconfirmed") or []
    return report


def render_rates(reply: dict[str, Any], *, title: str) -> RenderableType:
    """Every process's trace rate, where it comes from and its own setting."""
    table = Table(title=title, title_justify="left", expand=False)
    for column in ("process", "host", "rate", "from", "own rate", "as of"):
        table.add_column(column)
    for process in sorted(reply.get("processes") or (), key=_process_name):
        state = process.get("state")
        age = process.get("age") or 0.0
        if state is None:
            table.add_row(_process_name(process), process.get("hostname", ""), "?", "not told yet")
            continue
        table.add_row(
            _process_name(process),
            process.get("hostname", ""),
            _rate(state["rate"]),
            _source(state, age),
            _rate(state["own"]),
            f"{age:.1f} s ago",
        )
    return table


def _rates_header(reply: dict[str, Any]) -> str:
    lease = reply.get("lease")
    if lease is None:
        return "no graph lease: every process traces at its own rate"
    return _lease_line(lease)


def _cleared_header(reply: dict[str, Any]) -> str:
    ended = reply.get("ended")
    if ended is None:
        return f"no graph lease was running: nothing to end ({CLEARS})"
    line = (
        f"ended graph lease {ended['id']} ({_rate(ended['rate'])}, {ended['remaining']:.1f} s "
        f"left, asked by {ended['by']}): every process is back to its own rate ({CLEARS})"
    )
    unconfirmed = reply.get("unconfirmed") or []
    if unconfirmed:
        line += (
            f"; not confirmed yet by {', '.join(unconfirmed)} (each ends it by itself "
            f"within {ended['remaining'] + TRACE_LEASE_GRACE:.1f} s)"
        )
    return line


# -- sampling ------------------------------------------------------------------------------


@dataclass
class _Sampling:
    """One ``--sample`` run: the lease, and what came of waiting for the last reports."""

    lease: dict[str, Any]
    since: int
    stopped_early: bool = False
    waited: float = 0.0
    late: list[str] = field(default_factory=list)
    overwritten: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "lease": self.lease["id"],
            "rate": self.lease["rate"],
            "duration": self.lease["duration"],
            "stopped_early": self.stopped_early,
            "waited_for_reports": round(self.waited, 3),
            "late": self.late,
            "overwritten": self.overwritten,
        }


@contextlib.contextmanager
def _stop_signals(stop: asyncio.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM set *stop* while inside (then the defaults again)."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def _waiting_for(status: dict[str, Any], lease_id: str) -> list[dict[str, Any]]:
    """The processes whose hops of lease *lease_id* are not all at the server yet: those
    that report telemetry and still hold it, or left it without reporting since."""
    waiting = []
    for process in status.get("processes") or ():
        state = process.get("state")
        if not process.get("interval") or state is None:
            continue  # (no reports: its hops never reach the server)
        holds = state["lease"] == lease_id
        left = process.get("left_lease") == lease_id
        if holds or (left and process.get("flushed_lease") != lease_id):
            waiting.append(process)
    return waiting


async def _wait_for_reports(client: GraphClient, lease_id: str) -> tuple[list[str], float]:
    """After lease *lease_id* ended: wait until every process that held it reported
    since (its report carries every hop it finished under the lease), at most the
    longest report interval plus ``TRACE_FLUSH_MARGIN`` (and ``TRACE_FLUSH_MAX_WAIT``).
    Return the processes still not heard from, and the seconds waited."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    status = await client.request("trace_status")
    intervals = [p["interval"] for p in status.get("processes") or () if p.get("interval")]
    budget = min(max(intervals, default=0.0) + TRACE_FLUSH_MARGIN, TRACE_FLUSH_MAX_WAIT)
    while True:
        waiting = _waiting_for(status, lease_id)
        if not waiting or loop.time() - began >= budget:
            return [_process_name(p) for p in waiting], loop.time() - began
        await asyncio.sleep(MIN_TELEMETRY_INTERVAL)  # (reports come no faster)
        status = await client.request("trace_status")


async def _sample(client: GraphClient, rate: int, duration: float, *, quiet: bool) -> _Sampling:
    """Take the graph's lease for *duration* seconds at *rate*, wait for it to end (or
    for Ctrl-C / SIGTERM, which end it early), then for the processes' last reports."""
    reply = await client.request("trace_lease", rate=rate, duration=duration)
    lease = reply["lease"]
    sampling = _Sampling(lease=lease, since=int(reply["received"]))
    if not quiet:
        replaced = reply.get("replaced")
        note = f"; replaced lease {replaced['id']}" if replaced else ""
        unconfirmed = reply.get("unconfirmed") or []
        if unconfirmed:
            note += f"; not confirmed yet by {', '.join(unconfirmed)}"
        errors.print(
            f"sampling {_rate(rate)} for {duration:g} s on {len(reply.get('processes') or ())} "
            f"processes (graph lease {lease['id']}{note}) ...",
            highlight=False,
        )
    stop = asyncio.Event()
    with _stop_signals(stop):
        try:
            await asyncio.wait_for(stop.wait(), lease["remaining"])
        except (TimeoutError, asyncio.TimeoutError):
            pass  # the server ends the lease now (its own timer)
        else:
            sampling.stopped_early = True
            await client.request("end_trace_lease", lease=lease["id"])
            if not quiet:
                errors.print("stopped early: the lease is ended", highlight=False)
    sampling.late, sampling.waited = await _wait_for_reports(client, lease["id"])
    if sampling.late and not quiet:
        errors.print(
            f"no report since the lease ended from {', '.join(sampling.late)} after "
            f"{sampling.waited:.1f} s: its last hops may be missing (traces shown as incomplete)",
            highlight=False,
        )
    return sampling


# -- the command ---------------------------------------------------------------------------


def trace(  # noqa: PLR0917 - one parameter per command-line option
    address: AddressOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    sample: Annotated[
        int | None,
        typer.Option(
            "--sample",
            metavar="N",
            min=1,
            help="Take the graph's trace lease: every process traces one message in N for "
            "--duration seconds (then back to its own rate, by itself even if this command "
            "is killed), and show what was traced in that time.",
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration",
            metavar="S",
            help=f"Seconds to sample for, with --sample (default 3, at most {TRACE_LEASE_MAX:g}).",
            show_default=False,
        ),
    ] = None,
    rate: Annotated[
        bool,
        typer.Option(
            "--rate",
            help="Show each process's trace rate and where it comes from (its own setting, or "
            "the graph's lease and its time left). `--rate 0` ends the lease now on every "
            "process (own settings stay).",
        ),
    ] = False,
    value: Annotated[
        int | None,
        typer.Argument(
            metavar="0",
            help="With --rate: 0 ends the graph's trace lease now.",
            show_default=False,
        ),
    ] = None,
    recent: Annotated[
        int, typer.Option("--recent", min=0, help="Newest traces per path listed in --json.")
    ] = 5,
) -> None:
    """Where the time goes: a waterfall of a running graph's traced messages.

    Traced messages carry a trace id through every hop: publish (room wait, encode,
    write), transport, decode, queue (until the subscriber takes it) and handler (until
    the publish it causes, or its next recv). Per pipeline path it shows each hop's
    stages, p50 and p99, and a bar per stage at its place along the path. Times are
    CLOCK_MONOTONIC on one host; a hop from another host has no publish and transport
    times. Traces not all of whose hops were reported are counted as incomplete, apart
    (docs/tracing.md).

    Tracing is off unless a graph runs with `ezflow run --trace N` (or EZFLOW_TRACE=N),
    or while --sample holds the graph's lease: a rate with an end, which every process
    keeps to by itself. --rate shows who traces at what rate; --rate 0 ends the lease.

    Examples:

        ezflow trace

        ezflow trace --sample 100 --duration 5

        ezflow trace --rate

        ezflow trace --rate 0

        ezflow trace --json | jq '.paths[] | {path, end_to_end}'
    """
    where = resolve_address(address)
    label = format_address(where)
    if value is not None and not rate:
        fail(f"{value} is a value of --rate: `ezflow trace --rate 0` ends the graph's lease", 2)
    if rate and value not in (None, 0):
        fail(
            f"--rate takes 0 only (end the graph's trace lease now); to trace one message "
            f"in {value} for a while: ezflow trace --sample {value} --duration S",
            2,
        )
    if rate and sample is not None:
        fail("--rate and --sample do not go together: sample first, then look at --rate", 2)
    if duration is not None and sample is None:
        fail("--duration is the length of --sample: give --sample N too", 2)
    try:
        if sample is not None:
            check_trace_rate(sample, setting="--sample")
        seconds = check_trace_lease_duration(
            3.0 if duration is None else duration, setting="--duration"
        )
    except ConfigurationError as exc:
        fail(str(exc), 2)

    if rate:
        _rates(where, label, clear=value == 0, as_json=as_json)
        return

    async def main() -> tuple[list[dict[str, Any]], _Sampling | None]:
        async with graph_client(where, "ezflow trace") as client:
            sampling = None
            if sample is not None:
                sampling = await _sample(client, sample, seconds, quiet=as_json)
                hops, sampling.overwritten = window(await client.request("traces"), sampling.since)
            else:
                hops = await fetch_hops(client)
        return hops, sampling

    hops, sampling = run_command(main)
    paths = summarize(hops, recent=recent)
    incomplete = incomplete_of(hops)
    if as_json:
        report = paths_json(
            paths,
            label,
            len(hops),
            incomplete,
            None if sampling is None else sampling.to_json(),
        )
        typer.echo(json.dumps(report, indent=2))
        return
    if not paths and not incomplete.traces:
        if sampling is not None:
            fail(
                f"no message was traced at {label} while sampling: does the graph publish, "
                "and do its processes report telemetry (EZFLOW_TELEMETRY_INTERVAL)?"
            )
        fail(
            f"no traced messages at {label} yet: run the graph with `ezflow run --trace N` "
            "(or EZFLOW_TRACE=N), or sample it now with `ezflow trace --sample 100`"
        )
    traces = sum(path.traces for path in paths)
    title = f"ezflow trace - {label} - {len(hops)} hops, {traces} traces"
    if incomplete.traces:
        title += f" (and {incomplete.traces} incomplete)"
    if sampling is not None and sampling.overwritten:
        title += f"; {sampling.overwritten} hops of the window no longer kept (TRACE_SERVER_KEEP)"
    console.print(render_paths(paths, title=title, incomplete=incomplete))


def _rates(where: tuple[str, int], label: str, *, clear: bool, as_json: bool) -> None:
    """``--rate`` (and ``--rate 0``)."""

    async def main() -> dict[str, Any]:
        async with graph_client(where, "ezflow trace --rate") as client:
            return await client.request("end_trace_lease" if clear else "trace_status")

    reply = run_command(main)
    if as_json:
        typer.echo(json.dumps(rates_json(label, reply, cleared=clear), indent=2))
        return
    header = _cleared_header(reply) if clear else _rates_header(reply)
    console.print(Text(header), highlight=False)
    console.print(render_rates(reply, title=f"ezflow trace --rate - {label}"))
