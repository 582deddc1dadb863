"""``ezflow top``: live per-channel telemetry from the graph server (``--once --json``
for scripts), with each channel's stage split from the trace hops the server keeps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any, NamedTuple

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .._core._config import format_address
from .._core._exceptions import GraphError, ProtocolError
from .._core._telemetry import ProcessSnapshot, format_ns
from .._core._tracing import STAGES
from .._graph._client import GraphClient
from .._graph._traces import quantiles, stages_of
from ._connection import (
    AddressOption,
    console,
    errors,
    fail,
    graph_client,
    insecure_warning,
    resolve_address,
    run_async,
)
from ._trace import STAGE_STYLES, fetch_hops
from ._zenoh import FleetConfigOption, check_fleet_options

__all__ = ["rows", "top"]


async def fetch(client: GraphClient) -> dict[str, ProcessSnapshot]:
    """The latest snapshot of every process that reported, by client id."""
    reply = await client.request("telemetry")
    processes = reply.get("processes")
    if not isinstance(processes, dict):
        raise ProtocolError("the graph server sent a malformed telemetry reply")
    return {str(cid): ProcessSnapshot.from_wire(data) for cid, data in processes.items()}


async def fetch_traces(client: GraphClient) -> list[dict[str, Any]]:
    """The trace hops the graph server keeps (see :func:`~._trace.fetch_hops`), or none
    when it cannot give them: a server from before tracing refuses the request, and
    top then shows its telemetry without stage splits rather than failing."""
    try:
        return await fetch_hops(client)
    except (GraphError, ProtocolError):
        return []


def _us(value: int | None) -> float | None:
    return None if value is None else value / 1e3


class _Split(NamedTuple):
    """A channel's stage split: how many finished hops it has among the traced ones,
    and the p50 of each stage over them in microseconds (None: no hop knows it)."""

    traced: int
    p50_us: dict[str, float | None]


#: What a channel without traced hops shows.
_UNTRACED = _Split(0, dict.fromkeys(STAGES))

#: A channel: its publisher, and the name and pid of the process that receives it.
_ChannelKey = tuple[str, str, int]


def _splits(hops: Iterable[Mapping[str, Any]]) -> dict[_ChannelKey, _Split]:
    """The stage split of every channel with finished hops (``t_done`` set: a hop still
    being handled has no handler time yet) among *hops*. The p50 is the nearest-rank
    one of ``ezflow trace``, so both commands show the same figure for a channel."""
    stages: dict[_ChannelKey, list[dict[str, int | None]]] = defaultdict(list)
    for hop in hops:
        if hop["t_done"]:
            # The receiving process's name, as the graph server knows its client: the
            # name its channel rows carry. (A process with two contexts reports its
            # hops through either one: those under the other's name are not counted.)
            key = (hop["publisher_id"], str(hop.get("process")), hop["pid"])
            stages[key].append(stages_of(hop))
    return {
        key: _Split(
            len(split),
            {name: _us(quantiles(s[name] for s in split).p50) for name in STAGES},
        )
        for key, split in stages.items()
    }


def rows(
    processes: dict[str, ProcessSnapshot],
    now: float,
    hops: Iterable[Mapping[str, Any]] = (),
) -> dict[str, list[dict[str, Any]]]:
    """Flat rows, one per channel and one per publisher, sorted by topic (what the table
    shows and ``--json`` prints). Latencies are in microseconds, over the whole life of
    the channel (p50, p99, max).

    Each channel row also has ``traced``, how many of the trace *hops* (dicts as
    :func:`~._trace.fetch_hops` gives them) are finished hops of that channel, and
    ``stages_p50_us``, the p50 of each stage over them (every stage None when none is)."""
    splits = _splits(hops)
    channels = []
    publishers = []
    for client_id, snap in processes.items():
        process = {
            "client_id": client_id,
            "process": snap.name,
            "pid": snap.pid,
            "host": snap.hostname,
            "age": round(max(0.0, now - snap.time), 3),
        }
        for ch in snap.channels:
            split = splits.get((ch.publisher_id, snap.name, snap.pid), _UNTRACED)
            channels.append(
                {
                    **process,
                    "topic": ch.topic,
                    "publisher_id": ch.publisher_id,
                    "transport": ch.transport,
                    "subscribers": len(ch.subscribers),
                    "messages": ch.messages,
                    "bytes": ch.bytes,
                    "deliveries": ch.deliveries,
                    "msgs_per_s": round(ch.msgs_per_s, 3),
                    "mb_per_s": round(ch.bytes_per_s / 1e6, 6),
                    "latency_p50_us": _us(ch.latency.p50),
                    "latency_p99_us": _us(ch.latency.p99),
                    "latency_max_us": _us(ch.latency.max if ch.latency.count else None),
                    "decode_mean_us": _us(
                        None if ch.decode.mean is None else round(ch.decode.mean)
                    ),
                    "drops": ch.drops,
                    "dropped_overflow": ch.dropped_overflow,
                    "dropped_upstream": ch.dropped_upstream,
                    "decode_errors": ch.decode_errors,
                    "callback_errors": sum(s.callback_errors for s in ch.subscribers),
                    "queue_depth": ch.queue_depth,
                    "buffers_in_use": ch.buffers_in_use,
                    "rejoins": ch.rejoins,
                    "traced": split.traced,
                    "stages_p50_us": dict(split.p50_us),
                    "subscriber_stats": [
                        {
                            "subscriber_id": s.subscriber_id,
                            "leaky": s.leaky,
                            "queued": s.queued,
                            "received": s.received,
                            "taken": s.taken,
                            "dropped_overflow": s.dropped_overflow,
                            "dropped_upstream": s.dropped_upstream,
                            "callback_errors": s.callback_errors,
                            "handler_p50_us": _us(s.handler.p50),
                            "handler_p99_us": _us(s.handler.p99),
                        }
                        for s in ch.subscribers
                    ],
                }
            )
        for pub in snap.publishers:
            publishers.append(
                {
                    **process,
                    "topic": pub.topic,
                    "publisher_id": pub.publisher_id,
                    "channels": pub.channels,
                    "messages": pub.messages,
                    "bytes": pub.bytes,
                    "msgs_per_s": round(pub.msgs_per_s, 3),
                    "mb_per_s": round(pub.bytes_per_s / 1e6, 6),
                    "drops": pub.drops,
                    "waits": pub.waits,
                    "wait_seconds": pub.wait.total / 1e9,
                    "wait_p99_us": _us(pub.wait.p99),
                    "shm_in_use": pub.shm_in_use,
                    "stalled_cut": pub.stalled_cut,
                    "dead_channels": pub.dead_channels,
                }
            )
    channels.sort(key=lambda r: (r["topic"], r["client_id"], r["publisher_id"]))
    publishers.sort(key=lambda r: (r["topic"], r["client_id"], r["publisher_id"]))
    return {"channels": channels, "publishers": publishers}


def _errors(count: int) -> str:
    # Drops, decode errors, on_message exceptions: each one lost a message for someone.
    return str(count) if not count else f"[red]{count}[/]"


def _process(row: dict[str, Any]) -> str:
    """The process cell: its name without the ``ezflow:`` every unit process's name
    starts with (room for the latency at 80 columns), and its pid."""
    name = str(row["process"]).removeprefix("ezflow:")
    return escape(f"{name} ({row['pid']})")


def _lat(value_us: float | None) -> str:
    return format_ns(None if value_us is None else value_us * 1e3)


#: Cells of the stages column's bar (its width is fixed: a bar and a total).
_SPLIT_CELLS = 10


def _split(row: dict[str, Any]) -> str:
    """A channel's stage split: a bar of ``_SPLIT_CELLS`` cells, each stage's share of it
    filled with the stage's initial in its ``ezflow trace`` colour (``ppttttttqh``:
    readable without colour too), then the sum of the stage p50s. A stage no hop knows
    (timed on another host's clock) is left out and the sum marked ``≥``; ``-`` for a
    channel with no traced hops."""
    if not row["traced"]:
        return "-"
    p50 = row["stages_p50_us"]
    known = {name: p50[name] for name in STAGES if p50.get(name) is not None}
    total = sum(known.values())
    bar = []
    done = 0.0
    drawn = 0
    for name, value in known.items():
        # Cumulative rounding: the segments always add up to the whole bar.
        done += value
        end = round(done / total * _SPLIT_CELLS) if total > 0 else 0
        if end > drawn:
            bar.append(f"[reverse {STAGE_STYLES[name]}]{name[0] * (end - drawn)}[/]")
            drawn = end
    bar.append(" " * (_SPLIT_CELLS - drawn))
    at_least = "≥" if len(known) < len(STAGES) else ""
    return f"{''.join(bar)} {at_least}{_lat(total)}"


#: Columns of the two tables in display order: (header, priority, cell of a row).
#: When the terminal is too narrow for all, the columns with the highest priority
#: number go first; topic and process (priority 0) always stay, whole.
_Column = tuple[str, int, Callable[[dict[str, Any]], str]]
_CHANNEL_COLUMNS: list[_Column] = [
    ("topic", 0, lambda r: escape(r["topic"])),
    ("process", 0, _process),
    ("transport", 4, lambda r: str(r["transport"])),
    ("subs", 6, lambda r: str(r["subscribers"])),
    ("msgs/s", 1, lambda r: f"{r['msgs_per_s']:.1f}"),
    ("MB/s", 8, lambda r: f"{r['mb_per_s']:.2f}"),
    ("lat p50", 3, lambda r: _lat(r["latency_p50_us"])),
    ("lat p99", 7, lambda r: _lat(r["latency_p99_us"])),
    ("drops", 2, lambda r: _errors(r["drops"])),
    ("errors", 5, lambda r: _errors(r["decode_errors"] + r["callback_errors"])),
    ("queue", 9, lambda r: str(r["queue_depth"])),
    ("in use", 10, lambda r: str(r["buffers_in_use"])),
    ("rejoins", 6, lambda r: _errors(r["rejoins"])),
    ("messages", 11, lambda r: str(r["messages"])),
    # Telemetry first: the split is only there while messages are traced.
    ("stages", 12, _split),
]
_PUBLISHER_COLUMNS: list[_Column] = [
    ("topic", 0, lambda r: escape(r["topic"])),
    ("process", 0, _process),
    ("channels", 5, lambda r: str(r["channels"])),
    ("msgs/s", 1, lambda r: f"{r['msgs_per_s']:.1f}"),
    ("MB/s", 8, lambda r: f"{r['mb_per_s']:.2f}"),
    ("wait p99", 4, lambda r: _lat(r["wait_p99_us"])),
    ("wait s", 9, lambda r: f"{r['wait_seconds']:.3f}"),
    ("drops", 2, lambda r: _errors(r["drops"])),
    ("cut", 3, lambda r: _errors(r["stalled_cut"])),
    ("dead", 6, lambda r: _errors(r["dead_channels"])),
    ("shm in use", 10, lambda r: str(r["shm_in_use"])),
    ("messages", 11, lambda r: str(r["messages"])),
]
#: What a column costs besides its text: the borders and one space of padding each side.
_COLUMN_CHROME = 3


def _fit(columns: list[_Column], rows: list[dict[str, Any]], title: str, width: int) -> Table:
    """A table of *rows* with as many *columns* as fit in *width* cells, dropping the
    least important first (named in the caption); kept cells are never cut."""
    cells = [[cell(row) for _, _, cell in columns] for row in rows]
    natural = [
        max([len(header)] + [Text.from_markup(line[i]).cell_len for line in cells])
        for i, (header, _, _) in enumerate(columns)
    ]
    keep = {i for i, (_, priority, _) in enumerate(columns) if priority == 0}
    used = 1 + sum(natural[i] + _COLUMN_CHROME for i in keep)
    for i in sorted(range(len(columns)), key=lambda i: columns[i][1]):
        if i not in keep and used + natural[i] + _COLUMN_CHROME <= width:
            keep.add(i)
            used += natural[i] + _COLUMN_CHROME
    hidden = [header for i, (header, _, _) in enumerate(columns) if i not in keep]
    table = Table(
        title=title,
        title_justify="left",
        caption=f"not shown for width: {', '.join(hidden)} (widen, or --json)" if hidden else None,
        caption_justify="left",
    )
    shown = sorted(keep)
    for i in shown:
        table.add_column(columns[i][0], no_wrap=True, min_width=natural[i])
    for line in cells:
        table.add_row(*(line[i] for i in shown))
    return table


#: Channel columns shown only when some row is not 0 there (rare events: a column of
#: zeros would take the room of a useful one).
_SHOWN_WHEN_NOT_ZERO = {"rejoins"}


def _tables(
    data: dict[str, list[dict[str, Any]]], where: str, width: int, warning: str | None = None
) -> Group:
    """Both tables, fitted to *width* terminal cells, under *warning* if there is one."""
    rows = data["channels"]
    channel_columns = [
        column
        for column in _CHANNEL_COLUMNS
        if column[0] not in _SHOWN_WHEN_NOT_ZERO or any(row.get(column[0]) for row in rows)
    ]
    tables = [
        _fit(channel_columns, rows, f"channels (graph server {where})", width),
        _fit(_PUBLISHER_COLUMNS, data["publishers"], "publishers", width),
    ]
    if warning is None:
        return Group(*tables)
    return Group(Text(warning, style="bold red"), *tables)


def top(  # noqa: PLR0917 - one parameter per command-line option
    address: AddressOption = None,
    once: Annotated[bool, typer.Option("--once", help="Print once and exit.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (with --once: one document).")
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between refreshes.")
    ] = 1.0,
    fleet: Annotated[
        str | None,
        typer.Option(
            "--fleet",
            metavar="DOMAIN",
            help="Every host's telemetry in Zenoh fleet DOMAIN, once (ezflow-pubsub[zenoh]).",
        ),
    ] = None,
    connect: Annotated[
        list[str] | None,
        typer.Option(
            "--connect",
            metavar="ENDPOINT",
            help="With --fleet: the Zenoh router to ask through.",
        ),
    ] = None,
    config: FleetConfigOption = None,
) -> None:
    """Live telemetry per channel and publisher of the whole graph.

    A header names the graph server and the time of the figures; q (or Ctrl-C) quits.
    On a narrow terminal the least useful columns go first (named under each table):
    topic, process, msgs/s, drops and latency stay longest.

    Per channel: msgs/s, MB/s, publish -> deliver latency p50/p99, drops, queue depth,
    buffers in use and transport; per publisher: rate, backpressure wait, drops, and
    channels cut (stall_timeout) or declared dead (silent past the heartbeat deadline).

    Every process reports about once a second (EZFLOW_TELEMETRY_INTERVAL), so figures
    are up to that old; rates cover each process's last report interval.

    stages: where a channel's traced messages spend their time - a bar split by the p50
    of each stage of their hops, each stage drawn with its initial in its `ezflow trace`
    colour: p (publish: room wait, encode, write), t (transport), d (decode), q (queue,
    until the subscriber takes it), h (handler, until the publish it causes or its next
    recv) - then the sum of those p50s. It covers the channel's hops among the newest
    the graph server keeps, so it needs traced messages (`ezflow run --trace N`,
    EZFLOW_TRACE=N, or `ezflow trace --sample N` meanwhile): `-` for a channel with
    none; a sum marked >= leaves out stages timed on another host's clock. It is the
    first column to go on a narrow terminal. --json has stages_p50_us (every stage,
    µs) and traced (how many hops).

    Examples:

        ezflow top

        ezflow top --once --json | jq '.channels[] | {topic, messages, drops}'

        ezflow top --fleet lab --connect tcp/127.0.0.1:7447 --json
    """
    check_fleet_options(fleet, connect, config)
    if fleet is not None:
        _fleet_top(fleet, connect, config, as_json)
        return
    where = resolve_address(address)
    label = format_address(where)

    async def main() -> None:
        async with graph_client(where, "ezflow top") as client:
            warning = insecure_warning(where) if client.server_insecure else None
            if warning is not None and as_json:
                errors.print(warning, highlight=False, markup=False)  # (stdout is JSON)
            document = {"address": label, "insecure": client.server_insecure}

            async def snapshot() -> dict[str, list[dict[str, Any]]]:
                # Every refresh takes all the hops the server keeps (TRACE_SERVER_KEEP):
                # a full server (20 000 hops) costs a few MB and ~0.15 s per --interval.
                processes, hops = await asyncio.gather(fetch(client), fetch_traces(client))
                return rows(processes, time.time(), hops)

            if once:
                data = await snapshot()
                if as_json:
                    typer.echo(json.dumps({**document, **data}, indent=2))
                else:
                    console.print(_header(label, time.time(), live=False), highlight=False)
                    console.print(_tables(data, label, console.width, warning))
                return
            if as_json:
                while True:
                    data = await snapshot()
                    typer.echo(json.dumps({**document, "time": time.time(), **data}))
                    await asyncio.sleep(interval)
            quit_key = asyncio.Event()
            with _quit_on_q(quit_key), Live(console=console, auto_refresh=False) as live:
                while not quit_key.is_set():
                    data = await snapshot()
                    screen = Group(
                        _header(label, time.time(), live=True),
                        _tables(data, label, console.width, warning),
                    )
                    live.update(screen, refresh=True)
                    with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                        await asyncio.wait_for(quit_key.wait(), interval)

    run_async(main)


def _header(where: str, now: float, *, live: bool) -> Text:
    """The line above the tables: which graph, when, and (live) how to quit."""
    text = Text(
        f"ezflow top: graph server {where}, {time.strftime('%H:%M:%S', time.localtime(now))}"
    )
    if live:
        text.append("; q or Ctrl-C quits", style="dim")
    return text


@contextlib.contextmanager
def _quit_on_q(pressed: asyncio.Event) -> Iterator[None]:
    """Set *pressed* when q is typed on the terminal (stdin in cbreak mode meanwhile:
    keys arrive one at a time, unechoed; restored on exit). Nothing without a terminal
    on stdin (or without termios)."""
    try:
        import termios  # noqa: PLC0415 - POSIX only
        import tty  # noqa: PLC0415
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    if not sys.stdin.isatty():
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()

    def typed() -> None:
        try:
            keys = os.read(fd, 64)
        except OSError:
            keys = b""
        if not keys or b"q" in keys.lower():  # q, Q, or the terminal went away
            pressed.set()

    tty.setcbreak(fd)
    loop.add_reader(fd, typed)
    try:
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _fleet_top(domain: str, connect: list[str] | None, config: str | None, as_json: bool) -> None:
    """Every host's rows, with a ``host`` field; one table pair per host."""
    from .. import zenoh as ezflow_zenoh  # noqa: PLC0415 - Zenoh only when asked for
    from ._zenoh import fleet_query  # noqa: PLC0415

    replies = fleet_query(domain, "top", connect, config)
    now = time.time()
    silent = ezflow_zenoh.silent_hosts(replies, now)
    data: dict[str, list[dict[str, Any]]] = {"channels": [], "publishers": []}
    per_host = {}
    bridges: list[dict[str, Any]] = []
    for host, reply in sorted(replies.items()):
        processes = {
            cid: ProcessSnapshot.from_wire(wire) for cid, wire in reply["processes"].items()
        }
        per_host[host] = rows(processes, now)
        for kind in data:
            data[kind] += [{"host_name": host, **row} for row in per_host[host][kind]]
        for mapping, counters in (reply.get("bridge") or {}).items():
            bridges.append({"host_name": host, "mapping": mapping, **counters})
    if as_json:
        document = {"fleet": domain, **data, "bridges": bridges, "silent_hosts": silent}
        typer.echo(json.dumps(document, indent=2))
        return
    if not per_host:
        fail(f"no host of fleet {domain!r} answered (are its bridges started with --fleet?)")
    for host, host_rows in per_host.items():
        console.print(_tables(host_rows, f"host {host}", console.width))
    table = Table(title="bridge mappings", title_justify="left")
    headers = ("host", "mapping", "state", "messages", "dropped", "lost", "refused", "lat p50")
    for header in headers:
        table.add_column(header, no_wrap=header not in ("mapping", "state"))
    for row in bridges:
        state = row.get("state", "")
        if row.get("reason"):
            state = f"{state}: {row['reason']}"
        refused = row.get("refused") or {}
        table.add_row(
            escape(row["host_name"]),
            escape(row["mapping"]),
            escape(state) if state in ("live", "waiting") else f"[red]{escape(state)}[/]",
            str(row["messages"]),
            _errors(row["dropped_local"] + row["dropped_remote"]),
            _errors(row["lost_remote"] + row.get("lost_in_flight", 0)),
            _errors(sum(refused.values())) + "".join(f" {k} {v}" for k, v in refused.items()),
            _lat(row["latency_p50_us"]),
        )
    console.print(table)
    _print_silent(silent)


def _print_silent(silent: list[dict[str, Any]]) -> None:
    """One line per fleet host that did not answer (ezflow graph/top --fleet)."""
    for host in silent:
        when = (
            "its bridge is up but did not answer in time"
            if host["alive"]
            else f"last seen {host['seconds_since_seen']:.0f} s ago"
        )
        errors.print(f"host {host['host']} did not answer: {when}", highlight=False, markup=False)
