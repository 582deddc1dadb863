"""``ezflow zenoh bridge``'s per-mapping options, ``ezflow graph/top --fleet --config``,
and the fleet commands as the help and the docs write them, run as written.

The mapping grammar and the topic rules are checked in this process; the bridges, the
router and the fleet views are real ``ezflow`` processes: on loopback for one bridge per
host with a lossless and a leaky mapping, and in network namespaces (tests/_netns.py,
root) for the examples, which name fixed addresses and ports - in a namespace of their
own those are free. The docs' worked example runs across two namespaces (with their own
host names) through a router that admits only hosts with a certificate from the fleet's
CA (mutual TLS), with the certificates and Zenoh files of docs/security.md, as written.
Needs ``ezflow-pubsub[zenoh]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import _netns as netns
import pytest
from _proc import Child
from _zenoh_cli_peers import SCRIPT as PEERS
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

pytest.importorskip(
    "zenoh", reason="Eclipse Zenoh is not installed (pip install 'ezflow-pubsub[zenoh]')"
)

import ezflow
from ezflow._cli._app import app
from ezflow._cli._zenoh import MappingSpec, _describe, parse_mapping
from ezflow._core._config import ZENOH_LOSSLESS_QUEUE, ZENOH_QUEUE
from ezflow._zenoh._keys import imported_topic, literal_prefix, topic_to_key
from ezflow._zenoh._session import ZenohSettings, endpoints, session_config

DOCS = Path(__file__).parent.parent / "docs"
# The commands are processes on their default loop: one test loop is enough.
ONE_LOOP = pytest.mark.asyncio(loop_factories=["asyncio"])


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


# -- the mapping grammar -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("/camera/raw", "export", MappingSpec("/camera/raw", None, None, None, None)),
        ("/a=f/{host}/a:lossless", "export", MappingSpec("/a", "f/{host}/a", True, None, None)),
        ("/a:leaky=4:raw", "export", MappingSpec("/a", None, False, 4, "raw")),
        ("/a:raw:lossless=2", "export", MappingSpec("/a", None, True, 2, "raw")),
        ("e/*/%/c=/c:json:leaky", "import", MappingSpec("e/*/%/c", "/c", False, None, "json")),
        ("plain/key", "import", MappingSpec("plain/key", None, None, None, None)),
        # '::' and '==' are a ':' and a '=' inside a name, read from the left.
        ("ns::a==1=k==v:lossless", "export", MappingSpec("ns:a=1", "k=v", True, None, None)),
        ("a:::leaky", "export", MappingSpec("a:", None, False, None, None)),
        ("a===b", "import", MappingSpec("a=", "b", None, None, None)),
    ],
)  # fmt: skip
def test_mapping_specs_parse(text: str, kind: Any, expected: MappingSpec) -> None:
    assert parse_mapping(text, kind) == expected


def _written(name: str) -> str:
    return name.replace(":", "::").replace("=", "==")


@given(
    st.text(min_size=1, max_size=12),
    st.text(min_size=1, max_size=12).filter(lambda t: not t.startswith("=")),
    st.sampled_from(["", ":lossless", ":leaky=3", ":raw", ":raw:lossless=12"]),
)
def test_any_two_names_written_with_doubling_parse_back(
    source: str, destination: str, options: str
) -> None:
    # Topics and keys may hold ':' and '=': doubled, any two names come back as they were
    # (read from the left, a run of '=' is pairs, then the separator: so the second name
    # cannot start with '=').
    spec = parse_mapping(f"{_written(source)}={_written(destination)}{options}", "export")
    assert (spec.source, spec.destination) == (source, destination)
    assert parse_mapping(_written(source) + options, "export").source == source
    assert (spec.lossless, spec.queue, spec.encoding) == {
        "": (None, None, None),
        ":lossless": (True, None, None),
        ":leaky=3": (False, 3, None),
        ":raw": (None, None, "raw"),
        ":raw:lossless=12": (True, 12, "raw"),
    }[options]


def test_the_bridge_prints_each_mappings_queue_as_it_runs() -> None:
    """What ``ezflow zenoh bridge`` prints of each mapping at its start: a leaky one's
    queue (samples), a lossless import's window (messages), the one a spec or --queue
    names, and no queue for a lossless export (its importers' windows bound it)."""
    from ezflow.zenoh import Export, Import  # noqa: PLC0415

    assert _describe(Import("k", "/t"), exported=False) == f"leaky, queue {ZENOH_QUEUE}"
    assert (
        _describe(Import("k", "/t", lossless=True), exported=False)
        == f"lossless, queue {ZENOH_LOSSLESS_QUEUE}"
    )
    assert _describe(Import("k", "/t", lossless=True, queue=8), exported=False) == (
        "lossless, queue 8"
    )
    assert _describe(Export("/t", lossless=True), exported=True) == "lossless"
    assert _describe(Export("/t", queue=3, encoding="raw"), exported=True) == (
        "leaky, queue 3, raw"
    )


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--export", "/x:fast"], "unknown option ':fast'"),
        (["--export", "/x:json"], "':json' is an import's encoding"),
        (["--export", "/x:leaky:lossless"], "two modes (':leaky', ':lossless')"),
        (["--import", "k=/x:raw:json"], "two encodings (':raw', ':json')"),
        (["--export", "/x:leaky=0"], "in ':leaky=0', the queue N must be a whole number >= 1"),
        (["--export", "/x:"], "an empty option"),
        (["--export", "a=b=c"], "a second single '='"),
        (["--export", "=key"], "TOPIC is empty"),
        (["--import", "key="], "TOPIC is empty after '='"),
    ],
)
def test_a_bad_spec_is_named_with_the_form_and_exit_2(args: list[str], problem: str) -> None:
    result = invoke("zenoh", "bridge", "--connect", "tcp/127.0.0.1:9", *args)
    assert result.exit_code == 2
    line = " ".join(result.stderr.split())  # (rich wraps the line on the terminal's width)
    grammar = "TOPIC[=KEY][:lossless[=N]|:leaky[=N]][:raw]"
    if args[0] == "--import":
        grammar = "KEY[=TOPIC][:lossless[=N]|:leaky[=N]][:raw|:json]"
    assert f"error: {args[0]} {args[1]!r}: {problem}" in line
    assert f"The form is {args[0]} {grammar}, with '::' for a ':'" in line


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--export", "/x=a//b"], "'a//b' is not a Zenoh key expression: Invalid Key Expr"),
        (["--export", "/x=a/*"], "'a/*' has a wildcard: a key to publish on has none"),
        (["--import", "a/b#c=/x"], "'a/b#c' is not a Zenoh key expression"),
    ],
)
def test_a_key_zenoh_refuses_stops_the_bridge_before_it_starts(
    args: list[str], problem: str
) -> None:
    result = invoke("zenoh", "bridge", "--connect", "tcp/127.0.0.1:9", *args)
    assert result.exit_code == 2
    assert f"{args[0]} {args[1]!r}: {problem}" in " ".join(result.stderr.split())


