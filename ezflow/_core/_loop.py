"""Event-loop choice: uvloop when it is installed, the stock asyncio loop otherwise.

``EZFLOW_EVENT_LOOP=asyncio`` forces the stock loop, ``uvloop`` requires uvloop.
Everything in ezflow works on both; uvloop is simply faster.
"""

from __future__ import annotations

import asyncio
import os
from asyncio.base_events import BaseEventLoop
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ._config import ENV_EVENT_LOOP
from ._exceptions import ConfigurationError

__all__ = [
    "WakeHandle",
    "loop_factory",
    "loop_kind",
    "ready_queue",
    "run_coroutine",
    "run_lone_wake",
]

T = TypeVar("T")


def loop_factory(kind: str | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """A callable creating the event loop ezflow would use.

    *kind* is ``"uvloop"``, ``"asyncio"`` or ``None`` (``EZFLOW_EVENT_LOOP``, else
    uvloop when installed).
    """
    choice = (kind or os.environ.get(ENV_EVENT_LOOP, "") or "auto").strip().lower()
    if choice == "asyncio":
        return asyncio.new_event_loop
    if choice in ("uvloop", "auto"):
        try:
            import uvloop  # noqa: PLC0415 - optional: absent on Windows
        except ImportError:
            if choice == "uvloop":
                raise ConfigurationError(
                    f"{ENV_EVENT_LOOP}=uvloop but uvloop is not installed; "
                    "pip install uvloop or use asyncio"
                ) from None
            return asyncio.new_event_loop
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    raise ConfigurationError(
        f"{ENV_EVENT_LOOP}={choice!r} is not an event loop; use 'uvloop' or 'asyncio'"
    )


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` for a uvloop loop (a subclass of one included), else ``"asyncio"``."""
    is_uvloop = any(cls.__module__.startswith("uvloop") for cls in type(loop).__mro__)
    return "uvloop" if is_uvloop else "asyncio"


def ready_queue(loop: object) -> deque[asyncio.Handle] | None:
    """The queue of handles *loop* runs in its next iteration, when *loop* is the stock
    asyncio loop (its ``call_soon`` is ``BaseEventLoop``'s) and not in debug mode; else
    None.

    Appending a handle there from a callback of the running loop is what ``call_soon``
    does, without its checks (a closed loop: not while it runs a callback; the thread:
    debug mode only) and without creating the handle: a handle built once and appended
    again each time it is to run (never twice before it ran) costs a cold path a
    microsecond where ``call_soon`` costs five to seven (after a millisecond's sleep,
    with the caches cold: ``call_soon``, ``_check_closed``, ``_call_soon``,
    ``Handle.__init__`` and ``get_debug`` are five Python frames). uvloop's
    ``call_soon`` is compiled: there the callers keep calling it.
    """
    if (
        getattr(type(loop), "call_soon", None) is not BaseEventLoop.call_soon
        or not isinstance(loop, BaseEventLoop)
        or loop.get_debug()
    ):
        return None
    ready = getattr(loop, "_ready", None)
    return ready if type(ready) is deque else None


class WakeHandle(asyncio.Handle):
    """The kept handle that wakes a task waiting for a message (``Inbox``): a plain
    :class:`asyncio.Handle` whose type tells :func:`run_lone_wake` what it is."""

    __slots__ = ()


def run_lone_wake(loop: asyncio.AbstractEventLoop, ready: deque[asyncio.Handle]) -> None:
    """At the end of a read callback of *loop* (the stock loop; *ready*: its
    :func:`ready_queue`): when the one handle queued is a :class:`WakeHandle` (the read
    delivered a message to a task waiting for it, and nothing else is due), run it now
    instead of in the loop's next iteration.

    Nothing changes order: that handle is the next the loop would run, before whatever
    its next poll or its timers add (those go behind it), and nothing of this
    iteration is left to run (a handle of this iteration not yet run would be ahead of
    it in *ready*). What goes is the iteration in between - a poll of the selector with
    a zero timeout and the loop's bookkeeping, a few microseconds on the path of every
    paced message, with the caches cold. Not once the loop is stopping (its next
    iteration would not come)."""
    if len(ready) == 1 and type(ready[0]) is WakeHandle and not loop._stopping:  # type: ignore[attr-defined]
        handle = ready.popleft()
        if not handle._cancelled:  # (as the loop skips one)
            handle._run()


def run_coroutine(main: Coroutine[Any, Any, T], *, loop: str | None = None) -> T:
    """Run *main* to completion on a new event loop (uvloop when available), like
    :func:`asyncio.run`."""
    factory = loop_factory(loop)
    if hasattr(asyncio, "Runner"):  # Python >= 3.11
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    event_loop = factory()  # pragma: no cover - Python 3.10
    try:
        asyncio.set_event_loop(event_loop)
        return event_loop.run_until_complete(main)
    finally:
        try:
            for task in asyncio.all_tasks(event_loop):
                task.cancel()
            event_loop.run_until_complete(event_loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            event_loop.close()
