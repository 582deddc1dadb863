"""A control plane that survives: clients restore their registrations on whatever graph
server answers (a restarted one, or one another client starts), and the embedded server
runs in a thread of its own (issue 14, items 1 and 2)."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from _proc import Child

import ezflow
from ezflow._core._protocol import PROTOCOL
from ezflow._graph import _context
from ezflow._graph._embedded import EmbeddedGraphServer

pytestmark = pytest.mark.timeout(60)

PEERS = str(Path(__file__).with_name("_reconnect_peers.py"))


async def peer(role: str, **args: Any) -> Child:
    """Start a role of tests/_reconnect_peers.py (on uvloop, as ezflow would)."""
    env = dict(os.environ, EZFLOW_EVENT_LOOP="uvloop", PYTHONUNBUFFERED="1")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        PEERS,
        role,
        json.dumps(args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    return Child(process, role)


async def command(child: Child, line: str) -> None:
    assert child.process.stdin is not None
    child.process.stdin.write(line.encode() + b"\n")
    await child.process.stdin.drain()


async def status(child: Child) -> dict[str, Any]:
    await command(child, "status")
    return await child.event("status", timeout=10)


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float, what: str, every: float = 0.05
) -> Any:
    """Call *check* until it returns something true; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(every)


async def ezflow_serve(address: str) -> asyncio.subprocess.Process:
    """`ezflow serve` at *address*, once it listens."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ezflow",
        "serve",
        "--address",
        address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    seen = b""
    while b"listening" not in seen:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line, f"ezflow serve exited ({await process.wait()}) before listening"
        seen += line
    return process


async def graph_when_listed(address: str, ids: set[str], timeout: float) -> dict[str, Any]:
    """The graph, once a server answers at *address* and lists every one of *ids*."""
    found: dict[str, Any] = {}

    async def listed() -> bool:
        try:
            async with ezflow.GraphContext(address, auto_start=False, telemetry_interval=0) as ctx:
                graph = await ctx.graph()
        except ezflow.BrokenResourceError:
            return False  # nobody listens there yet
        registered = {p["id"] for p in graph["publishers"]} | {
            s["id"] for s in graph["subscribers"]
        }
        found.update(graph)
        return ids <= registered

    await eventually(listed, timeout, f"{sorted(ids)} registered at {address}")
    return found


async def finish(children: list[Child]) -> None:
    """Let every child end cleanly (its shared memory removed), else kill it."""
    await asyncio.gather(*(child.stop() for child in children), return_exceptions=True)
    for child in children:
        await child.aclose()


def server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ezflow-graph-server"]


# -- in one process --------------------------------------------------------------------


async def test_restore_after_server_restart_logs_once_keeps_ids_and_channels(
    unused_tcp_port: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two contexts (auto_start=False) lose their server and get a new one at the same
    address: channels flow meanwhile, a call needing the server waits (and gives up
    after the wait timeout), everything is registered again under the same ids, one
    warning and one info line per context, and no channel is duplicated."""
    caplog.set_level(logging.INFO, logger="ezflow.context")
    monkeypatch.setattr(_context, "RECONNECT_WAIT_TIMEOUT", 0.3)
    address = ("127.0.0.1", unused_tcp_port)
    server = ezflow.GraphServer(address)
    await server.start()
    try:
        async with (
            ezflow.GraphContext(address, auto_start=False, telemetry_interval=0) as a,
            ezflow.GraphContext(address, auto_start=False, telemetry_interval=0) as b,
        ):
            pub = await a.publisher("/rc/s")
            direct = await b.subscriber("/rc/s")
            await a.connect("/rc/s", "/rc/t")
            via_edge = await b.subscriber("/rc/t")
            for i in range(10):
                await pub.publish(i)
            await server.aclose()
            await eventually(
                lambda: _true(not a.connected and not b.connected), 5, "the outage noticed"
            )
            for i in range(10, 20):  # the data plane does not need the server
                await pub.publish(i)
            with pytest.raises(ezflow.BrokenResourceError, match="keeps reconnecting"):
                await a.graph()
            monkeypatch.undo()
            late = asyncio.ensure_future(b.subscriber("/rc/s"))  # waits for the server
            assert a.server is None and b.server is None  # auto_start=False: none started
            server = ezflow.GraphServer(address)  # binds: nobody took the address
            await server.start()
            late_sub = await asyncio.wait_for(late, 5)
            await eventually(lambda: _true(a.connected and b.connected), 5, "reconnected")
            graph = server.snapshot()
            assert [p["id"] for p in graph["publishers"]] == [pub.id]
            assert {s["id"] for s in graph["subscribers"]} == {direct.id, via_edge.id, late_sub.id}
            assert graph["edges"] == [["/rc/s", "/rc/t"]]
            for i in range(20, 30):
                await pub.publish(i)
            for sub in (direct, via_edge):
                assert [await sub.recv() for _ in range(30)] == list(range(30))
            assert [await late_sub.recv() for _ in range(10)] == list(range(20, 30))
            assert [c.publisher_id for c in b.channels] == [pub.id]  # one channel, kept
        lost = [r for r in caplog.records if "lost the connection" in r.getMessage()]
        back = [r for r in caplog.records if "reconnected to the graph server" in r.getMessage()]
        assert [r.levelno for r in lost] == [logging.WARNING] * 2
        assert [r.levelno for r in back] == [logging.INFO] * 2
    finally:
        await server.aclose()


