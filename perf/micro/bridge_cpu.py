"""CPU per message of the Zenoh bridge's two ends, against plain zenoh-python (loopback).

    .venv/bin/python perf/micro/bridge_cpu.py SIZE COUNT [SENDER RECEIVER]

SENDER and RECEIVER are ``bridge`` (a graph of its own: a publisher and a
``ZenohBridge`` export in one process; an import and a subscriber in the other, peer to
peer, lossless, as ``ezflow perf bridge``'s in-process path) or ``zenoh`` (plain
zenoh-python: a declared publisher putting a header and the payload; a callback that
copies each sample out). Prints msgs/s at the receiver and each process's CPU per
message (getrusage, every thread): the figure the machine's load does not decide.
``EZB_WRAP_sender="perf record -F 1999 -o /tmp/s.data --"`` runs the sender under
that command (likewise ``EZB_WRAP_receiver``). Set ``EZB_PROFILE=sender`` (or
``receiver``) to run that end under py-spy (``--native``, to /tmp/bridge_cpu_<end>.txt).

``EZB_PACE=0.002`` (bridge -> bridge only) paces the messages that many seconds apart
and prints the receiver's one-way p50/p90 (CLOCK_MONOTONIC, shared by the processes);
with ``EZB_STAGES=1`` too, the median time after the publisher's clock at which each
message reached each stage of the path (wrappers around the export's ``_send`` and
``_submit``, the import's Zenoh callback - entered and left -, its loop wake, its
``_handle`` and the local ``publish_encoded_many``, then ``recv()`` returning).
"""

# ruff: noqa: PLC0415 - each role imports what it measures, in its own process
from __future__ import annotations

import asyncio
import json
import os
import resource
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

PORT = 7499
KEY = "bench/cpu"
_HEADER = struct.Struct("<BqQ")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _threads() -> dict[str, int]:
    """CPU ns of each live thread of this process, by name (``main``; Python's threads
    are ``python-<tid>``; Zenoh's have names of their own: tx-0, rx-0, ...)."""
    found: dict[str, int] = {}
    pid = os.getpid()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                name = comm.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                ns = int(stat.read().split()[0])
        except (OSError, ValueError):
            continue
        name = "main" if int(tid) == pid else (f"{name}-{tid}" if name == "python" else name)
        found[name] = found.get(name, 0) + ns
    return found


def _per_thread(before: dict[str, int], count: int) -> dict[str, float]:
    after = _threads()
    used = {name: (ns - before.get(name, 0)) / 1e3 / count for name, ns in after.items()}
    return {name: round(us, 1) for name, us in sorted(used.items()) if us >= 0.1}


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _report_sender(
    used: float, faults: int, threads: dict[str, int], count: int, stages: Any = None
) -> None:
    """The sending side's line: CPU, page faults and per-thread CPU a message (and the
    stage times of a paced run)."""
    print(
        json.dumps(
            {
                "sender_cpu_us": used / count * 1e6,
                "sender_faults": faults / count,
                "sender_threads": _per_thread(threads, count),
                "sender_stages": stages or {},
            }
        ),
        flush=True,
    )


def _session(listen: bool) -> Any:
    import zenoh

    config = zenoh.Config()
    config.insert_json5("mode", '"peer"')
    config.insert_json5("scouting/multicast/enabled", "false")
    config.insert_json5("transport/shared_memory/enabled", "false")
    endpoint = json.dumps([f"tcp/127.0.0.1:{PORT}"])
    config.insert_json5("listen/endpoints" if listen else "connect/endpoints", endpoint)
    return zenoh.open(config)


def zenoh_send(size: int, count: int) -> None:
    import zenoh

    session = _session(listen=True)
    publisher = session.declare_publisher(
        KEY,
        congestion_control=zenoh.CongestionControl.BLOCK,
        reliability=zenoh.Reliability.RELIABLE,
    )
    print("ready", flush=True)
    sys.stdin.readline()
    payload = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8).tobytes()
    start, faults, threads = _cpu(), _faults(), _threads()
    for seq in range(count):
        publisher.put(_HEADER.pack(0, seq, time.monotonic_ns()) + payload)
    publisher.put(_HEADER.pack(2, 0, 0))
    used, faults = _cpu() - start, _faults() - faults
    sys.stdin.readline()
    _report_sender(used, faults, threads, count)
    session.close()


