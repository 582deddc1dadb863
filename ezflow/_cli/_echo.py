"""``ezflow echo TOPIC`` (print messages) and ``ezflow hz TOPIC`` (measure the rate).

Both subscribe leaky by default, so a terminal that prints slowly never holds a
publisher back (``echo --lossless`` to see every message). A topic the graph server
does not know is an error (exit 1), not a wait.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import math
import time
from collections import deque
from typing import Annotated, Any

import numpy as np
import typer
from rich.pretty import Pretty

from .._core._config import format_address
from .._core._exceptions import EndOfStream
from .._graph._context import GraphContext
from ._connection import (
    AddressOption,
    console,
    fail,
    graph_context,
    resolve_address,
    run_async,
)

__all__ = ["ArraySummary", "echo", "hz", "summarize"]

#: Leaky queue of the CLI's subscriber (messages kept while the terminal catches up).
ECHO_QUEUE = 64
HZ_QUEUE = 4096
#: How deep ``summarize`` walks into containers and dataclasses.
MAX_DEPTH = 6


@dataclasses.dataclass(frozen=True)
class ArraySummary:
    """How ``echo`` shows an array: shape, dtype, min and max (no data)."""

    shape: tuple[int, ...]
    dtype: str
    min: Any = None
    max: Any = None

    @classmethod
    def of(cls, array: np.ndarray[Any, Any]) -> ArraySummary:
        low = high = None
        orderable = (
            np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_
        ) and not np.issubdtype(array.dtype, np.complexfloating)
        if array.size and orderable:
            low, high = array.min().item(), array.max().item()
        return cls(tuple(array.shape), str(array.dtype), low, high)

    def __repr__(self) -> str:
        text = f"ndarray shape={self.shape} dtype={self.dtype}"
        if self.min is not None:
            text += f" min={self.min!r} max={self.max!r}"
        return text


def summarize(message: Any, depth: int = 0) -> Any:
    """*message* with every numpy array replaced by an :class:`ArraySummary`,
    looking into dicts, lists, tuples and dataclasses (up to ``MAX_DEPTH`` levels)."""
    if isinstance(message, np.ndarray):
        return ArraySummary.of(message)
    if depth >= MAX_DEPTH:
        return message
    if isinstance(message, dict):
        return {k: summarize(v, depth + 1) for k, v in message.items()}
    if isinstance(message, (list, tuple)) and any(
        isinstance(v, (np.ndarray, dict, list, tuple)) or dataclasses.is_dataclass(v)
        for v in message
    ):
        return type(message)(summarize(v, depth + 1) for v in message)
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        values = {
            f.name: summarize(getattr(message, f.name), depth + 1)
            for f in dataclasses.fields(message)
        }
        return _Shown(type(message).__name__, values)
    return message


@dataclasses.dataclass(frozen=True)
class _Shown:
    """A dataclass message re-shown with its arrays summarised."""

    name: str
    values: dict[str, Any]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"{self.name}({inner})"

    def __rich_repr__(self) -> Any:
        yield from self.values.items()


async def _subscribe(ctx: GraphContext, topic: str, where: str, *, leaky: bool, queue: int) -> Any:
    graph = await ctx.graph()
    if topic not in graph.get("topics", ()):
        fail(
            f"topic {topic!r} does not exist on the graph server at {where} "
            "(`ezflow topics` lists them)"
        )
    return await ctx.subscriber(topic, leaky=leaky, queue=queue if leaky else None)


def _import_modules(modules: list[str] | None) -> None:
    for name in modules or ():
        try:
            importlib.import_module(name)
        except Exception as exc:
            fail(f"cannot import {name!r} (--import): {type(exc).__name__}: {exc}", 2)


ImportOption = Annotated[
    list[str] | None,
    typer.Option(
        "--import",
        "-i",
        help="Import this module first (it registers the message classes of the topic).",
        show_default=False,
    ),
]


def echo(
    topic: Annotated[str, typer.Argument(help="The topic, e.g. SINE/OUTPUT.")],
    address: AddressOption = None,
    count: Annotated[
        int | None, typer.Option("--count", "-n", min=1, help="Stop after N messages.")
    ] = None,
    lossless: Annotated[
        bool,
        typer.Option(
            "--lossless",
            help="Receive every message (holds the publisher back if printing is slow).",
        ),
    ] = False,
    modules: ImportOption = None,
) -> None:
    """Print the messages published on TOPIC.

    Arrays are summarised as shape, dtype, min and max; other messages are
    pretty-printed (with the arrays inside them summarised too).

    Examples:

        ezflow echo SINE/OUTPUT

        ezflow echo /sensor/raw --count 3

        ezflow echo PIPE/EVENTS --import mypackage.messages
    """
    where = resolve_address(address)
    _import_modules(modules)

    async def main() -> None:
        async with graph_context(where, "ezflow echo") as ctx:
            sub = await _subscribe(
                ctx, topic, format_address(where), leaky=not lossless, queue=ECHO_QUEUE
            )
            shown = 0
            async for message in sub:
                shown += 1
                dropped = sub.stats.dropped
                note = f" ({dropped} dropped so far)" if dropped else ""
                console.print(f"[bold]#{shown}[/]{note}", highlight=False)
                summary = summarize(message)
                if isinstance(summary, ArraySummary):
                    console.print(repr(summary), highlight=False)
                else:
                    console.print(Pretty(summary))
                if count is not None and shown >= count:
                    return

    run_async(main)


def _rate_line(times: deque[float], received: int, dropped: int) -> dict[str, Any]:
    intervals = [b - a for a, b in zip(times, list(times)[1:], strict=False)]
    if not intervals:
        return {"messages": received, "dropped": dropped, "rate": None}
    span = times[-1] - times[0]
    mean = span / len(intervals)
    std = math.sqrt(sum((x - mean) ** 2 for x in intervals) / len(intervals))
    return {
        "messages": received,
        "dropped": dropped,
        "rate": len(intervals) / span if span > 0 else math.inf,
        "min_interval": min(intervals),
        "max_interval": max(intervals),
        "std_interval": std,
        "window": len(intervals),
    }


def _show_rate(line: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(line))
        return
    if line["rate"] is None:
        console.print(f"{line['messages']} messages so far; waiting for more", highlight=False)
        return
    dropped = f"  dropped: {line['dropped']}" if line["dropped"] else ""
    console.print(
        f"rate: {line['rate']:.2f} msg/s  min: {line['min_interval'] * 1e3:.3f} ms  "
        f"max: {line['max_interval'] * 1e3:.3f} ms  std: {line['std_interval'] * 1e3:.3f} ms  "
        f"window: {line['window']}{dropped}",
        highlight=False,
    )


def hz(  # noqa: PLR0917 - typer maps parameters to options
    topic: Annotated[str, typer.Argument(help="The topic, e.g. SINE/OUTPUT.")],
    address: AddressOption = None,
    window: Annotated[
        int, typer.Option("--window", "-w", min=2, help="Intervals the figures cover.")
    ] = 1000,
    duration: Annotated[
        float | None,
        typer.Option("--duration", "-d", min=0.1, help="Stop after this many seconds."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    modules: ImportOption = None,
) -> None:
    """Measure the message rate of TOPIC (rate, min/max/std interval).

    The intervals are measured where the messages arrive (this process). Messages
    dropped because this command could not keep up are counted and shown.

    Examples:

        ezflow hz SINE/OUTPUT

        ezflow hz /camera/frames --window 100 --duration 10
    """
    where = resolve_address(address)
    _import_modules(modules)

    async def main() -> None:
        async with graph_context(where, "ezflow hz") as ctx:
            sub = await _subscribe(ctx, topic, format_address(where), leaky=True, queue=HZ_QUEUE)
            times: deque[float] = deque(maxlen=window + 1)
            started = time.monotonic()
            next_print = started + 1.0
            end = None if duration is None else started + duration
            received = 0
            shown: tuple[int, float] | None = None  # (received, last arrival) last shown
            while True:
                now = time.monotonic()
                if end is not None and now >= end:
                    break
                wake = next_print if end is None else min(next_print, end)
                await _recv_until(sub, wake, times)
                received = sub.stats.received
                if time.monotonic() >= next_print:
                    next_print += 1.0
                    _show_rate(_rate_line(times, received, sub.stats.dropped), as_json)
                    shown = (received, times[-1] if times else 0.0)
            if shown != (received, times[-1] if times else 0.0):  # what is new since
                _show_rate(_rate_line(times, received, sub.stats.dropped), as_json)

    run_async(main)


async def _recv_until(sub: Any, deadline: float, times: deque[float]) -> None:
    """Receive (recording arrival times) until the monotonic *deadline*."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            await asyncio.wait_for(sub.recv(), remaining)
        except (TimeoutError, asyncio.TimeoutError, EndOfStream):
            return  # (after an end of stream, recv waits for the next publisher)
        times.append(time.monotonic())
        while sub.queued:
            sub.recv_nowait()
            times.append(time.monotonic())
