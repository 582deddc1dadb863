"""Child-process roles for the multi-process tests.

Run as ``python tests/_children.py ROLE JSON_ARGS``. A child reports on stdout, one JSON
object per line (``{"event": ...}``); the parent drives it with :class:`Child` from
``tests/_proc.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import hashlib
import json
import logging
import os
import signal
import sys
import time
from typing import Any

import numpy as np

import ezflow
from ezflow._core import _compiled
from ezflow._core._codec import Codec


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def payload(i: int, size: int) -> np.ndarray:
    """Message *i*: float64 array of *size* elements, element 0 is i, the rest derived."""
    data = np.arange(i, i + size, dtype=np.float64)
    data[0] = i
    return data


def check(message: Any, i: int, size: int) -> bool:
    return (
        isinstance(message, np.ndarray)
        and message.shape == (size,)
        and bool(np.array_equal(message, payload(i, size)))
    )


# Bytes 0, 1, ..., 255, 0, 1, ...: mixed-size payloads are slices of it (no per-message
# generation cost, even at 4 MiB).
_PATTERN = np.arange(4 * 1024 * 1024 + 256, dtype=np.uint8)


def mixed_payload(i: int, sizes: list[int]) -> np.ndarray:
    """Message *i* of a mixed-size stream: ``sizes[i % len(sizes)]`` bytes of the pattern,
    starting at ``i % 251`` (so that neighbouring messages differ)."""
    start = i % 251
    return _PATTERN[start : start + sizes[i % len(sizes)]]


def check_mixed(message: Any, i: int, sizes: list[int]) -> bool:
    return isinstance(message, np.ndarray) and bool(
        np.array_equal(message, mixed_payload(i, sizes))
    )


def shm_location(array: np.ndarray) -> list[Any] | None:
    """Where *array*'s data lives in this process: ``[file, offset in that file]`` from
    /proc/self/maps, or None for anonymous memory."""
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                path = fields[5].strip() if len(fields) > 5 else ""
                if not path.startswith("/"):  # anonymous, [heap], [stack], ...
                    return None
                return [path, int(fields[2], 16) + address - start]
    return None


@ezflow.message(name="tests.LoanedFrame")
@dataclasses.dataclass
class LoanedFrame:
    """A registered message class for the loan tests (same wire name in every process)."""

    head: Any
    frame: Any
    tail: Any


def arrays_in(message: Any) -> list[np.ndarray]:
    """Every numpy array in *message* (tuples, lists, dict keys and values, dataclass
    fields), depth first in encoding order: the same order on both sides of a hop."""
    found: list[np.ndarray] = []

    def walk(obj: Any) -> None:
        if isinstance(obj, np.ndarray):
            found.append(obj)
        elif isinstance(obj, (tuple, list)):
            for item in obj:
                walk(item)
        elif isinstance(obj, dict):
            for key, value in obj.items():
                walk(key)
                walk(value)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for field in dataclasses.fields(obj):
                walk(getattr(obj, field.name))

    walk(message)
    return found


def digest(message: Any) -> str:
    """Hash of *message*'s encoding: equal for messages that decode alike."""
    return hashlib.sha256(Codec().encode(message).to_bytes()).hexdigest()


async def subscribers(args: dict[str, Any]) -> None:
    """K subscribers on one topic in this process; each expects `count` messages
    0..count-1 (of `size` elements) from one publisher, in order."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        subs = [
            await ctx.subscriber(args["topic"], transport=args.get("transport"))
            for _ in range(args["subs"])
        ]
        report("ready")
        count, size, sizes = args["count"], args.get("size", 0), args.get("sizes")
        errors: list[str] = []
        same_object = True

        async def consume(index: int, sub: ezflow.Subscriber, seen: list[Any]) -> None:
            for i in range(count):
                message = await sub.recv()
                if not (check_mixed(message, i, sizes) if sizes else check(message, i, size)):
                    errors.append(f"subscriber {index} message {i}: got {message!r:.80}")
                    return
                if message.flags.writeable:
                    errors.append(f"subscriber {index} message {i} is writeable")
                    return
                if i % 97 == 0:  # a sample of messages, to compare identity across subscribers
                    seen.append(message)

        seen: list[list[Any]] = [[] for _ in subs]
        await asyncio.gather(*(consume(k, s, seen[k]) for k, s in enumerate(subs)))
        for column in zip(*seen, strict=True):
            if any(m is not column[0] for m in column):
                same_object = False
        channels = ctx.channels
        report(
            "done",
            errors=errors,
            received=[s.statistics().taken for s in subs],
            same_object=same_object,
            channels=len(channels),
            decoded=[c.statistics.decoded for c in channels],
            transports=[c.transport for c in channels],
        )
        await wait_for_stdin_close()


async def locate(args: dict[str, Any]) -> None:
    """Receive one array; report where its data lives (see shm_location) and its sum."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"], transport=args.get("transport"))
        report("ready")
        message = await sub.recv()
        report(
            "located",
            where=shm_location(message),
            total=int(message.sum(dtype=np.uint64)),
            transports=[c.transport for c in ctx.channels],
        )
        await wait_for_stdin_close()


