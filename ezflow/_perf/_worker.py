"""The worker processes of a perf run, framework-neutral.

``python -m ezflow._perf._worker graph`` runs a graph server; ``... units SPEC_JSON``
hosts the units of one process of a cell (see :mod:`._spec`). A peer framework's
worker runs the same code on that framework by passing its own :class:`Framework` to
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

``... throughput SPEC_JSON`` runs one end of a bare stream through the framework's
adapter for ``ezflow perf peers --selfcheck`` (a source publishing the p2p message back
to back, a sink that only counts and reports msgs/s over a window; see
:func:`_run_throughput`): the loop of a library's own throughput example.

Size: one process entry for every suite (graph, units, throughput), framework-neutral so
that peer frameworks run the identical sources, relays and sinks.
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
from ._spec import (
    END,
    FRAME_SIZE,
    LATENCY,
    MIXED_TOPIC_SUFFIX,
    RATE,
    TWO_TOPICS,
    WARMUP,
    Plan,
    UnitSpec,
    latency_count,
    p2p_pacing,
    pacing,
    payload_layout,
)

__all__ = [
    "HEADER",
    "EzflowFramework",
    "Framework",
    "MixedSample",
    "NewFrame",
    "NewPayload",
    "P2PSink",
    "SinkState",
    "is_end",
    "main",
    "p2p_payload_for",
    "payload_for",
    "private_frame",
    "private_payload",
]

T = TypeVar("T")
Frame = np.ndarray[Any, np.dtype[np.uint8]]
Payload = np.ndarray[Any, Any]
NewPayload = Callable[[], Awaitable[Payload]]
#: The former name of :data:`NewPayload` (a ``uint8`` frame is a payload).
NewFrame = NewPayload

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
    the framework's own objects; the worker only hands them back.

    A framework with options of its own (ezflow: the p2p variant's loop and ``recv`` or
    ``on_message``, ``Plan.shm_inline_limit``) may also define ``configure(spec:
    dict)``: :func:`main` calls it with the units spec (``spec["variant"]`` is the
    cell's :class:`~._spec.Variant` as JSON, or None outside p2p; ``spec["plan"]`` the
    plan) before :meth:`run`. Peers run the default variant and need not define it.

    A framework whose processes may leave shared-memory files behind when they exit may
    name their patterns in ``leftovers`` (a tuple of globs of /dev/shm names, e.g.
    ``("*.zenoh",)``): the runner removes the new ones no process uses after each cell
    (:mod:`._leftovers`).
    """

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
        """Serve while the block runs; yield an address ``(host, port)`` that every
        worker of the run receives (:meth:`context`). A framework without a graph
        server uses it as a rendezvous (e.g. a free port it reserves here, from which
        endpoints are derived)."""
        ...

    def context(self, graph: tuple[str, int]) -> AbstractAsyncContextManager[Any]:
        """A client context of the graph server (or rendezvous) at *graph*."""
        ...

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        """A publisher on *topic* whose edges use *transport* (local, shm or tcp).
        Raises one of :attr:`unavailable` when the framework has no such transport."""
        ...

    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        """A lossless subscriber of *topic* whose edges use *transport*."""
        ...

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        """The coroutine function that publishes one message on *pub*. In p2p the
        message is the tuple ``(phase, seq, t_ns, payload)`` (or, in ezflow's ``array``
        variant, the payload alone); the framework converts it the way a user of it
        would (pyzmq: ``send_multipart([header, payload], copy=False)``), and that cost
        is part of what is measured. In the other suites it is a ``uint8`` array."""
        ...

    def payload_function(
        self, pub: Any, transport: str, shape: tuple[int, ...], dtype: str, loan: bool
    ) -> NewPayload:
        """The coroutine function that returns a new writable array of *shape* and
        *dtype* for the next message of *pub*: a buffer the framework lends when *loan*
        and it can lend one for *transport*, else a private array (a framework that
        cannot lend always returns private arrays: "copied" in the tables)."""
        ...

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        """Call ``handle(message)`` for each message of *sub* until it returns True. In
        p2p, ``message[0]``..``message[3]`` are phase, seq, t_ns and the payload (same
        dtype and shape; may be read-only). The message need not stay valid after
        ``handle`` returns. An exception of ``handle`` ends ``consume`` with it."""
        ...

    async def relay(self, sub: Any, pub: Any) -> int:
        """Republish every message of *sub* on *pub*, up to and including the first
        one that :func:`is_end`; return how many (the relay and spread suites only)."""
        ...


