"""Tests of the message codec: round trips, type preservation, zero copy, registration,
limits, and that malformed bodies only ever raise ProtocolError."""

from __future__ import annotations

import array
import collections
import contextlib
import dataclasses
import enum
import gc
import math
import struct
import tracemalloc
from typing import Any, NamedTuple

import msgpack
import numpy as np
import pytest
from _messages import dtypes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ezflow._core import _codec
from ezflow._core._codec import (
    BUFFER_ALIGNMENT,
    DEFAULT_CODEC,
    EXT_BUFFER,
    EXT_BYTES,
    EXT_DATACLASS,
    EXT_NDARRAY,
    EXT_NPSCALAR,
    EXT_TUPLE,
    FORMAT_VERSION,
    HEADER,
    INLINE_BYTES_LIMIT,
    MAX_DEPTH,
    Codec,
    EncodedMessage,
    message,
    register_message,
)
from ezflow._core._config import DEFAULT_MAX_MESSAGE_SIZE
from ezflow._core._exceptions import (
    ConfigurationError,
    MessageTooLargeError,
    ProtocolError,
    UnregisteredTypeError,
)

# --------------------------------------------------------------------------- helpers


def body_variants(body: bytes) -> list[Any]:
    """The same body as every input type decode() accepts."""
    return [
        body,
        bytearray(body),
        memoryview(body),
        np.frombuffer(body, dtype=np.uint8),
    ]


def check_parts(enc: EncodedMessage) -> bytes:
    """Check the EncodedMessage invariants and return the joined body."""
    assert isinstance(enc, EncodedMessage)
    total = 0
    for part in enc.parts:
        assert isinstance(part, (bytes, memoryview))
        if isinstance(part, memoryview):
            # asyncio transports slice parts by bytes after a partial write.
            assert part.ndim == 1
            assert part.format == "B"
            assert part.c_contiguous
        total += len(part)
    body = enc.to_bytes()
    assert body == b"".join(enc.parts)
    assert len(body) == total == enc.nbytes
    return body


def roundtrip(obj: object, codec: Codec = DEFAULT_CODEC) -> Any:
    codec.validate(obj)
    body = check_parts(codec.encode(obj))
    results = [codec.decode(b) for b in body_variants(body)]
    for other in results[1:]:
        assert_same(results[0], other)
    return results[0]


def expected_type(obj: object) -> type:
    """The type *obj* decodes as."""
    if isinstance(obj, np.generic):
        return type(obj)
    if isinstance(obj, np.ndarray):
        return np.ndarray
    if isinstance(obj, (bytearray, memoryview)):
        return memoryview
    for base in (bool, int, float, str, bytes, dict, list, tuple):
        if isinstance(obj, base):
            return base
    return type(obj)


def assert_same(expected: object, actual: object) -> None:
    """*actual* is what decoding *expected* must give: same type, bitwise same data."""
    assert type(actual) is expected_type(expected), (type(expected), type(actual))
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray)
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        assert np.ascontiguousarray(expected).tobytes() == actual.tobytes()
    elif isinstance(expected, np.generic):
        assert isinstance(actual, np.generic)
        assert actual.dtype == expected.dtype
        assert actual.tobytes() == expected.tobytes()
    elif isinstance(expected, float):
        assert isinstance(actual, float)
        if math.isnan(expected):
            assert math.isnan(actual)
        else:
            assert actual == expected
            assert math.copysign(1.0, actual) == math.copysign(1.0, expected)
    elif isinstance(expected, (bytearray, memoryview)):
        assert isinstance(actual, memoryview)
        assert actual.readonly
        assert actual.format == "B" and actual.ndim == 1
        assert actual.tobytes() == memoryview(expected).tobytes()
    elif isinstance(expected, dict):
        assert isinstance(actual, dict)
        assert len(actual) == len(expected)
        for (ek, ev), (ak, av) in zip(expected.items(), actual.items(), strict=True):
            assert_same(ek, ak)
            assert_same(ev, av)
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple))
        assert len(actual) == len(expected)
        for e, a in zip(expected, actual, strict=True):
            assert_same(e, a)
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            assert_same(getattr(expected, field.name), getattr(actual, field.name))
    else:
        assert actual == expected


def make_body(meta: bytes, bufs: list[bytes] = (), *, nbuf: int | None = None) -> bytes:  # type: ignore[assignment]
    """Build a body by hand, following the documented layout."""
    count = len(bufs) if nbuf is None else nbuf
    out = bytearray(HEADER.pack(FORMAT_VERSION, 0, count, len(meta)))
    out += struct.pack(f"<{len(bufs)}Q", *(len(b) for b in bufs))
    out += meta
    for buf in bufs:
        out += b"\0" * (-len(out) % BUFFER_ALIGNMENT)
        out += buf
    return bytes(out)


