"""Message types across processes (issue 13 items 4-6): undecodable messages are loud,
registered classes are known in every unit process, optional run-time type checks."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt
import pytest

import ezflow
from ezflow._core._codec import (
    Codec,
    EncodedMessage,
    registered_class,
    registered_name,
    set_unknown_type_hook,
)
from ezflow._core._config import ENV_CHECK_TYPES
from ezflow._units._message_types import MessageTypes, UnresolvableMessageError
from ezflow._units._streams import message_check
from ezflow.units import TerminateAfter, TerminateAfterSettings


@ezflow.message
@dataclasses.dataclass
class Ghost:
    value: int


class _Forged:
    """A message whose encoded body is given as is (what a peer with other message
    classes, or a broken one, would send)."""

    def __init__(self, body: bytes) -> None:
        self.body = body


class _ForgingCodec(Codec):
    """The publisher's codec, except that a :class:`_Forged` message is sent as its body."""

    def _encode_small(self, obj: object) -> bytes | None:
        return obj.body if isinstance(obj, _Forged) else super()._encode_small(obj)

    def encode(self, obj: object) -> EncodedMessage:
        if isinstance(obj, _Forged):
            return EncodedMessage([obj.body], len(obj.body))
        return super().encode(obj)


def _unknown_type_body() -> bytes:
    """A well-formed body of a registered class's name that no process registered."""
    body = Codec().encode(Ghost(7)).to_bytes()
    assert body.count(b"Ghost") == 1
    return body.replace(b"Ghost", b"Ghozt")


