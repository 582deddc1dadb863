"""ezmsg 3.9.0 as the peer of ``perf/bench_transports.py``: 1 publisher -> 1 subscriber.

The benchmark starts this script with an interpreter that has ezmsg 3.9.0 (and ezflow,
for the shared payload and checks) installed, in three roles: ``server`` (an ezmsg
``GraphServer`` on a free loopback port, printed as JSON, until stdin closes), and the
same ``pub`` / ``sub`` roles with the same arguments as the benchmark's own children, so
both frameworks send the same messages at the same pace and are timed the same way.

Only ezmsg's public low-level API is used (``import ezmsg.core as ez``):
``ez.GraphServer``, ``ez.GraphContext(address, auto_start=False)``,
``ctx.publisher(topic, force_tcp=..., allow_local=False)`` + ``Publisher.broadcast``, and
``ctx.subscriber(topic)`` + ``Subscriber.recv_zero_copy`` - what ezmsg Units use. ``shm``
is ezmsg's default between processes, ``tcp`` is ``force_tcp=True``. ezmsg runs on the
stock asyncio loop, as ``ez.run`` does. Loaned buffers have no ezmsg counterpart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import ezmsg.core as ez  # type: ignore[import-not-found]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_transports import (
    _FRAME,
    _FRAME_SHAPE,
    _STAMP,
    _check_message,
    _parse,
    _payload,
    _stamp,
    _stdin_closed,
    _unless,
)

# What the subscriber needs before it counts: ezmsg has no "wait for subscribers", so the
# publisher starts after this delay (warm-up messages absorb the rest).
_CONNECT_DELAY = 1.0


async def _serve() -> None:
    server = ez.GraphServer()
    server.start(("127.0.0.1", 0))
    try:
        print(json.dumps({"address": f"{server.address.host}:{server.address.port}"}), flush=True)
        await _stdin_closed()
    finally:
        server.stop()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _publisher(args: argparse.Namespace) -> dict[str, Any]:
    released = asyncio.ensure_future(_stdin_closed())
    try:
        async with ez.GraphContext(_address(args.graph), auto_start=False) as ctx:
            pub = await ctx.publisher(
                args.topic, force_tcp=args.transport == "tcp", allow_local=False
            )
            await asyncio.sleep(_CONNECT_DELAY)
            payload = _payload(args.seed, args.size)
            shape = _FRAME_SHAPE if args.size == _FRAME else (args.size,)

            async def publish() -> dict[str, float]:
                started, cpu = time.perf_counter(), time.process_time()
                try:
                    for _ in range(args.warmup + args.count):
                        if args.mode == "throughput":
                            await pub.broadcast(payload)
                        else:
                            message = payload.reshape(shape).copy()
                            _stamp(message)
                            await pub.broadcast(message)
                            await asyncio.sleep(args.period)
                except RuntimeError as exc:
                    # ezmsg 3.9.0's broadcast iterates its channel dict while a subscriber
                    # that has all it needs disconnects ("dictionary changed size during
                    # iteration"): the run is over for the subscriber; stop here.
                    if "changed size" not in str(exc):
                        raise
                    return {}
                return {
                    "publisher_seconds": time.perf_counter() - started,
                    "publisher_cpu_seconds": time.process_time() - cpu,
                }

            result: dict[str, Any] = {}
            timing = await _unless(publish(), released)
            if timing is not None:
                result.update(timing)
                await released
            return result
    finally:
        released.cancel()


async def _subscriber(args: argparse.Namespace) -> dict[str, Any]:
    parent_gone = asyncio.ensure_future(_stdin_closed())
    try:
        async with ez.GraphContext(_address(args.graph), auto_start=False) as ctx:
            sub = await ctx.subscriber(args.topic)
            expected = _payload(args.seed, args.size)
            work = asyncio.wait_for(_receive(sub, args, expected), args.timeout)
            result = await _unless(work, parent_gone)
            if result is None:
                raise RuntimeError("the parent process went away")
            result["transports"] = [args.transport]
            return result
    finally:
        parent_gone.cancel()


async def _receive(sub: Any, args: argparse.Namespace, expected: Any) -> dict[str, Any]:
    """The benchmark's measurements, inside ezmsg's zero-copy context (the message is
    only valid there)."""
    receive = sub.recv_zero_copy
    clock = time.perf_counter_ns
    if args.mode == "latency":
        latencies: list[int] = []
        for index in range(args.warmup + args.count):
            async with receive() as message:
                now = clock()
                if index >= args.warmup:
                    latencies.append(now - int(message.reshape(-1)[:8].view(_STAMP)[0]))
                _check_message(message, expected, False)
        return {"latency_ns": latencies}
    for _ in range(args.warmup + 1):
        async with receive() as message:
            pass
    started, cpu = clock(), time.process_time()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    deadline = started + int(args.max_seconds * 1e9)
    received = 0
    for _ in range(args.count - 1):
        async with receive() as message:
            received += 1
            if received == args.count - 1 or clock() >= deadline:
                _check_message(message, expected, False)
                break
    elapsed = (clock() - started) / 1e9
    return {
        "messages": received,
        "seconds": elapsed,
        "subscriber_cpu_seconds": time.process_time() - cpu,
        "subscriber_minor_page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
    }


def main() -> None:
    if sys.argv[1:2] == ["server"]:
        asyncio.run(_serve())
        return
    options = _parse(sys.argv[1:])
    role = _publisher if options.role == "pub" else _subscriber
    print(json.dumps(asyncio.run(role(options))))


if __name__ == "__main__":
    main()
