"""The fork server (ezflow/_units/_forkserver.py): unit processes forked from a copy of
the program (``ezflow.run``) or from a fresh interpreter that imported the units'
modules once (a GraphRunner on a running event loop), each with a clean state;
``EZFLOW_START_METHOD=spawn`` as the fallback. Real processes throughout."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import conftest
import pytest
from _unit_graphs import Relay, Sink, SinkSettings

import ezflow
from ezflow._core._config import ENV_START_METHOD

pytestmark = pytest.mark.skipif(
    not ezflow._core._config.forkserver_supported(), reason="the fork server needs Linux pidfds"
)

# A program with side effects at import (a line printed, an atexit handler, a socket it
# holds when it calls run()); each unit process reports what it inherited.
PROBE = """
import atexit, json, os, signal, socket, stat, sys, threading
import ezflow

def say(*words):  # one write per line: with PYTHONUNBUFFERED, print() writes each word
    os.write(1, (" ".join(map(str, words)) + "\\n").encode())  # apart, and processes interleave


say("IMPORTED")
atexit.register(say, "ATEXIT", os.getpid())
HELD = socket.socket()  # the program's own socket, open when it calls run()
PROGRAM = os.getpid()


class Probe(ezflow.Unit):
    @ezflow.task
    async def report(self):
        null, stdin = os.stat(os.devnull), os.fstat(0)
        facts = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "program": PROGRAM,
            "own_session": os.getsid(0) == os.getpid(),
            "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
            "stdin_is_null": (stdin.st_rdev, stdin.st_ino) == (null.st_rdev, null.st_ino),
            "held_is_socket": stat.S_ISSOCK(os.fstat(HELD.fileno()).st_mode),
            "main_is_script": getattr(sys.modules["__main__"], "PROGRAM", None) == PROGRAM,
        }
        os.write(1, f"FACTS {json.dumps(facts)}\\n".encode())  # one write: processes interleave


if __name__ == "__main__":
    if os.environ.get("PROBE_THREAD"):  # a thread of the program's own: not safe to fork
        threading.Thread(target=threading.Event().wait, args=(30,), daemon=True).start()
    one, two = Probe(), Probe()
    ezflow.run(ONE=one, TWO=two, process_components=[one, two], end_when_done=True,
               graph_address="127.0.0.1:0")
    say("RAN", PROGRAM)
"""


def _probe(tmp_path: Path, method: str) -> subprocess.Popen[str]:
    script = tmp_path / f"probe_{method}.py"
    script.write_text(PROBE)
    env = {**os.environ, ENV_START_METHOD: method.split("+", maxsplit=1)[0]}
    if method.endswith("+thread"):
        env["PROBE_THREAD"] = "1"
    return subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _program(out: str) -> int:
    return int(next(line for line in out.splitlines() if line.startswith("RAN ")).split()[1])


def _facts(out: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in out.splitlines() if line.startswith("FACTS ")]


def test_run_forks_unit_processes_from_a_copy_of_the_program(tmp_path: Path) -> None:
    # Both start methods at once (two programs side by side: no sequential waits).
    methods = ("forkserver", "forkserver+thread", "spawn")
    probes = {method: _probe(tmp_path, method) for method in methods}
    results = {method: p.communicate(timeout=60) for method, p in probes.items()}
    for method, process in probes.items():
        assert process.returncode == 0, (method, results[method])
        assert conftest.without_shm_notices(results[method][1]) == "", (method, results[method])
    out, _ = results["forkserver"]
    lines = out.splitlines()
    # The program's module ran once: nothing imports it again, its atexit handler runs
    # once (in the program), and both units saw the script as their __main__.
    assert lines.count("IMPORTED") == 1, out
    program = _program(out)
    assert [line for line in lines if line.startswith("ATEXIT")] == [f"ATEXIT {program}"]
    facts = _facts(out)
    assert len(facts) == 2, out
    fork_servers = {f["ppid"] for f in facts}
    assert len(fork_servers) == 1 and program not in fork_servers  # one fork server
    for unit in facts:
        assert unit["program"] == program
        assert unit["main_is_script"]
        # Clean state: a session of its own, Ctrl-C the program's, nothing to read on
        # stdin, and the program's socket not open here (its number taken by /dev/null).
        assert unit["own_session"] and unit["sigint_ignored"] and unit["stdin_is_null"]
        assert not unit["held_is_socket"]
    # With a thread of its own, the program is not forked: the fork server is a fresh
    # interpreter that imported the script once (as __mp_main__), for both units.
    out, _ = results["forkserver+thread"]
    assert out.splitlines().count("IMPORTED") == 2, out
    facts = _facts(out)
    assert len(facts) == 2 and len({f["ppid"] for f in facts}) == 1, out
    assert facts[0]["ppid"] != _program(out)
    assert all(f["own_session"] and f["sigint_ignored"] and f["stdin_is_null"] for f in facts)
    # The fallback: a fresh interpreter per unit process, the program's own child,
    # importing the script again (as __mp_main__: its `if __name__ == "__main__":`
    # block does not run there).
    out, _ = results["spawn"]
    assert out.splitlines().count("IMPORTED") == 3, out
    program = _program(out)
    spawned = _facts(out)
    assert len(spawned) == 2, out
    for unit in spawned:
        assert unit["ppid"] == program
        assert unit["own_session"] and unit["sigint_ignored"] and unit["stdin_is_null"]


LOCAL_CLASS = """
import dataclasses
import ezflow
from ezflow.units import DebugLog, TerminateAfter, TerminateAfterSettings