def ext(code: int, data: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(code, data)


def packed_descr(descr: object) -> bytes:
    packed: bytes = msgpack.packb(descr)
    return packed


def array_payload(index: int, shape: tuple[int, ...], descr: bytes) -> bytes:
    return struct.pack(f"<IB{len(shape)}Q", index, len(shape), *shape) + descr


def decode_or_protocol_error(body: object, codec: Codec = DEFAULT_CODEC) -> None:
    with contextlib.suppress(ProtocolError):
        codec.decode(body)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- strategies

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
large_bytes = st.builds(
    lambda n, b: bytes([b]) * n,
    st.integers(INLINE_BYTES_LIMIT, 3 * INLINE_BYTES_LIMIT),
    st.integers(0, 255),
)
leaves = (
    st.none()
    | st.booleans()
    | INT64
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=40)
    | large_bytes
)
keys = st.recursive(
    st.text(max_size=10) | INT64 | st.none() | st.booleans() | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=5,
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(keys, inner, max_size=5)
    ),
    max_leaves=25,
)

all_dtypes = dtypes  # (tests/_messages.py: one strategy for every codec test)


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray[Any, Any]:
    dtype = draw(all_dtypes)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    arr = draw(hnp.arrays(dtype=dtype, shape=shape))
    layout = draw(st.sampled_from(["c", "fortran", "slice", "transpose", "negative"]))
    if layout == "fortran":
        arr = np.asfortranarray(arr)
    elif layout == "slice" and arr.ndim:
        arr = arr[::2]
    elif layout == "transpose":
        arr = arr.T
    elif layout == "negative" and arr.ndim:
        arr = arr[::-1]
    return arr


# --------------------------------------------------------------------------- test types


@message(name="tests.codec.Point")
@dataclasses.dataclass
class Point:
    x: float
    y: float


@message(name="tests.codec.Frozen")
@dataclasses.dataclass(frozen=True)
class Frozen:
    label: str
    point: Point
    tags: tuple[str, ...] = ()


@message(name="tests.codec.Slotted")
@dataclasses.dataclass(slots=True)
class Slotted:
    data: np.ndarray[Any, Any]
    stamp: np.datetime64
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@message
@dataclasses.dataclass(frozen=True, slots=True)
class Derived:
    values: np.ndarray[Any, Any]
    total: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", float(np.sum(self.values)))


@dataclasses.dataclass
class Checked:
    value: int

    def __post_init__(self) -> None:
        if self.value < 0:
            raise ValueError("value must not be negative")


register_message(Checked, name="tests.codec.Checked")


@dataclasses.dataclass
class Unregistered:
    a: int


class Plain:
    pass


class Pair(NamedTuple):
    a: int
    b: str


class Color(enum.IntEnum):
    RED = 1


class MyStr(str):
    pass


class MyFloat(float):
    pass


class MyBytes(bytes):
    pass


class MyList(list):  # type: ignore[type-arg]
    pass


class SubArray(np.ndarray[Any, Any]):
    pass


# --------------------------------------------------------------------------- round trips


@settings(max_examples=300, deadline=None)
@given(values)
def test_roundtrip_values(obj: object) -> None:
    assert_same(obj, roundtrip(obj))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrays())
def test_roundtrip_arrays(arr: np.ndarray[Any, Any]) -> None:
    out = roundtrip(arr)
    assert_same(arr, out)
    assert not out.flags.writeable
    # Also nested, next to other buffers.
    nested = roundtrip({"a": [arr, b"x" * 2000], "b": (arr, bytearray(b"yz"))})
    assert_same(arr, nested["a"][0])
    assert_same(arr, nested["b"][0])


@settings(max_examples=150, deadline=None)
@given(all_dtypes, st.data())
def test_roundtrip_numpy_scalars(dtype: np.dtype[Any], data: st.DataObject) -> None:
    scalar = data.draw(hnp.from_dtype(dtype))
    if not isinstance(scalar, np.generic):
        scalar = np.array(scalar, dtype=dtype)[()]
    out = roundtrip(scalar)
    assert_same(scalar, out)
    assert out.dtype in (dtype, scalar.dtype)


@pytest.mark.parametrize(
    "scalar",
    [
        np.float32(1.5),
        np.float16(-0.0),
        np.float64("nan"),
        np.int8(-3),
        np.int64(-(2**63)),
        np.uint64(2**64 - 1),
        np.bool_(True),
        np.datetime64("2021-03-04T05:06:07.123456789"),
        np.datetime64("NaT"),
        np.timedelta64(5, "ms"),
        np.complex128(1 - 2j),
        np.complex64(3j),
        np.longdouble("1.1"),
        np.str_("héllo"),
        np.bytes_(b"ab\x00c"),
        np.void(b"\x01\x02\x03"),
        np.void(b""),
        np.zeros(1, dtype=[("a", "<i2"), ("b", ">f4", (2,))])[0],
    ],
    ids=repr,
)
def test_numpy_scalar_types_preserved(scalar: np.generic) -> None:
    out = roundtrip(scalar)
    assert type(out) is type(scalar)
    assert out.dtype == scalar.dtype
    assert out.tobytes() == scalar.tobytes()


