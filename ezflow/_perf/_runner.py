"""Run the cells of a perf run in real processes and aggregate what their sinks saw.

For every framework (ezflow, then each peer) the runner starts one graph-server worker
for the whole run, then, round by round (``Plan.repeats`` rounds) and cell by cell, the
units workers of the cell's layout (:func:`._spec.layout`), the frameworks of a cell
back to back, so that their figures are measured under the same conditions and the
machine's drift over the run falls on every cell alike. A cell's figures are the
medians of its rounds; the rounds are kept (``repeats``), and their spread is shown
next to every figure (:mod:`._noise`).

A worker that crashes (exits with a non-zero status, hangs, or sends figures the
runner rejects: any :class:`WorkerError`) makes the runner start that repeat of the
cell again, up to :data:`CRASH_RETRIES` times; every crash is counted in the cell's
record (``crashes``, ``crash_reasons``) and shown in the tables, never hidden. A
worker that exits with a non-zero status *after* its figures (or must be killed)
counts as a crash too, but its figures are kept. Variant cells of the p2p suite run on
ezflow only (peers run the ordinary program).

Every worker is started in its own session (a Ctrl-C in the terminal reaches only the
runner), with its stdin a pipe from the runner: closing it makes the worker leave, and
:meth:`Worker.close` kills whatever has not left within a few seconds. All of that
happens in ``finally`` blocks, so an error, a Ctrl-C (the main task is cancelled) or a
SIGTERM ends every worker; a runner killed outright closes the pipes by dying, and the
workers leave on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._transports._shm import sweep_shm_dir
from . import _environment, _floor, _leftovers
from ._schema import SCHEMA_ID
from ._spec import Cell, Plan, latency_count, layout, suite_pacing

__all__ = [
    "CRASH_RETRIES",
    "EZFLOW_WORKER",
    "CellRecord",
    "FrameworkInfo",
    "WorkerError",
    "run",
]

#: How the runner starts an ezflow worker.
EZFLOW_WORKER = (sys.executable, "-m", "ezflow._perf._worker")
#: Seconds a worker may take to start and register (imports, graph round trips).
SETUP_TIMEOUT = 60.0
#: Seconds beyond its expected run time before a cell counts as hung.
GRACE = 30.0
#: Bytes of a worker's stderr kept for error messages.
STDERR_TAIL = 64 * 1024
#: Times a repeat of a cell is started again after a crash (so at most 1 + this many
#: attempts per repeat); each crash is counted in the results.
CRASH_RETRIES = 2
#: Crash reasons kept per cell (the count is always exact).
MAX_CRASH_REASONS = 5


class WorkerError(RuntimeError):
    """A worker failed, hung or went away; the message says which and why (one line)."""


class Worker:
    """One child process speaking the :mod:`._worker` protocol."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process
        self._stderr = bytearray()
        self._drain = asyncio.ensure_future(self._read_stderr())
        #: Whether :meth:`close` had to kill the process (it did not leave in time).
        self.killed = False

    @classmethod
    async def start(cls, name: str, command: Sequence[str]) -> Worker:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                env=env,
            )
        except OSError as exc:
            raise WorkerError(
                f"cannot start {name} ({command[0]}): {exc.strerror or exc}"
            ) from None
        return cls(name, process)

    async def _read_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        while chunk := await stream.read(65536):
            self._stderr += chunk
            del self._stderr[:-STDERR_TAIL]

    def why(self) -> str:
        """The last meaningful stderr line of the worker, for error messages."""
        lines = [line.strip() for line in self._stderr.decode(errors="replace").splitlines()]
        lines = [line for line in lines if line]
        return lines[-1] if lines else "no output on stderr"

    async def event(self, names: set[str], timeout: float) -> dict[str, Any]:
        """The next stdout event whose name is in *names* (others are skipped)."""
        try:
            return await asyncio.wait_for(self._event(names), timeout)
        except asyncio.TimeoutError:
            raise WorkerError(
                f"{self.name} hung (no {'/'.join(sorted(names))} within {timeout:.0f} s)"
            ) from None

    async def _event(self, names: set[str]) -> dict[str, Any]:
        stdout = self.process.stdout
        assert stdout is not None
        while True:
            line = await stdout.readline()
            if not line:
                code = await self.process.wait()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._drain), 2.0)
                raise WorkerError(f"{self.name} exited with status {code}: {self.why()}")
            if not line.startswith(b"{"):
                continue  # stray output (a library printing): not part of the protocol
            event: dict[str, Any] = json.loads(line)
            if event.get("event") in names:
                return event

    def send(self, command: str) -> None:
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.write(command.encode() + b"\n")

    async def close(self, timeout: float = 5.0) -> None:
        """Close stdin (the cue to leave), wait up to *timeout*, then kill; reap."""
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.process.wait()), timeout)
        finally:
            killed = self.process.returncode is None
            self.killed = self.killed or killed
            if killed:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
            await self.process.wait()
            if killed:
                # A killed worker cannot remove its shared memory: do it for it.
                sweep_shm_dir()
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._drain, 2.0)


