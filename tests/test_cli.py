"""The graph commands end to end: ``ezflow serve`` and ``ezflow run`` as real processes
(the known graph of tests/_cli_graphs.py), the inspection commands as subprocesses (and
through typer's runner where speed matters), checking what they print."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import queue
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from _proc import ezflow_cli
from _prometheus import http_get, parse_exposition
from conftest import without_shm_notices
from rich.console import Console
from typer.testing import CliRunner

from ezflow._cli._app import app
from ezflow._cli._top import _tables
from ezflow._transports._ezring import RingWriter

GRAPHS = str(Path(__file__).with_name("_cli_graphs.py"))
CHILDREN = str(Path(__file__).with_name("_children.py"))
RATE = 50.0  # _cli_graphs.RATE
EDGES = {
    ("TICKER/SOURCE/OUTPUT", "TICKER/RELAY/INPUT"),
    ("TICKER/RELAY/OUTPUT", "TICKER/SINK/INPUT"),
}
COMMANDS = ["serve", "shutdown", "run", "graph", "topics", "echo", "hz", "top", "trace", "otel"]


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    """typer's runner: the command in this process (fast)."""
    return CliRunner().invoke(app, list(args), env=env)


@dataclass
class Graph:
    address: str
    metrics_url: str
    env: dict[str, str]


def _wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def graph() -> Iterator[Graph]:
    """`ezflow serve` (with metrics) and `ezflow run` of TICKER on it."""
    env = dict(os.environ, EZFLOW_TELEMETRY_INTERVAL="0.2", PYTHONUNBUFFERED="1")
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ezflow",
            "serve",
            "--address",
            "127.0.0.1:0",
            "--metrics-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    run = None
    try:
        assert serve.stdout is not None
        banner = serve.stdout.readline()
        found = re.search(r"listening on (\S+), metrics at (http://\S+/metrics)", banner)
        assert found, banner
        address, metrics_url = found.group(1), found.group(2)
        run = subprocess.Popen(
            [sys.executable, "-m", "ezflow", "run", f"{GRAPHS}:TICKER", "--address", address],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

        def ready() -> bool:
            result = invoke("graph", "--json", "--address", address)
            if result.exit_code != 0:
                return False
            edges = {tuple(e) for e in json.loads(result.stdout)["edges"]}
            return edges == EDGES

        _wait_for(ready, 30, "the TICKER graph to start")
        yield Graph(address, metrics_url, env)
        # SIGINT ends `ezflow run` normally: exit 0.
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=20)
        assert run.returncode == 0, err
        result = ezflow_cli("shutdown", "--address", address)
        assert result.returncode == 0, result.stderr
        assert f"graph server at {address} stopped" in result.stdout
        serve.communicate(timeout=10)
        assert serve.returncode == 0
    finally:
        for process in (run, serve):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()


# -- help and errors (typer's runner) -------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_examples_and_the_address_option(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0
    assert "Examples" in result.stdout
    assert "ezflow " + command in result.stdout
    assert "--address" in result.stdout
    assert "EZFLOW_GRAPH_ADDRESS" in result.stdout


def _help_texts(command: Any, path: str) -> Iterator[tuple[str, str]]:
    yield path, command.help or ""
    for param in command.params:
        yield f"{path} {param.name}", getattr(param, "help", None) or ""
    for name, sub in getattr(command, "commands", {}).items():
        yield from _help_texts(sub, f"{path} {name}")


def test_help_shows_every_character_as_written() -> None:
    # Typer read help as rich markup: "ezflow[zenoh]" lost its "[zenoh]" (a style tag).
    # Help is plain text now: written as it shows, nothing escaped.
    texts = list(_help_texts(typer.main.get_command(app), "ezflow"))
    assert len(texts) > 50
    for where, text in texts:
        assert "\\[" not in text, where
    assert "pip install 'ezflow-pubsub[zenoh]'" in invoke("zenoh", "--help").stdout
    assert "(ezflow-pubsub[zenoh]" in " ".join(invoke("graph", "--help").stdout.split())


def _command_paths() -> list[list[str]]:
    """Every command and group of the app, as the words that name it."""
    found: list[list[str]] = []
    pending: list[tuple[list[str], Any]] = [([], typer.main.get_command(app))]
    while pending:
        words, command = pending.pop()
        found.append(words)
        for name, sub in getattr(command, "commands", {}).items():
            pending.append(([*words, name], sub))
    return found


