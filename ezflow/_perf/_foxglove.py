"""The cost of a Foxglove viewer, and MCAP write speed: ``ezflow perf foxglove``.

**Viewer.** One graph, four processes: CAMERA publishes 3840x2160 RGB frames (24 MiB)
at 30 fps, SIGNAL an 8-sample float64 block at 1 kHz, SINK subscribes to both
(lossless) and measures each message's one-way latency (the publisher's
``CLOCK_MONOTONIC`` stamp in the message) and rate; ``ezflow foxglove`` runs next to
them. Each round measures SINK for ``--seconds`` in four phases, in an order that
rotates from round to round: *alone* (no viewer), *tapped* (no viewer, but a process
with the leaky subscribers a viewer brings, taking every message and doing nothing: the
floor of any viewer), *watched* (a WebSocket client in this process subscribed to both
topics, reading every message it gets) and *stalled* (a client subscribed to both
topics that never reads: its socket and the SDK's backlog fill, and the server goes
on). Printed: per topic, SINK's msgs/s and p50 latency for each phase (medians of the
rounds, with their min-max spread), each phase's ratio to *alone*, and what the reading
viewer received. The issue's bar: within 1.1x.

**MCAP.** 1 MiB messages (1024x1024 mono8 frames, ``foxglove.RawImage``) written to a
file in ``--dir``: the disk's own floor (the same bytes with ``write``), the mapping
alone (no file), and ``McapWriter`` with no compression, lz4 and zstd; GB/s, medians of
the rounds with their spread, each ending with ``fsync`` (without it the figure is the
page cache's, not the disk's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FoxgloveBenchError", "main", "mcap_speed", "run"]

FRAME_SHAPE = (2160, 3840, 3)
FPS = 30.0
SERIES_RATE = 1000.0
TOPICS = {"frames": "/perf/frames", "series": "/perf/series"}
PHASES = ("alone", "tapped", "watched", "stalled")
MCAP_MESSAGE = (1024, 1024)  # 1 MiB mono8
#: Seconds a process has to start, connect or answer.
STEP_TIMEOUT = 60.0


class FoxgloveBenchError(RuntimeError):
    """A process of the benchmark failed or did not answer in time."""


# -- the graph's processes (``python -m ezflow._perf._foxglove ROLE ADDRESS``) ----------


async def _camera(address: str) -> None:
    import ezflow  # noqa: PLC0415 - in the child only

    async with ezflow.GraphContext(address, auto_start=False) as ctx:
        publisher = await ctx.publisher(TOPICS["frames"])
        pool = [np.full(FRAME_SHAPE, i * 40, np.uint8) for i in range(3)]
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        due = loop.time()
        for seq in range(1 << 62):
            frame = pool[seq % len(pool)]
            frame.reshape(-1)[:8].view(np.int64)[0] = time.monotonic_ns()
            await publisher.publish(frame)
            due += 1 / FPS
            await asyncio.sleep(max(0.0, due - loop.time()))


async def _signal(address: str) -> None:
    import ezflow  # noqa: PLC0415
    from ezflow.units import rate_limited  # noqa: PLC0415

    async with ezflow.GraphContext(address, auto_start=False) as ctx:
        publisher = await ctx.publisher(TOPICS["series"])
        print("ready", flush=True)
        async for i in rate_limited(SERIES_RATE):
            block = np.arange(8.0) + i
            block[0] = float(time.monotonic_ns())  # < 2**53: exact in a float64
            await publisher.publish(block)


async def _tap(address: str) -> None:
    """What a viewer's subscribers are without a viewer: leaky subscribers (the queue
    ``ezflow foxglove`` gives its own) to both topics, in a process of their own, taking
    every message and doing nothing with it."""
    import ezflow  # noqa: PLC0415
    from ezflow._core._config import FOXGLOVE_QUEUE  # noqa: PLC0415

    async with ezflow.GraphContext(address, auto_start=False) as ctx:
        subscribers = [
            await ctx.subscriber(topic, leaky=True, queue=FOXGLOVE_QUEUE)
            for topic in TOPICS.values()
        ]
        print("ready", flush=True)

        async def take(subscriber: Any) -> None:
            async for _ in subscriber:
                pass

        await asyncio.gather(*(take(s) for s in subscribers))


async def _sink(address: str) -> None:
    """Measures both topics; a line ``mark`` on stdin starts a phase, ``report`` prints
    its figures as one JSON line."""
    import ezflow  # noqa: PLC0415

    async with ezflow.GraphContext(address, auto_start=False) as ctx:
        latencies: dict[str, list[int]] = {name: [] for name in TOPICS}
        started = [time.monotonic()]

        async def take(name: str) -> None:
            subscriber = await ctx.subscriber(TOPICS[name])
            async for message in subscriber:
                now = time.monotonic_ns()
                if name == "frames":
                    stamp = int(message.reshape(-1)[:8].view(np.int64)[0])
                else:
                    stamp = int(message[0])
                latencies[name].append(now - stamp)

        tasks = [asyncio.create_task(take(name)) for name in TOPICS]
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := (await reader.readline()).strip():
            if line == b"mark":
                for values in latencies.values():
                    values.clear()
                started[0] = time.monotonic()
            elif line == b"report":
                span = time.monotonic() - started[0]
                figures = {
                    name: {
                        "rate": len(values) / span,
                        "p50_us": statistics.median(values) / 1e3 if values else None,
                    }
                    for name, values in latencies.items()
                }
                print(json.dumps(figures), flush=True)
        for task in tasks:
            task.cancel()


def main(argv: list[str] | None = None) -> None:
    """``python -m ezflow._perf._foxglove ROLE ADDRESS``: one process of the graph."""
    role, address = (argv or sys.argv[1:])[:2]
    from ezflow._core._loop import run_coroutine  # noqa: PLC0415

    roles = {"camera": _camera, "signal": _signal, "sink": _sink, "tap": _tap}
    with contextlib.suppress(KeyboardInterrupt):
        run_coroutine(roles[role](address))


# -- orchestration -------------------------------------------------------------------------


async def _start(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


async def _line(process: asyncio.subprocess.Process, what: str) -> str:
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), STEP_TIMEOUT)
    except TimeoutError:
        raise FoxgloveBenchError(f"{what}: no answer within {STEP_TIMEOUT:.0f} s") from None
    if not line:
        raise FoxgloveBenchError(f"{what}: the process exited ({await process.wait()})")
    return line.decode()


async def _measure(sink: asyncio.subprocess.Process, seconds: float) -> dict[str, Any]:
    assert sink.stdin is not None
    sink.stdin.write(b"mark\n")
    await asyncio.sleep(seconds)
    sink.stdin.write(b"report\n")
    return json.loads(await _line(sink, "the sink's report"))  # type: ignore[no-any-return]


async def _viewer(host: str, port: int, received: dict[str, int], *, reads: bool) -> None:
    from .._foxglove._viewer import Viewer  # noqa: PLC0415

    viewer = await Viewer.connect(host, port)
    try:
        await viewer.wait_for_channels(list(TOPICS.values()), STEP_TIMEOUT)
        ids = {await viewer.subscribe(topic): name for name, topic in TOPICS.items()}
        if not reads:  # subscribed, and never reads again (until cancelled)
            await asyncio.Event().wait()
        while True:
            subscription, _, _ = await viewer.message()
            received[ids[subscription]] += 1
    finally:
        await viewer.close()


async def _bench(rounds: int, seconds: float) -> list[dict[str, Any]]:
    import ezflow  # noqa: PLC0415

    results: list[dict[str, Any]] = []
    async with ezflow.GraphContext("127.0.0.1:0") as ctx:
        address = "{}:{}".format(*ctx.address)
        module = ("-m", "ezflow._perf._foxglove")
        processes = [await _start(*module, role, address) for role in ("sink", "camera", "signal")]
        foxglove = await _start("-m", "ezflow", "foxglove", "-a", address, "--port", "0",
                                "--http-port", "0")  # fmt: skip
        try:
            for process, role in zip(processes, ("sink", "camera", "signal"), strict=True):
                await _line(process, role)
            line = await _line(foxglove, "ezflow foxglove")
            host, port = line.split("ws://", 1)[1].split()[0].rsplit(":", 1)
            await asyncio.sleep(2.0)  # the graph settles, the server has seen the topics
            sink = processes[0]
            for index in range(rounds):
                round_: dict[str, Any] = {}
                turn = index % len(PHASES)
                for phase in PHASES[turn:] + PHASES[:turn]:
                    if phase == "alone":
                        round_[phase] = await _measure(sink, seconds)
                        continue
                    if phase == "tapped":
                        tap = await _start(*module, "tap", address)
                        try:
                            await _line(tap, "tap")
                            await asyncio.sleep(1.0)  # subscribed, messages flowing
                            round_[phase] = await _measure(sink, seconds)
                        finally:
                            tap.terminate()
                            await tap.wait()
                        await asyncio.sleep(0.5)
                        continue
                    received = dict.fromkeys(TOPICS, 0)
                    viewing = asyncio.create_task(
                        _viewer(host, int(port), received, reads=phase == "watched")
                    )
                    # subscribed, frames flowing (a stalled viewer's buffers full)
                    await asyncio.sleep(1.0)
                    if viewing.done():
                        viewing.result()  # its error
                    before = dict(received)
                    round_[phase] = await _measure(sink, seconds)
                    if phase == "watched":
                        round_["viewer"] = {k: (received[k] - before[k]) / seconds for k in TOPICS}
                    viewing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await viewing
                    await asyncio.sleep(0.5)
                results.append(round_)
        finally:
            for process in (*processes, foxglove):
                if process.returncode is None:
                    process.terminate()
            for process in (*processes, foxglove):
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()
    return results


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):9.1f} ({min(values):.1f}-{max(values):.1f})"


def _ratio(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def run(rounds: int, seconds: float) -> None:
    """Measure and print the viewer's cost (module docstring)."""
    results = asyncio.run(_bench(rounds, seconds))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{'topic':8} {'figure':12} "
        + " ".join(f"{p:>24}" for p in PHASES)
        + " "
        + " ".join(f"{p + '/alone':>20}" for p in PHASES[1:])
    )
    for name in TOPICS:
        for figure, unit in (("rate", "msgs/s"), ("p50_us", "p50 µs")):
            rounds_ = [r for r in results if all(r[p][name][figure] for p in PHASES)]
            if not rounds_:
                print(f"{name:8} {unit:12} no messages")
                continue
            cells = [_spread([r[p][name][figure] for r in rounds_]) for p in PHASES]
            ratios = [
                _ratio([r[p][name][figure] / r["alone"][name][figure] for r in rounds_])
                for p in PHASES[1:]
            ]
            print(
                f"{name:8} {unit:12} "
                + " ".join(f"{c:>24}" for c in cells)
                + " "
                + " ".join(f"{r:>20}" for r in ratios)
            )
    shown = {k: statistics.median(r["viewer"][k] for r in results) for k in TOPICS}
    print(
        f"the viewer received {shown['frames']:.1f} frames/s and "
        f"{shown['series']:.0f} series msgs/s (median of {rounds} rounds)"
    )