@dataclass(slots=True)
class FrameworkInfo:
    """One framework of the run and its graph-server worker."""

    command: tuple[str, ...]
    name: str = ""
    version: str = ""
    event_loop: str = "asyncio"
    graph: Worker | None = None
    address: tuple[str, int] = ("127.0.0.1", 0)
    #: Globs of /dev/shm files its workers may leave behind (:mod:`._leftovers`).
    leftovers: tuple[str, ...] = ()

    async def start(self) -> None:
        info = await Worker.start("framework info", [*self.command, "info"])
        try:
            event = await info.event({"info"}, SETUP_TIMEOUT)
        finally:
            await info.close()
        self.name, self.version, self.event_loop = (
            event["framework"],
            event["version"],
            event["loop"],
        )
        self.leftovers = tuple(str(glob) for glob in event.get("leftovers", ()))
        self.graph = await Worker.start(f"{self.name} graph server", [*self.command, "graph"])
        ready = await self.graph.event({"ready"}, SETUP_TIMEOUT)
        self.address = (ready["address"][0], int(ready["address"][1]))

    async def aclose(self) -> None:
        if self.graph is not None:
            await self.graph.close()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "event_loop": self.event_loop}


@dataclass(slots=True)
class CellRecord:
    """The results of one framework in one cell, over the repeats so far."""

    framework: str
    cell: Cell
    status: str = "ok"
    reason: str | None = None
    processes: int = 0
    repeats: list[dict[str, Any]] = field(default_factory=list)
    #: The event loop the workers reported (None until a repeat has run).
    loop: str | None = None
    crashes: int = 0
    crash_reasons: list[str] = field(default_factory=list)
    #: Files the framework's workers left in /dev/shm, removed after a repeat (name,
    #: bytes), and those matching that were left (name, why) (:mod:`._leftovers`).
    swept: list[tuple[str, int]] = field(default_factory=list)
    unswept: list[tuple[str, str]] = field(default_factory=list)

    def crashed(self, reason: str) -> None:
        """Count one crash of a worker of this cell."""
        self.crashes += 1
        if len(self.crash_reasons) < MAX_CRASH_REASONS:
            self.crash_reasons.append(reason)

    @property
    def metrics(self) -> dict[str, Any] | None:
        """The median of every figure over the repeats (drops: the largest)."""
        if self.status != "ok" or not self.repeats:
            return None
        merged: dict[str, Any] = {}
        for key in self.repeats[0]:
            values = [repeat[key] for repeat in self.repeats if repeat[key] is not None]
            if key == "drops":
                merged[key] = max(values)
            elif key == "messages":
                merged[key] = int(np.median(values))
            else:
                merged[key] = float(np.median(values)) if values else None
        return merged

    def to_json(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "suite": self.cell.suite,
            "transport": self.cell.transport,
            "size": self.cell.size,
            "clients": self.cell.clients,
            "variant": None if self.cell.variant is None else self.cell.variant.to_json(),
            "loop": self.loop,
            "status": self.status,
            "reason": self.reason,
            "processes": self.processes,
            "crashes": self.crashes,
            "crash_reasons": self.crash_reasons,
            "swept": [{"name": name, "bytes": size} for name, size in self.swept],
            "unswept": [{"name": name, "why": why} for name, why in self.unswept],
            "repeats": self.repeats,
            "metrics": self.metrics,
        }