def test_python_types_preserved() -> None:
    obj = {
        "tuple": (1, (2, 3), [4, (5,)]),
        (1, "a"): "tuple key",
        ((1, 2), None): "nested tuple key",
        7: "int key",
        2**64 - 1: "big int key",
        None: "none key",
        1.5: "float key",
        "small": b"abc",
        "large": b"\x01" * 5000,
        "empty": (),
    }
    out = roundtrip(obj)
    assert out == obj
    assert type(out["tuple"]) is tuple
    assert type(out["tuple"][1]) is tuple
    assert type(out["tuple"][2]) is list
    assert type(out["tuple"][2][1]) is tuple
    assert type(out["large"]) is bytes
    assert out["empty"] == ()
    assert list(out) == list(obj)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        0.0,
        -0.0,
        math.inf,
        "",
        "x" * 100_000,
    ],
)
def test_top_level_leaves(value: object) -> None:
    assert_same(value, roundtrip(value))


def test_bytes_inline_and_out_of_band() -> None:
    small = b"s" * (INLINE_BYTES_LIMIT - 1)
    large = b"l" * INLINE_BYTES_LIMIT
    enc_small = DEFAULT_CODEC.encode(small)
    enc_large = DEFAULT_CODEC.encode(large)
    assert HEADER.unpack_from(enc_small.to_bytes())[2] == 0
    assert HEADER.unpack_from(enc_large.to_bytes())[2] == 1
    # The large bytes are referenced, not copied, when encoding.
    assert any(isinstance(p, memoryview) and p.obj is large for p in enc_large.parts)
    assert DEFAULT_CODEC.decode(enc_small.to_bytes()) == small
    out = DEFAULT_CODEC.decode(enc_large.to_bytes())
    assert type(out) is bytes and out == large


def test_bytearray_and_memoryview_decode_as_readonly_views() -> None:
    source = np.arange(24, dtype=np.int32).reshape(4, 6)
    obj = {
        "ba": bytearray(b"hello"),
        "empty": bytearray(),
        "mv": memoryview(b"world"),
        "mv2d": source.data,
        "strided": source.data[::2],
        "floats": np.arange(3.0).data,
    }
    body = np.frombuffer(DEFAULT_CODEC.encode(obj).to_bytes(), dtype=np.uint8)
    out = DEFAULT_CODEC.decode(body)
    assert isinstance(out, dict)
    assert out["ba"] == b"hello"
    assert out["empty"] == b""
    assert out["mv"] == b"world"
    assert out["mv2d"] == source.tobytes()
    assert out["strided"] == source[::2].tobytes()
    assert out["floats"] == np.arange(3.0).tobytes()
    for key, view in out.items():
        assert type(view) is memoryview, key
        assert view.readonly and view.format == "B" and view.ndim == 1
        if view.nbytes:
            assert np.shares_memory(np.frombuffer(view, dtype=np.uint8), body)
    with pytest.raises(TypeError):
        out["ba"][0] = 1


def test_subclasses_encode_as_base_type() -> None:
    obj = [
        collections.OrderedDict([("b", 1), ("a", 2)]),
        collections.defaultdict(list, {"k": [1]}),
        Pair(1, "x"),
        Color.RED,
        MyStr("s"),
        MyFloat(2.5),
        MyBytes(b"b"),
        MyBytes(b"B" * 3000),
        MyList([1, 2]),
        np.arange(3).view(SubArray),
    ]
    out = roundtrip(obj)
    assert_same(obj, out)
    assert [type(x) for x in out] == [
        dict,
        dict,
        tuple,
        int,
        str,
        float,
        bytes,
        bytes,
        list,
        np.ndarray,
    ]
    assert out[0] == {"b": 1, "a": 2} and list(out[0]) == ["b", "a"]
    assert out[3] == 1 and out[4] == "s"