async def _true(value: bool) -> bool:
    return value


async def test_auto_start_context_takes_over_when_the_owner_leaves(unused_tcp_port: int) -> None:
    """The context that started the embedded server closes while another
    (auto_start=True) is connected: the other starts a server at the same address and
    registers itself there; the owner's server thread is gone."""
    address = ("127.0.0.1", unused_tcp_port)
    owner = ezflow.GraphContext(address, telemetry_interval=0)
    await owner.start()
    async with ezflow.GraphContext(address, telemetry_interval=0) as other:
        try:
            assert owner.server is not None and other.server is None
            assert len(server_threads()) == 1
            sub = await other.subscriber("/to/x")
            pub = await other.publisher("/to/x")
        finally:
            await owner.aclose()
        await eventually(lambda: _true(other.connected), 5, "the takeover")
        assert other.server is not None and other.address == address
        graph = await other.graph()
        assert {p["id"] for p in graph["publishers"]} == {pub.id}
        assert {s["id"] for s in graph["subscribers"]} == {sub.id}
        await pub.publish("after")
        assert await sub.recv() == "after"
    assert server_threads() == []


async def test_shutdown_request_is_not_taken_over(unused_tcp_port: int) -> None:
    """A server stopped on request (`ezflow shutdown`) says so: auto_start contexts
    reconnect when one is started there again, but do not start one."""
    address = ("127.0.0.1", unused_tcp_port)
    server = ezflow.GraphServer(address)
    async with (
        ezflow.GraphContext(address, telemetry_interval=0) as owner,
        ezflow.GraphContext(address, telemetry_interval=0) as other,
    ):
        _, writer = await asyncio.open_connection(*address)
        hello = {"op": "hello", "protocol": PROTOCOL, "pid": 1, "host_id": "h", "nonce": bytes(32)}
        writer.write(_frame(hello))
        writer.write(_frame({"op": "shutdown", "id": 1}))
        await writer.drain()
        await eventually(
            lambda: _true(not owner.connected and not other.connected), 5, "the outage"
        )
        await eventually(lambda: _true(not server_threads()), 5, "the server thread ends")
        await asyncio.sleep(0.3)  # reconnect attempts happen meanwhile
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*address)
        writer.close()
        await server.start()
        await eventually(lambda: _true(owner.connected and other.connected), 5, "reconnected")
        assert len(server.snapshot()["clients"]) == 2
    await server.aclose()
    assert server_threads() == []


def _frame(message: object) -> bytes:
    import struct  # noqa: PLC0415

    import msgpack  # noqa: PLC0415

    body = msgpack.packb(message)
    return struct.pack("<I", len(body)) + body


async def test_embedded_server_that_cannot_bind_leaves_no_thread(unused_tcp_port: int) -> None:
    address = ("127.0.0.1", unused_tcp_port)
    async with ezflow.GraphServer(address):
        embedded = EmbeddedGraphServer(address)
        with pytest.raises(OSError) as info:
            await embedded.start()
        assert info.value.errno == errno.EADDRINUSE
        await eventually(lambda: _true(not server_threads()), 5, "the thread ends")
        await embedded.aclose()


