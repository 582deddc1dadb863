"""The graph's trace lease (``ezflow trace --sample N --duration S``), with real
processes: a killed command, a killed or restarted graph server - no process traces
past the lease; ``--rate`` shows each process's rate and where it comes from; ``--rate
0`` ends the lease at once; ``--duration S`` samples S seconds and reads every hop;
traces not all of whose hops were reported are counted and labelled as incomplete; a
malformed lease request gets a precise error and the server keeps serving.

Each graph runs on an ``ezflow serve`` child; the publisher, relays and subscribers are
children (tests/_trace_peers.py) that say ten times a second how they trace - what the
process itself holds, and the hops its subscribers recorded (the ground truth: a
process that traces no more records no more hops while messages keep flowing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from _proc import Child
from conftest import loop_kind
from typer.testing import CliRunner

import ezflow
from ezflow._cli._app import app
from ezflow._core._config import TRACE_LEASE_GRACE
from ezflow._core._exceptions import GraphError, ProtocolError
from ezflow._core._tracing import TRACING, apply_lease, carry, set_own_rate
from ezflow._graph._client import GraphClient
from ezflow._graph._traces import incomplete_of, missing_of, summarize

pytestmark = pytest.mark.usefixtures("tracing_off")

PEERS = str(Path(__file__).with_name("_trace_peers.py"))
#: The leases of these tests are short, so that a test runs in seconds ...
DURATION = 3.0
#: ... and a deadline on a loaded machine is this generous.
SLACK = 5.0


def skip_on_uvloop() -> None:
    if loop_kind() == "uvloop":
        pytest.skip("every process of the graph is a child on its own loop: once is enough")


async def eventually(
    check: Callable[[], Any], timeout: float, what: str, every: float = 0.05
) -> Any:
    """Call *check* until it returns something true; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(every)


class Peer:
    """A child of tests/_trace_peers.py whose ``state`` reports are read as they come."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.state: dict[str, Any] = {}
        self.ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.times: asyncio.Future[list[int]] | None = None
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        stdout = self.child.process.stdout
        assert stdout is not None
        while line := await stdout.readline():
            event = json.loads(line)
            if event["event"] == "state":
                self.state = event
            elif event["event"] == "ready" and not self.ready.done():
                self.ready.set_result(event)
            elif event["event"] == "times" and self.times is not None:
                self.times.set_result(event["times"])
        if not self.ready.done():
            self.ready.set_exception(AssertionError(f"{self.child.role} exited before ready"))

    async def publish_times(self) -> list[int]:
        """``monotonic_ns`` just before each publish so far (a publisher)."""
        self.times = asyncio.get_running_loop().create_future()
        assert self.child.process.stdin is not None
        self.child.process.stdin.write(b"times\n")
        await self.child.process.stdin.drain()
        return await asyncio.wait_for(self.times, 10)

    @property
    def lease(self) -> str | None:
        return self.state.get("lease")

    async def still_records_none(self, seconds: float = 1.0) -> None:
        """Messages keep arriving for *seconds*, and none of them is traced."""
        before = dict(self.state)
        await asyncio.sleep(seconds)
        assert self.state["count"] > before["count"] + 5, (before, self.state)
        assert self.state["recorded"] == before["recorded"], (before, self.state)

    async def aclose(self) -> None:
        await self.child.stop()
        await self.child.aclose()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Graph:
    """An ``ezflow serve`` child at a fixed address (to kill and restart) and the
    peers of its graph."""

    def __init__(self, port: int) -> None:
        self.address = f"127.0.0.1:{port}"
        self.server: asyncio.subprocess.Process | None = None
        self.peers: list[Peer] = []
        self.commands: list[asyncio.subprocess.Process] = []

    async def serve(self) -> None:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ezflow", "serve", "--address", self.address),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert process.stdout is not None
        seen = b""
        while b"listening" not in seen:
            line = await asyncio.wait_for(process.stdout.readline(), 30)
            assert line, f"ezflow serve exited ({await process.wait()}) before listening"
            seen += line
        self.server = process

    async def kill_server(self) -> None:
        assert self.server is not None
        self.server.kill()
        await self.server.wait()
        self.server = None

    async def peer(self, role: str, env: dict[str, str] | None = None, **args: Any) -> Peer:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, PEERS, role, json.dumps({"address": self.address, **args})),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        )
        peer = Peer(Child(process, role))
        self.peers.append(peer)
        await asyncio.wait_for(peer.ready, 30)
        return peer

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        """``ezflow ARGS --address ...`` in the background."""
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ezflow", *args, "--address", self.address),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self.commands.append(process)
        return process

    async def run(self, *args: str, timeout: float = 30) -> tuple[int, str, str]:
        process = await self.start(*args)
        out, err = await asyncio.wait_for(process.communicate(), timeout)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    async def json(self, *args: str) -> dict[str, Any]:
        code, out, err = await self.run(*args, "--json")
        assert code == 0, err
        report: dict[str, Any] = json.loads(out)
        return report

    async def rates(self) -> dict[str, dict[str, Any]]:
        """``ezflow trace --rate --json``'s processes, by name."""
        report = await self.json("trace", "--rate")
        return {p["name"]: p for p in report["processes"]}

    async def aclose(self) -> None:
        for command in self.commands:
            if command.returncode is None:
                command.kill()
            await command.communicate()
        await asyncio.gather(*(peer.aclose() for peer in self.peers), return_exceptions=True)
        if self.server is not None:
            self.server.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.server.wait(), 10)
            except asyncio.TimeoutError:
                self.server.kill()
                await self.server.wait()