# --------------------------------------------------------------------------- arrays


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(8, dtype=np.float64),
        np.array(3.5),
        np.array(b"xy"),
        np.zeros((0,), dtype=np.float32),
        np.zeros((3, 0, 2), dtype=np.int16),
        np.arange(12, dtype=">i4").reshape(3, 4),
        np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        np.arange(20)[::3],
        np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1),
        np.array(["2020-01-01", "NaT"], dtype="M8[D]"),
        np.array([1, 2], dtype="m8[10us]"),
        np.array(["a", "bcd"], dtype="U3"),
        np.array([b"a", b"bcd"], dtype="S3"),
        np.zeros(2, dtype=np.dtype([("a", "u1"), ("b", "<f8")], align=True)),
        np.zeros(2, dtype=[(("Title", "t"), "<i4"), ("sub", [("x", ">f4"), ("y", "S2")], (2,))]),
        np.zeros(3, dtype=np.dtype("f8", metadata={"unit": "m"})),
        np.broadcast_to(np.arange(3.0), (4, 3)),
        np.zeros(4, dtype=np.complex64),
        np.ones((2, 2), dtype=bool),
        np.zeros(3, dtype=[]),
        np.zeros((2, 3), dtype="V0"),
    ],
    ids=lambda a: f"{a.dtype}-{a.shape}",
)
def test_array_cases(arr: np.ndarray[Any, Any]) -> None:
    out = roundtrip(arr)
    assert_same(arr, out)


@settings(max_examples=60, deadline=None)
@given(arrays())
def test_decoded_arrays_are_readonly_zero_copy_views(arr: np.ndarray[Any, Any]) -> None:
    enc = DEFAULT_CODEC.encode({"k": arr, "pad": "x" * 7})
    body = np.frombuffer(enc.to_bytes(), dtype=np.uint8)
    out = DEFAULT_CODEC.decode(body)["k"]  # type: ignore[index]
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out.flags.writeable = True
    if arr.nbytes:
        assert np.shares_memory(out, body)
        assert (out.ctypes.data - body.ctypes.data) % BUFFER_ALIGNMENT == 0
        # The base chain reaches the body.
        base: Any = out
        for _ in range(10):
            if base is body or base is None:
                break
            base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
        assert base is body


def test_encode_references_contiguous_arrays_without_copy() -> None:
    arr = np.arange(1000, dtype=np.float64)
    enc = DEFAULT_CODEC.encode(arr)
    views = [p for p in enc.parts if isinstance(p, memoryview)]
    assert len(views) == 1
    assert np.shares_memory(np.frombuffer(views[0], dtype=np.uint8), arr)
    enc = DEFAULT_CODEC.encode({"a": arr})
    views = [p for p in enc.parts if isinstance(p, memoryview)]
    assert np.shares_memory(np.frombuffer(views[0], dtype=np.uint8), arr)


def test_decoded_array_outlives_caller_references() -> None:
    body = DEFAULT_CODEC.encode(np.arange(100.0)).to_bytes()
    out = DEFAULT_CODEC.decode(bytearray(body))
    del body
    gc.collect()
    assert np.array_equal(out, np.arange(100.0))  # type: ignore[arg-type]


def test_body_layout() -> None:
    arr = np.arange(3, dtype="<u2")
    body = DEFAULT_CODEC.encode(arr).to_bytes()
    version, flags, nbuf, meta_len = HEADER.unpack_from(body)
    assert (version, flags, nbuf) == (FORMAT_VERSION, 0, 1)
    (length,) = struct.unpack_from("<Q", body, HEADER.size)
    assert length == 6
    meta_end = HEADER.size + 8 + meta_len
    meta = msgpack.unpackb(body[HEADER.size + 8 : meta_end])
    assert isinstance(meta, msgpack.ExtType) and meta.code == EXT_NDARRAY
    index, ndim, dim = struct.unpack_from("<IBQ", meta.data)
    assert (index, ndim, dim) == (0, 1, 3)
    assert msgpack.unpackb(meta.data[13:]) == "<u2"
    start = meta_end + (-meta_end % BUFFER_ALIGNMENT)
    assert body[meta_end:start] == b"\0" * (start - meta_end)
    assert body[start:] == arr.tobytes()
    # A body built by hand from the documented layout decodes the same way.
    again = make_body(msgpack.packb(meta), [arr.tobytes()])
    assert again == body


def test_hand_built_bodies_of_each_ext_kind() -> None:
    descr = packed_descr("<f4")
    data = np.arange(4, dtype="<f4").tobytes()
    meta = msgpack.packb(
        [
            ext(EXT_TUPLE, msgpack.packb([1, "a"])),
            ext(EXT_NDARRAY, array_payload(0, (2, 2), descr)),
            ext(EXT_NPSCALAR, struct.pack("<I", len(descr)) + descr + data[:4]),
            ext(EXT_BYTES, struct.pack("<I", 1)),
            ext(EXT_BUFFER, struct.pack("<I", 1)),
            ext(EXT_DATACLASS, msgpack.packb(["tests.codec.Point", {"x": 1.0, "y": 2.0}])),
        ]
    )
    out = DEFAULT_CODEC.decode(make_body(meta, [data, b"raw"]))
    assert isinstance(out, list)
    assert out[0] == (1, "a")
    assert out[1].shape == (2, 2) and out[1].dtype == np.float32
    assert out[2] == np.float32(0.0) and type(out[2]) is np.float32
    assert out[3] == b"raw" and type(out[3]) is bytes
    assert out[4] == b"raw" and type(out[4]) is memoryview
    assert out[5] == Point(1.0, 2.0)