def _percentile_us(samples: np.ndarray[Any, np.dtype[np.float64]], q: float) -> float | None:
    return float(np.percentile(samples, q)) / 1e3 if samples.size else None


def _aggregate(cell: Cell, results: list[dict[str, Any]]) -> dict[str, Any]:
    """One repeat's metrics from the ``result`` events of the cell's workers."""
    sinks = [unit for result in results for unit in result["units"] if unit["kind"] == "sink"]
    corrupt = sum(sink["corrupt"] for sink in sinks)
    disorder = sum(sink["disorder"] for sink in sinks)
    if corrupt or disorder:
        raise WorkerError(f"{corrupt} corrupted and {disorder} out-of-order messages at the sinks")
    latency = np.asarray([ns for sink in sinks for ns in sink["latency_ns"]], dtype=np.float64)
    loaded = [sink["loaded_p50_ns"] for sink in sinks if sink["loaded_p50_ns"] is not None]
    msgs_per_s = float(sum(sink["msgs_per_s"] for sink in sinks))
    messages = sum(
        sink["rate_messages"] + sink["latency_messages"] + sink["ends"] for sink in sinks
    )
    cpu = sum(result["cpu_seconds"] for result in results)
    return {
        "msgs_per_s": msgs_per_s,
        "mb_per_s": msgs_per_s * cell.size / 1e6,
        "latency_p50_us": _percentile_us(latency, 50),
        "latency_p99_us": _percentile_us(latency, 99),
        "latency_max_us": float(latency.max()) / 1e3 if latency.size else None,
        "loaded_latency_p50_us": float(np.median(loaded)) / 1e3 if loaded else None,
        "drops": int(sum(sink["drops"] for sink in sinks)),
        "cpu_s_per_msg": cpu / messages if messages else 0.0,
        "messages": int(messages),
    }


def expected_seconds(cell: Cell, plan: Plan) -> float:
    """How long the streaming part of one repeat of *cell* should take (at most)."""
    sources = cell.clients if cell.suite == "fanin" else 1
    count = latency_count(plan, cell.size, sources, cell.suite)
    paced = count * sources * suite_pacing(cell.suite, cell.size, plan.period)
    rate = plan.max_duration if cell.suite == "p2p" else plan.duration
    return rate + paced * 1.5


async def _run_cell(
    framework: FrameworkInfo, cell: Cell, plan: Plan, record: CellRecord, profile: str | None
) -> None:
    """One repeat of *cell* on *framework*; updates *record* (status, repeats)."""
    groups = layout(cell, f"/perf/{uuid.uuid4().hex[:12]}")
    record.processes = len(groups)
    base = {
        "graph": list(framework.address),
        "suite": cell.suite,
        "variant": None if cell.variant is None else cell.variant.to_json(),
        "transport": cell.transport,
        "size": cell.size,
        "seed": int.from_bytes(os.urandom(4), "little"),
        "plan": plan.to_json(),
        "label": f"{cell.suite}-{cell.transport}-{cell.size}-{cell.clients}",
        "profile": profile,
    }
    workers: list[Worker] = []
    before = _leftovers.snapshot(framework.leftovers)
    try:
        for index, group in enumerate(groups):
            spec = dict(base, units=[unit.to_json() for unit in group.units])
            name = f"{framework.name} {cell.label} process {index + 1} ({group.roles})"
            workers.append(
                await Worker.start(name, [*framework.command, "units", json.dumps(spec)])
            )
        for stage, command in (("subscribed", "publish"), ("published", "go")):
            events = await asyncio.gather(
                *(worker.event({stage, "unavailable"}, SETUP_TIMEOUT) for worker in workers)
            )
            for event in events:
                if event["event"] == "unavailable":
                    record.status, record.reason = "unavailable", event["reason"]
                    return
            for worker in workers:
                worker.send(command)
        warm = (worker.event({"warm"}, SETUP_TIMEOUT) for worker in workers)
        await asyncio.gather(*warm)
        for worker in workers:
            worker.send("measure")
        timeout = expected_seconds(cell, plan) + GRACE
        results = await asyncio.gather(*(worker.event({"result"}, timeout) for worker in workers))
        metrics = _aggregate(cell, list(results))
    finally:
        # Concurrently: each close may wait a few seconds for a worker to leave.
        await asyncio.gather(*(worker.close() for worker in workers), return_exceptions=True)
        if framework.leftovers:
            swept = _leftovers.sweep(framework.leftovers, before)
            record.swept += swept.removed
            record.unswept += swept.kept
    record.repeats.append(metrics)
    record.loop = results[0].get("loop", framework.event_loop)
    for worker in workers:
        # Figures came, but a worker that then fails to leave cleanly still crashed.
        if worker.killed:
            record.crashed(f"{worker.name} did not leave after its result and was killed")
        elif worker.process.returncode:
            record.crashed(
                f"{worker.name} exited with status {worker.process.returncode} after its "
                f"result: {worker.why()}"
            )