@pytest.fixture
async def graph(unused_tcp_port: int) -> AsyncIterator[Graph]:
    skip_on_uvloop()
    graph = Graph(unused_tcp_port)
    await graph.serve()
    try:
        yield graph
    finally:
        await graph.aclose()


async def pub_and_sub(graph: Graph, topic: str, **args: Any) -> tuple[Peer, Peer]:
    """A publisher process and a subscriber process of *topic*, messages flowing. (The
    two start at once: an interpreter importing ezflow takes seconds on a loaded machine.)"""
    pub, sub = await asyncio.gather(
        graph.peer("publisher", topic=topic, name="pub", **args),
        graph.peer("subscriber", topic=topic, name="sub"),
    )
    await eventually(lambda: sub.state.get("count", 0) > 5, 30, "messages flowing")
    return pub, sub


async def holding(peers: list[Peer], what: str) -> str:
    """Wait until every peer holds the same lease; its id."""
    await eventually(lambda: all(p.lease for p in peers), 30, f"every process holds {what}")
    (lease,) = {p.lease for p in peers}
    assert lease is not None
    return lease


# -- the acceptance line -----------------------------------------------------------------------


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
async def test_a_killed_sample_command_leaves_no_process_tracing_after_its_lease(
    graph: Graph, how: signal.Signals
) -> None:
    """``timeout 2 ezflow trace --sample 1 --duration 30`` (the signal sent here once
    the lease runs, which ``timeout`` cannot know): SIGTERM ends the command's lease at
    once; after SIGKILL nobody ends it, and it runs out at its end (the server's timer;
    without a server each process ends it by itself: the next test). Either way no
    process traces after it, neither the publisher's nor the subscriber's, while
    messages keep flowing."""
    pub, sub = await pub_and_sub(graph, f"/killed/{how.name}")
    duration = 30.0 if how == signal.SIGTERM else DURATION
    command = await graph.start("trace", "--sample", "1", "--duration", str(duration))
    lease = await holding([pub, sub], "the lease")
    assert pub.state["rate"] == 1 and sub.state["rate"] == 1
    # (granted this long ago: a process ends it by itself at duration + grace)
    granted = time.monotonic() - (duration + TRACE_LEASE_GRACE - pub.state["left"])
    recorded = sub.state["recorded"]
    await eventually(lambda: sub.state["recorded"] > recorded + 5, 10, "traced messages")
    command.send_signal(how)
    out, err = await asyncio.wait_for(command.communicate(), 30)
    if how == signal.SIGTERM:
        assert command.returncode == 0, err
        assert b"stopped early: the lease is ended" in err
        assert f"/killed/{how.name} -> sub".encode() in out  # (what it sampled)
        await eventually(lambda: not pub.lease and not sub.lease, SLACK, "the lease ended")
        assert time.monotonic() - granted < duration / 2
    else:
        assert command.returncode == -signal.SIGKILL
        assert pub.lease == lease or time.monotonic() - granted > DURATION - 0.5
        await eventually(
            lambda: not pub.lease and not sub.lease,
            DURATION + TRACE_LEASE_GRACE + SLACK,
            "the lease's end",
        )
        assert time.monotonic() - granted >= DURATION - 0.5, "it ended before its time"
    assert pub.state["rate"] == 0 and sub.state["rate"] == 0  # (their own: none)
    await sub.still_records_none()
    report = await graph.json("trace", "--rate")
    assert report["lease"] is None and report["last_ended"]["id"] == lease
    ender = f"ended by ezflow trace (pid {command.pid})"
    assert report["last_ended"]["how"] == ("expired" if how == signal.SIGKILL else ender)
    assert {p["name"]: (p["rate"], p["source"]) for p in report["processes"]} == {
        "pub": (0, "own"),
        "sub": (0, "own"),
    }