def main():
    @ezflow.message
    @dataclasses.dataclass
    class Local:  # defined inside a function: no fresh interpreter could import it
        seq: int

    class Source(ezflow.Unit):
        OUTPUT = ezflow.OutputStream(Local)

        @ezflow.publisher(OUTPUT)
        async def generate(self):
            for i in range(3):
                yield self.OUTPUT, Local(i)

    source, log = Source(), DebugLog()
    end = TerminateAfter(TerminateAfterSettings(count=3))
    ezflow.run(
        components={"SOURCE": source, "LOG": log, "END": end},
        connections=[(source.OUTPUT, log.INPUT), (log.OUTPUT, end.INPUT)],
        process_components=[log],
        graph_address="127.0.0.1:0",
    )


if __name__ == "__main__":
    main()
"""


def test_a_process_forked_from_the_program_knows_its_local_classes(tmp_path: Path) -> None:
    # (With spawn the start fails naming the class: tests/test_message_types.py.)
    script = tmp_path / "local_class.py"
    script.write_text(LOCAL_CLASS)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, ENV_START_METHOD: "forkserver"},
    )
    assert result.returncode == 0, result.stderr
    assert "Local(seq=2)" in result.stdout, result.stdout


def _children_of(pid: int) -> set[int]:
    return conftest._children(pid)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def _reaped(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


async def _until(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_a_graph_runner_forks_from_a_spawned_fork_server(
    server: ezflow.GraphServer, tmp_path: Path
) -> None:
    sink, relay = Sink(SinkSettings(str(tmp_path))), Relay()
    runner = ezflow.GraphRunner(
        SINK=sink,
        RELAY=relay,
        connections=[(relay.OUTPUT, sink.INPUT)],
        process_components=[sink, relay],
        graph_address=server.address,
    )
    async with runner:
        pids = runner.processes
        # A running loop here: the fork server is a fresh interpreter (our only child),
        # and both unit processes are its children.
        (fork_server,) = _children_of(os.getpid()) - set(pids.values())
        assert _children_of(fork_server) == set(pids.values())
        feed = await runner.context.publisher("RELAY/INPUT")
        await feed.publish(1)
        await _until((tmp_path / "running-SINK").exists)
    assert (tmp_path / "shutdown-SINK").exists()
    # Everything forked is gone, the fork server too (reaped: no zombie).
    assert all(_gone(pid) for pid in pids.values())
    assert _reaped(fork_server)


async def test_a_killed_unit_process_is_reported_by_name(server: ezflow.GraphServer) -> None:
    sink, relay = Sink(SinkSettings("")), Relay()
    runner = ezflow.GraphRunner(
        SINK=sink,
        RELAY=relay,
        connections=[(relay.OUTPUT, sink.INPUT)],
        process_components=[relay],
        graph_address=server.address,
    )
    await runner.start()
    pid = runner.processes["RELAY"]
    os.kill(pid, signal.SIGKILL)
    # Its exit status comes from the fork server, which reaped it.
    with pytest.raises(ezflow.ProcessDiedError, match=rf"process RELAY \(pid {pid}.*SIGKILL"):
        await asyncio.wait_for(runner.wait(), 30)


async def test_a_dead_fork_server_takes_its_unit_processes_along(
    server: ezflow.GraphServer,
) -> None:
    relay = Relay()
    runner = ezflow.GraphRunner(
        RELAY=relay, process_components=[relay], graph_address=server.address
    )
    await runner.start()
    pid = runner.processes["RELAY"]
    (fork_server,) = _children_of(os.getpid())
    os.kill(fork_server, signal.SIGKILL)
    # Nobody is left to report the unit process's exit: it is killed, the graph fails
    # naming it, and nothing stays behind.
    with pytest.raises(ezflow.ProcessDiedError, match=r"process RELAY .*killed by SIGKILL"):
        await asyncio.wait_for(runner.wait(), 30)
    await _until(lambda: _gone(pid))


def test_an_unknown_start_method_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_START_METHOD, "vfork")
    relay = Relay()
    with pytest.raises(ezflow.ConfigurationError, match=r"EZFLOW_START_METHOD='vfork'.*'spawn'"):
        ezflow.GraphRunner(RELAY=relay, process_components=[relay])