class EzflowFramework:
    """ezflow's low-level API (GraphContext, Publisher, Subscriber). Outside p2p it runs
    on uvloop unless ``EZFLOW_EVENT_LOOP`` says otherwise; a p2p cell's variant
    (:meth:`configure`) picks the loop (``asyncio`` is plain :func:`asyncio.run`) and
    ``recv`` or ``on_message``."""

    name = "ezflow"
    unavailable: tuple[type[Exception], ...] = (ConfigurationError,)

    def __init__(self) -> None:
        self._loop: str | None = None
        self._receive = "recv"
        self._inline_limit: int | None = None

    def configure(self, spec: dict[str, Any]) -> None:
        """Adopt a p2p cell's variant (loop and receive; the message shape and the
        loan are the worker's) and the plan's ``shm_inline_limit``."""
        variant = spec.get("variant")
        if variant is not None:
            self._loop = variant["loop"]
            self._receive = variant["receive"]
            if variant["message"] == "mixed":
                from .._core._codec import register_message  # noqa: PLC0415

                register_message(MixedSample, name="ezflow.perf.MixedSample")
        self._inline_limit = spec["plan"].get("shm_inline_limit")

    def version(self) -> str:
        import ezflow  # noqa: PLC0415 - keep the module importable without side effects

        return ezflow.__version__

    def loop_name(self) -> str:
        if self._loop is not None:
            return self._loop
        from .._core._loop import loop_factory  # noqa: PLC0415

        return "uvloop" if loop_factory().__module__.startswith("uvloop") else "asyncio"

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        if self._loop == "asyncio":
            return asyncio.run(main)  # exactly what the ordinary program calls
        from .._core._loop import run_coroutine  # noqa: PLC0415

        return run_coroutine(main, loop=self._loop)

    @contextlib.asynccontextmanager
    async def graph_server(self) -> AsyncIterator[tuple[str, int]]:
        from .._graph._server import GraphServer  # noqa: PLC0415

        async with GraphServer(("127.0.0.1", 0)) as server:
            yield server.address

    def context(self, graph: tuple[str, int]) -> AbstractAsyncContextManager[Any]:
        from .._graph._context import GraphContext  # noqa: PLC0415

        return GraphContext(graph, auto_start=False, name=f"perf-{os.getpid()}")

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        if self._inline_limit is not None and transport == "shm":
            from .._core._config import ShmOptions  # noqa: PLC0415

            options = ShmOptions(inline_limit=self._inline_limit)
            return await ctx.publisher(topic, transport=transport, shm=options)
        return await ctx.publisher(topic, transport=transport)

    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        if self._receive == "on_message":
            callbacks = _Callbacks()
            await ctx.subscriber(topic, transport=transport, on_message=callbacks)
            return callbacks
        return await ctx.subscriber(topic, transport=transport)

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        publish: Callable[[Any], Awaitable[None]] = pub.publish
        return publish

    def payload_function(
        self, pub: Any, transport: str, shape: tuple[int, ...], dtype: str, loan: bool
    ) -> NewPayload:
        from .._core._config import DEFAULT_SHM_INLINE_LIMIT  # noqa: PLC0415

        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        limit = DEFAULT_SHM_INLINE_LIMIT if self._inline_limit is None else self._inline_limit
        # Below the inline limit shm sends messages inline on its socket: nothing to lend.
        if loan and transport == "shm" and nbytes >= limit:
            lend = pub.loan

            async def loaned() -> Payload:
                payload: Payload = await lend(shape, dtype)
                return payload

            return loaned
        return private_payload(shape, dtype)

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        if isinstance(sub, _Callbacks):
            await sub.consume(handle)
            return
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