async def both_listed(graph: Graph) -> dict[str, dict[str, Any]]:
    """``--rate``'s processes once a server answers and lists the publisher and the
    subscriber with a trace state."""

    async def listed() -> dict[str, dict[str, Any]] | None:
        code, out, _ = await graph.run("trace", "--rate", "--json")
        if code != 0:
            return None
        rates = {p["name"]: p for p in json.loads(out)["processes"] if p["rate"] is not None}
        return rates if {"pub", "sub"} <= rates.keys() else None

    found: dict[str, dict[str, Any]] = await eventually(listed, 15, "both listed", every=0.2)
    return found


@pytest.mark.parametrize("restart", ["during the lease", "after it"])
async def test_a_server_killed_during_a_lease_leaves_no_process_tracing_after_it(
    graph: Graph, restart: str
) -> None:
    """SIGKILL the graph server while a lease runs. Restarted at once, it has no lease:
    every process drops it on reconnecting (long before the lease's end). Not restarted,
    nobody can tell the processes: each ends the lease by itself, at its end plus
    ``TRACE_LEASE_GRACE``."""
    pub, sub = await pub_and_sub(graph, "/server")
    duration = 30.0 if restart == "during the lease" else DURATION
    await graph.start("trace", "--sample", "1", "--duration", str(duration))
    await holding([pub, sub], "the lease")
    await graph.kill_server()
    killed = time.monotonic()
    deadline = killed + min(pub.state["left"], sub.state["left"])  # (their own: end + grace)
    if restart == "during the lease":
        await graph.serve()
        await eventually(lambda: not pub.lease and not sub.lease, 15, "the lease dropped")
        assert time.monotonic() < deadline - 5, "it did not end before the lease did"
        # Each process drops the lease on its own reconnect: a message the publisher
        # traced just before it dropped its lease may reach the subscriber after the
        # subscriber reported dropping its own. Let those land (and be reported: every
        # 0.1 s) before the window in which nothing may be recorded.
        await asyncio.sleep(0.5)
    else:
        await asyncio.sleep(0.3)  # a window: the lease may not end in it
        assert pub.lease and sub.lease  # nothing ended it: the server is gone
        await eventually(
            lambda: not pub.lease and not sub.lease, deadline - killed + SLACK, "its end"
        )
        assert time.monotonic() >= deadline - 0.5, "it ended before its deadline"
        await sub.still_records_none()  # (channels flow on without the server)
        await graph.serve()
    assert pub.state["rate"] == 0 and sub.state["rate"] == 0
    await sub.still_records_none()
    rates = await both_listed(graph)
    assert {name: (p["rate"], p["source"]) for name, p in rates.items()} == {
        "pub": (0, "own"),
        "sub": (0, "own"),
    }


