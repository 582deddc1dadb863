"""ezflow.zenoh: topics bridged between two graph servers through a Zenoh router (the
``ezflow zenoh router`` command, a real process); needs ``ezflow[zenoh]`` (skipped
without it; the CI installs it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import _netns as netns
import numpy as np
import pytest
from _proc import Child
from conftest import loop_kind
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("zenoh", reason="Eclipse Zenoh is not installed (pip install 'ezflow[zenoh]')")

import ezflow
from ezflow.zenoh import (
    Export,
    Import,
    ZenohBridge,
    ZenohBridgeSettings,
    ZenohBridgeUnit,
    ZenohSettings,
    key_to_topic,
    open_session,
    topic_to_key,
)

_FORBIDDEN = set("*$?#")


@given(st.text(min_size=1, max_size=40).filter(lambda t: "\x00" not in t))
def test_topic_key_round_trip(topic: str) -> None:
    key = topic_to_key(topic, "ezflow/host")
    assert key.startswith("ezflow/host/")
    chunks = key.split("/")
    assert all(chunks) and not any(c in _FORBIDDEN for c in key)
    assert key_to_topic(key, "ezflow/host") == topic


def test_settings_are_checked() -> None:
    with pytest.raises(ezflow.ConfigurationError, match="has no protocol"):
        ZenohSettings(connect=("127.0.0.1:7447",))
    with pytest.raises(ezflow.ConfigurationError, match="client needs connect"):
        ZenohSettings(mode="client")


async def test_a_bad_config_file_is_named(tmp_path: object) -> None:
    with pytest.raises(ezflow.ConfigurationError, match="cannot read the Zenoh configuration"):
        async with open_session(ZenohSettings(config_file="/no/such/zenoh.json5")):
            pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def router() -> Iterator[str]:
    """``ezflow zenoh router`` on a free loopback port: its endpoint."""
    endpoint = f"tcp/127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "ezflow", "zenoh", "router", "--listen", endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "listening on" in line, process.stderr.read() if process.stderr else line
        yield endpoint
    finally:
        process.terminate()
        process.communicate(timeout=10)


@contextlib.asynccontextmanager
async def two_graphs() -> AsyncIterator[tuple[ezflow.GraphContext, ezflow.GraphContext]]:
    """Two graph servers, as two hosts would have, with a context on each."""
    async with (
        ezflow.GraphServer(("127.0.0.1", 0)) as server_a,
        ezflow.GraphServer(("127.0.0.1", 0)) as server_b,
        ezflow.GraphContext(server_a.address, auto_start=False) as a,
        ezflow.GraphContext(server_b.address, auto_start=False) as b,
    ):
        yield a, b


async def wait_for(predicate: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


async def test_lossless_numpy_messages_cross_in_order_and_intact(router: str) -> None:
    count = 2000
    settings = ZenohSettings(mode="client", connect=(router,))
    async with (
        two_graphs() as (a, b),
        ZenohBridge(
            a,
            settings,
            exports=[Export("/a/data", key="test/{host}/data", lossless=True)],
            host="robot1",
        ),
        ZenohBridge(
            b, settings, imports=[Import("test/robot1/data", "/b/data", lossless=True, queue=8)]
        ) as importer,
    ):
        sink = await b.subscriber("/b/data")
        publisher = await a.publisher("/a/data")
        await publisher.wait_for_channels(1)
        # Zenoh routes the importer's subscription to the exporter asynchronously.
        await asyncio.sleep(1.0)

        async def consume() -> list[np.ndarray]:
            got = []
            for _ in range(count):
                got.append(await sink.recv())
                if len(got) % 200 == 0:
                    await asyncio.sleep(0.05)  # a slow consumer: backpressure, no loss
            return got

        consumer = asyncio.ensure_future(consume())
        for i in range(count):
            await publisher.publish(np.full(256, i, dtype=np.int32))
        received = await asyncio.wait_for(consumer, 60)
        stats = next(iter(importer.stats.values()))
    assert [int(m[0]) for m in received] == list(range(count))
    assert all(m.shape == (256,) and (m == m[0]).all() for m in received)
    assert stats.lost_remote == 0 and stats.dropped_local == 0
    assert stats.latency_p50_us() is not None


async def test_leaky_mapping_counts_every_drop(router: str) -> None:
    count = 500
    settings = ZenohSettings(mode="client", connect=(router,))
    async with (
        two_graphs() as (a, b),
        ZenohBridge(a, settings, exports=[Export("/a/fast", key="test/fast")]) as exporter,
        ZenohBridge(b, settings, imports=[Import("test/fast", "/b/fast", queue=4)]) as importer,
    ):
        sink = await b.subscriber("/b/fast")
        publisher = await a.publisher("/a/fast")
        await publisher.wait_for_channels(1)
        await asyncio.sleep(1.0)
        received: list[int] = []

        async def slow() -> None:
            async for message in sink:  # until the end of stream crosses over
                received.append(message)
                await asyncio.sleep(0.005)

        await publisher.publish(0)  # the first one arrives: the importer counts from it
        received.append(await sink.recv())
        consumer = asyncio.ensure_future(slow())
        for i in range(1, count):
            await publisher.publish(i)
        await publisher.aclose()  # the end crosses over and ends /b/fast
        await asyncio.wait_for(consumer, 30)
        out = next(iter(exporter.stats.values()))
        into = next(iter(importer.stats.values()))
    assert out.messages + out.dropped_local == count
    assert into.messages + into.dropped_local + into.lost_remote == out.messages
    assert received == sorted(received) and len(set(received)) == len(received)
    drops = out.dropped_local + into.dropped_local + into.lost_remote
    assert len(received) + drops == count
    assert drops > 0  # the consumer was slow enough to need them


# -- two hosts (network namespaces), a router, a bridge per host ---------------------------

HOST_A, HOST_B = "10.78.0.1", "10.78.0.2"
# The bridges and the router are CLI processes on their default loop; one test loop is
# enough here (the bridge's own logic runs on both loops in the tests above).
ONE_LOOP = pytest.mark.asyncio(loop_factories=["asyncio"])
ROUTER = f"tcp/{HOST_A}:7447"


@pytest.fixture(scope="module")
def hosts() -> Iterator[netns.TwoHosts]:
    try:
        with netns.two_hosts(HOST_A, HOST_B) as found:
            yield found
    except netns.NetnsUnavailable as exc:
        pytest.skip(str(exc))


class Cli:
    """An ``ezflow`` command in a namespace, stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, namespace: str, *args: str) -> None:
        self.args = (*netns.on(namespace), sys.executable, "-m", "ezflow", *args)
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, ready: str) -> Cli:
        self.process = await asyncio.create_subprocess_exec(
            *self.args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert ready in line.decode(), line
        return self

    async def stats(self) -> dict[str, Any]:
        """Stop the command (SIGTERM) and return the statistics it prints on the way out."""
        assert self.process is not None and self.process.stdout is not None
        self.process.send_signal(signal.SIGTERM)
        out = (await asyncio.wait_for(self.process.stdout.read(), 20)).decode()
        await self.process.wait()
        lines = [line for line in out.splitlines() if line.startswith("stats ")]
        assert lines, out
        return dict(json.loads(lines[-1][len("stats ") :]))

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(sig)
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()


@contextlib.asynccontextmanager
async def fleet(
    hosts: netns.TwoHosts, *, lossless: bool
) -> AsyncIterator[tuple[list[Any], list[Cli], Callable[..., Awaitable[Child]]]]:
    """A graph server per host, the router on host A, a bridge per host (A exports
    /a/data as fleet/a/data, B imports it as /b/data; both announce their graph in
    fleet ``lab`` as robot-a and station-b). Yields the per-host graph
    addresses, the processes, and a function starting a role of tests/_children.py."""
    children: list[Child] = []
    clis: list[Cli] = []

    async def child(role: str, host: str, **args: Any) -> Child:
        started = await Child.start(role, loop_kind(), prefix=netns.on(host), **args)
        children.append(started)
        return started

    try:
        addresses = []
        for host in (hosts.a, hosts.b):
            server = await child("serve", host)
            addresses.append((await server.event("ready"))["address"])
        clis.append(await Cli(hosts.a, "zenoh", "router", "--listen", ROUTER).start("listening"))
        mode = ["--lossless"] if lossless else []
        clis.append(
            await Cli(
                hosts.a,
                "zenoh",
                "bridge",
                "--connect",
                ROUTER,
                "-a",
                addresses[0],
                "--export",
                "/a/data=fleet/a/data",
                *mode,
                *("--fleet", "lab", "--host", "robot-a"),
            ).start("export")
        )
        clis.append(
            await Cli(
                hosts.b,
                "zenoh",
                "bridge",
                "--connect",
                ROUTER,
                "-a",
                addresses[1],
                "--import",
                "fleet/a/data=/b/data",
                *mode,
                *("--fleet", "lab", "--host", "station-b"),
            ).start("import")
        )
        yield addresses, clis, child
    finally:
        for cli in reversed(clis):
            await cli.stop()
        for started in reversed(children):  # the graph servers last
            if started.role == "serve":
                await started.aclose()
            else:  # its cue to close its context (and its shared memory) cleanly
                with contextlib.suppress(Exception):
                    await started.stop()
                await started.aclose()


@ONE_LOOP
async def test_10000_messages_cross_two_hosts_lossless(hosts: netns.TwoHosts) -> None:
    count, size = 10_000, 64
    async with fleet(hosts, lossless=True) as (addresses, _, child):
        receiver = await child(
            "subscribers",
            hosts.b,
            address=addresses[1],
            topic="/b/data",
            subs=1,
            count=count,
            size=size,
        )
        await receiver.event("ready")
        await asyncio.sleep(1.0)  # the import's publisher on /b/data appears with the first
        sender = await child(
            "publish", hosts.a, address=addresses[0], topic="/a/data", count=count, size=size
        )
        await sender.event("ready")
        done = await receiver.event("done", timeout=120)
    assert done["errors"] == [] and done["received"] == [count]


@ONE_LOOP
async def test_the_flow_resumes_after_the_router_restarts(hosts: netns.TwoHosts) -> None:
    async with fleet(hosts, lossless=False) as (addresses, clis, child):
        receiver = await child("progress", hosts.b, address=addresses[1], topic="/b/data")
        await receiver.event("ready")
        sender = await child(
            "publish_until_closed", hosts.a, address=addresses[0], topic="/a/data", pace=0.002
        )
        await sender.event("ready")

        async def arrived(after: int, timeout: float) -> int:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while loop.time() < deadline:
                event = await receiver.event("progress", timeout=timeout)
                if event["n"] > after:
                    return int(event["n"])
            raise AssertionError(f"nothing after {after} within {timeout} s")

        first = await arrived(10, 20)
        router = clis[0]
        await router.stop(signal.SIGKILL)
        stalled = (await receiver.event("progress"))["n"]
        clis[0] = await Cli(hosts.a, "zenoh", "router", "--listen", ROUTER).start("listening")
        restarted = asyncio.get_running_loop().time()
        resumed = await arrived(stalled + 10, 10)
        took = asyncio.get_running_loop().time() - restarted
    assert first <= stalled < resumed
    assert took < 5.0, f"the flow resumed {took:.1f} s after the router restarted"


@ONE_LOOP
async def test_graph_and_top_fleet_list_both_hosts(hosts: netns.TwoHosts) -> None:
    async with fleet(hosts, lossless=False) as (addresses, _, child):
        receiver = await child("progress", hosts.b, address=addresses[1], topic="/b/data")
        await receiver.event("ready")
        sender = await child(
            "publish_until_closed", hosts.a, address=addresses[0], topic="/a/data", pace=0.01
        )
        await sender.event("ready")
        while (await receiver.event("progress"))["n"] < 5:
            pass
        asked = await asyncio.create_subprocess_exec(
            *netns.on(hosts.b),
            sys.executable,
            "-m",
            "ezflow",
            "graph",
            "--fleet",
            "lab",
            "--connect",
            ROUTER,
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(asked.communicate(), 30)
        assert asked.returncode == 0, err.decode()
        graphs = json.loads(out)
        await asyncio.sleep(1.5)  # a telemetry report from every process
        asked = await asyncio.create_subprocess_exec(
            *netns.on(hosts.a),
            sys.executable,
            "-m",
            "ezflow",
            "top",
            "--fleet",
            "lab",
            "--connect",
            ROUTER,
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(asked.communicate(), 30)
        assert asked.returncode == 0, err.decode()
        top = json.loads(out)
    assert set(graphs) == {"robot-a", "station-b"}
    assert "/a/data" in graphs["robot-a"]["topics"]
    assert "/b/data" in graphs["station-b"]["topics"]
    hosts_seen = {(row["host_name"], row["topic"]) for row in top["channels"]}
    assert ("robot-a", "/a/data") in hosts_seen and ("station-b", "/b/data") in hosts_seen
    # The bridges' own counters: what crossed, what was lost, the cross-host latency.
    mappings = {row["host_name"]: row for row in top["bridges"]}
    assert mappings["robot-a"]["mapping"] == "export /a/data -> fleet/a/data"
    assert mappings["station-b"]["mapping"] == "import fleet/a/data -> /b/data"
    assert mappings["station-b"]["messages"] >= 5
    assert mappings["station-b"]["latency_p50_us"] > 0


@ONE_LOOP
async def test_a_leaky_mapping_between_hosts_counts_every_drop(hosts: netns.TwoHosts) -> None:
    count = 3000
    async with fleet(hosts, lossless=False) as (addresses, clis, child):
        receiver = await child(
            "collect_slowly", hosts.b, address=addresses[1], topic="/b/data", delay=0.002
        )
        await receiver.event("ready")
        sender = await child(
            "publish_ints", hosts.a, address=addresses[0], topic="/a/data", count=count
        )
        await sender.event("ready")
        await asyncio.sleep(1.0)  # Zenoh routes the import to the export
        assert sender.process.stdin is not None
        sender.process.stdin.write(b"go\n")
        await sender.event("done")
        # The end crosses over: the receiver's stream ends once it has taken everything.
        values = (await receiver.event("done", timeout=120))["values"]
        exported = next(iter((await clis[1].stats()).values()))
        imported = next(iter((await clis[2].stats()).values()))
    assert values == sorted(values) and len(set(values)) == len(values)
    assert exported["messages"] + exported["dropped_local"] == count
    assert (
        imported["messages"] + imported["dropped_local"] + imported["lost_remote"]
        == exported["messages"]
    )
    assert len(values) == imported["messages"]  # lossless from the bridge to the receiver
    drops = exported["dropped_local"] + imported["dropped_local"] + imported["lost_remote"]
    assert drops > 0 and len(values) + drops == count


class Ticks(ezflow.Unit):
    """Publishes 0..COUNT-1, 5 ms apart, after a second (Zenoh routes meanwhile)."""

    COUNT = 40
    OUTPUT = ezflow.OutputStream(int)

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> AsyncIterator[tuple[Any, int]]:
        await asyncio.sleep(1.0)
        for i in range(self.COUNT):
            yield self.OUTPUT, i
            await asyncio.sleep(0.005)


async def test_bridge_unit_in_its_own_process(router: str) -> None:
    ticks = Ticks()
    bridge = ZenohBridgeUnit(
        ZenohBridgeSettings(
            connect=(router,),
            exports=(Export("TICKS/OUTPUT", key="unit/ticks", lossless=True),),
        )
    )
    async with (
        ezflow.GraphServer(("127.0.0.1", 0)) as server_b,
        ezflow.GraphContext(server_b.address, auto_start=False) as b,
        ZenohBridge(
            b,
            ZenohSettings(mode="client", connect=(router,)),
            imports=[Import("unit/ticks", "/ticks", lossless=True)],
        ),
    ):
        sink = await b.subscriber("/ticks")
        async with ezflow.GraphRunner(
            TICKS=ticks, BRIDGE=bridge, process_components=[bridge], graph_address="127.0.0.1:0"
        ) as runner:
            assert "BRIDGE" in runner.processes
            received = [await asyncio.wait_for(sink.recv(), 30) for _ in range(Ticks.COUNT)]
    assert received == list(range(Ticks.COUNT))


def test_bridge_unit_settings_are_checked_where_written() -> None:
    with pytest.raises(ezflow.ConfigurationError, match="has no protocol"):
        ZenohBridgeSettings(connect=("127.0.0.1:7447",))
    with pytest.raises(ezflow.ConfigurationError, match="queue=0"):
        ZenohBridgeSettings(connect=("tcp/127.0.0.1:7447",), exports=(Export("/x", queue=0),))


def test_a_mapping_names_its_encoding() -> None:
    assert Export("/x").encoding == "ezflow" and Import("k", "/x").encoding == "ezflow"
    assert Export("/x", encoding="raw").encoding == "raw"
    with pytest.raises(
        ezflow.ConfigurationError, match=r"encoding='xml' is not one of 'ezflow', 'raw', 'json'"
    ):
        Import("a/b", "/x", encoding="xml")
