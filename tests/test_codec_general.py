"""The general encoder, validator and decoder (ezflow._core._codec._general): what cannot be
encoded is named with the fix (encode and validate alike), nesting and size bounds, and
malformed metas are protocol errors."""

from __future__ import annotations

import array
import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from _codec_cases import (
    Color,
    Frozen,
    MyList,
    Pair,
    Plain,
    Point,
    Unregistered,
    decode_or_protocol_error,
    ext,
    keys,
    leaves,
    make_body,
    packed_descr,
    roundtrip,
    values,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from ezflow._core._codec import DEFAULT_CODEC, MAX_DEPTH
from ezflow._core._codec._format import EXT_BUFFER, EXT_BYTES, EXT_DATACLASS, EXT_TUPLE
from ezflow._core._exceptions import ProtocolError, UnregisteredTypeError

# --------------------------------------------------------------------------- unsupported


@pytest.mark.parametrize(
    ("obj", "name"),
    [
        ({1, 2}, "set"),
        (frozenset(), "frozenset"),
        (Plain(), "Plain"),
        (Unregistered(1), "Unregistered"),
        (np.array([1, "a"], dtype=object), "object"),
        (np.zeros(2, dtype=[("a", "O")]), "object"),
        (print, "builtin_function_or_method"),
        (lambda: 0, "function"),
        (1j, "complex"),
        (np.ma.masked_array([1, 2], mask=[False, True]), "MaskedArray"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_unsupported_types(obj: object, name: str) -> None:
    for wrapped in (obj, [1, {"k": obj}], (obj,), Frozen("x", Point(0, 0), (obj,))):  # type: ignore[arg-type]
        for operation in (DEFAULT_CODEC.encode, DEFAULT_CODEC.validate):
            with pytest.raises(UnregisteredTypeError) as info:
                operation(wrapped)
            assert isinstance(info.value, TypeError)
            assert name in str(info.value)
    if isinstance(obj, Unregistered):
        assert "register_message" in str(info.value)


def test_unregistered_dataclass_message_mentions_registration() -> None:
    with pytest.raises(UnregisteredTypeError, match=r"Unregistered.*register_message"):
        DEFAULT_CODEC.encode(Unregistered(1))


def test_what_cannot_be_encoded_is_named_with_its_field_and_the_fix() -> None:
    # A field of a dataclass (nested ones add theirs), a buffer that is not bytes-like
    # (array.array: what to send instead), a script's class as __main__ (not the
    # __mp_main__ a unit process imports it as).
    nested = Frozen("x", Point(array.array("b", [0]), 0))  # type: ignore[arg-type]
    for operation in (DEFAULT_CODEC.encode, DEFAULT_CODEC.validate):
        with pytest.raises(UnregisteredTypeError) as info:
            operation(nested)
        assert str(info.value) == (
            f"{Frozen.__module__}.Frozen.point: {Point.__module__}.Point.x: cannot encode an "
            "object of type array.array; it holds a buffer: send numpy.asarray(x) (an array "
            "of its items) or memoryview(x) (its bytes) instead"
        )
    script_class = type(Unregistered)("Reading", (), {"__module__": "__mp_main__"})
    with pytest.raises(
        UnregisteredTypeError, match=r"^cannot encode an object of type __main__\.Reading;"
    ):
        DEFAULT_CODEC.encode(script_class())


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**100])
def test_int_out_of_range(value: int) -> None:
    for operation in (DEFAULT_CODEC.encode, DEFAULT_CODEC.validate):
        with pytest.raises(UnregisteredTypeError, match="64-bit"):
            operation({"n": [value]})


def test_too_deep_nesting_is_value_error() -> None:
    deep: list[Any] = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    deep_tuple: Any = ()
    for _ in range(MAX_DEPTH + 5):
        deep_tuple = (deep_tuple,)
    for obj in (deep, cyclic, deep_tuple):
        for operation in (DEFAULT_CODEC.encode, DEFAULT_CODEC.validate):
            with pytest.raises(ValueError, match="deep") as info:
                operation(obj)
            assert not isinstance(info.value, UnregisteredTypeError)
    ok: list[Any] = []
    for _ in range(MAX_DEPTH - 1):
        ok = [ok]
    assert roundtrip(ok) == ok


def test_other_encode_value_errors() -> None:
    with pytest.raises(ValueError):
        DEFAULT_CODEC.encode(["\ud800"])
    with pytest.raises(ValueError, match="out-of-band buffers"):
        DEFAULT_CODEC.encode([bytearray(1)] * 70_000)
    with pytest.raises(ValueError, match="zero-size items"):
        DEFAULT_CODEC.encode(np.broadcast_to(np.zeros(1, dtype=[]), (2**40,)))
    DEFAULT_CODEC.encode([bytearray(1)] * 65_535)


_BAD_LEAVES = st.sampled_from(
    [
        {1, 2},
        Plain(),
        Unregistered(1),
        np.array([None], dtype=object),
        np.ma.masked_array([1, 2]),
        2**64,
        -(2**63) - 1,
        1j,
    ]
)
_ODD_LEAVES = st.sampled_from(
    [np.float32(1.5), np.zeros(3, np.int16), memoryview(b"ab"), bytearray(b"c"), Color.RED]
)


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(keys, inner, max_size=3)
        | st.lists(inner, max_size=3).map(MyList)  # (subclasses: the items still checked)
        | inner.map(lambda item: Pair(1, item))
        | inner.map(lambda item: Frozen("x", Point(0.0, 1.0), (item,)))
    )


@settings(max_examples=300, deadline=None)
@given(st.recursive(leaves | _BAD_LEAVES | _ODD_LEAVES, _nested, max_leaves=15))
def test_validate_raises_what_encode_raises_for_types(obj: object) -> None:
    # validate walks the message as encode does (it skips the calls for plain leaves
    # and goes straight to an exact container's items): the same error, type and
    # message, for every type encode refuses; nothing where encode succeeds.
    encoded = _raised(lambda: DEFAULT_CODEC.encode(obj))
    validated = _raised(lambda: DEFAULT_CODEC.validate(obj))
    if encoded is None:
        assert validated is None
    elif issubclass(encoded[0], UnregisteredTypeError) or "deep" in encoded[1]:
        assert validated == encoded


def _raised(call: Any) -> tuple[type[BaseException], str] | None:
    try:
        call()
    except Exception as exc:
        return type(exc), str(exc)
    return None


def test_validate_is_cheap_for_large_top_level_values() -> None:
    # Nothing is copied or encoded: a 1 TB broadcast array validates instantly.
    huge = np.broadcast_to(np.zeros(1), (2**37,))
    DEFAULT_CODEC.validate(huge)
    DEFAULT_CODEC.validate(b"x" * 10_000_000)


# --------------------------------------------------------------------------- malformed metas


@settings(max_examples=300, deadline=None)
@given(values)
def test_random_metas(obj: object) -> None:
    # Arbitrary msgpack in the meta, also with ext types of every code around ours.
    meta = msgpack.packb(obj, default=lambda o: ext(EXT_TUPLE, msgpack.packb(list(o))))
    decode_or_protocol_error(make_body(meta))
    decode_or_protocol_error(make_body(meta, [b"abc"]))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 127), st.binary(max_size=40), st.lists(st.binary(max_size=40), max_size=2))