# --------------------------------------------------------------------------- dataclasses


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
            f"{__name__}.Frozen.point: {__name__}.Point.x: cannot encode an object of type "
            "array.array; it holds a buffer: send numpy.asarray(x) (an array of its items) "
            "or memoryview(x) (its bytes) instead"
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


def test_string_dtype_refused() -> None:
    string_dtype = getattr(np.dtypes, "StringDType", None) if hasattr(np, "dtypes") else None
    if string_dtype is None:
        pytest.skip("numpy without StringDType")
    arr = np.array(["a", "bc"], dtype=string_dtype())
    for operation in (DEFAULT_CODEC.encode, DEFAULT_CODEC.validate):
        with pytest.raises(UnregisteredTypeError):
            operation(arr)


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


def test_validate_is_cheap_for_large_top_level_values() -> None:
    # Nothing is copied or encoded: a 1 TB broadcast array validates instantly.
    huge = np.broadcast_to(np.zeros(1), (2**37,))
    DEFAULT_CODEC.validate(huge)
    DEFAULT_CODEC.validate(b"x" * 10_000_000)


# --------------------------------------------------------------------------- limits


def test_default_limit() -> None:
    assert Codec().max_message_size == DEFAULT_MAX_MESSAGE_SIZE
    assert DEFAULT_CODEC.max_message_size == DEFAULT_MAX_MESSAGE_SIZE
    assert Codec(max_message_size=1000).max_message_size == 1000
    for bad in (0, -1, True, 1.5, "10"):
        with pytest.raises(ConfigurationError):
            Codec(max_message_size=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "obj",
    [
        np.arange(100.0),
        np.arange(100.0)[::2],
        {"t": 1.0, "data": np.arange(64.0), "name": "n"},
        [b"x" * 2000, bytearray(100), np.zeros(3)],
        "a string",
        [1, 2, 3],
        np.zeros(0),
    ],
    ids=["array", "strided", "dict", "multi", "str", "list", "empty-array"],
)
def test_message_size_limit(obj: object) -> None:
    size = DEFAULT_CODEC.encode(obj).nbytes
    at_limit = Codec(max_message_size=size)
    body = check_parts(at_limit.encode(obj))
    assert len(body) == size
    at_limit.decode(body)
    below = Codec(max_message_size=size - 1)
    with pytest.raises(MessageTooLargeError) as info:
        below.encode(obj)
    text = str(info.value)
    assert str(size - 1) in text
    assert "max_message_size" in text and "EZFLOW_MAX_MESSAGE_SIZE" in text
    assert isinstance(info.value, ValueError)
    with pytest.raises(ProtocolError, match="max_message_size"):
        below.decode(body)


def test_size_checked_before_copying() -> None:
    # 1 TiB of strided data: copying it would fail with MemoryError.
    huge = np.broadcast_to(np.zeros(1), (2**37,))
    for obj in (huge, {"a": huge}, [huge.data[::2]]):
        with pytest.raises(MessageTooLargeError):
            DEFAULT_CODEC.encode(obj)


# --------------------------------------------------------------------------- malformed input

VALID_OBJECTS: list[object] = [
    None,
    "hello",
    [1, 2.5, None, True],
    {"a": (1, 2), (3, 4): b"x"},
    np.arange(5.0),
    np.zeros((2, 0)),
    np.array(7, dtype=">i2"),
    {"t": 1.0, "data": np.arange(4, dtype=np.float32), "name": "n", "raw": bytearray(b"ab")},
    [np.int16(3), np.datetime64("2020-01-01"), b"y" * 1100],
    Frozen("f", Point(1.0, 2.0), ("t",)),
    np.zeros(2, dtype=[("a", "<i4"), ("b", "S3", (2,))]),
]
VALID_BODIES = [DEFAULT_CODEC.encode(o).to_bytes() for o in VALID_OBJECTS]


@pytest.mark.parametrize("body", VALID_BODIES, ids=range(len(VALID_BODIES)))
def test_every_truncation_and_extension_is_protocol_error(body: bytes) -> None:
    DEFAULT_CODEC.decode(body)
    for cut in range(len(body)):
        with pytest.raises(ProtocolError):
            DEFAULT_CODEC.decode(body[:cut])
    for extra in (b"\0", b"x" * 17):
        with pytest.raises(ProtocolError):
            DEFAULT_CODEC.decode(body + extra)


