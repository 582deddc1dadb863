"""Child-process roles for tests/test_liveness.py.

Run as ``python tests/_liveness_peers.py ROLE JSON_ARGS``; reports one JSON object per
line on stdout (``{"event": ...}``), like tests/_children.py, and is driven with
:class:`_proc.Child`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
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
        report("done", errors=errors, taken=sub.stats.taken)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


ROLES = {"subscribe": subscribe}

if __name__ == "__main__":
    role, raw = sys.argv[1], sys.argv[2]
    ezflow.run_coroutine(ROLES[role](json.loads(raw)))