def _runs_on(cell: Cell, frameworks: list[FrameworkInfo]) -> list[FrameworkInfo]:
    """The frameworks that measure *cell*: all of them, ezflow alone for a variant."""
    if cell.variant is not None and not cell.variant.is_default:
        return frameworks[:1]
    return frameworks


async def _attempt(  # noqa: PLR0917 - one repeat's whole context
    framework: FrameworkInfo,
    cell: Cell,
    plan: Plan,
    record: CellRecord,
    profile: str | None,
    progress: Progress,
    label: str,
) -> None:
    """One repeat of *cell* on *framework*, started again after each crash (up to
    :data:`CRASH_RETRIES` times); the cell is an error once every attempt crashed."""
    for attempt in range(CRASH_RETRIES + 1):
        try:
            await _run_cell(framework, cell, plan, record, profile)
        except WorkerError as exc:
            record.crashed(str(exc))
            if attempt == CRASH_RETRIES:
                record.status, record.reason = "error", str(exc)
                progress.log(f"[red]{label}: {exc}[/]")
            else:
                progress.log(f"[yellow]{label}: {exc}; starting it again[/]")
        else:
            return


@dataclass(slots=True)
class Progress:
    """Callbacks of a run, for a live display (all optional)."""

    started: Callable[[int], None] = lambda total: None
    step: Callable[[str], None] = lambda label: None
    cell_done: Callable[[CellRecord], None] = lambda record: None
    log: Callable[[str], None] = lambda message: None


#: The raw socket each p2p transport is set against in the floor.
P2P_FLOOR_SOCKET = {"local": "unix", "shm": "unix", "tcp": "tcp"}
#: Longest back-to-back stream of the p2p floor, in seconds.
MAX_FLOOR_STREAM = 1.0


