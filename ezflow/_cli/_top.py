"""``ezflow top``: live per-channel telemetry from the graph server (``--once --json``
for scripts)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from .._core._config import format_address
from .._core._exceptions import ProtocolError
from .._core._telemetry import ProcessSnapshot, format_ns
from .._graph._client import GraphClient
from ._connection import AddressOption, console, graph_client, resolve_address, run_async

__all__ = ["rows", "top"]


async def fetch(client: GraphClient) -> dict[str, ProcessSnapshot]:
    """The latest snapshot of every process that reported, by client id."""
    reply = await client.request("telemetry")
    processes = reply.get("processes")
    if not isinstance(processes, dict):
        raise ProtocolError("the graph server sent a malformed telemetry reply")
    return {str(cid): ProcessSnapshot.from_wire(data) for cid, data in processes.items()}


def _us(value: int | None) -> float | None:
    return None if value is None else value / 1e3


def rows(processes: dict[str, ProcessSnapshot], now: float) -> dict[str, list[dict[str, Any]]]:
    """Flat rows, one per channel and one per publisher, sorted by topic (what the table
    shows and ``--json`` prints). Latencies are in microseconds, over the whole life of
    the channel (p50, p99, max)."""
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
    # Decode errors and on_message exceptions: each one lost a message for someone.
    return str(count) if not count else f"[red]{count}[/]"


def _lat(value_us: float | None) -> str:
    return format_ns(None if value_us is None else value_us * 1e3)


def _tables(data: dict[str, list[dict[str, Any]]], where: str) -> Group:
    channels = Table(
        "topic",
        "process",
        "transport",
        "subs",
        "msgs/s",
        "MB/s",
        "lat p50",
        "lat p99",
        "drops",
        "errors",
        "queue",
        "in use",
        "messages",
        title=f"channels (graph server {where})",
        title_justify="left",
    )
    for row in data["channels"]:
        channels.add_row(
            escape(row["topic"]),
            escape(f"{row['process']} ({row['pid']})"),
            row["transport"],
            str(row["subscribers"]),
            f"{row['msgs_per_s']:.1f}",
            f"{row['mb_per_s']:.2f}",
            _lat(row["latency_p50_us"]),
            _lat(row["latency_p99_us"]),
            str(row["drops"]) if not row["drops"] else f"[red]{row['drops']}[/]",
            _errors(row["decode_errors"] + row["callback_errors"]),
            str(row["queue_depth"]),
            str(row["buffers_in_use"]),
            str(row["messages"]),
        )
    publishers = Table(
        "topic",
        "process",
        "channels",
        "msgs/s",
        "MB/s",
        "wait p99",
        "wait s",
        "drops",
        "cut",
        "dead",
        "shm in use",
        "messages",
        title="publishers",
        title_justify="left",
    )
    for row in data["publishers"]:
        publishers.add_row(
            escape(row["topic"]),
            escape(f"{row['process']} ({row['pid']})"),
            str(row["channels"]),
            f"{row['msgs_per_s']:.1f}",
            f"{row['mb_per_s']:.2f}",
            _lat(row["wait_p99_us"]),
            f"{row['wait_seconds']:.3f}",
            str(row["drops"]),
            _errors(row["stalled_cut"]),
            _errors(row["dead_channels"]),
            str(row["shm_in_use"]),
            str(row["messages"]),
        )
    return Group(channels, publishers)


def top(
    address: AddressOption = None,
    once: Annotated[bool, typer.Option("--once", help="Print once and exit.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (with --once: one document).")
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between refreshes.")
    ] = 1.0,
) -> None:
    """Live telemetry per channel and publisher of the whole graph.

    Per channel: msgs/s, MB/s, publish -> deliver latency p50/p99, drops, queue depth,
    buffers in use and transport; per publisher: rate, backpressure wait, drops, and
    channels cut (stall_timeout) or declared dead (silent past the heartbeat deadline).

    Every process reports about once a second (EZFLOW_TELEMETRY_INTERVAL), so figures
    are up to that old; rates cover each process's last report interval.

    Examples:

        ezflow top

        ezflow top --once --json | jq '.channels[] | {topic, messages, drops}'
    """
    where = resolve_address(address)
    label = format_address(where)

    async def main() -> None:
        async with graph_client(where, "ezflow top") as client:
            if once:
                data = rows(await fetch(client), time.time())
                if as_json:
                    typer.echo(json.dumps({"address": label, **data}, indent=2))
                else:
                    console.print(_tables(data, label))
                return
            if as_json:
                while True:
                    data = rows(await fetch(client), time.time())
                    typer.echo(json.dumps({"address": label, "time": time.time(), **data}))
                    await asyncio.sleep(interval)
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    data = rows(await fetch(client), time.time())
                    live.update(_tables(data, label), refresh=True)
                    await asyncio.sleep(interval)

    run_async(main)
