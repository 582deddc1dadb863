"""Transport benchmark of ezflow: one publisher -> one subscriber, in two processes,
over shared memory (shm) and tcp.

Everything is measured in one run, repeat after repeat, so that the ratios between
ezflow and the raw socket floor (:mod:`_floor`) are meaningful on a noisy machine:

* raw floor: a uvloop/asyncio-Protocol ping-pong between two processes over a
  ``socket.socketpair()`` (a Unix socket) and over TCP loopback (one-way = RTT / 2), a
  paced (1 ms) one-way send over a Unix socket and over TCP loopback, and the
  throughput of each with one ``transport.write`` per message;
* ezflow one-way latency p50/p99 per transport, paced at one message every 1 ms: the
  publisher writes ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared by the processes
  of one host) into the first 8 bytes of a random payload and the subscriber subtracts
  it from its own clock on receipt - once with ``await sub.recv()`` (a task wakes up
  for each message) and once in an ``on_message`` callback, which takes the time where
  the raw floor's receiver does: in the read callback;
* ezflow back-to-back throughput per transport: the publisher publishes as fast as
  lossless flow control lets it, the subscriber counts from the end of the warm-up to
  the last message (and reports its CPU time and page faults, the publisher its CPU
  time and waits); over shm also with loaned buffers (``Publisher.loan``: no copy);
* a 3840x2160x3 uint8 video frame (24.9 MB) over shm: loaned (filled in place,
  published with no copy) paced at 1 ms like the other latency rows and at 10 ms like a
  camera, and published as a plain array (copied once) at 10 ms;
* ezmsg 3.9.0, when an interpreter with it installed is at hand (this one, or
  ``--ezmsg PYTHON``): the same latency and throughput runs, back to back with ezflow's
  (:mod:`peers.ezmsg_pair`), on its own graph server.

The parent process hosts the graph server; the publisher and the subscriber are child
processes running this script (``child pub|sub``). Children never outlive the parent: they
are killed in ``finally``, the publisher also ends when its stdin (a pipe from the parent)
closes, and the subscriber gives up after a deadline.

Usage::

    python perf/bench_transports.py [--quick] [--repeats N] [--transports shm,tcp]
                                    [--loop uvloop|asyncio] [--json PATH]
                                    [--profile DIR] [--max-in-flight N]
                                    [--ezmsg PYTHON | --no-ezmsg]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from _floor import LOOPS, paced_one_way, pingpong_rtt, stream_rate
from rich.console import Console
from rich.table import Table

import ezflow

T = TypeVar("T")

_SCRIPT = str(Path(__file__).resolve())
_PEER = str(Path(__file__).resolve().parent / "peers" / "ezmsg_pair.py")
_SMALL = 64
_LARGE = 1 << 20
_SIZES = (_SMALL, _LARGE)
_FRAME_SHAPE = (2160, 3840, 3)  # one 4K RGB video frame
_FRAME = 2160 * 3840 * 3
_PERIOD = 0.001  # latency pacing: one message every 1 ms
_FRAME_PERIOD = 0.01  # ... and one video frame every 10 ms
_TRANSPORTS = ("shm", "tcp")
#: The raw socket kind each transport is compared with.
_SOCKET = {"shm": "unix", "tcp": "tcp"}
_STAMP = np.dtype(np.int64)
_STAMP_PACK = struct.Struct("=q")  # the same 8 bytes, written with struct as the floor does
#: Extra time a child gets beyond its expected run time before it counts as hung.
_GRACE = 60.0

#: ezmsg 3.9.0 on this machine, from DESIGN.md ("Performance, as users will measure it").
REFERENCE = {
    ("latency_p50_us/shm", _SMALL): 205.0,
    ("latency_p50_us/shm", _LARGE): 270.0,
    ("msgs_per_s/shm", _SMALL): 27_000.0,
    ("msgs_per_s/shm", _LARGE): 9_000.0,
    ("latency_p50_us/tcp", _SMALL): 293.0,
    ("latency_p50_us/tcp", _LARGE): 863.0,
    ("msgs_per_s/tcp", _SMALL): 15_000.0,
    ("msgs_per_s/tcp", _LARGE): 560.0,
    ("floor_socketpair_rtt_p50_us", _SMALL): 66.0,
}


@dataclass(frozen=True, slots=True)
class Plan:
    """How many samples each measurement takes (per repeat)."""

    floor_round_trips: dict[int, int]
    floor_warmup: dict[int, int]
    floor_stream_count: dict[int, int]
    latency_samples: dict[int, int]
    latency_warmup: dict[int, int]
    throughput_count: dict[int, int]
    throughput_warmup: dict[int, int]
    frame_samples: int
    frame_warmup: int
    max_seconds: float


FULL = Plan(
    floor_round_trips={_SMALL: 2000, _LARGE: 300},
    floor_warmup={_SMALL: 200, _LARGE: 30},
    floor_stream_count={_SMALL: 300_000, _LARGE: 3000},
    latency_samples={_SMALL: 1000, _LARGE: 300},
    latency_warmup={_SMALL: 200, _LARGE: 50},
    throughput_count={_SMALL: 200_000, _LARGE: 20_000},
    throughput_warmup={_SMALL: 2000, _LARGE: 100},
    frame_samples=200,
    frame_warmup=20,
    max_seconds=3.0,
)
QUICK = Plan(
    floor_round_trips={_SMALL: 500, _LARGE: 100},
    floor_warmup={_SMALL: 100, _LARGE: 20},
    floor_stream_count={_SMALL: 100_000, _LARGE: 1000},
    latency_samples={_SMALL: 300, _LARGE: 100},
    latency_warmup={_SMALL: 50, _LARGE: 20},
    throughput_count={_SMALL: 50_000, _LARGE: 5000},
    throughput_warmup={_SMALL: 1000, _LARGE: 30},
    frame_samples=50,
    frame_warmup=10,
    max_seconds=1.5,
)


def _size_label(size: int) -> str:
    if size == _FRAME:
        return "24.9 MB"
    return "1 MiB" if size == _LARGE else f"{size} B"


def _payload(seed: int, size: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The random payload both children derive from the same seed."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _percentiles_us(samples_ns: list[int]) -> tuple[float, float]:
    """(p50, p99) of *samples_ns*, in µs."""
    p50, p99 = np.percentile(np.asarray(samples_ns, dtype=np.float64), [50, 99])
    return float(p50) / 1e3, float(p99) / 1e3


# -- child processes ---------------------------------------------------------------------


class _StdinWatch(asyncio.Protocol):
    """Resolves :attr:`closed` when the parent closes our stdin (or dies)."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def _stdin_closed() -> None:
    """Return once our stdin reaches end of file (the parent closed it or died)."""
    transport, watch = await asyncio.get_running_loop().connect_read_pipe(_StdinWatch, sys.stdin)
    try:
        await watch.closed
    finally:
        transport.close()