# -- topics of wildcard imports -------------------------------------------------------------

_CHUNK = st.text(min_size=1, max_size=8).filter(lambda t: "\x00" not in t and "/" not in t)


@given(st.text(min_size=1, max_size=30).filter(lambda t: "\x00" not in t), _CHUNK)
def test_a_wildcard_import_gives_prefix_host_and_topic(topic: str, host: str) -> None:
    # Any topic exported by any host under ezflow/<host>/ arrives on the import's topic,
    # the host and the topic's chunks: no doubled '/', no '%'.
    key = topic_to_key(topic, topic_to_key(host, "ezflow"))
    expected = "/".join(["/robots", host, *(chunk for chunk in topic.split("/") if chunk)])
    assert imported_topic("/robots", key, "ezflow") == expected
    assert imported_topic("/robots/", key, literal_prefix("ezflow/*/**") or "") == expected


def test_literal_prefixes_and_default_import_topics() -> None:
    assert literal_prefix("ezflow/robot1/%/camera") is None
    assert literal_prefix("ezflow/*/%/camera/raw") == "ezflow"
    assert literal_prefix("a/b/$*x/c") == "a/b"
    assert literal_prefix("**") == ""
    assert imported_topic("/r1", "ezflow/robot1/%/camera/raw", "ezflow/robot1") == "/r1/camera/raw"
    assert imported_topic("", "a/b%2Fc/d", "") == "/a/b/c/d"
    with pytest.raises(ezflow.ConfigurationError, match="not under"):
        imported_topic("/x", "other/key", "ezflow")


