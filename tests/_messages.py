"""Hypothesis strategies for the message shapes users publish, and the comparisons the
differential tests of the codec's fast paths use (tests/test_codec_fastpaths.py,
tests/test_channel.py, tests/test_outlet.py)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ezflow._core._codec import HEADER, INLINE_BYTES_LIMIT, SMALL_BODY, message
from ezflow._core._exceptions import ProtocolError

# --------------------------------------------------------------------------- leaves

# Every msgpack int encoding boundary, each side of it, and the first values out of range;
# also each side of 2**30 and 2**60, where an int gains a CPython digit (the compiled
# paths read ints of up to three digits themselves).
_INT_EDGES = sorted(
    {
        v + d
        for v in (0, 127, 128, 255, 256, 2**15, 2**16, 2**30, 2**31, 2**32, 2**60, 2**63, 2**64 - 1)
        for d in (-1, 0, 1)
    }
    | {
        -v + d
        for v in (1, 32, 33, 128, 129, 2**15, 2**15 + 1, 2**30, 2**31, 2**31 + 1, 2**60, 2**63)
        for d in (-1, 0, 1)
    }
)
ints = st.sampled_from(_INT_EDGES) | st.integers(-(2**63), 2**64 - 1)
# str and bytes lengths around msgpack's fixstr/str8/str16 and our inline-bytes limit.
_LENGTHS = st.sampled_from([0, 1, 31, 32, 255, 256, INLINE_BYTES_LIMIT - 1, INLINE_BYTES_LIMIT])
strs = st.text(max_size=40) | _LENGTHS.flatmap(
    lambda n: st.text(alphabet="aé€😀", min_size=n, max_size=n)
)
byte_strings = st.binary(max_size=40) | _LENGTHS.map(lambda n: bytes(n % 256 for n in range(n)))
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0])

scalar_dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?"),
    hnp.complex_number_dtypes(endianness="?"),
    hnp.datetime64_dtypes(endianness="?"),
    hnp.timedelta64_dtypes(endianness="?"),
    hnp.byte_string_dtypes(endianness="?", max_len=8),
    hnp.unicode_string_dtypes(endianness="?", max_len=8),
)
#: Every plain dtype kind the codec carries: scalars, structured, nested, subarrays.
dtypes = st.one_of(
    scalar_dtypes,
    hnp.array_dtypes(subtype_strategy=scalar_dtypes, max_size=4, allow_subarrays=True),
    hnp.nested_dtypes(subtype_strategy=scalar_dtypes, max_leaves=5),
)


@st.composite
def arrays(draw: st.DrawFn, max_side: int = 5) -> np.ndarray[Any, Any]:
    """Arrays of random plain dtypes (big-endian, structured...) and shapes (0-d,
    empty...), some not C-contiguous."""
    dtype = draw(dtypes)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=max_side))
    arr = draw(hnp.arrays(dtype=dtype, shape=shape))
    layout = draw(st.sampled_from(["c", "c", "fortran", "slice", "negative"]))
    if layout == "fortran":
        arr = np.asfortranarray(arr)
    elif layout == "slice" and arr.ndim:
        arr = arr[::2]
    elif layout == "negative" and arr.ndim:
        arr = arr[::-1]
    return arr


np_scalars = st.sampled_from(
    [
        np.bool_(True),
        np.int8(-5),
        np.uint16(7),
        np.int32(-(2**31)),
        np.uint64(2**64 - 1),
        np.float16(1.5),
        np.float32(-0.0),
        np.float64(np.nan),
        np.complex64(1 - 2j),
        np.int64(3),
        np.longlong(4),
        np.intc(5),
    ]
)

#: The leaf kinds a message shape may hold, by name.
LEAVES: dict[str, st.SearchStrategy[Any]] = {
    "none": st.none(),
    "bool": st.booleans(),
    "int": ints,
    "float": floats,
    "str": strs,
    "bytes": byte_strings,
    "array": arrays(),
    "npscalar": np_scalars,
}
# Some items a template does not cover: the general path must take the message.
OTHER: st.SearchStrategy[Any] = st.sampled_from(
    [[1, 2], {"a": 1}, (1,), bytearray(b"ab"), memoryview(b"cd"), 2**70, -(2**64)]
)


# --------------------------------------------------------------------------- shapes


@message(name="tests.messages.Empty")
@dataclasses.dataclass
class Empty:
    pass


@message(name="tests.messages.One")
@dataclasses.dataclass
class One:
    a: Any


@message(name="tests.messages.Sample")
@dataclasses.dataclass
class Sample:
    phase: Any
    seq: Any
    t_ns: Any
    payload: Any


@message(name="tests.messages.Wide")
@dataclasses.dataclass(frozen=True, slots=True)
class Wide:
    a: Any
    b: Any
    c: Any
    d: Any
    e: Any
    f: Any = None
    derived: int = dataclasses.field(init=False, default=0)


DATACLASSES: dict[int, type] = {0: Empty, 1: One, 4: Sample, 6: Wide}
_NAMES = st.text(max_size=8) | st.sampled_from(["phase", "seq", "t_ns", "payload", "é"])


@st.composite
def shapes(draw: st.DrawFn, *, other: bool = True) -> tuple[str, tuple[str, ...], Any]:
    """A message shape: (container, item kinds, names or None)."""
    container = draw(st.sampled_from(["tuple", "list", "dict", "dataclass"]))
    kinds = list(LEAVES) + (["other"] if other else [])
    if container == "dataclass":
        size = draw(st.sampled_from(sorted(DATACLASSES)))
    else:
        size = draw(st.integers(0, 6))
    items = tuple(draw(st.sampled_from(kinds)) for _ in range(size))
    names = None
    if container == "dict":
        names = tuple(draw(st.lists(_NAMES, min_size=size, max_size=size, unique=True)))
    return container, items, names


def build(shape: tuple[str, tuple[str, ...], Any], draw: Callable[[Any], Any]) -> Any:
    """A message of *shape* with values drawn by *draw* (``data.draw``)."""
    container, items, names = shape
    values = [draw(OTHER if kind == "other" else LEAVES[kind]) for kind in items]
    if container == "tuple":
        return tuple(values)
    if container == "list":
        return values
    if container == "dict":
        return dict(zip(names, values, strict=True))
    return DATACLASSES[len(values)](*values)


@st.composite
def messages(draw: st.DrawFn) -> Any:
    """One message of a random shape, or a bare array or leaf now and then."""
    which = draw(st.integers(0, 9))
    if which == 0:
        return draw(arrays())
    return build(draw(shapes()), draw)


# --------------------------------------------------------------------------- comparisons


def assert_same_decoded(expected: object, actual: object) -> None:
    """*actual* equals *expected* (a result of the general decoder): same types all the
    way down, same values (NaN equal to NaN), arrays of the same dtype, shape and bytes,
    read-only like the general decoder's."""
    assert type(actual) is type(expected), (type(expected), type(actual))
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        assert actual.tobytes() == expected.tobytes()
        assert actual.flags.writeable == expected.flags.writeable
        assert not actual.flags.writeable
    elif isinstance(expected, np.generic):
        assert isinstance(actual, np.generic)
        assert actual.dtype == expected.dtype and actual.tobytes() == expected.tobytes()
    elif isinstance(expected, float):
        assert isinstance(actual, float)
        assert actual == expected or (math.isnan(actual) and math.isnan(expected))
        assert math.copysign(1.0, actual) == math.copysign(1.0, expected)
    elif isinstance(expected, memoryview):
        assert isinstance(actual, memoryview)
        assert actual.readonly and actual.tobytes() == expected.tobytes()
    elif isinstance(expected, dict):
        assert isinstance(actual, dict)
        assert list(actual) == list(expected)
        for key in expected:
            assert_same_decoded(expected[key], actual[key])
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple))
        assert len(actual) == len(expected)
        for e, a in zip(expected, actual, strict=True):
            assert_same_decoded(e, a)
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            assert_same_decoded(getattr(expected, field.name), getattr(actual, field.name))
    else:
        assert actual == expected


