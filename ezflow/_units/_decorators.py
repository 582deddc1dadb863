"""Decorators that give unit methods a role: subscriber, publisher, task, thread, main.

Each decorator records the role on the function (``fn.__ezflow_role__``) and returns
the function itself, so they stack in any order. Misuse (a publisher that is not an
async generator, a task that is not a coroutine function, ...) raises ``TypeError``
when the class is defined, naming the function and what to write instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ._streams import InputStream, OutputStream

__all__ = ["FunctionRole", "main", "publisher", "role_of", "subscriber", "task", "thread"]

_F = TypeVar("_F", bound=Callable[..., Any])


class FunctionRole:
    """What the decorators recorded about one unit method."""

    __slots__ = ("kind", "publishes", "subscribes")

    def __init__(self) -> None:
        self.subscribes: InputStream | None = None
        self.publishes: list[OutputStream] = []
        self.kind: str | None = None  # "task", "thread" or "main"

    def __repr__(self) -> str:
        return f"FunctionRole({self.subscribes!r}, {self.publishes!r}, {self.kind!r})"


def role_of(fn: object) -> FunctionRole | None:
    return getattr(fn, "__ezflow_role__", None)


def _role(fn: Any, decorator: str) -> FunctionRole:
    if not callable(fn):
        raise TypeError(f"@ezflow.{decorator} decorates a function, not {fn!r}")
    role = role_of(fn)
    if role is None:
        role = FunctionRole()
        fn.__ezflow_role__ = role
    return role


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", repr(fn))


def subscriber(stream: InputStream) -> Callable[[_F], _F]:
    """Call the decorated method with every message arriving on *stream* (an
    :class:`~ezflow.InputStream` of the same class).

    The method is ``async def on_x(self, msg)``, a plain ``def`` (called inline, for
    cheap handlers), or — also decorated with :func:`publisher` — an async generator
    yielding ``(stream, message)`` pairs to publish. Messages are handled one at a
    time, in arrival order, directly from the input's receive loop: the next message of
    the same input is taken only when the method returned. A method may subscribe to
    one stream; several methods may subscribe to the same stream (called in definition
    order). Raising :class:`~ezflow.Complete` stops calling this method; once every
    publisher feeding the stream has ended (and every message was handled), the
    stream's methods are no longer called.
    """
    if not isinstance(stream, InputStream):
        raise TypeError(
            f"@ezflow.subscriber needs an InputStream of the class, not {stream!r}; "
            "declare INPUT = ezflow.InputStream(type) and write @ezflow.subscriber(INPUT)"
        )

    def decorate(fn: _F) -> _F:
        role = _role(fn, "subscriber")
        if role.subscribes is not None:
            raise TypeError(
                f"{_name(fn)} already subscribes to {role.subscribes.name}; a method "
                "subscribes to one stream (write one method per input)"
            )
        if role.kind is not None:
            raise TypeError(f"{_name(fn)} is a @{role.kind} and cannot also be a @subscriber")
        role.subscribes = stream
        return fn

    return decorate


def publisher(stream: OutputStream) -> Callable[[_F], _F]:
    """Let the decorated async generator publish on *stream* by yielding
    ``(self.STREAM, message)``; stack several to publish on several streams.

    Alone, the generator is started once when the graph starts and iterated in one task
    (return from it to stop publishing; each yield waits while a lossless subscriber is
    ``max_in_flight`` messages behind). With :func:`subscriber`, it runs once per
    received message. Yielding to a stream not named in a ``@publisher`` raises.
    """
    if not isinstance(stream, OutputStream):
        raise TypeError(
            f"@ezflow.publisher needs an OutputStream of the class, not {stream!r}; "
            "declare OUTPUT = ezflow.OutputStream(type) and write @ezflow.publisher(OUTPUT)"
        )

    def decorate(fn: _F) -> _F:
        if not inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"@ezflow.publisher({stream.name}) needs an async generator function: "
                f"{_name(fn)} must be `async def` and `yield self.{stream.name}, message`"
            )
        role = _role(fn, "publisher")
        if role.kind is not None:
            raise TypeError(f"{_name(fn)} is a @{role.kind} and cannot also be a @publisher")
        if any(s is stream for s in role.publishes):
            raise TypeError(f"{_name(fn)} is decorated twice with @publisher({stream.name})")
        role.publishes.append(stream)
        return fn

    return decorate


def _kind(kind: str, fn: Any) -> FunctionRole:
    role = _role(fn, kind)
    if role.subscribes is not None or role.publishes or role.kind is not None:
        raise TypeError(
            f"{_name(fn)}: @{kind} cannot be combined with "
            f"{'@' + role.kind if role.kind else '@subscriber/@publisher'}"
        )
    role.kind = kind
    return role


def task(fn: _F) -> _F:
    """Run ``async def method(self)`` as a task once the graph has started; it is
    cancelled when the graph stops. Returning (or raising :class:`~ezflow.Complete`)
    ends just this task; raising :class:`~ezflow.NormalTermination` ends the graph;
    any other exception fails it. While it runs, the unit's outputs stay open (it may
    publish to any of them)."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"@ezflow.task needs an `async def` method; {_name(fn)} is not one "
            "(use @ezflow.thread for blocking code)"
        )
    _kind("task", fn)
    return fn


def thread(fn: _F) -> _F:
    """Run the blocking ``def method(self)`` in its own worker thread once the graph has
    started. It cannot be cancelled: loop while ``self.running`` and return when it
    turns false (the graph waits a bounded time for it, then leaves it behind as a
    daemon thread, logging so). Returning or raising :class:`~ezflow.Complete` ends just
    this thread; :class:`~ezflow.NormalTermination` ends the graph."""
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"@ezflow.thread needs a plain `def` method; {_name(fn)} is async (use @ezflow.task)"
        )
    _kind("thread", fn)
    return fn


def main(fn: _F) -> _F:
    """Run the blocking ``def method(self)`` in the main thread of the unit's process
    once the graph has started (for GUI toolkits and the like; the event loop then runs
    in a worker thread). When it returns, the graph ends normally, as if it raised
    :class:`~ezflow.NormalTermination`. At most one per process; with :class:`ezflow.GraphRunner`
    the unit must be in ``process_components`` (the caller owns the main thread)."""
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"@ezflow.main needs a plain `def` method; {_name(fn)} is async (use @ezflow.task)"
        )
    _kind("main", fn)
    return fn