async def _unless(work: Coroutine[Any, Any, T], stop: asyncio.Future[None]) -> T | None:
    """Run *work* to completion, or cancel it and return None once *stop* is done."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
        return task.result() if task.done() else None
    finally:
        task.cancel()


def _stamp(message: np.ndarray[Any, Any]) -> None:
    """Write the send time into the first 8 bytes of *message*.

    The view is made before the clock is read, so that only packing the time is timed,
    as the raw floor's sender times only ``struct.pack`` and its write."""
    view = memoryview(message).cast("B")  # type: ignore[arg-type]
    _STAMP_PACK.pack_into(view, 0, time.perf_counter_ns())


#: Bytes of a loaned buffer the publisher fills (and the subscriber checks): filling the
#: whole buffer would measure memory bandwidth, not the transport.
_LOAN_FILLED = 4096


async def _publish(pub: ezflow.Publisher, args: argparse.Namespace) -> dict[str, float]:
    """Publish every message; return the wall and CPU seconds spent doing so."""
    payload = _payload(args.seed, args.size)
    shape = _FRAME_SHAPE if args.size == _FRAME else (args.size,)
    await pub.wait_for_channels(1)
    started, cpu_started = time.perf_counter(), time.process_time()
    mode = args.mode
    for _ in range(args.warmup + args.count):
        if mode == "throughput":
            # The same array every time: never modified, so it may still be in flight.
            await pub.publish(payload)
        elif mode == "loan-throughput":
            message = await pub.loan(shape)
            message.reshape(-1)[:_LOAN_FILLED] = payload[:_LOAN_FILLED]
            await pub.publish(message)
        else:
            if mode == "loan-latency":
                message = await pub.loan(shape)
                message.reshape(-1)[:_LOAN_FILLED] = payload[:_LOAN_FILLED]
            else:
                message = payload.reshape(shape).copy()  # tcp may still send the last one
            _stamp(message)
            await pub.publish(message)
            await asyncio.sleep(args.period)
    return {
        "publisher_seconds": time.perf_counter() - started,
        "publisher_cpu_seconds": time.process_time() - cpu_started,
    }


async def _publisher_child(args: argparse.Namespace) -> dict[str, Any]:
    """Publish until done, then hold the connection until the parent releases us by
    closing our stdin (leaving the context earlier could cut off what is still in
    flight); stop publishing early if released before."""
    options: dict[str, Any] = {}
    if args.max_in_flight is not None:
        options["max_in_flight"] = args.max_in_flight
    if args.max_in_flight_bytes is not None:
        options["max_in_flight_bytes"] = args.max_in_flight_bytes
    shm_options: dict[str, Any] = {}
    if args.inline_limit is not None:
        shm_options["inline_limit"] = args.inline_limit
    if args.no_handoff:
        shm_options["handoff"] = False
    if shm_options:
        options["shm"] = ezflow.ShmOptions(**shm_options)
    released = asyncio.ensure_future(_stdin_closed())
    try:
        async with ezflow.GraphContext(args.graph, auto_start=False) as ctx:
            pub = await ctx.publisher(args.topic, transport=args.transport, **options)
            result: dict[str, Any] = {}
            timing = await _unless(_publish(pub, args), released)
            if timing is not None:
                result.update(timing)
                await released
            result["publisher_stats"] = dataclasses.asdict(pub.stats)
            shm_stats = pub.shm_stats
            if shm_stats is not None:
                result["shm_stats"] = dataclasses.asdict(shm_stats)
            return result
    finally:
        released.cancel()


def _check_message(message: Any, expected: np.ndarray[Any, Any], loaned: bool) -> None:
    """Raise AssertionError unless *message* is the payload (bar its timestamp; of a
    loaned buffer, only the part the publisher filled)."""
    if not isinstance(message, np.ndarray) or message.size != expected.size:
        raise AssertionError(f"unexpected message {type(message).__name__}")
    flat = message.reshape(-1)
    end = _LOAN_FILLED if loaned else 1 << 16
    if not np.array_equal(flat[8:end], expected[8:end]):
        raise AssertionError("payload corrupted in transit")
    tail = max(8, flat.size - (1 << 16))
    if not loaned and not np.array_equal(flat[tail:], expected[tail:]):
        raise AssertionError("payload corrupted in transit")


async def _receive_latency(
    sub: ezflow.Subscriber, args: argparse.Namespace, expected: np.ndarray[Any, Any]
) -> dict[str, Any]:
    """Record the one-way latency of every message after the warm-up."""
    latencies: list[int] = []
    loaned = args.mode.startswith("loan")
    for index in range(args.warmup + args.count):
        message = await sub.recv()
        now = time.perf_counter_ns()
        if index >= args.warmup:
            latencies.append(now - int(message.reshape(-1)[:8].view(_STAMP)[0]))
        _check_message(message, expected, loaned)  # after taking the time
    return {"latency_ns": latencies}


