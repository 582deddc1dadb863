"""The pipeline scenario of ``ezflow perf waterfall``: N hops, one process per relay.

``python ezflow/_perf/_pipeline.py --hops 3 -o result.json`` (also ``python -m
ezflow._perf._pipeline``). This file imports nothing of ezflow but its public API (and
numpy), so that ``ezflow perf waterfall`` can run *this* file under an older ezflow
installed from another git ref: the same scenario at both refs.

The graph: this process publishes ``(seq, t_ns, frame)`` tuples on ``/hop0`` (the
ordinary program: plain ``asyncio.run``, ``await sub.recv()``); relay ``i`` (its own
process, 1 <= i < N) takes ``/hop{i-1}`` and publishes what it got on ``/hop{i}``; this
process takes ``/hop{N-1}``: N hops over N - 1 relay processes plus this one. Frames are paced
(``--period``, a video's frame rate), after a warm-up until one went all the way.

Measured: end to end per frame (CLOCK_MONOTONIC before ``publish`` at the source to
``recv`` returning at the sink) and, when the installed ezflow traces
(``ezflow.set_trace_rate``) and ``--no-trace`` is not given, every hop's stages: the
source traces each frame (1 in 1), relays carry the trace on, and the hops are read
back from the graph server.

``--hold`` keeps the graph running once the result is written, until stdin closes or
SIGTERM (what a test uses to look at the live graph with ``ezflow trace``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np

import ezflow

__all__ = ["main"]

FRAME_4K = (2160, 3840, 3)  # a 4K RGB frame, 24.9 MB of uint8
WARMUP_PERIOD = 0.05
REPORT_INTERVAL = "0.2"  # telemetry reports (and so trace hops) reach the server this often


def _parse_frame(text: str) -> tuple[int, ...]:
    if text == "4k":
        return FRAME_4K
    if text.endswith("B") and text[:-1].isdigit():
        return (int(text[:-1]),)
    return tuple(int(part) for part in text.lower().split("x"))


async def _relay(address: tuple[str, int], index: int) -> None:
    async with ezflow.GraphContext(address, name=f"relay{index}") as ctx:
        sub = await ctx.subscriber(f"/hop{index - 1}")
        pub = await ctx.publisher(f"/hop{index}")
        print("ready", flush=True)
        orphaned = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        while not orphaned.done():
            try:
                message = await sub.recv()
            except (ezflow.EndOfStream, ezflow.ClosedResourceError):
                return
            await pub.publish(message)


async def _hold() -> None:
    """Until stdin closes or SIGTERM."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def finish(*_: object) -> None:
        if not done.done():
            done.set_result(None)

    loop.add_signal_handler(signal.SIGTERM, finish)
    loop.run_in_executor(None, sys.stdin.read).add_done_callback(finish)
    await done


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["EZFLOW_TELEMETRY_INTERVAL"] = REPORT_INTERVAL
    shape = _parse_frame(args.frame)
    frame = np.zeros(shape, np.uint8)
    frame.flat[:: max(1, frame.size // 64)] = 7  # not all zeros, not worth compressing
    can_trace = hasattr(ezflow, "set_trace_rate")
    traces = can_trace and args.trace
    async with ezflow.GraphContext((args.host, 0), name="source+sink") as ctx:
        address = ctx.address
        sink = await ctx.subscriber(f"/hop{args.hops - 1}")
        source = await ctx.publisher("/hop0")
        relays = [
            subprocess.Popen(  # noqa: ASYNC220 - once, at start-up
                [
                    sys.executable,
                    os.path.abspath(__file__),  # noqa: ASYNC240
                    "--relay",
                    str(i),
                    "--address",
                    f"{address[0]}:{address[1]}",
                ],
                stdout=subprocess.PIPE,
                stdin=subprocess.PIPE,  # (closed when this process ends: relays end too)
                text=True,
            )
            for i in range(1, args.hops)
        ]
        try:
            for relay in relays:
                assert relay.stdout is not None
                line = await asyncio.get_running_loop().run_in_executor(None, relay.stdout.readline)
                if line.strip() != "ready":
                    raise RuntimeError(f"a relay process failed to start (exit {relay.poll()})")
            result = await _measure(args, ctx, source, sink, frame=frame, traces=traces)
            result["address"] = f"{address[0]}:{address[1]}"
            result["can_trace"] = can_trace
            if args.output:
                with open(args.output + ".tmp", "w") as f:  # noqa: ASYNC230 - at the end
                    json.dump(result, f)
                os.replace(args.output + ".tmp", args.output)
            else:
                json.dump(result, sys.stdout)
                print()
            if args.hold:
                await _hold()
            return result
        finally:
            # The end of /hop0 ends relay 1, whose end ends relay 2, ...: each exits.
            await source.aclose()
            loop = asyncio.get_running_loop()
            for relay in relays:
                assert relay.stdin is not None
                relay.stdin.close()  # (a relay's stdin reader keeps it from exiting)
            for relay in relays:
                try:
                    await loop.run_in_executor(None, relay.wait, 10)
                except subprocess.TimeoutExpired:
                    relay.kill()
                    relay.wait()


async def _measure(
    args: argparse.Namespace,
    ctx: ezflow.GraphContext,
    source: ezflow.Publisher,
    sink: ezflow.Subscriber,
    *,
    frame: np.ndarray[Any, Any],
    traces: bool,
) -> dict[str, Any]:
    # Warm-up: until one message went all the way (every relay is routed).
    while True:
        await source.publish((-1, time.monotonic_ns(), frame))
        try:
            await asyncio.wait_for(sink.recv(), WARMUP_PERIOD * 20)
            break
        except TimeoutError:
            continue
    while sink.queued:
        sink.recv_nowait()
    if traces:
        ezflow.set_trace_rate(1)  # this process's source only: relays carry traces on
    latencies: list[int] = []
    started = time.monotonic()

    async def take() -> None:
        while len(latencies) < args.count:
            seq, sent, _ = await sink.recv()
            if seq >= 0:
                latencies.append(time.monotonic_ns() - sent)

    taker = asyncio.ensure_future(take())
    next_at = time.monotonic()
    for seq in range(args.count):
        await source.publish((seq, time.monotonic_ns(), frame))
        next_at += args.period
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    await asyncio.wait_for(taker, 60)
    elapsed = time.monotonic() - started
    hops: list[dict[str, Any]] | None = None
    if traces:
        ezflow.set_trace_rate(0)
        # The sink's last hop finishes when it asks for the next message: ask once.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sink.recv(), 0.01)
        hops = []
        deadline = time.monotonic() + 10 * float(REPORT_INTERVAL) + 5
        want = args.count * args.hops
        while time.monotonic() < deadline:
            await asyncio.sleep(float(REPORT_INTERVAL))
            hops = [h for h in await ctx.graph_traces() if h["t_done"]]
            if len(hops) >= want:
                break
    return {
        "ezflow": getattr(ezflow, "__version__", "?"),
        "hops": args.hops,
        "frame": list(frame.shape),
        "frame_bytes": int(frame.nbytes),
        "count": args.count,
        "period": args.period,
        "elapsed": elapsed,
        "end_to_end_ns": latencies,
        "traces": hops,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hops", type=int, default=3, help="hops (relay processes + 1)")
    parser.add_argument("--frame", default="4k", help="4k, WxHxC or NB (default 4k)")
    parser.add_argument("--count", type=int, default=100, help="frames measured")
    parser.add_argument("--period", type=float, default=1 / 30, help="seconds between frames")
    parser.add_argument("--host", default="127.0.0.1", help="graph server host (port: any)")
    parser.add_argument("-o", "--output", help="write the result here (JSON; else stdout)")
    parser.add_argument("--hold", action="store_true", help="keep running after the result")
    parser.add_argument(
        "--no-trace",
        dest="trace",
        action="store_false",
        help="trace nothing (end to end only: what tracing costs is left out)",
    )
    parser.add_argument("--relay", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.relay is not None:
        host, _, port = args.address.rpartition(":")
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_relay((host, int(port)), args.relay))
        return 0
    if args.hops < 1 or args.count < 1:
        parser.error("--hops and --count must be at least 1")
    asyncio.run(_run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
