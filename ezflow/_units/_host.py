"""Running the units of one process: state, initialize, streams, tasks, stop, shutdown.

Performance model (the runner is on every message's path):

* one task per subscribed input stream; it takes each message from the subscriber and
  calls the unit's subscriber methods directly — no task, lock or queue per message;
* one task per publisher-only async generator, iterating it and publishing each yield;
* ``@task`` methods are tasks, ``@thread`` methods threads, started once.

Ends (docs/units.md, "How a graph ends"): ``return`` or :class:`Complete` ends one
function. Each output stream has *writers* - what may still publish to it: the
``@publisher`` generators that declare it, the input loops whose ``@subscriber``
functions declare it (or declare no output: a plain function may ``self.publish``), and
every ``@task``, ``@thread`` and ``@main`` of the unit. When the last writer finishes,
the output's publisher is closed: its subscribers see the end of stream. An input loop
ends when its subscriber raises :class:`EndOfStream` (or its last function raised
``Complete``). The host is *done* when every input loop ended (or never had a
publisher) and every output has ended; tasks and threads of units without outputs do
not count (they are cancelled when the graph stops). An output whose only writers are
input loops that never had a publisher (nothing is connected to them) is *dormant*: it
ends once the graph stops, and at once with ``end_when_done`` (such an input counts as
ended: nothing will come).

Stopping drains: sources (publisher generators, tasks) are cancelled, so their outputs
end; input loops go on until their inputs end, bounded by the drain timeout; what is
still queued then is counted (:class:`DrainCut`) and cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

from .._core._config import SHUTDOWN_TIMEOUT, THREAD_JOIN_TIMEOUT
from .._core._exceptions import (
    ClosedResourceError,
    EndOfStream,
    UndecodableMessageError,
    UnregisteredTypeError,
)
from .._core._tracing import HANDLING
from .._graph._context import GraphContext
from .._graph._publisher import Publisher
from .._graph._subscriber import Subscriber
from ._component import Unit
from ._decorators import FunctionRole
from ._errors import Complete, MessageTypeError, NormalTermination
from ._plan import stream_topic
from ._streams import InputStream, OutputStream, message_check, type_name
from ._tracebacks import describe, mark_yield_site

__all__ = [
    "DrainCut",
    "UnitHost",
    "graph_context_of",
]

log = logging.getLogger("ezflow.units")


#: (component path, what failed and the user's frames, the same with ezflow's frames)
FailureCallback = Callable[[str, str, str], None]
CompleteCallback = Callable[[str], None]  # (component path)


async def _call(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


@dataclass(frozen=True, slots=True)
class DrainCut:
    """What a drain timeout cut off in one process: messages received and not handled,
    and inputs that had not ended."""

    queued: int = 0
    inputs: int = 0

    def __bool__(self) -> bool:
        return bool(self.queued or self.inputs)


class _Handler:
    __slots__ = ("call", "is_async", "writes")

    def __init__(
        self, call: Callable[[Any], Any], is_async: bool, writes: tuple[Publisher, ...] | None
    ) -> None:
        self.call = call
        self.is_async = is_async
        # The outputs it may publish to: its @publisher streams; None for a plain
        # @subscriber function (it may call self.publish on any output of its unit).
        self.writes = writes


@dataclass(eq=False)
class _Input:
    """One input loop of a unit: its subscriber and its functions."""

    subscriber: Subscriber
    handlers: list[_Handler]
    unit: Unit
    name: str
    task: asyncio.Task[None] | None = None
    external: bool = False  # fed only by other programs (Plan.external_inputs)

    @property
    def data(self) -> bool:
        """False for ``INPUT_SETTINGS``: settings never end, nor hold a graph open."""
        return self.name != "INPUT_SETTINGS"

    @property
    def finished(self) -> bool:
        """The loop ended, or its input never had a publisher and holds nothing (an
        unconnected input cannot hold the graph open)."""
        if self.task is None or self.task.done():
            return True
        sub = self.subscriber
        return not sub.queued and not sub.had_publisher

    @property
    def drained(self) -> bool:
        """Finished, or fed only by other programs and holding nothing: a stopping
        graph does not wait for their publishers to end."""
        return self.finished or (self.external and not self.subscriber.queued)


class _CheckedPublisher:
    """A unit's publisher with run-time type checks (``check_types``): what the unit's
    publishing functions and ``Unit.publish``/``loan`` use instead of the publisher, so
    that with checks off the message path has no check at all."""

    __slots__ = ("_check", "_declared", "_publisher", "_where")

    def __init__(
        self, publisher: Publisher, check: Callable[[object], bool], declared: Any, where: str
    ) -> None:
        self._publisher = publisher
        self._check = check
        self._declared = declared
        self._where = where

    def publish(self, message: Any) -> Coroutine[Any, Any, None]:
        """Raise :class:`MessageTypeError` for a message that does not match the stream's
        declared type; otherwise return the publisher's ``publish(message)`` (the
        coroutine itself: no frame of ours on the message path)."""
        if not self._check(message):
            declared = type_name(self._declared)
            raise MessageTypeError(
                f"{self._where} is declared OutputStream({declared}), but a "
                f"{type_name(type(message))} was published on it: {message!r:.80}; publish "
                f"a {declared}, or declare the stream's type as what it carries"
            )
        return self._publisher.publish(message)

    async def loan(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        return await self._publisher.loan(shape, dtype)


def _underlying(publisher: Publisher) -> Publisher:
    """The publisher itself under a :class:`_CheckedPublisher` (what outputs are
    tracked, closed and compared by)."""
    if isinstance(publisher, _CheckedPublisher):
        return publisher._publisher
    return publisher


_CONTEXT_ATTRIBUTE = "_ezflow_graph_context"


def graph_context_of(unit: Unit) -> GraphContext:
    """The GraphContext *unit* runs on, from ``initialize()`` on: for units whose topics
    are not known when the class is written (a bridge's, named in its settings). Raises
    RuntimeError for a unit that is not running."""
    context = unit.__dict__.get(_CONTEXT_ATTRIBUTE)
    if not isinstance(context, GraphContext):
        raise RuntimeError(f"{unit.path or type(unit).__qualname__} is not running in a graph")
    return context


class UnitHost:
    """Runs *units* on *context*: :meth:`setup`, then :meth:`start`, then :meth:`stop`.

    Failures and ends of unit code are reported through *on_failure* (component path,
    traceback text) and *on_complete* (component path: a unit raised
    :class:`NormalTermination`); *on_done* is called once when every unit is done
    (see the module docstring). The owner decides to stop.
    With *check_types*, every message a unit publishes is checked against its output
    stream's declared type (:class:`MessageTypeError` in the unit when it does not match).
    """

    def __init__(
        self,
        units: list[Unit],
        context: GraphContext,
        *,
        on_failure: FailureCallback,
        on_complete: CompleteCallback,
        on_done: Callable[[], None] | None = None,
        end_when_done: bool = False,
        check_types: bool = False,
        external_inputs: frozenset[str] = frozenset(),
    ) -> None:
        self.units = units
        self._external_inputs = external_inputs
        self._end_when_done = end_when_done
        self.check_types = check_types
        self.context = context
        self._on_failure = on_failure
        self._on_complete = on_complete
        self._on_done = on_done
        self._initialized: list[Unit] = []
        self._inputs: list[_Input] = []
        self._publishers: list[tuple[Unit, str, Callable[[], Any], dict[object, Publisher]]] = []
        self._outputs: dict[str, list[Publisher]] = {}  # by unit path
        self._tasks: dict[asyncio.Task[None], tuple[str, str]] = {}
        self._loops: dict[object, _Input] = {}  # input loop task -> its input
        self._threads: list[tuple[threading.Thread, str, asyncio.Event]] = []
        # Output -> what may still publish to it; the output closes when none is left.
        self._writers: dict[Publisher, set[object]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()  # an input loop or an output ended
        self._done = False
        self._started = False
        self._stopping = False
        self._stopped = asyncio.Event()

    # -- setup ---------------------------------------------------------------------------

    async def setup(self) -> None:
        """Create each unit's state, call ``initialize()``, register its streams.
        A failure is reported and re-raised (the owner then stops)."""
        for unit in self.units:
            unit.__dict__[_CONTEXT_ATTRIBUTE] = self.context
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
                    stall_timeout=stream.stall_timeout,
                )
                check = message_check(stream.message_type) if self.check_types else None
                if check is not None:
                    where = f"{unit.path}.{name}"
                    checked = _CheckedPublisher(outlets[name], check, stream.message_type, where)
                    # Used only through publish() and loan(), which it has.
                    outlets[name] = cast(Publisher, checked)
        by_key: dict[object, Publisher] = {}
        for name, publisher in outlets.items():
            by_key[streams[name]] = publisher
            by_key[unit._bound_stream(streams[name])] = publisher
        unit._ezflow_outlets = by_key
        self._outputs[unit.path] = [_underlying(p) for p in outlets.values()]

        for name, stream in streams.items():
            if not isinstance(stream, InputStream):
                continue
            handlers = [
                self._handler(unit, fname, role, streams, outlets)
                for fname, role in functions.items()
                if role.subscribes is not None and role.subscribes.name == name
            ]
            if name == "INPUT_SETTINGS":
                handlers.insert(0, _Handler(self._settings_handler(unit), True, ()))
            if not handlers:
                continue  # nobody reads it: subscribing would only hold publishers back
            subscriber = await self.context.subscriber(
                stream_topic(unit.path, name),
                leaky=stream.leaky,
                queue=stream.queue,
                transport=stream.transport,
            )
            # A unit input without a publisher is the graph's design, not a typo (the
            # runner checks the graph's topic names).
            self.context._skip_typo_check(subscriber)
            topic = stream_topic(unit.path, name)
            external = topic in self._external_inputs
            self._inputs.append(_Input(subscriber, handlers, unit, name, external=external))
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
            writes = tuple(_underlying(outlets[declared.name]) for declared in role.publishes)

            async def publish_each(message: Any) -> None:
                await _publish_all(method(message), allowed, where)

            return _Handler(publish_each, True, writes)
        if inspect.iscoroutinefunction(method):
            return _Handler(method, True, None)
        return _Handler(method, False, None)

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
        """Start every input loop, publisher, task and thread (after the start barrier).
        Outputs nothing may publish to end at once."""
        self._started = True
        loop = asyncio.get_running_loop()
        for unit in self.units:
            unit._ezflow_running = True
        for publisher in (p for outputs in self._outputs.values() for p in outputs):
            self._writers[publisher] = set()
        for entry in self._inputs:
            task = loop.create_task(self._pump(entry.subscriber, entry.handlers))
            entry.task = task
            self._loops[task] = entry
            writes: set[Publisher] = set()
            for handler in entry.handlers:
                writes.update(
                    self._outputs[entry.unit.path] if handler.writes is None else handler.writes
                )
            self._watch(task, entry.unit.path, f"subscriber of {entry.name}", writes)
        for unit, fname, method, allowed in self._publishers:
            where = f"{unit.path}.{fname}"
            task = loop.create_task(_publish_all(method(), allowed, where))
            self._watch(task, unit.path, fname, {_underlying(p) for p in allowed.values()})
        for unit in self.units:
            for fname, role in type(unit).functions().items():
                if role.kind == "task":
                    task = loop.create_task(getattr(unit, fname)())
                    self._watch(task, unit.path, fname, set(self._outputs[unit.path]))
                elif role.kind == "thread":
                    self._start_thread(loop, unit, fname)
                elif role.kind == "main":
                    self._add_writer(role, set(self._outputs[unit.path]))
        for publisher, writers in self._writers.items():
            if not writers:
                self._close_output(publisher)
        self._settle()

    @property
    def outputs(self) -> set[Publisher]:
        """The publishers of every unit's output streams."""
        return {p for outputs in self._outputs.values() for p in outputs}

    def main_function(self) -> tuple[str, Callable[[], Any]] | None:
        """The ``@main`` method of these units, if any, as (unit path, bound method)."""
        for unit in self.units:
            for fname, role in type(unit).functions().items():
                if role.kind == "main":
                    return unit.path, getattr(unit, fname)
        return None

    def main_finished(self) -> None:
        """The ``@main`` method returned (or raised): its unit's outputs may end."""
        for unit in self.units:
            for role in type(unit).functions().values():
                if role.kind == "main":
                    self._writer_done(role)

    def _add_writer(self, writer: object, outputs: set[Publisher]) -> None:
        for publisher in outputs:
            self._writers[publisher].add(writer)

    def _writer_done(self, writer: object) -> None:
        for publisher, writers in self._writers.items():
            if writer in writers:
                writers.discard(writer)
                if not writers:
                    self._close_output(publisher)

    def _close_output(self, publisher: Publisher) -> None:
        """Nothing may publish to *publisher* any more: close it (END goes out)."""
        task = asyncio.get_running_loop().create_task(publisher.aclose())
        self._closing.add(task)
        task.add_done_callback(self._output_closed)

    def _output_closed(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("closing an output failed: %r", task.exception())
        self._changed.set()
        self._settle()

    def _settle(self) -> None:
        """After any change: end dormant outputs when the graph stops (or with
        end_when_done), and report done."""
        if self._started and (self._stopping or self._end_when_done):
            for publisher, writers in self._writers.items():
                if writers and all(
                    writer in self._loops and self._loops[writer].finished for writer in writers
                ):
                    writers.clear()
                    self._close_output(publisher)
        self._check_done()

    def _watch(
        self, task: asyncio.Task[None], path: str, what: str, writes: set[Publisher]
    ) -> None:
        self._tasks[task] = (path, what)
        self._add_writer(task, writes)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        path, what = self._tasks.pop(task, ("?", "?"))
        self._writer_done(task)
        self._changed.set()
        self._settle()
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None or isinstance(exc, Complete):
            return  # that function is done; the graph goes on
        if isinstance(exc, NormalTermination):
            self._on_complete(path)
        elif isinstance(exc, ClosedResourceError) and self._stopping:
            return  # a publish racing with stop
        else:
            self._fail(path, what, exc)

    def _check_done(self) -> None:
        """Call *on_done* once every input loop and every output has ended."""
        if self._done or not self._started or self._stopping or self._on_done is None:
            return
        if self._closing or any(self._writers.values()):
            return
        if not all(entry.finished for entry in self._inputs if entry.data):
            return
        self._done = True
        self._on_done()

    def _fail(self, path: str, what: str, exc: BaseException) -> None:
        described = describe(exc)
        if isinstance(exc, UndecodableMessageError):
            # The message says it all; a traceback would only show ezflow's inbox.
            details = f"in {what}: {type(exc).__name__}: {exc}"
        else:
            details = f"in {what}:\n{described.short}"
        log.debug("unit %s failed %s", path, details)
        self._on_failure(path, details, f"in {what}:\n{described.full}")

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
                pass  # as returning: this thread is done
            except NormalTermination:
                report(self._on_complete, path)
            except BaseException as exc:
                report(self._fail, path, fname, exc)
            finally:
                report(finished.set)
                report(self._writer_done, finished)

        finished = asyncio.Event()
        self._add_writer(finished, set(self._outputs[path]))
        thread = threading.Thread(target=target, name=f"ezflow {path}.{fname}", daemon=True)
        self._threads.append((thread, f"{path}.{fname}", finished))
        thread.start()

    @staticmethod
    async def _pump(subscriber: Subscriber, handlers: list[_Handler]) -> None:
        # The hot loop: take a message (without awaiting when one is queued), hand it
        # to each subscriber method in turn. The loop ends when the subscriber is closed
        # and empty, at its end of stream, or when its last method raised Complete; any
        # other exception from a method ends it too (and fails the unit).
        # What this loop publishes is caused by what it takes: traced only when that
        # is (sampling starts traces at the sources, whole paths and not halves).
        HANDLING.set(True)
        recv_nowait = subscriber.recv_nowait
        recv = subscriber.recv
        single = handlers[0].call if len(handlers) == 1 and handlers[0].is_async else None
        while True:
            if subscriber.queued:
                message = recv_nowait()
            else:
                try:
                    message = await recv()
                except (ClosedResourceError, EndOfStream):
                    return
            if single is not None:
                try:
                    await single(message)
                except Complete:
                    return
                continue
            for handler in handlers:
                try:
                    if handler.is_async:
                        await handler.call(message)
                    else:
                        handler.call(message)
                except Complete:
                    # Only that function ends (the loop goes on over a new list).
                    handlers = [h for h in handlers if h is not handler]
                    if not handlers:
                        return

    # -- stopping ------------------------------------------------------------------------

    async def stop(
        self, drain_timeout: float = 0.0, hurry: asyncio.Event | None = None
    ) -> DrainCut:
        """Stop, draining first: cancel publisher generators and tasks (their outputs
        end), let the input loops handle what arrives until their inputs end - for up
        to *drain_timeout* seconds, or until *hurry* is set - then count what is still
        queued (returned), cancel the rest, join threads (``THREAD_JOIN_TIMEOUT``),
        and call every initialized unit's ``shutdown()`` in reverse order (a failing
        one is reported, the others still run). Idempotent: a second call waits for
        the first and returns nothing cut."""
        if self._stopping:
            await self._stopped.wait()
            return DrainCut()
        self._stopping = True
        cut = DrainCut()
        try:
            for unit in self.units:
                unit._ezflow_running = False
            pumps = {entry.task for entry in self._inputs}
            await _cancel([task for task in self._tasks if task not in pumps])
            self._settle()
            if self._started and drain_timeout > 0:
                await self._drain(time.monotonic() + drain_timeout, hurry)
            cut = DrainCut(
                queued=sum(entry.subscriber.queued for entry in self._inputs if entry.data),
                inputs=sum(1 for entry in self._inputs if entry.data and not entry.drained),
            )
            await asyncio.gather(
                *(entry.subscriber.aclose() for entry in self._inputs), return_exceptions=True
            )
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
                    hung = f"in shutdown(): did not return within {SHUTDOWN_TIMEOUT:g} s"
                    self._on_failure(unit.path, hung, hung)
                except Exception as exc:
                    self._fail(unit.path, "shutdown()", exc)
            for unit in self.units:
                unit._ezflow_outlets = {}
                unit.__dict__.pop(_CONTEXT_ATTRIBUTE, None)  # a unit may run (and move) again
            if self._closing:
                # (Publisher.aclose is bounded: each channel has CLOSE_TIMEOUT to read
                # up to END, the graph server REQUEST_TIMEOUT to answer.)
                await asyncio.wait(set(self._closing))
        finally:
            self._stopped.set()
        return cut

    async def _drain(self, deadline: float, hurry: asyncio.Event | None) -> None:
        """Wait until every data input loop finished and every output closing has
        ended, the *deadline* (monotonic) passes or *hurry* is set."""
        hurried = asyncio.ensure_future(hurry.wait()) if hurry is not None else None
        try:
            while not (
                all(entry.drained for entry in self._inputs if entry.data) and not self._closing
            ):
                self._settle()
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (hurry is not None and hurry.is_set()):
                    return
                if any(entry.external and not entry.drained for entry in self._inputs):
                    # Nothing signals that such an input emptied its queue: look again.
                    remaining = min(remaining, _EXTERNAL_POLL)
                self._changed.clear()
                changed = asyncio.ensure_future(self._changed.wait())
                waiting = {changed} if hurried is None else {changed, hurried}
                try:
                    await asyncio.wait(
                        waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    changed.cancel()
        finally:
            if hurried is not None:
                hurried.cancel()


#: Seconds to wait for cancelled unit tasks (a task that swallows cancellation is left).
_CANCEL_TIMEOUT = 2.0
#: Seconds between looks at the queue of an input fed by other programs, while draining.
_EXTERNAL_POLL = 0.05


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
    """Iterate the async generator *items* and publish every ``(stream, message)``. What
    publishing raises is marked with the ``yield`` that gave the message (the user's
    line: the generator is suspended there, so its frame is not in the traceback), and
    a message the codec cannot encode is named with the stream's topic."""
    async for item in items:
        try:
            stream, message = item
            publisher = allowed[stream]
        except (TypeError, ValueError, KeyError):
            error = _explain(allowed, item, where)
            mark_yield_site(error, items)
            raise error from None
        try:
            await publisher.publish(message)
        except UnregisteredTypeError as exc:
            topic = _underlying(publisher).topic
            error = UnregisteredTypeError(f"{topic}: {exc}").with_traceback(exc.__traceback__)
            mark_yield_site(error, items)
            raise error from None
        except Exception as exc:
            mark_yield_site(exc, items)
            raise
