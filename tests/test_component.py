"""Declarations: Settings, State, streams, decorators, Unit and Collection classes."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import AsyncIterator
from typing import Any, Literal

import numpy as np
import pytest

import ezflow


class RateSettings(ezflow.Settings):
    rate: float = 100.0
    label: str | None = None
    mode: Literal["fast", "slow"] = "fast"


class Required(ezflow.Settings):
    path: str


class CounterState(ezflow.State):
    count: int = 0
    seen: list[int] = dataclasses.field(default_factory=list)
    handle: Any


class Source(ezflow.Unit):
    SETTINGS = RateSettings
    STATE = CounterState
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> AsyncIterator[tuple[Any, Any]]:
        yield self.OUTPUT, np.zeros(1)


class Filter(ezflow.Unit):
    INPUT = ezflow.InputStream(np.ndarray, leaky=True, queue=3)
    OUTPUT = ezflow.OutputStream(np.ndarray, max_in_flight=8)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_samples(self, message: Any) -> AsyncIterator[tuple[Any, Any]]:
        yield self.OUTPUT, message


def test_settings_are_frozen_checked_dataclasses() -> None:
    settings = RateSettings(rate=5)  # an int is a fine float
    assert dataclasses.is_dataclass(settings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.rate = 2.0  # type: ignore[misc]
    assert dataclasses.replace(settings, rate=2.0).rate == 2.0
    with pytest.raises(ezflow.ConfigurationError, match=r"RateSettings.rate='fast' is a str"):
        RateSettings(rate="fast")  # type: ignore[arg-type]
    with pytest.raises(ezflow.ConfigurationError, match="label"):
        RateSettings(label=3)  # type: ignore[arg-type]
    with pytest.raises(ezflow.ConfigurationError, match="mode"):
        RateSettings(mode="medium")  # type: ignore[arg-type]
    assert RateSettings(label=None, mode="slow").mode == "slow"


def test_settings_travel_through_the_codec() -> None:
    codec = ezflow.lowlevel.Codec()
    settings = RateSettings(rate=1.5, label="x")
    assert codec.decode(codec.encode(settings).to_bytes()) == settings


def test_a_settings_class_can_be_defined_again() -> None:
    # A notebook cell run twice defines the class again under the same name.
    for gain in (1.0, 2.0):

        class Redefined(ezflow.Settings):
            value: float = gain

        assert Redefined().value == gain


def test_state_fields_default_factory_and_unset() -> None:
    first, second = CounterState(), CounterState()
    first.seen.append(1)
    assert second.seen == [] and first.count == 0
    assert not hasattr(first, "handle")  # set in initialize(), the ezmsg idiom
    assert "count=0" in repr(first)


def test_unit_settings_by_object_keywords_or_defaults() -> None:
    assert RateSettings() == Source().SETTINGS
    assert Source(RateSettings(rate=3.0)).SETTINGS.rate == 3.0
    assert Source(rate=4.0).SETTINGS.rate == 4.0
    with pytest.raises(ezflow.GraphDefinitionError, match="not both"):
        Source(RateSettings(), rate=1.0)
    with pytest.raises(ezflow.GraphDefinitionError, match="expects RateSettings"):
        Source(Required(path="x"))
    with pytest.raises(ezflow.GraphDefinitionError, match="declares no SETTINGS"):
        Filter(rate=1.0)


def test_streams_and_functions_are_collected() -> None:
    assert set(Filter.streams()) == {"INPUT", "OUTPUT", "INPUT_SETTINGS"}
    assert Filter.INPUT.leaky and Filter.INPUT.queue == 3
    assert Filter.OUTPUT.max_in_flight == 8
    role = Filter.functions()["on_samples"]
    assert role.subscribes is Filter.INPUT and role.publishes == [Filter.OUTPUT]
    unit = Filter()
    assert unit.OUTPUT is unit.OUTPUT  # bound once per instance
    assert unit.OUTPUT.stream is Filter.OUTPUT and unit.OUTPUT.component is unit
    copy = pickle.loads(pickle.dumps(unit))
    assert copy.OUTPUT.component is copy


def test_stream_options_are_checked() -> None:
    with pytest.raises(ezflow.ConfigurationError, match="leaky"):
        ezflow.InputStream(int, queue=4)
    with pytest.raises(ezflow.ConfigurationError, match="queue"):
        ezflow.InputStream(int, leaky=True, queue=0)
    with pytest.raises(ezflow.ConfigurationError, match="transport"):
        ezflow.OutputStream(int, transport="carrier-pigeon")
    with pytest.raises(ezflow.ConfigurationError, match="max_in_flight"):
        ezflow.OutputStream(int, max_in_flight=0)


def test_decorator_misuse_is_a_clear_type_error() -> None:
    stream_in, stream_out = ezflow.InputStream(int), ezflow.OutputStream(int)
    with pytest.raises(TypeError, match="async generator"):

        @ezflow.publisher(stream_out)
        async def not_a_generator(self: Any) -> None: ...

    with pytest.raises(TypeError, match="InputStream"):
        ezflow.subscriber(stream_out)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="OutputStream"):
        ezflow.publisher(stream_in)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="async def"):

        @ezflow.task
        def blocking(self: Any) -> None: ...

    with pytest.raises(TypeError, match="plain `def`"):

        @ezflow.thread
        async def not_blocking(self: Any) -> None: ...

    with pytest.raises(TypeError, match="plain `def`"):

        @ezflow.main
        async def async_main(self: Any) -> None: ...

    with pytest.raises(TypeError, match="one stream"):

        @ezflow.subscriber(stream_in)
        @ezflow.subscriber(ezflow.InputStream(int))
        async def twice(self: Any, message: Any) -> None: ...

    with pytest.raises(TypeError, match="cannot also be"):

        @ezflow.subscriber(stream_in)
        @ezflow.task
        async def both(self: Any) -> None: ...


def test_class_definition_checks() -> None:
    foreign = ezflow.InputStream(int)
    foreign.name = "ELSEWHERE"
    with pytest.raises(TypeError, match="not an input stream of"):

        class Orphan(ezflow.Unit):
            @ezflow.subscriber(foreign)
            async def on(self, message: Any) -> None: ...

    with pytest.raises(TypeError, match=r"no @ezflow\.publisher"):

        class Yielder(ezflow.Unit):
            INPUT = ezflow.InputStream(int)

            @ezflow.subscriber(INPUT)
            async def on(self, message: Any) -> AsyncIterator[Any]:
                yield message

    with pytest.raises(TypeError, match="several @main"):

        class TwoMains(ezflow.Unit):
            @ezflow.main
            def one(self) -> None: ...

            @ezflow.main
            def two(self) -> None: ...


def test_collection_children_are_copied_per_instance() -> None:
    class Pair(ezflow.Collection):
        SOURCE = Source()
        FILTER = Filter()

        def configure(self) -> None:
            self.EXTRA = Filter()  # created in configure(): also a child

    first, second = Pair(), Pair()
    assert first.SOURCE is not second.SOURCE
    assert first.SOURCE is not Pair.SOURCE
    first.configure()
    assert list(first.components()) == ["SOURCE", "FILTER", "EXTRA"]