async def describe(args: dict[str, Any]) -> None:
    """Receive messages until stdin closes; report each one's digest and, for each of
    its arrays (see arrays_in), where its data lives, whether it is writeable and its
    address modulo 16. Keeps the last `keep` messages (default 0)."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"], transport=args.get("transport"))
        report("ready")
        kept: list[Any] = []

        async def receive() -> None:
            while True:
                try:
                    message = await sub.recv()
                except ezflow.EndOfStream:
                    continue  # one test's publisher ended; the next one's may come
                arrays = arrays_in(message)
                report(
                    "message",
                    digest=digest(message),
                    where=[shm_location(a) for a in arrays],
                    writeable=[bool(a.flags.writeable) for a in arrays],
                    misaligned=[a.__array_interface__["data"][0] % 16 for a in arrays],
                    transports=[c.transport for c in ctx.channels],
                )
                kept.append(message)
                del kept[: len(kept) - args.get("keep", 0)]
                del message, arrays

        receiving = asyncio.ensure_future(receive())
        await wait_for_stdin_close()
        receiving.cancel()


async def publish_loaned(args: dict[str, Any]) -> None:
    """Publish one `(phase, seq, t_ns, frame)` tuple whose frame is loaned (filled with
    i % 251 at flat index i); report where the frame lives; idle until killed."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        pub = await ctx.publisher(args["topic"])
        report("ready", publisher_id=pub.id)
        await pub.wait_for_channels(1)
        frame = await pub.loan(tuple(args["shape"]))
        frame.reshape(-1)[:] = np.arange(frame.size) % 251
        await pub.publish(("phase", 1, 2, frame))
        stats = pub.shm_statistics()
        report(
            "published",
            where=shm_location(frame),
            loans_published=None if stats is None else stats.loans_published,
        )
        await wait_for_stdin_close()


async def collect(args: dict[str, Any]) -> None:
    """One subscriber; report every message's first element until `count` arrived."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"], transport=args.get("transport"))
        report("ready")
        values = []
        for _ in range(args["count"]):
            message = await sub.recv()
            values.append(message.tolist() if isinstance(message, np.ndarray) else message)
        report("done", values=values)
        await wait_for_stdin_close()


async def publish_ints(args: dict[str, Any]) -> None:
    """Publish 0..count-1 as fast as it can once a channel is connected, then close the
    publisher (its end of stream goes out); idle until stdin closes."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        pub = await ctx.publisher(args["topic"])
        report("ready", publisher_id=pub.id)
        await pub.wait_for_channels(1)
        await asyncio.to_thread(sys.stdin.readline)  # the parent says go
        for i in range(args["count"]):
            await pub.publish(i)
        await pub.aclose()
        report("done")
        await wait_for_stdin_close()


async def publish(args: dict[str, Any]) -> None:
    """Publish `count` payload messages (optionally tagged) once `channels` are
    connected; then idle until stdin closes."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        pub = await ctx.publisher(args["topic"], transport=args.get("transport"))
        report("ready", publisher_id=pub.id)
        await pub.wait_for_channels(args.get("channels", 1))
        tag = args.get("tag")
        for i in range(args["count"]):
            if tag is None:
                await pub.publish(payload(i, args["size"]))
            else:
                await pub.publish(np.array([tag, i], dtype=np.int64))
            if args.get("pace"):
                await asyncio.sleep(args["pace"])
        # (whether each link hands off the CPU after a paced publish: a channel on this host)
        handoff = [link.handoff for link in pub._outlet.links]
        report("done", seq=pub.statistics().messages, handoff=handoff)
        await wait_for_stdin_close()


async def publish_forever(args: dict[str, Any]) -> None:
    """Publish an increasing counter forever (until killed)."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        pub = await ctx.publisher(args["topic"], transport=args.get("transport"))
        report("ready", publisher_id=pub.id)
        i = 0
        size = args.get("size", 1)
        while True:
            await pub.publish(np.full(size, i, dtype=np.int64))
            i += 1
            await asyncio.sleep(args.get("pace", 0.001))


