"""Validation before start, topic naming and relay resolution (no processes, no network)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable
from typing import Any, Literal

import numpy as np
import pytest

import ezflow
from ezflow._units import _plan
from ezflow._units._plan import build_plan


class SineSettings(ezflow.Settings):
    rate: float = 100.0


class ScaleSettings(ezflow.Settings):
    factor: float = 2.0


class NeedsPath(ezflow.Settings):
    path: str


class Sine(ezflow.Unit):
    SETTINGS = SineSettings
    OUTPUT = ezflow.OutputStream(np.ndarray)
    TEXT = ezflow.OutputStream(str)

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> AsyncIterator[tuple[Any, Any]]:
        yield self.OUTPUT, np.zeros(2)


class Scale(ezflow.Unit):
    SETTINGS = ScaleSettings
    INPUT = ezflow.InputStream(np.ndarray)
    ANYTHING = ezflow.InputStream()
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_samples(self, message: Any) -> AsyncIterator[tuple[Any, Any]]:
        yield self.OUTPUT, message


class Saver(ezflow.Unit):
    SETTINGS = NeedsPath
    INPUT = ezflow.InputStream(np.ndarray)


class Shown(ezflow.Unit):
    @ezflow.main
    def show(self) -> None: ...


class Chain(ezflow.Collection):
    """INPUT -> A -> B -> OUTPUT, B in its own process."""

    INPUT = ezflow.InputStream(np.ndarray)
    OUTPUT = ezflow.OutputStream(np.ndarray)
    A = Scale()
    B = Scale()

    def network(self) -> Iterable[tuple[Any, Any]]:
        return [
            (self.INPUT, self.A.INPUT),
            (self.A.OUTPUT, self.B.INPUT),
            (self.B.OUTPUT, self.OUTPUT),
        ]

    def process_components(self) -> Iterable[ezflow.Component]:
        return [self.B]


class Outer(ezflow.Collection):
    """A collection of a collection: relays two levels deep."""

    INPUT = ezflow.InputStream(np.ndarray)
    OUTPUT = ezflow.OutputStream(np.ndarray)
    INNER = Chain()

    def network(self) -> Iterable[tuple[Any, Any]]:
        return [(self.INPUT, self.INNER.INPUT), (self.INNER.OUTPUT, self.OUTPUT)]


def invalid(match: str) -> Any:
    return pytest.raises(ezflow.GraphDefinitionError, match=match)


def test_topics_come_from_paths_and_relays_become_direct_edges() -> None:
    sine, outer, sink = Sine(), Outer(), Scale()
    plan = build_plan(
        {"SINE": sine, "OUTER": outer, "SINK": sink},
        [(sine.OUTPUT, outer.INPUT), (outer.OUTPUT, sink.INPUT), (sink.OUTPUT, "/display")],
        [sink],
    )
    assert list(plan.units) == ["SINE", "OUTER/INNER/A", "OUTER/INNER/B", "SINK"]
    assert sorted(plan.edges) == [
        ("OUTER/INNER/A/OUTPUT", "OUTER/INNER/B/INPUT"),
        ("OUTER/INNER/B/OUTPUT", "SINK/INPUT"),
        ("SINE/OUTPUT", "OUTER/INNER/A/INPUT"),
        ("SINK/OUTPUT", "/display"),
    ]
    assert plan.process_of == {
        "SINE": "",
        "OUTER/INNER/A": "",
        "OUTER/INNER/B": "OUTER/INNER/B",
        "SINK": "SINK",
    }
    assert outer.INNER.A.path == "OUTER/INNER/A"


def test_string_endpoints_name_streams_or_outside_topics() -> None:
    sine, scale = Sine(), Scale()
    plan = build_plan(
        {"SINE": sine, "SCALE": scale},
        [("SINE/OUTPUT", "SCALE/INPUT"), ("/raw", scale.ANYTHING)],
    )
    assert sorted(plan.edges) == [("/raw", "SCALE/ANYTHING"), ("SINE/OUTPUT", "SCALE/INPUT")]


def test_unknown_stream() -> None:
    sine, scale = Sine(), Scale()
    with invalid(r"connection 0: unknown stream 'SINE/OUTPTU': Sine SINE has no stream"):
        build_plan({"SINE": sine, "SCALE": scale}, [("SINE/OUTPTU", scale.INPUT)])
    stranger = Sine()
    with invalid(r"connection 0: unknown stream OUTPUT of a Sine that is not in the graph"):
        build_plan({"SINE": sine, "SCALE": scale}, [(stranger.OUTPUT, scale.INPUT)])
    with invalid("is a component, not a stream"):
        build_plan({"SINE": sine, "SCALE": scale}, [("SINE", scale.INPUT)])
    with invalid("component, not a stream"):
        build_plan({"SINE": sine, "SCALE": scale}, [(sine, scale.INPUT)])
    with invalid("stream of a class, not of a component"):
        build_plan({"SINE": sine, "SCALE": scale}, [(Sine.OUTPUT, scale.INPUT)])
    with invalid(r"\(source, destination\) pair"):
        build_plan({"SINE": sine, "SCALE": scale}, [(sine.OUTPUT,)])


def test_two_inputs_two_outputs_or_reversed() -> None:
    sine, scale, other = Sine(), Scale(), Scale()
    components = {"SINE": sine, "SCALE": scale, "OTHER": other}
    with invalid(r"connection 0 \(SCALE.INPUT -> OTHER.INPUT\) connects two inputs"):
        build_plan(components, [(scale.INPUT, other.INPUT)])
    with invalid(r"connection 0 \(SINE.OUTPUT -> SCALE.OUTPUT\) connects two outputs"):
        build_plan(components, [(sine.OUTPUT, scale.OUTPUT)])
    with invalid(r"connection 1 .* is reversed"):
        build_plan(components, [(sine.OUTPUT, scale.INPUT), (other.INPUT, sine.OUTPUT)])


def test_collection_streams_are_relays_in_both_directions() -> None:
    class Wrong(ezflow.Collection):
        INPUT = ezflow.InputStream(np.ndarray)
        A = Scale()

        def network(self) -> Iterable[tuple[Any, Any]]:
            return [(self.A.OUTPUT, self.INPUT)]

    with invalid(r"WRONG connection 0 \(WRONG/A.OUTPUT -> WRONG.INPUT\) connects two outputs"):
        build_plan({"WRONG": Wrong()})


def test_message_type_mismatch() -> None:
    sine, scale = Sine(), Scale()
    with invalid(r"message type mismatch: SINE.TEXT carries str but SCALE.INPUT expects ndarray"):
        build_plan({"SINE": sine, "SCALE": scale}, [(sine.TEXT, scale.INPUT)])
    # A unit's INPUT_SETTINGS accepts its own SETTINGS class only.
    with invalid(r"SINE.OUTPUT carries ndarray but SCALE.INPUT_SETTINGS expects ScaleSettings"):
        build_plan({"SINE": sine, "SCALE": scale}, [(sine.OUTPUT, scale.INPUT_SETTINGS)])
    # An undeclared type on either end is not checked.
    build_plan({"SINE": sine, "SCALE": scale}, [(sine.TEXT, scale.ANYTHING)])


def test_duplicate_component_names() -> None:
    sine = Sine()
    with invalid("duplicate component name 'SINE'"):
        build_plan({"SINE": sine}, [])  # fine on its own
        ezflow.GraphRunner({"SINE": sine}, SINE=Sine())
    with invalid("the same Sine instance is both SINE and COPY"):
        build_plan({"SINE": sine, "COPY": sine})
    with invalid("may not contain '/'"):
        build_plan({"A/B": Sine()})


def test_settings_of_the_wrong_type() -> None:
    sine = Sine()
    sine.SETTINGS = ScaleSettings()  # bypassing apply_settings
    with invalid(r"SINE: settings are a ScaleSettings, but Sine expects SineSettings"):
        build_plan({"SINE": sine})
    with invalid(r"SAVE: Saver has no settings, and NeedsPath has required fields \(path\)"):
        build_plan({"SAVE": Saver()})
    with invalid("expects SineSettings"):
        Sine(ScaleSettings())


class GainedSettings(ezflow.Settings):
    factor: float = 1.0
    mode: Literal["fast", "exact"] = "fast"
    taps: tuple[int, ...] = (1,)
    limit: int | None = None


class Gained(ezflow.Collection):
    """Sets its child's settings from its own in configure()."""

    SETTINGS = GainedSettings
    CHILD = Scale()

    def configure(self) -> None:
        self.CHILD.apply_settings(ScaleSettings(factor=self.SETTINGS.factor))  # type: ignore[attr-defined]