# -- the fleet views' options and the Zenoh configuration file ------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["graph", "--config", "ws.json5"], "--config goes with --fleet DOMAIN"),
        (["top", "--connect", "tcp/127.0.0.1:9", "--config", "f"], "--connect and --config go"),
        (["graph", "--fleet", "lab"], "--fleet needs --connect ROUTER"),
        (["top", "--fleet", "lab", "--config", "/no/such.json5"], "cannot read the Zenoh"),
    ],
)
def test_fleet_options_are_checked(args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())


def test_endpoints_not_given_come_from_the_file(tmp_path: Path) -> None:
    file = tmp_path / "client.json5"
    file.write_text('{connect: {endpoints: ["tcp/10.1.2.3:7447"]}, listen: {endpoints: []}}')
    from_file = session_config(ZenohSettings(mode="client", config_file=str(file)))
    assert endpoints(from_file, "connect", "client") == ["tcp/10.1.2.3:7447"]
    given = ZenohSettings(mode="client", connect=("tcp/10.9.9.9:7447",), config_file=str(file))
    assert endpoints(session_config(given), "connect", "client") == ["tcp/10.9.9.9:7447"]
    # Nothing listens unless told: not Zenoh's default (every interface).
    assert endpoints(session_config(ZenohSettings()), "listen", "peer") == []
    empty = tmp_path / "empty.json5"
    empty.write_text("{}")
    with pytest.raises(ezflow.ConfigurationError, match=r"connect/endpoints in .*empty\.json5"):
        session_config(ZenohSettings(mode="client", config_file=str(empty)))


def test_zenoh_shared_memory_is_off_unless_a_config_file_says(tmp_path: Path) -> None:
    # On, Zenoh leaves its /dev/shm/*.zenoh pool files behind at exit.
    ours = session_config(ZenohSettings())
    assert json.loads(ours.get_json("transport/shared_memory/enabled")) is False
    file = tmp_path / "shm.json5"
    file.write_text("{transport: {shared_memory: {enabled: true}}}")
    theirs = session_config(ZenohSettings(config_file=str(file)))
    assert json.loads(theirs.get_json("transport/shared_memory/enabled")) is True