def outcome(call: Callable[[], object]) -> tuple[str, object]:
    """("ok", result) or ("raised", exception type) of *call*."""
    try:
        return "ok", call()
    except Exception as exc:
        return "raised", type(exc)


def assert_same_outcome(expected: tuple[str, object], actual: tuple[str, object]) -> None:
    assert expected[0] == actual[0], (expected, actual)
    if expected[0] == "ok":
        assert_same_decoded(expected[1], actual[1])
    else:
        assert expected[1] is actual[1] is ProtocolError, (expected, actual)


def templated(obj: object) -> bool:
    """Whether the codec's shape templates must cover *obj* (the documented rule)."""
    leaves = (type(None), bool, int, float, str, bytes, np.ndarray)
    if type(obj) in (tuple, list):
        values = list(obj)  # type: ignore[call-overload]
    elif type(obj) is dict:
        if not all(type(k) is str for k in obj):
            return False
        values = list(obj.values())
    elif type(obj) in (Empty, One, Sample, Wide):
        values = [getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init]  # type: ignore[arg-type]
    else:
        return False
    for v in values:
        if type(v) is int and not -(2**63) <= v <= 2**64 - 1:
            return False
        if type(v) is bytes and len(v) >= INLINE_BYTES_LIMIT:
            return False
        if type(v) is np.ndarray and (v.dtype.hasobject or v.dtype.kind not in "biufcmMSUV"):
            return False
        if type(v) is str:
            try:
                v.encode()
            except UnicodeEncodeError:
                return False
        if type(v) not in leaves and not isinstance(v, np.generic):
            return False
    return len(values) <= 64


__all__ = [
    "SMALL_BODY",
    "Sample",
    "arrays",
    "assert_same_decoded",
    "assert_same_outcome",
    "build",
    "messages",
    "outcome",
    "shapes",
    "templated",
]


# -- mutated bodies (a codec body with a byte flipped, cut, extended or a length off) --


def head_size(body: bytes) -> int:
    _, _, nbuf, meta_len = HEADER.unpack_from(body)
    return HEADER.size + 8 * nbuf + meta_len


@st.composite
def mutations(draw: st.DrawFn, body: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "extend", "flip_head", "flip_any", "length"]))
    if kind == "truncate":
        return body[: draw(st.integers(0, len(body) - 1))]
    if kind == "extend":
        return body + bytes([draw(st.integers(0, 255))])
    if kind == "length":
        # meta_len or a buffer length off by a little
        _, _, nbuf, _ = HEADER.unpack_from(body)
        field = draw(st.integers(0, nbuf))
        at, size = (4, 4) if field == 0 else (HEADER.size + 8 * (field - 1), 8)
        value = int.from_bytes(body[at : at + size], "little") + draw(
            st.sampled_from([-16, -1, 1, 8])
        )
        value %= 1 << (8 * size)
        return body[:at] + value.to_bytes(size, "little") + body[at + size :]
    end = head_size(body) if kind == "flip_head" else len(body)
    at = draw(st.integers(0, max(0, min(end, len(body)) - 1)))
    flipped = body[at] ^ draw(st.integers(1, 255))
    return body[:at] + bytes([flipped]) + body[at + 1 :]