def test_settings_are_set_by_path_before_configure() -> None:
    plan = build_plan(
        {"G": Gained(), "SAVE": Saver()},
        settings={
            # Text, read by each field's type (what `ezflow run --set` passes).
            "G": {"factor": "3", "mode": "exact", "taps": "(2, 3)", "limit": "none"},
            "SAVE": {"path": "/tmp/out"},  # a required field, given only here
        },
    )
    child, saver = plan.units["G/CHILD"].SETTINGS, plan.units["SAVE"].SETTINGS
    assert child == ScaleSettings(factor=3.0)  # through G's configure()
    assert saver == NeedsPath(path="/tmp/out")
    # A child's fields are set after its parent's configure() set them; values that
    # are not text are taken as they are.
    plan = build_plan({"G": Gained()}, settings={"G": {"factor": 3}, "G/CHILD": {"factor": 5.0}})
    child = plan.units["G/CHILD"].SETTINGS
    assert child == ScaleSettings(factor=5.0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"G/CHLD": {"factor": "1"}},
            r"cannot set G/CHLD.factor: there is no component 'G/CHLD' "
            r"\(did you mean 'G/CHILD'\?\); the graph's components: G, G/CHILD$",
        ),
        (
            {"G": {"facter": "1"}},
            r"cannot set G.facter: GainedSettings has no field 'facter' "
            r"\(did you mean 'factor'\?\); its fields: factor, mode, taps, limit$",
        ),
        (
            {"G": {"factor": "fast"}},
            r"cannot set G.factor: GainedSettings.factor is declared "
            r"as float: 'fast' is not a float$",
        ),
        ({"G": {"mode": "slow"}}, r"'slow' is not one of 'fast', 'exact'$"),
        (
            {"G": {"taps": "[2]"}},
            r"'\[2\]' is not a tuple\[int, ...\] written as a Python "
            r"literal$",
        ),
        ({"G": {"limit": "lots"}}, r"'lots' is not an int or none$"),
        ({"G": {"factor": [1]}}, r"cannot set G.factor: GainedSettings.factor=\[1\] is a list"),
        ({"G/CHILD/OUTPUT": {"x": "1"}}, r"there is no component 'G/CHILD/OUTPUT'"),
    ],
)
def test_a_wrong_path_field_or_value_is_named(settings: Any, message: str) -> None:
    with invalid(message):
        build_plan({"G": Gained()}, settings=settings)


