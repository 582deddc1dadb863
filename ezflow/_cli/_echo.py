"""``ezflow echo TOPIC`` (print messages) and ``ezflow hz TOPIC`` (measure the rate).

Both subscribe leaky by default, so a terminal that prints slowly never holds a
publisher back (``echo --lossless`` to see every message). A topic the graph server
does not know is an error (exit 1), not a wait.

A message this process cannot decode (most often a dataclass whose class is not
registered here) is counted and shown as ``undecodable``; the first one of each unknown
type is named once on stderr with the fix (``--import MODULE_OR_FILE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import Iterator
from types import ModuleType
from typing import Annotated, Any

import numpy as np
import typer
from rich.markup import escape
from rich.pretty import Pretty

from .._core._channel import SubscriberStats
from .._core._codec import message_fields, register_message
from .._core._config import format_address
from .._core._exceptions import (
    ClosedResourceError,
    ConfigurationError,
    EndOfStream,
    ProtocolError,
)
from .._graph._context import GraphContext
from .._graph._subscriber import Subscriber
from ._connection import (
    AddressOption,
    console,
    errors,
    fail,
    graph_context,
    import_module_or_file,
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
        name = type(message).__name__
        return _shown_as(name)(name, values)
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


@functools.lru_cache(maxsize=256)
def _shown_as(name: str) -> type[_Shown]:
    """A subclass of :class:`_Shown` called *name*: rich prints the class name of an
    object with ``__rich_repr__`` (it printed ``_Shown(...)`` for every dataclass)."""
    return type(name, (_Shown,), {})


async def _subscribe(
    ctx: GraphContext, topic: str, where: str, *, leaky: bool, queue: int
) -> Subscriber:
    graph = await ctx.graph()
    if topic not in graph.get("topics", ()):
        fail(
            f"topic {topic!r} does not exist on the graph server at {where} "
            "(`ezflow topics` lists them)"
        )
    return await ctx.subscriber(topic, leaky=leaky, queue=queue if leaky else None)


def _import_modules(modules: list[str] | None) -> None:
    """Import each ``--import`` (module or file; exits 2 naming it when it cannot) and
    make its message classes known under their script names too."""
    for where in modules or ():
        _known_as_script(import_module_or_file(where, "--import", packages=True))


def _known_as_script(module: ModuleType) -> None:
    """Also register each message class *module* defines under the wire name it has
    when its file runs as a script (``__main__.Name``).

    The wire name of a class depends on how its file was started: ``msgs.Point`` when a
    program imports ``msgs``, ``__main__.Point`` when the publisher is ``python
    msgs.py``. The command cannot know which, so it decodes both: the script name maps
    to a subclass that adds nothing (a class can hold only one name in the registry).
    A name already taken (another imported module defines the same class name) is left
    as it is.
    """
    for value in list(vars(module).values()):
        if not (
            isinstance(value, type)
            and value.__module__ == module.__name__
            and message_fields(value) is not None
        ):
            continue
        alias = type(
            value.__name__,
            (value,),
            {"__module__": "__main__", "__qualname__": value.__qualname__},
        )
        with contextlib.suppress(ConfigurationError):
            register_message(alias)  # default name: __main__.<qualname>


#: The codec's reason for a dataclass whose name is not in this process's registry.
_UNKNOWN_TYPE = re.compile(r"unknown message type '([^']+)'")


class _Undecodable(logging.Filter):
    """Says, once, why messages of one topic could not be decoded here.

    The subscriber counts them (``stats.undecodable``). A lossless subscriber's
    ``recv()`` raises :class:`~ezflow.UndecodableMessageError` in their place (given
    to :meth:`note`); a leaky one only counts them, and the channel and the inbox log
    the reason, the only place that names the type. So this filter, on the
    ``ezflow.channel`` logger while the command runs, takes those records (instead of
    letting them repeat on stderr) and gives their error to :meth:`note`. Each unknown
    type is named once, with the fix; any other reason is shown once.
    """

    def __init__(self, topic: str) -> None:
        super().__init__()
        self.topic = topic
        self._named: set[str] = set()
        self._other_shown = False

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        causes = [*args, record.exc_info[1] if record.exc_info else None]
        error = next((a for a in causes if isinstance(a, ProtocolError)), None)
        if error is None:
            return True
        self.note(error)
        return False

    def note(self, error: BaseException) -> None:
        """Say what *error* (a message that could not be decoded) means, once."""
        reasons = [str(error)]
        if error.__cause__ is not None:
            reasons.append(str(error.__cause__))
        found = next((m for r in reasons if (m := _UNKNOWN_TYPE.search(r))), None)
        if found is not None:
            name = found.group(1)
            if name not in self._named:
                self._named.add(name)
                # A script's classes are __main__.Name on the wire: no module to name.
                where = " (a script's class: --import the script's file)"
                errors.print(
                    f"[yellow]note:[/] message type {escape(repr(name))} is not registered "
                    "in this process: use --import MODULE_OR_FILE to load the module that "
                    f"defines it{where if name.startswith('__main__.') else ''}",
                    highlight=False,
                )
        elif not self._other_shown:
            self._other_shown = True
            errors.print(
                f"[yellow]note:[/] a message on topic {escape(repr(self.topic))} could not "
                f"be decoded (counted as undecodable): {escape(str(error))}",
                highlight=False,
            )

    @contextlib.contextmanager
    def listening(self) -> Iterator[_Undecodable]:
        """Take the channel's decode-failure log records while the block runs."""
        logger = logging.getLogger("ezflow.channel")
        logger.addFilter(self)
        try:
            yield self
        finally:
            logger.removeFilter(self)