# -- --rate ------------------------------------------------------------------------------------


async def test_rate_shows_rates_and_sources_and_rate_0_ends_the_lease_at_once(
    graph: Graph,
) -> None:
    # (the publisher's own rate from EZFLOW_TRACE, the third's from set_trace_rate)
    (pub, sub), sub_rate = await asyncio.gather(
        pub_and_sub(graph, "/rates", env={"EZFLOW_TRACE": "7"}),
        graph.peer("subscriber", topic="/rates", name="counting", rate=3),
    )
    await eventually(lambda: sub_rate.state.get("count", 0) > 0, 30, "the third process")

    async def listed() -> dict[str, dict[str, Any]] | None:
        rates = await graph.rates()
        return rates if {"pub", "sub", "counting"} <= rates.keys() else None

    rates = await eventually(listed, 15, "every process listed", every=0.2)
    assert (rates["pub"]["rate"], rates["pub"]["source"]) == (7, "own")
    assert rates["pub"]["own_source"] == "EZFLOW_TRACE"
    assert (rates["counting"]["rate"], rates["counting"]["own_source"]) == (3, "set_trace_rate")
    assert (rates["sub"]["rate"], rates["sub"]["own_source"]) == (0, "default")
    code, out, _ = await graph.run("trace", "--rate")
    assert code == 0 and "no graph lease: every process traces at its own rate" in out
    assert "own: EZFLOW_TRACE" in out and "own: set_trace_rate" in out

    await graph.start("trace", "--sample", "2", "--duration", "30")
    lease = await holding([pub, sub, sub_rate], "the lease")
    report = await graph.json("trace", "--rate")
    assert report["lease"]["id"] == lease and report["lease"]["rate"] == 2
    assert 0 < report["lease"]["remaining"] <= 30
    for process in report["processes"]:
        assert (process["rate"], process["source"], process["lease"]) == (2, "lease", lease)
        assert 0 < process["lease_left"] <= 30 + TRACE_LEASE_GRACE
    assert {p["name"]: p["own"] for p in report["processes"]} == {
        "pub": 7,
        "sub": 0,
        "counting": 3,
    }
    code, out, _ = await graph.run("trace", "--rate")
    assert code == 0 and f"graph lease {lease}: 1 in 2 for 30 s" in out, out

    # --rate 0 ends it at once: every process confirmed before the command answers.
    code, out, err = await graph.run("trace", "--rate", "0")
    text = " ".join(out.split())
    assert code == 0, err
    assert f"ended graph lease {lease} (1 in 2," in text and "back to its own rate" in text
    assert "ends the graph's lease only" in text and "own rate" in text
    # (each process says how it traces ten times a second: it had confirmed already)
    await eventually(lambda: not (pub.lease or sub.lease or sub_rate.lease), 1, "ended")
    assert (pub.state["rate"], sub.state["rate"], sub_rate.state["rate"]) == (7, 0, 3)
    # Again, as JSON: what was ended, and every process's confirmed rates.
    await graph.start("trace", "--sample", "2", "--duration", "30")
    lease = await holding([pub, sub, sub_rate], "another lease")
    cleared = await graph.json("trace", "--rate", "0")
    assert cleared["cleared"]["id"] == lease and cleared["lease"] is None
    assert cleared["unconfirmed"] == [] and "own rate" in cleared["clears"]
    assert {p["name"]: (p["rate"], p["source"]) for p in cleared["processes"]} == {
        "pub": (7, "own"),
        "sub": (0, "own"),
        "counting": (3, "own"),
    }
    # Nothing left to end.
    code, out, _ = await graph.run("trace", "--rate", "0")
    assert code == 0 and "no graph lease was running: nothing to end" in " ".join(out.split())


