"""The worker processes of a perf run, framework-neutral.

``python -m ezflow._perf._worker graph`` runs a graph server; ``... units SPEC_JSON``
hosts the units of one process of a cell (see :mod:`._spec`). ``perf/peers/`` runs
the same code on another framework by passing its own :class:`Framework` to
:func:`main`, so both are measured by identical sources, relays and sinks.

Protocol with the runner (the parent):

* the worker writes one JSON object per line on stdout (``{"event": ...}``);
* the parent writes commands, one per line, on the worker's stdin: ``publish`` (create
  the publishers: every subscriber of the cell exists by then), ``go`` (start the
  warm-up), ``measure`` (every sink of the cell is warm: start the measured phases);
* end of file on stdin means "leave": a worker that sees it before it is done stops at
  once (the parent went away or gave up); after its result it closes its publishers
  and subscribers and exits. So a worker never outlives its parent.

With ``"profile": DIR`` in its spec, a units worker writes its cProfile statistics to
``DIR/FRAMEWORK-CELL-PID.prof`` when it ends.

A units worker goes ``subscribed`` -> ``published`` -> ``warm`` -> ``result`` (or
``unavailable`` with a reason, when the framework refuses the transport); a graph
worker prints ``ready`` with its address and serves until end of file.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import json
import os
import struct
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from .._core._exceptions import ConfigurationError
from ._spec import END, LATENCY, RATE, WARMUP, Plan, UnitSpec, latency_count, pacing

__all__ = [
    "HEADER",
    "EzflowFramework",
    "Framework",
    "SinkState",
    "is_end",
    "main",
    "payload_for",
    "private_frame",
]

T = TypeVar("T")
Frame = np.ndarray[Any, np.dtype[np.uint8]]
NewFrame = Callable[[], Awaitable[Frame]]

#: The header of every message: publish time (ns), seq, source index, phase.
HEADER = struct.Struct("<4q")

#: Loaded-latency samples a sink keeps (one int each): a bound on its memory.
MAX_LOADED_SAMPLES = 500_000
#: WARMUP messages a sink needs from each of its sources before it is warm.
WARM_MESSAGES = 3
#: A source yields to the event loop at least once every this many RATE messages.
YIELD_EVERY = 256
#: Exit status of a worker whose parent went away (stdin closed early).
EXIT_ABANDONED = 3


class Framework(Protocol):
    """What a worker needs from a pub/sub framework. ``ctx``, ``pub`` and ``sub`` are
    the framework's own objects; the worker only hands them back."""

    name: str
    #: Errors that mean "this transport is not available here": the cell is reported
    #: as unavailable with the error's message instead of failing.
    unavailable: tuple[type[Exception], ...]

    def version(self) -> str:
        """The framework's version string, for the results."""
        ...

    def loop_name(self) -> str:
        """The event loop :meth:`run` uses (``uvloop`` or ``asyncio``)."""
        ...

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run *main* on the event loop this framework uses by default."""
        ...

    def graph_server(self) -> AbstractAsyncContextManager[tuple[str, int]]:
        """Serve a graph server on a free loopback port while the block runs; yields its
        address."""
        ...

    def context(self, graph: tuple[str, int]) -> AbstractAsyncContextManager[Any]:
        """A client context of the graph server at *graph*."""
        ...

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        """A publisher on *topic* whose edges use *transport* (local, shm or tcp)."""
        ...

    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        """A lossless subscriber of *topic* whose edges use *transport*."""
        ...

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        """The coroutine function that publishes one message on *pub*."""
        ...

    def frame_function(self, pub: Any, transport: str, size: int, loan: bool) -> NewFrame:
        """The coroutine function that returns a new writable ``uint8`` array of *size*
        bytes for the next message of *pub*: a buffer the framework lends when *loan*
        and it has one for *transport*, else a private array."""
        ...

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        """Call ``handle(message)`` for each message of *sub* until it returns True. The
        message need not stay valid after ``handle`` returns."""
        ...

    async def relay(self, sub: Any, pub: Any) -> int:
        """Republish every message of *sub* on *pub*, up to and including the first
        one that :func:`is_end`; return how many."""
        ...


class EzflowFramework:
    """ezflow's low-level API (GraphContext, Publisher, Subscriber), on uvloop unless
    ``EZFLOW_EVENT_LOOP`` says otherwise."""

    name = "ezflow"
    unavailable: tuple[type[Exception], ...] = (ConfigurationError,)

    def version(self) -> str:
        import ezflow  # noqa: PLC0415 - keep the module importable without side effects

        return ezflow.__version__

    def loop_name(self) -> str:
        from .._core._loop import loop_factory  # noqa: PLC0415

        return "uvloop" if loop_factory().__module__.startswith("uvloop") else "asyncio"

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        from .._core._loop import run_coroutine  # noqa: PLC0415

        return run_coroutine(main)

    @contextlib.asynccontextmanager
    async def graph_server(self) -> AsyncIterator[tuple[str, int]]:
        from .._graph._server import GraphServer  # noqa: PLC0415

        async with GraphServer(("127.0.0.1", 0)) as server:
            yield server.address

    def context(self, graph: tuple[str, int]) -> AbstractAsyncContextManager[Any]:
        from .._graph._context import GraphContext  # noqa: PLC0415

        return GraphContext(graph, auto_start=False, name=f"perf-{os.getpid()}")

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        return await ctx.publisher(topic, transport=transport)

    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        return await ctx.subscriber(topic, transport=transport)

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        publish: Callable[[Any], Awaitable[None]] = pub.publish
        return publish

    def frame_function(self, pub: Any, transport: str, size: int, loan: bool) -> NewFrame:
        from .._core._config import DEFAULT_SHM_INLINE_LIMIT  # noqa: PLC0415

        # Below the inline limit shm sends messages inline on its socket: nothing to lend.
        if loan and transport == "shm" and size >= DEFAULT_SHM_INLINE_LIMIT:
            lend = pub.loan

            async def loaned() -> Frame:
                frame: Frame = await lend(size)
                return frame

            return loaned
        return private_frame(size)

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        recv = sub.recv
        while not handle(await recv()):
            pass

    async def relay(self, sub: Any, pub: Any) -> int:
        recv, publish = sub.recv, pub.publish
        forwarded = 0
        while True:
            message = await recv()
            await publish(message)
            forwarded += 1
            if is_end(message):
                return forwarded


def private_frame(size: int) -> NewFrame:
    """A :meth:`Framework.frame_function` that allocates a new array every time."""
    empty, uint8 = np.empty, np.uint8

    async def new() -> Frame:
        return empty(size, uint8)

    return new


def is_end(message: Any) -> bool:
    """True for the END message of a source."""
    return bool(HEADER.unpack_from(message)[3] == END)


def payload_for(seed: int, source: int, size: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The random payload of *source* (never zeros, which the kernel shares for free)."""
    return np.random.default_rng([seed, source]).integers(0, 256, size, dtype=np.uint8)


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far."""
    times = os.times()
    return times.user + times.system


@dataclass(slots=True)
class SinkState:
    """What one sink measures; :meth:`handle` is called once per message."""

    sources: int
    warmup_ns: int
    expected: list[np.ndarray[Any, np.dtype[np.uint8]]]
    on_warm: Callable[[], None] = lambda: None
    next_seq: list[int] = field(default_factory=list)
    warm: list[int] = field(default_factory=list)
    ends: int = 0
    rate_messages: int = 0
    measured: int = 0
    warm_end_ns: int = 0
    rate_first_ns: int = 0
    first_ns: int = 0
    last_ns: int = 0
    loaded_ns: list[int] = field(default_factory=list)
    latency_ns: list[int] = field(default_factory=list)
    latency_messages: int = 0
    drops: int = 0
    disorder: int = 0
    corrupt: int = 0

    def __post_init__(self) -> None:
        self.next_seq = [0] * self.sources
        self.warm = [0] * self.sources

    def handle(self, message: Any) -> bool:
        """Account one message; True once every source has ended."""
        now = time.perf_counter_ns()
        stamp, seq, source, phase = HEADER.unpack_from(message)
        expected_seq = self.next_seq[source]
        if seq != expected_seq:  # lossless edges: never, unless something is broken
            if seq > expected_seq:
                self.drops += seq - expected_seq
            else:
                self.disorder += 1
        self.next_seq[source] = seq + 1
        if phase == LATENCY:
            self.latency_messages += 1
            self.latency_ns.append(now - stamp)
            return False
        if phase == RATE:
            if not self.rate_messages:
                self.rate_first_ns = now
                self.warm_end_ns = now + self.warmup_ns
            self.rate_messages += 1
            self.last_ns = now
            if now >= self.warm_end_ns:
                if not self.measured:
                    self.first_ns = now
                self.measured += 1
                if len(self.loaded_ns) < MAX_LOADED_SAMPLES:
                    self.loaded_ns.append(now - stamp)
            return False
        # The whole payload is checked on untimed messages only: a check here would
        # delay the next sink of this process and count in its latency.
        if not np.array_equal(message[HEADER.size :], self.expected[source][HEADER.size :]):
            self.corrupt += 1
        if phase == WARMUP:
            self.warm[source] += 1
            if self.warm[source] == WARM_MESSAGES and min(self.warm) >= WARM_MESSAGES:
                self.on_warm()
            return False
        self.ends += 1  # END
        return self.ends >= self.sources

    def result(self, latency_warmup: int) -> dict[str, Any]:
        """Raw figures of this sink (the runner aggregates the sinks of a cell). msgs/s
        is measured after the warm-up; when fewer than 10 messages came after it (a
        very slow cell), over the whole RATE phase instead."""
        if self.measured < 10:
            self.measured, self.first_ns = self.rate_messages, self.rate_first_ns
        seconds = (self.last_ns - self.first_ns) / 1e9
        loaded = np.asarray(self.loaded_ns, dtype=np.float64)
        return {
            "rate_messages": self.rate_messages,
            "measured_messages": self.measured,
            "measured_seconds": seconds,
            "msgs_per_s": (self.measured - 1) / seconds if seconds > 0 else 0.0,
            "loaded_p50_ns": float(np.percentile(loaded, 50)) if loaded.size else None,
            "loaded_p99_ns": float(np.percentile(loaded, 99)) if loaded.size else None,
            "latency_messages": self.latency_messages,
            "ends": self.ends,
            "latency_ns": self.latency_ns[latency_warmup:],
            "drops": self.drops,
            "disorder": self.disorder,
            "corrupt": self.corrupt,
        }


class _Barrier:
    """Releases every waiter once *parties* have arrived (asyncio.Barrier is 3.11+)."""

    def __init__(self, parties: int) -> None:
        self._missing = parties
        self._open = asyncio.Event()

    async def wait(self) -> None:
        self._missing -= 1
        if self._missing <= 0:
            self._open.set()
        await self._open.wait()


async def _source(
    framework: Framework,
    pub: Any,
    unit: UnitSpec,
    spec: dict[str, Any],
    plan: Plan,
    *,
    measure: asyncio.Event,
    paced_done: _Barrier,
) -> dict[str, Any]:
    """Publish the phases of one source (see :mod:`._spec`)."""
    size: int = spec["size"]
    body = payload_for(spec["seed"], unit.index, size)[HEADER.size :]
    publish = framework.publish_function(pub)
    new_frame = framework.frame_function(pub, spec["transport"], size, plan.loan)
    # Typed loosely: numpy arrays are buffers, which typeshed's Buffer does not know.
    pack: Callable[..., None] = HEADER.pack_into
    clock, start = time.perf_counter_ns, HEADER.size
    index = unit.index
    seq = 0

    async def send(phase: int) -> None:
        frame = await new_frame()
        frame[start:] = body  # what a producer pays anyway: filling its frame
        pack(frame, 0, clock(), seq, index, phase)
        await publish(frame)

    period = pacing(size, plan.period)
    while not measure.is_set():
        await send(WARMUP)
        seq += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(measure.wait(), period)
    # Together the sources publish one message per period: each every period x sources,
    # staggered by their index.
    own_period = period * unit.sources
    await asyncio.sleep(period * index)
    due = time.monotonic()
    for _ in range(latency_count(plan, size, unit.sources)):
        await send(LATENCY)
        seq += 1
        due += own_period
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    await paced_done.wait()  # no source floods the graph while another one is paced
    started = clock()
    stop_ns = started + int(plan.duration * 1e9)
    limit = seq + (plan.count if plan.count is not None else sys.maxsize)
    while seq < limit and clock() < stop_ns:
        # send(RATE), inlined: this loop is what msgs/s measures on the publishing side.
        frame = await new_frame()
        frame[start:] = body
        pack(frame, 0, clock(), seq, index, RATE)
        await publish(frame)
        seq += 1
        if not seq % YIELD_EVERY:
            # publish() need not suspend (no subscriber left, room in every window):
            # let the other tasks of this process run, e.g. the one that notices the
            # parent has gone.
            await asyncio.sleep(0)
    rate_seconds = (clock() - started) / 1e9
    await send(END)
    return {
        "kind": "source",
        "index": index,
        "rate_seconds": rate_seconds,
        "published": seq + 1,
    }


async def _sink(
    framework: Framework,
    sub: Any,
    unit: UnitSpec,
    spec: dict[str, Any],
    plan: Plan,
    *,
    on_warm: Callable[[], None],
) -> dict[str, Any]:
    sources = unit.sources
    expected = [payload_for(spec["seed"], index, spec["size"]) for index in range(sources)]
    state = SinkState(
        sources=sources, warmup_ns=int(plan.warmup * 1e9), expected=expected, on_warm=on_warm
    )
    await framework.consume(sub, state.handle)
    result = state.result(latency_warmup=state.latency_messages // 10)
    result.update(kind="sink", index=unit.index)
    return result


async def _relay(framework: Framework, sub: Any, pub: Any, unit: UnitSpec) -> dict[str, Any]:
    forwarded = await framework.relay(sub, pub)
    return {"kind": "relay", "index": unit.index, "forwarded": forwarded}


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


class _Commands:
    """Lines from stdin, one command each; None once stdin is closed."""

    def __init__(self) -> None:
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.BaseTransport | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._reader = asyncio.StreamReader(limit=4096)
        protocol = asyncio.StreamReaderProtocol(self._reader)
        self._transport, _ = await loop.connect_read_pipe(lambda: protocol, sys.stdin)

    async def next(self) -> str | None:
        assert self._reader is not None
        line = await self._reader.readline()
        return line.decode().strip() if line else None

    async def expect(self, command: str) -> None:
        """Wait for *command*; exit the process if stdin closes first."""
        got = await self.next()
        if got is None:
            raise SystemExit(EXIT_ABANDONED)
        if got != command:
            raise RuntimeError(f"expected command {command!r}, got {got!r}")

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def _run_units(framework: Framework, spec: dict[str, Any]) -> None:
    plan = Plan(**spec["plan"])
    units = [UnitSpec.from_json(unit) for unit in spec["units"]]
    transport: str = spec["transport"]
    graph = (spec["graph"][0], int(spec["graph"][1]))
    commands = _Commands()
    await commands.start()
    try:
        async with framework.context(graph) as ctx:
            try:
                subs = {
                    (unit.kind, unit.index): await framework.subscriber(ctx, unit.input, transport)
                    for unit in units
                    if unit.input is not None
                }
                _emit("subscribed")
                await commands.expect("publish")
                pubs = {
                    (unit.kind, unit.index): await framework.publisher(ctx, unit.output, transport)
                    for unit in units
                    if unit.output is not None
                }
            except framework.unavailable as exc:
                _emit("unavailable", reason=str(exc))
                return
            _emit("published")
            await commands.expect("go")
            cpu_started, wall_started = _cpu_seconds(), time.perf_counter()
            measure, gone = asyncio.Event(), asyncio.Event()
            listener = asyncio.ensure_future(_listen(commands, measure, gone))
            cold = [sum(1 for unit in units if unit.kind == "sink")]

            def on_warm() -> None:
                cold[0] -= 1
                if not cold[0]:
                    _emit("warm")

            if not cold[0]:
                _emit("warm")
            work: list[Coroutine[Any, Any, dict[str, Any]]] = []
            paced_done = _Barrier(sum(1 for unit in units if unit.kind == "source"))
            for unit in units:
                key = (unit.kind, unit.index)
                if unit.kind == "source":
                    work.append(
                        _source(
                            framework,
                            pubs[key],
                            unit,
                            spec,
                            plan,
                            measure=measure,
                            paced_done=paced_done,
                        )
                    )
                elif unit.kind == "sink":
                    work.append(_sink(framework, subs[key], unit, spec, plan, on_warm=on_warm))
                else:
                    work.append(_relay(framework, subs[key], pubs[key], unit))
            try:
                results = await _unless_gone(asyncio.gather(*work), gone)
                _emit(
                    "result",
                    cpu_seconds=_cpu_seconds() - cpu_started,
                    wall_seconds=time.perf_counter() - wall_started,
                    units=results,
                )
                # Stay connected until the parent has every result: a publisher that
                # left early could take in-flight messages (or shared memory) with it.
                await gone.wait()
            finally:
                listener.cancel()
    finally:
        commands.close()


async def _listen(commands: _Commands, measure: asyncio.Event, gone: asyncio.Event) -> None:
    """Serve the commands of the running stage: ``measure``, then end of file."""
    while (command := await commands.next()) is not None:
        if command == "measure":
            measure.set()
    gone.set()


async def _unless_gone(work: Awaitable[T], gone: asyncio.Event) -> T:
    """*work*'s result, or exit the process if the parent goes away (*gone*) first."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise SystemExit(EXIT_ABANDONED)
    finally:
        for future in (task, waiter):
            future.cancel()