@pytest.mark.parametrize("words", _command_paths(), ids=lambda w: " ".join(w) or "ezflow")
def test_help_is_plain_text_that_fits_80_columns(words: list[str]) -> None:
    result = invoke(*words, "--help", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = result.stdout
    # No type labels (typer writes <bool>, <str>...), no boxes, no {REQUIRED} arguments.
    assert not re.search(r"<(bool|str|int|float|path|list\[\w+\])>", text), text
    assert not set("╭╮╰╯│─") & set(text), text
    assert not re.search(r"^Usage: .*\{", text, re.MULTILINE), text
    for line in text.splitlines():
        # Reflowed to the width, except the examples: one command a line, as written.
        assert len(line) <= 80 or line.startswith("      "), line
        # Never cut inside an option's name or a package's (--drain-|timeout).
        assert not re.search(r"\w-$", line), line
    # A flag shows no value; an option that takes one says what it takes.
    # The list of commands: whole sentences, not cut short with "...".
    commands = text.partition("\nCommands:\n")[2]
    assert not re.search(r"\.\.\.$", commands, re.MULTILINE), commands
    if words == ["run"]:
        assert re.search(r"^  --single-process +Run every unit", text, re.MULTILINE)
        assert re.search(r"^  -a, --address HOST:PORT +Graph server", text, re.MULTILINE)
        assert text.startswith("Usage: ezflow run [OPTIONS] MODULE_OR_FILE:OBJECT\n")
        assert "      EZFLOW_GRAPH_ADDRESS=127.0.0.1:0 ezflow run examples/" in text


@pytest.mark.parametrize(
    ("args", "message", "usage"),
    [
        (
            ["run", "--bogus"],
            "no such option: --bogus (possible options: --verbose)",
            "ezflow run [OPTIONS] MODULE_OR_FILE:OBJECT",
        ),
        (
            ["run"],
            "missing argument 'MODULE_OR_FILE:OBJECT'",
            "ezflow run [OPTIONS] MODULE_OR_FILE:OBJECT",
        ),
        (["top", "--interval", "x"], "invalid value for '--interval': ", "ezflow top [OPTIONS]"),
        (["grpah"], "no such command 'grpah'", "ezflow [OPTIONS] COMMAND [ARGS]..."),
    ],
)
def test_a_command_line_error_is_one_error_line_and_the_usage(
    args: list[str], message: str, usage: str
) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    first, second = result.stderr.splitlines()
    assert first.startswith(f"error: {message}"), first
    command = usage.split(" [", maxsplit=1)[0]
    assert second == f"usage: {usage}  (`{command} --help` for details)"
    assert result.stdout == ""


def test_every_error_has_the_same_style_in_a_real_process() -> None:
    # The console script's path (not typer's test runner): the parser's error and
    # ezflow's own (a malformed --address) both start with "error: ", no box.
    usage = ezflow_cli("hz", "/x", "--window", "many")
    assert usage.returncode == 2
    assert usage.stderr.startswith("error: invalid value for '--window'")
    assert re.match(r"usage: .*ezflow hz \[OPTIONS\] TOPIC  \(`", usage.stderr.splitlines()[1])
    own = ezflow_cli("topics", "--address", "nowhere")
    assert own.returncode == 2
    assert own.stderr.startswith("error: ") and own.stderr.count("\n") == 1
    for result in (usage, own):
        assert "Traceback" not in result.stderr and "╭" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["graph"],
        ["graph", "--mermaid"],
        ["topics"],
        ["echo", "/x"],
        ["hz", "/x"],
        ["top", "--once"],
        ["trace"],
        ["shutdown"],
    ],
)
def test_an_unreachable_server_is_one_line_and_exit_1(args: list[str]) -> None:
    result = invoke(*args, "--address", "127.0.0.1:1")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no graph server answers at 127.0.0.1:1")
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_the_address_comes_from_the_environment_too() -> None:
    result = invoke("topics", env={"EZFLOW_GRAPH_ADDRESS": "127.0.0.1:2"})
    assert result.exit_code == 1
    assert "no graph server answers at 127.0.0.1:2" in result.stderr
    result = invoke("topics", env={"EZFLOW_GRAPH_ADDRESS": "nowhere"})
    assert result.exit_code == 2
    assert "is not HOST:PORT" in result.stderr