def zenoh_receive(size: int, count: int) -> None:
    import zenoh

    session = _session(listen=False)
    state: dict[str, Any] = {"first": 0.0, "n": 0, "cpu": 0.0, "faults": 0}
    done = threading.Event()

    def on_sample(sample: Any) -> None:
        body = sample.payload.to_bytes()
        phase = body[0]
        if phase == 0:
            if not state["n"]:
                state["first"], state["cpu"], state["faults"] = time.monotonic(), _cpu(), _faults()
                state["threads"] = _threads()
            state["n"] += 1
        else:
            state["last"], state["cpu"] = time.monotonic(), _cpu() - state["cpu"]
            state["faults"] = _faults() - state["faults"]
            state["threads"] = _per_thread(state["threads"], state["n"])
            done.set()

    session.declare_subscriber(KEY, zenoh.handlers.Callback(on_sample, indirect=False))
    print("ready", flush=True)
    done.wait(300)
    n = state["n"]
    print(
        json.dumps(
            {
                "msgs_per_s": n / (state["last"] - state["first"]),
                "receiver_cpu_us": state["cpu"] / n * 1e6,
                "receiver_faults": state["faults"] / n,
                "receiver_threads": state["threads"],
            }
        ),
        flush=True,
    )
    session.close()


async def bridge_send(size: int, count: int) -> None:
    import ezflow
    from ezflow.zenoh import Export, ZenohBridge, ZenohSettings

    settings = ZenohSettings(mode="peer", listen=(f"tcp/127.0.0.1:{PORT}",))
    async with (
        ezflow.GraphContext("127.0.0.1:0") as ctx,
        ZenohBridge(ctx, settings, exports=[Export("/cpu", KEY, lossless=True)]) as bridge,
    ):
        pub = await ctx.publisher("/cpu")
        await pub.wait_for_channels(1)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        payload = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
        start, faults, threads = _cpu(), _faults(), _threads()
        for seq in range(count):
            await pub.publish((0, seq, time.monotonic_ns(), payload))
            if PACE:
                await asyncio.sleep(PACE)
        await pub.publish((2, 0, 0, payload[:1]))
        await asyncio.to_thread(sys.stdin.readline)
        used, faults = _cpu() - start, _faults() - faults
        _report_sender(used, faults, threads, count, _STAGES)
        stats = next(iter(bridge.summary().values()))
        print("  export:", {k: stats.get(k) for k in ("messages", "samples")}, file=sys.stderr)


async def bridge_receive(size: int, count: int) -> None:
    import ezflow
    from ezflow.zenoh import Import, ZenohBridge, ZenohSettings

    settings = ZenohSettings(mode="peer", connect=(f"tcp/127.0.0.1:{PORT}",))
    async with (
        ezflow.GraphContext("127.0.0.1:0") as ctx,
        ZenohBridge(ctx, settings, imports=[Import(KEY, "/cpu", lossless=True)]),
    ):
        sub = await ctx.subscriber("/cpu")
        print("ready", flush=True)
        n, first, cpu, faults = 0, 0.0, 0.0, 0
        while True:
            phase, _, sent, _ = await sub.recv()
            if phase == 0 and PACE:
                _STAGES.setdefault("recv_ret", []).append(time.monotonic_ns())
                _STAGES.setdefault("t0", []).append(sent)
            if phase == 0:
                if not n:
                    first, cpu, faults, threads = time.monotonic(), _cpu(), _faults(), _threads()
                n += 1
            else:
                break
        last, cpu, faults = time.monotonic(), _cpu() - cpu, _faults() - faults
        found = {"msgs_per_s": n / (last - first), "receiver_cpu_us": cpu / n * 1e6}
        found["receiver_threads"] = _per_thread(threads, n)
        if PACE:
            found["stages"] = _STAGES
        print(json.dumps({**found, "receiver_faults": faults / n}), flush=True)


PACE = float(os.environ.get("EZB_PACE", "0") or 0)
#: stage name -> CLOCK_MONOTONIC ns of each message's passage (EZB_STAGES)
_STAGES: dict[str, list[int]] = {}


