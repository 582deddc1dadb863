"""Child-process roles for tests/test_reconnect.py.

Run as ``python tests/_reconnect_peers.py ROLE JSON_ARGS``. A child reports on stdout, one
JSON object per line (``{"event": ...}``, read with :class:`_proc.Child`) and reads
commands from stdin, one per line; end of stdin is its cue to finish.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import ezflow


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def commands() -> Any:
    """Lines from stdin (without the newline) until it closes."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        yield line.strip()


def context(args: dict[str, Any]) -> ezflow.GraphContext:
    return ezflow.GraphContext(
        args["address"], auto_start=args.get("auto_start", False), name=args.get("name")
    )


async def publish(args: dict[str, Any]) -> None:
    """Publish 0, 1, 2, ... every `pace` seconds on `topic` until stdin closes."""
    async with context(args) as ctx:
        pub = await ctx.publisher(args["topic"])
        report("ready", publisher_id=pub.id, owns_server=ctx.server is not None)

        async def run() -> None:
            i = 0
            while True:
                await pub.publish(i)
                i += 1
                await asyncio.sleep(args.get("pace", 0.01))

        task = asyncio.ensure_future(run())
        async for _ in commands():
            pass
        task.cancel()


async def sequence(args: dict[str, Any]) -> None:
    """A lossless subscriber of consecutive integers: counts them and notes every gap or
    reordering. Command ``status``: report ``status`` (count, last, gaps)."""
    async with context(args) as ctx:
        sub = await ctx.subscriber(args["topic"])
        state: dict[str, Any] = {"first": None, "last": None, "count": 0, "gaps": []}

        async def run() -> None:
            async for value in sub:
                last = state["last"]
                if last is None:
                    state["first"] = value
                elif value != last + 1:
                    state["gaps"].append([last, value])
                state["last"] = value
                state["count"] += 1

        task = asyncio.ensure_future(run())
        report("ready", subscriber_id=sub.id, owns_server=ctx.server is not None)
        async for command in commands():
            if command == "status":
                report("status", channels=len(ctx.channels), **state)
        task.cancel()
        report("done", channels=len(ctx.channels), **state)


async def collect(args: dict[str, Any]) -> None:
    """Subscribe, receive `count` messages, report them; then wait for stdin to close."""
    async with context(args) as ctx:
        sub = await ctx.subscriber(args["topic"])
        report("ready", subscriber_id=sub.id)
        values = [await sub.recv() for _ in range(args["count"])]
        report("done", values=values)
        async for _ in commands():
            pass


async def own(args: dict[str, Any]) -> None:
    """A context that starts the embedded server (nothing else answers at `address`).
    Command ``sleep S``: report ``sleeping``, then block this process's loop S seconds."""
    async with context({**args, "auto_start": True}) as ctx:
        server = ctx.server
        report("ready", owns_server=server is not None, pid=os.getpid())
        async for command in commands():
            if command.startswith("sleep "):
                report("sleeping")
                time.sleep(float(command.split()[1]))  # noqa: ASYNC251 - blocks on purpose
                report("awake")


ROLES = {"publish": publish, "sequence": sequence, "collect": collect, "own": own}

if __name__ == "__main__":
    ezflow.lowlevel.run_coroutine(ROLES[sys.argv[1]](json.loads(sys.argv[2])))