def test_rate_and_sample_options_that_do_not_fit_are_usage_errors() -> None:
    for args, text in (
        (("--rate", "5"), "--rate takes 0 only"),
        (("0",), "is a value of --rate"),
        (("--rate", "--sample", "3"), "do not go together"),
        (("--duration", "3"), "give --sample N too"),
        (("--sample", "3", "--duration", "0"), "--duration=0.0 must be a number"),
        (("--sample", "3", "--duration", "99999"), "TRACE_LEASE_MAX"),
    ):
        # (checked before connecting: nothing listens at that address; in this process,
        # as usage errors need no child: six `ezflow` starts took 22 s at load 8)
        result = CliRunner().invoke(app, ["trace", *args, "--address", "127.0.0.1:1"])
        assert result.exit_code == 2, (args, result.stderr)
        assert text in " ".join(result.stderr.split()), (args, result.stderr)


# -- --duration --------------------------------------------------------------------------------


async def test_duration_samples_that_long_and_reads_every_hop_of_it(graph: Graph) -> None:
    pace = 0.02
    pub, _ = await pub_and_sub(graph, "/window", pace=pace)
    command = await graph.start("trace", "--sample", "1", "--duration", "2", "--json")
    # From the lease's grant (each process says what it holds ten times a second) to the
    # command's end: its start-up, an interpreter importing ezflow, is no part of it (at
    # load 8 that alone took seconds).
    await holding([pub], "the lease")
    began = time.monotonic()
    out, err = await asyncio.wait_for(command.communicate(), 30)
    took = time.monotonic() - began
    assert command.returncode == 0, err
    report = json.loads(out)
    times = await pub.publish_times()
    async with ezflow.GraphContext(graph.address, auto_start=False, telemetry_interval=0) as ctx:
        hops = [h for h in await ctx.graph_traces() if h["topic"] == "/window"]
    published = sorted(h["t_publish"] for h in hops)
    span = (published[-1] - published[0]) / 1e9
    # Sampled 2 s (not 2 s plus a report interval, as before) ...
    assert 2 - 0.4 <= span <= 2 + 0.4, span
    # ... and every message published in that window was traced and reported.
    first, last = published[0], published[-1]
    in_window = [t for t in times if first - pace / 2 * 1e9 < t <= last]
    assert len(hops) == len(in_window), (len(hops), len(in_window))
    assert report["traces"] == len(hops) and report["incomplete"]["traces"] == 0
    assert report["sampling"]["late"] == [] and not report["sampling"]["stopped_early"]
    (path,) = report["paths"]
    assert path["path"] == "/window -> sub" and path["traces"] == len(hops)
    # The command waited for the last reports (one interval, 0.2 s here), not blindly.
    assert report["sampling"]["waited_for_reports"] < 0.2 + 0.5 + 0.5
    assert took < 2 + SLACK


# -- incomplete traces -------------------------------------------------------------------------


@pytest.mark.parametrize("silent", ["relay", "sink", None])
async def test_traces_missing_hops_are_counted_and_labelled_incomplete(
    graph: Graph, silent: str | None
) -> None:
    """source -> relay -> sink, one of them not reporting during the test (its report
    interval is an hour): its hops are missing, so every trace is incomplete - its
    start (the relay's hop) or its end (the sink's) - and no path is made of the rest.
    A subscriber without telemetry (as ``ezflow echo``) takes the relay's messages too,
    and does not count: with everyone else reporting, traces are complete."""
    interval = {"relay": 0.2, "sink": 0.2}
    if silent is not None:
        interval[silent] = 3600
    _, _, sink, echo = await asyncio.gather(
        graph.peer("publisher", topic="/in", name="source", pace=0.02),
        graph.peer("relay", topic="/in", out="/out", name="relay", telemetry=interval["relay"]),
        graph.peer("subscriber", topic="/out", name="sink", telemetry=interval["sink"]),
        graph.peer("subscriber", topic="/out", name="echo", telemetry=0),
    )
    await eventually(lambda: sink.state.get("count", 0) > 5 and echo.state.get("count"), 30, "flow")
    report = await graph.json("trace", "--sample", "1", "--duration", "1.5")
    incomplete = report["incomplete"]
    if silent is None:
        (path,) = report["paths"]
        assert path["path"] == "/in -> relay -> sink" and path["traces"] > 30
        assert incomplete["traces"] <= 2, incomplete  # (cut at the lease's edges at most)
        return
    assert report["paths"] == [] and incomplete["traces"] > 30
    (fragment,) = incomplete["fragments"]
    expected = {"relay": ("/out -> sink", ["start"]), "sink": ("/in -> relay", ["end"])}
    assert (fragment["path"], fragment["missing"]) == expected[silent]
    assert fragment["incomplete"] is True and fragment["traces"] == incomplete["traces"]
    code, out, _ = await graph.run("trace")  # every hop kept: the same, as tables
    text = " ".join(out.split())
    assert code == 0 and f"incomplete traces: {incomplete['traces']}" in text, out
    row = f"{expected[silent][0]} │ {incomplete['traces']} │ its {expected[silent][1][0]}"
    assert row in text, out