def _install_stage_probes() -> None:
    """Wrap the functions a paced message passes through on either end (EZB_STAGES)."""
    import functools

    from ezflow._core import _outlet
    from ezflow._zenoh import _export, _import

    def mark(stage: str) -> None:
        _STAGES.setdefault(stage, []).append(time.monotonic_ns())

    def wrap(owner: Any, name: str, stage: str, *, leave: str = "") -> None:
        original = getattr(owner, name)
        if asyncio.iscoroutinefunction(original):

            @functools.wraps(original)
            async def probed(*args: Any, **kwargs: Any) -> Any:
                mark(stage)
                return await original(*args, **kwargs)

        else:

            @functools.wraps(original)
            def probed(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                mark(stage)
                try:
                    return original(*args, **kwargs)
                finally:
                    if leave:
                        mark(leave)

        setattr(owner, name, probed)

    wrap(_export.ExportRun, "_send", "export_send")
    wrap(_export.ExportRun, "_submit", "export_submit")
    wrap(_import.ImportRun, "_on_sample", "import_callback", leave="import_callback_left")
    wrap(_import, "_wake", "import_loop_woken")
    wrap(_import.ImportRun, "_handle", "import_handle")
    wrap(_outlet.Outlet, "publish_encoded_many", "import_publish")


def _report_stages(stages: dict[str, list[int]], sender: dict[str, list[int]]) -> None:
    import bisect
    import statistics

    starts = stages.pop("t0")
    latency = sorted(r - t for r, t in zip(stages["recv_ret"], starts, strict=True))
    print(
        f"  paced every {PACE * 1e3:g} ms: p50 {latency[len(latency) // 2] / 1e3:.1f} µs, "
        f"p90 {latency[int(len(latency) * 0.9)] / 1e3:.1f} µs (n={len(latency)})"
    )
    rows = []
    for stage, times in {**sender, **stages}.items():
        times.sort()
        after = []
        for t0 in starts[len(starts) // 10 :]:
            i = bisect.bisect_left(times, t0)
            if i < len(times) and times[i] - t0 < 10_000_000:
                after.append(times[i] - t0)
        if after:
            rows.append((statistics.median(after) / 1e3, stage))
    for median, stage in sorted(rows):
        print(f"    {stage:22s} {median:7.1f} µs after the publisher's clock")


def _start(role: str, end: str, size: int, count: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, __file__, "--role", role, end, str(size), str(count)]
    if os.environ.get("EZB_PROFILE") == end:
        spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        argv = [spy, "record", "--native", "-f", "raw", "-o", f"/tmp/bridge_cpu_{end}.txt"]
        argv += [*os.environ.get("EZB_SPY_ARGS", "").split(), "--"]
        argv += [sys.executable, __file__, "--role", role, end, str(size), str(count)]
    wrap = os.environ.get(f"EZB_WRAP_{end}")  # e.g. "perf record -F 1999 -o /tmp/s.data --"
    if wrap:
        argv = [*wrap.split(), *argv]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    while b"ready" not in proc.stdout.readline():
        if proc.poll() is not None:
            raise RuntimeError(f"{role} {end} exited")
    return proc


def main() -> None:
    if sys.argv[1] == "--role":
        role, end, size, count = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        if role == "zenoh":
            (zenoh_send if end == "sender" else zenoh_receive)(size, count)
        else:
            import ezflow

            coroutine = bridge_send if end == "sender" else bridge_receive
            if PACE and os.environ.get("EZB_STAGES"):
                _install_stage_probes()
            ezflow.lowlevel.run_coroutine(coroutine(size, count))
        return
    size, count = int(sys.argv[1]), int(sys.argv[2])
    sender_role, receiver_role = (
        (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else ("bridge",) * 2
    )
    sender = _start(sender_role, "sender", size, count)
    receiver = _start(receiver_role, "receiver", size, count)
    time.sleep(1.0)  # Zenoh routes the subscriber to the publisher
    assert sender.stdin is not None and sender.stdout is not None
    assert receiver.stdout is not None
    sender.stdin.write(b"go\n")
    sender.stdin.flush()
    got = json.loads(receiver.stdout.readline())
    sender.stdin.write(b"done\n")
    sender.stdin.close()
    got.update(json.loads(sender.stdout.readline()))
    for proc in (sender, receiver):
        proc.wait(30)
    for end in ("sender", "receiver"):
        print(f"  {end} threads (µs/msg):", got[f"{end}_threads"])
    if "stages" in got:
        _report_stages(got["stages"], got.get("sender_stages") or {})
    print(
        f"{sender_role}->{receiver_role} {size} B x {count}: {got['msgs_per_s']:,.0f} msgs/s, "
        f"CPU/msg sender {got['sender_cpu_us']:.1f} µs, receiver {got['receiver_cpu_us']:.1f} µs; "
        f"page faults/msg sender {got['sender_faults']:.1f}, receiver {got['receiver_faults']:.1f}"
    )


if __name__ == "__main__":
    main()