def test_a_router_listens_where_its_config_file_says(tmp_path: Path) -> None:
    endpoint = f"tcp/127.0.0.1:{free_port()}"
    (tmp_path / "router.json5").write_text(json.dumps({"listen": {"endpoints": [endpoint]}}))
    router = subprocess.Popen(
        command("ezflow zenoh router --config router.json5"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert router.stdout is not None
        assert router.stdout.readline().endswith(f" listening on {endpoint}\n")
    finally:
        router.terminate()
        router.communicate(timeout=10)


# -- real commands --------------------------------------------------------------------------


def command(line: str) -> list[str]:
    """*line* as a shell reads it (quotes, comments), ``ezflow`` as this interpreter's."""
    words = shlex.split(line, comments=True)
    return [sys.executable, "-m", "ezflow", *words[1:]] if words[0] == "ezflow" else words


def child_env(prefix: tuple[str, ...], **extra: str) -> dict[str, str]:
    """The environment of a child run with *prefix*: in a network namespace (a non-empty
    prefix) without conftest's ``EZFLOW_GRAPH_ADDRESS=127.0.0.1:0``, so that it uses the
    default graph address as the examples do (private to the namespace); on this host
    as it is (commands there name their address)."""
    env = dict(os.environ, **extra)
    if prefix:
        env.pop("EZFLOW_GRAPH_ADDRESS", None)
    return env


def on_host(namespace: str, hostname: str | None = None) -> tuple[str, ...]:
    """The prefix that runs a command in *namespace*, with its own *hostname* if given
    (a UTS namespace: bridges name their host after it)."""
    prefix = netns.on(namespace)
    if hostname is None:
        return prefix
    return (*prefix, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname)


class Command:
    """A long-running ``ezflow`` command (a router, a bridge, a graph server) until it
    is stopped: SIGTERM, then SIGKILL."""

    def __init__(self, prefix: tuple[str, ...], line: str, cwd: Path) -> None:
        self.line = line
        self.args = (*prefix, *command(line))
        self.env = child_env(prefix)
        self.cwd = cwd
        self.lines: list[str] = []
        self.process: asyncio.subprocess.Process | None = None
        self._stderr = cwd / f"stderr-{id(self)}.txt"

    async def start(self, until: str) -> Command:
        """Start it and read its stdout until a line holding *until*."""
        with self._stderr.open("wb") as stderr:
            self.process = await asyncio.create_subprocess_exec(
                *self.args,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                cwd=self.cwd,
                env=self.env,
            )
        assert self.process.stdout is not None
        while not self.lines or until not in self.lines[-1]:
            line = await asyncio.wait_for(self.process.stdout.readline(), 30)
            if not line:
                await self.process.wait()
                raise AssertionError(f"{self.line!r} exited: {self.stderr()}")
            self.lines.append(line.decode().rstrip("\n"))
        return self

    def stderr(self) -> str:
        return self._stderr.read_text() if self._stderr.exists() else ""

    async def stats(self) -> dict[str, Any]:
        """Stop a bridge (SIGTERM) and return the statistics it prints on the way out."""
        assert self.process is not None and self.process.stdout is not None
        self.process.send_signal(signal.SIGTERM)
        out = (await asyncio.wait_for(self.process.stdout.read(), 30)).decode()
        await asyncio.wait_for(self.process.wait(), 10)
        lines = [line for line in out.splitlines() if line.startswith("stats ")]
        assert lines, (out, self.stderr())
        return dict(json.loads(lines[-1][len("stats ") :]))

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()


async def run(prefix: tuple[str, ...], line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command that ends by itself (``ezflow graph --fleet``), bounded."""
    process = await asyncio.create_subprocess_exec(
        *prefix,
        *command(line),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=child_env(prefix),
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return subprocess.CompletedProcess(line, process.returncode, out.decode(), err.decode())


async def fleet_top(
    prefix: tuple[str, ...], line: str, cwd: Path, hosts: set[str]
) -> subprocess.CompletedProcess[str]:
    """``ezflow top --fleet ... --json`` (*line*) until it has channels of every one of
    *hosts* (each process reports its telemetry about once a second), at most 15 s."""
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        result = await run(prefix, line, cwd)
        if result.returncode != 0 or asyncio.get_running_loop().time() > deadline:
            return result
        if {row["host_name"] for row in json.loads(result.stdout)["channels"]} >= hosts:
            return result
        await asyncio.sleep(0.3)


class Processes:
    """The commands and peers of a test, all stopped on the way out of
    :func:`processes` (peers first, then commands in reverse order: bridges before
    routers and graph servers)."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.commands: list[Command] = []
        self.peers: list[Child] = []

    async def start(self, *specs: tuple[tuple[str, ...], str, str]) -> list[Command]:
        """Start commands at once, each ``(prefix, line, until)`` (see Command.start)."""
        started = [Command(prefix, line, self.cwd) for prefix, line, _ in specs]
        self.commands += started  # (before they start: stopped even if one fails)
        outcomes = await asyncio.gather(
            *(c.start(until) for c, (_, _, until) in zip(started, specs, strict=True)),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return started

    async def peer(self, prefix: tuple[str, ...], role: str, **args: Any) -> Child:
        """A role of tests/_zenoh_cli_peers.py (JSON events, read through ``Child``)."""
        process = await asyncio.create_subprocess_exec(
            *prefix,
            sys.executable,
            PEERS,
            role,
            json.dumps(args),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=child_env(prefix, PYTHONUNBUFFERED="1"),
        )
        self.peers.append(Child(process, role))
        return self.peers[-1]

    async def aclose(self) -> None:
        for child in reversed(self.peers):
            with contextlib.suppress(Exception):
                await child.stop()
            child.kill()
            await child.process.wait()
        for started in reversed(self.commands):
            await started.stop()


@contextlib.asynccontextmanager
async def processes(cwd: Path) -> AsyncIterator[Processes]:
    started = Processes(cwd)
    try:
        yield started
    finally:
        await started.aclose()


async def deliver(publisher: Child, collector: Child, timeout: float = 30) -> list[int]:
    """Probe until the collector has one (Zenoh has routed), say go, and return the
    values the collector took."""
    await collector.event("ready")
    await publisher.event("ready")
    await collector.event("probed", timeout=timeout)  # (else: no probe reached it in time)
    assert publisher.process.stdin is not None
    publisher.process.stdin.write(b"go\n")
    done = await collector.event("done", timeout=timeout)
    return list(done["values"])


# -- one bridge per host: a lossless and a leaky mapping ------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@ONE_LOOP
async def test_one_bridge_per_host_serves_a_lossless_and_a_leaky_mapping(tmp_path: Path) -> None:
    count, probe_every = 300, 0.05
    router = f"tcp/127.0.0.1:{free_port()}"
    async with (
        ezflow.GraphServer(("127.0.0.1", 0)) as server_a,
        ezflow.GraphServer(("127.0.0.1", 0)) as server_b,
        ezflow.GraphContext(server_a.address, auto_start=False) as a,
        ezflow.GraphContext(server_b.address, auto_start=False) as b,
        processes(tmp_path) as started,
    ):
        where_a, where_b = (f"{h}:{p}" for h, p in (server_a.address, server_b.address))
        await started.start(((), f"ezflow zenoh router --listen {router}", "listening"))
        exporter, importer = await started.start(
            ((), f"ezflow zenoh bridge --connect {router} -a {where_a} "
             "--export /a/slow=test/slow:lossless --export /a/fast=test/fast:leaky=4",
             "export /a/fast"),
            ((), f"ezflow zenoh bridge --connect {router} -a {where_b} "
             "--import test/slow=/b/slow:lossless=8 --import test/fast=/b/fast:leaky=4",
             "import test/fast"),
        )  # fmt: skip
        assert exporter.lines == [
            "export /a/slow -> test/slow (lossless)",
            "export /a/fast -> test/fast (leaky, queue 4)",
        ]
        assert importer.lines == [
            "import test/slow -> /b/slow (lossless, queue 8)",
            "import test/fast -> /b/fast (leaky, queue 4)",
        ]
        sinks = {name: await b.subscriber(f"/b/{name}") for name in ("slow", "fast")}
        sources = {name: await a.publisher(f"/a/{name}") for name in ("slow", "fast")}
        for source in sources.values():
            await source.wait_for_channels(1)  # the exporting bridge's subscribers

        async def probe(name: str) -> tuple[int, int]:
            """Probe -1, -2, ... until one arrives (the mapping is routed; later ones are
            on their way, in order): the index of the first that arrived, and how many
            were sent."""
            k = 0
            while True:
                k += 1
                await sources[name].publish(-k)
                with contextlib.suppress(asyncio.TimeoutError):
                    first = await asyncio.wait_for(sinks[name].recv(), probe_every)
                    return -int(first) - 1, k

        _, (fast_first, fast_probes) = await asyncio.wait_for(
            asyncio.gather(probe("slow"), probe("fast")), 30
        )

        async def consume(name: str) -> list[int]:
            got = []
            async for value in sinks[name]:  # until the end of stream crosses over
                got.append(int(value))
                await asyncio.sleep(0.004)  # a slow consumer: 300 take over a second
            return got

        consumers = [asyncio.ensure_future(consume(name)) for name in ("slow", "fast")]
        for i in range(count):
            await sources["slow"].publish(i)
            await sources["fast"].publish(i)
        for source in sources.values():
            await source.aclose()
        slow, fast = await asyncio.wait_for(asyncio.gather(*consumers), 60)
        exported, imported = await exporter.stats(), await importer.stats()
    # Lossless: every message, in order (after the probes still on their way).
    assert [v for v in slow if v >= 0] == list(range(count))
    assert imported["import test/slow -> /b/slow"]["dropped_local"] == 0
    assert imported["import test/slow -> /b/slow"]["lost_remote"] == 0
    # Leaky: what did not arrive is counted, exactly, from the first sample the importer
    # saw (the first probe that arrived; those before it went nowhere: not yet routed).
    fast_values = [v for v in fast if v >= 0]
    assert fast_values == sorted(set(fast_values))
    out = exported["export /a/fast -> test/fast"]
    into = imported["import test/fast -> /b/fast"]
    assert out["messages"] + out["dropped_local"] == fast_probes + count
    seen = out["messages"] - fast_first  # exported from the first probe that arrived
    assert into["messages"] + into["dropped_local"] + into["lost_remote"] == seen
    assert into["messages"] == len(fast) + 1  # (the first probe was taken in probe())
    drops = out["dropped_local"] + into["dropped_local"] + into["lost_remote"]
    assert drops > 0, "the consumer was slow enough to need drops"
    # Every message from the first seen on arrived or was counted as dropped or lost.
    assert 1 + len(fast) + drops == fast_probes + count - fast_first


# -- the examples, as written, in network namespaces -----------------------------------------


@pytest.fixture
def namespace() -> Iterator[str]:
    try:
        with netns.remote_host() as host:
            yield host.namespace
    except netns.NetnsUnavailable as exc:
        pytest.skip(str(exc))


def help_examples(*words: str) -> list[str]:
    """The examples of ``ezflow WORDS --help`` as it prints them (continued lines
    joined, as a shell would)."""
    result = invoke(*words, "--help")
    assert result.exit_code == 0, result.output
    section = result.stdout.split("Examples:", 1)[1].split("\nOptions:", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.strip()]
    return _joined(lines)


def _joined(lines: list[str]) -> list[str]:
    joined: list[str] = []
    continued = False
    for line in lines:
        if continued:
            joined[-1] = joined[-1][:-1].rstrip() + " " + line
        else:
            joined.append(line)
        continued = joined[-1].endswith("\\")
    return joined


@ONE_LOOP
async def test_the_help_examples_run_as_written(namespace: str, tmp_path: Path) -> None:
    host = on_host(namespace)
    hostname = socket.gethostname()
    routers = help_examples("zenoh", "router")
    bridges = help_examples("zenoh", "bridge")
    views = [e for e in help_examples("graph") + help_examples("top") if "--fleet" in e]
    assert routers == ["ezflow zenoh router", "ezflow zenoh router --listen tcp/127.0.0.1:7448"]
    assert len(bridges) == 4 and len(views) == 2
    ready = ["export /camera/raw", "import ezflow/*/%/camera/raw", "export /odometry", "fleet lab"]
    async with processes(tmp_path) as started:
        # The default ports (graph server, router) are free in a namespace of its own.
        await started.start(
            (host, "ezflow serve", "listening"), *((host, line, "listening") for line in routers)
        )
        running = await started.start(
            *((host, line, until) for line, until in zip(bridges, ready, strict=True))
        )
        assert running[1].lines == [
            f"import ezflow/*/%/camera/raw -> /cams (leaky, queue {ZENOH_QUEUE})"
        ]
        assert running[2].lines == [
            f"export /events -> ezflow/{hostname}/%/events (lossless)",
            f"export /odometry -> ezflow/{hostname}/%/odometry (leaky, queue 2)",
        ]
        collector = await started.peer(
            host, "probe_collect", topic=f"/cams/{hostname}/camera/raw", count=20
        )
        publisher = await started.peer(
            host, "probe_publish", topic="/camera/raw", count=20, end=False
        )
        assert await deliver(publisher, collector) == list(range(20))  # 20 of 20
        graph, top = await asyncio.gather(
            run(host, views[0], tmp_path), fleet_top(host, views[1], tmp_path, {hostname})
        )
    assert graph.returncode == 0, graph.stderr
    assert f"host {hostname}" in graph.stdout and "/camera/raw" in graph.stdout
    assert top.returncode == 0, top.stderr
    assert {row["host_name"] for row in json.loads(top.stdout)["channels"]} == {hostname}


def doc_blocks(page: str, language: str) -> list[str]:
    """The ```LANGUAGE blocks of docs/PAGE, in order."""
    blocks = re.finditer(r"^```(\w*)\n(.*?)^```$", (DOCS / page).read_text(), re.DOTALL | re.M)
    return [block.group(2) for block in blocks if block.group(1) == language]


@pytest.fixture
def example_files(tmp_path: Path) -> Path:
    """docs/security.md's certificates (its openssl commands) and Zenoh files (each
    block names its file in its first line), made as written in *tmp_path*."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the certificates")
    (make_certificates,) = doc_blocks("security.md", "bash")
    subprocess.run(
        ["bash", "-e", "-c", make_certificates], cwd=tmp_path, check=True, capture_output=True
    )
    for block in doc_blocks("security.md", "json5"):
        name = re.match(r"// (\S+\.json5):", block)
        assert name, block
        (tmp_path / name.group(1)).write_text(block)
    return tmp_path


@pytest.fixture
def example_hosts() -> Iterator[netns.TwoHosts]:
    """The worked example's hosts: the router and the workstation on 10.0.0.1, the robot
    on 10.0.0.2 (addresses private to the two namespaces)."""
    try:
        with netns.two_hosts("10.0.0.1", "10.0.0.2") as hosts:
            yield hosts
    except netns.NetnsUnavailable as exc:
        pytest.skip(str(exc))


@ONE_LOOP
async def test_the_worked_example_runs_as_written_over_mutual_tls(
    example_hosts: netns.TwoHosts, example_files: Path
) -> None:
    blocks = [_joined(block.splitlines()) for block in doc_blocks("fleets.md", "bash")]
    (router,), (robot,), (bridge, graph, top), (options,), benchmark = blocks
    assert benchmark == ['sudo "$(command -v ezflow)" perf bridge --rounds 3']  # minutes
    ws, robot1 = on_host(example_hosts.a, "ws"), on_host(example_hosts.b, "robot1")
    async with processes(example_files) as started:
        await started.start(
            (ws, "ezflow serve", "listening"),
            (robot1, "ezflow serve", "listening"),
            (ws, router, "listening"),
        )
        (exporter, *_) = await started.start(
            (robot1, robot, "fleet lab"), (ws, bridge, "fleet lab"), (robot1, options, "import")
        )
        assert exporter.lines[0] == (
            "export /camera/raw -> ezflow/robot1/%/camera/raw (leaky, queue 2)"
        )
        collector = await started.peer(
            ws, "probe_collect", topic="/robots/robot1/camera/raw", count=20
        )
        publisher = await started.peer(
            robot1, "probe_publish", topic="/camera/raw", count=20, pace=0.005, end=False
        )
        assert await deliver(publisher, collector) == list(range(20))  # 20 of 20
        shown, telemetry, refused = await asyncio.gather(
            run(ws, graph, example_files),
            fleet_top(ws, top, example_files, {"robot1", "ws"}),
            run(ws, graph.replace(" --config ws.json5", ""), example_files),  # no certificate
        )
    assert shown.returncode == 0, shown.stderr
    assert "host robot1" in shown.stdout and "host ws" in shown.stdout
    assert telemetry.returncode == 0, telemetry.stderr
    rows = json.loads(telemetry.stdout)
    assert {row["host_name"] for row in rows["channels"]} == {"robot1", "ws"}
    mappings = {(row["host_name"], row["mapping"]) for row in rows["bridges"]}
    assert ("ws", "import ezflow/*/%/camera/raw -> /robots") in mappings
    assert ("robot1", "export /camera/raw -> ezflow/robot1/%/camera/raw") in mappings
    assert refused.returncode == 1
    assert "cannot open a Zenoh session" in refused.stderr


def test_a_router_endpoint_is_loopback_only_on_a_loopback_host() -> None:
    """What decides the router's warning about a listener reachable from the network."""
    from ezflow._cli._zenoh import _is_loopback  # noqa: PLC0415

    for endpoint in ("tcp/127.0.0.1:7447", "tcp/[::1]:7447", "tcp/localhost:7447", "127.0.0.2"):
        assert _is_loopback(endpoint), endpoint
    for endpoint in ("tcp/0.0.0.0:7447", "tcp/10.79.0.1:7447", "tls/[::]:7447", "tcp/host:7447"):
        assert not _is_loopback(endpoint), endpoint
