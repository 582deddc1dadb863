"""Liveness: the stall policy of lossless edges, heartbeats, dead peers, and rejoins.

Real processes, real sockets: a SIGSTOPped subscriber, a subscriber behind a veth link
that goes down (network namespaces; skipped without root and iproute2), a raw graph
client that falls silent, a tcp connection destroyed from outside (``ss -K``; skipped
where it cannot), and slow but healthy peers that must survive. A subscriber cut by any
of these rejoins once it is back, as a late joiner; a publisher that ended cleanly is
never reopened. Each test runs on one event loop (the behaviour under test is the
loop's timers, not its I/O), and deadlines are short so that the whole file stays
within a few seconds per case.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _netns as netns
import msgpack
import pytest
from _framed import Receiver, receiving
from _netns import ip
from _proc import Child

import ezflow
from ezflow._core._config import (
    ENV_HEARTBEAT_DEADLINE,
    REJOIN_MAX_DELAY,
    heartbeat_deadline_from_env,
)
from ezflow._core._framing import LENGTH
from ezflow._core._liveness import Heartbeat
from ezflow._core._protocol import PROTOCOL
from ezflow._transports._tcp import TcpTransport

PEERS = str(Path(__file__).with_name("_liveness_peers.py"))
ONE_LOOP = pytest.mark.asyncio(loop_factories=["asyncio"])


async def start_peer(role: str, *, prefix: tuple[str, ...] = (), **args: Any) -> Child:
    """Start a role of tests/_liveness_peers.py (through *prefix*, e.g. ``ip netns exec``)."""
    env = dict(os.environ, EZFLOW_EVENT_LOOP="asyncio", PYTHONUNBUFFERED="1")
    process = await asyncio.create_subprocess_exec(
        *prefix,
        sys.executable,
        PEERS,
        role,
        json.dumps(args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    return Child(process, role)


async def until(condition: Any, timeout: float, what: str) -> float:
    """Wait (polling every 10 ms) until *condition()* is true; return the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def status(child: Child) -> dict[str, Any]:
    """Ask a ``stream`` child (tests/_liveness_peers.py) for its status."""
    stdin = child.process.stdin
    assert stdin is not None
    stdin.write(b"status\n")
    await stdin.drain()
    return await child.event("status", timeout=10)


async def flowing(child: Child, value: int, timeout: float) -> dict[str, Any]:
    """The status of a ``stream`` child once it took *value* (polled)."""
    started = time.monotonic()
    while True:
        state = await status(child)
        if state["last"] is not None and state["last"] >= value:
            return state
        assert time.monotonic() - started < timeout, f"not at {value} within {timeout} s: {state}"
        await asyncio.sleep(0.05)


async def telemetry_rejoins(ctx: ezflow.GraphContext, pid: int, timeout: float) -> int:
    """The rejoins the process *pid* reported for its channels (polled until not 0)."""
    found = 0
    started = time.monotonic()
    while not found and time.monotonic() - started < timeout:
        snapshots = await ctx.graph_telemetry()
        found = sum(
            channel.rejoins for s in snapshots.values() if s.pid == pid for channel in s.channels
        )
        await asyncio.sleep(0.1)
    return found


class Feed:
    """Publishes *first*, *first* + 1, ... every 10 ms; a subscriber of this process
    drains the same topic into :attr:`got`."""

    def __init__(self, pub: ezflow.Publisher, healthy: ezflow.Subscriber, first: int = 0) -> None:
        self.pub = pub
        self.first = first
        self.got: list[int] = []
        self._tasks = [
            asyncio.ensure_future(self._publish()),
            asyncio.ensure_future(self._drain(healthy)),
        ]

    async def _publish(self) -> None:
        i = self.first
        while True:
            await self.pub.publish(i)
            i += 1
            await asyncio.sleep(0.01)

    async def _drain(self, healthy: ezflow.Subscriber) -> None:
        async for value in healthy:
            self.got.append(value)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()