ImportOption = Annotated[
    list[str] | None,
    typer.Option(
        "--import",
        "-i",
        metavar="MODULE_OR_FILE",
        help=(
            "Import this module or file first (it registers the message classes of the "
            "topic); repeatable. The current directory is on the import path."
        ),
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
    pretty-printed (with the arrays inside them summarised too). It ends (exit 0) after
    --count messages or at Ctrl-C; when the stream ends (every publisher of TOPIC has
    ended) it says so and waits for a new publisher. Messages that cannot be decoded
    here are counted (--import the module that defines their class).

    Examples:

        ezflow echo SINE/OUTPUT

        ezflow echo /sensor/raw --count 3

        ezflow echo PIPE/EVENTS --import mypackage.messages

        ezflow echo SPECTRUM/OUTPUT --import examples/signal_pipeline.py
    """
    where = resolve_address(address)
    _import_modules(modules)
    undecodable = _Undecodable(topic)

    async def main() -> None:
        async with graph_context(where, "ezflow echo") as ctx:
            sub = await _subscribe(
                ctx, topic, format_address(where), leaky=not lossless, queue=ECHO_QUEUE
            )
            shown = 0
            while True:
                try:
                    message = await sub.recv()
                except EndOfStream:
                    _ended(topic)
                    continue
                except ClosedResourceError:
                    return
                except ProtocolError as exc:  # a lossless subscriber's undecodable message
                    undecodable.note(exc)
                    continue
                shown += 1
                notes = []
                if dropped := _dropped(sub.statistics()):
                    notes.append(f"{dropped} dropped")
                if bad := sub.statistics().undecodable:
                    notes.append(f"{bad} undecodable")
                note = f" ({', '.join(notes)} so far)" if notes else ""
                console.print(f"[bold]#{shown}[/]{note}", highlight=False)
                summary = summarize(message)
                if isinstance(summary, ArraySummary):
                    console.print(repr(summary), highlight=False)
                else:
                    console.print(Pretty(summary))
                if count is not None and shown >= count:
                    return

    with undecodable.listening():
        run_async(main)


def _ended(topic: str) -> None:
    """Say that the stream ended (``recv`` raises EndOfStream once per end, then waits
    for a publisher routed later: the command goes on, as a monitor should)."""
    errors.print(
        f"[yellow]note:[/] end of stream on {escape(repr(topic))}: every publisher has "
        "ended; waiting for a new one (Ctrl-C to stop)",
        highlight=False,
    )


def _dropped(stats: SubscriberStats) -> int:
    """Messages missed for lack of room (the inbox's or the publisher's). A message
    that could not be decoded is shown as undecodable, not as dropped, although a leaky
    inbox counts it in ``stats.dropped`` too."""
    return stats.dropped_overflow + stats.dropped_upstream


def _rate_line(
    times: deque[float], received: int, dropped: int, undecodable: int
) -> dict[str, Any]:
    intervals = [b - a for a, b in zip(times, list(times)[1:], strict=False)]
    if not intervals:
        return {
            "messages": received,
            "dropped": dropped,
            "undecodable": undecodable,
            "rate": None,
        }
    span = times[-1] - times[0]
    mean = span / len(intervals)
    std = math.sqrt(sum((x - mean) ** 2 for x in intervals) / len(intervals))
    return {
        "messages": received,
        "dropped": dropped,
        "undecodable": undecodable,
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
    undecodable = f"  undecodable: {line['undecodable']}" if line["undecodable"] else ""
    if line["rate"] is None:
        console.print(
            f"{line['messages']} messages so far{undecodable}; waiting for more",
            highlight=False,
        )
        return
    dropped = f"  dropped: {line['dropped']}" if line["dropped"] else ""
    console.print(
        f"rate: {line['rate']:.2f} msg/s  min: {line['min_interval'] * 1e3:.3f} ms  "
        f"max: {line['max_interval'] * 1e3:.3f} ms  std: {line['std_interval'] * 1e3:.3f} ms  "
        f"window: {line['window']}{dropped}{undecodable}",
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
    dropped because this command could not keep up are counted and shown, and so are
    messages it could not decode (not in the rate: --import the module that defines
    their class). It ends (exit 0) after --duration or at Ctrl-C; when the stream ends
    (every publisher of TOPIC has ended) it says so and waits for a new publisher.

    Examples:

        ezflow hz SINE/OUTPUT

        ezflow hz /camera/frames --window 100 --duration 10

        ezflow hz SPECTRUM/OUTPUT --import examples/signal_pipeline.py --json
    """
    where = resolve_address(address)
    _import_modules(modules)
    undecodable = _Undecodable(topic)

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
                await _recv_until(sub, wake, times, undecodable)
                received = sub.statistics().received
                if time.monotonic() >= next_print:
                    next_print += 1.0
                    line = _rate_line(
                        times, received, _dropped(sub.statistics()), sub.statistics().undecodable
                    )
                    _show_rate(line, as_json)
                    shown = (received, times[-1] if times else 0.0)
            if shown != (received, times[-1] if times else 0.0):  # what is new since
                line = _rate_line(
                    times, received, _dropped(sub.statistics()), sub.statistics().undecodable
                )
                _show_rate(line, as_json)

    with undecodable.listening():
        run_async(main)


async def _recv_until(
    sub: Subscriber, deadline: float, times: deque[float], undecodable: _Undecodable
) -> None:
    """Receive (recording arrival times) until the monotonic *deadline*. A message that
    cannot be decoded is noted, not timed; an end of stream is noted, and receiving goes
    on (a publisher may come back)."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            await asyncio.wait_for(sub.recv(), remaining)
            times.append(time.monotonic())
            while sub.queued:  # no timer needed for what is already there
                sub.recv_nowait()
                times.append(time.monotonic())
        except (TimeoutError, asyncio.TimeoutError):
            return
        except EndOfStream:
            _ended(sub.topic)
        except ProtocolError as exc:
            undecodable.note(exc)
