"""Across two hosts: through the Zenoh bridge vs direct ezflow tcp, same run.

``ezflow perf bridge`` (root and iproute2: two network namespaces joined by a veth pair
stand for two hosts; needs ``ezflow-pubsub[zenoh]``). ``python -m ezflow._perf._zenoh_bridge``
is the same, kept as an alias (and runs the two roles, ``--role``, in the namespaces).

* **direct**: one graph server on host A (on the link's address, with a token); the
  publisher on A and the subscriber on B are both its clients, so the data goes over
  ezflow's tcp transport from A to B.
* **bridge**: a graph server per host on its own loopback, a Zenoh router on A, a bridge
  per host (``ezflow zenoh bridge``, lossless): A exports the topic, B imports it.
* **in-process**: a graph server per host, and each host's bridge inside the publishing
  and the subscribing process (``ZenohBridge`` on their own context, lossless), Zenoh
  peer to peer without a router (docs/fleets.md: "A bridge in your own process").
* **zenoh**: the reference, no ezflow at all: plain zenoh-python peer to peer, a header
  and the payload's bytes put by a declared publisher, taken by a callback that copies
  them out - the floor of any path through zenoh-python.

The message is what users write: a tuple ``(phase, seq, t_ns, payload)`` with a numpy
payload of the given size. Latency: 300 messages paced 5 ms apart, publish → ``recv``
on CLOCK_MONOTONIC (the namespaces share one kernel clock); throughput: a burst (20,000 x
64 B, 300 x 1 MiB), msgs/s at the receiver; CPU: each process's CPU time (every thread,
/proc/PID/task/*/schedstat) from the sender's first burst message to the receiver's
result, per burst message. Prints the medians of the rounds with their spread (min-max),
each path's CPU per message by process, its ratios to direct tcp and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

__all__ = ["BridgeError", "check_environment", "main", "run"]

HOST_A, HOST_B = "10.79.0.1", "10.79.0.2"
PACED, PACE = 300, 0.005
BURST = {64: 20000, 1 << 20: 300}
#: What is measured, in each round: direct ezflow tcp; the bridge as separate processes
#: through a router; the bridge inside the publishing and subscribing processes, peer to
#: peer (docs/fleets.md: "A bridge in your own process"); and, for reference, plain
#: zenoh-python peer to peer without ezflow (the floor of any path through Zenoh).
PATHS = ("direct", "bridge", "in-process", "zenoh")


class BridgeError(RuntimeError):
    """What the benchmark needs is missing, or a measurement failed."""


def check_environment() -> None:
    """Raise :class:`BridgeError` naming what is missing: root, ``ip``, Zenoh."""
    if os.geteuid() != 0:
        raise BridgeError(
            "needs root to make two network namespaces: run it with sudo "
            '(sudo "$(command -v ezflow)" perf bridge)'
        )
    if shutil.which("ip") is None:
        raise BridgeError("needs iproute2's `ip` command on PATH (e.g. apt install iproute2)")
    if importlib.util.find_spec("zenoh") is None:  # (the bridge processes import it)
        raise BridgeError("needs Eclipse Zenoh: pip install 'ezflow-pubsub[zenoh]'")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _sweep_stale() -> None:
    """Delete the namespaces of a run that was killed (named after its pid, now gone):
    namespaces are not files, nothing else would."""
    listed = subprocess.run(
        ["ip", "netns", "list"], check=False, capture_output=True, text=True, timeout=10
    )
    for line in listed.stdout.splitlines():
        found = re.fullmatch(r"(ezbench-[ab](\d+))\b.*", line)
        if found is None:
            continue
        try:
            os.kill(int(found[2]), 0)
        except ProcessLookupError:
            subprocess.run(["ip", "netns", "del", found[1]], check=False, capture_output=True)
        except OSError:
            pass  # (alive, another user's)


@contextlib.contextmanager
def _namespaces() -> Any:
    _sweep_stale()
    tag = os.getpid()  # (device names: at most 15 characters)
    a, b, va, vb = f"ezbench-a{tag}", f"ezbench-b{tag}", f"ezba{tag}", f"ezbb{tag}"
    _ip("netns", "add", a)
    try:
        _ip("netns", "add", b)
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", a)
        _ip("link", "set", vb, "netns", b)
        for ns, dev, addr in ((a, va, HOST_A), (b, vb, HOST_B)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


# -- the two roles, run inside a namespace ------------------------------------------------


@contextlib.asynccontextmanager
async def _in_process_bridge(ctx: Any, topic: str, peer: str | None, export: bool) -> Any:
    """With *peer* (an endpoint), this process's own bridge, in Zenoh peer mode: an
    export listening on *peer*, or an import connecting to it; without, nothing."""
    if peer is None:
        yield
        return
    from ezflow.zenoh import Export, Import, ZenohBridge, ZenohSettings  # noqa: PLC0415

    if export:
        settings = ZenohSettings(mode="peer", listen=(peer,))
        mappings: dict[str, Any] = {"exports": [Export(topic, "bench/data", lossless=True)]}
    else:
        settings = ZenohSettings(mode="peer", connect=(peer,))
        mappings = {"imports": [Import("bench/data", topic, lossless=True)]}
    async with ZenohBridge(ctx, settings, **mappings):
        yield


async def _send(address: str, topic: str, size: int, peer: str | None = None) -> None:
    import ezflow  # noqa: PLC0415 - a role of this module, in its own process

    async with (
        ezflow.GraphContext(address, auto_start=False) as ctx,
        _in_process_bridge(ctx, topic, peer, export=True),
    ):
        pub = await ctx.publisher(topic)
        await pub.wait_for_channels(1)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the receiver is ready too
        payload = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
        for seq in range(PACED):
            await pub.publish((1, seq, time.monotonic_ns(), payload))
            await asyncio.sleep(PACE)
        print("burst", flush=True)  # (the CPU of the burst is measured from here)
        for seq in range(BURST[size]):
            await pub.publish((0, seq, time.monotonic_ns(), payload))
        await pub.publish((2, 0, 0, payload[:1]))
        await asyncio.to_thread(sys.stdin.readline)


async def _receive(address: str, topic: str, size: int, peer: str | None = None) -> None:
    import ezflow  # noqa: PLC0415 - a role of this module, in its own process

    async with (
        ezflow.GraphContext(address, auto_start=False) as ctx,
        _in_process_bridge(ctx, topic, peer, export=False),
    ):
        sub = await ctx.subscriber(topic)
        print("ready", flush=True)
        latencies, first, count = [], 0, 0
        while True:
            phase, _, sent, _ = await sub.recv()
            now = time.monotonic_ns()
            if phase == 1:
                latencies.append(now - sent)
            elif phase == 0:
                first = first or now
                count += 1
            else:
                break
        ordered = sorted(latencies[len(latencies) // 10 :])  # the first ones warm up
        print(
            json.dumps(
                {
                    "p50_us": ordered[len(ordered) // 2] / 1e3,
                    "msgs_per_s": count / max(1e-9, (now - first) / 1e9),
                }
            ),
            flush=True,
        )


def _zenoh_session(peer: str, listen: bool) -> Any:
    import zenoh  # noqa: PLC0415 - the reference roles only

    config = zenoh.Config()
    config.insert_json5("mode", '"peer"')
    config.insert_json5("scouting/multicast/enabled", "false")
    config.insert_json5("transport/shared_memory/enabled", "false")
    config.insert_json5("listen/endpoints" if listen else "connect/endpoints", json.dumps([peer]))
    return zenoh.open(config)


_HEADER = struct.Struct("<BqQ")  # phase, seq, t_ns: the reference rows' messages


def _zenoh_send(peer: str, size: int) -> None:
    """The reference: plain zenoh-python, no ezflow - a declared publisher (reliable,
    blocking) putting a header and *size* bytes, as the bridge puts."""
    import zenoh  # noqa: PLC0415 - the reference roles only

    session = _zenoh_session(peer, listen=True)
    try:
        publisher = session.declare_publisher(
            "bench/zenoh",
            congestion_control=zenoh.CongestionControl.BLOCK,
            reliability=zenoh.Reliability.RELIABLE,
        )
        print("ready", flush=True)
        sys.stdin.readline()
        payload = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8).tobytes()
        for seq in range(PACED):
            publisher.put(_HEADER.pack(1, seq, time.monotonic_ns()) + payload)
            time.sleep(PACE)
        print("burst", flush=True)  # (the CPU of the burst is measured from here)
        for seq in range(BURST[size]):
            publisher.put(_HEADER.pack(0, seq, time.monotonic_ns()) + payload)
        publisher.put(_HEADER.pack(2, 0, 0))
        sys.stdin.readline()
    finally:
        session.close()


def _zenoh_receive(peer: str) -> None:
    """The reference's receiver: a callback on Zenoh's thread that copies each payload
    out (``to_bytes``), as the bridge's import does."""
    import zenoh  # noqa: PLC0415 - the reference roles only

    session = _zenoh_session(peer, listen=False)
    latencies: list[int] = []
    state = {"first": 0, "count": 0, "last": 0}
    done = threading.Event()

    def on_sample(sample: Any) -> None:
        body = sample.payload.to_bytes()
        now = time.monotonic_ns()
        phase, _, sent = _HEADER.unpack_from(body)
        if phase == 1:
            latencies.append(now - sent)
        elif phase == 0:
            state["first"] = state["first"] or now
            state["count"] += 1
        else:
            state["last"] = now
            done.set()

    try:
        session.declare_subscriber(
            "bench/zenoh", zenoh.handlers.Callback(on_sample, indirect=False)
        )
        print("ready", flush=True)
        done.wait(300)
        ordered = sorted(latencies[len(latencies) // 10 :])
        elapsed = max(1e-9, (state["last"] - state["first"]) / 1e9)
        print(
            json.dumps(
                {"p50_us": ordered[len(ordered) // 2] / 1e3, "msgs_per_s": state["count"] / elapsed}
            ),
            flush=True,
        )
        sys.stdin.readline()
    finally:
        session.close()


# -- orchestration ------------------------------------------------------------------------


def _in(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, *args]


@contextlib.asynccontextmanager
async def _process(argv: list[str], ready: str, env: dict[str, str]) -> AsyncIterator[Any]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    try:
        assert proc.stdout is not None
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            if not line:
                raise RuntimeError(f"{argv[4:]} exited before {ready!r}")
            if ready in line:
                proc.first_line = line  # type: ignore[attr-defined]
                break
        yield proc
    finally:
        # A role ends when its stdin closes (its context closes: no shared memory left
        # behind); commands end on SIGTERM; anything else is killed.
        role = "--role" in argv
        if role and proc.stdin is not None:
            proc.stdin.close()
        for stop in (None if role else proc.terminate, proc.terminate, proc.kill):
            if proc.returncode is not None:
                break
            if stop is not None:
                stop()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)


def _cpu_ns(pid: int) -> int:
    """CPU time (ns) of every live thread of process *pid* (its schedstat: finer than
    the clock ticks of getrusage)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{pid}/task/{task}/schedstat") as stat,
            ):
                total += int(stat.read().split()[0])
    return total


def _address(banner: str) -> str:
    found = re.search(r"listening on ([^\s,;]+)", banner)
    if found is None:
        raise RuntimeError(f"no address in the graph server's banner: {banner!r}")
    return found.group(1)


async def _serve(ns: str, host: str, env: dict[str, str]) -> Any:
    return _process(_in(ns, "-m", "ezflow", "serve", "-a", f"{host}:0"), "listening on", env)


async def _measure(a: str, b: str, path: str, size: int, env: dict[str, str]) -> dict[str, Any]:
    me = ["-m", "ezflow._perf._zenoh_bridge", "--role"]
    topic = "/bench"
    async with contextlib.AsyncExitStack() as stack:
        peer: list[str] = []
        others: dict[str, Any] = {}  # the path's other processes, by role
        if path == "direct":
            server = await stack.enter_async_context(await _serve(a, HOST_A, env))
            others["server"] = server
            address = _address(server.first_line)
            send_at, receive_at = address, address
        elif path == "zenoh":
            endpoint = f"tcp/{HOST_A}:7447"
            sender = await stack.enter_async_context(
                _process(_in(a, *me, "zsend", endpoint, topic, str(size)), "ready", env)
            )
            receiver = await stack.enter_async_context(
                _process(_in(b, *me, "zreceive", endpoint, topic, str(size)), "ready", env)
            )
            peer = [endpoint]
            await asyncio.sleep(1.0)  # Zenoh routes the subscriber to the publisher
        elif path == "in-process":
            addresses: list[str] = []
            for ns in (a, b):
                server = await stack.enter_async_context(await _serve(ns, "127.0.0.1", env))
                others[f"server {len(addresses) + 1}"] = server
                addresses.append(_address(server.first_line))
            send_at, receive_at = addresses
            peer = ["--peer", f"tcp/{HOST_A}:7447"]
            # The sender listens (its bridge's session), the receiver connects to it.
            sender = await stack.enter_async_context(
                _process(_in(a, *me, "send", send_at, topic, str(size), *peer), "ready", env)
            )
            receiver = await stack.enter_async_context(
                _process(_in(b, *me, "receive", receive_at, topic, str(size), *peer), "ready", env)
            )
            await asyncio.sleep(1.0)  # Zenoh routes the import to the export
        else:
            addresses = []
            for ns in (a, b):
                server = await stack.enter_async_context(await _serve(ns, "127.0.0.1", env))
                others[f"server {len(addresses) + 1}"] = server
                addresses.append(_address(server.first_line))
            router = f"tcp/{HOST_A}:7447"
            others["router"] = await stack.enter_async_context(
                _process(
                    _in(a, "-m", "ezflow", "zenoh", "router", "--listen", router), "listening", env
                )
            )
            for ns, where, mapping in (
                (a, addresses[0], ["--export", f"{topic}=bench/data"]),
                (b, addresses[1], ["--import", f"bench/data={topic}"]),
            ):
                others[
                    "exporter" if "--export" in mapping else "importer"
                ] = await stack.enter_async_context(
                    _process(
                        _in(
                            ns,
                            "-m",
                            "ezflow",
                            "zenoh",
                            "bridge",
                            "--connect",
                            router,
                            "-a",
                            where,
                            "--lossless",
                            *mapping,
                        ),
                        "export" if "--export" in mapping else "import",
                        env,
                    )
                )
            send_at, receive_at = addresses
            await asyncio.sleep(1.0)  # Zenoh routes the import to the export
        if not peer:
            receiver = await stack.enter_async_context(
                _process(_in(b, *me, "receive", receive_at, topic, str(size)), "ready", env)
            )
            sender = await stack.enter_async_context(
                _process(_in(a, *me, "send", send_at, topic, str(size)), "ready", env)
            )
        assert sender.stdin is not None and sender.stdout is not None
        assert receiver.stdout is not None
        sender.stdin.write(b"go\n")
        await sender.stdin.drain()
        while b"burst" not in await asyncio.wait_for(sender.stdout.readline(), 300):
            pass
        processes = {"sender": sender, "receiver": receiver, **others}
        before = {role: _cpu_ns(proc.pid) for role, proc in processes.items()}
        line = await asyncio.wait_for(receiver.stdout.readline(), 300)
        after = {role: _cpu_ns(proc.pid) for role, proc in processes.items()}
        sender.stdin.write(b"done\n")
        await sender.stdin.drain()
        found = dict(json.loads(line))
        # CPU per message of the burst, each process (µs; what the load does not decide)
        found["cpu_us"] = {
            role: (after[role] - before[role]) / 1e3 / BURST[size] for role in processes
        }
        return found


async def _run(rounds: int, paths: tuple[str, ...], sizes: tuple[int, ...]) -> None:
    env = dict(os.environ, EZFLOW_TOKEN=os.urandom(16).hex(), PYTHONWARNINGS="ignore")
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with _namespaces() as (a, b):
        for _ in range(rounds):
            for size in sizes:
                for path in paths:
                    found = await _measure(a, b, path, size, env)
                    results.setdefault((path, size), []).append(found)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians of {rounds}")
    header = f"{'path':10} {'size':>6} {'p50 latency':>12} {'(spread)':>17}"
    print(f"{header} {'msgs/s':>10} {'(spread)':>19}")
    medians: dict[tuple[str, int], tuple[float, float]] = {}
    for (path, size), runs in sorted(
        results.items(), key=lambda kv: (kv[0][1], PATHS.index(kv[0][0]))
    ):
        p50s = [r["p50_us"] for r in runs]
        rates = [r["msgs_per_s"] for r in runs]
        medians[path, size] = statistics.median(p50s), statistics.median(rates)
        print(
            f"{path:10} {_label(size):>6} {medians[path, size][0]:9.0f} µs "
            f"({min(p50s):5.0f}-{max(p50s):5.0f}) {medians[path, size][1]:10,.0f} "
            f"({min(rates):7,.0f}-{max(rates):7,.0f})"
        )
    print("CPU per message of the burst (µs, medians; every thread of each process):")
    for (path, size), runs in sorted(
        results.items(), key=lambda kv: (kv[0][1], PATHS.index(kv[0][0]))
    ):
        cpu = {
            role: statistics.median(r["cpu_us"][role] for r in runs) for role in runs[0]["cpu_us"]
        }
        listed = ", ".join(f"{role} {us:.1f}" for role, us in cpu.items())
        print(f"{path:10} {_label(size):>6} total {sum(cpu.values()):7.1f}: {listed}")
    for size in sizes:
        for path in paths:
            if path != "direct" and ("direct", size) in medians:
                (bp, br), (dp, dr) = medians[path, size], medians["direct", size]
                # Each round's own ratio too: the paths of a round run one after the other,
                # so its ratio sees the machine's load of that minute.
                pairs = list(zip(results[path, size], results["direct", size], strict=True))
                rates = [r["msgs_per_s"] / d["msgs_per_s"] for r, d in pairs]
                p50s = [r["p50_us"] / d["p50_us"] for r, d in pairs]
                print(
                    f"{path} / direct, {_label(size)}: rate {br / dr:.2f}x "
                    f"(rounds {min(rates):.2f}-{max(rates):.2f}), p50 {bp / dp:.1f}x "
                    f"(rounds {min(p50s):.1f}-{max(p50s):.1f})"
                )


def _label(size: int) -> str:
    return "64 B" if size == 64 else "1 MiB"


def run(
    rounds: int = 3, paths: tuple[str, ...] = PATHS, sizes: tuple[int, ...] = (64, 1 << 20)
) -> None:
    """Measure *rounds* rounds of each of *paths* (:data:`PATHS`) at each of *sizes* and
    print the medians; raises :class:`BridgeError` when the environment lacks something
    or a measurement fails."""
    if rounds < 1:
        raise BridgeError(f"--rounds {rounds}: need at least 1 round")
    unknown = [path for path in paths if path not in PATHS]
    if unknown or not paths:
        raise BridgeError(f"paths {list(paths)}: choose among {', '.join(PATHS)}")
    unmeasured = [size for size in sizes if size not in BURST]
    if unmeasured or not sizes:
        raise BridgeError(f"sizes {list(sizes)}: choose among {', '.join(map(str, BURST))}")
    check_environment()
    try:
        asyncio.run(_run(rounds, paths, sizes))
    except subprocess.CalledProcessError as error:
        detail = (error.stderr or b"").decode(errors="replace").strip()
        raise BridgeError(f"{' '.join(error.cmd)} failed: {detail or error}") from None
    except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
        raise BridgeError("a process of the measurement did not answer in time") from None
    except RuntimeError as error:  # a process ended before it was ready
        raise BridgeError(str(error)) from None


def main(argv: list[str] | None = None) -> None:
    """``python -m ezflow._perf._zenoh_bridge``: the alias of ``ezflow perf bridge``, and
    (``--role``) the sender or receiver in a namespace."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated")
    parser.add_argument("--sizes", default="64,1048576", help="comma-separated")
    parser.add_argument("--role", nargs=4, metavar=("ROLE", "ADDRESS", "TOPIC", "SIZE"))
    parser.add_argument("--peer", metavar="ENDPOINT", help="(a role) bridge in this process")
    args = parser.parse_args(argv)
    if args.role:
        role, address, topic, size = args.role
        import ezflow  # noqa: PLC0415

        if role == "zsend":
            _zenoh_send(address, int(size))
            return
        if role == "zreceive":
            _zenoh_receive(address)
            return
        coroutine = _send if role == "send" else _receive
        ezflow.lowlevel.run_coroutine(coroutine(address, topic, int(size), args.peer))
        return
    try:
        run(
            args.rounds,
            tuple(args.paths.split(",")),
            tuple(int(size) for size in args.sizes.split(",")),
        )
    except BridgeError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