def test_a_component_without_settings_has_none_to_set() -> None:
    with invalid(r"cannot set SHOWN.x: Shown declares no SETTINGS class, so it has no settings"):
        build_plan({"SHOWN": Shown()}, settings={"SHOWN": {"x": "1"}})


def test_process_components_must_be_in_the_graph() -> None:
    sine, scale = Sine(), Scale()
    with invalid(r"process_components\[0\]: a Scale that is not in the graph"):
        build_plan({"SINE": sine}, [], [scale])
    with invalid(r"process_components\[1\]: SINE is already listed"):
        build_plan({"SINE": sine}, [], [sine, sine])
    with invalid("is not a component"):
        build_plan({"SINE": sine}, [], ["SINE"])

    class Greedy(ezflow.Collection):
        A = Scale()

        def process_components(self) -> Iterable[ezflow.Component]:
            return [sine]

    with invalid(r"GREEDY.process_components\(\)\[0\]: SINE is not inside GREEDY"):
        build_plan({"SINE": sine, "GREEDY": Greedy()})


def test_one_main_per_process() -> None:
    with invalid(r"process main has several @main methods \(A.show, B.show\)"):
        build_plan({"A": Shown(), "B": Shown()})
    a, b = Shown(), Shown()
    assert build_plan({"A": a, "B": b}, [], [b]).process_of == {"A": "", "B": "B"}
    with invalid("several @main methods"):
        build_plan({"A": a, "B": b}, [], [b], force_single_process=True)
    assert build_plan({"A": a, "S": Sine()}, [], [a], force_single_process=True).process_of == {
        "A": "",
        "S": "",
    }


def test_nothing_to_run() -> None:
    with invalid("nothing to run"):
        build_plan({})
    with invalid("is not a component"):
        build_plan({"X": object()})  # type: ignore[dict-item]


class ForeignComponent:
    """The base of another framework's components (its classes claim ``otherfw``)."""

    __module__ = "otherfw.core"


class ForeignStream:
    __module__ = "otherfw.core"


class ForeignUnit(ForeignComponent):
    __module__ = "otherfw.units"

    def __init__(self) -> None:
        self.OUT = ForeignStream()  # one of its streams


