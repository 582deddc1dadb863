"""Child-process roles for tests/test_trace_lease.py: processes of a graph that say, ten
times a second, how they trace.

Run as ``python tests/_trace_peers.py ROLE JSON_ARGS``. A child reports on stdout, one
JSON object per line (read with :class:`_proc.Child`): ``ready``, then ``state`` every
0.1 s with its trace state as the process has it (``TRACING.state()``: the rate in
force, its own rate and where it came from, the lease it holds), the hops it recorded
(``recorded``: traced messages its subscribers took) and its message count. It reads
commands from stdin, one per line (``times``: report the ``monotonic_ns`` taken just
before each publish); end of stdin is its cue to finish.

Arguments: ``address``, ``topic`` (and ``out`` for a relay), ``name``, ``pace``
(seconds between publishes), ``telemetry`` (the context's report interval; 0: none),
``rate`` (``ezflow.set_trace_rate`` first, if given).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import ezflow
from ezflow._core._tracing import HANDLING, TRACING


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def commands() -> AsyncIterator[str]:
    """Lines from stdin (without the newline) until it closes."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        yield line.strip()


def context(args: dict[str, Any]) -> ezflow.GraphContext:
    if args.get("rate") is not None:
        ezflow.set_trace_rate(args["rate"])
    return ezflow.GraphContext(
        args["address"],
        auto_start=False,
        name=args.get("name"),
        telemetry_interval=args.get("telemetry", 0.2),
    )


async def tell(count: list[int]) -> None:
    while True:
        report("state", **TRACING.state(), recorded=TRACING.recorded, count=count[0])
        await asyncio.sleep(0.1)


async def until_closed(*tasks: asyncio.Future[Any], times: list[int] | None = None) -> None:
    try:
        async for command in commands():
            if command == "times" and times is not None:
                report("times", times=times)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def publisher(args: dict[str, Any]) -> None:
    """Publish 0, 1, 2, ... on `topic` every `pace` seconds, noting when."""
    async with context(args) as ctx:
        pub = await ctx.publisher(args["topic"])
        report("ready", publisher_id=pub.id)
        count, times = [0], []

        async def run() -> None:
            while True:
                times.append(time.monotonic_ns())
                await pub.publish(count[0])
                count[0] += 1
                await asyncio.sleep(args.get("pace", 0.02))

        await until_closed(
            asyncio.ensure_future(run()), asyncio.ensure_future(tell(count)), times=times
        )


async def subscriber(args: dict[str, Any]) -> None:
    """Take every message of `topic` (a sink), counting them."""
    async with context(args) as ctx:
        sub = await ctx.subscriber(args["topic"])
        report("ready", subscriber_id=sub.id)
        count = [0]

        async def run() -> None:
            async for _ in sub:
                count[0] += 1

        await until_closed(asyncio.ensure_future(run()), asyncio.ensure_future(tell(count)))


async def relay(args: dict[str, Any]) -> None:
    """Take every message of `topic` and publish it on `out`, as a unit's input loop
    does: a traced message carries its trace on, and it starts none of its own."""
    async with context(args) as ctx:
        sub = await ctx.subscriber(args["topic"])
        pub = await ctx.publisher(args["out"])
        report("ready", subscriber_id=sub.id, publisher_id=pub.id)
        count = [0]

        async def run() -> None:
            HANDLING.set(True)
            async for message in sub:
                count[0] += 1
                await pub.publish(message)

        await until_closed(asyncio.ensure_future(run()), asyncio.ensure_future(tell(count)))


ROLES = {"publisher": publisher, "subscriber": subscriber, "relay": relay}

if __name__ == "__main__":
    role, raw = sys.argv[1], sys.argv[2]
    ezflow.lowlevel.run_coroutine(ROLES[role](json.loads(raw)))