class _CallbackLatency:
    """The ``on_message`` callback of a ``callback-latency`` subscriber: records the
    one-way latency of every message after the warm-up, as :func:`_receive_latency`
    does with ``recv``, but with no task to wake up."""

    def __init__(self, args: argparse.Namespace, expected: np.ndarray[Any, Any]) -> None:
        self.latencies: list[int] = []
        self.seen = 0
        self.error: BaseException | None = None
        self.done = asyncio.get_running_loop().create_future()
        self._args = args
        self._expected = expected

    def __call__(self, message: Any) -> None:
        now = time.perf_counter_ns()
        if self.done.done():
            return
        if self.seen >= self._args.warmup:
            self.latencies.append(now - int(message.reshape(-1)[:8].view(_STAMP)[0]))
        self.seen += 1
        try:
            _check_message(message, self._expected, False)  # after taking the time
        except AssertionError as exc:
            self.done.set_exception(exc)
            return
        if self.seen == self._args.warmup + self._args.count:
            self.done.set_result(None)

    async def result(self) -> dict[str, Any]:
        await self.done
        return {"latency_ns": self.latencies}


async def _receive_throughput(
    sub: ezflow.Subscriber, args: argparse.Namespace, expected: np.ndarray[Any, Any]
) -> dict[str, Any]:
    """Count messages from the end of the warm-up until the last one or the deadline."""
    clock = time.perf_counter_ns
    for _ in range(args.warmup + 1):
        message = await sub.recv()
    started = clock()
    cpu_started = time.process_time()
    faults_started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    deadline = started + int(args.max_seconds * 1e9)
    received = 0
    for _ in range(args.count - 1):
        message = await sub.recv()
        received += 1
        if clock() >= deadline:
            break
    elapsed = (clock() - started) / 1e9
    cpu = time.process_time() - cpu_started
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_started
    _check_message(message, expected, args.mode.startswith("loan"))
    return {
        "messages": received,
        "seconds": elapsed,
        "subscriber_cpu_seconds": cpu,
        "subscriber_minor_page_faults": faults,
    }


async def _subscriber_child(args: argparse.Namespace) -> dict[str, Any]:
    """Receive and measure; give up after ``--timeout`` or when the parent goes away
    (our stdin closes)."""
    parent_gone = asyncio.ensure_future(_stdin_closed())
    try:
        async with ezflow.GraphContext(args.graph, auto_start=False) as ctx:
            expected = _payload(args.seed, args.size)
            if args.mode == "callback-latency":
                callback = _CallbackLatency(args, expected)
                sub = await ctx.subscriber(
                    args.topic, transport=args.transport, on_message=callback
                )
                work = asyncio.wait_for(callback.result(), args.timeout)
            else:
                sub = await ctx.subscriber(args.topic, transport=args.transport)
                receive = (
                    _receive_throughput if args.mode.endswith("throughput") else _receive_latency
                )
                work = asyncio.wait_for(receive(sub, args, expected), args.timeout)
            result = await _unless(work, parent_gone)
            if result is None:
                raise RuntimeError("the parent process went away")
            result["subscriber_stats"] = dataclasses.asdict(sub.stats)
            result["transports"] = sorted({c.transport for c in ctx.channels})
            return result
    finally:
        parent_gone.cancel()


def _child_main(args: argparse.Namespace) -> None:
    """Run one child role and print its result as one JSON document on stdout."""
    role = _publisher_child if args.role == "pub" else _subscriber_child
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    try:
        result = ezflow.run_coroutine(role(args), loop=args.loop)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
    print(json.dumps(result))


# -- the parent ----------------------------------------------------------------------------

#: Child pids not yet reaped, for the last-resort cleanup in :func:`main`.
_LIVE: set[int] = set()


