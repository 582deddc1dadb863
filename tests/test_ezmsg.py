"""ezmsg on ezflow (the adapter ezflow._units._ezmsg_adapter, ezflow.compat.ezmsg, the
rules both share, AxisArray in the codec): needs the
``ezmsg`` extra; skipped without it. The ezmsg-sigproc tests skip on their own when only
ezmsg is installed (as with ezmsg 3.9, which ezmsg-sigproc no longer accepts)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import importlib.metadata
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "ezmsg.core", reason="ezmsg is not installed (pip install 'ezflow-pubsub[ezmsg]')"
)

import ezmsg.core as ez
from _ezmsg_graphs import (
    EzflowSink,
    Lifecycle,
    LifecycleSettings,
    Sink,
    Source,
)
from conftest import without_shm_notices
from ezmsg.util.debuglog import DebugLog, DebugLogSettings
from ezmsg.util.messages.axisarray import AxisArray, CoordinateAxis
from ezmsg.util.terminate import TerminateOnTimeout

import ezflow
import ezflow.compat.ezmsg as compat
from ezflow._core._codec import _registry
from ezflow._core._config import DEFAULT_MAX_IN_FLIGHT
from ezflow._units import _ezmsg_adapter
from ezflow._units._plan import adaptable, build_plan

PROGRAMS = Path(__file__).parent / "ezmsg_programs"


@pytest.fixture
def sigproc() -> Any:
    """tests/_sigproc_graphs.py, or a skip when ezmsg-sigproc is not installed."""
    pytest.importorskip(
        "ezmsg.sigproc", reason="ezmsg-sigproc is not installed (ezflow-pubsub[ezmsg])"
    )
    return importlib.import_module("_sigproc_graphs")


def assert_same_signal(received: list[AxisArray], sigproc: Any) -> None:
    want = sigproc.expected()
    assert len(received) == len(want)
    got_data = np.concatenate([m.data for m in received])
    want_data = np.concatenate([m.data for m in want])
    np.testing.assert_allclose(got_data, want_data, rtol=1e-12, atol=1e-12)
    for got, ref in zip(received, want, strict=True):
        assert got.dims == ref.dims
        assert got.axes["time"].gain == pytest.approx(ref.axes["time"].gain)
        assert got.axes["time"].offset == pytest.approx(ref.axes["time"].offset)
        assert got.key == ref.key


async def test_sigproc_pipeline_each_stage_in_its_own_process(
    server: ezflow.GraphServer, sigproc: Any
) -> None:
    # ezmsg units (ezmsg-sigproc's, unmodified) next to an ezflow unit, in one graph.
    source = Source()
    butter = sigproc.ButterworthFilter(sigproc.FILTER)
    down = sigproc.Downsample(sigproc.DOWNSAMPLE)
    sink = EzflowSink()
    async with ezflow.GraphRunner(
        SOURCE=source,
        FILTER=butter,
        DOWNSAMPLE=down,
        SINK=sink,
        connections=[
            (source.OUTPUT_SIGNAL, butter.INPUT_SIGNAL),
            (butter.OUTPUT_SIGNAL, down.INPUT_SIGNAL),
            (down.OUTPUT_SIGNAL, sink.INPUT),
        ],
        process_components=[butter, down],
        graph_address=server.address,
        end_when_done=True,
    ) as runner:
        pids = runner.processes
        await asyncio.wait_for(runner.wait(), 30)
    assert {"FILTER", "DOWNSAMPLE"} <= set(pids)
    assert len({pids["FILTER"], pids["DOWNSAMPLE"], os.getpid()}) == 3
    assert_same_signal(sink.received, sigproc)
    assert all(not m.data.flags.writeable for m in sink.received)  # shm: read-only views


def test_sigproc_pipeline_as_an_ezmsg_collection(sigproc: Any) -> None:
    # ezflow.run as a script calls it (one event loop: the test above covers both).
    system = sigproc.PipelineSystem()
    ezflow.run(SYSTEM=system, graph_address="127.0.0.1:0", end_when_done=True)
    sink = system.SINK
    assert isinstance(sink, Sink)
    assert sink.address == "SYSTEM/SINK"  # ezmsg's addressing, from the ezflow path
    assert_same_signal(sink.received, sigproc)


async def test_ezmsg_unit_lifecycle(server: ezflow.GraphServer) -> None:
    unit = Lifecycle()
    async with ezflow.GraphRunner(LIFE=unit, graph_address=server.address) as runner:
        await runner.update_settings("LIFE", LifecycleSettings(limit=3))
        await asyncio.wait_for(unit.applied.wait(), 10)  # (a unit of this process)
        pub = await runner.context.publisher("LIFE/INPUT")
        for number in range(3):
            await pub.publish(number)
        await asyncio.wait_for(runner.wait(), 10)
    assert runner.completed_by == "LIFE"  # ezmsg's NormalTermination ended the graph
    assert unit.limits == [3]  # its INPUT_SETTINGS subscriber ran once
    assert LifecycleSettings(limit=3) == unit.SETTINGS
    assert unit.task_ran and unit.thread_ran and unit.shut_down
    assert unit.STATE.count == 3


async def test_ezmsg_streams_must_belong_to_the_graph(server: ezflow.GraphServer) -> None:
    source, stray = Source(), Sink()
    assert adaptable(source) and not adaptable(EzflowSink())
    adapted = _ezmsg_adapter.adapt(source)
    assert isinstance(adapted, _ezmsg_adapter.EzmsgUnit) and adapted.ezmsg_component is source
    assert set(type(adapted).streams()) == {"INPUT_SETTINGS", "OUTPUT_SIGNAL"}
    with pytest.raises(TypeError, match="not an ezmsg Unit or Collection"):
        _ezmsg_adapter.adapt(EzflowSink())
    with pytest.raises(ezflow.GraphDefinitionError, match="not in the graph"):
        ezflow.GraphRunner(SOURCE=source, connections=[(source.OUTPUT_SIGNAL, stray.INPUT_SIGNAL)])


def test_ezflow_ezmsg_is_a_deprecated_alias_of_the_adapter() -> None:
    sys.modules.pop("ezflow.ezmsg", None)
    with pytest.warns(DeprecationWarning, match=r"ezflow\.compat\.ezmsg"):
        alias = importlib.import_module("ezflow.ezmsg")
    assert alias.adapt is _ezmsg_adapter.adapt
    assert alias.EzmsgUnit is _ezmsg_adapter.EzmsgUnit
    assert alias.EzmsgCollection is _ezmsg_adapter.EzmsgCollection


@pytest.mark.parametrize("force_tcp", [None, False, True])
@pytest.mark.parametrize("num_buffers", [32, 1, 8, 100])
def test_compat_and_the_adapter_translate_an_output_alike(
    num_buffers: int, force_tcp: bool | None
) -> None:
    # The same ezmsg declaration, as ezmsg's class (the adapter) and as compat's.
    tag = f"{num_buffers}_{force_tcp}"
    theirs = dataclasses.make_dataclass(f"Theirs_{tag}", [("value", float)])
    ours = dataclasses.make_dataclass(f"Ours_{tag}", [("value", float)])
    adapted = _ezmsg_adapter._ezflow_stream(
        ez.OutputStream(theirs, num_buffers=num_buffers, force_tcp=force_tcp)
    )
    own = compat.OutputStream(ours, num_buffers=num_buffers, force_tcp=force_tcp)
    assert isinstance(adapted, ezflow.OutputStream)
    assert (adapted.max_in_flight, adapted.transport) == (own.max_in_flight, own.transport)
    assert adapted.max_in_flight == (DEFAULT_MAX_IN_FLIGHT if num_buffers == 32 else num_buffers)
    # both registered the dataclass the stream names, so that it crosses processes
    assert _registry.registered_name(theirs) and _registry.registered_name(ours)
    assert adapted.transport == ("tcp" if force_tcp else None)


def axis_array() -> AxisArray:
    return AxisArray(
        np.arange(24.0).reshape(4, 6),
        dims=["time", "ch"],
        axes={
            "time": AxisArray.TimeAxis(fs=250.0, offset=3.5),
            "ch": CoordinateAxis(np.array([f"c{i}" for i in range(6)]), dims=["ch"], unit="id"),
        },
        attrs={"subject": "S01", "gain": 2.5},
        key="amp-1",
    )


def assert_same_axis_array(got: Any, sent: AxisArray) -> None:
    assert type(got) is AxisArray
    np.testing.assert_array_equal(got.data, sent.data)
    assert not got.data.flags.writeable
    assert got.dims == sent.dims
    assert got.axes["time"] == sent.axes["time"]
    ch = got.axes["ch"]
    assert type(ch) is CoordinateAxis
    assert ch.dims == ["ch"] and ch.unit == "id"
    np.testing.assert_array_equal(ch.data, sent.axes["ch"].data)
    assert got.attrs == sent.attrs
    assert got.key == sent.key


@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_axis_array_round_trip(ctx: ezflow.GraphContext, transport: str) -> None:
    sent = axis_array()
    pub = await ctx.publisher("/ezmsg/axis", transport=transport)
    sub = await ctx.subscriber("/ezmsg/axis", transport=transport)
    await pub.publish(sent)
    got = await asyncio.wait_for(sub.recv(), 10)
    assert_same_axis_array(got, sent)


@contextlib.contextmanager
def empty_registry() -> Iterator[None]:
    """A process that registered no message class (the registry as it was afterwards)."""
    saved = dict(_registry._TYPES_BY_NAME), dict(_registry._TYPES_BY_CLASS)
    _registry._TYPES_BY_NAME.clear()
    _registry._TYPES_BY_CLASS.clear()
    try:
        yield
    finally:
        _registry._TYPES_BY_NAME.clear()
        _registry._TYPES_BY_CLASS.clear()
        _registry._TYPES_BY_NAME.update(saved[0])
        _registry._TYPES_BY_CLASS.update(saved[1])


def test_axis_array_needs_no_registration() -> None:
    # A process that never met AxisArray: empty registry, both when encoding and decoding.
    with empty_registry():
        body = ezflow.lowlevel.Codec().encode(axis_array()).to_bytes()
    with empty_registry():
        assert_same_axis_array(ezflow.lowlevel.Codec().decode(body), axis_array())


# -- ezmsg's example programs, with only their import line changed ------------------------

_LOG_LINE = re.compile(r"^\S+ \S+ - pid: \d+ - .*? - (?:INFO|DEBUG|WARNING|ERROR) - (\w+): (.*)$")
_NUMBER = re.compile(r"-?\d+\.\d+(e-?\d+)?")


def user_lines(output: str, source: str) -> list[str]:
    """What the program printed: its print() lines and the log lines of its own functions
    (the framework's own log lines differ), numbers that depend on time replaced."""
    own = set(re.findall(r"def (\w+)", source))
    lines = []
    for line in output.splitlines():
        match = _LOG_LINE.match(line)
        if match is not None and match.group(1) not in own:
            continue
        text = line if match is None else match.group(2)
        lines.append(_NUMBER.sub("#", text))
    return lines


_COMPAT_IMPORT = "import ezflow.compat.ezmsg as ez\n"
_EZMSG_IMPORT = "import ezmsg.core as ez\n"


def run_variants(name: str, tmp_path: Path) -> dict[str, list[str]]:
    """Run the program three ways at once: under ezmsg (its import line changed back to
    ezmsg's), as it is (ezflow.compat.ezmsg), and ezmsg's classes run by ezflow.run
    (ezflow's adapter, through compat's ``run(system)``); what each printed."""
    source = (PROGRAMS / name).read_text()
    assert source.count(_COMPAT_IMPORT) == 1 and source.count("    ez.run(") == 1
    original = source.replace(_COMPAT_IMPORT, _EZMSG_IMPORT)
    adapted = original.replace(
        _EZMSG_IMPORT, _EZMSG_IMPORT + "import ezflow.compat.ezmsg\n"
    ).replace("    ez.run(", "    ezflow.compat.ezmsg.run(")
    paths = {"ezmsg": tmp_path / "ezmsg" / name, "adapter": tmp_path / "adapter" / name}
    for variant, text in (("ezmsg", original), ("adapter", adapted)):
        paths[variant].parent.mkdir()
        paths[variant].write_text(text)
    paths["compat"] = PROGRAMS / name
    env = {**os.environ, "EZFLOW_GRAPH_ADDRESS": "127.0.0.1:0", "PYTHONWARNINGS": "ignore"}
    # Each in a session of its own: a variant that hangs is killed with every process it
    # started (ezmsg's graph server holds the pipes too), so that reading what it wrote
    # ends, and the test fails naming it instead of waiting on the pipes for ever.
    procs = {
        variant: subprocess.Popen(
            [sys.executable, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=path.parent,
            start_new_session=True,
        )
        for variant, path in paths.items()
    }
    ended = {}
    hung: dict[str, tuple[str, str]] = {}
    try:
        for variant, proc in procs.items():
            try:
                ended[variant] = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                hung[variant] = proc.communicate(timeout=30)
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=30)
    assert not hung, {variant: err[-2000:] for variant, (_, err) in hung.items()}
    for variant, (_, err) in ended.items():
        assert procs[variant].returncode == 0, f"{variant}: {err}"
    # ezmsg 3.10 logs INFO on stdout (as compat's logger does), 3.9 everything on stderr:
    # read both, so the comparison holds for each.
    return {
        variant: user_lines(out + without_shm_notices(err), source)
        for variant, (out, err) in ended.items()
    }


def test_intro_example_prints_what_ezmsg_prints(tmp_path: Path) -> None:
    printed = run_variants("ezmsg_intro.py", tmp_path)
    assert printed["ezmsg"] == [f"Current Count: {i}" for i in range(1, 11)]
    assert printed["compat"] == printed["ezmsg"]
    assert printed["adapter"] == printed["ezmsg"]


def test_toy_example_prints_what_ezmsg_prints(tmp_path: Path) -> None:
    printed = run_variants("ezmsg_toy.py", tmp_path)
    # Timing decides how many times each line appears and in which order. On ezflow it
    # does not decide which lines appear: a start barrier loses nothing published at
    # start, so both ezflow runs print every line the program can print. ezmsg prints
    # a subset: every line on a quiet machine, fewer on a loaded one, where its
    # subscribers connect after the first messages and the program ends after 3 s.
    every_line = {
        "0",
        "1",
        "2",
        "Spawning FOO",
        "Spawning PING",
        "Output[A1]: PING",
        "Output[A1]: Spawned Once",
        "Output[A2]: PING|#",
        "Output[A2]: Spawned Once|#",
        "Output[Default]: FOO",
        "Output[Default]: PING",
        "Output[Default]: Spawned Once",
        "Output[REPUB]: CombinedMessage(string='PING', number=#)",
        "Output[REPUB]: CombinedMessage(string='Spawned Once', number=#)",
    }
    assert set(printed["compat"]) == every_line
    assert set(printed["adapter"]) == every_line
    assert {"0", "1", "2"} <= set(printed["ezmsg"]) <= every_line


class GainSettings(compat.Settings):
    gain: float = 1.0


class Gain(compat.Unit):
    SETTINGS = GainSettings
    INPUT_SETTINGS = compat.InputStream(GainSettings)

    async def initialize(self) -> None:
        self.seen: list[float] = []

    @compat.subscriber(INPUT_SETTINGS)
    @compat.timeit  # awaited: the subscriber still runs (and is timed)
    async def on_settings(self, msg: GainSettings) -> None:
        self.seen.append(msg.gain)
        if msg.gain == 3.0:
            raise compat.NormalTermination


async def test_compat_settings_subscriber_is_called_once(server: ezflow.GraphServer) -> None:
    # ezflow calls a unit's on_settings hook for INPUT_SETTINGS; an ezmsg program's
    # subscriber of that name must still run once per settings message.
    gain = Gain()
    async with ezflow.GraphRunner(GAIN=gain, graph_address=server.address) as runner:
        await runner.update_settings("GAIN", GainSettings(gain=2.0))
        await runner.update_settings("GAIN", GainSettings(gain=3.0))
        await asyncio.wait_for(runner.wait(), 10)
    assert gain.seen == [2.0, 3.0]
    assert GainSettings(gain=3.0) == gain.SETTINGS
    assert gain.address == "GAIN"


def test_compat_names_are_ezflow_signals() -> None:
    assert compat.Complete is ezflow.Complete
    assert compat.NormalTermination is ezflow.NormalTermination
    assert set(compat.__all__) >= {
        "InputTopic",
        "OutputTopic",
        "NetworkDefinition",
        "Flag",
        "logger",
    }


class GainPair(compat.Collection):
    FIRST = Gain()
    SECOND = Gain()

    def process_components(self) -> tuple[compat.Component, ...]:
        return (self, self.SECOND)  # ezmsg's idiom: the collection itself, and a child


def test_compat_collection_listing_itself_runs_where_its_parent_puts_it() -> None:
    plan = build_plan({"PAIR": GainPair()})
    assert plan.process_of == {"PAIR/FIRST": "", "PAIR/SECOND": "PAIR/SECOND"}


class Logged(compat.Collection):
    """ezmsg's DebugLog and TerminateOnTimeout (ezmsg's own units) in a compat collection,
    as ezmsg programs write them."""

    GAIN = Gain()
    LOG = DebugLog(DebugLogSettings(name="LOG"))
    TERM = TerminateOnTimeout()

    def network(self) -> compat.NetworkDefinition:
        return ((self.LOG.OUTPUT, self.TERM.INPUT),)

    def process_components(self) -> tuple[Any, ...]:
        return (self.LOG,)


def test_ezmsg_units_inside_a_compat_collection() -> None:
    first, second = Logged(), Logged()
    assert first.LOG is not second.LOG  # each instance its own copy, as ezmsg's
    assert first.LOG is not Logged.LOG
    plan = build_plan({"SYS": first})
    assert list(plan.units) == ["SYS/GAIN", "SYS/LOG", "SYS/TERM"]
    assert isinstance(plan.units["SYS/LOG"], _ezmsg_adapter.EzmsgUnit)
    assert plan.units["SYS/LOG"].ezmsg_component is first.LOG
    assert first.LOG.address == "SYS/LOG"  # ezmsg's address, from the ezflow path
    assert plan.edges == [("SYS/LOG/OUTPUT", "SYS/TERM/INPUT")]
    assert plan.process_of == {"SYS/GAIN": "", "SYS/LOG": "SYS/LOG", "SYS/TERM": ""}
    stray = DebugLog()
    with pytest.raises(ezflow.GraphDefinitionError, match="not in the graph"):
        build_plan({"SYS": second}, [(stray.OUTPUT, second.TERM.INPUT)])


def test_ezflow_run_takes_an_ezmsg_system(tmp_path: Path) -> None:
    """`ezflow run FILE:OBJECT` where OBJECT is a function returning an ezmsg Collection
    (ezmsg's own classes, the program as ezmsg users write it)."""
    original = (PROGRAMS / "ezmsg_intro.py").read_text()
    program = original.replace("import ezflow.compat.ezmsg as ez\n", _EZMSG_IMPORT)
    program += "\n\ndef SYSTEM():\n    return CountSystem(CountSystemSettings(iterations=3))\n"
    script = tmp_path / "intro_system.py"
    script.write_text(program)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [sys.executable, "-m", "ezflow", "run", "-a", "127.0.0.1:0", f"{script}:SYSTEM"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    printed = [line for line in result.stdout.splitlines() if line.startswith("Current Count")]
    assert printed == [f"Current Count: {i}" for i in range(1, 4)]


# -- ezmsg's own examples, from its sdist, with only their import line changed -----------
#
# The examples of the sdist of the ezmsg installed here that import from ezmsg.util, run
# under ezmsg and as they are but for `import ezmsg.core as ez` ->
# `import ezflow.compat.ezmsg as ez` (their ezmsg.util units run on ezflow through the
# adapter), all at once in the background while the tests below wait for theirs.

SDIST_RUN = {
    "ezmsg_configs.py": "eleven systems in turn: hanging publishers and subscribers, "
    "passthrough collections, a system without units, DebugLog",
    "ezmsg_generator.py": "generator units, AxisArray and replace(), gen_to_unit, DebugLog; "
    "its own wiring mistake (an output connected to an output) and its own AttributeError",
    "ezmsg_attach.py": "a second program attaching a DebugLog to ezmsg_toy.py's topic",
}
SDIST_NOT_RUN = {
    "ezmsg_count.py": "its CountMessage (an unregistered dataclass, on a stream declared "
    "int) carries an array.array: ezflow's codec carries neither (ezmsg pickles them); it "
    "fails at the first message with one line naming the class, the stream and the fix",
}
_SDIST_LOG_LINE = re.compile(
    r"^\S+ \S+ - pid: \d+ - .*? - (?:INFO|DEBUG|WARNING|ERROR) - (\S+): (.*)$"
)
#: ezflow's lines on stderr (not in ezmsg's log format): the Ctrl-C lines and warnings.
_EZFLOW_SAYS = ("stopping: ", "stopped now: ", "SYSTEM connection ")
_PIP_SDIST = ("--no-deps", "--no-binary", ":all:", "-q", "-d")
_UTIL_IMPORT = re.compile(r"^from (ezmsg\.util[\w.]*) import", re.MULTILINE)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Program:
    """A program started in a session of its own, its output in files."""

    def __init__(self, path: Path, env: dict[str, str], *args: str) -> None:
        self.path = path
        stem = f"{path.parent.name}-{path.stem}{'-' + args[-1] if args else ''}"
        self.out_path = path.parent.parent / f"{stem}.out"
        self.err_path = path.parent.parent / f"{stem}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.process = subprocess.Popen(
                [sys.executable, *args] if args else [sys.executable, str(path)],
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1", **env},
                cwd=path.parent,
                start_new_session=True,
            )

    @property
    def out(self) -> str:
        return self.out_path.read_text()

    @property
    def err(self) -> str:
        return without_shm_notices(self.err_path.read_text())

    def wait_for(self, text: str, count: int = 1, timeout: float = 30, stream: str = "out") -> None:
        deadline = time.monotonic() + timeout
        while (self.out + self.err if stream == "err" else self.out).count(text) < count:
            assert self.process.poll() is None, f"{self.path.name} exited: {self.err}"
            assert time.monotonic() < deadline, f"{self.path.name}: no {text!r} in {timeout} s"
            time.sleep(0.05)

    def interrupt(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does

    def finish(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _sdist_examples(cache: Path, tmp: Path) -> Path:
    """The sdist of the ezmsg installed here, unpacked into *tmp*: downloaded into
    *cache* (pytest's cache directory) the first time, or a skip when pip cannot get it
    (no network)."""
    wanted = importlib.metadata.version("ezmsg")
    archive_path = cache / f"ezmsg-{wanted}.tar.gz"
    if not archive_path.is_file():
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", f"ezmsg=={wanted}", *_PIP_SDIST, str(cache)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0 or not archive_path.is_file():
            pytest.skip(f"cannot download ezmsg {wanted}'s sdist: {result.stderr.strip()[-300:]}")
    with tarfile.open(archive_path) as archive:
        archive.extractall(tmp)
    return tmp / f"ezmsg-{wanted}"


@pytest.fixture(scope="module")
def sdist_runs(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[dict[str, Any]]:
    """Start every example both ways at once; the tests wait for what they need."""
    root = tmp_path_factory.mktemp("ezmsg-sdist")
    # The download is kept in pytest's cache between runs (a fresh directory without it:
    # -p no:cacheprovider).
    cache = getattr(pytestconfig, "cache", None)
    downloads = cache.mkdir("ezmsg-sdist") if cache is not None else root / "download"
    downloads.mkdir(exist_ok=True)
    sdist = _sdist_examples(downloads, root)
    examples = sdist / "examples"
    variants: dict[str, Path] = {"ezmsg": root / "ezmsg", "compat": root / "compat"}
    for directory in variants.values():
        directory.mkdir()
    for source in examples.glob("*.py"):
        text = source.read_text()
        (variants["ezmsg"] / source.name).write_text(text)
        (variants["compat"] / source.name).write_text(text.replace(_EZMSG_IMPORT, _COMPAT_IMPORT))
    # Each program on a graph server of its own (ezmsg starts one on a free port when
    # none answers at its default address), but for ezmsg's toy and attach: they share
    # one, ezmsg's standalone server (given an address, ezmsg starts none) and ezflow's
    # embedded in the toy's run.
    env: dict[str, dict[str, str]] = {
        "ezmsg": {},
        "compat": {"EZFLOW_GRAPH_ADDRESS": "127.0.0.1:0"},
    }
    shared = {
        "ezmsg": {"EZMSG_GRAPHSERVER_ADDR": f"127.0.0.1:{_free_port()}"},
        "compat": {"EZFLOW_GRAPH_ADDRESS": f"127.0.0.1:{_free_port()}"},
    }
    programs: dict[tuple[str, str], _Program] = {}
    server = _Program(variants["ezmsg"] / "serve", shared["ezmsg"], "-m", "ezmsg.core", "serve")
    try:
        for variant, directory in variants.items():
            for name in ("ezmsg_configs.py", "ezmsg_generator.py"):
                programs[variant, name] = _Program(directory / name, env[variant])
        programs["compat", "ezmsg_count.py"] = _Program(
            variants["compat"] / "ezmsg_count.py", env["compat"]
        )
        programs["compat", "ezmsg_toy.py"] = _Program(
            variants["compat"] / "ezmsg_toy.py", shared["compat"]
        )
        server.wait_for("Servers running", stream="err")
        programs["ezmsg", "ezmsg_toy.py"] = _Program(
            variants["ezmsg"] / "ezmsg_toy.py", shared["ezmsg"]
        )
        for variant, directory in variants.items():
            programs[variant, "ezmsg_toy.py"].wait_for("Spawning PING")  # its topics exist
            programs[variant, "ezmsg_attach.py"] = _Program(
                directory / "ezmsg_attach.py", shared[variant]
            )
        yield {
            "examples": examples,
            "sdist": sdist,
            "variants": variants,
            "programs": programs,
            "shared": shared,
        }
    finally:
        for program in programs.values():
            program.interrupt()
        for program in programs.values():
            try:
                program.process.wait(15)
            except subprocess.TimeoutExpired:
                program.kill()
        server.kill()


def _util_functions(sdist: Path, source: str) -> set[str]:
    """The functions of the ezmsg.util modules *source* imports (DebugLog.log, ...):
    their log lines are the program's output too."""
    names: set[str] = set()
    for module in _UTIL_IMPORT.findall(source):
        path = sdist / "src" / Path(*module.split(".")).with_suffix(".py")
        names |= set(re.findall(r"def (\w+)", path.read_text()))
    return names


def _printed(runs: dict[str, Any], variant: str, name: str, program: _Program) -> list[str]:
    source = (runs["examples"] / name).read_text()
    own = set(re.findall(r"def (\w+)", source)) | _util_functions(runs["sdist"], source)
    own.add("<module>")
    lines = []
    for line in (program.out + program.err).splitlines():
        match = _SDIST_LOG_LINE.match(line)
        if match is None and line.startswith(_EZFLOW_SAYS):
            continue  # ezflow's own words (Ctrl-C, warnings), on stderr
        if match is None or match.group(1) in own:
            lines.append(_NUMBER.sub("#", line if match is None else match.group(2)))
    return lines


def test_sdist_examples_that_import_ezmsg_util_are_all_accounted_for(
    sdist_runs: dict[str, Any],
) -> None:
    importing = {
        path.name
        for path in sdist_runs["examples"].glob("*.py")
        if _UTIL_IMPORT.search(path.read_text())
    }
    assert importing == set(SDIST_RUN) | set(SDIST_NOT_RUN)
    for name in importing:  # only the import line changed
        ours = (sdist_runs["variants"]["compat"] / name).read_text().splitlines()
        theirs = (sdist_runs["examples"] / name).read_text().splitlines()
        changed = [(a, b) for a, b in zip(theirs, ours, strict=True) if a != b]
        assert changed == [(_EZMSG_IMPORT.strip(), _COMPAT_IMPORT.strip())]


def test_sdist_configs_prints_what_ezmsg_prints(sdist_runs: dict[str, Any]) -> None:
    printed = {}
    for variant in ("ezmsg", "compat"):
        program = sdist_runs["programs"][variant, "ezmsg_configs.py"]
        assert program.finish() == 0, program.err
        # A generator at 4 Hz next to a terminator after 1 s: its 4th message (3) races
        # with the end, under ezmsg too; the three before it do not.
        printed[variant] = [
            line
            for line in _printed(sdist_runs, variant, "ezmsg_configs.py", program)
            if not re.fullmatch(r"DEBUG - msg=([3-9]|\d\d+)", line)
        ]
    assert printed["compat"] == printed["ezmsg"]
    assert printed["ezmsg"].count("DEBUG - msg=2") == 3  # it printed something
    assert sum(line.startswith("Testing ") for line in printed["ezmsg"]) == 11


def test_sdist_generator_prints_what_ezmsg_prints(sdist_runs: dict[str, Any]) -> None:
    printed, last = {}, {}
    for variant in ("ezmsg", "compat"):
        program = sdist_runs["programs"][variant, "ezmsg_generator.py"]
        assert program.finish() == 1, program.err  # its gen_to_unit system's AttributeError
        printed[variant] = _printed(sdist_runs, variant, "ezmsg_generator.py", program)
        last[variant] = program.err.strip().splitlines()[-1]
    assert (
        printed["compat"][: printed["compat"].index("Running ezmsg system with gen-to-unit")]
        == (printed["ezmsg"][: printed["ezmsg"].index("Running ezmsg system with gen-to-unit")])
    )
    assert sum("DEBUG - msg=AxisArray" in line for line in printed["compat"]) == 2
    assert (
        last["compat"]
        == last["ezmsg"]
        == ("AttributeError: 'PowUnit' object has no attribute 'INPUT'")
    )
    err = sdist_runs["programs"]["compat", "ezmsg_generator.py"].err
    # Its wiring mistake runs as under ezmsg, and is named (once per run of the system).
    wiring = "SYSTEM connection 3 (SYSTEM/ADD_12.OUTPUT -> SYSTEM/POW_0_5.OUTPUT) connects two"
    assert err.count(wiring) == 1
    assert "/ezflow/" not in err  # the user's frames only


def test_sdist_attach_prints_what_ezmsg_prints(sdist_runs: dict[str, Any]) -> None:
    attach = {
        variant: sdist_runs["programs"][variant, "ezmsg_attach.py"]
        for variant in ("ezmsg", "compat")
    }
    for program in attach.values():
        program.wait_for("msg='PING'", count=2)
    for program in attach.values():
        program.interrupt()  # it runs until Ctrl-C
    for variant, program in attach.items():
        code = program.finish(30)
        lines = _printed(sdist_runs, variant, "ezmsg_attach.py", program)
        assert lines[0] == "This example attaches to the system created/run by ezmsg_toy.py."
        assert len(lines) >= 3 and set(lines[1:]) == {"DEBUG - msg='PING'"}, lines
    assert code == 0, program.err  # ezflow's: a Ctrl-C ends it normally, without a word
    assert "Traceback" not in program.err
    assert program.err.splitlines() == ["stopping: draining up to 5 s; Ctrl-C again to stop now"]


def test_sdist_count_fails_at_its_first_message_in_one_line(sdist_runs: dict[str, Any]) -> None:
    program = sdist_runs["programs"]["compat", "ezmsg_count.py"]
    assert program.finish() == 1
    err = program.err
    last = err.strip().splitlines()[-1]
    assert last == (
        f"{program.path}:32: ezflow.UnregisteredTypeError: SYSTEM/COUNT/OUTPUT: cannot encode "
        "__main__.CountMessage: it is a dataclass that is not registered; decorate it with "
        "@ezflow.message or call ezflow.register_message(CountMessage) in every process "
        "that sends or receives it"
    )
    assert "__mp_main__" not in err and "/ezflow/" not in err
    assert err.count("cannot encode") == 1  # said once