@pytest.mark.parametrize("body", VALID_BODIES, ids=range(len(VALID_BODIES)))
def test_single_byte_mutations(body: bytes) -> None:
    # Bodies with a 1100-byte buffer: mutate the interesting head only.
    for pos in range(min(len(body), 200)):
        for value in {body[pos] ^ 0x01, body[pos] ^ 0x80, 0x00, 0xFF, 0x7F}:
            mutated = bytearray(body)
            mutated[pos] = value
            decode_or_protocol_error(bytes(mutated))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    decode_or_protocol_error(data)


@settings(max_examples=500, deadline=None)
@given(
    st.integers(0, 3),
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(0, 2**64 - 1), max_size=3),
    st.binary(max_size=100),
)
def test_random_bodies_behind_a_plausible_header(
    nbuf: int, meta_len: int, lengths: list[int], rest: bytes
) -> None:
    head = HEADER.pack(FORMAT_VERSION, 0, nbuf, meta_len) + struct.pack(
        f"<{len(lengths)}Q", *lengths
    )
    decode_or_protocol_error(head + rest)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VALID_BODIES), st.data())
def test_random_edits_of_valid_bodies(body: bytes, data: st.DataObject) -> None:
    mutated = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(body) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    decode_or_protocol_error(bytes(mutated))


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


def test_huge_claims_allocate_nothing() -> None:
    claims = [
        HEADER.pack(FORMAT_VERSION, 0, 0xFFFF, 0),
        HEADER.pack(FORMAT_VERSION, 0, 0, 0xFFFFFFFF) + b"\x90",
        HEADER.pack(FORMAT_VERSION, 0, 1, 1) + struct.pack("<Q", 2**64 - 1) + b"\xc0",
        HEADER.pack(FORMAT_VERSION, 0, 2, 1) + struct.pack("<2Q", 2**63, 2**63) + b"\xc0",
        # msgpack array/str/bin/map headers claiming 2**32-1 items.
        make_body(b"\xdd\xff\xff\xff\xff"),
        make_body(b"\xdb\xff\xff\xff\xff"),
        make_body(b"\xc6\xff\xff\xff\xff"),
        make_body(b"\xdf\xff\xff\xff\xff"),
        make_body(b"\xc9\xff\xff\xff\xff\x02"),
        # An array claiming 2**40 float64 items from an 8-byte buffer.
        make_body(
            msgpack.packb(ext(EXT_NDARRAY, array_payload(0, (2**40,), packed_descr("<f8")))),
            [b"\0" * 8],
        ),
        # Zero-size dtype claiming an enormous shape.
        make_body(
            msgpack.packb(ext(EXT_NDARRAY, array_payload(0, (2**64 - 1, 0), packed_descr("<f8")))),
            [b""],
        ),
        make_body(
            msgpack.packb(ext(EXT_NDARRAY, array_payload(0, (2**63, 2**63), packed_descr("|V0")))),
            [b""],
        ),
        make_body(
            msgpack.packb(ext(EXT_NDARRAY, array_payload(0, (2**62,), packed_descr("|V0")))), [b""]
        ),
    ]
    tracemalloc.start()
    try:
        for body in claims:
            with pytest.raises(ProtocolError):
                DEFAULT_CODEC.decode(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def bad_ext(code: int, payload: bytes, bufs: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
    return make_body(msgpack.packb([ext(code, payload)]), bufs)


F8 = packed_descr("<f8")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(make_body(b"\xc0")[:-1], id="no-meta"),
        pytest.param(bytes([2]) + make_body(b"\xc0")[1:], id="version"),
        pytest.param(bytes([1, 1]) + make_body(b"\xc0")[2:], id="flags"),
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
        pytest.param(bad_ext(EXT_NDARRAY, b"\0\0"), id="array-short"),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(0, (2,), F8), [b"\0" * 8]), id="array-size-mismatch"
        ),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(1, (1,), F8), [b"\0" * 8]), id="array-index"
        ),
        pytest.param(bad_ext(EXT_NDARRAY, struct.pack("<IB", 0, 200), [b""]), id="array-ndim"),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(0, (1,) * 65, F8), [b"\0" * 8]), id="array-ndim-65"
        ),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(0, (1,), packed_descr("|O")), [b"\0" * 8]),
            id="object-dtype",
        ),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(0, (1,), msgpack.packb([["a", "|O"]])), [b"\0" * 8]),
            id="object-field-list",
        ),
        pytest.param(
            bad_ext(
                EXT_NDARRAY,
                array_payload(0, (1,), msgpack.packb([ext(EXT_TUPLE, msgpack.packb(["a", "|O"]))])),
                [b"\0" * 8],
            ),
            id="object-field",
        ),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(0, (1,), packed_descr("T")), [b"\0" * 16]),
            id="stringdtype",
        ),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(0, (1,), packed_descr("f8,i4")), [b"\0" * 12]),
            id="comma-descr",
        ),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(0, (1,), packed_descr(7)), [b"\0" * 8]),
            id="descr-int",
        ),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(0, (1,), b"\xc1"), [b"\0" * 8]), id="descr-garbage"
        ),
        pytest.param(
            bad_ext(EXT_NDARRAY, array_payload(0, (1,), packed_descr("<f8") + b"x"), [b"\0" * 8]),
            id="descr-extra",
        ),
        pytest.param(bad_ext(EXT_NPSCALAR, b"\0"), id="scalar-short"),
        pytest.param(bad_ext(EXT_NPSCALAR, struct.pack("<I", 100) + F8), id="scalar-descr-overrun"),
        pytest.param(
            bad_ext(EXT_NPSCALAR, struct.pack("<I", len(F8)) + F8 + b"\0" * 7), id="scalar-size"
        ),
        pytest.param(
            bad_ext(EXT_NPSCALAR, struct.pack("<I", 3) + packed_descr("|O") + b"\0" * 8),
            id="scalar-object",
        ),
    ],
)
def test_specific_malformed_bodies(body: bytes) -> None:
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