# -- real processes --------------------------------------------------------------------


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_sigkilled_ezflow_serve_restarted_under_a_running_graph(
    unused_tcp_port: int,
) -> None:
    """Issue 14 acceptance: `ezflow serve` SIGKILLed under a publisher process (100 Hz)
    and a lossless subscriber process, then started again at the same address: within
    5 s it lists both again, a third process subscribes and receives, and the original
    subscriber saw every message in order over the one channel it always had. Neither
    client, though started with auto_start, takes the standalone server's address."""
    address = f"127.0.0.1:{unused_tcp_port}"
    serve = await ezflow_serve(address)
    children: list[Child] = []
    try:
        # auto_start=True (the default): clients of a standalone server wait for it to
        # come back rather than take its address (else the restart below could not bind).
        publisher = await peer(
            "publish", address=address, topic="/acc/seq", pace=0.01, auto_start=True
        )
        subscriber = await peer("sequence", address=address, topic="/acc/seq", auto_start=True)
        children += [publisher, subscriber]
        pub_id = (await publisher.event("ready"))["publisher_id"]
        sub_id = (await subscriber.event("ready"))["subscriber_id"]
        await eventually(lambda: _count_at_least(subscriber, 10), 10, "data flowing")
        serve.kill()
        await serve.wait()
        before = (await status(subscriber))["count"]
        await eventually(
            lambda: _count_at_least(subscriber, before + 10), 5, "data flowing in the outage"
        )
        # The publisher's process is stopped while the server restarts, so the subscriber
        # registers again first and its first routes name no publisher: its channel,
        # still up, must be kept (RECONNECT_ROUTE_GRACE), not closed and reopened.
        os.kill(publisher.pid, signal.SIGSTOP)
        try:
            serve = await ezflow_serve(address)
            restarted = time.monotonic()
            await graph_when_listed(address, {sub_id}, 5)
            assert (await status(subscriber))["channels"] == 1
        finally:
            os.kill(publisher.pid, signal.SIGCONT)
        await graph_when_listed(address, {pub_id, sub_id}, 5)
        assert time.monotonic() - restarted < 5
        newcomer = await peer("collect", address=address, topic="/acc/seq", count=5)
        children.append(newcomer)
        values = (await newcomer.event("done", timeout=10))["values"]
        assert values == list(range(values[0], values[0] + 5))
        final = await status(subscriber)
        assert final["gaps"] == []
        assert final["count"] == final["last"] - final["first"] + 1
        assert final["last"] >= values[-1]
        assert final["channels"] == 1
    finally:
        await finish(children)
        serve.kill()
        await serve.wait()


async def _count_at_least(child: Child, count: int) -> bool:
    return bool((await status(child))["count"] >= count)


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_process_that_started_the_server_exits_others_take_over(
    unused_tcp_port: int,
) -> None:
    """Issue 14 acceptance: the process that auto-started the server exits while two
    others publish and subscribe: within 5 s a new subscriber joins and receives, and
    the lossless subscriber lost nothing."""
    address = f"127.0.0.1:{unused_tcp_port}"
    owner = await peer("own", address=address)
    children = [owner]
    try:
        assert (await owner.event("ready"))["owns_server"]
        publisher = await peer(
            "publish", address=address, topic="/to/seq", pace=0.01, auto_start=True
        )
        subscriber = await peer("sequence", address=address, topic="/to/seq", auto_start=True)
        children += [publisher, subscriber]
        pub_id = (await publisher.event("ready"))["publisher_id"]
        sub_id = (await subscriber.event("ready"))["subscriber_id"]
        await eventually(lambda: _count_at_least(subscriber, 10), 10, "data flowing")
        assert await owner.stop() == 0
        left = time.monotonic()
        await graph_when_listed(address, {pub_id, sub_id}, 5)
        newcomer = await peer("collect", address=address, topic="/to/seq", count=5)
        children.append(newcomer)
        values = (await newcomer.event("done", timeout=10))["values"]
        assert time.monotonic() - left < 5 + 3  # + the newcomer's own start-up
        assert values == list(range(values[0], values[0] + 5))
        final = await status(subscriber)
        assert final["gaps"] == [] and final["channels"] == 1
        assert final["count"] == final["last"] - final["first"] + 1
    finally:
        await finish(children)


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_blocked_loop_of_the_server_owner_does_not_delay_other_clients(
    unused_tcp_port: int,
) -> None:
    """Issue 14 acceptance: a 5 s time.sleep in the loop of the process that started the
    embedded server does not delay another client's connect and first request."""
    address = f"127.0.0.1:{unused_tcp_port}"
    owner = await peer("own", address=address)
    try:
        assert (await owner.event("ready"))["owns_server"]
        await command(owner, "sleep 5")
        await owner.event("sleeping")
        started = time.monotonic()
        async with ezflow.GraphContext(address, auto_start=False, telemetry_interval=0) as ctx:
            await ctx.subscriber("/blocked")
            assert {c["name"] for c in (await ctx.graph())["clients"]} >= {ctx.name}
        assert time.monotonic() - started < 1
    finally:
        await owner.aclose()
