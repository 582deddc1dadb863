"""TCP benchmark of ezflow: one publisher -> one subscriber, in two processes.

Everything is measured in one run, repeat after repeat, so that the ratios between
ezflow and the raw socket floor (:mod:`_floor`) are meaningful on a noisy machine:

* raw floor: a uvloop/asyncio-Protocol ping-pong between two processes over a
  ``socket.socketpair()`` (one-way floor = RTT / 2; the floor of the latency rows), the
  same over TCP loopback, a paced (1 ms) one-way send over TCP loopback, and the TCP
  loopback throughput with one ``transport.write`` per message;
* ezflow tcp one-way latency p50/p99, paced at one message every 1 ms: the publisher
  writes ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared by the processes of one
  host) into the first 8 bytes of a random payload and the subscriber subtracts it from
  its own clock on receipt;
* ezflow tcp back-to-back throughput: the publisher publishes as fast as lossless flow
  control lets it, the subscriber counts from the end of the warm-up to the last message
  (and reports its CPU time and page faults, the publisher its CPU time and waits).

The parent process hosts the graph server; the publisher and the subscriber are child
processes running this script (``child pub|sub``). Children never outlive the parent: they
are killed in ``finally``, the publisher also ends when its stdin (a pipe from the parent)
closes, and the subscriber gives up after a deadline.

Usage::

    python perf/bench_tcp.py [--quick] [--repeats N] [--loop uvloop|asyncio]
                             [--json PATH] [--profile DIR] [--max-in-flight N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
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
_SMALL = 64
_LARGE = 1 << 20
_SIZES = (_SMALL, _LARGE)
_PERIOD = 0.001  # latency pacing: one message every 1 ms
_STAMP = np.dtype(np.int64)
#: Extra time a child gets beyond its expected run time before it counts as hung.
_GRACE = 60.0

#: ezmsg 3.9.0 on this machine, from DESIGN.md ("Performance, as users will measure it").
REFERENCE = {
    ("latency_p50_us", _SMALL): 293.0,
    ("latency_p50_us", _LARGE): 863.0,
    ("msgs_per_s", _SMALL): 15_000.0,
    ("msgs_per_s", _LARGE): 560.0,
    ("floor_socketpair_rtt_p50_us", _SMALL): 66.0,
}
#: The bar from the issue: tcp back-to-back msgs/s.
BARS = {_SMALL: 100_000.0, _LARGE: 1_500.0}


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
    max_seconds: float


FULL = Plan(
    floor_round_trips={_SMALL: 2000, _LARGE: 300},
    floor_warmup={_SMALL: 200, _LARGE: 30},
    floor_stream_count={_SMALL: 300_000, _LARGE: 3000},
    latency_samples={_SMALL: 1000, _LARGE: 300},
    latency_warmup={_SMALL: 200, _LARGE: 50},
    throughput_count={_SMALL: 200_000, _LARGE: 3000},
    throughput_warmup={_SMALL: 2000, _LARGE: 100},
    max_seconds=3.0,
)
QUICK = Plan(
    floor_round_trips={_SMALL: 500, _LARGE: 100},
    floor_warmup={_SMALL: 100, _LARGE: 20},
    floor_stream_count={_SMALL: 100_000, _LARGE: 1000},
    latency_samples={_SMALL: 300, _LARGE: 100},
    latency_warmup={_SMALL: 50, _LARGE: 20},
    throughput_count={_SMALL: 50_000, _LARGE: 600},
    throughput_warmup={_SMALL: 1000, _LARGE: 30},
    max_seconds=1.5,
)


def _size_label(size: int) -> str:
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


async def _publish(pub: ezflow.Publisher, args: argparse.Namespace) -> dict[str, float]:
    """Publish every message; return the wall and CPU seconds spent doing so."""
    payload = _payload(args.seed, args.size)
    await pub.wait_for_channels(1)
    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(args.warmup + args.count):
        if args.mode == "throughput":
            # The same array every time: never modified, so it may still be in flight.
            await pub.publish(payload)
        else:
            message = payload.copy()  # a fresh array: tcp may still reference the last one
            message[:8].view(_STAMP)[0] = time.perf_counter_ns()
            await pub.publish(message)
            await asyncio.sleep(_PERIOD)
    return {
        "publisher_seconds": time.perf_counter() - started,
        "publisher_cpu_seconds": time.process_time() - cpu_started,
    }


async def _publisher_child(args: argparse.Namespace) -> dict[str, Any]:
    """Publish until done, then hold the connection until the parent releases us by
    closing our stdin (leaving the context earlier could cut off what is still in
    flight); stop publishing early if released before."""
    options = {} if args.max_in_flight is None else {"max_in_flight": args.max_in_flight}
    released = asyncio.ensure_future(_stdin_closed())
    try:
        async with ezflow.GraphContext(args.graph, auto_start=False) as ctx:
            pub = await ctx.publisher(args.topic, transport="tcp", **options)
            result: dict[str, Any] = {}
            timing = await _unless(_publish(pub, args), released)
            if timing is not None:
                result.update(timing)
                await released
            result["publisher_stats"] = dataclasses.asdict(pub.stats)
            return result
    finally:
        released.cancel()


def _check_message(message: Any, expected: np.ndarray[Any, Any]) -> None:
    """Raise AssertionError unless *message* is the payload (bar its timestamp)."""
    if not isinstance(message, np.ndarray) or message.shape != expected.shape:
        raise AssertionError(f"unexpected message {type(message).__name__}")
    if not np.array_equal(message[8:], expected[8:]):
        raise AssertionError("payload corrupted in transit")


async def _receive_latency(
    sub: ezflow.Subscriber, args: argparse.Namespace, expected: np.ndarray[Any, Any]
) -> dict[str, Any]:
    """Record the one-way latency of every message after the warm-up."""
    latencies: list[int] = []
    for index in range(args.warmup + args.count):
        message = await sub.recv()
        now = time.perf_counter_ns()
        if index >= args.warmup:
            latencies.append(now - int(message[:8].view(_STAMP)[0]))
        _check_message(message, expected)  # after taking the time
    return {"latency_ns": latencies}


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
    _check_message(message, expected)
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
            sub = await ctx.subscriber(args.topic, transport="tcp")
            expected = _payload(args.seed, args.size)
            receive = _receive_latency if args.mode == "latency" else _receive_throughput
            work = asyncio.wait_for(receive(sub, args, expected), args.timeout)
            result = await _unless(work, parent_gone)
            if result is None:
                raise RuntimeError("the parent process went away")
            result["subscriber_stats"] = dataclasses.asdict(sub.stats)
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
    async def start(cls, name: str, args: list[str]) -> _Child:
        """Start ``this script child ARGS``. Its stdin is a pipe from this process: the
        child ends when it closes (:meth:`release`, or this process dying)."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            _SCRIPT,
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
    graph: str, mode: str, size: int, *, plan: Plan, options: argparse.Namespace, tag: str
) -> dict[str, Any]:
    """One publisher child and one subscriber child streaming one topic."""
    if mode == "latency":
        count, warmup = plan.latency_samples[size], plan.latency_warmup[size]
        expected_s = (count + warmup) * _PERIOD * 3
    else:
        count, warmup = plan.throughput_count[size], plan.throughput_warmup[size]
        expected_s = plan.max_seconds * 2
    common = [
        "--graph", graph,
        "--topic", f"/bench/{mode}/{size}/{uuid.uuid4().hex[:8]}",
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
                extra += ["--profile", str(options.profile / f"{role}-{mode}-{size}-{tag}.prof")]
            if options.max_in_flight is not None:
                extra += ["--max-in-flight", str(options.max_in_flight)]
            child = await _Child.start(role, [role, *common, *extra])
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
        return received
    finally:
        for child in children:
            await child.kill()


async def _repeat(graph: str, plan: Plan, options: argparse.Namespace, tag: str) -> dict[str, Any]:
    """One repeat of every measurement: metric values plus raw details."""
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {}
    loop = options.loop
    for size in _SIZES:
        label = _size_label(size)
        trips, warmup = plan.floor_round_trips[size], plan.floor_warmup[size]
        for over in ("socketpair", "tcp"):
            _log(f"  floor: {over} ping-pong {label}")
            rtt = await pingpong_rtt(size, trips, warmup, over=over, loop=loop)
            p50, p99 = _percentiles_us(rtt)
            metrics[f"floor_{over}_rtt_p50_us/{size}"] = p50
            metrics[f"floor_{over}_rtt_p99_us/{size}"] = p99
        _log(f"  floor: tcp one-way, 1 ms pacing {label}")
        one_way = await paced_one_way(
            size, plan.latency_samples[size], plan.latency_warmup[size], period=_PERIOD, loop=loop
        )
        p50, p99 = _percentiles_us(one_way)
        metrics[f"floor_paced_p50_us/{size}"] = p50
        metrics[f"floor_paced_p99_us/{size}"] = p99
        _log(f"  ezflow: tcp latency {label}")
        run = await _ezflow_run(graph, "latency", size, plan=plan, options=options, tag=tag)
        p50, p99 = _percentiles_us(run.pop("latency_ns"))
        metrics[f"latency_p50_us/{size}"] = p50
        metrics[f"latency_p99_us/{size}"] = p99
        details[f"latency/{size}"] = run
    for size in _SIZES:
        label = _size_label(size)
        _log(f"  floor: tcp stream {label}")
        rate = await stream_rate(
            size, plan.floor_stream_count[size], max_seconds=plan.max_seconds, loop=loop
        )
        metrics[f"floor_msgs_per_s/{size}"] = rate.msgs_per_s
        metrics[f"floor_mb_per_s/{size}"] = rate.mb_per_s
        _log(f"  ezflow: tcp back-to-back {label}")
        run = await _ezflow_run(graph, "throughput", size, plan=plan, options=options, tag=tag)
        msgs_per_s = run["messages"] / run["seconds"]
        metrics[f"msgs_per_s/{size}"] = msgs_per_s
        metrics[f"mb_per_s/{size}"] = msgs_per_s * size / 1e6
        metrics[f"subscriber_cpu_share/{size}"] = run["subscriber_cpu_seconds"] / run["seconds"]
        if "publisher_seconds" in run:  # absent when the subscriber stopped at its deadline
            share = run["publisher_cpu_seconds"] / run["publisher_seconds"]
            metrics[f"publisher_cpu_share/{size}"] = share
        details[f"throughput/{size}"] = run
    return {"metrics": metrics, "details": details}


async def _bench(plan: Plan, options: argparse.Namespace) -> list[dict[str, Any]]:
    """Host the graph server and run every repeat."""
    main_task = asyncio.current_task()
    assert main_task is not None
    # SIGTERM gets the same clean-up as Ctrl-C: cancel, so every ``finally`` runs.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    runs = []
    async with ezflow.GraphContext(("127.0.0.1", 0)) as ctx:
        host, port = ctx.address
        graph = f"{host}:{port}"
        for index in range(options.repeats):
            _log(f"[bold]repeat {index + 1}/{options.repeats}[/]")
            runs.append(await _repeat(graph, plan, options, f"r{index + 1}"))
    return runs


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
    """One line of the table: metric keys (without the ``/size`` suffix)."""

    metric: str
    size: int
    fmt: Callable[[float], str]
    ezflow: str | None  # None: a floor-only line
    floor: str
    floor_scale: float = 1.0  # 0.5 turns a round trip into a one-way floor


def _rows() -> list[_Row]:
    """The lines of the table, in order."""
    rows = []
    for size in _SIZES:
        for pct in ("p50", "p99"):
            latency = f"latency_{pct}_us"
            floor = f"floor_socketpair_rtt_{pct}_us"
            rows.append(_Row(f"one-way latency {pct}", size, _fmt_us, latency, floor, 0.5))
    for size in _SIZES:
        rows.append(_Row("back-to-back msgs/s", size, _fmt_rate, "msgs_per_s", "floor_msgs_per_s"))
        rows.append(_Row("back-to-back MB/s", size, _fmt_mb, "mb_per_s", "floor_mb_per_s"))
    for size in _SIZES:
        for name, floor in (
            ("raw RTT p50, socketpair", "floor_socketpair_rtt_p50_us"),
            ("raw RTT p50, tcp loopback", "floor_tcp_rtt_p50_us"),
            ("raw one-way p50, tcp, 1 ms pacing", "floor_paced_p50_us"),
            ("raw one-way p99, tcp, 1 ms pacing", "floor_paced_p99_us"),
        ):
            rows.append(_Row(name, size, _fmt_us, None, floor))
    return rows


def _table(medians: dict[str, float], options: argparse.Namespace) -> Table:
    """The results table: ezflow, floor, ratio, reference and bar per metric."""
    repeats = f"median of {options.repeats} repeat{'s' if options.repeats > 1 else ''}"
    table = Table(
        title=f"ezflow tcp: 1 publisher -> 1 subscriber, two processes ({options.loop}, {repeats})",
        caption="floor: latency = socketpair ping-pong RTT/2 of the same size; throughput = TCP "
        "loopback, one transport.write per message. ratio = ezflow/floor (latency: lower is "
        "better, 1.00x = at the floor; throughput: higher is better). Rows without an ezflow "
        "figure are raw floors only; 'raw one-way, 1 ms pacing' is paced like the ezflow "
        "latency rows (both processes idle between messages).",
    )
    table.add_column("metric", no_wrap=True)
    for column in ("size", "ezflow", "floor", "ratio"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("ezmsg 3.9.0 reference\n(DESIGN.md)", justify="right", style="dim")
    table.add_column("bar (issue)", justify="right", no_wrap=True)
    for row in _rows():
        floor = medians[f"{row.floor}/{row.size}"] * row.floor_scale
        ezflow_text = ratio_text = bar_text = ""
        if row.ezflow is not None:
            value = medians[f"{row.ezflow}/{row.size}"]
            ezflow_text = row.fmt(value)
            ratio_text = f"{value / floor:.2f}x" if floor else "-"
            bar = BARS.get(row.size) if row.ezflow == "msgs_per_s" else None
            if bar is not None:
                verdict = "[green]PASS[/]" if value >= bar else "[red]MISS[/]"
                bar_text = f">= {bar:,.0f} {verdict}"
        reference = REFERENCE.get((row.ezflow or row.floor, row.size))
        table.add_row(
            row.metric,
            _size_label(row.size),
            ezflow_text,
            row.fmt(floor),
            ratio_text,
            "" if reference is None else row.fmt(reference),
            bar_text,
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


def _bars(medians: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Each bar of the issue, the measured figure and whether it passes."""
    return {
        _size_label(size): {
            "msgs_per_s": medians[f"msgs_per_s/{size}"],
            "bar": bar,
            "pass": medians[f"msgs_per_s/{size}"] >= bar,
        }
        for size, bar in BARS.items()
    }


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
            "loop": options.loop,
            "max_in_flight": options.max_in_flight,
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
    parser.add_argument("--json", type=Path, help="write results and environment here")
    parser.add_argument(
        "--profile", type=Path, help="run the children under cProfile, writing DIR/*.prof"
    )
    parser.add_argument(
        "--max-in-flight", type=int, help="the publisher's max_in_flight (default: ezflow's)"
    )
    roles = parser.add_subparsers(dest="command")
    child = roles.add_parser("child", help="(internal) one child process")
    child.add_argument("role", choices=("pub", "sub"))
    child.add_argument("--graph", required=True)
    child.add_argument("--topic", required=True)
    child.add_argument("--mode", choices=("latency", "throughput"), required=True)
    child.add_argument("--size", type=int, required=True)
    child.add_argument("--count", type=int, required=True)
    child.add_argument("--warmup", type=int, required=True)
    child.add_argument("--seed", type=int, required=True)
    child.add_argument("--max-seconds", type=float, required=True)
    child.add_argument("--timeout", type=float, required=True)
    child.add_argument("--loop", choices=LOOPS, required=True)
    child.add_argument("--max-in-flight", type=int)
    child.add_argument("--profile", help="write a cProfile dump here")
    options = parser.parse_args(argv)
    if options.command is None:
        if options.repeats is None:
            options.repeats = 1 if options.quick else 3
        if options.repeats < 1:
            parser.error("--repeats must be at least 1")
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
    console.print(_table(medians, options))
    for label, bar in _bars(medians).items():
        verdict = "[green]PASS[/]" if bar["pass"] else "[red]MISS[/]"
        console.print(
            f"bar: tcp back-to-back {label} >= {bar['bar']:,.0f} msgs/s: {verdict} "
            f"({bar['msgs_per_s']:,.0f} msgs/s)"
        )
    for size in _SIZES:
        sub_cpu = medians[f"subscriber_cpu_share/{size}"]
        pub_cpu = medians.get(f"publisher_cpu_share/{size}")
        pub_text = "n/a" if pub_cpu is None else f"{pub_cpu:.0%}"
        console.print(
            f"[dim]back-to-back {_size_label(size)}: subscriber CPU {sub_cpu:.0%}, publisher "
            f"CPU {pub_text} of their busy time: {_diagnosis(sub_cpu, pub_cpu)}[/]"
        )
    if options.profile is not None:
        console.print("[yellow]children ran under cProfile: figures are not representative[/]")
    console.print(f"[dim]{time.monotonic() - started:.0f} s[/]")
    if options.json is not None:
        _write_json(options.json, runs, medians, plan=plan, options=options)
        console.print(f"results written to {options.json}")


if __name__ == "__main__":
    main()