def test_random_ext_payloads(code: int, payload: bytes, bufs: list[bytes]) -> None:
    body = make_body(msgpack.packb([ext(code, payload)]), bufs)
    decode_or_protocol_error(body)


F8 = packed_descr("<f8")


def bad_ext(code: int, payload: bytes, bufs: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
    return make_body(msgpack.packb([ext(code, payload)]), bufs)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(make_body(b"\xc0\xc0"), id="meta-extra-data"),
        pytest.param(make_body(b"\xc1"), id="meta-invalid-byte"),
        pytest.param(make_body(b"\xa2\xff\xfe"), id="meta-bad-utf8"),
        pytest.param(make_body(msgpack.packb(msgpack.Timestamp(1, 0))), id="timestamp"),
        pytest.param(
            make_body(msgpack.packb([{"a": msgpack.Timestamp(1, 0)}])), id="nested-timestamp"
        ),
        pytest.param(
            bad_ext(EXT_TUPLE, msgpack.packb([msgpack.Timestamp(1, 0)])), id="timestamp-in-tuple"
        ),
        pytest.param(make_body(msgpack.packb({(1, 2): 3})), id="list-key"),
        pytest.param(bad_ext(42, b""), id="unknown-ext"),
        pytest.param(bad_ext(EXT_TUPLE, msgpack.packb({"a": 1})), id="tuple-not-list"),
        pytest.param(bad_ext(EXT_TUPLE, b"\x91"), id="tuple-truncated"),
        pytest.param(bad_ext(EXT_DATACLASS, msgpack.packb(["x"])), id="dataclass-short"),
        pytest.param(bad_ext(EXT_DATACLASS, msgpack.packb([1, {}])), id="dataclass-name-not-str"),
        pytest.param(
            bad_ext(EXT_DATACLASS, msgpack.packb(["tests.codec.Point", {1: 2}])),
            id="dataclass-key-not-str",
        ),
        pytest.param(bad_ext(EXT_BYTES, b"\0\0\0"), id="bytes-ref-short"),
        pytest.param(bad_ext(EXT_BYTES, struct.pack("<I", 1), [b"a"]), id="bytes-ref-out-of-range"),
        pytest.param(bad_ext(EXT_BUFFER, struct.pack("<I", 0)), id="buffer-ref-no-buffers"),
    ],
)
def test_malformed_general_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        DEFAULT_CODEC.decode(body)


def test_deeply_nested_input_is_protocol_error() -> None:
    payload = msgpack.packb([])
    for _ in range(3000):
        payload = msgpack.packb([ext(EXT_TUPLE, payload)])
    with pytest.raises(ProtocolError):
        DEFAULT_CODEC.decode(make_body(payload))
    with pytest.raises(ProtocolError):
        DEFAULT_CODEC.decode(make_body(b"\x91" * 100_000 + b"\xc0"))