async def subscribe_forever(args: dict[str, Any]) -> None:
    """Subscribe and receive (slowly if asked) forever, until killed."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"], transport=args.get("transport"))
        report("ready", subscriber_id=sub.id)
        async for _ in sub:
            if args.get("stall"):
                await asyncio.sleep(3600)


async def progress(args: dict[str, Any]) -> None:
    """Subscribe; report how many messages arrived (and the latest) every 0.1 s."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"])
        report("ready", subscriber_id=sub.id)
        state = {"n": 0, "last": None}

        async def tick() -> None:
            while True:
                await asyncio.sleep(0.1)
                report("progress", n=state["n"], last=state["last"])

        async def count() -> None:
            async for message in sub:
                state["n"] += 1
                state["last"] = int(message[0])

        # Until stdin closes (the parent's cue): then the context closes cleanly.
        tasks = [asyncio.ensure_future(c) for c in (tick(), count())]
        try:
            await wait_for_stdin_close()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def collect_slowly(args: dict[str, Any]) -> None:
    """Receive until the stream ends, `delay` seconds per message; report the values."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"])
        report("ready", subscriber_id=sub.id)
        values = []
        async for message in sub:
            values.append(int(message))
            await asyncio.sleep(args.get("delay", 0.002))
        report("done", values=values)
        await wait_for_stdin_close()


async def consume_slowly(args: dict[str, Any]) -> None:
    """Receive until the stream ends, `delay` seconds per message, reporting how many
    arrived every 0.1 s; then report them all (the first element of each array) and the
    time from the first to the last."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"])
        report("ready", subscriber_id=sub.id)
        values: list[int] = []
        loop = asyncio.get_running_loop()
        first = last = 0.0

        async def tick() -> None:
            while True:
                await asyncio.sleep(0.1)
                report("progress", n=len(values))

        ticking = asyncio.ensure_future(tick())
        async for message in sub:
            values.append(int(message[0]))
            first = first or loop.time()
            last = loop.time()
            await asyncio.sleep(args["delay"])
        ticking.cancel()
        report("done", values=values, elapsed=last - first)
        await wait_for_stdin_close()


async def publish_until_closed(args: dict[str, Any]) -> None:
    """Publish an increasing counter every `pace` seconds until stdin closes."""
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        pub = await ctx.publisher(args["topic"])
        report("ready", publisher_id=pub.id)

        async def run() -> None:
            i = 0
            while True:
                await pub.publish(np.full(4, i, dtype=np.int64))
                i += 1
                await asyncio.sleep(args.get("pace", 0.002))

        task = asyncio.ensure_future(run())
        try:
            await wait_for_stdin_close()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def serve(args: dict[str, Any]) -> None:
    """A graph server on a free port; reports its address, runs until killed."""
    async with ezflow.GraphServer((args.get("host", "127.0.0.1"), 0)) as server:
        host, port = server.address
        report("ready", address=f"{host}:{port}", pid=os.getpid())
        await server.serve_forever()


# -- the compiled paths' edges: a blast of ordinary tuples, a peer killed or stalled ------


def count_compiled_paths() -> dict[str, int]:
    """Count what the compiled one-call publish and take do in this process (a counting
    wrapper around each, where ``Publisher.publish`` and ``Inbox.get`` look them up):
    ``{"publishes": n, "takes": n}``; both stay 0 on the pure-Python path."""
    from ezflow._core import _inbox  # noqa: PLC0415
    from ezflow._graph import _publisher  # noqa: PLC0415

    counts = {"publishes": 0, "takes": 0}
    publish_small, take_queued = _publisher._publish_small, _inbox.take_queued
    if publish_small is not None:

        def counting_publish(outlet: Any, message: Any) -> bool:
            took = publish_small(outlet, message)
            counts["publishes"] += took
            return took

        _publisher._publish_small = counting_publish  # type: ignore[assignment]
    if take_queued is not None:

        def counting_take(inbox: Any) -> Any:
            message = take_queued(inbox)
            counts["takes"] += message is not _inbox.NOTHING
            return message

        _inbox.take_queued = counting_take
    return counts