def test_non_bytes_bodies_are_protocol_errors() -> None:
    for body in ("text", 12, None, [1, 2], np.zeros(4, dtype=np.uint8)[::2]):
        with pytest.raises(ProtocolError):
            DEFAULT_CODEC.decode(body)  # type: ignore[arg-type]


def test_other_buffer_formats_are_accepted() -> None:
    body = DEFAULT_CODEC.encode(np.arange(4, dtype=np.int32)).to_bytes()
    assert len(body) % 4 == 0
    for view in (
        np.frombuffer(body, dtype=np.uint32),
        np.frombuffer(body, dtype=np.uint8).reshape(4, -1),
        memoryview(body).cast("i"),
    ):
        out = DEFAULT_CODEC.decode(view)
        assert np.array_equal(out, np.arange(4))  # type: ignore[arg-type]
        assert np.shares_memory(out, view)


# --------------------------------------------------------------------------- array caches


def _uncached_body(arr: np.ndarray[Any, Any]) -> bytes:
    """What the general encoder (msgpack meta, no top-level array shortcut) produces."""
    return DEFAULT_CODEC.encode([arr]).to_bytes()


def test_array_caches_give_the_uncached_results() -> None:
    arrays = [
        np.arange(6, dtype="<u2").reshape(2, 3),
        np.arange(6, dtype=">u2").reshape(2, 3),  # equal shape, other byte order
        np.arange(6, dtype="<u2").reshape(3, 2),  # equal dtype and size, other shape
        np.arange(6, dtype="<i2").reshape(2, 3),
        np.array(5, dtype=np.float64),
        np.zeros((2, 0), dtype=np.float32),  # empty: never cached
        np.array(["ab", "c"], dtype="U2"),
        np.zeros(3, dtype=[("a", "<i4"), ("b", "S3", (2,))]),
        np.array(["2020-01-01"], dtype="datetime64[D]"),  # no PEP 3118 buffer
    ]
    codec = Codec()
    for _ in range(3):  # first round fills the caches, later rounds hit them
        for arr in arrays:
            flipped = arr[::-1] if arr.ndim else arr
            for variant in (arr, np.asfortranarray(arr), arr.T, flipped):
                body = check_parts(codec.encode(variant))
                out = codec.decode(body)
                assert_same(variant, out)
                assert not out.flags.writeable  # type: ignore[attr-defined]
                top = codec.encode(variant.copy(order="C"))
                assert top.to_bytes() == body
                # The top-level and general encoders agree on everything but the meta's
                # nesting: decoding the general body gives a one-item list.
                assert_same([variant], codec.decode(_uncached_body(variant)))


def test_cached_decode_still_checks_the_body_length() -> None:
    body = DEFAULT_CODEC.encode(np.arange(8, dtype=np.int32)).to_bytes()
    DEFAULT_CODEC.decode(body)  # now cached
    for bad in (body[:-1], body + b"\0", body[:-4], body + b"\0" * 16):
        with pytest.raises(ProtocolError):
            DEFAULT_CODEC.decode(bad)
    assert np.array_equal(DEFAULT_CODEC.decode(body), np.arange(8))  # type: ignore[arg-type]


def test_cached_encode_respects_each_codecs_limit() -> None:
    arr = np.zeros(1000, dtype=np.uint8)
    assert DEFAULT_CODEC.encode(arr).nbytes > 1000  # cached now
    with pytest.raises(MessageTooLargeError):
        Codec(max_message_size=1000).encode(arr)
    with pytest.raises(ProtocolError):
        Codec(max_message_size=1000).decode(DEFAULT_CODEC.encode(arr).to_bytes())


