"""Child-process roles for tests/test_liveness.py.

Run as ``python tests/_liveness_peers.py ROLE JSON_ARGS``; reports one JSON object per
line on stdout (``{"event": ...}``), like tests/_children.py, and is driven with
:class:`_proc.Child`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import ezflow


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def subscribe(args: dict[str, Any]) -> None:
    """A lossless subscriber. After its first message (reported as ``got``) it blocks
    its event loop for ``block`` seconds, then awaits for ``sleep`` seconds (a slow but
    healthy handler); then it takes the rest. Once ``count`` messages arrived (values
    checked in order from the first one) it reports ``done`` and waits for stdin to
    close."""
    async with ezflow.GraphContext(tuple(args["address"]), auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"], transport=args.get("transport"))
        report("ready", subscriber_id=sub.id)
        first = int(await sub.recv())
        report("got", value=first)
        time.sleep(args.get("block", 0.0))  # noqa: ASYNC251 - the whole loop stops, heartbeats too
        await asyncio.sleep(args.get("sleep", 0.0))  # the loop runs: heartbeats go on
        errors = []
        for expected in range(first + 1, first + args.get("count", 1 << 62)):
            value = int(await sub.recv())
            if value != expected:
                errors.append(f"got {value}, expected {expected}")
                break
        report("done", errors=errors, taken=sub.statistics().taken)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def commands() -> AsyncIterator[str]:
    """Lines from stdin (without the newline) until it closes."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        yield line.strip()


class _Rejoins(logging.Handler):
    """Keeps the log lines of ezflow that say a channel rejoined."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "rejoined" in record.getMessage():
            self.lines.append(record.getMessage())


async def stream(args: dict[str, Any]) -> None:
    """A lossless subscriber (``transport`` forced if given) that takes every message of
    ``topic`` (consecutive integers) until stdin closes. Reports ``got`` with the first
    message, ``rejoin`` (value, wall-clock time, rejoins) with the first message after
    each rejoin, ``end`` each time ``EndOfStream`` is raised; on the command ``status``,
    ``status``: messages taken, the last value, the gaps seen, its stats, its channels'
    transports and rejoin counts, and the log lines of its rejoins."""
    logging.basicConfig(level=logging.INFO, format="child %(name)s: %(message)s")
    caught = _Rejoins()
    logging.getLogger("ezflow").addHandler(caught)
    async with ezflow.GraphContext(tuple(args["address"]), auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"], transport=args.get("transport"))
        state: dict[str, Any] = {"taken": 0, "last": None, "gaps": [], "ends": 0}

        async def take() -> None:
            rejoins = 0
            while True:
                try:
                    value = int(await sub.recv())
                except ezflow.EndOfStream:
                    state["ends"] += 1
                    report("end", ends=state["ends"], taken=state["taken"])
                    continue
                last = state["last"]
                if last is None:
                    report("got", value=value)
                elif value != last + 1:
                    state["gaps"].append([last, value])
                state["last"] = value
                state["taken"] += 1
                if sub.statistics().rejoins != rejoins:
                    rejoins = sub.statistics().rejoins
                    report("rejoin", value=value, t=time.time(), rejoins=rejoins)

        task = asyncio.ensure_future(take())
        report("ready", subscriber_id=sub.id)
        async for command in commands():
            if command == "status":
                report(
                    "status",
                    **state,
                    stats=dataclasses.asdict(sub.statistics()),
                    channels=[[c.transport, c.statistics.rejoins] for c in ctx.channels],
                    lines=caught.lines,
                )
        task.cancel()


async def publish(args: dict[str, Any]) -> None:
    """Publish 0, 1, 2, ... on ``topic`` every 10 ms until stdin closes."""
    async with ezflow.GraphContext(tuple(args["address"]), auto_start=False) as ctx:
        pub = await ctx.publisher(args["topic"])
        report("ready", publisher_id=pub.id)

        async def run() -> None:
            i = 0
            while True:
                await pub.publish(i)
                i += 1
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(run())
        async for _ in commands():
            pass
        task.cancel()


ROLES = {"subscribe": subscribe, "stream": stream, "publish": publish}

if __name__ == "__main__":
    role, raw = sys.argv[1], sys.argv[2]
    ezflow.lowlevel.run_coroutine(ROLES[role](json.loads(raw)))
