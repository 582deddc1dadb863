"""Where a paced 64 B message's one-way time goes: the ordinary program (a tuple,
``asyncio.run``, ``await sub.recv()``) between two processes, one message every
``PACE`` seconds (default 0.001), with stage timestamps (CLOCK_MONOTONIC, shared by
the two processes) taken by wrappers around the functions a message passes through.

    python perf/micro/paced_stages.py shm|tcp N

Prints the p50/p90 one-way latency without the probes, then with them, and for each
stage the median time after the publisher read its clock (the message's ``t_ns``):

* ``write`` / ``write_ret``: the publisher's ``VectoredWriter.write`` called / returned
  (the one system call of a paced message);
* ``epoll_ret``: the subscriber's selector returned with events;
* ``buffer_updated`` / ``buffer_updated_ret``: its channel connection given the read
  bytes / done with them;
* ``recv_ret``: ``await sub.recv()`` returned (inside ``buffer_updated``: the channel
  runs the woken task at once, ``run_lone_wake``);
* ``pub_ret``: ``await pub.publish()`` returned (after the paced handoff, so after the
  subscriber ran).

The probes cost ~0.3 µs each. perf/HISTORY.md (the twelfth session) has a run.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import selectors
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

import ezflow

PACE = float(os.environ.get("PACE", "0.001"))
OUT = os.path.join(tempfile.gettempdir(), "ezflow_paced_stages_{}.json")
MARKS: dict[str, list[int]] = {}
mono = time.monotonic_ns


def mark(stage: str) -> None:
    MARKS.setdefault(stage, []).append(mono())


def install(role: str) -> None:
    if role == "sub":
        select = selectors.EpollSelector.select

        def probed_select(self: Any, timeout: float | None = None) -> Any:
            events = select(self, timeout)
            if events and timeout != 0:
                mark("epoll_ret")
            return events

        selectors.EpollSelector.select = probed_select  # type: ignore[method-assign]
        from ezflow._transports import _stream_channel

        updated = _stream_channel.ChannelConnection.buffer_updated

        def probed_updated(self: Any, nbytes: int) -> None:
            mark("buffer_updated")
            updated(self, nbytes)
            mark("buffer_updated_ret")

        _stream_channel.ChannelConnection.buffer_updated = probed_updated  # type: ignore[method-assign]
    else:
        from ezflow._transports import _writer

        write = _writer.VectoredWriter.write

        def probed_write(self: Any, data: Any) -> None:
            mark("write")
            write(self, data)
            mark("write_ret")

        _writer.VectoredWriter.write = probed_write  # type: ignore[method-assign]


async def publisher(address: str, transport: str, count: int) -> None:
    async with ezflow.GraphContext(address, auto_start=False) as ctx:
        pub = await ctx.publisher("/paced", transport=transport)
        body = np.zeros(16, np.float32)
        await pub.wait_for_channels(1)
        await asyncio.sleep(0.5)
        due = time.monotonic()
        for seq in range(count):
            t_ns = mono()
            MARKS.setdefault("t0", []).append(t_ns)
            await pub.publish((0, seq, t_ns, body))
            mark("pub_ret")
            due += PACE
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        await pub.publish((1, -1, 0, body))
        with open(OUT.format("pub"), "w") as out:
            json.dump(MARKS, out)
        await asyncio.sleep(0.3)


async def subscriber(address: str, transport: str) -> None:
    async with ezflow.GraphContext(address, auto_start=False) as ctx:
        sub = await ctx.subscriber("/paced", transport=transport)
        latency = []
        while True:
            message = await sub.recv()
            now = mono()
            if message[0] == 1:
                break
            latency.append(now - message[2])
            MARKS.setdefault("recv_ret", []).append(now)
        with open(OUT.format("sub"), "w") as out:
            json.dump(MARKS, out)
        latency.sort()
        p50, p90 = latency[len(latency) // 2], latency[int(len(latency) * 0.9)]
        print(f"p50 {p50 / 1e3:.1f} µs, p90 {p90 / 1e3:.1f} µs", flush=True)


async def run(transport: str, count: int, probes: bool) -> None:
    async with ezflow.GraphServer(("127.0.0.1", 0)) as server:
        address = "%s:%d" % server.address
        env = {**os.environ, "PACED_STAGES_PROBES": "1" if probes else ""}
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable, __file__, transport, str(count), "--role", role, address, env=env
            )
            for role in ("sub", "pub")
        ]
        for proc in procs:
            await proc.wait()


def report(skip: int = 200) -> None:
    with open(OUT.format("pub")) as pub, open(OUT.format("sub")) as sub:
        marks = {**json.load(pub), **json.load(sub)}
    starts = marks.pop("t0")[skip:]
    rows = []
    for stage, times in marks.items():
        times.sort()
        after = []
        for t0 in starts:
            i = bisect.bisect_left(times, t0)
            if i < len(times) and times[i] - t0 < 1_000_000:
                after.append(times[i] - t0)
        if after:
            rows.append((statistics.median(after) / 1e3, stage, len(after)))
    for median, stage, n in sorted(rows):
        print(f"  {stage:20s} {median:7.1f} µs after the publisher's clock (n={n})")


def main() -> None:
    if "--role" in sys.argv:
        i = sys.argv.index("--role")
        role, address = sys.argv[i + 1], sys.argv[i + 2]
        if os.environ.get("PACED_STAGES_PROBES"):
            install(role)
        if role == "pub":
            asyncio.run(publisher(address, sys.argv[1], int(sys.argv[2])))
        else:
            asyncio.run(subscriber(address, sys.argv[1]))
        return
    transport, count = sys.argv[1], int(sys.argv[2])
    print("without probes: ", end="", flush=True)
    asyncio.run(run(transport, count, probes=False))
    print("with probes:    ", end="", flush=True)
    asyncio.run(run(transport, count, probes=True))
    report()


if __name__ == "__main__":
    main()
