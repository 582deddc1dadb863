"""``ezflow trace``: where the time of a running graph goes, per pipeline path, hop and
stage - a waterfall of its traced messages (docs/tracing.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .._core._config import format_address
from .._core._telemetry import format_ns
from .._core._tracing import STAGES, check_trace_rate
from .._graph._client import GraphClient
from .._graph._traces import (
    STAGE_STYLES,
    PathSummary,
    hops_from_reply,
    stage_bar,
    summarize,
)
from ._connection import AddressOption, console, errors, fail, graph_client, resolve_address
from ._connection import run_async as run_command

__all__ = ["STAGE_STYLES", "fetch_hops", "render_paths", "trace"]

_BAR_WIDTH = 40


async def fetch_hops(client: GraphClient) -> list[dict[str, Any]]:
    """Every trace hop the graph server keeps, as dicts (oldest first)."""
    return hops_from_reply(await client.request("traces"))


def _us(ns: int | None) -> str:
    return "-" if ns is None else format_ns(ns)


def render_paths(paths: Sequence[PathSummary], *, title: str = "") -> RenderableType:
    """The waterfall of every path: per hop, a row per stage (p50, p99, and a bar at its
    p50 offset along the path) and the hop total."""
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
    return Group(*parts)


def paths_json(paths: Sequence[PathSummary], address: str, hops: int) -> dict[str, Any]:
    """What ``--json`` prints (times in microseconds)."""
    return {
        "address": address,
        "hops": hops,
        "stages": list(STAGES),
        "paths": [path.to_json() for path in paths],
    }


def trace(
    address: AddressOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    sample: Annotated[
        int | None,
        typer.Option(
            "--sample",
            metavar="N",
            min=1,
            help="Have every process of the graph trace one message in N for --duration "
            "seconds first (then back to their own setting).",
        ),
    ] = None,
    duration: Annotated[
        float,
        typer.Option("--duration", min=0.1, help="Seconds to sample for, with --sample."),
    ] = 3.0,
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
    times (docs/tracing.md).

    Tracing is off unless a graph runs with `ezflow run --trace N` (or EZFLOW_TRACE=N),
    or until --sample turns it on for a while.

    Examples:

        ezflow trace

        ezflow trace --sample 100 --duration 5

        ezflow trace --json | jq '.paths[] | {path, end_to_end}'
    """
    where = resolve_address(address)
    label = format_address(where)

    async def main() -> tuple[list[PathSummary], int]:
        async with graph_client(where, "ezflow trace") as client:
            if sample is not None:
                check_trace_rate(sample, setting="--sample")
                reply = await client.request("trace_rate", rate=sample)
                try:
                    if not as_json:
                        errors.print(
                            f"sampling one message in {sample} for {duration:g} s ...",
                            highlight=False,
                        )
                    # (plus a report interval: the last hops reach the server)
                    await asyncio.sleep(duration + 1.0)
                finally:
                    await client.request("trace_rate", rate=reply.get("previous"))
            hops = await fetch_hops(client)
        return summarize(hops, recent=recent), len(hops)

    paths, count = run_command(main)
    if as_json:
        typer.echo(json.dumps(paths_json(paths, label, count), indent=2))
        return
    if not paths:
        fail(
            f"no traced messages at {label} yet: run the graph with `ezflow run --trace N` "
            "(or EZFLOW_TRACE=N), or sample it now with `ezflow trace --sample 100`"
        )
    console.print(render_paths(paths, title=f"ezflow trace - {label} - {count} hops"))
