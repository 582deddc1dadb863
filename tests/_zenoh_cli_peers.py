"""Child processes of tests/test_cli_zenoh.py: a publisher and a subscriber that first
make sure Zenoh has routed the bridges between them, so that the messages a test counts
are exactly those it sends.

Run as ``python tests/_zenoh_cli_peers.py ROLE JSON_ARGS`` (JSON events on stdout, one
per line, as tests/_children.py; ``_proc.Child`` reads them). Probes are the values -1,
-2, ... (probe k is -(k+1)); the messages counted are 0, 1, ... Zenoh routes a new
subscription to its publishers asynchronously: until it has, a bridge's samples go
nowhere, so a test sends probes until one arrives, then says go.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

import ezflow

SCRIPT = str(Path(__file__).resolve())


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def message(value: int, size: int) -> Any:
    return np.full(size, value, dtype=np.int32) if size else value


def value_of(received: Any) -> int:
    return int(received[0]) if isinstance(received, np.ndarray) else int(received)


async def probe_publish(args: dict[str, Any]) -> None:
    """Publish probes every `probe_every` s until stdin says go, then `count` messages
    (`size` int32 each, or ints), `pace` s apart; then (unless `end` is false: the
    channels stay, for ``ezflow top``) close the publisher, so that its end of stream
    goes out; report done and idle until stdin closes."""
    async with ezflow.GraphContext(args.get("address"), auto_start=False) as ctx:
        publisher = await ctx.publisher(args["topic"])
        report("ready")
        await publisher.wait_for_channels(1)
        size = args.get("size", 0)
        go = asyncio.ensure_future(asyncio.to_thread(sys.stdin.readline))
        probes = 0
        while not go.done():
            probes += 1
            await publisher.publish(message(-probes, size))
            await asyncio.wait([go], timeout=args.get("probe_every", 0.05))
        for i in range(args["count"]):
            await publisher.publish(message(i, size))
            if args.get("pace"):
                await asyncio.sleep(args["pace"])
        if args.get("end", True):
            await publisher.aclose()
        report("done", probes=probes)
        await asyncio.to_thread(sys.stdin.read)


async def probe_collect(args: dict[str, Any]) -> None:
    """Report the first probe that arrives (``probed``), then take messages, `delay` s
    each, until `count` have arrived (or the stream ends); report them and the probes."""
    async with ezflow.GraphContext(args.get("address"), auto_start=False) as ctx:
        subscriber = await ctx.subscriber(args["topic"])
        report("ready")
        values: list[int] = []
        probes: list[int] = []
        async for received in subscriber:
            value = value_of(received)
            if value < 0:
                if not probes:
                    report("probed", value=value)
                probes.append(value)
                continue
            values.append(value)
            if args.get("delay"):
                await asyncio.sleep(args["delay"])
            if len(values) == args.get("count"):
                break
        report("done", values=values, probes=probes)
        await asyncio.to_thread(sys.stdin.read)


ROLES = {"probe_publish": probe_publish, "probe_collect": probe_collect}

if __name__ == "__main__":
    role, raw = sys.argv[1], sys.argv[2]
    ezflow.lowlevel.run_coroutine(ROLES[role](json.loads(raw)))