def test_small_arrays_are_copied_into_one_part_large_ones_referenced() -> None:
    codec = Codec()
    small = np.arange(16, dtype=np.int64)  # a 176-byte body
    large = np.arange(1024, dtype=np.int64)  # 8 KiB of data: above SMALL_BODY
    for arr in (small, large):
        codec.encode(arr)  # fills the cache
    encoded = codec.encode(small)
    assert len(encoded.parts) == 1 and type(encoded.parts[0]) is bytes
    small[0] = 99  # the message was taken at encode time
    assert codec.decode(encoded.to_bytes())[0] == 0  # type: ignore[index]
    encoded = codec.encode(large)
    assert len(encoded.parts) == 2
    assert np.shares_memory(np.frombuffer(encoded.parts[1], np.uint8), large)
    assert encoded.nbytes > _codec.SMALL_BODY


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(16, dtype=np.int64),
        np.full((2, 3), 1.5, dtype=">f4"),
        np.arange(24, dtype=np.uint16).reshape(4, 6).T,  # not contiguous
        np.array(7, dtype=np.int32),  # 0-d
    ],
    ids=["1-D", "2-D big-endian", "transposed", "0-d"],
)
def test_small_array_body_is_what_encode_gives_for_the_kind_encoded_last(
    arr: np.ndarray,
) -> None:
    codec = Codec()
    assert codec.small_array_body(arr) is None  # this codec has encoded nothing yet
    codec.encode(arr)
    codec.encode(arr)  # (the first may have filled the shared cache only)
    body = codec.small_array_body(arr)
    assert type(body) is bytes
    assert body == codec.encode(arr).to_bytes()
    decoded = codec.decode(body)
    assert isinstance(decoded, np.ndarray)
    assert decoded.dtype == arr.dtype and decoded.shape == arr.shape
    assert np.array_equal(decoded, arr)


def test_small_array_body_declines_other_kinds_and_large_bodies() -> None:
    codec = Codec()
    arr = np.arange(16, dtype=np.int64)
    codec.encode(arr)
    codec.encode(arr)
    assert codec.small_array_body(arr) is not None
    assert codec.small_array_body(arr.astype(np.int32)) is None
    assert codec.small_array_body(np.arange(17, dtype=np.int64)) is None
    assert codec.small_array_body(arr.reshape(4, 4)) is None
    large = np.arange(1024, dtype=np.int64)  # 8 KiB of data: above SMALL_BODY
    codec.encode(large)
    codec.encode(large)
    assert codec.small_array_body(large) is None


def test_array_caches_are_bounded() -> None:
    codec = Codec()
    for n in range(3 * _codec._ARRAY_CACHE_SIZE):
        arr = np.full(n + 1, n % 251, dtype=np.uint8)
        out = codec.decode(codec.encode(arr).to_bytes())
        assert np.array_equal(out, arr)  # type: ignore[arg-type]
        assert len(_codec._ENC_ARRAYS) <= _codec._ARRAY_CACHE_SIZE
        assert len(_codec._DEC_ARRAYS) <= _codec._ARRAY_CACHE_SIZE
    # Still correct for shapes evicted long ago.
    arr = np.arange(1, dtype=np.uint8)
    assert np.array_equal(codec.decode(codec.encode(arr).to_bytes()), arr)  # type: ignore[arg-type]


# -- laying out an array's body ahead of time (loans) -----------------------------------------


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((0,), "u1"), ((5,), "<f8"), ((2, 3, 4), ">i4"), ((), "f4"), ((7, 1), "c16")],
)
def test_array_prefix_is_exactly_what_encode_puts_before_the_data(
    shape: tuple[int, ...], dtype: str
) -> None:
    codec = Codec()
    arr = np.arange(math.prod(shape)).astype(dtype).reshape(shape)
    prefix, total = codec.array_prefix(shape, np.dtype(dtype))
    assert prefix + arr.tobytes() == codec.encode(arr).to_bytes()
    assert total == len(prefix) + arr.nbytes
    assert len(prefix) % BUFFER_ALIGNMENT == 0  # the data starts aligned
    decoded = codec.decode(prefix + arr.tobytes())
    assert decoded.shape == shape and np.array_equal(decoded, arr)


def test_array_prefix_refuses_what_encode_refuses() -> None:
    codec = Codec(max_message_size=1024)
    with pytest.raises(UnregisteredTypeError, match="object"):
        codec.array_prefix((3,), np.dtype(object))
    with pytest.raises(ValueError, match="shape"):
        codec.array_prefix((-1,), np.dtype("u1"))
    with pytest.raises(ValueError, match="shape"):
        codec.array_prefix((1,) * 65, np.dtype("u1"))
    with pytest.raises(MessageTooLargeError):
        codec.array_prefix((2000,), np.dtype("u1"))
    with pytest.raises(MessageTooLargeError):
        codec.array_prefix((1000,), np.dtype("u1"))  # the data fits, the body does not


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