def test_other_frameworks_components_go_through_their_adapter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ezflow._units import _foreign  # noqa: PLC0415

    foreign, scale = ForeignUnit(), Scale()
    with pytest.raises(ezflow.GraphDefinitionError, match="is not a component"):
        build_plan({"F": foreign, "S": scale}, [(foreign.OUT, scale.INPUT)])  # type: ignore[dict-item]
    adapted = Sine()

    class Adapter:
        swap = {id(foreign): adapted, id(foreign.OUT): adapted.OUTPUT}

        def component(self, obj: object) -> object:
            return self.swap.get(id(obj), obj)

        endpoint = placed = component

    monkeypatch.setattr(_foreign, "_factories", {"otherfw": Adapter})
    monkeypatch.setitem(_foreign.COMPONENT_BASES, "otherfw", "otherfw.core.ForeignComponent")
    assert _plan.adaptable(foreign) and not _plan.adaptable(scale)
    assert not _plan.adaptable(foreign.OUT)  # a stream, not a component
    plan = build_plan(
        {"F": foreign, "S": scale},  # type: ignore[dict-item]
        [(foreign.OUT, scale.INPUT)],
        process_components=[foreign],
    )
    assert plan.units["F"] is adapted
    assert plan.edges == [("F/OUTPUT", "S/INPUT")]
    assert plan.process_of == {"F": "F", "S": ""}


def test_topic_names_are_recorded_and_inputs_they_alone_feed_drain_without_an_end() -> None:
    sine, scale, other = Sine(), Scale(), Scale()
    plan = build_plan(
        {"SINE": sine, "SCALE": scale, "OTHER": other},
        [
            (sine.OUTPUT, "/sensor/raw"),
            ("/sensor/rwa", scale.INPUT),
            ("/sensor/raw", other.INPUT),
            (sine.OUTPUT, other.INPUT),  # OTHER is fed by the graph too
        ],
    )
    assert plan.topic_ends == [
        _plan.TopicEnd("/sensor/raw", "destination", "connection 0", "SINE.OUTPUT"),
        _plan.TopicEnd("/sensor/rwa", "source", "connection 1", "SCALE.INPUT"),
        _plan.TopicEnd("/sensor/raw", "source", "connection 2", "OTHER.INPUT"),
    ]
    assert plan.external_inputs == {"SCALE/INPUT"}


def test_ezmsg_wiring_joins_two_outputs_with_a_note_where_ezflow_refuses() -> None:
    import ezflow.compat.ezmsg as ez  # noqa: PLC0415

    class Relay(ez.Unit):
        INPUT = ez.InputStream(int)
        OUTPUT = ez.OutputStream(int)

    class Wired(ez.Collection):
        A = Relay()
        B = Relay()
        C = Relay()

        def network(self) -> ez.NetworkDefinition:
            return ((self.A.OUTPUT, self.B.OUTPUT), (self.B.OUTPUT, self.C.INPUT))

    plan = build_plan({"W": Wired()})
    # As in ezmsg: what A publishes reaches B's subscribers too (through B's topic).
    assert plan.edges == [("W/A/OUTPUT", "W/B/OUTPUT"), ("W/B/OUTPUT", "W/C/INPUT")]
    assert plan.notes == [
        "W connection 0 (W/A.OUTPUT -> W/B.OUTPUT) connects two outputs; as in ezmsg, what "
        "W/A.OUTPUT publishes also reaches the subscribers of W/B.OUTPUT (an "
        "ezflow.Collection refuses this: it is usually a wiring mistake; connect an "
        "OutputStream to an InputStream)"
    ]
    a, b = Sine(), Sine()
    with invalid("connects two outputs"):  # ezflow's own components: refused
        build_plan({"A": a, "B": b}, [(a.OUTPUT, b.OUTPUT)])


@dataclasses.dataclass
class Unregistered:  # deliberately not registered
    value: float


class SendsUnregistered(ezflow.Unit):
    OUTPUT = ezflow.OutputStream(Unregistered)


class TakesUnregistered(ezflow.Unit):
    INPUT = ezflow.InputStream(Unregistered)


def test_an_unregistered_declared_class_between_processes_fails_at_start() -> None:
    source, sink = SendsUnregistered(), TakesUnregistered()
    graph = {"SOURCE": source, "SINK": sink}
    connections = [(source.OUTPUT, sink.INPUT)]
    build_plan(graph, connections)  # one process: messages pass by reference
    build_plan(graph, connections, [sink], force_single_process=True)
    with invalid(
        rf"^SOURCE.OUTPUT declares {__name__}.Unregistered, a dataclass that is not "
        r"registered, and is connected to SINK.INPUT in another process \(SINK\): its "
        r"messages cannot travel there; decorate Unregistered with @ezflow.message \(or "
        r"call ezflow.register_message\(Unregistered\)\) at module level$"
    ):
        build_plan(graph, connections, [sink])
