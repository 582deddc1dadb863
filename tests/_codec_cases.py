"""What the codec tests share (tests/test_codec*.py): round-trip helpers, hand-built
bodies, strategies of encodable values and arrays, and registered message classes."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import struct
from typing import Any, NamedTuple

import msgpack
import numpy as np
from _messages import dtypes
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ezflow._core._codec import (
    DEFAULT_CODEC,
    HEADER,
    INLINE_BYTES_LIMIT,
    Codec,
    EncodedMessage,
    message,
    register_message,
)
from ezflow._core._codec._format import BUFFER_ALIGNMENT, FORMAT_VERSION
from ezflow._core._exceptions import ProtocolError

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
