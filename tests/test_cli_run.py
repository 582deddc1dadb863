"""What a newcomer meets first with ``ezflow run`` and friends, as real subprocesses: the
version, the start line, the traceback of a broken target, a taken port, a second copy of
a running graph, and every example in the commands' ``--help`` run as written."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import without_shm_notices

from ezflow._cli._app import app

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = str(Path(__file__).with_name("_cli_graphs.py"))


def ezflow(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ezflow", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )


def test_version() -> None:
    result = ezflow("--version")
    assert result.returncode == 0
    assert result.stdout == f"ezflow {version('ezflow')}\n"


def test_run_prints_the_real_address_and_the_processes_once() -> None:
    result = ezflow("run", "examples/signal_pipeline.py:graph", "--address", "127.0.0.1:0")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("ezflow run:")]
    assert len(lines) == 1, result.stderr
    found = re.fullmatch(
        r"ezflow run: graph server 127\.0\.0\.1:(\d+); processes: main pid \d+ "
        r"\(GENERATOR, SINK\), BANDPASS pid \d+ \(BANDPASS\), SPECTRUM pid \d+ \(SPECTRUM\)",
        lines[0],
    )
    assert found and int(found.group(1)) != 0, lines[0]
    assert "spectra received" in result.stdout  # the graph's own output stays on stdout


def test_quiet_prints_no_start_line() -> None:
    result = ezflow("run", "examples/units_quickstart.py:graph", "-q", "-a", "127.0.0.1:0")
    assert result.returncode == 0, result.stderr
    assert without_shm_notices(result.stderr) == ""
    assert result.stdout == "received 100 blocks, peak 2.000\n"


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("import os\n\n\ndef boom():\n    return 1 / 0\n\n\nboom()\n", ["line 8", "line 5"]),
        ("x = (\n", ["line 1", "SyntaxError"]),
        ("import no_such_module_here\n", ["line 1", "ModuleNotFoundError"]),
    ],
)
def test_an_import_error_shows_the_users_traceback(
    tmp_path: Path, source: str, shown: list[str]
) -> None:
    target = tmp_path / "broken.py"
    target.write_text(source)
    result = ezflow("run", f"{target}:GRAPH", cwd=tmp_path)
    assert result.returncode == 2
    assert f'File "{target}"' in result.stderr
    for text in shown:
        assert text in result.stderr
    assert "ezflow/" not in result.stderr and "importlib" not in result.stderr  # only theirs
    assert result.stderr.splitlines()[-1].startswith(f"error: cannot import {target}")


def test_a_wrong_object_name_lists_what_the_file_offers() -> None:
    result = ezflow("run", "examples/units_quickstart.py:grpah")
    assert result.returncode == 2
    assert result.stderr == (
        "error: examples/units_quickstart.py has no attribute 'grpah'; it has: Sine, Scale, "
        "Check, graph, main\n"
    )


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port bound by a program that is not a graph server (and does not listen)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


def test_a_taken_port_says_why_and_what_to_do(taken_port: int) -> None:
    result = ezflow("run", "examples/units_quickstart.py:graph", "-a", f"127.0.0.1:{taken_port}")
    assert result.returncode == 1
    assert f"cannot start a graph server at 127.0.0.1:{taken_port}" in result.stderr
    assert "Address already in use" in result.stderr
    assert "--address 127.0.0.1:0" in result.stderr


def test_a_second_copy_of_a_running_graph_is_refused() -> None:
    first = subprocess.Popen(
        [sys.executable, "-m", "ezflow", "run", f"{GRAPHS}:TICKER", "-a", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stderr is not None
        line = first.stderr.readline()
        while not without_shm_notices(line):
            line = first.stderr.readline()
        found = re.match(r"ezflow run: graph server (\S+);", line)
        assert found, line
        second = ezflow("run", f"{GRAPHS}:TICKER", "-a", found.group(1))
        assert second.returncode == 2
        assert "units of this graph already run on the graph server" in second.stderr
        assert "TICKER/SOURCE (already in ezflow-run pid" in second.stderr
        assert "TICKER/RELAY (already in ezflow:TICKER/RELAY pid" in second.stderr
        assert "--address 127.0.0.1:0" in second.stderr
        assert first.poll() is None  # the first copy runs on, untouched
    finally:
        first.terminate()
        first.communicate(timeout=30)
    assert first.returncode == 0


# -- every --help example ---------------------------------------------------------------


def _commands() -> list[tuple[str, Any]]:
    """(name, command) of every leaf command (``perf run`` included)."""
    found = []
    pending: list[tuple[str, Any]] = list(typer.main.get_command(app).commands.items())  # type: ignore[attr-defined]
    while pending:
        name, command = pending.pop(0)
        if hasattr(command, "commands"):
            pending += [(f"{name} {sub}", c) for sub, c in command.commands.items()]
        else:
            found.append((name, command))
    return found


def _examples() -> list[tuple[str, Any, list[str]]]:
    """(command name, command, the example's words) for every example line of every
    command's help: the lines that run ``ezflow <that command>`` (a line that ends in
    ``\\`` goes on in the next, as in a shell), pipes cut off."""
    found = []
    for name, command in _commands():
        lines = re.sub(r"\\\n\s*", "", command.help or "").splitlines()
        for text in lines:
            line = text.strip().split(" | ")[0].split(" > ")[0]
            if f"ezflow {name} " in f"{line} ":
                found.append((name, command, shlex.split(line)))
    return found


EXAMPLES = _examples()


def test_every_command_has_examples() -> None:
    with_examples = {name for name, _, _ in EXAMPLES}
    assert {"run", "serve", "graph", "topics", "echo", "hz", "top", "shutdown"} <= with_examples


@pytest.mark.parametrize(
    ("name", "command", "words"), EXAMPLES, ids=[" ".join(w) for _, _, w in EXAMPLES]
)
def test_help_example_parses_and_names_files_that_exist(
    name: str, command: Any, words: list[str]
) -> None:
    at = words.index("ezflow") + 1 + len(name.split())
    assert words[at - len(name.split()) : at] == name.split()
    # click parses the words as the command would: an unknown option, a missing
    # argument or a bad value raises.
    command.make_context(name, words[at:])
    for word in words[at:]:
        path = word.split(":")[0]
        if path.endswith(".py"):
            assert (ROOT / path).is_file(), f"{path} does not exist"


@pytest.mark.parametrize(
    "words",
    [w for name, _, w in EXAMPLES if name == "run"],
    ids=[" ".join(w) for name, _, w in EXAMPLES if name == "run"],
)
def test_run_help_example_runs_as_written(words: list[str]) -> None:
    env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=\S*", w))
    args = [w for w in words if not re.fullmatch(r"[A-Z_]+=\S*", w)][1:]
    if "--address" not in args and "EZFLOW_GRAPH_ADDRESS" not in env:
        env["EZFLOW_GRAPH_ADDRESS"] = "127.0.0.1:0"  # the default port may be in use here
    started = time.monotonic()
    result = ezflow(*args, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "the example printed nothing"
    assert time.monotonic() - started < 60