class _Callbacks:
    """The ``on_message`` callback of an ezflow subscriber, standing in for the
    subscriber in :meth:`EzflowFramework.consume`: messages that arrive before
    ``consume`` starts wait in a list (none are lost)."""

    def __init__(self) -> None:
        self._early: list[Any] = []
        self._handle: Callable[[Any], bool] | None = None
        self._done: asyncio.Future[None] | None = None

    def __call__(self, message: Any) -> None:
        handle = self._handle
        if handle is None:
            self._early.append(message)
            return
        try:
            finished = handle(message)
        except BaseException as exc:  # ezflow would only count it: end consume() with it
            self._finish(exc)
            return
        if finished:
            self._finish(None)

    def _finish(self, error: BaseException | None) -> None:
        self._handle = _ignore
        if self._done is not None and not self._done.done():
            if error is None:
                self._done.set_result(None)
            else:
                self._done.set_exception(error)

    async def consume(self, handle: Callable[[Any], bool]) -> None:
        self._done = asyncio.get_running_loop().create_future()
        early, self._early = self._early, []
        for message in early:
            if handle(message):
                self._handle = _ignore
                return
        self._handle = handle
        await self._done


def _ignore(message: Any) -> bool:
    return False


def private_payload(shape: tuple[int, ...], dtype: str) -> NewPayload:
    """A :meth:`Framework.payload_function` that allocates a new array every time."""
    empty, kind = np.empty, np.dtype(dtype)

    async def new() -> Payload:
        return empty(shape, kind)

    return new


def private_frame(size: int) -> NewPayload:
    """:func:`private_payload` of *size* ``uint8`` bytes."""
    return private_payload((size,), "uint8")


def is_end(message: Any) -> bool:
    """True for the END message of a source."""
    return bool(HEADER.unpack_from(message)[3] == END)


@dataclass(slots=True)
class MixedSample:
    """The second stream of the ``mixed`` p2p variant: the ordinary tuple's fields in a
    dataclass, a shape of its own for the codec (registered by
    :meth:`EzflowFramework.configure`)."""

    phase: int
    seq: int
    t_ns: int
    payload: Payload
    source: str = "mixed"


class _Alternating:
    """The subscribers of a ``mixed`` cell as one: :meth:`recv` takes from each in
    turn, as the source publishes to each in turn (lossless edges keep that order)."""

    def __init__(self, first: Any, second: Any) -> None:
        self._recvs = (first.recv, second.recv)
        self._turn = 0

    def recv(self) -> Awaitable[Any]:
        recv = self._recvs[self._turn]
        self._turn ^= 1
        received: Awaitable[Any] = recv()
        return received


def _mixed_publish(
    framework: Framework, first: Any, second: Any, *, pair: bool = False
) -> Callable[[Any], Awaitable[None]]:
    """A publish function for ``(phase, seq, t_ns, payload)`` tuples that sends those
    of even *seq* as they are to *first* and the others as :class:`MixedSample` to
    *second* (with *pair*, as they are: the ``pair`` variant's one shape)."""
    publish_first = framework.publish_function(first)
    publish_second = framework.publish_function(second)

    if pair:

        def publish_pair(message: Any) -> Awaitable[None]:
            if message[1] & 1:
                return publish_second(message)
            return publish_first(message)

        return publish_pair

    def publish(message: Any) -> Awaitable[None]:
        if message[1] & 1:
            return publish_second(MixedSample(*message))
        return publish_first(message)

    return publish


