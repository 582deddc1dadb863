"""What a newcomer meets first with ``ezflow run`` and friends, as real subprocesses: the
version, the start line, the traceback of a broken target, a taken port, a second copy of
a running graph, and every example in the commands' ``--help`` run as written."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
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
from typer.testing import CliRunner

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
    # The distribution is ezflow-pubsub (`ezflow` on PyPI is another project).
    assert result.stdout.startswith(f"ezflow {version('ezflow-pubsub')}\ncodec: ")


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


def test_set_with_a_wrong_field_or_form_exits_2_naming_it() -> None:
    wrong = ezflow(
        "run", "examples/nested_collection.py:graph", "--set", "PIPELINE/GAIN.gian=2", "-q"
    )
    assert wrong.returncode == 2
    assert without_shm_notices(wrong.stderr) == (
        "error: cannot set PIPELINE/GAIN.gian: GainSettings has no field 'gian' (did you "
        "mean 'gain'?); its fields: gain\n"
    )
    assert wrong.stdout == ""  # refused before anything ran
    for spec in ("PIPELINE=2", "width=2", "PIPELINE.width"):
        result = CliRunner().invoke(app, ["run", "nowhere.py:graph", "--set", spec])
        assert result.exit_code == 2
        assert result.stderr == (
            f"error: --set {spec!r}: expected PATH.FIELD=VALUE, a component's path and a "
            "field of its settings (e.g. --set SINE.rate=500 or --set "
            "PIPELINE/FILTER.cutoff=30)\n"
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


# -- Ctrl-C, as a terminal sends it (SIGINT to the process group) -----------------------

COMMAND = Path(sys.executable).with_name("ezflow")  # the console script


def _start(args: list[str], err: Path, **env: str) -> subprocess.Popen[str]:
    with open(err, "w") as stderr:
        return subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=ROOT,
            # PYTHONFAULTHANDLER: a run that hangs is stopped with SIGABRT (_finish), which
            # then prints every thread's stack of every process of the run to *err*.
            env={
                **os.environ,
                "EZFLOW_GRAPH_ADDRESS": "127.0.0.1:0",
                "PYTHONFAULTHANDLER": "1",
                **env,
            },
            start_new_session=True,  # a shell job: its own process group
        )


def _finish(process: subprocess.Popen[str], err: Path, timeout: float = 30) -> None:
    """Wait for *process* to exit; one still running after *timeout* seconds fails the
    test with the stacks of every process of its group (see _start)."""
    try:
        process.communicate(timeout=timeout)
        return
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGABRT)
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # unit processes left behind
    pytest.fail(f"still running {timeout:g} s after Ctrl-C; its stacks:\n{err.read_text()}")


def _ctrl_c(process: subprocess.Popen[str]) -> None:
    os.killpg(process.pid, signal.SIGINT)


def _wait_for(path: Path, text: str, process: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert process.poll() is None, path.read_text()
        assert time.monotonic() < deadline, f"no {text!r} after {timeout} s: {path.read_text()}"
        time.sleep(0.02)


STOPPING = "stopping: draining up to 5 s; Ctrl-C again to stop now\n"


def _numpy_loaded(pid: int) -> bool:
    """Whether process *pid* is importing ezflow (numpy's extension is mapped): past
    the interpreter's own start-up, which no program can make Ctrl-C-safe."""
    with contextlib.suppress(OSError):
        return "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text()
    return False


def _has_child(pid: int) -> bool:
    """Whether process *pid* started a unit process (it is still importing then)."""
    with contextlib.suppress(OSError):
        return any(
            Path(f"/proc/{pid}/task/{task}/children").read_text().strip()
            for task in os.listdir(f"/proc/{pid}/task")
        )
    return False


@pytest.mark.skipif(not COMMAND.is_file(), reason="the ezflow command is not installed here")
def test_ctrl_c_while_ezflow_run_starts_prints_no_traceback(tmp_path: Path) -> None:
    # Four runs at once, each interrupted at another moment: as soon as ezflow imports,
    # as soon as the first unit process exists (importing), and 0.2, 0.5 and 1 s later
    # than ezflow began importing. (Counted from there: the interpreter's own start-up,
    # before any code of ezflow's, is no program's to make Ctrl-C-safe, and on a loaded
    # machine it alone can take half a second.)
    moments: list[Any] = [0.0, _has_child, 0.2, 0.5, 1.0]
    runs = []
    for index in range(len(moments)):
        err = tmp_path / f"{index}.err"
        runs.append((_start([str(COMMAND), "run", f"{GRAPHS}:TICKER"], err), err))
    importing: dict[int, float] = {}  # run -> when ezflow began importing
    pending = dict(enumerate(moments))
    deadline = time.monotonic() + 30
    while pending:
        now = time.monotonic()
        for index, moment in list(pending.items()):
            process = runs[index][0]
            if index not in importing and _numpy_loaded(process.pid):
                importing[index] = now
            if isinstance(moment, float):
                due = index in importing and now >= importing[index] + moment
            else:
                due = moment(process.pid)
            if due or process.poll() is not None or now > deadline:
                with contextlib.suppress(ProcessLookupError):
                    _ctrl_c(process)
                del pending[index]
        time.sleep(0.002)
    try:
        for process, err in runs:
            _finish(process, err)
    finally:
        for process, _ in runs:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
    for (process, err), moment in zip(runs, moments, strict=True):
        text = without_shm_notices(err.read_text())
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, (moment, text)
        # Before the graph exists: interrupted (130), quietly; after: it stopped (0).
        lines = [line for line in text.splitlines(keepends=True) if "ezflow run:" not in line]
        assert (process.returncode, lines) in ((130, []), (0, [STOPPING])), (moment, text)
        if moment == 0.0:
            assert process.returncode == 130  # interrupted while ezflow imported
        if moment is _has_child:
            assert process.returncode == 0  # the graph stopped


@pytest.mark.skipif(not COMMAND.is_file(), reason="the ezflow command is not installed here")
def test_a_second_ctrl_c_stops_now_says_what_it_cut_and_runs_every_shutdown(
    tmp_path: Path,
) -> None:
    err = tmp_path / "slow.err"
    process = _start(
        [str(COMMAND), "run", f"{GRAPHS}:slow"],
        err,
        EZFLOW_DRAIN_TIMEOUT="60",  # the drain would take ~13 s: the flood's 64 in flight
        EZFLOW_TEST_MARKERS=str(tmp_path),
    )
    try:
        _wait_for(err, "ezflow run: graph server", process)
        time.sleep(0.5)  # the sink's backlog builds up
        _ctrl_c(process)
        _wait_for(err, "stopping: draining up to 60 s", process)
        started = time.monotonic()
        _ctrl_c(process)
        _finish(process, err)
        elapsed = time.monotonic() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    text = without_shm_notices(err.read_text())
    assert process.returncode == 130, text
    assert elapsed < 10, text
    lines = text.splitlines()
    assert lines[1:-1] == ["stopping: draining up to 60 s; Ctrl-C again to stop now"], text
    found = re.fullmatch(
        r"stopped now: (\d+) message\(s\) received and not handled were cut, 1 input\(s\) "
        r"had not ended \(SINK: \1 queued, 1 open\)",
        lines[-1],
    )
    assert found and int(found.group(1)) > 0, lines[-1]
    assert (tmp_path / "shutdown-FLOOD").exists()
    assert (tmp_path / "shutdown-SINK").exists()  # in its own process, after the cut


def test_a_unit_failure_ends_with_the_users_file_and_line() -> None:
    result = ezflow("run", f"{GRAPHS}:unregistered", "-a", "127.0.0.1:0", "-q")
    assert result.returncode == 1, result.stderr
    err = without_shm_notices(result.stderr)
    line = next(
        number
        for number, text in enumerate(Path(GRAPHS).read_text().splitlines(), 1)
        if "the line a failure names" in text
    )
    assert err.splitlines() == [
        "error: unit SOURCE (process SOURCE) failed in send:",
        f'  File "{GRAPHS}", line {line}, in send',
        "    yield self.OUTPUT, Reading(1.0)  # the line a failure names",
        f"{GRAPHS}:{line}: ezflow.UnregisteredTypeError: SOURCE/OUTPUT: cannot encode "
        "_cli_graphs.Reading: it is a dataclass that is not registered; decorate it with "
        "@ezflow.message or call ezflow.register_message(Reading) in every process that "
        "sends or receives it",
    ]
    verbose = ezflow("run", f"{GRAPHS}:unregistered", "-a", "127.0.0.1:0", "-q", "-v")
    assert verbose.returncode == 1
    assert "ezflow/_core/_codec/" in verbose.stderr  # -v: ezflow's frames too