def _hop(span: int, parent: int, **fields: Any) -> dict[str, Any]:
    hop = {
        "trace_id": 1,
        "span_id": span,
        "parent_id": parent,
        "topic": f"/t{span}",
        "publisher_id": f"p{parent}",
        "subscriber": f"s{span}",
        "transport": "shm",
        "pid": 100 + span,
        "same_clock": True,
        "t_publish": 10 * span,
        "t_sent": 10 * span + 1,
        "t_received": 10 * span + 2,
        "t_decoded": 10 * span + 3,
        "t_taken": 10 * span + 4,
        "t_done": 10 * span + 5,
        "forwarded": 0,
        "process": f"proc{span}",
        "wall_offset": 0,
    }
    hop.update(fields)
    return hop


def test_a_trace_is_complete_when_every_hop_it_sent_on_was_reported() -> None:
    chain = [_hop(1, 0, forwarded=1), _hop(2, 1, forwarded=1), _hop(3, 2)]
    assert missing_of(chain) == ()
    assert missing_of(chain[1:]) == ("start",)
    assert missing_of(chain[:2]) == ("end",)
    assert missing_of([chain[1]]) == ("start", "end")
    # Two subscribers in one process are one delivery; two processes are two.
    twins = [_hop(3, 2, subscriber="a"), _hop(4, 2, pid=103, process="proc3", t_publish=30)]
    assert missing_of([*chain[:2], *twins]) == ()
    assert missing_of([chain[0], _hop(2, 1, forwarded=2), twins[0]]) == ("end",)
    # Hops of an ezflow without `forwarded` send nothing on.
    old = [{k: v for k, v in hop.items() if k != "forwarded"} for hop in chain[:2]]
    assert missing_of(old) == ()
    # summarize keeps complete traces only; incomplete_of counts the rest, per fragment.
    other = [{**hop, "trace_id": 2} for hop in chain[1:]]
    (path,) = summarize([*chain, *other])
    assert path.traces == 1 and path.name == "/t1 -> proc1 -> proc2 -> proc3"
    summary = incomplete_of([*chain, *other])
    assert (summary.traces, summary.hops) == (1, 2)
    assert [(f.path, f.traces, f.missing) for f in summary.fragments] == [
        ("/t2 -> proc2 -> proc3", 1, ("start",))
    ]


# -- the lease in one process, and bad requests --------------------------------------------------


class _Source:
    trace_countdown = 1