def mcap_speed(rounds: int, count: int, directory: str) -> None:
    """Measure and print MCAP write speed of 1 MiB messages (module docstring)."""
    from .._foxglove._mapping import encode_message, mapping_for  # noqa: PLC0415
    from .._foxglove._mcap import McapWriter  # noqa: PLC0415

    frames = [np.random.default_rng(i).integers(0, 256, MCAP_MESSAGE, np.uint8) for i in range(4)]
    mapping = mapping_for(frames[0])
    size = frames[0].nbytes * count
    cells: dict[str, list[float]] = {}

    def timed(name: str, body: Any) -> None:
        started = time.perf_counter()
        body()
        cells.setdefault(name, []).append(size / (time.perf_counter() - started) / 1e9)

    with tempfile.TemporaryDirectory(prefix="ezflow-mcap-", dir=directory) as tmp:
        path = str(Path(tmp) / "bench.mcap")

        def floor() -> None:
            with open(path, "wb") as file:
                for i in range(count):
                    file.write(frames[i % 4].data)
                file.flush()
                os.fsync(file.fileno())

        def mapping_only() -> None:
            for i in range(count):
                encode_message(frames[i % 4], mapping, i)

        def writer(compression: str) -> Any:
            def body() -> None:
                with McapWriter(path, compression=compression) as mcap:
                    for i in range(count):
                        mcap.write("/frames", frames[i % 4], log_time=i)
                    mcap.sync()

            return body

        for _ in range(rounds):
            timed("write() floor", floor)
            timed("mapping only", mapping_only)
            for compression in ("none", "lz4", "zstd"):
                timed(f"mcap {compression}", writer(compression))
    print(f"MCAP write of {count} x 1 MiB mono8 frames (random pixels) to {directory}:")
    for name, values in cells.items():
        print(f"  {name:14} {_spread(values)} GB/s")


if __name__ == "__main__":
    main()