async def _measure_floor(
    plan: Plan, sizes: Sequence[int], p2p: Sequence[tuple[str, int]], progress: Progress
) -> dict[str, Any]:
    """The floor of the run: socketpair round trips and one copy of each size; for
    each (socket, size) of *p2p*, the paced one-way time and the stream rate."""
    progress.log("floor: memcpy bandwidth")
    memcpy = _floor.memcpy_bandwidth()
    rtts = []
    for size in sizes:
        progress.log(f"floor: socketpair round trip, {size} B")
        trips = plan.floor_round_trips if size < (1 << 20) else max(1, plan.floor_round_trips // 5)
        samples = np.asarray(
            await _floor.socketpair_rtt(size, trips, max(1, trips // 10)), dtype=np.float64
        )
        rtts.append(
            {
                "size": size,
                "p50": float(np.percentile(samples, 50)) / 1e3,
                "p99": float(np.percentile(samples, 99)) / 1e3,
            }
        )
    copies = [{"size": size, "us": _floor.memcpy_seconds(size) * 1e6} for size in sizes]
    paced, streams = [], []
    for over, size in p2p:
        progress.log(f"floor: paced one-way and stream over {over}, {size} B")
        one_way = np.asarray(
            await _floor.paced_one_way(
                size,
                latency_count(plan, size, 1, "p2p"),
                10,
                period=suite_pacing("p2p", size, plan.period),
                over=over,
            ),
            dtype=np.float64,
        )
        paced.append(
            {
                "over": over,
                "size": size,
                "p50": float(np.percentile(one_way, 50)) / 1e3,
                "p99": float(np.percentile(one_way, 99)) / 1e3,
            }
        )
        seconds = min(plan.duration, MAX_FLOOR_STREAM)
        rate = await _floor.stream_rate(size, seconds, over=over)
        streams.append({"over": over, "size": size, "msgs_per_s": rate})
    floor: dict[str, Any] = {
        "memcpy_gb_per_s": memcpy / 1e9,
        "socketpair_rtt_us": rtts,
        "memcpy_us": copies,
    }
    if p2p:
        floor |= {"paced_one_way_us": paced, "stream_msgs_per_s": streams}
    return floor


async def run(
    cells: Sequence[Cell],
    plan: Plan,
    *,
    peers: Sequence[Sequence[str]] = (),
    progress: Progress | None = None,
    command: Sequence[str] = (),
    profile: str | None = None,
) -> dict[str, Any]:
    """Measure the floor, then every cell on ezflow and on each peer (a worker command,
    e.g. ``["VENV/bin/python", "-m", "ezflow._perf._peers._ezmsg"]``; variant cells on
    ezflow only); return the results document (see :mod:`._schema`). A worker that
    crashes is started again (:data:`CRASH_RETRIES`) and counted; a cell whose every
    attempt crashed is recorded with status ``error`` and the run goes on; cancelling
    the calling task ends every worker first. With *profile* (a
    directory), every units worker leaves its cProfile statistics there."""
    progress = progress or Progress()
    main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if main_task is not None:  # SIGTERM: the same clean-up as Ctrl-C
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    started = time.perf_counter()
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = _environment.load_average()
    frameworks = [FrameworkInfo(EZFLOW_WORKER), *(FrameworkInfo(tuple(peer)) for peer in peers)]
    records: dict[tuple[str, Cell], CellRecord] = {}
    try:
        for framework in frameworks:
            progress.log(f"starting {' '.join(framework.command)}")
            await framework.start()
        sizes = sorted({cell.size for cell in cells})
        p2p = sorted(
            {(P2P_FLOOR_SOCKET[cell.transport], cell.size) for cell in cells if cell.suite == "p2p"}
        )
        floor = await _measure_floor(plan, sizes, p2p, progress)
        progress.started(sum(len(_runs_on(cell, frameworks)) for cell in cells) * plan.repeats)
        for cell in cells:
            for framework in _runs_on(cell, frameworks):
                record = CellRecord(framework.name, cell)
                records[framework.name, cell] = record
                if cell.applicable is not None:
                    record.status, record.reason = "unavailable", cell.applicable
        # Rounds: every cell once per round, the frameworks of a cell back to back, so
        # that the machine's drift falls on every cell and framework alike.
        for repeat in range(plan.repeats):
            for cell in cells:
                chosen = _runs_on(cell, frameworks)
                for framework in chosen:
                    record = records[framework.name, cell]
                    label = f"{framework.name} {cell.label} round {repeat + 1}/{plan.repeats}"
                    progress.step(label)
                    if record.status == "ok":
                        await _attempt(framework, cell, plan, record, profile, progress, label)
                if repeat == plan.repeats - 1:
                    for framework in chosen:
                        progress.cell_done(records[framework.name, cell])
    finally:
        await asyncio.gather(*(fw.aclose() for fw in frameworks), return_exceptions=True)
        if main_task is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGTERM)
    ezflow_info = frameworks[0]
    return {
        "schema": SCHEMA_ID,
        "created": created,
        "command": list(command),
        "wall_seconds": time.perf_counter() - started,
        "environment": _environment.capture(ezflow_info.event_loop)
        | {"load_before": load_before, "load_after": _environment.load_average()},
        "plan": plan.to_json(),
        "frameworks": [framework.to_json() for framework in frameworks],
        "floor": floor,
        "cells": [record.to_json() for record in records.values()],
    }