def payload_for(seed: int, source: int, size: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The random payload of *source* (never zeros, which the kernel shares for free)."""
    return np.random.default_rng([seed, source]).integers(0, 256, size, dtype=np.uint8)


def p2p_payload_for(seed: int, size: int) -> Payload:
    """The random p2p payload of *size* bytes (:func:`._spec.payload_layout`): random
    ``float32`` in [1, 2) (never zeros), or random ``uint8`` for the frame."""
    shape, dtype = payload_layout(size)
    rng = np.random.default_rng([seed, 0])
    if dtype == "uint8":
        return rng.integers(1, 256, shape, dtype=np.uint8)
    return (rng.random(shape, dtype=np.float32) + np.float32(1.0)).astype(np.float32)


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
        """Account one message (a ``uint8`` array with :data:`HEADER` first); True once
        every source has ended."""
        now = time.perf_counter_ns()
        stamp, seq, source, phase = HEADER.unpack_from(message)
        return self._account(now, stamp, seq, source, phase, message)

    def _intact(self, message: Any, source: int) -> bool:
        """Whether the payload of *message* is what *source* sends."""
        return bool(np.array_equal(message[HEADER.size :], self.expected[source][HEADER.size :]))

    def _account(  # noqa: PLR0917 - the header fields, unpacked once by the caller
        self, now: int, stamp: int, seq: int, source: int, phase: int, message: Any
    ) -> bool:
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
        if not self._intact(message, source):
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


@dataclass(slots=True)
class P2PSink(SinkState):
    """The sink of a p2p cell (one source): messages are ``(phase, seq, t_ns, payload)``
    (anything indexable so), or with *array* the payload alone, :data:`HEADER` in its
    first bytes. ``expected`` holds the source's payload."""

    array: bool = False

    def handle(self, message: Any) -> bool:
        now = time.perf_counter_ns()
        if self.array:
            stamp, seq, _, phase = HEADER.unpack_from(message)
        elif type(message) is MixedSample:
            phase, seq, stamp = message.phase, message.seq, message.t_ns
        else:
            phase, seq, stamp = message[0], message[1], message[2]
        return self._account(now, stamp, seq, 0, phase, message)

    def _intact(self, message: Any, source: int) -> bool:
        expected = self.expected[0]
        if self.array:
            got = np.asarray(message).view(np.uint8).reshape(-1)[HEADER.size :]
            return bool(np.array_equal(got, expected.view(np.uint8).reshape(-1)[HEADER.size :]))
        payload = np.asarray(message.payload if type(message) is MixedSample else message[3])
        return (
            payload.dtype == expected.dtype
            and payload.shape == expected.shape
            and bool(np.array_equal(payload, expected))
        )


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
    new_frame = framework.payload_function(pub, spec["transport"], (size,), "uint8", plan.loan)
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


async def _p2p_source(
    framework: Framework,
    pub: Any,
    spec: dict[str, Any],
    plan: Plan,
    *,
    measure: asyncio.Event,
) -> dict[str, Any]:
    """Publish the phases of the p2p source (see :mod:`._spec`), written the way the
    cell's variant says."""
    size: int = spec["size"]
    variant: dict[str, Any] = spec["variant"]
    shape, dtype = payload_layout(size)
    body = p2p_payload_for(spec["seed"], size)
    publish = (
        _mixed_publish(framework, *pub, pair=variant["message"] == "pair")
        if variant["message"] in TWO_TOPICS
        else framework.publish_function(pub)
    )
    array, loan = variant["message"] == "array", bool(variant["loan"])
    # Typed loosely: numpy arrays are buffers, which typeshed's Buffer does not know.
    pack: Callable[..., None] = HEADER.pack_into
    clock = time.perf_counter_ns
    seq = 0

    if array or loan:
        # A loan is new for every message, and a bare array carries its own header,
        # so it cannot be the same array each time (a transport may still hold the
        # previous one): a new payload per message, filled as a producer fills it.
        new_payload = framework.payload_function(pub, spec["transport"], shape, dtype, loan)

        async def send(phase: int) -> None:
            payload = await new_payload()
            payload[...] = body
            if array:
                pack(payload, 0, clock(), seq, 0, phase)
                await publish(payload)
            else:
                await publish((phase, seq, clock(), payload))

    else:

        async def send(phase: int) -> None:
            await publish((phase, seq, clock(), body))  # the ordinary program

    period = p2p_pacing(size, plan.period)
    while not measure.is_set():
        await send(WARMUP)
        seq += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(measure.wait(), period)
    due = time.monotonic()
    for _ in range(latency_count(plan, size, 1, "p2p")):
        await send(LATENCY)
        seq += 1
        due += period
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    frame = size == FRAME_SIZE
    started = clock()
    stop_ns = started + int(plan.duration * 1e9)
    hard_ns = started + int((plan.duration if frame else plan.max_duration) * 1e9)
    at_least = seq + (0 if frame else plan.min_messages)
    limit = seq + (plan.count if plan.count is not None else sys.maxsize)
    plain = not (array or loan)
    while seq < limit:
        now = clock()
        if now >= stop_ns and (seq >= at_least or now >= hard_ns):
            break
        if plain:  # send(RATE), inlined: what the ordinary program's loop costs
            await publish((RATE, seq, now, body))
        else:
            await send(RATE)
        seq += 1
        if not seq % YIELD_EVERY:
            # publish() need not suspend: let the other tasks of this process run, e.g.
            # the one that notices the parent has gone.
            await asyncio.sleep(0)
    rate_seconds = (clock() - started) / 1e9
    await send(END)
    return {"kind": "source", "index": 0, "rate_seconds": rate_seconds, "published": seq + 1}


async def _sink(
    framework: Framework,
    sub: Any,
    unit: UnitSpec,
    spec: dict[str, Any],
    plan: Plan,
    *,
    on_warm: Callable[[], None],
) -> dict[str, Any]:
    sources, warmup_ns = unit.sources, int(plan.warmup * 1e9)
    state: SinkState
    if spec.get("suite") == "p2p":
        state = P2PSink(
            sources=1,
            warmup_ns=warmup_ns,
            expected=[p2p_payload_for(spec["seed"], spec["size"])],
            on_warm=on_warm,
            array=spec["variant"]["message"] == "array",
        )
    else:
        expected = [payload_for(spec["seed"], index, spec["size"]) for index in range(sources)]
        state = SinkState(sources=sources, warmup_ns=warmup_ns, expected=expected, on_warm=on_warm)
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
            # (the mixed and pair p2p variants: two topics, see _Alternating and
            # _mixed_publish)
            mixed = (spec.get("variant") or {}).get("message") in TWO_TOPICS
            try:
                subs: dict[tuple[str, int], Any] = {}
                for unit in units:
                    if unit.input is not None:
                        sub = await framework.subscriber(ctx, unit.input, transport)
                        if mixed:
                            second = unit.input + MIXED_TOPIC_SUFFIX
                            sub = _Alternating(
                                sub, await framework.subscriber(ctx, second, transport)
                            )
                        subs[unit.kind, unit.index] = sub
                _emit("subscribed")
                await commands.expect("publish")
                pubs: dict[tuple[str, int], Any] = {}
                for unit in units:
                    if unit.output is not None:
                        pub = await framework.publisher(ctx, unit.output, transport)
                        if mixed:
                            second = unit.output + MIXED_TOPIC_SUFFIX
                            pub = (pub, await framework.publisher(ctx, second, transport))
                        pubs[unit.kind, unit.index] = pub
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
                if unit.kind == "source" and spec.get("suite") == "p2p":
                    work.append(_p2p_source(framework, pubs[key], spec, plan, measure=measure))
                elif unit.kind == "source":
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
                    loop=framework.loop_name(),
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


#: Seconds a ``throughput`` sink waits for its first message.
FIRST_MESSAGE_TIMEOUT = 60.0


async def _run_throughput(framework: Framework, spec: dict[str, Any]) -> None:
    """The ``throughput`` command: one end of a stream written the way a library's own
    throughput example is (``ezflow perf peers --selfcheck``): the source publishes
    the p2p message ``(RATE, seq, 0, payload)`` back to back, the same payload every
    time, until stdin closes; the sink only counts (no timestamps, no checks), and
    reports messages per second over ``window`` seconds after ``warmup`` seconds of
    the stream. Both ends go through the framework's own adapter (publisher,
    ``publish_function``, subscriber, ``consume``), as the p2p cells do."""
    graph = (spec["graph"][0], int(spec["graph"][1]))
    topic, transport, role = spec["topic"], spec["transport"], spec["role"]
    commands = _Commands()
    await commands.start()
    gone = asyncio.Event()
    listener = asyncio.ensure_future(_listen(commands, asyncio.Event(), gone))
    try:
        async with framework.context(graph) as ctx:
            try:
                if role == "sink":
                    end = await framework.subscriber(ctx, topic, transport)
                else:
                    end = await framework.publisher(ctx, topic, transport)
            except framework.unavailable as exc:
                _emit("unavailable", reason=str(exc))
                return
            _emit("ready")
            if role == "sink":
                await _unless_gone(_count_window(framework, end, spec), gone)
                await gone.wait()
            else:
                await _blast(framework, end, spec, gone)
    finally:
        listener.cancel()
        commands.close()


async def _count_window(framework: Framework, sub: Any, spec: dict[str, Any]) -> None:
    count = [0]

    def handle(message: Any) -> bool:
        count[0] += 1
        return bool(message[0] == END)

    consuming = asyncio.ensure_future(framework.consume(sub, handle))
    try:
        deadline = time.monotonic() + FIRST_MESSAGE_TIMEOUT
        while not count[0]:
            if consuming.done():
                consuming.result()  # its error, if it failed
                raise RuntimeError("the stream ended before its first message")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no message within {FIRST_MESSAGE_TIMEOUT:.0f} s")
            await asyncio.sleep(0.01)
        await asyncio.sleep(float(spec["warmup"]))
        first, started = count[0], time.perf_counter()
        await asyncio.sleep(float(spec["window"]))
        last, ended = count[0], time.perf_counter()
        _emit(
            "result",
            msgs_per_s=(last - first) / (ended - started),
            messages=last - first,
            seconds=ended - started,
        )
    finally:
        consuming.cancel()


async def _blast(framework: Framework, pub: Any, spec: dict[str, Any], gone: asyncio.Event) -> None:
    payload = p2p_payload_for(int(spec.get("seed", 0)), int(spec["size"]))
    publish = framework.publish_function(pub)
    seq = 0
    while not gone.is_set():
        await publish((RATE, seq, 0, payload))
        seq += 1
        if not seq % YIELD_EVERY:
            await asyncio.sleep(0)  # the end of stdin: stop


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
    """Entry point of a worker: ``graph``, ``units SPEC_JSON``, ``throughput SPEC_JSON``
    or ``info``. Errors are printed to stderr (the runner reports their last line)
    with a non-zero exit."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["graph"]:
            framework.run(_run_graph(framework))
        elif args[:1] == ["units"] and len(args) == 2:
            spec = json.loads(args[1])
            configure = getattr(framework, "configure", None)
            if configure is not None:
                configure(spec)
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
        elif args[:1] == ["throughput"] and len(args) == 2:
            spec = json.loads(args[1])
            configure = getattr(framework, "configure", None)
            if configure is not None:
                configure({"variant": None, "plan": {}, **spec})
            framework.run(_run_throughput(framework, spec))
        elif args[:1] == ["info"]:
            _emit(
                "info",
                framework=framework.name,
                version=framework.version(),
                loop=framework.loop_name(),
                leftovers=list(getattr(framework, "leftovers", ())),
            )
        else:
            sys.exit("usage: worker graph | units SPEC_JSON | throughput SPEC_JSON | info")
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
