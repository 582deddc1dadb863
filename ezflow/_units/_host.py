"""Running the units of one process: state, initialize, streams, tasks, stop, shutdown.

Performance model (the runner is on every message's path):

* one task per subscribed input stream; it takes each message from the subscriber and
  calls the unit's subscriber methods directly — no task, lock or queue per message;
* one task per publisher-only async generator, iterating it and publishing each yield;
* ``@task`` methods are tasks, ``@thread`` methods threads, started once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from .._core._exceptions import ClosedResourceError
from .._graph._context import GraphContext
from .._graph._publisher import Publisher
from .._graph._subscriber import Subscriber
from ._component import Unit
from ._decorators import FunctionRole
from ._errors import Complete
from ._plan import stream_topic
from ._streams import InputStream, OutputStream

__all__ = [
    "DRAIN_TIMEOUT",
    "SHUTDOWN_TIMEOUT",
    "THREAD_JOIN_TIMEOUT",
    "UnitHost",
    "format_failure",
]

log = logging.getLogger("ezflow.units")

#: Seconds a stopping process keeps handing already-received messages to subscribers.
DRAIN_TIMEOUT = 1.0
#: Seconds a stopping process waits for its ``@thread`` methods to return.
THREAD_JOIN_TIMEOUT = 2.0
#: Seconds an ``async`` ``shutdown()`` may take before it is cancelled and reported.
SHUTDOWN_TIMEOUT = 5.0

FailureCallback = Callable[[str, str], None]  # (component path, formatted details)
CompleteCallback = Callable[[str], None]  # (component path)


def format_failure(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


async def _call(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


class _Handler:
    __slots__ = ("call", "is_async")

    def __init__(self, call: Callable[[Any], Any], is_async: bool) -> None:
        self.call = call
        self.is_async = is_async


class UnitHost:
    """Runs *units* on *context*: :meth:`setup`, then :meth:`start`, then :meth:`stop`.

    Failures and completions of unit code are reported through *on_failure* (component
    path, traceback text) and *on_complete* (component path); the owner decides to stop.
    """

    def __init__(
        self,
        units: list[Unit],
        context: GraphContext,
        *,
        on_failure: FailureCallback,
        on_complete: CompleteCallback,
    ) -> None:
        self.units = units
        self.context = context
        self._on_failure = on_failure
        self._on_complete = on_complete
        self._initialized: list[Unit] = []
        self._pumps: list[tuple[Subscriber, list[_Handler], Unit, str]] = []
        self._publishers: list[tuple[Unit, str, Callable[[], Any], dict[object, Publisher]]] = []
        self._tasks: dict[asyncio.Task[None], tuple[str, str]] = {}
        self._pump_tasks: list[asyncio.Task[None]] = []
        self._threads: list[tuple[threading.Thread, str, asyncio.Event]] = []
        self._started = False
        self._stopping = False
        self._stopped = asyncio.Event()

    # -- setup ---------------------------------------------------------------------------

    async def setup(self) -> None:
        """Create each unit's state, call ``initialize()``, register its streams.
        A failure is reported and re-raised (the owner then stops)."""
        for unit in self.units:
            try:
                state_type = type(unit).state_type()
                unit.STATE = state_type() if state_type is not None else None
                await _call(unit.initialize())
            except BaseException as exc:
                self._fail(unit.path, "initialize()", exc)
                raise
            self._initialized.append(unit)
        await asyncio.gather(*(self._register_reporting(unit) for unit in self.units))

    async def _register_reporting(self, unit: Unit) -> None:
        try:
            await self._register(unit)
        except Exception as exc:
            self._fail(unit.path, "registering its streams", exc)
            raise

    async def _register(self, unit: Unit) -> None:
        cls = type(unit)
        streams = cls.streams()
        functions = cls.functions()
        outlets: dict[str, Publisher] = {}
        for name, stream in streams.items():
            if isinstance(stream, OutputStream):
                outlets[name] = await self.context.publisher(
                    stream_topic(unit.path, name),
                    max_in_flight=stream.max_in_flight,
                    max_in_flight_bytes=stream.max_in_flight_bytes,
                    transport=stream.transport,
                    shm=stream.shm,
                )
        by_key: dict[object, Publisher] = {}
        for name, publisher in outlets.items():
            by_key[streams[name]] = publisher
            by_key[unit._bound_stream(streams[name])] = publisher
        unit._ezflow_outlets = by_key

        for name, stream in streams.items():
            if not isinstance(stream, InputStream):
                continue
            handlers = [
                self._handler(unit, fname, role, streams, outlets)
                for fname, role in functions.items()
                if role.subscribes is not None and role.subscribes.name == name
            ]
            if name == "INPUT_SETTINGS":
                handlers.insert(0, _Handler(self._settings_handler(unit), True))
            if not handlers:
                continue  # nobody reads it: subscribing would only hold publishers back
            subscriber = await self.context.subscriber(
                stream_topic(unit.path, name),
                leaky=stream.leaky,
                queue=stream.queue,
                transport=stream.transport,
            )
            self._pumps.append((subscriber, handlers, unit, name))
        for fname, role in functions.items():
            if role.publishes and role.subscribes is None:
                allowed = self._allowed(unit, role, streams, outlets)
                self._publishers.append((unit, fname, getattr(unit, fname), allowed))

    @staticmethod
    def _allowed(
        unit: Unit, role: FunctionRole, streams: dict[str, Any], outlets: dict[str, Publisher]
    ) -> dict[object, Publisher]:
        allowed: dict[object, Publisher] = {}
        for declared in role.publishes:
            stream = streams[declared.name]
            publisher = outlets[declared.name]
            allowed[declared] = allowed[stream] = publisher
            allowed[unit._bound_stream(stream)] = publisher
        return allowed

    def _handler(
        self,
        unit: Unit,
        fname: str,
        role: FunctionRole,
        streams: dict[str, Any],
        outlets: dict[str, Publisher],
    ) -> _Handler:
        method = getattr(unit, fname)
        if role.publishes:
            allowed = self._allowed(unit, role, streams, outlets)
            where = f"{unit.path}.{fname}"

            async def publish_each(message: Any) -> None:
                await _publish_all(method(message), allowed, where)

            return _Handler(publish_each, True)
        if inspect.iscoroutinefunction(method):
            return _Handler(method, True)
        return _Handler(method, False)

    def _settings_handler(self, unit: Unit) -> Callable[[Any], Awaitable[None]]:
        async def apply(settings: Any) -> None:
            expected = type(unit).settings_type()
            if expected is None or not isinstance(settings, expected):
                log.error(
                    "%s: ignoring a %s received on INPUT_SETTINGS; %s expects %s",
                    unit.path,
                    type(settings).__qualname__,
                    type(unit).__qualname__,
                    expected.__qualname__ if expected is not None else "no settings",
                )
                return
            unit.SETTINGS = settings
            await _call(unit.on_settings(settings))

        return apply

    # -- running -------------------------------------------------------------------------

    def start(self) -> None:
        """Start every input loop, publisher, task and thread (after the start barrier)."""
        self._started = True
        loop = asyncio.get_running_loop()
        for unit in self.units:
            unit._ezflow_running = True
        for subscriber, handlers, unit, name in self._pumps:
            task = loop.create_task(self._pump(subscriber, handlers))
            self._watch(task, unit.path, f"subscriber of {name}")
            self._pump_tasks.append(task)
        for unit, fname, method, allowed in self._publishers:
            where = f"{unit.path}.{fname}"
            self._watch(loop.create_task(_publish_all(method(), allowed, where)), unit.path, fname)
        for unit in self.units:
            for fname, role in type(unit).functions().items():
                if role.kind == "task":
                    self._watch(loop.create_task(getattr(unit, fname)()), unit.path, fname)
                elif role.kind == "thread":
                    self._start_thread(loop, unit, fname)

    def main_function(self) -> tuple[str, Callable[[], Any]] | None:
        """The ``@main`` method of these units, if any, as (unit path, bound method)."""
        for unit in self.units:
            for fname, role in type(unit).functions().items():
                if role.kind == "main":
                    return unit.path, getattr(unit, fname)
        return None

    def _watch(self, task: asyncio.Task[None], path: str, what: str) -> None:
        self._tasks[task] = (path, what)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        path, what = self._tasks.pop(task, ("?", "?"))
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if isinstance(exc, Complete):
            self._on_complete(path)
        elif isinstance(exc, ClosedResourceError) and self._stopping:
            return  # a publish racing with stop
        else:
            self._fail(path, what, exc)

    def _fail(self, path: str, what: str, exc: BaseException) -> None:
        details = f"in {what}:\n{format_failure(exc)}"
        log.debug("unit %s failed %s", path, details)
        self._on_failure(path, details)

    def _start_thread(self, loop: asyncio.AbstractEventLoop, unit: Unit, fname: str) -> None:
        method = getattr(unit, fname)
        path = unit.path

        def report(callback: Callable[..., None], *args: Any) -> None:
            # A closed loop means the process is ending anyway.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(callback, *args)

        def target() -> None:
            try:
                method()
            except Complete:
                report(self._on_complete, path)
            except BaseException as exc:
                report(self._fail, path, fname, exc)
            finally:
                report(finished.set)

        finished = asyncio.Event()
        thread = threading.Thread(target=target, name=f"ezflow {path}.{fname}", daemon=True)
        self._threads.append((thread, f"{path}.{fname}", finished))
        thread.start()

    @staticmethod
    async def _pump(subscriber: Subscriber, handlers: list[_Handler]) -> None:
        # The hot loop: take a message (without awaiting when one is queued), hand it
        # to each subscriber method in turn. The loop ends when the subscriber is closed
        # and empty; an exception from a method ends it too (and fails the unit).
        recv_nowait = subscriber.recv_nowait
        recv = subscriber.recv
        single = handlers[0].call if len(handlers) == 1 and handlers[0].is_async else None
        while True:
            if subscriber.queued:
                message = recv_nowait()
            else:
                try:
                    message = await recv()
                except ClosedResourceError:
                    return
            if single is not None:
                await single(message)
                continue
            for handler in handlers:
                if handler.is_async:
                    await handler.call(message)
                else:
                    handler.call(message)

    # -- stopping ------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop: cancel publishers and tasks, close the inputs and let them finish the
        messages they already received (up to ``DRAIN_TIMEOUT``), cancel them, join
        threads (``THREAD_JOIN_TIMEOUT``), then call every initialized unit's
        ``shutdown()`` in reverse order (a failing one is reported, the others still
        run). Idempotent."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            for unit in self.units:
                unit._ezflow_running = False
            pumps = set(self._pump_tasks)
            await _cancel([task for task in self._tasks if task not in pumps])
            # Closed subscribers still hand out what they hold, then end their loop.
            await asyncio.gather(
                *(subscriber.aclose() for subscriber, *_ in self._pumps), return_exceptions=True
            )
            if self._pump_tasks:
                await asyncio.wait(self._pump_tasks, timeout=DRAIN_TIMEOUT)
            await _cancel(list(self._tasks))
            deadline = time.monotonic() + THREAD_JOIN_TIMEOUT
            for thread, name, finished in self._threads:
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    await asyncio.wait_for(finished.wait(), max(0.0, deadline - time.monotonic()))
                if thread.is_alive() and not finished.is_set():
                    log.warning(
                        "thread %s did not return within %.0f s of the graph stopping; "
                        "leaving it behind (it should return when self.running is False)",
                        name,
                        THREAD_JOIN_TIMEOUT,
                    )
            for unit in reversed(self._initialized):
                try:
                    await asyncio.wait_for(_call(unit.shutdown()), SHUTDOWN_TIMEOUT)
                except (TimeoutError, asyncio.TimeoutError):
                    self._on_failure(
                        unit.path, f"in shutdown(): did not return within {SHUTDOWN_TIMEOUT:g} s"
                    )
                except Exception as exc:
                    self._fail(unit.path, "shutdown()", exc)
            for unit in self.units:
                unit._ezflow_outlets = {}
        finally:
            self._stopped.set()


#: Seconds to wait for cancelled unit tasks (a task that swallows cancellation is left).
_CANCEL_TIMEOUT = 2.0


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=_CANCEL_TIMEOUT)
        for task in pending:
            log.warning("%s ignored cancellation for %.0f s; leaving it", task, _CANCEL_TIMEOUT)


def _explain(allowed: dict[object, Publisher], item: Any, where: str) -> Exception:
    try:
        stream, _ = item
    except (TypeError, ValueError):
        return TypeError(f"{where} yielded {item!r:.80}; yield (self.STREAM, message) pairs")
    return ValueError(
        f"{where} yielded to {stream!r}, which it does not publish on; add "
        "@ezflow.publisher for that stream"
    )


async def _publish_all(items: Any, allowed: dict[object, Publisher], where: str) -> None:
    """Iterate the async generator *items* and publish every ``(stream, message)``."""
    async for item in items:
        try:
            stream, message = item
            publisher = allowed[stream]
        except (TypeError, ValueError, KeyError):
            raise _explain(allowed, item, where) from None
        await publisher.publish(message)