class _Child:
    """A child process running one role of this script."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process
        _LIVE.add(process.pid)
        self._output = asyncio.ensure_future(self._collect())

    async def _collect(self) -> tuple[str, str]:
        """The child's whole stdout and stderr, read concurrently until it exits."""

        async def read(stream: asyncio.StreamReader | None) -> str:
            assert stream is not None
            return (await stream.read()).decode(errors="replace")

        stdout, stderr = await asyncio.gather(read(self.process.stdout), read(self.process.stderr))
        return stdout, stderr

    @classmethod
    async def start(cls, name: str, args: list[str], *, python: str | None = None) -> _Child:
        """Start ``this script child ARGS`` (with *python*: the ezmsg peer script under
        that interpreter). Its stdin is a pipe from this process: the child ends when it
        closes (:meth:`release`, or this process dying)."""
        command = [sys.executable, _SCRIPT] if python is None else [python, _PEER]
        process = await asyncio.create_subprocess_exec(
            *command,
            "child",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(name, process)

    def release(self) -> None:
        """Close the child's stdin: a publisher child then ends."""
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()

    async def result(self, timeout: float) -> dict[str, Any]:
        """Wait for the child to exit and return its JSON result (raise with its
        stderr if it failed)."""
        try:
            stdout, stderr = await asyncio.wait_for(asyncio.shield(self._output), timeout)
        except asyncio.TimeoutError:
            raise RuntimeError(
                f"{self.name} child hung (no result within {timeout:.0f} s)"
            ) from None
        code = await self.process.wait()
        if code != 0:
            raise RuntimeError(f"{self.name} child exited with {code}:\n{stderr.strip()}")
        if stderr.strip():
            _log(f"[yellow]{self.name} child stderr:[/]")
            _stderr.print(stderr.strip(), markup=False, highlight=False)
        return dict(json.loads(stdout))

    async def kill(self) -> None:
        """Kill the child if it is still running and reap it."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        await self.process.wait()
        self._output.cancel()
        _LIVE.discard(self.process.pid)


_stderr = Console(stderr=True)


def _log(message: str) -> None:
    _stderr.print(message, highlight=False)


async def _ezflow_run(
    graph: str,
    transport: str,
    mode: str,
    size: int,
    *,
    plan: Plan,
    options: argparse.Namespace,
    tag: str,
    python: str | None = None,
    inline_limit: int | None = None,
    frame_period: float = _FRAME_PERIOD,
) -> dict[str, Any]:
    """One publisher child and one subscriber child streaming one topic (ezmsg's when
    *python* is given: its interpreter; *inline_limit* sets the publisher's
    ``ShmOptions.inline_limit``; video frames are paced at *frame_period*)."""
    period = _PERIOD
    if size not in _SIZES and size != _FRAME:  # the crossover sweep
        if mode.endswith("latency"):
            count, warmup = plan.latency_samples[_LARGE], plan.latency_warmup[_LARGE]
            expected_s = (count + warmup) * period * 3
        else:
            count, warmup = 1_000_000, plan.throughput_warmup[_LARGE]
            expected_s = plan.max_seconds * 2
    elif size == _FRAME:
        count, warmup, period = plan.frame_samples, plan.frame_warmup, frame_period
        expected_s = (count + warmup) * period * 3
    elif mode.endswith("latency"):
        count, warmup = plan.latency_samples[size], plan.latency_warmup[size]
        expected_s = (count + warmup) * period * 3
    else:
        count, warmup = plan.throughput_count[size], plan.throughput_warmup[size]
        expected_s = plan.max_seconds * 2
    common = [
        "--graph", graph,
        "--topic", f"/bench/{mode}/{size}/{uuid.uuid4().hex[:8]}",
        "--transport", transport,
        "--period", str(period),
        "--mode", mode,
        "--size", str(size),
        "--count", str(count),
        "--warmup", str(warmup),
        "--seed", str(int.from_bytes(os.urandom(4), "little")),
        "--max-seconds", str(plan.max_seconds),
        "--timeout", str(expected_s + _GRACE),
        "--loop", options.loop,
    ]  # fmt: skip
    children: list[_Child] = []
    try:
        for role in ("sub", "pub"):
            extra = []
            if options.profile is not None:
                name = f"{role}-{transport}-{mode}-{size}-{tag}.prof"
                extra += ["--profile", str(options.profile / name)]
            if options.max_in_flight is not None:
                extra += ["--max-in-flight", str(options.max_in_flight)]
            if options.max_in_flight_bytes is not None:
                extra += ["--max-in-flight-bytes", str(options.max_in_flight_bytes)]
            if inline_limit is not None:
                extra += ["--inline-limit", str(inline_limit)]
            if options.no_handoff and python is None:
                extra += ["--no-handoff"]
            child = await _Child.start(role, [role, *common, *extra], python=python)
            children.append(child)
        subscriber, publisher = children
        # The subscriber gives up by itself after expected_s + _GRACE.
        received_task = asyncio.ensure_future(subscriber.result(expected_s + 2 * _GRACE))
        publisher_exit = asyncio.ensure_future(publisher.process.wait())
        try:
            # Fail fast if the publisher dies before the subscriber has its result.
            await asyncio.wait({received_task, publisher_exit}, return_when=asyncio.FIRST_COMPLETED)
            if not received_task.done():
                await publisher.result(_GRACE)  # raises with its stderr when it failed
                raise RuntimeError("publisher child ended before the subscriber was done")
            received = received_task.result()
        finally:
            received_task.cancel()
            publisher_exit.cancel()
        publisher.release()
        received.update(await publisher.result(_GRACE))
        if received["transports"] != [transport]:
            raise RuntimeError(f"asked for {transport}, the edge used {received['transports']}")
        return received
    finally:
        for child in children:
            await child.kill()


async def _repeat(
    graph: str, ezmsg_graph: str | None, plan: Plan, options: argparse.Namespace, tag: str
) -> dict[str, Any]:
    """One repeat of every measurement: metric values plus raw details."""
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {}
    loop = options.loop
    transports: tuple[str, ...] = options.transports

    async def ezflow_run(
        transport: str, mode: str, size: int, frame_period: float = _FRAME_PERIOD
    ) -> dict[str, Any]:
        _log(f"  ezflow: {transport} {mode} {_size_label(size)}")
        run = await _ezflow_run(
            graph,
            transport,
            mode,
            size,
            plan=plan,
            options=options,
            tag=tag,
            frame_period=frame_period,
        )
        details[f"{mode}/{transport}/{size}/{frame_period}"] = run
        return run

    async def ezmsg_run(transport: str, mode: str, size: int) -> dict[str, Any] | None:
        if ezmsg_graph is None:
            return None
        _log(f"  ezmsg: {transport} {mode} {_size_label(size)}")
        run = await _ezflow_run(
            ezmsg_graph,
            transport,
            mode,
            size,
            plan=plan,
            options=options,
            tag=tag,
            python=options.ezmsg,
        )
        details[f"ezmsg/{mode}/{transport}/{size}"] = run
        return run

    def latency(key: str, samples: list[int]) -> None:
        p50, p99 = _percentiles_us(samples)
        metrics[key.format(pct="p50")] = p50
        metrics[key.format(pct="p99")] = p99

    for size in _SIZES:
        label = _size_label(size)
        trips, warmup = plan.floor_round_trips[size], plan.floor_warmup[size]
        for over in ("socketpair", "tcp"):
            _log(f"  floor: {over} ping-pong {label}")
            rtt = await pingpong_rtt(size, trips, warmup, over=over, loop=loop)
            latency(f"floor_{over}_rtt_{{pct}}_us/{size}", rtt)
        for over in sorted({_SOCKET[t] for t in transports}):
            _log(f"  floor: {over} one-way, 1 ms pacing {label}")
            one_way = await paced_one_way(
                size,
                plan.latency_samples[size],
                plan.latency_warmup[size],
                period=_PERIOD,
                loop=loop,
                over=over,
            )
            latency(f"floor_{over}_paced_{{pct}}_us/{size}", one_way)
        for transport in transports:
            run = await ezflow_run(transport, "latency", size)
            latency(f"latency_{{pct}}_us/{transport}/{size}", run.pop("latency_ns"))
            run = await ezflow_run(transport, "callback-latency", size)
            latency(f"callback_latency_{{pct}}_us/{transport}/{size}", run.pop("latency_ns"))
            peer = await ezmsg_run(transport, "latency", size)
            if peer is not None:
                latency(f"ezmsg_latency_{{pct}}_us/{transport}/{size}", peer.pop("latency_ns"))
    for size in _SIZES:
        label = _size_label(size)
        for over in sorted({_SOCKET[t] for t in transports}):
            _log(f"  floor: {over} stream {label}")
            rate = await stream_rate(
                size,
                plan.floor_stream_count[size],
                max_seconds=plan.max_seconds,
                loop=loop,
                over=over,
            )
            metrics[f"floor_{over}_msgs_per_s/{size}"] = rate.msgs_per_s
            metrics[f"floor_{over}_mb_per_s/{size}"] = rate.mb_per_s
        modes = [(t, "throughput") for t in transports]
        if "shm" in transports:
            modes.append(("shm", "loan-throughput"))
        for transport in transports:
            peer = await ezmsg_run(transport, "throughput", size)
            if peer is not None:
                metrics[f"ezmsg_msgs_per_s/{transport}/{size}"] = peer["messages"] / peer["seconds"]
        for transport, mode in modes:
            run = await ezflow_run(transport, mode, size)
            name = "msgs_per_s" if mode == "throughput" else "loan_msgs_per_s"
            msgs_per_s = run["messages"] / run["seconds"]
            metrics[f"{name}/{transport}/{size}"] = msgs_per_s
            cpu = run["subscriber_cpu_seconds"] / run["seconds"]
            metrics[f"subscriber_cpu_share/{mode}/{transport}/{size}"] = cpu
            if "publisher_seconds" in run:  # absent when the subscriber stopped at its deadline
                share = run["publisher_cpu_seconds"] / run["publisher_seconds"]
                metrics[f"publisher_cpu_share/{mode}/{transport}/{size}"] = share
    if "shm" in transports:
        # Paced like the other latency rows (1 ms), and at a camera's pace (10 ms: both
        # processes sit idle longer, and lose more of their caches to everything else).
        for mode, frame_period, name in (
            ("loan-latency", _PERIOD, "loan_latency"),
            ("loan-latency", _FRAME_PERIOD, "loan_latency_10ms"),
            ("latency", _FRAME_PERIOD, "latency_10ms"),
        ):
            run = await ezflow_run("shm", mode, _FRAME, frame_period)
            latency(f"{name}_{{pct}}_us/shm/{_FRAME}", run.pop("latency_ns"))
    return {"metrics": metrics, "details": details}


async def _bench(plan: Plan, options: argparse.Namespace) -> list[dict[str, Any]]:
    """Host the graph server and run every repeat."""
    main_task = asyncio.current_task()
    assert main_task is not None
    # SIGTERM gets the same clean-up as Ctrl-C: cancel, so every ``finally`` runs.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    runs = []
    async with contextlib.AsyncExitStack() as stack:
        ctx = await stack.enter_async_context(ezflow.GraphContext(("127.0.0.1", 0)))
        host, port = ctx.address
        graph = f"{host}:{port}"
        ezmsg_graph = None
        if options.ezmsg is not None:
            ezmsg_graph = await stack.enter_async_context(_ezmsg_server(options.ezmsg))
        for index in range(options.repeats):
            _log(f"[bold]repeat {index + 1}/{options.repeats}[/]")
            tag = f"r{index + 1}"
            if options.crossover:
                runs.append(await _crossover(graph, plan, options, tag))
            else:
                runs.append(await _repeat(graph, ezmsg_graph, plan, options, tag))
    return runs


#: Message sizes of the crossover sweep, and the two inline limits compared there.
_CROSSOVER_SIZES = tuple(1 << k for k in range(12, 21))  # 4 KiB .. 1 MiB
_ALL_INLINE = 1 << 40
_NONE_INLINE = 0


async def _crossover(
    graph: str, plan: Plan, options: argparse.Namespace, tag: str
) -> dict[str, Any]:
    """Each crossover size over shm with every message inline, then with every message
    through shared memory: back-to-back msgs/s and paced one-way p50."""
    metrics: dict[str, float] = {}
    for size in _CROSSOVER_SIZES:
        for path, limit in (("inline", _ALL_INLINE), ("zero_copy", _NONE_INLINE)):
            _log(f"  crossover: {path} {size} B")
            run = await _ezflow_run(
                graph, "shm", "throughput", size, plan=plan, options=options, tag=tag,
                inline_limit=limit,
            )  # fmt: skip
            metrics[f"crossover_msgs_per_s/{path}/{size}"] = run["messages"] / run["seconds"]
            run = await _ezflow_run(
                graph, "shm", "latency", size, plan=plan, options=options, tag=tag,
                inline_limit=limit,
            )  # fmt: skip
            p50, _ = _percentiles_us(run["latency_ns"])
            metrics[f"crossover_latency_p50_us/{path}/{size}"] = p50
    return {"metrics": metrics, "details": {}}


def _crossover_table(medians: dict[str, float], options: argparse.Namespace) -> Table:
    table = Table(
        title=f"shm: inline vs zero-copy by message size ({options.loop}, median of "
        f"{options.repeats})",
        caption="inline: the message bytes go through the Unix socket (copied in and out); "
        "zero-copy: written once into shared memory, received as a view, released by FREE. "
        "The smallest size from which zero-copy wins both is the inline_limit to use.",
    )
    for column in ("size", "inline msgs/s", "zero-copy msgs/s", "inline p50", "zero-copy p50"):
        table.add_column(column, justify="right")
    for size in _CROSSOVER_SIZES:
        cells = [f"{size // 1024} KiB"]
        for metric, fmt in (
            ("crossover_msgs_per_s", _fmt_rate),
            ("crossover_latency_p50_us", _fmt_us),
        ):
            for path in ("inline", "zero_copy"):
                cells.append(fmt(medians[f"{metric}/{path}/{size}"]))
        table.add_row(*cells)
    return table


@contextlib.asynccontextmanager
async def _ezmsg_server(python: str) -> AsyncIterator[str]:
    """An ezmsg graph server in a child process (under *python*); yields its address."""
    process = await asyncio.create_subprocess_exec(
        python, _PEER, "server", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    _LIVE.add(process.pid)
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), _GRACE)
        if not line:
            raise RuntimeError(f"the ezmsg graph server under {python} did not start")
        yield str(json.loads(line)["address"])
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 5)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
        _LIVE.discard(process.pid)


# -- report -----------------------------------------------------------------------------


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median over the repeats of every metric (of those that measured it)."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for key, value in run["metrics"].items():
            values.setdefault(key, []).append(value)
    return {key: float(np.median(found)) for key, found in values.items()}


def _fmt_us(value: float) -> str:
    return f"{value:,.1f} µs"


def _fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def _fmt_mb(value: float) -> str:
    return f"{value:,.1f}"


@dataclass(frozen=True, slots=True)
class _Row:
    """One line of the table: metric keys (without the ``/transport/size`` suffix)."""

    metric: str
    size: int
    transport: str  # "" for a raw-floor line
    fmt: Callable[[float], str]
    ezflow: str | None  # None: a floor-only line
    floor: str | None  # None: no floor to compare with
    floor_scale: float = 1.0  # 0.5 turns a round trip into a one-way floor


def _rows(transports: tuple[str, ...]) -> list[_Row]:
    """The lines of the table, in order."""
    rows = []
    for size in _SIZES:
        for transport in transports:
            paced = f"floor_{_SOCKET[transport]}_paced"
            for name, key in (("recv", "latency"), ("on_message", "callback_latency")):
                for pct in ("p50", "p99"):
                    rows.append(
                        _Row(
                            f"one-way latency {pct}, {name}",
                            size,
                            transport,
                            _fmt_us,
                            f"{key}_{pct}_us",
                            f"{paced}_{pct}_us",
                        )
                    )
    for size in _SIZES:
        for transport in transports:
            sock = _SOCKET[transport]
            rows.append(
                _Row(
                    "back-to-back msgs/s",
                    size,
                    transport,
                    _fmt_rate,
                    "msgs_per_s",
                    f"floor_{sock}_msgs_per_s",
                )
            )
            if transport == "shm":
                rows.append(
                    _Row(
                        "back-to-back msgs/s, loaned",
                        size,
                        transport,
                        _fmt_rate,
                        "loan_msgs_per_s",
                        f"floor_{sock}_msgs_per_s",
                    )
                )
    if "shm" in transports:
        for name, key in (
            ("frame one-way, loaned, 1 ms pacing", "loan_latency"),
            ("frame one-way, loaned, 10 ms pacing", "loan_latency_10ms"),
            ("frame one-way, copied, 10 ms pacing", "latency_10ms"),
        ):
            for pct in ("p50", "p99"):
                rows.append(_Row(f"{name} {pct}", _FRAME, "shm", _fmt_us, f"{key}_{pct}_us", None))
    for size in _SIZES:
        for pct in ("p50", "p99"):
            rows.append(
                _Row(
                    f"raw one-way {pct}: socketpair RTT/2",
                    size,
                    "",
                    _fmt_us,
                    None,
                    f"floor_socketpair_rtt_{pct}_us",
                    0.5,
                )
            )
        rows.append(
            _Row("raw one-way p50: tcp RTT/2", size, "", _fmt_us, None, "floor_tcp_rtt_p50_us", 0.5)
        )
    return rows


def _table(medians: dict[str, float], options: argparse.Namespace) -> Table:
    """The results table: ezflow, floor, ratio, reference per metric."""
    repeats = f"median of {options.repeats} repeat{'s' if options.repeats > 1 else ''}"
    if options.no_handoff:
        repeats += ", shm handoff off"
    table = Table(
        title=f"ezflow: 1 publisher -> 1 subscriber, two processes ({options.loop}, {repeats})",
        caption="floor: raw sockets between two Python processes, same run: latency = a "
        "timestamped message every 1 ms over the same kind of socket (Unix for shm, TCP "
        "loopback for tcp); throughput = one transport.write per message. ratio = "
        "ezflow/floor (latency: lower is better, 1.00x = at the floor; throughput: higher "
        "is better). 'loaned': Publisher.loan, filled in place, published with no copy. "
        "ezmsg: the same runs on ezmsg 3.9.0, back to back with ezflow's; x ezmsg = how many "
        "times better ezflow is (ezmsg latency / ezflow latency, ezflow msgs/s / ezmsg msgs/s).",
    )
    table.add_column("metric", no_wrap=True)
    for column in ("size", "transport", "ezflow", "floor", "ratio", "ezmsg", "x ezmsg"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("ezmsg 3.9.0 reference\n(DESIGN.md)", justify="right", style="dim")
    for row in _rows(options.transports):
        suffix = f"/{row.transport}/{row.size}" if row.transport else f"/{row.size}"
        floor = None
        if row.floor is not None:
            floor = medians.get(f"{row.floor}/{row.size}")
            floor = None if floor is None else floor * row.floor_scale
        ezflow_text = ratio_text = peer_text = better_text = ""
        if row.ezflow is not None:
            value = medians.get(f"{row.ezflow}{suffix}")
            if value is None:
                continue
            ezflow_text = row.fmt(value)
            ratio_text = f"{value / floor:.2f}x" if floor else ""
            peer = medians.get(f"ezmsg_{row.ezflow}{suffix}")
            if peer is not None and value:
                peer_text = row.fmt(peer)
                better = peer / value if row.fmt is _fmt_us else value / peer
                better_text = f"{better:.1f}x"
        reference = REFERENCE.get((f"{row.ezflow}/{row.transport}", row.size))
        if row.ezflow is None:
            reference = REFERENCE.get((row.floor or "", row.size))
            reference = None if reference is None else reference * row.floor_scale
        table.add_row(
            row.metric,
            _size_label(row.size),
            row.transport,
            ezflow_text,
            "" if floor is None else row.fmt(floor),
            ratio_text,
            peer_text,
            better_text,
            "" if reference is None else row.fmt(reference),
        )
    return table


def _diagnosis(sub_cpu: float, pub_cpu: float | None) -> str:
    """What the CPU shares of a back-to-back run say about its bottleneck."""
    if sub_cpu >= 0.9:
        return "subscriber-bound"
    if pub_cpu is None:
        return "subscriber not saturated"
    if pub_cpu >= 0.9:
        return "publisher-bound"
    if sub_cpu + pub_cpu > 1.2:
        return "neither saturated, but they overlap"
    if sub_cpu + pub_cpu >= 0.8:
        return "neither saturated, together ~one core: they take turns instead of overlapping"
    return "neither saturated: waiting on the wire or on wake-ups"


def _bars(medians: dict[str, float]) -> list[dict[str, Any]]:
    """The bars of the issues that these figures can check: what, measured, limit."""
    bars: list[dict[str, Any]] = []

    def bar(name: str, key: str, limit: float, *, at_most: bool = False) -> None:
        value = medians.get(key)
        if value is not None:
            passed = value <= limit if at_most else value >= limit
            bars.append({"bar": name, "value": value, "limit": limit, "pass": passed})

    # The raw one-way floor as DESIGN.md defines it: a socketpair round trip / 2 between
    # two processes, measured in this run; and the stricter paced floor (a message every
    # 1 ms over a Unix socket, like the latency runs). The floor's receiver takes the
    # time in its read callback, as an on_message subscriber does; recv adds a task
    # wake-up, so it is shown against both floors too.
    rtt = medians.get(f"floor_socketpair_rtt_p50_us/{_SMALL}")
    paced = medians.get(f"floor_unix_paced_p50_us/{_SMALL}")
    for name, key in (("on_message", "callback_latency"), ("recv", "latency")):
        if rtt is not None:
            bar(
                f"shm 64 B one-way p50, {name} <= 2x raw one-way floor "
                "(DESIGN.md: socketpair RTT/2) [us]",
                f"{key}_p50_us/shm/{_SMALL}",
                rtt,  # 2 x RTT/2
                at_most=True,
            )
        if paced is not None:
            bar(
                f"shm 64 B one-way p50, {name} <= 2x paced raw one-way (Unix socket, 1 ms "
                "pacing; stricter) [us]",
                f"{key}_p50_us/shm/{_SMALL}",
                2 * paced,
                at_most=True,
            )
    # ezmsg measured in this run when it was, else the reference figures of DESIGN.md.
    small = medians.get(f"ezmsg_msgs_per_s/shm/{_SMALL}", REFERENCE[("msgs_per_s/shm", _SMALL)])
    large = medians.get(f"ezmsg_msgs_per_s/shm/{_LARGE}", REFERENCE[("msgs_per_s/shm", _LARGE)])
    bar("shm 64 B back-to-back >= 5x ezmsg [msgs/s]", f"msgs_per_s/shm/{_SMALL}", 5 * small)
    bar("shm 1 MiB back-to-back >= 2x ezmsg [msgs/s]", f"msgs_per_s/shm/{_LARGE}", 2 * large)
    bar(
        "shm 1 MiB back-to-back, loaned >= 2x ezmsg [msgs/s]",
        f"loan_msgs_per_s/shm/{_LARGE}",
        2 * large,
    )
    bar(
        "loaned 24.9 MB frame one-way p50 (1 ms pacing) < 200 us [us]",
        f"loan_latency_p50_us/shm/{_FRAME}",
        200.0,
        at_most=True,
    )
    bar("tcp 64 B back-to-back >= 100k [msgs/s]", f"msgs_per_s/tcp/{_SMALL}", 100_000.0)
    bar("tcp 1 MiB back-to-back >= 1.5k [msgs/s]", f"msgs_per_s/tcp/{_LARGE}", 1_500.0)
    return bars


def _git_revision() -> str | None:
    """The checked-out commit, or None outside a git checkout (or without commits)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(_SCRIPT).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _environment(options: argparse.Namespace) -> dict[str, Any]:
    """What the figures depend on, for the JSON results."""
    return {
        "python": sys.version,
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        **{name: importlib.metadata.version(name) for name in ("numpy", "uvloop", "msgpack")},
        "ezflow": ezflow.__version__,
        "event_loop": options.loop,
        "git_revision": _git_revision(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _write_json(
    path: Path,
    runs: list[dict[str, Any]],
    medians: dict[str, float],
    *,
    plan: Plan,
    options: argparse.Namespace,
) -> None:
    """Write every result, the plan and the environment to *path*."""
    document = {
        "environment": _environment(options),
        "options": {
            "quick": options.quick,
            "repeats": options.repeats,
            "transports": list(options.transports),
            "ezmsg_python": options.ezmsg,
            "loop": options.loop,
            "max_in_flight": options.max_in_flight,
            "max_in_flight_bytes": options.max_in_flight_bytes,
            "shm_handoff": not options.no_handoff,
            "profiled": options.profile is not None,
        },
        "plan": {
            name: {str(k): v for k, v in value.items()} if isinstance(value, dict) else value
            for name, value in dataclasses.asdict(plan).items()
        },
        "medians": medians,
        "bars": _bars(medians),
        "reference_ezmsg_3_9_0": {
            f"{name}/{size}": value for (name, size), value in REFERENCE.items()
        },
        "runs": runs,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line (the benchmark's, or a child's with ``child``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, 1 repeat (< 60 s)")
    parser.add_argument("--repeats", type=int, help="repeats of every measurement (default 3)")
    parser.add_argument("--loop", choices=LOOPS, default="uvloop", help="event loop everywhere")
    ezmsg = parser.add_mutually_exclusive_group()
    ezmsg.add_argument(
        "--ezmsg",
        metavar="PYTHON",
        help="an interpreter with ezmsg 3.9.0 and ezflow installed: measure ezmsg too "
        "(default: this interpreter, if it has ezmsg)",
    )
    ezmsg.add_argument("--no-ezmsg", action="store_true", help="do not measure ezmsg")
    parser.add_argument(
        "--crossover",
        action="store_true",
        help="instead: measure shm inline vs zero-copy across sizes (the inline_limit)",
    )
    parser.add_argument(
        "--transports",
        default=",".join(_TRANSPORTS),
        help="comma-separated transports to measure (default: shm,tcp)",
    )
    parser.add_argument("--json", type=Path, help="write results and environment here")
    parser.add_argument(
        "--profile", type=Path, help="run the children under cProfile, writing DIR/*.prof"
    )
    parser.add_argument(
        "--max-in-flight", type=int, help="the publisher's max_in_flight (default: ezflow's)"
    )
    parser.add_argument(
        "--max-in-flight-bytes",
        type=int,
        help="the publisher's max_in_flight_bytes (default: ezflow's)",
    )
    parser.add_argument(
        "--no-handoff",
        action="store_true",
        help="publish with ShmOptions(handoff=False): no CPU yield after a paced message",
    )
    roles = parser.add_subparsers(dest="command")
    child = roles.add_parser("child", help="(internal) one child process")
    child.add_argument("role", choices=("pub", "sub"))
    child.add_argument("--graph", required=True)
    child.add_argument("--topic", required=True)
    child.add_argument("--transport", choices=_TRANSPORTS, required=True)
    child.add_argument("--period", type=float, required=True)
    child.add_argument(
        "--mode",
        choices=("latency", "callback-latency", "throughput", "loan-latency", "loan-throughput"),
        required=True,
    )
    child.add_argument("--size", type=int, required=True)
    child.add_argument("--count", type=int, required=True)
    child.add_argument("--warmup", type=int, required=True)
    child.add_argument("--seed", type=int, required=True)
    child.add_argument("--max-seconds", type=float, required=True)
    child.add_argument("--timeout", type=float, required=True)
    child.add_argument("--loop", choices=LOOPS, required=True)
    child.add_argument("--max-in-flight", type=int)
    child.add_argument("--max-in-flight-bytes", type=int)
    child.add_argument("--inline-limit", type=int)
    child.add_argument("--no-handoff", action="store_true")
    child.add_argument("--profile", help="write a cProfile dump here")
    options = parser.parse_args(argv)
    if options.command is None:
        if options.repeats is None:
            options.repeats = 1 if options.quick else 3
        if options.repeats < 1:
            parser.error("--repeats must be at least 1")
        transports = tuple(t.strip() for t in options.transports.split(",") if t.strip())
        unknown = [t for t in transports if t not in _TRANSPORTS]
        if unknown or not transports:
            parser.error(f"--transports: use a subset of {','.join(_TRANSPORTS)}")
        options.transports = transports
        if options.no_ezmsg:
            options.ezmsg = None
        elif options.ezmsg is None and importlib.util.find_spec("ezmsg") is not None:
            options.ezmsg = sys.executable
    return options


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark (or, with ``child``, one of its child processes)."""
    options = _parse(argv)
    if options.command == "child":
        _child_main(options)
        return
    plan = QUICK if options.quick else FULL
    if options.profile is not None:
        options.profile.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        runs = ezflow.run_coroutine(_bench(plan, options), loop=options.loop)
    except (KeyboardInterrupt, asyncio.CancelledError):
        _log("[red]interrupted[/]")
        sys.exit(130)
    finally:
        for pid in _LIVE:  # only if the event loop died before its own cleanup ran
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    medians = _medians(runs)
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 132)
    if options.crossover:
        console.print(_crossover_table(medians, options))
        if options.json is not None:
            _write_json(options.json, runs, medians, plan=plan, options=options)
        return
    console.print(_table(medians, options))
    for bar in _bars(medians):
        verdict = "[green]PASS[/]" if bar["pass"] else "[red]MISS[/]"
        console.print(f"bar: {bar['bar']}: {verdict} ({bar['value']:,.1f} vs {bar['limit']:,.1f})")
    for key, sub_cpu in sorted(medians.items()):
        if not key.startswith("subscriber_cpu_share/"):
            continue
        run = key.removeprefix("subscriber_cpu_share/")
        pub_cpu = medians.get(f"publisher_cpu_share/{run}")
        pub_text = "n/a" if pub_cpu is None else f"{pub_cpu:.0%}"
        console.print(
            f"[dim]{run}: subscriber CPU {sub_cpu:.0%}, publisher CPU {pub_text} of their "
            f"busy time: {_diagnosis(sub_cpu, pub_cpu)}[/]"
        )
    if options.profile is not None:
        console.print("[yellow]children ran under cProfile: figures are not representative[/]")
    console.print(f"[dim]{time.monotonic() - started:.0f} s[/]")
    if options.json is not None:
        _write_json(options.json, runs, medians, plan=plan, options=options)
        console.print(f"results written to {options.json}")


if __name__ == "__main__":
    main()