@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_undecodable_raises_in_order_for_lossless_and_counts_for_leaky(
    ctx: ezflow.GraphContext, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    pub = await ctx.publisher("/forged", transport=transport)
    lossless = await ctx.subscriber("/forged", transport=transport)
    leaky = await ctx.subscriber("/forged", transport=transport, leaky=True, queue=16)
    pub._outlet.codec = _ForgingCodec()
    sent: list[Any] = [
        Ghost(1),
        _Forged(b"\x01garbage"),
        Ghost(2),
        _Forged(_unknown_type_body()),
        np.arange(4.0),
    ]
    for message in sent:
        await pub.publish(message)
    assert await asyncio.wait_for(lossless.recv(), 5) == Ghost(1)
    with pytest.raises(ezflow.UndecodableMessageError) as garbage:
        await asyncio.wait_for(lossless.recv(), 5)
    assert garbage.value.topic == "/forged" and garbage.value.publisher_id == pub.id
    assert isinstance(garbage.value.__cause__, ezflow.ProtocolError)
    assert await asyncio.wait_for(lossless.recv(), 5) == Ghost(2)
    with pytest.raises(ezflow.UndecodableMessageError, match="Ghozt"):
        await asyncio.wait_for(lossless.recv(), 5)
    assert np.array_equal(await asyncio.wait_for(lossless.recv(), 5), np.arange(4.0))
    assert lossless.statistics().undecodable == 2
    assert {channel.transport for channel in ctx.channels} == {transport}
    # Nothing stalls: the publisher's window was released for every message.
    for i in range(3):
        await asyncio.wait_for(pub.publish(Ghost(10 + i)), 5)
        assert await asyncio.wait_for(lossless.recv(), 5) == Ghost(10 + i)
    got = [await asyncio.wait_for(leaky.recv(), 5) for _ in range(6)]
    assert got[:2] == [Ghost(1), Ghost(2)] and got[3:] == [Ghost(10), Ghost(11), Ghost(12)]
    assert (leaky.statistics().undecodable, leaky.statistics().dropped) == (2, 2)
    assert "cannot be decoded" in caplog.text


# -- message classes known in every unit process (real processes, a script file) -------

_SCRIPT = r"""
import dataclasses
import os
from typing import Any

import ezflow
from ezflow.units import DebugLog, DebugLogSettings, TerminateAfter, TerminateAfterSettings


@ezflow.message
@dataclasses.dataclass
class Reading:  # registered where the script is defined
    seq: int
    label: str


@dataclasses.dataclass
class Late:  # registered only inside main(), at run time
    seq: int


class Source(ezflow.Unit):
    OUTPUT = ezflow.OutputStream(Any)

    @ezflow.publisher(OUTPUT)
    async def generate(self):
        for i in range(3):
            yield self.OUTPUT, Reading(i, "r")
            yield self.OUTPUT, Late(i)


class Sink(ezflow.Unit):  # a script-defined unit in a process of its own
    INPUT = ezflow.InputStream(Any)
    OUTPUT = ezflow.OutputStream(Any)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_message(self, message):
        # stderr, in one write: stdout is the LOG process's (DebugLog prints there).
        os.write(2, f"SINK got {type(message).__qualname__} {message.seq}\n".encode())
        yield self.OUTPUT, message


def main():
    ezflow.register_message(Late)
    source, log, sink = Source(), DebugLog(DebugLogSettings(name="LOG")), Sink()
    end = TerminateAfter(TerminateAfterSettings(count=6))
    ezflow.run(
        components={"SOURCE": source, "LOG": log, "SINK": sink, "END": end},
        connections=[
            (source.OUTPUT, log.INPUT),
            (log.OUTPUT, sink.INPUT),
            (sink.OUTPUT, end.INPUT),
        ],
        process_components=[log, sink],
    )


if __name__ == "__main__":
    main()
"""

_LOCAL_GRAPH = """
import dataclasses
from typing import Any

import numpy as np

import ezflow
from ezflow.units import DebugLog, TerminateAfter, TerminateAfterSettings


def build(declared: Any = None):
    @ezflow.message
    @dataclasses.dataclass
    class Local:  # defined inside a function: no other process can import it
        seq: int

    class Source(ezflow.Unit):
        OUTPUT = ezflow.OutputStream(Local if declared is None else declared)

        @ezflow.publisher(OUTPUT)
        async def generate(self):
            for i in range(3):
                yield self.OUTPUT, Local(i)

    source, log = Source(), DebugLog()
    end = TerminateAfter(TerminateAfterSettings(count=3))
    return {
        "components": {"SOURCE": source, "LOG": log, "END": end},
        "connections": [(source.OUTPUT, log.INPUT), (log.OUTPUT, end.INPUT)],
        "process_components": [log],
    }


def build_untyped():
    return build(Any)


class Mislabelled(ezflow.Unit):
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def generate(self):
        yield self.OUTPUT, "not an array"


def mislabelled():
    source, end = Mislabelled(), TerminateAfter(TerminateAfterSettings(count=1))
    return {"SOURCE": source, "END": end}, [(source.OUTPUT, end.INPUT)]
"""


def _run(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


# Unit processes that import what they need (forked from the program, they know what it
# knew, classes defined inside functions too: tests/test_forkserver.py).
_SPAWN = {"EZFLOW_START_METHOD": "spawn"}


def test_script_classes_reach_stock_and_script_units_in_other_processes(tmp_path: Path) -> None:
    """A class registered in the script reaches a stock DebugLog alone in its process;
    a class registered only inside main() reaches it and a script-defined unit."""
    script = tmp_path / "readings.py"
    script.write_text(_SCRIPT)
    result = _run([str(script)], tmp_path)
    assert result.returncode == 0, result.stderr
    lines, errors = result.stdout.splitlines(), result.stderr.splitlines()
    for i in range(3):
        assert f"LOG LOG: Reading(seq={i}, label='r')" in lines
        assert f"LOG LOG: Late(seq={i})" in lines
        assert f"SINK got Reading {i}" in errors and f"SINK got Late {i}" in errors
    assert "cannot be decoded" not in result.stderr


def test_a_declared_class_defined_in_a_function_fails_at_start(tmp_path: Path) -> None:
    (tmp_path / "local_graph.py").write_text(_LOCAL_GRAPH)
    result = _run(["-m", "ezflow", "run", "local_graph.py:build"], tmp_path, _SPAWN)
    assert result.returncode == 1, result.stderr
    text = " ".join(result.stderr.split())  # rich wraps long lines
    assert "local_graph.build.<locals>.Local" in text
    assert "process LOG" in text and "defined inside a function" in text
    assert "define the class at module level" in text
    assert "LOG: Local(" not in result.stdout  # before any data flowed


def test_an_undecodable_message_on_a_lossless_edge_fails_the_graph(tmp_path: Path) -> None:
    """The same class on an untyped stream: not known to be needed at start, so the
    first message fails the receiving unit, naming the topic and the reason (exit 1)."""
    (tmp_path / "local_graph.py").write_text(_LOCAL_GRAPH)
    result = _run(["-m", "ezflow", "run", "local_graph.py:build_untyped"], tmp_path, _SPAWN)
    assert result.returncode == 1, result.stderr
    text = " ".join(result.stderr.split())
    assert "UndecodableMessageError" in text and "SOURCE/OUTPUT" in text
    assert "local_graph.build.<locals>.Local" in text and "defined inside a function" in text


# -- finding the parent's classes (in this process, as a unit process does) -------------


def _no_main() -> Any:
    raise UnresolvableMessageError("the parent's __main__ cannot be imported here")


def test_a_class_is_found_when_its_first_message_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The codec asks for an unknown name; the class the parent registered under it is
    imported by module and qualname, registered, and the message decodes."""
    old = registered_name(Ghost)
    assert old is not None
    module = "lazy" + "x" * (len(old) - len(".Lazy") - 4)  # a body of the same length
    name = f"{module}.Lazy"
    (tmp_path / f"{module}.py").write_text(
        "import dataclasses\n\n\n@dataclasses.dataclass\nclass Lazy:\n    value: int\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    body = Codec().encode(Ghost(7)).to_bytes().replace(old.encode(), name.encode())
    with pytest.raises(ezflow.ProtocolError, match="unknown message type"):
        Codec().decode(body)
    types = MessageTypes({"registered": [[name, module, "Lazy"]]}, "P", _no_main)
    set_unknown_type_hook(types.on_unknown_type)
    try:
        message = Codec().decode(body)
    finally:
        set_unknown_type_hook(None)
    assert type(message).__name__ == "Lazy" and message.value == 7
    assert registered_class(name) is type(message)


@pytest.mark.parametrize(
    ("module", "qualname", "reason"),
    [
        ("no_such_module_13", "X", "importing no_such_module_13 failed: ModuleNotFoundError"),
        ("json", "NoSuchClass", "json has no NoSuchClass here"),
        ("json", "JSONDecoder", "json.JSONDecoder is not a dataclass"),
        ("__main__", "X", "the parent's __main__ cannot be imported here"),
        ("pkg", "build.<locals>.X", "it is defined inside a function"),
    ],
)
def test_a_required_class_that_cannot_be_found_is_named_with_the_reason(
    module: str, qualname: str, reason: str
) -> None:
    name = f"{module}.{qualname}"
    shipped = {"registered": [[name, module, qualname]], "required": [name]}
    types = MessageTypes(shipped, "SINK", _no_main)
    with pytest.raises(UnresolvableMessageError) as info:
        types.resolve_required()
    text = str(info.value)
    assert f"message class {name} (registered as {name!r}) in process SINK" in text
    assert reason in text and "define the class at module level" in text
    # The same reason when one of its messages arrives (cached, not imported again).
    with pytest.raises(ezflow.ProtocolError, match=re.escape(reason)):
        types.on_unknown_type(name)


# -- optional run-time type checks ---------------------------------------------------------


class Mislabelled(ezflow.Unit):
    """Publishes an array, then a str, on a stream declared to carry arrays."""

    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> Any:
        yield self.OUTPUT, np.zeros(2)
        yield self.OUTPUT, "not an array"


def _mislabelled_graph(**options: Any) -> ezflow.GraphRunner:
    source = options.pop("SOURCE", None) or Mislabelled()
    end = TerminateAfter(TerminateAfterSettings(count=2))
    return ezflow.GraphRunner(
        SOURCE=source, END=end, connections=[(source.OUTPUT, end.INPUT)], **options
    )


async def test_without_type_checks_a_str_on_an_array_stream_is_delivered(
    server: ezflow.GraphServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_CHECK_TYPES, raising=False)
    runner = _mislabelled_graph(graph_address=server.address)
    assert runner.check_types is False
    await runner.start()
    await asyncio.wait_for(runner.wait(), 20)  # END got both: the graph completed


async def test_type_checks_fail_the_publishing_unit_in_its_process(
    server: ezflow.GraphServer,
) -> None:
    source = Mislabelled()
    runner = _mislabelled_graph(
        SOURCE=source,
        process_components=[source],
        graph_address=server.address,
        check_types=True,
    )
    await runner.start()
    assert "SOURCE" in runner.processes
    with pytest.raises(ezflow.UnitError) as info:
        await asyncio.wait_for(runner.wait(), 20)
    text = str(info.value)
    assert "unit SOURCE (process SOURCE) failed" in text and "MessageTypeError" in text
    assert "SOURCE.OUTPUT is declared OutputStream(numpy.ndarray), but a str" in text
    # The user's line - the yield, which no traceback holds (the generator is suspended
    # there while ezflow publishes) - and none of ezflow's; all of them in full_traceback.
    line = Mislabelled.generate.__code__.co_firstlineno + 3
    assert info.value.details.splitlines() == [
        "in generate:",
        f'  File "{__file__}", line {line}, in generate',
        '    yield self.OUTPUT, "not an array"',
        f"{__file__}:{line}: ezflow.MessageTypeError: SOURCE.OUTPUT is declared "
        "OutputStream(numpy.ndarray), but a str was published on it: 'not an array'; "
        "publish a numpy.ndarray, or declare the stream's type as what it carries",
    ]
    assert "ezflow/_units/_host.py" in info.value.full_traceback


async def test_ezflow_debug_shows_ezflow_frames_in_the_message(
    server: ezflow.GraphServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EZFLOW_DEBUG", "1")
    runner = _mislabelled_graph(graph_address=server.address, check_types=True)
    await runner.start()
    with pytest.raises(ezflow.UnitError) as info:
        await asyncio.wait_for(runner.wait(), 20)
    assert "ezflow/_units/_host.py" in str(info.value)
    assert "ezflow/_units/_host.py" not in info.value.details


def test_the_environment_turns_type_checks_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CHECK_TYPES, "1")
    assert _mislabelled_graph().check_types is True
    assert _mislabelled_graph(check_types=False).check_types is False
    monkeypatch.setenv(ENV_CHECK_TYPES, "yes")
    with pytest.raises(ezflow.ConfigurationError, match="EZFLOW_CHECK_TYPES='yes'"):
        _mislabelled_graph()


T = TypeVar("T")


@pytest.mark.parametrize(
    ("declared", "good", "bad"),
    [
        (np.ndarray, np.zeros(1), "text"),
        (npt.NDArray[np.float32], np.zeros(1, np.float32), [1.0]),
        (int, 3, 3.0),
        (float, 3, "3"),  # an int is a float, as in settings
        (float, 1.5, True),
        (list[int], [1], (1,)),
        (dict[str, Any], {}, []),
        (Ghost, Ghost(1), {"value": 1}),
        (Ghost | None, None, 1),
        (Literal["a", "b"], "a", "c"),
    ],
)
def test_message_check_per_declared_type(declared: Any, good: object, bad: object) -> None:
    check = message_check(declared)
    assert check is not None
    assert check(good) and not check(bad)


@pytest.mark.parametrize("declared", [Any, object, T])
def test_undeclared_types_are_not_checked(declared: Any) -> None:
    assert message_check(declared) is None


@pytest.mark.parametrize("flag", [True, False])
def test_ezflow_run_check_types(tmp_path: Path, flag: bool) -> None:
    (tmp_path / "local_graph.py").write_text(_LOCAL_GRAPH)
    options = ["--check-types"] if flag else []
    result = _run(["-m", "ezflow", "run", "local_graph.py:mislabelled", *options], tmp_path)
    if flag:
        assert result.returncode == 1, result.stderr
        text = " ".join(result.stderr.split())  # rich wraps long lines
        assert "MessageTypeError" in text and "but a str" in text
    else:
        assert result.returncode == 0, result.stderr


class Counted(ezflow.Unit):
    """Publishes 50 arrays of the declared type, then returns (its output ends)."""

    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> Any:
        for i in range(50):
            yield self.OUTPUT, np.full(2, float(i))


class Tally(ezflow.Unit):
    INPUT = ezflow.InputStream(np.ndarray)

    def initialize(self) -> None:
        self.seen: list[float] = []

    @ezflow.subscriber(INPUT)
    async def take(self, message: np.ndarray) -> None:
        self.seen.append(float(message[0]))


async def test_checked_outputs_end_like_any_output(server: ezflow.GraphServer) -> None:
    """With type checks on, a unit's outputs are still closed when nothing may publish to
    them (through the publisher the check wraps): the graph ends by itself."""
    source, tally = Counted(), Tally()
    runner = ezflow.GraphRunner(
        SOURCE=source,
        TALLY=tally,
        connections=[(source.OUTPUT, tally.INPUT)],
        graph_address=server.address,
        check_types=True,
        end_when_done=True,
    )
    await runner.start()
    await asyncio.wait_for(runner.wait(), 20)
    assert tally.seen == [float(i) for i in range(50)]