def test_an_unreachable_server_as_a_real_process() -> None:
    result = ezflow_cli("top", "--once", "--address", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.startswith("error: no graph server answers")
    assert "Traceback" not in result.stderr


def test_serve_stops_cleanly_on_ctrl_c() -> None:
    serve = subprocess.Popen(
        [sys.executable, "-m", "ezflow", "serve", "--address", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert serve.stdout is not None
        assert "listening on 127.0.0.1:" in serve.stdout.readline()
        serve.send_signal(signal.SIGINT)
        out, err = serve.communicate(timeout=10)
        assert serve.returncode == 0, err
        assert out == "graph server stopped\n" and without_shm_notices(err) == ""
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.communicate()


def test_serve_refuses_a_port_in_use(graph: Graph) -> None:
    result = invoke("serve", "--address", graph.address)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot listen on {graph.address}: address in use")
    assert f"`ezflow shutdown --address {graph.address}` stops it" in result.stderr
    assert result.stderr.count("\n") == 1


def test_serve_names_the_metrics_port_when_it_is_the_one_in_use() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = invoke("serve", "--address", "127.0.0.1:0", "--metrics-port", str(port))
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: cannot serve metrics on port {port} (127.0.0.1:{port}): address in use; "
        "choose another --metrics-port (0 takes a free one)\n"
    )


# -- the known graph -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["echo", "hz"])
def test_a_topic_that_does_not_exist_is_one_line_and_exit_1(graph: Graph, command: str) -> None:
    result = invoke(command, "/no/such/topic", "--address", graph.address)
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: topic '/no/such/topic' does not exist on the graph server at "
        f"{graph.address} (`ezflow topics` lists them)\n"
    )


def test_graph_mermaid_draws_the_units_in_order_with_live_rates(graph: Graph) -> None:
    """TICKER as written: SOURCE -> RELAY (its own process) -> SINK, left to right,
    the runner's process and RELAY's as clusters, each edge over shm with the msgs/s
    the graph reported (50 Hz); no INPUT_SETTINGS."""

    def drawn() -> str | None:
        result = ezflow_cli("graph", "--mermaid", "--address", graph.address)
        assert result.returncode == 0, result.stderr
        rated = re.findall(r'-->\|"OUTPUT → INPUT<br/>shm · ([\d.]+) msg/s"\|', result.stdout)
        return result.stdout if len(rated) == 2 else None

    text = _wait_for(drawn, 20, "both edges of TICKER to show a rate")
    assert text.startswith("flowchart LR\n")
    assert re.findall(r'^    n\d+\["([^"]+)"\]$', text, re.MULTILINE) == [
        "TICKER/SOURCE",
        "TICKER/RELAY",
        "TICKER/SINK",
    ]
    clusters = re.findall(r'^    subgraph g\d+\["([^"]+)"\]$', text, re.MULTILINE)
    assert len(clusters) == 2 and re.fullmatch(r"ezflow:TICKER/RELAY \(pid \d+\)", clusters[1])
    edges = re.findall(r"^    (n\d) -->\|\"[^\"]*\"\| (n\d)$", text, re.MULTILINE)
    assert edges == [("n0", "n1"), ("n1", "n2")]
    rates = [float(r) for r in re.findall(r"shm · ([\d.]+) msg/s", text)]
    assert all(RATE / 5 < rate < RATE * 5 for rate in rates), rates  # 50 Hz, loosely
    assert "INPUT_SETTINGS" not in text


def test_graph_dot_html_and_tree(graph: Graph, tmp_path: Path) -> None:
    result = invoke("graph", "--dot", "--address", graph.address)
    assert result.exit_code == 0
    assert result.stdout.startswith("digraph ezflow {") and result.stdout.endswith("}\n")
    assert "n0:o_OUTPUT:e -> n1:i_INPUT:w" in result.stdout  # SOURCE -> RELAY, port to port
    assert "n1:o_OUTPUT:e -> n2:i_INPUT:w" in result.stdout  # RELAY -> SINK
    assert "INPUT_SETTINGS" not in result.stdout
    settings = invoke("graph", "--dot", "--settings", "--address", graph.address)
    assert settings.stdout.count('port="i_INPUT_SETTINGS"') == 3  # one per unit
    page = tmp_path / "ticker.html"
    written = invoke("graph", "--html", str(page), "--address", graph.address)
    assert written.exit_code == 0, written.output
    text = page.read_text()
    assert "<script" not in text and "href=" not in text
    assert text.count('<g class="node unit"') == 3 and text.count('<g class="edge">') == 2
    tree = invoke("graph", "--address", graph.address)
    assert tree.exit_code == 0
    assert "TICKER/SOURCE/OUTPUT -> TICKER/RELAY/INPUT" in tree.stdout
    assert "processes (2)" in tree.stdout  # the runner and RELAY's process, not us
    assert "publisher p-" in tree.stdout
    assert invoke("graph", "--dot", "--mermaid", "--address", graph.address).exit_code == 2


def test_graph_lists_the_rings_it_reads_under_their_own_heading(tmp_path: Path) -> None:
    """A graph server registers every live ring of its user: `ezflow graph` lists the
    rings this graph reads (a subscriber of their topic) under "rings", and only counts
    the others - another program's - unless --all-rings."""
    serve = subprocess.Popen(
        [sys.executable, "-m", "ezflow", "serve", "-a", "127.0.0.1:0", "--watch-rings"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    tag = f"t{os.getpid()}"
    collector = None
    try:
        assert serve.stdout is not None
        address = re.search(r"listening on (\S+);", serve.stdout.readline()).group(1)  # type: ignore[union-attr]
        with (
            RingWriter.create(f"{tag}-cam", slot_size=64, topic=f"/rings/{tag}/cam"),
            RingWriter.create(f"{tag}-other", slot_size=64, topic=f"/rings/{tag}/other"),
        ):
            collector = _child(
                "collect", dict(os.environ), address=address, topic=f"/rings/{tag}/cam", count=1
            )
            _event(collector, "ready")

            def both_registered() -> bool:
                result = invoke("graph", "--json", "--address", address)
                rings = [
                    p for p in json.loads(result.stdout)["publishers"] if p["transport"] == "ezring"
                ]
                return len(rings) == 2

            _wait_for(both_registered, 15, "the graph server to register both rings")
            tree = invoke("graph", "--address", address, env={"COLUMNS": "200"}).stdout
            every = invoke(
                "graph", "--all-rings", "--address", address, env={"COLUMNS": "200"}
            ).stdout
    finally:
        if collector is not None:
            assert collector.stdin is not None
            collector.stdin.close()
            collector.wait(timeout=20)
            assert collector.stdout is not None
            collector.stdout.close()
        serve.send_signal(signal.SIGINT)
        serve.communicate(timeout=20)
    rings = tree.split("rings (1)")[1]
    assert f"{tag}-cam -> /rings/{tag}/cam (registered by the graph server)" in rings
    assert "1 more ring of this user that no one in this graph reads (--all-rings" in rings
    assert f"/rings/{tag}/other" not in tree  # not among the topics either
    assert f"ezring {tag}-cam" in tree.split("edges (")[0]  # the publisher of its topic
    assert "rings (2)" in every
    assert (
        f"{tag}-other -> /rings/{tag}/other (registered by the graph server, read by no one here)"
        in every
    )


def test_topics(graph: Graph) -> None:
    result = invoke("topics", "--json", "--address", graph.address)
    assert result.exit_code == 0
    rows = {row["topic"]: row for row in json.loads(result.stdout)}
    assert rows["TICKER/SOURCE/OUTPUT"]["publishers"] == 1
    assert rows["TICKER/SOURCE/OUTPUT"]["to"] == ["TICKER/RELAY/INPUT"]
    assert rows["TICKER/RELAY/INPUT"]["subscribers"] == 1
    table = invoke("topics", "--address", graph.address)
    assert "TICKER/SINK/INPUT" in table.stdout


def test_echo_count_3_prints_3_messages(graph: Graph) -> None:
    result = ezflow_cli("echo", "TICKER/RELAY/OUTPUT", "--count", "3", "--address", graph.address)
    assert result.returncode == 0, result.stderr
    assert re.findall(r"^#(\d+)", result.stdout, re.MULTILINE) == ["1", "2", "3"]
    summaries = re.findall(
        r"^ndarray shape=\(4,\) dtype=float64 min=(\S+) max=(\S+)$", result.stdout, re.MULTILINE
    )
    assert len(summaries) == 3
    for low, high in summaries:  # RELAY doubles [i, i+1, i+2, i+3]
        assert float(high) - float(low) == 6.0


def test_hz_reports_the_publisher_rate(graph: Graph) -> None:
    result = ezflow_cli(
        "hz", "TICKER/SOURCE/OUTPUT", "--duration", "3", "--json", "--address", graph.address
    )
    assert result.returncode == 0, result.stderr
    last = json.loads(result.stdout.splitlines()[-1])
    assert last["rate"] == pytest.approx(RATE, rel=0.2)
    assert last["window"] >= 100
    assert last["min_interval"] <= 1 / RATE <= last["max_interval"]


def test_top_once_shows_every_channel(graph: Graph) -> None:
    def channels() -> list[dict[str, Any]]:
        result = invoke("top", "--once", "--json", "--address", graph.address)
        assert result.exit_code == 0, result.stderr
        found = json.loads(result.stdout)["channels"]
        return found if len(found) >= 2 and all(c["msgs_per_s"] > 0 for c in found) else []

    rows = {row["topic"]: row for row in _wait_for(channels, 10, "both channels reported")}
    relay_in = rows["TICKER/SOURCE/OUTPUT"]  # received in RELAY's process, over shm
    assert relay_in["transport"] == "shm"
    assert relay_in["process"] == "ezflow:TICKER/RELAY"
    assert relay_in["drops"] == 0
    # The rate is over the last telemetry interval (0.2 s here: 10 messages), which one
    # late tick and its catch-up swing by 20-40% on a loaded machine (69.8 at load 8):
    # top must report the graph's rate, not every window of it.
    rates: list[float] = []

    def at_rate() -> bool:
        rows = {row["topic"]: row for row in channels()}
        rate = rows.get("TICKER/SOURCE/OUTPUT", {}).get("msgs_per_s", 0.0)
        rates.append(rate)
        return bool(rate == pytest.approx(RATE, rel=0.3))

    try:
        _wait_for(at_rate, 10, f"a rate of {RATE} +- 30%")
    except AssertionError as error:
        raise AssertionError(f"{error}; reported: {rates}") from None
    table = ezflow_cli("top", "--once", "--address", graph.address)
    assert table.returncode == 0, table.stderr
    assert "TICKER/RELAY/OUTPUT" in table.stdout and "msgs/s" in table.stdout


@pytest.mark.parametrize("width", [80, 120])
def test_top_fits_the_terminal_width(graph: Graph, width: int) -> None:
    def data() -> dict[str, Any]:
        result = invoke("top", "--once", "--json", "--address", graph.address)
        found: dict[str, Any] = json.loads(result.stdout)
        return found if len(found["channels"]) >= 2 and found["publishers"] else {}

    snapshot = _wait_for(data, 10, "channels and publishers reported")
    console = Console(width=width, record=True)
    console.print(_tables(snapshot, graph.address, console.width))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in text  # no cell cut short
    for row in snapshot["channels"] + snapshot["publishers"]:
        assert row["topic"] in text and f"({row['pid']})" in text
    # The most important stay: latency too, over less useful columns.
    for header in ("topic", "process", "msgs/s", "lat p50", "drops"):
        assert re.search(rf"\b{re.escape(header)}\b", lines[2]), lines[2]
    if width == 80:
        assert "not shown for width: " in text
    all_columns = _tables(snapshot, graph.address, 1000)
    wide = Console(width=1000, record=True)
    wide.print(all_columns)
    assert "not shown" not in wide.export_text()


def test_top_shows_a_header_and_quits_on_q(graph: Graph) -> None:
    once = ezflow_cli("top", "--once", "--address", graph.address)
    assert once.returncode == 0, once.stderr
    assert re.match(
        rf"ezflow top: graph server {re.escape(graph.address)}, \d\d:\d\d:\d\d\n", once.stdout
    )
    # Live, on a terminal of 80 columns: the header says how to quit, and q does.
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 80, 0, 0))
    top = subprocess.Popen(
        [sys.executable, "-m", "ezflow", "top", "--address", graph.address, "--interval", "0.2"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
        env=dict(graph.env, COLUMNS="80"),
    )
    os.close(terminal)
    screen = b""
    try:
        deadline = time.monotonic() + 30
        while b"quits" not in screen or b"lat p50" not in screen:
            assert time.monotonic() < deadline, screen.decode(errors="replace")
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                screen += os.read(master, 65536)
        os.write(master, b"q")
        assert top.wait(timeout=15) == 0
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen.decode(errors="replace"))
    assert f"ezflow top: graph server {graph.address}, " in text
    assert "; q or Ctrl-C quits" in text
    assert "Traceback" not in text


def test_top_shows_rejoins_only_once_a_channel_rejoined(graph: Graph) -> None:
    def data() -> dict[str, Any]:
        result = invoke("top", "--once", "--json", "--address", graph.address)
        found: dict[str, Any] = json.loads(result.stdout)
        return found if found["channels"] else {}

    snapshot = _wait_for(data, 10, "channels reported")

    def header() -> str:
        console = Console(width=1000, record=True)
        console.print(_tables(snapshot, graph.address, console.width))
        return console.export_text().splitlines()[2]  # the channel table's

    assert all(row["rejoins"] == 0 for row in snapshot["channels"])
    assert "rejoins" not in header()  # a column of zeros is left out
    snapshot["channels"][0]["rejoins"] = 2
    cells = [cell.strip() for cell in header().split("┃")]
    assert "rejoins" in cells


def _child(role: str, env: dict[str, str], **args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CHILDREN, role, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _event(child: subprocess.Popen[str], name: str) -> dict[str, Any]:
    assert child.stdout is not None
    while True:
        line = child.stdout.readline()
        assert line, f"child exited before {name!r}"
        event: dict[str, Any] = json.loads(line)
        if event["event"] == name:
            return event


def test_top_once_json_counts_match_what_was_published(graph: Graph) -> None:
    """Two processes, exact counts: 120 messages published, 120 received by a channel
    of another process, as reported through the graph server."""
    topic = "/cli/exact"
    env = dict(graph.env, EZFLOW_EVENT_LOOP="asyncio")
    collector = _child("collect", env, address=graph.address, topic=topic, count=120)
    publisher = None
    try:
        _event(collector, "ready")
        publisher = _child("publish", env, address=graph.address, topic=topic, count=120, size=8)
        publisher_id = _event(publisher, "ready")["publisher_id"]
        _event(publisher, "done")
        _event(collector, "done")

        def reported() -> dict[str, Any] | None:
            result = invoke("top", "--once", "--json", "--address", graph.address)
            data = json.loads(result.stdout)
            channels = [c for c in data["channels"] if c["publisher_id"] == publisher_id]
            publishers = [p for p in data["publishers"] if p["publisher_id"] == publisher_id]
            if channels and publishers and channels[0]["messages"] == 120:
                return {"channel": channels[0], "publisher": publishers[0]}
            return None

        found = _wait_for(reported, 10, "the counts of /cli/exact")
        assert found["publisher"]["messages"] == 120
        assert found["publisher"]["bytes"] > 120 * 64  # 8 float64 and the header each
        channel = found["channel"]
        assert (channel["messages"], channel["deliveries"], channel["drops"]) == (120, 120, 0)
        assert channel["bytes"] == found["publisher"]["bytes"]
        assert channel["subscriber_stats"][0]["taken"] == 120
        assert channel["subscriber_stats"][0]["callback_errors"] == channel["callback_errors"] == 0
        assert channel["latency_p50_us"] is None or channel["latency_p50_us"] > 0
    finally:
        for child in (publisher, collector):
            if child is not None:
                assert child.stdin is not None
                child.stdin.close()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                assert child.stdout is not None
                child.stdout.close()


def test_prometheus_endpoint_of_ezflow_serve(graph: Graph) -> None:
    def scraped() -> dict[str, Any] | None:
        status, body = http_get(graph.metrics_url)
        assert status == 200
        families = parse_exposition(body)
        samples = families.get("ezflow_channel_messages_total", {}).get("samples", [])
        topics = {labels["topic"] for _, labels, _ in samples}
        return families if {"TICKER/SOURCE/OUTPUT", "TICKER/RELAY/OUTPUT"} <= topics else None

    families = _wait_for(scraped, 10, "both channels in the metrics")
    assert families["ezflow_channel_latency_seconds"]["type"] == "histogram"
    assert families["ezflow_publisher_messages_total"]["type"] == "counter"


# -- ezflow run --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "code", "message"),
    [
        ("complete", 0, None),
        ("failing", 1, "the unit failed on purpose"),
        ("dying", 1, "DIES"),
        ("NOT_A_GRAPH", 2, "NOT_A_GRAPH is a int"),
        ("missing", 2, "has no attribute 'missing'"),
    ],
)
def test_run_exit_codes(target: str, code: int, message: str | None) -> None:
    # --quiet: no start line (tests/test_cli_run.py checks it), so stderr is the error.
    result = ezflow_cli("run", f"{GRAPHS}:{target}", "--address", "127.0.0.1:0", "--quiet")
    assert result.returncode == code, result.stderr
    stderr = without_shm_notices(result.stderr)
    if message is None:
        assert stderr == ""
    else:
        assert stderr.startswith("error: ")
        assert message in result.stderr


def test_run_a_module_single_process() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ezflow", "run", "_cli_graphs:complete", "--single-process"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(GRAPHS).parent,
        env=dict(os.environ, EZFLOW_GRAPH_ADDRESS="127.0.0.1:0"),
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_run_refuses_what_is_not_a_target() -> None:
    assert "is not MODULE_OR_FILE:OBJECT" in invoke("run", "nothing").stderr
    assert "no such file" in invoke("run", "nope/graph.py:X").stderr
    assert invoke("run", "nope/graph.py:X").exit_code == 2


def test_echo_summarises_arrays_inside_other_messages() -> None:
    import dataclasses  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from ezflow._cli._echo import summarize  # noqa: PLC0415

    @dataclasses.dataclass
    class Frame:
        name: str
        pixels: np.ndarray

    shown = repr(summarize({"a": [np.arange(6).reshape(2, 3)], "f": Frame("x", np.ones(3))}))
    assert "ndarray shape=(2, 3) dtype=int64 min=0 max=5" in shown
    assert "Frame(name='x', pixels=ndarray shape=(3,) dtype=float64 min=1.0 max=1.0)" in shown
    assert repr(summarize(np.array([1 + 2j]))) == "ndarray shape=(1,) dtype=complex128"
    assert summarize("text") == "text"


# -- echo / hz and message classes this process does not know --------------------------

#: A script that defines a registered message class and, run as a script, publishes a
#: Point and a plain dict every 20 ms until its stdin closes: on the wire its class is
#: ``__main__.Point``, the name a script's classes have.
POINTS_SCRIPT = """
import asyncio
import dataclasses
import sys

import ezflow


@ezflow.message
@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: float


async def main(address: str, topic: str) -> None:
    async with ezflow.GraphContext(address, auto_start=False) as ctx:
        pub = await ctx.publisher(topic)
        print("ready", flush=True)
        stop = asyncio.ensure_future(asyncio.to_thread(sys.stdin.read))
        i = 0
        while not stop.done():
            await pub.publish(Point(i, i / 2))
            await pub.publish({"seq": i})
            i += 1
            await asyncio.sleep(0.02)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
"""
POINTS_TOPIC = "/cli/points"
HINT = (
    "message type '__main__.Point' is not registered in this process: use --import "
    "MODULE_OR_FILE to load the module that defines it (a script's class: --import the "
    "script's file)"
)


@pytest.fixture(scope="module")
def points(graph: Graph, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real publisher process of POINTS_SCRIPT on the graph; the script's path."""
    script = tmp_path_factory.mktemp("points") / "points_script.py"
    script.write_text(POINTS_SCRIPT)
    publisher = subprocess.Popen(
        [sys.executable, str(script), graph.address, POINTS_TOPIC],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=graph.env,
    )
    try:
        assert publisher.stdout is not None
        assert publisher.stdout.readline() == "ready\n"
        yield script
    finally:
        assert publisher.stdin is not None
        publisher.stdin.close()
        try:
            assert publisher.wait(10) == 0
        finally:
            if publisher.poll() is None:
                publisher.kill()
                publisher.wait()
            assert publisher.stdout is not None
            publisher.stdout.close()


@pytest.mark.parametrize("how", ["file", "module"])
def test_echo_import_a_script_shows_its_message_class(graph: Graph, points: Path, how: str) -> None:
    """``--import path/to/script.py`` (or the module name, found in the current
    directory) makes the script's class known under the name its publisher uses."""
    target = str(points) if how == "file" else points.stem
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ezflow",
            "echo",
            POINTS_TOPIC,
            "--count",
            "6",
            "--import",
            target,
            "--address",
            graph.address,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=points.parent,
        env=graph.env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert re.findall(r"^#(\d+)", result.stdout, re.MULTILINE) == ["1", "2", "3", "4", "5", "6"]
    assert len(re.findall(r"^Point\(x=\d+, y=[\d.]+\)$", result.stdout, re.MULTILINE)) >= 2
    assert "undecodable" not in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("mode", ["leaky", "lossless"])
def test_echo_names_an_unknown_message_type_once(graph: Graph, points: Path, mode: str) -> None:
    options = ["--lossless"] if mode == "lossless" else []
    result = ezflow_cli(
        "echo", POINTS_TOPIC, "--count", "6", *options, "--address", graph.address, env=graph.env
    )
    assert result.returncode == 0, result.stderr
    # The dicts are shown, each Point counted; the reason once, with the fix.
    assert len(re.findall(r"^\{'seq': \d+\}$", result.stdout, re.MULTILINE)) == 6
    undecodable = [int(n) for n in re.findall(r"(\d+) undecodable so far", result.stdout)]
    assert len(undecodable) >= 5 and undecodable == sorted(undecodable)
    assert "dropped" not in result.stdout  # undecodable, not dropped for lack of room
    assert result.stderr == f"note: {HINT}\n"


def test_hz_counts_undecodable_messages(graph: Graph, points: Path) -> None:
    result = ezflow_cli(
        "hz", POINTS_TOPIC, "--duration", "1.2", "--json", "--address", graph.address
    )
    assert result.returncode == 0, result.stderr
    last = json.loads(result.stdout.splitlines()[-1])
    # 50 Points and 50 dicts a second: the dicts timed, the Points counted.
    assert last["messages"] >= 10 and last["undecodable"] >= 10
    assert abs(last["messages"] - last["undecodable"]) <= 3
    assert last["dropped"] == 0
    assert result.stderr == f"note: {HINT}\n"


class _Lines:
    """The lines of a child's pipe, read by a thread (a buffered pipe and select() do
    not mix), to wait for one with a timeout."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._lines.put(line)

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line with {text!r}; seen {self.seen}") from None
            self.seen.append(line)
            if text in line:
                return line

    def rest(self) -> list[str]:
        """Every line, once the child has exited (the pipe is then closed)."""
        self._thread.join(10)
        self._stream.close()
        while not self._lines.empty():
            self.seen.append(self._lines.get())
        return self.seen


def test_echo_says_when_the_stream_ends_and_waits(graph: Graph, points: Path) -> None:
    """A publisher that ends: echo says so once (stderr) and waits for the next one."""
    topic = "/cli/ending"
    publisher = subprocess.Popen(
        [sys.executable, str(points), graph.address, topic],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=graph.env,
    )
    echo = None
    try:
        assert publisher.stdout is not None and publisher.stdin is not None
        assert publisher.stdout.readline() == "ready\n"
        echo = subprocess.Popen(
            [sys.executable, "-m", "ezflow", "echo", topic, "--address", graph.address],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=graph.env,
        )
        out, err = _Lines(echo.stdout), _Lines(echo.stderr)
        out.wait_for("{'seq': ", 20)
        publisher.stdin.close()  # the publisher returns: its end of stream goes out
        assert publisher.wait(10) == 0
        line = err.wait_for("end of stream", 10)
        assert line == (
            f"note: end of stream on '{topic}': every publisher has ended; waiting for a new "
            "one (Ctrl-C to stop)\n"
        )
        assert echo.poll() is None  # still waiting
        echo.send_signal(signal.SIGINT)
        assert echo.wait(10) == 0
        out.rest()
        assert sum("end of stream" in line for line in err.rest()) == 1  # said once
    finally:
        for process in (echo, publisher):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        assert publisher.stdout is not None
        publisher.stdout.close()


def test_hz_text_lines_show_the_undecodable_count(capsys: pytest.CaptureFixture[str]) -> None:
    from collections import deque  # noqa: PLC0415

    from ezflow._cli._echo import _rate_line, _show_rate  # noqa: PLC0415

    _show_rate(_rate_line(deque([0.0, 0.02, 0.04]), 3, 0, 7), as_json=False)
    _show_rate(_rate_line(deque([0.0]), 1, 0, 5), as_json=False)
    _show_rate(_rate_line(deque([0.0, 0.02]), 2, 0, 0), as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("rate: 50.00 msg/s") and lines[0].endswith("  undecodable: 7")
    assert lines[1] == "1 messages so far  undecodable: 5; waiting for more"
    assert "undecodable" not in lines[2]


def test_import_a_file_inside_a_package(tmp_path: Path) -> None:
    """``--import pkg/mod.py`` imports ``pkg.mod`` (relative imports work, and its
    classes have the names a program importing ``pkg.mod`` sends), and also knows them
    under their script names."""
    package = tmp_path / "clidocs_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text("import dataclasses\nFIELDS = dataclasses.field\n")
    (package / "mod.py").write_text(
        "import dataclasses\nimport ezflow\nfrom .base import FIELDS\n\n"
        "@ezflow.message\n@dataclasses.dataclass\nclass Point:\n    x: int = FIELDS(default=0)\n"
    )
    check = (
        "import sys\n"
        "from ezflow._cli._echo import _import_modules\n"
        "from ezflow._core._codec._registry import _TYPES_BY_NAME\n"
        "_import_modules([sys.argv[1]])\n"
        "print(sorted(n for n in _TYPES_BY_NAME if n.endswith('Point')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", check, "clidocs_pkg/mod.py"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "['__main__.Point', 'clidocs_pkg.mod.Point']\n"


def test_an_import_that_fails_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # --import puts directories on it
    broken = tmp_path / "broken_messages.py"
    broken.write_text("import dataclasses\nraise RuntimeError('no database here')\n")
    cases = {
        "no_such_module_here": "cannot import no_such_module_here (--import): "
        "ModuleNotFoundError: No module named 'no_such_module_here'",
        str(tmp_path / "missing.py"): f"no such file: {tmp_path / 'missing.py'} (--import)",
        str(broken): f"cannot import {broken} (--import): RuntimeError: no database here",
    }
    for command in ("echo", "hz"):
        for target, message in cases.items():
            result = invoke(command, "/x", "--import", target, "--address", "127.0.0.1:1")
            assert result.exit_code == 2, result.stderr
            # An error raised by the module's code comes with its traceback first.
            assert result.stderr.endswith(f"error: {message}\n")
            if target == str(broken):
                assert f'File "{broken}", line 2, in <module>' in result.stderr
            else:
                assert result.stderr == f"error: {message}\n"