# -- stall policy --------------------------------------------------------------------------


@ONE_LOOP
async def test_stall_timeout_rejects_bad_values(ctx: ezflow.GraphContext) -> None:
    for bad in (0, -1.0, float("nan"), True, "2"):
        with pytest.raises(ezflow.ConfigurationError, match="stall_timeout"):
            await ctx.publisher("/bad", stall_timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ezflow.ConfigurationError, match="stall_timeout"):
        ezflow.OutputStream(int, stall_timeout=-3)
    assert ezflow.OutputStream(int, stall_timeout=2).stall_timeout == 2.0
    assert ezflow.OutputStream(int).stall_timeout is None


@ONE_LOOP
async def test_stuck_local_subscriber_is_cut_and_the_other_gets_everything(
    server: ezflow.GraphServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Two contexts: one channel each (subscribers of one context share a channel).
    async with (
        ezflow.GraphContext(server.address, auto_start=False) as ctx,
        ezflow.GraphContext(server.address, auto_start=False) as stuck_ctx,
    ):
        healthy = await ctx.subscriber("/stuck")
        await stuck_ctx.subscriber("/stuck")  # never takes anything
        pub = await ctx.publisher("/stuck", max_in_flight=2, stall_timeout=0.3)
        await pub.wait_for_channels(2)
        started = time.monotonic()
        for i in range(20):
            await pub.publish(i)
            assert await healthy.recv() == i
        elapsed = time.monotonic() - started
        assert pub.statistics().stalled_cut == 1 and pub.channels == 1
        assert 0.25 < elapsed < 3
        assert stuck_ctx.channels == []  # its side saw the channel lost
        [snapshot] = ctx.telemetry().publishers
        assert (snapshot.stalled_cut, snapshot.dead_channels, snapshot.channels) == (1, 0, 1)
        cut = [r for r in caplog.records if "cutting the lossless" in r.getMessage()]
        assert len(cut) == 1 and "local channel" in cut[0].getMessage()


@ONE_LOOP
async def test_stopped_lossless_subscriber_is_cut_after_stall_timeout(
    server: ezflow.GraphServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGSTOPped subscriber process (shm) and a healthy one in this process: with
    ``stall_timeout=2`` the stopped one is cut after about 2 s and the other got every
    message, in order."""
    address = list(server.address)
    child = await start_peer("subscribe", address=address, topic="/stopped")
    try:
        async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
            await child.event("ready")
            healthy = await ctx.subscriber("/stopped")
            pub = await ctx.publisher("/stopped", max_in_flight=4, stall_timeout=2.0)
            await pub.wait_for_channels(2)
            await pub.publish(0)
            assert (await child.event("got"))["value"] == 0
            assert await healthy.recv() == 0
            os.kill(child.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                cut_after = None
                for i in range(1, 41):
                    await pub.publish(i)
                    if cut_after is None and pub.statistics().stalled_cut:
                        cut_after = time.monotonic() - started
                    assert await healthy.recv() == i
                assert cut_after is not None, "the stopped subscriber was never cut"
                assert 1.5 <= cut_after <= 5, cut_after
                assert pub.channels == 1 and pub.statistics().stalled_cut == 1
                [line] = [r for r in caplog.records if "cutting the lossless" in r.getMessage()]
                assert f"pid {child.pid}" in line.getMessage()
                assert "stall_timeout=2" in line.getMessage()
            finally:
                os.kill(child.pid, signal.SIGCONT)
    finally:
        await child.aclose()


# -- heartbeats on tcp data connections ------------------------------------------------------


@ONE_LOOP
async def test_slow_but_healthy_tcp_subscriber_is_not_declared_dead(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Deadline 1.5 s. The subscriber process blocks its loop for 0.7 s (less than the
    deadline) and then awaits for 2 s (longer than it) with the publisher's window full:
    heartbeats keep both ends alive, and every message arrives."""
    monkeypatch.setenv(ENV_HEARTBEAT_DEADLINE, "1.5")
    async with ezflow.GraphServer(("127.0.0.1", 0)) as server:
        child = await start_peer(
            "subscribe",
            address=list(server.address),
            topic="/slow",
            transport="tcp",
            block=0.7,
            sleep=2.0,
            count=30,
        )
        try:
            async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
                await child.event("ready")
                pub = await ctx.publisher("/slow", max_in_flight=2)
                await pub.wait_for_channels(1)
                for i in range(30):
                    await pub.publish(i)
                done = await child.event("done", timeout=20)
                assert done == {"event": "done", "errors": [], "taken": 30}
                assert pub.statistics().dead_channels == 0 and pub.channels == 1
                assert pub.statistics().wait_seconds > 2  # it did wait on the sleeping handler
                assert not [r for r in caplog.records if "silent for" in r.getMessage()]
                assert len(server.snapshot()["clients"]) == 2 and server.dead_clients == 0
        finally:
            await child.aclose()


@ONE_LOOP
async def test_a_process_whose_own_loop_was_blocked_does_not_blame_its_peers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Server, publisher and a tcp subscriber on one loop, blocked for longer than the
    deadline: nothing could be sent or heard meanwhile, and no side declares the other
    dead for it (a late look counts as having heard)."""
    monkeypatch.setenv(ENV_HEARTBEAT_DEADLINE, "1")
    async with (
        ezflow.GraphServer(("127.0.0.1", 0)) as server,
        ezflow.GraphContext(server.address, auto_start=False) as ctx,
    ):
        sub = await ctx.subscriber("/blocked", transport="tcp")
        pub = await ctx.publisher("/blocked")
        await pub.publish(1)
        assert await sub.recv() == 1
        time.sleep(1.5)  # noqa: ASYNC251 - the point: this loop hears nothing meanwhile
        await asyncio.sleep(0.3)  # a look or two after the block
        await pub.publish(2)
        assert await sub.recv() == 2
        assert pub.statistics().dead_channels == 0 and server.dead_clients == 0
        assert [c.transport for c in ctx.channels] == ["tcp"]
        assert not [r for r in caplog.records if "silent for" in r.getMessage()]
        # TCP keepalive backs the heartbeats up, on the data connection and the graph one.
        assert ctx._transports is not None and ctx._client is not None
        [data] = ctx._transports.get("tcp", TcpTransport).connections
        for transport in (data.transport, ctx._client._protocol.transport):
            assert transport is not None
            sock = transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3


def test_heartbeat_deadline_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_HEARTBEAT_DEADLINE, raising=False)
    assert heartbeat_deadline_from_env() == 10.0
    for text, value in (("2.5", 2.5), ("0", 0.0), (" 30 ", 30.0)):
        monkeypatch.setenv(ENV_HEARTBEAT_DEADLINE, text)
        assert heartbeat_deadline_from_env() == value
    for bad in ("soon", "0.1", "-1", "nan", "5000"):
        monkeypatch.setenv(ENV_HEARTBEAT_DEADLINE, bad)
        with pytest.raises(ezflow.ConfigurationError, match=ENV_HEARTBEAT_DEADLINE):
            heartbeat_deadline_from_env()


# -- heartbeats on the graph connection ------------------------------------------------------


def frame(message: object) -> bytes:
    body = msgpack.packb(message)
    return struct.pack("<I", len(body)) + body


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    (size,) = struct.unpack("<I", await reader.readexactly(4))
    return msgpack.unpackb(await reader.readexactly(size))  # type: ignore[no-any-return]


@ONE_LOOP
async def test_silent_graph_client_is_dropped_and_a_quiet_one_is_not(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A raw client completes the handshake, registers a subscriber and falls silent: the
    server declares it dead within the deadline and its registration vanishes. A real
    client that merely has nothing to say (idle for longer than the deadline) stays,
    although its own deadline is 5 s: it learns the server's 1 s from its heartbeats and
    sends often enough for it (at its own pace it would be declared dead)."""
    monkeypatch.setenv(ENV_HEARTBEAT_DEADLINE, "1")
    async with ezflow.GraphServer(("127.0.0.1", 0)) as server:
        monkeypatch.setenv(ENV_HEARTBEAT_DEADLINE, "5")
        # (No telemetry reports: they would keep the connection busy.)
        async with ezflow.GraphContext(
            server.address, auto_start=False, telemetry_interval=0
        ) as ctx:
            await quiet_and_silent_clients(server, ctx, caplog)


async def quiet_and_silent_clients(
    server: ezflow.GraphServer, ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    await ctx.subscriber("/quiet")
    reader, writer = await asyncio.open_connection(*server.address)
    try:
        writer.write(frame({"op": "hello", "protocol": PROTOCOL, "pid": 1, "host_id": "h"}))
        assert (await read_message(reader))["op"] == "welcome"
        writer.write(
            frame(
                {
                    "op": "register_subscriber",
                    "id": 1,
                    "subscriber_id": "s-silent",
                    "topic": "/silent",
                }
            )
        )
        reply = await read_message(reader)
        while reply["op"] != "reply":  # routes come first: the server waits for
            if reply["op"] == "routes":  # them to be applied before it answers
                writer.write(frame({"op": "routes_applied", "version": reply["version"]}))
            reply = await read_message(reader)
        assert reply["ok"]

        def registered() -> set[str]:
            return {s["id"] for s in server.snapshot()["subscribers"]}

        assert "s-silent" in registered()
        # The raw client reads nothing more and sends nothing: silent.
        took = await until(lambda: "s-silent" not in registered(), 5, "dropped")
        assert 0.8 <= took <= 4
        assert server.dead_clients == 1
    finally:
        writer.close()
    await asyncio.sleep(1.2)  # the real client idles for longer than the deadline
    assert len(registered()) == 1 and server.dead_clients == 1
    assert len(server.snapshot()["clients"]) == 1
    lines = [r.getMessage() for r in caplog.records if "silent for" in r.getMessage()]
    assert len(lines) == 1 and "declaring it dead" in lines[0]
    assert "pid 1" in lines[0] and "1 subscribers" in lines[0]


# -- a black-holed tcp subscriber (network namespaces) ---------------------------------------


@pytest.fixture
def remote_host() -> Iterator[tuple[str, str, str, str]]:
    """A network namespace joined to this one (tests/_netns.py): (namespace, its veth
    device, this side's address, its address)."""
    try:
        with netns.remote_host() as host:
            yield host.namespace, host.device, host.here, host.there
    except netns.NetnsUnavailable as exc:
        pytest.skip(str(exc))


@ONE_LOOP
async def test_black_holed_tcp_subscriber_is_declared_dead_and_rejoins_once_healed(
    remote_host: tuple[str, str, str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns, there_dev, here, _ = remote_host
    deadline = 2.0
    monkeypatch.setenv(ENV_HEARTBEAT_DEADLINE, str(deadline))
    # A graph server on a routable address needs a token (once authentication is in);
    # every child inherits it.
    monkeypatch.setenv("EZFLOW_TOKEN", os.urandom(16).hex())
    children: list[Child] = []
    prefix = ("ip", "netns", "exec", ns)
    try:
        async with (
            ezflow.GraphServer((here, 0)) as server,
            ezflow.GraphContext(server.address, auto_start=False) as ctx,
            ezflow.GraphContext(server.address, auto_start=False) as local_ctx,
        ):
            address = list(server.address)
            remote = await start_peer("stream", prefix=prefix, address=address, topic="/bh")
            children.append(remote)
            await remote.event("ready")
            local = await local_ctx.subscriber("/bh")
            pub = await ctx.publisher("/bh", max_in_flight=4)
            await pub.wait_for_channels(2)
            assert [c.transport for c in local_ctx.channels] == ["local"]
            await pub.publish(0)
            assert (await remote.event("got"))["value"] == 0
            assert await local.recv() == 0

            ip("-n", ns, "link", "set", there_dev, "down")  # the black hole
            started = time.monotonic()
            declared = None
            for i in range(1, 61):
                await pub.publish(i)
                if declared is None and pub.statistics().dead_channels:
                    declared = time.monotonic() - started
                assert await local.recv() == i
                await asyncio.sleep(0.05)
                if declared is not None and i > 20:
                    break
            assert declared is not None, "the black-holed subscriber was never declared dead"
            assert declared <= deadline + 3, declared
            assert pub.channels == 1 and pub.statistics().dead_channels == 1
            [snapshot] = ctx.telemetry().publishers
            assert (snapshot.dead_channels, snapshot.stalled_cut) == (1, 0)
            silent = [r.getMessage() for r in caplog.records if "silent for" in r.getMessage()]
            assert any("/bh" in line and "tcp channel from" in line for line in silent)
            # The server dropped the black-holed client too (its connection fell silent).
            await until(lambda: server.dead_clients >= 1, deadline + 3, "client declared dead")

            # Healed: the same subscriber process reconnects to the graph server,
            # registers again and rejoins the publisher, which never stopped.
            ip("-n", ns, "link", "set", there_dev, "up")
            await until(lambda: pub.channels == 2, 15, "the healed subscriber rejoined")
            feed = Feed(pub, local, first=1000)
            try:
                rejoin = await remote.event("rejoin", timeout=10)
                assert rejoin["value"] >= 1000 and rejoin["rejoins"] == 1
                state = await status(remote)
                assert state["ends"] == 0 and state["channels"] == [["tcp", 1]]
                await until(
                    lambda: len(server.snapshot()["subscribers"]) == 2, 10, "registered again"
                )
                assert server.dead_clients == 1
            finally:
                feed.close()
            assert feed.got == list(range(1000, 1000 + len(feed.got)))
    finally:
        for child in children:
            await child.aclose()


# -- rejoin: a cut subscriber that comes back receives again (issue 24) ----------------------


@ONE_LOOP
@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_stopped_subscriber_cut_by_stall_timeout_rejoins_after_sigcont(
    server: ezflow.GraphServer, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGSTOPped lossless subscriber process is cut by ``stall_timeout=2`` while the
    subscriber here keeps receiving; after SIGCONT it receives again within 2 s from the
    publisher that never stopped, as a late joiner: counted (stats, telemetry) and
    logged once, and its stream did not end."""
    child = await start_peer(
        "stream", address=list(server.address), topic="/rejoin", transport=transport
    )
    try:
        async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
            await child.event("ready")
            healthy = await ctx.subscriber("/rejoin")
            pub = await ctx.publisher("/rejoin", max_in_flight=4, stall_timeout=2.0)
            await pub.wait_for_channels(2)
            feed = Feed(pub, healthy)
            try:
                await child.event("got")
                os.kill(child.pid, signal.SIGSTOP)
                try:
                    await until(lambda: pub.statistics().stalled_cut == 1, 8, "the stopped one cut")
                    cut_at = len(feed.got)
                    await until(lambda: len(feed.got) > cut_at + 20, 5, "the other flows on")
                finally:
                    os.kill(child.pid, signal.SIGCONT)
                continued, published = time.time(), pub.statistics().messages
                rejoin = await child.event("rejoin", timeout=10)
                assert rejoin["t"] - continued < 2.0, rejoin["t"] - continued
                assert rejoin["value"] >= published  # published after it came back
                assert rejoin["rejoins"] == 1
                await until(lambda: pub.channels == 2, 5, "two channels again")
                state = await flowing(child, rejoin["value"] + 10, 5)
                assert state["ends"] == 0
                stats = state["stats"]
                assert (stats["rejoins"], stats["publishers_ended"]) == (1, 0)
                assert state["channels"] == [[transport, 1]]
                [line] = state["lines"]
                assert pub.id in line and "'/rejoin'" in line and f"over {transport}" in line
                assert "connection broke without END" in line and "late joiners" in line
                assert await telemetry_rejoins(ctx, child.pid, 5) == 1
            finally:
                feed.close()
            # The healthy subscriber got every message, in order: it never lost one.
            assert feed.got == list(range(len(feed.got))) and len(feed.got) > cut_at + 20
            assert pub.statistics().stalled_cut == 1
            cut = [r for r in caplog.records if "cutting the lossless" in r.getMessage()]
            assert len(cut) == 1
    finally:
        await child.aclose()


@ONE_LOOP
async def test_subscriber_declared_dead_by_heartbeats_reconnects_and_receives_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deadline 1 s. A tcp subscriber process SIGSTOPped for longer: the graph server
    drops it and the publisher declares its channel dead. After SIGCONT it reconnects,
    registers again and rejoins the publisher, which never stopped publishing."""
    monkeypatch.setenv(ENV_HEARTBEAT_DEADLINE, "1")
    async with ezflow.GraphServer(("127.0.0.1", 0), watch_rings=False) as server:
        child = await start_peer(
            "stream", address=list(server.address), topic="/dead", transport="tcp"
        )
        try:
            async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
                await child.event("ready")
                healthy = await ctx.subscriber("/dead")
                pub = await ctx.publisher("/dead", max_in_flight=4)
                await pub.wait_for_channels(2)
                feed = Feed(pub, healthy)
                try:
                    await child.event("got")
                    os.kill(child.pid, signal.SIGSTOP)
                    try:
                        await until(
                            lambda: (
                                pub.statistics().dead_channels == 1 and server.dead_clients == 1
                            ),
                            8,
                            "the stopped one declared dead",
                        )
                        assert len(server.snapshot()["subscribers"]) == 1  # ours only
                    finally:
                        os.kill(child.pid, signal.SIGCONT)
                    continued, published = time.time(), pub.statistics().messages
                    rejoin = await child.event("rejoin", timeout=10)
                    assert rejoin["t"] - continued < 5.0, rejoin["t"] - continued
                    assert rejoin["value"] >= published
                    assert len(server.snapshot()["subscribers"]) == 2  # registered again
                    state = await status(child)
                    assert state["ends"] == 0 and state["channels"] == [["tcp", 1]]
                    assert state["stats"]["rejoins"] == 1
                finally:
                    feed.close()
                assert feed.got == list(range(len(feed.got)))
        finally:
            await child.aclose()


def ss_kill(port: int) -> int:
    """Destroy every established tcp socket of this host connected to local *port*
    (``ss -K``: the kernel resets both ends); the number destroyed."""
    result = subprocess.run(
        [
            "ss",
            "-K",
            "-t",
            "-n",
            "state",
            "established",
            "dst",
            "127.0.0.1",
            "dport",
            "=",
            f":{port}",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=5,
    )
    return max(0, len(result.stdout.strip().splitlines()) - 1)  # (a header line first)


@pytest.fixture
def socket_killer() -> None:
    """Skip unless ``ss -K`` can destroy a socket here (root, a kernel with
    INET_DIAG_DESTROY)."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        try:
            if shutil.which("ss") is None or not ss_kill(listener.getsockname()[1]):
                pytest.skip(
                    "`ss -K` cannot destroy sockets here (needs root and INET_DIAG_DESTROY)"
                )
        finally:
            client.close()
            accepted.close()
    finally:
        listener.close()


@ONE_LOOP
async def test_a_tcp_link_that_goes_down_and_up_reopens_with_backoff(
    server: ezflow.GraphServer, socket_killer: None
) -> None:
    """The tcp connection of a subscriber process's channel is destroyed from outside
    (``ss -K``), and every new one too for 1.5 s (the link is down); then it is left
    alone (up). The channel reopens, with a backoff (a few attempts, not a spin), and
    receives again."""
    child = await start_peer("stream", address=list(server.address), topic="/link", transport="tcp")
    try:
        async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
            await child.event("ready")
            healthy = await ctx.subscriber("/link")
            pub = await ctx.publisher("/link", max_in_flight=4)
            await pub.wait_for_channels(2)
            feed = Feed(pub, healthy)
            try:
                await child.event("got")
                assert ctx._transports is not None
                address = ctx._transports.get("tcp", TcpTransport).address
                assert address is not None
                port = address[1]
                killed = 0
                down_until = time.monotonic() + 1.5
                while time.monotonic() < down_until:
                    killed += await asyncio.to_thread(ss_kill, port)
                    await asyncio.sleep(0.02)
                assert killed >= 1
                state = await flowing(child, pub.statistics().messages + 20, 8)
                rejoins = state["stats"]["rejoins"]
                # Each reopen that was destroyed again waited longer: a few, not a spin.
                assert 1 <= rejoins <= 6, state
                assert state["channels"] == [["tcp", rejoins]] and state["ends"] == 0
                assert state["stats"]["publishers_ended"] == 0
            finally:
                feed.close()
            assert feed.got == list(range(len(feed.got)))
    finally:
        await child.aclose()


@ONE_LOOP
async def test_a_publisher_that_ended_cleanly_is_not_reopened(
    server: ezflow.GraphServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A publisher ends cleanly while one of its subscriber processes is SIGSTOPped, so
    it stays registered (it waits for that one to read END): routes applied meanwhile
    still list it, and the channel that read END is not reopened. Both subscribers get
    EndOfStream, once."""
    caplog.set_level(logging.INFO, logger="ezflow")
    child = await start_peer(
        "stream", address=list(server.address), topic="/ended", transport="tcp"
    )
    try:
        async with (
            ezflow.GraphContext(server.address, auto_start=False) as ctx,
            ezflow.GraphContext(server.address, auto_start=False) as sub_ctx,
        ):
            await child.event("ready")
            sub = await sub_ctx.subscriber("/ended", transport="tcp")
            pub = await ctx.publisher("/ended")
            await pub.wait_for_channels(2)
            for i in range(5):
                await pub.publish(i)
            assert [await sub.recv() for _ in range(5)] == list(range(5))
            await child.event("got")
            os.kill(child.pid, signal.SIGSTOP)
            try:
                closing = asyncio.ensure_future(pub.aclose())
                with pytest.raises(ezflow.EndOfStream):
                    await asyncio.wait_for(sub.recv(), 5)
                assert pub.id in {p["id"] for p in server.snapshot()["publishers"]}
                # New routes for sub_ctx, which still list the ended publisher.
                await sub_ctx.subscriber("/elsewhere")
                assert pub.id in {p["id"] for p in server.snapshot()["publishers"]}
                await asyncio.sleep(0.5)  # a window past REJOIN_MIN_DELAY: no rejoin in it
                assert sub_ctx.channels == []
                with pytest.raises(asyncio.TimeoutError):  # no second end, no message
                    await asyncio.wait_for(sub.recv(), 0.5)
                stats = sub.statistics()
                assert (stats.publishers_ended, stats.publishers_broken, stats.rejoins) == (1, 0, 0)
            finally:
                os.kill(child.pid, signal.SIGCONT)
            assert (await child.event("end", timeout=10))["ends"] == 1
            await asyncio.wait_for(closing, 10)
            await asyncio.sleep(0.3)
            state = await status(child)
            assert state["ends"] == 1 and state["taken"] == 5 and state["stats"]["rejoins"] == 0
            text = "\n".join(r.getMessage() for r in caplog.records)
            assert "rejoined" not in text and "the channel to publisher" not in text
    finally:
        await child.aclose()


@ONE_LOOP
async def test_a_lost_publisher_whose_process_died_is_not_retried_and_ends_the_stream(
    server: ezflow.GraphServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGKILLed publisher process: its channel here is lost; the graph server drops
    the publisher, so the routes no longer list it and no attempt to reopen it follows
    (none for longer than ``REJOIN_MAX_DELAY``); the stream ends, broken, once."""
    caplog.set_level(logging.DEBUG, logger="ezflow.context")
    async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
        sub = await ctx.subscriber("/gone", transport="tcp")
        child = await start_peer("publish", address=list(server.address), topic="/gone")
        try:
            await child.event("ready")
            await asyncio.wait_for(sub.recv(), 5)
            os.kill(child.pid, signal.SIGKILL)
            with pytest.raises(ezflow.EndOfStream):
                while True:
                    await asyncio.wait_for(sub.recv(), 5)
        finally:
            await child.aclose()

        def attempts() -> int:
            return sum("reopen the channel" in r.getMessage() for r in caplog.records)

        before = attempts()
        await asyncio.sleep(REJOIN_MAX_DELAY + 0.5)  # a window: no attempt in it
        assert attempts() == before and ctx.channels == []
        stats = sub.statistics()
        assert (stats.publishers_ended, stats.publishers_broken, stats.rejoins) == (1, 1, 0)
        with pytest.raises(asyncio.TimeoutError):  # ended once
            await asyncio.wait_for(sub.recv(), 0.3)


class _Listener(Receiver):
    """A connection with a real heartbeat that only listens (HeartbeatOwner)."""

    def __init__(self) -> None:
        super().__init__()
        self.silent_after: float | None = None
        self.heartbeat: Heartbeat | None = None

    def send_heartbeat(self, deadline: float) -> None:
        self.send_frame(b"\x0a")

    def peer_silent(self, silence: float, deadline: float) -> None:
        self.silent_after = silence
        self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.heartbeat is not None:
            self.heartbeat.cancel()


@ONE_LOOP
@pytest.mark.parametrize("held_bytes_read_at_looks", [True, False])
async def test_a_slow_link_busy_with_a_large_frame_is_alive(
    held_bytes_read_at_looks: bool,
) -> None:
    """A large frame trickling in (1 KiB every 20 ms, a slow link) while the kernel holds
    its rest back for one read: the heartbeat's looks read what arrived, so the peer is
    heard and not declared dead; once it falls silent, it is, within the deadline. With
    the looks not reading held bytes (the False case: what this test guards against),
    the same link is declared dead though bytes keep coming."""
    loop = asyncio.get_running_loop()
    async with receiving(_Listener) as (listener, client):
        if not held_bytes_read_at_looks:
            listener.read_held_back = lambda: None  # type: ignore[method-assign]
        listener.heartbeat = Heartbeat(listener, 0.5)  # (a look every 0.1 s)
        data = LENGTH.pack(1 << 20) + bytes(1 << 20)
        await loop.sock_sendall(client, data[:100_000])
        sent = 100_000
        start = time.monotonic()
        while time.monotonic() - start < 1.5 and listener.silent_after is None:
            await loop.sock_sendall(client, data[sent : sent + 1024])
            sent += 1024
            await asyncio.sleep(0.02)
        if not held_bytes_read_at_looks:
            assert listener.silent_after is not None
            return
        assert listener.silent_after is None
        # The looks read the held bytes: little of what was sent is left unread.
        assert listener._reader.rest() <= len(data) - 4 - sent + 16 * 1024
        silent_from = time.monotonic()
        while listener.silent_after is None:
            assert time.monotonic() - silent_from < 2.0, "a silent peer was not declared dead"
            await asyncio.sleep(0.01)
        assert listener.frames == []
