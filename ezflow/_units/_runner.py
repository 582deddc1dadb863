"""GraphRunner (non-blocking, for tests and notebooks) and ezflow.run (blocking).

Size: :class:`GraphRunner`, one class of about 640 lines, and :func:`ezflow.run` with the
signal handling it needs (first and second SIGINT/SIGTERM, drain cuts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._core._config import (
    CHILD_STOP_TIMEOUT,
    FORK_TIMEOUT,
    INTERRUPT_STOP_TIMEOUT,
    START_TIMEOUT,
    Address,
    check_drain_timeout,
    check_types_from_env,
    debug_from_env,
    drain_timeout_from_env,
    format_address,
    start_method_from_env,
)
from .._core._exceptions import ClosedResourceError
from .._core._interrupts import take_interrupt
from .._core._loop import loop_kind, run_coroutine
from .._graph._context import GraphContext
from .._graph._publisher import Publisher
from . import _process
from ._component import Component
from ._errors import GraphDefinitionError, ProcessDiedError, UnitError
from ._forkserver import ForkedProcess, ForkServer
from ._host import DrainCut, UnitHost
from ._mainthread import MainThreadGate, run_beside_main
from ._message_types import shipped_message_types
from ._plan import MAIN_PROCESS, Plan, build_plan, stream_topic
from ._process import ChildProcess, preparation
from ._settings import Settings
from ._streams import OutputStream
from ._tracebacks import describe, show_to_user

__all__ = ["GraphRunner", "run"]

log = logging.getLogger("ezflow.units")


@dataclass
class _Failure:
    component: str
    process: str
    details: str  # what failed, the user's frames and the failing line
    full: str = ""  # the same with every frame (EZFLOW_DEBUG=1)
    returncode: int | None = None  # set for a process that died

    def describe(self, debug: bool = False) -> str:
        details = self.full if debug and self.full else self.details
        if self.returncode is not None:
            return details
        where = f" (process {self.process})" if self.process != "main" else ""
        return f"unit {self.component}{where} failed {details}"


#: Seconds a unit process that died of SIGINT waits to be recognised as ended by the
#: Ctrl-C that the runner's handler is about to see (see _killed_by_our_ctrl_c).
_SIGINT_GRACE = 0.1


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _merge(
    components: Mapping[str, Component] | None, named: Mapping[str, Component]
) -> dict[str, Component]:
    merged: dict[str, Component] = {}
    if components is not None:
        if not isinstance(components, Mapping):
            raise GraphDefinitionError(
                "components must be a mapping of names to components, e.g. "
                "components={'SINE': sine}"
            )
        merged.update(components)
    for name, component in named.items():
        if name in merged:
            raise GraphDefinitionError(
                f"duplicate component name {name!r}: given in components= and as a keyword"
            )
        merged[name] = component
    return merged


class GraphRunner:
    """Runs a graph of units without blocking: ``async with GraphRunner(...) as runner``.

    Arguments are those of :func:`ezflow.run`. The graph is validated on construction
    (:class:`~ezflow.GraphDefinitionError`). :meth:`start` (or entering the context)
    starts the unit processes, creates every unit's streams, connects them and only
    then lets any unit run — the start barrier: nothing published after start can miss
    a subscriber that is still starting. Once started, :attr:`context` is a
    :class:`~ezflow.GraphContext` on the same graph server, for test publishers and
    subscribers on the units' topics (``"SINE/OUTPUT"``).

    The graph ends when a unit raises :class:`~ezflow.NormalTermination`, a ``@main``
    returns, with *end_when_done* once every unit is done (every source ended and every
    message was handled: docs/units.md), when a unit fails or a unit process dies, or
    on :meth:`stop`. A normal stop drains: sources stop, and the units go on handling
    what lossless edges already accepted until their inputs end, for up to
    *drain_timeout* seconds (default ``EZFLOW_DRAIN_TIMEOUT``, else 5; what it cuts is
    counted and logged in one line); a failure stops at once. :meth:`wait` and
    :meth:`stop` return once everything has stopped, and raise
    :class:`~ezflow.UnitError` (or :class:`~ezflow.ProcessDiedError`) when a unit
    failed; leaving the context stops the graph and raises it too, unless the body
    raised. A failure is raised once. Publishers the caller created on
    :attr:`context` are closed when the graph starts to stop (so that units reading
    them see their end).
    """

    def __init__(
        self,
        components: Mapping[str, Component] | None = None,
        *,
        connections: Iterable[object] = (),
        process_components: Iterable[object] = (),
        graph_address: Address | str | None = None,
        force_single_process: bool = False,
        check_types: bool | None = None,
        end_when_done: bool = False,
        drain_timeout: float | None = None,
        settings: Mapping[str, Mapping[str, object]] | None = None,
        **named_components: Component,
    ) -> None:
        self.check_types = check_types_from_env() if check_types is None else bool(check_types)
        self._end_when_done = bool(end_when_done)
        self._drain_timeout = (
            drain_timeout_from_env()
            if drain_timeout is None
            else check_drain_timeout(drain_timeout)
        )
        self.plan: Plan = build_plan(
            _merge(components, named_components),
            connections,
            process_components,
            force_single_process=force_single_process,
            settings=settings,
        )
        self._graph_address = graph_address
        #: "forkserver" or "spawn" (EZFLOW_START_METHOD; docs/architecture.md)
        self._start_method = start_method_from_env()
        self._forkserver: ForkServer | None = None
        # Unit processes asked of the fork server and not adopted yet (their future,
        # and our end of their control socket).
        self._forking: list[tuple[str, asyncio.Future[ForkedProcess], socket.socket]] = []
        self._state = "new"
        self._context: GraphContext | None = None
        self._host: UnitHost | None = None
        self._children: list[ChildProcess] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._failures: list[_Failure] = []
        self._raised = False
        self._completed_by: str | None = None
        self._end = asyncio.Event()
        self._finished = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._settings_publishers: dict[str, Publisher] = {}
        self._allow_main = False
        self._gate: MainThreadGate | None = None
        self._host_done = False
        self._hurry = asyncio.Event()  # stop draining (a second signal, or a failure)
        self._interrupted = False  # a second signal: say what was cut, exit 130
        self._sigint = False  # stopping because of SIGINT (Ctrl-C), see _killed_by_our_ctrl_c

    # -- public API ----------------------------------------------------------------------

    @property
    def context(self) -> GraphContext:
        """The runner's GraphContext (while the graph runs)."""
        if self._context is None or self._state not in ("running", "stopping"):
            raise ClosedResourceError("the graph is not running")
        return self._context

    @property
    def completed_by(self) -> str | None:
        """The path of the unit that ended the graph with NormalTermination (or whose
        ``@main`` returned), if one did."""
        return self._completed_by

    @property
    def processes(self) -> dict[str, int]:
        """Unit processes by name, with their pids (the runner's own process excluded)."""
        return {child.name: child.pid for child in self._children}

    def describe(self) -> str:
        """One line saying where the graph runs: the graph server address and, per
        process, its pid and units, e.g. ``graph server 127.0.0.1:41234; processes:
        main pid 10 (SOURCE, SINK), RELAY pid 11 (RELAY)`` (what ``ezflow run`` prints
        at start). Call it once the graph started."""
        pids = {MAIN_PROCESS: os.getpid(), **self.processes}
        parts = [
            f"{process or 'main'} pid {pids.get(process, '?')} ({', '.join(paths)})"
            for process, paths in self.plan.processes.items()
            if paths
        ]
        return f"graph server {format_address(self.context.address)}; processes: {', '.join(parts)}"

    async def __aenter__(self) -> GraphRunner:
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._end.set()
        if exc_type is not None:
            await self._wait_finished()
            return
        await self.stop()

    async def start(self) -> None:
        """Start every process and unit, behind the start barrier. Raises
        :class:`~ezflow.UnitError` when a unit fails to initialize or a process fails
        to start (everything started is stopped first). Cancellation-safe."""
        if self._state != "new":
            raise RuntimeError("a GraphRunner can be started once")
        if _process.importing_main:
            raise RuntimeError(
                "a graph was started while a unit process imports the main script (to "
                "find the unit classes defined there); start graphs under "
                "`if __name__ == '__main__':`"
            )
        self._state = "starting"
        for note in self.plan.notes:
            log.warning("%s", note)
        try:
            await self._start()
        except BaseException:
            await asyncio.shield(self._shutdown())
            self._state = "stopped"
            self._finished.set()
            self._raise_failures()
            raise
        self._state = "running"
        self._supervisor = asyncio.ensure_future(self._supervise())

    async def wait(self) -> None:
        """Wait until the graph has ended and stopped; raise if a unit failed."""
        await self._wait_finished()
        self._raise_failures()

    async def stop(self) -> None:
        """Stop the graph gracefully (every ``shutdown()`` runs) and wait for it; raise
        if a unit failed. Idempotent."""
        self._end.set()
        await self._wait_finished()
        self._raise_failures()

    def request_stop(self) -> None:
        """Ask the graph to stop without waiting (safe from signal handlers)."""
        self._end.set()

    async def update_settings(self, path: str, settings: Settings) -> None:
        """Send *settings* to the ``INPUT_SETTINGS`` stream of the unit at *path*
        (``"PIPE/FILTER"``); the unit replaces ``self.SETTINGS`` and calls
        ``on_settings`` when it receives them (returns once they were published).
        Raises :class:`~ezflow.GraphDefinitionError` for an unknown path or settings of
        the wrong class."""
        unit = self.plan.units.get(path)
        if unit is None:
            raise GraphDefinitionError(
                f"update_settings: there is no unit {path!r}; units: {', '.join(self.plan.units)}"
            )
        expected = type(unit).settings_type()
        if expected is None or not isinstance(settings, expected):
            raise GraphDefinitionError(
                f"update_settings({path!r}): {type(unit).__qualname__} expects "
                f"{expected.__qualname__ if expected else 'no settings'}, not "
                f"{type(settings).__qualname__}"
            )
        publisher = self._settings_publishers.get(path)
        if publisher is None:
            publisher = await self.context.publisher(stream_topic(path, "INPUT_SETTINGS"))
            self._settings_publishers[path] = publisher
        await publisher.publish(settings)

    # -- starting ------------------------------------------------------------------------

    def _payloads(self) -> dict[str, bytes]:
        payloads = {}
        for process, paths in self.plan.processes.items():
            if process == MAIN_PROCESS:
                continue
            units = [self.plan.units[path] for path in paths]
            try:
                payloads[process] = pickle.dumps(units, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise GraphDefinitionError(
                    f"process {process}: its units cannot be sent to it ({exc!r}); units in "
                    "process_components must be picklable before the graph starts (create "
                    "sockets, files and the like in initialize())"
                ) from exc
        return payloads

    def _local_main(self) -> tuple[str, Any] | None:
        for unit in self.plan.units_in(MAIN_PROCESS):
            for fname, role in type(unit).functions().items():
                if role.kind == "main":
                    return unit.path, getattr(unit, fname)
        return None

    async def _start(self) -> None:
        local_main = self._local_main()
        if local_main is not None and not self._allow_main:
            raise GraphDefinitionError(
                f"{local_main[0]} has a @main method, which needs the main thread of its "
                "process: put it in process_components, or use ezflow.run()"
            )
        payloads = self._payloads()
        prep: dict[str, Any] | None = None
        # The unit processes start first (forked, or spawned: an interpreter importing
        # ezflow), overlapping with our context's start. They wait for their bootstrap
        # (where the graph server is) before doing anything.
        if payloads and self._start_method == "forkserver":
            if self._forkserver is None:  # (ezflow.run forked one before its loop)
                self._forkserver = ForkServer.spawn()
                prep = await asyncio.to_thread(preparation)  # (file-system calls)
                self._forkserver.preload(prep, self._preload_modules())
            for process in payloads:
                forked, parent_end = ChildProcess.fork(process, self._forkserver)
                self._forking.append((process, forked, parent_end))
        else:
            for process in payloads:
                self._adopted(await ChildProcess.start(process))
        context = GraphContext(self._graph_address, name="ezflow-run")
        await context.start()
        self._context = context
        if context.server is None:  # a server others may use: is this graph there already?
            await self._check_not_running_already(context)
        await self._adopt_forked()
        if self._failures:
            raise self._error()
        loop = loop_kind(asyncio.get_running_loop())
        if prep is None:
            prep = await asyncio.to_thread(preparation)  # (os.getcwd: file-system calls)
        for child in self._children:
            child.send(
                {
                    "name": child.name,
                    "address": list(context.address),
                    "loop": loop,
                    "prep": prep,
                    "units": payloads[child.name],
                    "messages": shipped_message_types(self.plan, child.name),
                    "check_types": self.check_types,
                    "drain": self._drain_timeout,
                    "end_when_done": self._end_when_done,
                    "external_inputs": sorted(self.plan.external_inputs),
                }
            )
        host = UnitHost(
            self.plan.units_in(MAIN_PROCESS),
            context,
            on_failure=self._local_failed,
            on_complete=self._local_complete,
            check_types=self.check_types,
            on_done=self._local_done,
            end_when_done=self._end_when_done,
            external_inputs=frozenset(self.plan.external_inputs),
        )
        self._host = host
        setup = asyncio.ensure_future(host.setup())
        ready = [setup, *(asyncio.ensure_future(_shielded(c.ready)) for c in self._children)]
        ending = asyncio.ensure_future(self._end.wait())
        try:
            await asyncio.wait(
                [asyncio.ensure_future(asyncio.wait(ready)), ending],
                timeout=START_TIMEOUT,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ending.cancel()
        if not all(task.done() for task in ready):
            for task in ready:
                task.cancel()
            if self._end.is_set() and not self._failures:
                return  # stopped (a signal) while starting: the supervisor shuts down
            late = [c.name for c in self._children if not c.ready.done()]
            if not setup.done():
                late.insert(0, "main")
            if not self._failures:
                self._failures.append(
                    _Failure(
                        late[0] if late else "?",
                        late[0] if late else "?",
                        f"process(es) {', '.join(late)} did not start within {START_TIMEOUT:.0f} s",
                        returncode=0,
                    )
                )
            raise self._error()
        for child in self._children:
            if not child.ready.result():
                # Gone before it was ready: let its exit (and report) be recorded.
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(child.process.wait()), 5)
                await asyncio.sleep(0)
                if await self._killed_by_our_ctrl_c(child):
                    continue
                if not any(f.process == child.name for f in self._failures):
                    self._failures.append(
                        _Failure(
                            child.name,
                            child.name,
                            f"process {child.name} (pid {child.pid}) ended before it was "
                            f"ready ({_signal_name(child.process.returncode or 0)})",
                            returncode=child.process.returncode or 0,
                        )
                    )
        if self._failures:
            raise self._error()
        error = setup.exception()
        if error is not None:
            raise error
        await asyncio.gather(*(context.connect(src, dst) for src, dst in self.plan.edges))
        if self._end.is_set():
            return
        for child in self._children:
            child.send({"op": "start"})
        host.start()
        if self._gate is not None:
            self._gate.open()
        if self.plan.topic_ends:
            self._watchers.append(asyncio.ensure_future(self._check_topic_ends(context)))

    def _adopted(self, child: ChildProcess) -> None:
        self._children.append(child)
        child.listen(self._child_failed, self._child_complete, self._child_done)
        self._watchers.append(asyncio.ensure_future(self._watch(child)))

    async def _adopt_forked(self) -> None:
        """Take over the unit processes the fork server forked (waiting up to
        ``FORK_TIMEOUT`` for each); one it could not fork is a failure."""
        while self._forking:
            name, forked, parent_end = self._forking[0]
            try:
                process = await asyncio.wait_for(asyncio.shield(forked), FORK_TIMEOUT)
            except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
                reason = str(exc) or f"no answer within {FORK_TIMEOUT:g} s"
                self._failures.append(
                    _Failure(
                        name, name, f"process {name} could not be started: {reason}", returncode=0
                    )
                )
                return
            self._forking.pop(0)
            self._adopted(await ChildProcess.adopt(name, process, parent_end))

    def _preload_modules(self) -> set[str]:
        """The modules of the unit processes' classes (a spawned fork server imports
        them once for every process; ``__main__``: the program's main script)."""
        modules = {
            cls.__module__
            for process, paths in self.plan.processes.items()
            if process != MAIN_PROCESS
            for path in paths
            for cls in type(self.plan.units[path]).__mro__
        }
        return modules - {"builtins"}

    def _fork_server_here(self) -> ForkServer | None:
        """For :func:`run`, before its event loop: fork the fork server from this
        process when the graph has unit processes (see ``_forkserver``)."""
        if self._start_method != "forkserver":
            return None
        if not any(p != MAIN_PROCESS and paths for p, paths in self.plan.processes.items()):
            return None
        self._forkserver = ForkServer.fork_here()
        return self._forkserver

    async def _check_topic_ends(self, context: GraphContext) -> None:
        """Warn once about each connection to a topic name that nothing publishes on (or
        nothing reads) while a topic a typo away does: ``/sensor/rwa`` next to
        ``/sensor/raw``. Topic names with no such neighbour are left alone (other
        programs may join them later)."""
        from .._graph._typos import fed_topics, nearest_topic, read_topics  # noqa: PLC0415

        try:
            snapshot = await context.graph()
        except Exception as exc:  # the graph server went away: the graph is stopping
            log.debug("cannot check the graph's topic names: %r", exc)
            return
        fed, read = fed_topics(snapshot), read_topics(snapshot)
        said: set[frozenset[str]] = set()  # a pair of ends of this graph: said once
        for end in self.plan.topic_ends:
            if end.role == "source" and end.topic not in fed:
                near = nearest_topic(end.topic, fed)
                if near is not None and {end.topic, near} not in said:
                    said.add(frozenset((end.topic, near)))
                    log.warning(
                        "%s: nothing publishes on %r, so %s receives nothing from it; "
                        "did you mean %r (a topic that has a publisher)?",
                        end.where,
                        end.topic,
                        end.other,
                        near,
                    )
            elif end.role == "destination" and end.topic not in read:
                near = nearest_topic(end.topic, read)
                if near is not None and {end.topic, near} not in said:
                    said.add(frozenset((end.topic, near)))
                    log.warning(
                        "%s: nothing subscribes to %r, so what %s publishes there goes "
                        "nowhere; did you mean %r (a topic that has a subscriber)?",
                        end.where,
                        end.topic,
                        end.other,
                        near,
                    )

    async def _check_not_running_already(self, context: GraphContext) -> None:
        """Raise GraphDefinitionError when another client of the graph server already
        publishes on an output topic of this graph's units: a second copy of the same
        graph, whose data would merge with ours without a word. (Subscribers, and
        publishers feeding the units' inputs, are other programs using the graph.)"""
        outputs = {
            stream_topic(path, name): path
            for path, unit in self.plan.units.items()
            for name, stream in type(unit).streams().items()
            if isinstance(stream, OutputStream)
        }
        snapshot = await context.graph()
        clients = {c["client_id"]: c for c in snapshot.get("clients", [])}
        clashes: dict[str, str] = {}
        for publisher in snapshot.get("publishers", []):
            path = outputs.get(publisher["topic"])
            if path is not None and path not in clashes:
                owner = clients.get(publisher["client_id"], {})
                clashes[path] = f"{owner.get('name', '?')} pid {owner.get('pid', '?')}"
        if clashes:
            listed = ", ".join(f"{path} (already in {owner})" for path, owner in clashes.items())
            raise GraphDefinitionError(
                f"units of this graph already run on the graph server at "
                f"{format_address(context.address)}: {listed}; another copy of the graph "
                "runs there, and the two would exchange data. Stop it, rename the "
                "components, or run this copy on a graph server of its own "
                "(`ezflow run --address 127.0.0.1:0`, graph_address='127.0.0.1:0')"
            )

    # -- reports -------------------------------------------------------------------------

    def _local_failed(self, component: str, details: str, full: str = "") -> None:
        self._failures.append(_Failure(component, "main", details, full))
        self._failed()

    def _failed(self) -> None:
        # A failure stops at once, also while draining.
        self._end.set()
        self._hurry.set()

    def _local_complete(self, component: str) -> None:
        self._complete(component)

    def _child_failed(
        self, child: ChildProcess, component: str, details: str, full: str = ""
    ) -> None:
        self._failures.append(_Failure(component, child.name, details, full))
        self._failed()

    def _local_done(self) -> None:
        self._host_done = True
        self._maybe_done()

    def _child_done(self, child: ChildProcess) -> None:
        self._maybe_done()

    def _maybe_done(self) -> None:
        """With end_when_done: stop once every process reported its units done."""
        if not self._end_when_done or self._end.is_set():
            return
        if self._host_done and all(child.units_done for child in self._children):
            log.info("every unit is done (end_when_done): stopping the graph")
            self._end.set()

    def _child_complete(self, child: ChildProcess, component: str) -> None:
        self._complete(component)

    def _complete(self, component: str) -> None:
        if self._completed_by is None and not self._end.is_set():
            self._completed_by = component
            log.info("unit %s ended the graph: stopping it", component)
        self._end.set()

    def main_returned(self, exc: BaseException | None) -> None:
        """Called (from the main thread, through the loop) when a runner-process
        ``@main`` method returned or raised."""
        if self._host is not None:
            self._host.main_finished()
        if exc is None:
            local = self._local_main()
            self._complete(local[0] if local else "main")
        else:
            local = self._local_main()
            described = describe(exc)
            self._local_failed(
                local[0] if local else "main",
                f"in @main:\n{described.short}",
                f"in @main:\n{described.full}",
            )

    async def _killed_by_our_ctrl_c(self, child: ChildProcess) -> bool:
        """Whether *child* died of the Ctrl-C that stops this graph: until its new
        session begins, a unit process being started is in the terminal's process group
        (for a few milliseconds: uvloop prepares the forked child before ``setsid``),
        and the SIGINT meant for the runner ends it before any unit code ran — not a
        failure."""
        if child.process.returncode != -signal.SIGINT:
            return False
        if not self._sigint:
            await asyncio.sleep(_SIGINT_GRACE)  # the runner's handler may run just after
        if self._sigint:
            child.stop_requested = True
            log.debug("process %s ended by the Ctrl-C while it started", child.name)
        return self._sigint

    async def _watch(self, child: ChildProcess) -> None:
        returncode = await child.process.wait()
        if child.stop_requested or await self._killed_by_our_ctrl_c(child):
            return
        reported = any(f.process == child.name for f in self._failures)
        if not reported:
            units = ", ".join(self.plan.processes.get(child.name, []))
            self._failures.append(
                _Failure(
                    child.name,
                    child.name,
                    f"process {child.name} (pid {child.pid}, units {units}) "
                    f"{_signal_name(returncode)} while the graph was running",
                    returncode=returncode,
                )
            )
            log.debug("%s", self._failures[-1].details)
        self._failed()

    # -- stopping ------------------------------------------------------------------------

    async def _supervise(self) -> None:
        try:
            await self._end.wait()
            self._state = "stopping"
            await self._shutdown()
        finally:
            self._state = "stopped"
            self._finished.set()

    async def _wait_finished(self) -> None:
        if self._state == "new":
            raise RuntimeError("the graph was not started")
        if self._supervisor is not None:
            await asyncio.shield(self._supervisor)
        await self._finished.wait()

    async def _shutdown(self) -> None:
        """Stop every process and unit, draining unless a unit failed; kill what does
        not stop in time. Cancellation leaves nothing running: children are killed
        before this re-raises."""
        self._end.set()
        normal = not self._failures
        drain = self._drain_timeout if normal else 0.0
        cuts: dict[str, DrainCut] = {}
        try:
            if self._context is not None and normal:
                # The caller's publishers on our context (not the units') are sources
                # too: end them.
                ours = set() if self._host is None else self._host.outputs
                await asyncio.gather(
                    *(
                        p.aclose()
                        for p in list(self._context._publishers.values())
                        if p not in ours
                    ),
                    return_exceptions=True,
                )
            for child in self._children:
                child.request_stop(drain)
                if self._hurry.is_set():
                    child.hurry()
            if self._host is not None:
                cuts["main"] = await self._host.stop(drain, self._hurry)
            if self._children:
                exited = await asyncio.gather(
                    *(
                        self._wait_exit(child, drain + CHILD_STOP_TIMEOUT)
                        for child in self._children
                    )
                )
                cuts.update((child.name, child.cut) for child in self._children)
                for child, by_itself in zip(self._children, exited, strict=True):
                    if by_itself or child.killed_by_user:
                        continue
                    if self._interrupted:
                        _say(
                            f"process {child.name} (pid {child.pid}) did not stop within "
                            f"{INTERRUPT_STOP_TIMEOUT:g} s of the second signal and was killed "
                            "(its shutdown() may not have run)"
                        )
                        continue
                    self._failures.append(
                        _Failure(
                            child.name,
                            child.name,
                            f"process {child.name} (pid {child.pid}) did not stop within "
                            f"{drain + CHILD_STOP_TIMEOUT:.0f} s and was killed",
                            returncode=-signal.SIGKILL,
                        )
                    )
            if self._interrupted:
                _say_cut(cuts)
            elif normal:
                _log_cut(cuts, drain)
        finally:
            for child in self._children:
                await child.aclose()
            for _, forked, parent_end in self._forking:  # (the start was cut short)
                parent_end.close()
                forked.cancel()
            self._forking.clear()
            if self._forkserver is not None:
                await self._forkserver.aclose()  # (kills what it forked for us and is left)
            for watcher in self._watchers:
                watcher.cancel()
            for publisher in self._settings_publishers.values():
                with contextlib.suppress(Exception):
                    await publisher.aclose()
            if self._context is not None:
                await self._context.aclose()

    async def _wait_exit(self, child: ChildProcess, timeout: float) -> bool:
        """Wait for *child* to exit, for up to *timeout* seconds — or, once the stop is
        hurried, for up to ``INTERRUPT_STOP_TIMEOUT`` from then — and kill it after.
        Returns whether it exited by itself."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        exit_task = asyncio.ensure_future(child.process.wait())
        hurried = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait({exit_task, hurried}, timeout=timeout, return_when="FIRST_COMPLETED")
            if not exit_task.done() and hurried.done():
                remaining = min(deadline - loop.time(), INTERRUPT_STOP_TIMEOUT)
                await asyncio.wait({exit_task}, timeout=max(0.0, remaining))
        finally:
            hurried.cancel()
        if exit_task.done():
            return True
        child.kill()
        await exit_task
        return False

    def hurry(self) -> None:
        """Stop draining now (a second Ctrl-C): every process cancels what it still
        handles, joins its threads and runs its units' ``shutdown()``; a unit process
        that has not exited ``INTERRUPT_STOP_TIMEOUT`` seconds later is killed. Says
        how many messages were cut when the graph has stopped."""
        self._interrupted = True
        self._end.set()
        self._hurry.set()
        for child in self._children:
            if child.stop_requested:
                child.hurry()

    def kill_children(self) -> None:
        """Kill every unit process now and stop draining (a third Ctrl-C)."""
        self._hurry.set()
        for child in self._children:
            child.stop_requested = True
            child.killed_by_user = True
            child.kill()

    # -- failures ------------------------------------------------------------------------

    def _error(self) -> UnitError:
        first, *others = self._failures
        debug = debug_from_env()
        message = first.describe(debug)
        if others:
            message += "\nwhile stopping, also:\n" + "\n".join(f.describe(debug) for f in others)
        if first.returncode is not None:
            return ProcessDiedError(
                message,
                component=first.component,
                process=first.process,
                details=first.details,
                returncode=first.returncode,
            )
        return UnitError(
            message,
            component=first.component,
            process=first.process,
            details=first.details,
            full_traceback=first.full or first.details,
        )

    def _raise_failures(self) -> None:
        if self._failures and not self._raised:
            self._raised = True
            raise self._error()


async def _shielded(future: asyncio.Future[bool]) -> None:
    await asyncio.shield(future)


def _log_cut(cuts: dict[str, DrainCut], drain: float) -> None:
    """One line, if the drain timeout cut the drain short: what was left, per process."""
    cut = {name: c for name, c in cuts.items() if c}
    if not cut:
        return
    log.warning(
        "the drain timeout (%g s) cut the graph's drain short: %s; raise drain_timeout / "
        "EZFLOW_DRAIN_TIMEOUT to wait longer",
        drain,
        _cut_text(cut),
    )


def _say_cut(cuts: dict[str, DrainCut]) -> None:
    """After a second signal: one line saying what the stop cut (also when nothing)."""
    cut = {name: c for name, c in cuts.items() if c}
    _say(f"stopped now: {_cut_text(cut)}")


def _cut_text(cut: dict[str, DrainCut]) -> str:
    queued = sum(c.queued for c in cut.values())
    inputs = sum(c.inputs for c in cut.values())
    text = f"{queued} message(s) received and not handled were cut, {inputs} input(s) had not ended"
    if cut:
        text += (
            " ("
            + ", ".join(f"{n}: {c.queued} queued, {c.inputs} open" for n, c in cut.items())
            + ")"
        )
    return text


def _say(line: str) -> None:
    """Tell the person at the terminal (Ctrl-C): one line on stderr, whatever logging
    is configured."""
    try:
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: nobody to tell
        pass


def run(
    components: Mapping[str, Component] | None = None,
    *,
    connections: Iterable[object] = (),
    process_components: Iterable[object] = (),
    graph_address: Address | str | None = None,
    force_single_process: bool = False,
    check_types: bool | None = None,
    end_when_done: bool = False,
    drain_timeout: float | None = None,
    on_started: Callable[[GraphRunner], None] | None = None,
    settings: Mapping[str, Mapping[str, object]] | None = None,
    **named_components: Component,
) -> None:
    """Run a graph until it ends; block meanwhile.

    *components* maps names to units and collections (or pass them as keywords:
    ``run(SINE=sine, SCALE=scale)``); names become the topic paths (``"SINE/OUTPUT"``).
    *connections* are ``(source, destination)`` pairs of streams (``sine.OUTPUT``) or
    topic names; *process_components* lists components that each get a process of their
    own (everything else runs in this process); *graph_address* is where the graph
    server is, or should be started when none answers (default ``EZFLOW_GRAPH_ADDRESS``,
    else ``127.0.0.1:25990``); *force_single_process* ignores process placement;
    *check_types* checks every message a unit publishes against its ``OutputStream``'s
    declared type, failing the unit with :class:`~ezflow.MessageTypeError` on a mismatch
    (default ``EZFLOW_CHECK_TYPES``: ``1`` on, else off; off costs nothing per message).
    *end_when_done* ends the graph once every unit is done: every source ended and
    every message was handled (docs/units.md). *drain_timeout* bounds how long a
    stopping graph keeps handling messages already accepted (default
    ``EZFLOW_DRAIN_TIMEOUT``, else 5 seconds; 0: no drain). *on_started* is called
    once, on the graph's event loop, when every unit runs (e.g. to print
    :meth:`GraphRunner.describe`); what it raises stops the graph. *settings* sets
    fields of components' settings by path before the graph starts, as ``ezflow run
    --set PATH.FIELD=VALUE`` does (``{"PIPE/FILTER": {"cutoff": 30.0}}``; a str for a
    field that takes no str is read as text; each component's before its
    ``configure()``).

    Returns normally when a unit raised :class:`~ezflow.NormalTermination`, a
    ``@main`` method returned, every unit is done (*end_when_done*), or on a first
    SIGINT (Ctrl-C) / SIGTERM — after the drain, every ``shutdown()`` ran and every
    process exited; that signal prints one line (``stopping: draining up to 5 s; Ctrl-C
    again to stop now``). A second signal stops draining: every process cancels what it
    still handles, runs its units' ``shutdown()`` (unit processes are killed after
    ``INTERRUPT_STOP_TIMEOUT`` seconds), one line says how many messages were cut, and
    ``run`` raises :class:`KeyboardInterrupt` (uncaught, without a traceback: the
    script exits as interrupted, status 130 in a shell); a third kills the unit
    processes at once. A signal before the graph started stops it before anything runs.
    Raises :class:`~ezflow.GraphDefinitionError` before starting anything for an
    invalid graph, :class:`~ezflow.UnitError` naming the unit, the user's frames and
    the failing line when one raised, and :class:`~ezflow.ProcessDiedError` when a unit
    process died — in each case after the rest of the graph stopped. Uncaught, these
    exit the script with status 1, printed with the user's frames only (ezflow's with
    ``EZFLOW_DEBUG=1``).

    In a unit process, a ``run()`` executed while the parent's main script is imported
    (to find the classes it defines) returns at once, so scripts work without an
    ``if __name__ == "__main__":`` guard (it is still good practice).
    """
    if _process.importing_main:
        return  # in a unit process, importing the script that called run() (see above)
    signals = _SignalHandler()
    with _catching(signals):
        try:
            _run_blocking(
                signals,
                on_started,
                components,
                connections=connections,
                process_components=process_components,
                graph_address=graph_address,
                force_single_process=force_single_process,
                check_types=check_types,
                end_when_done=end_when_done,
                drain_timeout=drain_timeout,
                settings=settings,
                **named_components,
            )
        except BaseException as exc:
            if not isinstance(exc, (SystemExit, GeneratorExit)):
                show_to_user(exc)  # uncaught, printed with the user's frames only
            raise


def _run_blocking(
    signals: _SignalHandler,
    on_started: Callable[[GraphRunner], None] | None,
    components: Mapping[str, Component] | None,
    **options: Any,
) -> None:
    runner = GraphRunner(components, **options)
    runner._allow_main = True
    # Before any event loop or thread of ours exists: the fork server, a copy of this
    # program that unit processes are forked from (nothing to import again).
    forkserver = runner._fork_server_here()
    try:
        _run_runner(runner, signals, on_started)
    finally:
        if forkserver is not None:
            forkserver.close_now()  # (closed already unless the graph never started)


def _run_runner(
    runner: GraphRunner,
    signals: _SignalHandler,
    on_started: Callable[[GraphRunner], None] | None,
) -> None:
    local_main = runner._local_main()
    if local_main is None:
        run_coroutine(_run_until_done(runner, signals, on_started=on_started))
        return
    gate = runner._gate = MainThreadGate()
    state: dict[str, asyncio.AbstractEventLoop] = {}

    def main_returned(exc: BaseException | None) -> None:
        loop = state.get("loop")
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(runner.main_returned, exc)

    async def run_in_thread() -> None:
        state["loop"] = asyncio.get_running_loop()
        await _run_until_done(runner, signals, on_started=on_started)

    run_beside_main(
        run_in_thread(),
        loop=None,
        gate=gate,
        main=local_main[1],
        on_main_return=main_returned,
        signals=(),  # run() catches them (_catching), for the whole run
    )


class _SignalHandler:
    """SIGINT (Ctrl-C) and SIGTERM during :func:`run`: the first stops the graph,
    draining, the second stops it now, a third kills the unit processes (see
    :func:`run`). :meth:`arrived` is the signal handler (main thread); the rest runs
    on the graph's event loop once :meth:`attach` was called."""

    def __init__(self) -> None:
        self.count = 0
        self._runner: GraphRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[int] = []
        # attach() may run on the loop's thread while a signal arrives on the main
        # thread (@main); reentrant: on one thread, the handler interrupts attach().
        self._lock = threading.RLock()

    def arrived(self, signum: int, frame: object = None) -> None:
        with self._lock:
            loop = self._loop
            if loop is None:
                self._pending.append(signum)
                return
        with contextlib.suppress(RuntimeError):  # a closed loop: run() is returning
            loop.call_soon_threadsafe(self.received, signum)

    def attach(self, runner: GraphRunner, loop: asyncio.AbstractEventLoop) -> None:
        """Handle the signals that arrive from now on, and those that came before."""
        with self._lock:
            self._runner = runner
            self._loop = loop
            pending, self._pending = self._pending, []
        for signum in pending:
            self.received(signum)

    def received(self, signum: int) -> None:
        runner = self._runner
        if runner is None:  # pragma: no cover - attach() handles the pending ones
            return
        self.count += 1
        if signum == signal.SIGINT:
            runner._sigint = True
        if self.count == 1:
            drain = runner._drain_timeout
            draining = f"draining up to {drain:g} s; " if drain > 0 else ""
            if signum == signal.SIGINT:
                _say(f"stopping: {draining}Ctrl-C again to stop now")
            else:
                name = signal.Signals(signum).name
                _say(f"stopping ({name}): {draining}signal again to stop now")
            runner.request_stop()
        elif self.count == 2:
            runner.hurry()
        else:
            _say("killing the unit processes")
            runner.kill_children()


@contextlib.contextmanager
def _catching(signals: _SignalHandler) -> Iterator[None]:
    """SIGINT and SIGTERM go to *signals* while the block runs (from the main thread:
    elsewhere signals cannot be caught, and the caller handles them), unless the program
    ignores them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # A signal the program ignores (a background job's SIGINT, nohup's) stays ignored.
    previous = {
        sig: signal.signal(sig, signals.arrived)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    if take_interrupt(previous.get(signal.SIGINT)):
        signals.arrived(signal.SIGINT)  # a Ctrl-C that Python swallowed just before
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _run_until_done(
    runner: GraphRunner,
    signals: _SignalHandler,
    *,
    on_started: Callable[[GraphRunner], None] | None = None,
) -> None:
    signals.attach(runner, asyncio.get_running_loop())
    if signals.count:
        interrupted = signals.count > 1
    else:
        await runner.start()
        if on_started is not None and not runner._end.is_set():
            try:
                on_started(runner)
            except BaseException:
                await runner.stop()
                raise
        await runner.wait()
        interrupted = runner._interrupted
    if interrupted:
        raise KeyboardInterrupt  # a second signal: stopped now (run() says how)