async def _run_graph(framework: Framework) -> None:
    commands = _Commands()
    await commands.start()
    try:
        async with framework.graph_server() as address:
            _emit("ready", address=list(address))
            while await commands.next() is not None:
                pass
    finally:
        commands.close()


def main(framework: Framework, argv: list[str] | None = None) -> None:
    """Entry point of a worker: ``graph``, or ``units SPEC_JSON``. Errors are printed
    to stderr (the runner reports their last line) with a non-zero exit."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["graph"]:
            framework.run(_run_graph(framework))
        elif args[:1] == ["units"] and len(args) == 2:
            spec = json.loads(args[1])
            profile = spec.get("profile")
            profiler = cProfile.Profile() if profile else None
            if profiler is not None:
                profiler.enable()
            try:
                framework.run(_run_units(framework, spec))
            finally:
                if profiler is not None:
                    profiler.disable()
                    name = f"{framework.name}-{spec['label']}-{os.getpid()}.prof"
                    profiler.dump_stats(os.path.join(profile, name.replace("/", "-")))
        elif args[:1] == ["info"]:
            _emit(
                "info",
                framework=framework.name,
                version=framework.version(),
                loop=framework.loop_name(),
            )
        else:
            sys.exit("usage: worker graph | units SPEC_JSON | info")
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except BaseException as exc:
        traceback.print_exc()
        sys.stderr.write(f"error: {type(exc).__name__}: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main(EzflowFramework())
