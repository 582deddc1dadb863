"""CPU per message of each process of the bridge's CLI path (loopback).

    .venv/bin/python perf/micro/bridge_cli_cpu.py SIZE COUNT [ROUNDS]

Two graph servers (hosts A and B on loopback), a Zenoh router, ``ezflow zenoh bridge
--lossless`` exporting /cpu from A and another importing it into B, a publisher on A
and a subscriber on B (``ezflow perf bridge``'s roles). Prints, per round, msgs/s at
the receiver and each process's CPU per message of the burst (/proc schedstat, every
thread). ``EZB_PROFILE=exporter`` (or ``importer``) runs that bridge under
``py-spy record --native`` (to /tmp/bridge_cli_<role>.txt, raw format; it includes
idle samples: leave out the leaf frames epoll_pwait and libc's futex waits). Set
``EZB_MODE=:lossless=1024`` to append that option to both mappings.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

PORT = 7498
ROUTER = f"tcp/127.0.0.1:{PORT}"
PY = sys.executable
MODE = os.environ.get("EZB_MODE", "")  # e.g. ":lossless=1024", appended to both mappings
BENCH = [PY, __file__, "--role"]  # ezflow perf bridge's roles, with a burst of COUNT


def _cpu_ns(pid: int) -> int:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError):
            pass
    return total


def _faults(pid: int) -> int:
    """Minor page faults of process *pid* so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[7])


def _threads(pid: int) -> dict[str, int]:
    """CPU ns of each thread of *pid* by name (main; Python's threads python-<tid>)."""
    found: dict[str, int] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as comm:
                name = comm.read().strip()
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                ns = int(stat.read().split()[0])
        except (OSError, ValueError):
            continue
        name = "main" if int(task) == pid else (f"py-{task}" if name == "python" else name)
        found[name] = found.get(name, 0) + ns
    return found


def _start(argv: list[str], ready: str, role: str) -> subprocess.Popen[bytes]:
    if os.environ.get("EZB_PROFILE") == role:
        spy = os.path.join(os.path.dirname(PY), "py-spy")
        out = f"/tmp/bridge_cli_{role}.txt"
        argv = [spy, "record", "--native", "-r", "200", "-f", "raw", "-o", out, "--", *argv]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while True:
        line = proc.stdout.readline().decode()
        if ready in line:
            proc.first_line = line  # type: ignore[attr-defined]
            return proc
        if not line or time.monotonic() > deadline:
            raise RuntimeError(f"{role} ended before {ready!r}")


def _python_pid(proc: subprocess.Popen[bytes]) -> int:
    """The measured process: itself, or py-spy's child."""
    children = f"/proc/{proc.pid}/task/{proc.pid}/children"
    with open(children) as found:
        kids = found.read().split()
    return int(kids[0]) if kids and "py-spy" in open(f"/proc/{proc.pid}/comm").read() else proc.pid


def one_round(size: int, count: int) -> dict[str, Any]:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        addresses = []
        for name in ("server A", "server B"):
            procs[name] = _start(
                [PY, "-m", "ezflow", "serve", "-a", "127.0.0.1:0"], "listening on", name
            )
            banner = procs[name].first_line  # type: ignore[attr-defined]
            found = re.search(r"listening on ([^\s,;]+)", banner)
            assert found is not None
            addresses.append(found.group(1))
        procs["router"] = _start(
            [PY, "-m", "ezflow", "zenoh", "router", "--listen", ROUTER], "listening", "router"
        )
        for role, address, mapping in (
            ("exporter", addresses[0], ["--export", "/cpu=bench/cpu" + MODE]),
            ("importer", addresses[1], ["--import", "bench/cpu=/cpu" + MODE]),
        ):
            bridge = [PY, "-m", "ezflow", "zenoh", "bridge", "--connect", ROUTER, "-a", address]
            procs[role] = _start(
                [*bridge, "--lossless", *mapping],
                "export" if role == "exporter" else "import",
                role,
            )
        for role, at in (("receiver", addresses[1]), ("sender", addresses[0])):
            argv = [*BENCH, str(count), "send" if role == "sender" else "receive"]
            procs[role] = _start([*argv, at, "/cpu", str(size)], "ready", role)
        time.sleep(1.0)  # Zenoh routes the import to the export
        sender, receiver = procs["sender"], procs["receiver"]
        assert sender.stdin and sender.stdout and receiver.stdout
        sender.stdin.write(b"go\n")
        sender.stdin.flush()
        while b"burst" not in sender.stdout.readline():
            pass
        pids = {role: _python_pid(proc) for role, proc in procs.items()}
        before = {role: _cpu_ns(pid) for role, pid in pids.items()}
        faults = {role: _faults(pid) for role, pid in pids.items()}
        threads = {role: _threads(pids[role]) for role in ("exporter", "importer")}
        got = json.loads(receiver.stdout.readline())
        after = {role: _cpu_ns(pid) for role, pid in pids.items()}
        got["faults"] = {r: round((_faults(pid) - faults[r]) / count, 1) for r, pid in pids.items()}
        for role, was in threads.items():
            now = _threads(pids[role])
            used = {name: (ns - was.get(name, 0)) / 1e3 / count for name, ns in now.items()}
            got[role] = {name: round(us, 2) for name, us in sorted(used.items()) if us >= 0.05}
        sender.stdin.write(b"done\n")
        sender.stdin.flush()
        got["cpu_us"] = {r: round((after[r] - before[r]) / 1e3 / count, 1) for r in procs}
        return got
    finally:
        for role in ("sender", "receiver"):
            if role in procs and procs[role].stdin:
                procs[role].stdin.close()  # type: ignore[union-attr]
        for proc in reversed(list(procs.values())):
            if proc.poll() is None:
                proc.send_signal(2)  # (py-spy and the bridges write their output on SIGINT)
        for role, proc in procs.items():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                continue
            assert proc.stdout is not None
            out = proc.stdout.read()
            for line in out.decode(errors="replace").splitlines():
                if line.startswith("stats ") and role in ("exporter", "importer"):
                    for name, stats in json.loads(line[6:]).items():
                        if isinstance(stats, dict) and stats.get("samples"):
                            n = stats.get("messages", 0) / stats["samples"]
                            print(f"  {role} {name}: {n:.1f} messages a sample")


def main() -> None:
    if sys.argv[1] == "--role":  # the benchmark's role with a burst of COUNT
        from ezflow._perf import _zenoh_bridge  # noqa: PLC0415 - the roles only

        count, argv = int(sys.argv[2]), sys.argv[3:]
        _zenoh_bridge.BURST[int(argv[-1])] = count
        _zenoh_bridge.main(["--role", *argv])
        return
    size, count = int(sys.argv[1]), int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    for _ in range(rounds):
        got = one_round(size, count)
        cpu = got["cpu_us"]
        print(
            f"{size} B x {count}: {got['msgs_per_s']:,.0f} msgs/s, p50 {got['p50_us']:.0f} µs; "
            f"CPU µs/msg: {cpu} (load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        for role in ("exporter", "importer"):
            print(f"  {role} threads (µs/msg): {got[role]}")
        print(f"  page faults a message: {got['faults']}")


if __name__ == "__main__":
    main()
