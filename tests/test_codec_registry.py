"""The message type registry (ezflow._core._codec._registry): registered dataclasses
round-trip, registration rules, unknown names and failing constructors on decoding."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from _codec_cases import (
    Checked,
    Derived,
    Frozen,
    Plain,
    Point,
    Slotted,
    assert_same,
    ext,
    make_body,
    roundtrip,
)

from ezflow._core import _codec
from ezflow._core._codec import DEFAULT_CODEC, Codec, message, register_message
from ezflow._core._codec._format import EXT_DATACLASS
from ezflow._core._exceptions import ConfigurationError, ProtocolError


def test_dataclass_roundtrip() -> None:
    frame = Frozen("f", Point(1.0, -2.0), ("a", "b"))
    slotted = Slotted(
        np.arange(6.0).reshape(2, 3), np.datetime64("2024-01-01T00:00:00"), {"p": frame}
    )
    derived = Derived(np.array([1.0, 2.0, 3.5]))
    out = roundtrip([frame, slotted, derived, {"nested": [Point(0.0, 0.0)]}])
    assert out[0] == frame and type(out[0].tags) is tuple
    assert_same(slotted, out[1])
    assert out[1].meta["p"] == frame
    assert isinstance(out[2], Derived) and out[2].total == 6.5
    assert not out[2].values.flags.writeable
    assert out[3] == {"nested": [Point(0.0, 0.0)]}
    assert roundtrip(Point(1.0, 2.0)) == Point(1.0, 2.0)


def test_registration_rules() -> None:
    assert register_message(Point, name="tests.codec.Point") is Point  # same name: no-op
    assert register_message(Point) is Point  # no name: no-op once registered

    with pytest.raises(ConfigurationError, match=r"already registered as message type"):
        register_message(Point, name="tests.codec.OtherName")

    @dataclasses.dataclass
    class Impostor:
        x: float

    with pytest.raises(ConfigurationError) as info:
        register_message(Impostor, name="tests.codec.Point")
    assert "Point" in str(info.value) and "Impostor" in str(info.value)

    with pytest.raises(TypeError, match="dataclass"):
        register_message(Plain)
    with pytest.raises(TypeError, match="dataclass"):
        register_message(Point(1.0, 2.0))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        register_message(Impostor, name="")

    @message(name="tests.codec.Decorated")
    @dataclasses.dataclass
    class Decorated:
        v: int

    assert roundtrip(Decorated(3)) == Decorated(3)

    @message
    @dataclasses.dataclass
    class DefaultName:
        v: int

    body = DEFAULT_CODEC.encode(DefaultName(1)).to_bytes()
    assert f"{DefaultName.__module__}.{DefaultName.__qualname__}".encode() in body
    assert DEFAULT_CODEC.decode(body) == DefaultName(1)


def test_unknown_message_name_is_protocol_error() -> None:
    body = DEFAULT_CODEC.encode({"p": Point(1.0, 2.0)}).to_bytes()
    forged = body.replace(b"tests.codec.Point", b"tests.codec.Ghost")
    assert forged != body
    with pytest.raises(
        ProtocolError, match=r"unknown message type 'tests.codec.Ghost'.*register_message"
    ):
        DEFAULT_CODEC.decode(forged)


def test_constructor_failure_is_protocol_error_with_cause() -> None:
    obj = Checked(1)
    obj.value = -1
    body = DEFAULT_CODEC.encode(obj).to_bytes()
    with pytest.raises(ProtocolError) as info:
        DEFAULT_CODEC.decode(body)
    assert isinstance(info.value.__cause__, ValueError)
    # Unknown field names also fail in the constructor.
    meta = msgpack.packb(
        ext(EXT_DATACLASS, msgpack.packb(["tests.codec.Point", {"x": 1.0, "z": 2}]))
    )
    with pytest.raises(ProtocolError) as info:
        DEFAULT_CODEC.decode(make_body(meta))
    assert isinstance(info.value.__cause__, TypeError)


def test_a_class_of_the_main_script_has_one_name_in_every_process() -> None:
    """A script's classes are ``__main__.X`` where it runs and ``__mp_main__.X`` where a
    spawned child imports it: both register under ``__main__.X``."""
    codec = Codec()
    made = {}
    for module in ("__main__", "__mp_main__"):

        @dataclasses.dataclass
        class Reading:
            value: int

        Reading.__module__ = module
        Reading.__qualname__ = f"Reading_{id(made)}"
        made[module] = Reading
    _codec.register_message(made["__main__"])
    body = codec.encode(made["__main__"](3)).to_bytes()
    # The child's class registers under the same name: here it collides with the parent's
    # (one process), which proves the names are equal.
    with pytest.raises(ConfigurationError, match=r"already registered|cannot register"):
        _codec.register_message(made["__mp_main__"])
    assert codec.decode(body) == made["__main__"](3)