def test_a_process_ends_its_lease_by_itself_where_a_trace_would_start() -> None:
    set_own_rate(5, "set_trace_rate")
    apply_lease({"id": "L9", "rate": 1, "remaining": 2.5})
    state = TRACING.state()
    assert (state["rate"], state["own"], state["lease"]) == (1, 5, "L9")
    assert 2.5 < state["left"] <= 2.5 + TRACE_LEASE_GRACE
    assert carry(_Source()) is not None and carry(_Source()) is not None  # one in 1
    # Its deadline passes (no server, no loop needed): the next publish is at the
    # process's own rate again.
    assert TRACING.lease is not None
    TRACING.lease.deadline = 0
    TRACING.update()
    source = _Source()
    assert carry(source) is not None  # (its countdown was 1) ...
    assert TRACING.lease is None and TRACING.rate == 5 and source.trace_countdown == 5
    assert TRACING.state() == {
        "rate": 5,
        "own": 5,
        "own_source": "set_trace_rate",
        "lease": None,
        "left": None,
    }
    # A server without a lease: any held is dropped.
    apply_lease({"id": "L10", "rate": 1, "remaining": 30})
    apply_lease(None)
    assert TRACING.lease is None and TRACING.rate == 5
    for bad in ({"id": 1, "rate": 1, "remaining": 1}, {"id": "x", "rate": -1, "remaining": 1},
                {"id": "x", "rate": 1, "remaining": float("inf")}, {"id": "x", "rate": True,
                "remaining": 1}, [1]):  # fmt: skip
        with pytest.raises(ProtocolError, match="trace lease"):
            apply_lease(bad)


async def test_a_malformed_lease_request_gets_a_precise_error_and_the_server_keeps_running(
    server: ezflow.GraphServer,
) -> None:
    client = await GraphClient.connect(
        server.address, name="raw", on_routes=lambda *_: None, on_lost=lambda _: None
    )
    try:
        for op, fields, text in (
            ("trace_lease", {"rate": "often", "duration": 1}, "trace_lease rate='often' must be"),
            ("trace_lease", {"rate": -1, "duration": 1}, "trace_lease rate=-1 must be 0"),
            ("trace_lease", {"rate": 1, "duration": 0}, "trace_lease duration=0 must be"),
            ("trace_lease", {"rate": 1, "duration": "3"}, "trace_lease duration='3' must be"),
            ("trace_lease", {"rate": 1, "duration": 1e9}, "at most 3600 (TRACE_LEASE_MAX)"),
            ("trace_lease", {"rate": 1}, "trace_lease needs rate"),
            ("end_trace_lease", {"lease": 5}, "end_trace_lease lease=5 must be a lease id"),
        ):
            with pytest.raises(GraphError, match=re.escape(text)):
                await client.request(op, **fields)
            assert server.trace_lease is None
        # The same connection goes on, and a good lease works.
        await client.request("ping")
        reply = await client.request("trace_lease", rate=4, duration=30)
        assert reply["lease"]["rate"] == 4 and reply["unconfirmed"] == []
        assert TRACING.lease is not None and TRACING.rate == 4  # (this process is a client)
        # A process that connects while the lease runs gets the rest of it in welcome ...
        TRACING.lease = None
        TRACING.update()
        late = await GraphClient.connect(
            server.address, name="late", on_routes=lambda *_: None, on_lost=lambda _: None
        )
        late.close()
        assert TRACING.lease is not None and TRACING.lease.id == reply["lease"]["id"]
        assert 0 < TRACING.state()["left"] <= 30 + TRACE_LEASE_GRACE
        # ... and one that connects to a server without a lease (a new one) drops it.
        async with ezflow.GraphServer(("127.0.0.1", 0), watch_rings=False) as new:
            fresh = await GraphClient.connect(
                new.address, name="fresh", on_routes=lambda *_: None, on_lost=lambda _: None
            )
            fresh.close()
        assert TRACING.lease is None and TRACING.rate == 0
        apply_lease({"id": reply["lease"]["id"], "rate": 4, "remaining": 30})
        ended = await client.request("end_trace_lease", lease="not it")
        assert ended["ended"] is None and server.trace_lease is not None
        ended = await client.request("end_trace_lease", lease=reply["lease"]["id"])
        assert ended["ended"]["id"] == reply["lease"]["id"] and server.trace_lease is None
        assert TRACING.lease is None
        # A malformed trace_state notice costs only its own connection.
        client._protocol.send_message({"op": "trace_state", "version": 1, "state": {"rate": -1}})
        await eventually(lambda: not client.connected, 5, "the bad connection closed")
        async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
            assert (await ctx.graph())["server_id"] == server.server_id
    finally:
        client.close()