class LogLines(logging.Handler):
    """Every log record of this process (ezflow's DEBUG ones included), one line each."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        logging.getLogger().setLevel(logging.INFO)
        logging.getLogger().addHandler(self)
        logging.getLogger("ezflow").setLevel(logging.DEBUG)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


async def blast(args: dict[str, Any]) -> None:
    """The ordinary program's publisher: ``(0, seq, time_ns, float32 array)`` tuples back
    to back (``count`` of them, or until killed) once ``channels`` are connected,
    reporting its progress every 20 ms; then its statistics, what ``publish`` raised (if
    anything) and every log line. Idles until stdin closes."""
    compiled = count_compiled_paths()
    logs = LogLines()
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        pub = await ctx.publisher(args["topic"], transport=args["transport"])
        report("ready", publisher_id=pub.id, path=_compiled.active_path())
        await pub.wait_for_channels(args.get("channels", 1))
        arr = np.arange(16, dtype=np.float32)
        count = args.get("count")
        seq = 0

        async def tick() -> None:
            while True:
                report("progress", seq=seq, compiled=compiled["publishes"])
                await asyncio.sleep(0.02)

        ticking = asyncio.ensure_future(tick())
        error = None
        started = time.monotonic()
        try:
            while count is None or seq < count:
                await pub.publish((0, seq, time.time_ns(), arr))
                seq += 1
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        ticking.cancel()
        stats = pub.statistics()
        report(
            "done",
            sent=seq,
            error=error,
            seconds=time.monotonic() - started,
            compiled=compiled["publishes"],
            channels=pub.channels,
            waits=stats.waits,
            wait_seconds=stats.wait_seconds,
            drops=stats.drops,
            logs=logs.lines,
        )
        await wait_for_stdin_close()


async def receive_blast(args: dict[str, Any]) -> None:
    """The ordinary program's subscriber of :func:`blast`: ``recv()`` until ``count``
    messages or the end of the stream (stalling ``stall`` seconds after the
    ``stall_at``-th); report how many, the first and last seq, every gap or bad message,
    how it ended and what the compiled take took. With ``then``: one more ``recv()``
    after the end (a publisher that comes later), reported as ``after``."""
    compiled = count_compiled_paths()
    async with ezflow.GraphContext(args["address"], auto_start=False) as ctx:
        sub = await ctx.subscriber(args["topic"], transport=args.get("transport"))
        report("ready", subscriber_id=sub.id, path=_compiled.active_path())
        expected = np.arange(16, dtype=np.float32)
        count, stall_at = args.get("count"), args.get("stall_at")
        n, first, last, bad = 0, None, None, []
        ended = None
        try:
            while count is None or n < count:
                phase, seq, _, arr = await sub.recv()
                if first is None:
                    first = seq
                elif seq != last + 1 or phase != 0 or not np.array_equal(arr, expected):
                    bad.append([last, seq, phase])
                    del bad[10:]
                last, n = seq, n + 1
                if n == stall_at:
                    await asyncio.sleep(args["stall"])  # (no recv(): the window fills)
        except ezflow.EndOfStream:
            ended = "EndOfStream"
        except Exception as exc:
            ended = f"{type(exc).__name__}: {exc}"
        stats = sub.statistics()
        report(
            "done",
            n=n,
            first=first,
            last=last,
            bad=bad,
            ended=ended,
            takes=compiled["takes"],
            broken=stats.publishers_broken,
        )
        if args.get("then"):
            phase, seq, _, _ = await asyncio.wait_for(sub.recv(), 20)
            report("after", phase=phase, seq=seq)
        await wait_for_stdin_close()


async def wait_for_stdin_close() -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)


ROLES = {
    "subscribers": subscribers,
    "collect": collect,
    "locate": locate,
    "describe": describe,
    "publish_loaned": publish_loaned,
    "publish": publish,
    "publish_forever": publish_forever,
    "subscribe_forever": subscribe_forever,
    "serve": serve,
    "progress": progress,
    "consume_slowly": consume_slowly,
    "publish_until_closed": publish_until_closed,
    "collect_slowly": collect_slowly,
    "publish_ints": publish_ints,
    "blast": blast,
    "receive_blast": receive_blast,
}


def dump_tasks() -> None:
    """Every task's stack to stderr (SIGUSR2: tests/_proc.py sends it to a child that
    did not report an event in time, so the failure shows where it waits)."""
    tasks = asyncio.all_tasks()
    print(f"--- {sys.argv[1]} child {os.getpid()}: {len(tasks)} tasks ---", file=sys.stderr)
    for task in tasks:
        print(f"{task.get_name()}:", file=sys.stderr)
        awaited: Any = task.get_coro()
        while awaited is not None:  # (down the chain of awaits: where it waits)
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                code = frame.f_code
                print(f"  {code.co_filename}:{frame.f_lineno} {code.co_name}", file=sys.stderr)
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        print(f"  waiting on {task._fut_waiter!r}", file=sys.stderr)  # type: ignore[attr-defined]
    sys.stderr.flush()


async def run_role(role: str, args: dict[str, Any]) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, dump_tasks)
    await ROLES[role](args)


if __name__ == "__main__":
    role, raw = sys.argv[1], sys.argv[2]
    # SIGUSR1: every thread's stack, even with the event loop blocked (see dump_tasks)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ezflow.lowlevel.run_coroutine(run_role(role, json.loads(raw)))
