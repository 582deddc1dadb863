"""Tests of ezflow._core._codec's Codec: round trips, type preservation, zero copy,
limits, the top-level array caches and the per-stream hints. The body layout, the registry,
dtypes and the general encoder/decoder have their own files (test_codec_*.py); every fast
path is pinned to the general path in test_codec_fastpaths.py."""

from __future__ import annotations

import collections
import gc
import math
from typing import Any

import numpy as np
import pytest
from _codec_cases import (
    Color,
    MyBytes,
    MyFloat,
    MyList,
    MyStr,
    Pair,
    SubArray,
    arrays,
    assert_same,
    check_parts,
    roundtrip,
    values,
)
from hypothesis import HealthCheck, given, settings

from ezflow._core import _codec
from ezflow._core._codec import DEFAULT_CODEC, HEADER, INLINE_BYTES_LIMIT, SMALL_BODY, Codec
from ezflow._core._codec._format import BUFFER_ALIGNMENT
from ezflow._core._config import DEFAULT_MAX_MESSAGE_SIZE
from ezflow._core._exceptions import (
    ConfigurationError,
    MessageTooLargeError,
    ProtocolError,
    UnregisteredTypeError,
)

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
    assert encoded.nbytes > SMALL_BODY


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
    assert codec._small_array_body(arr) is None  # this codec has encoded nothing yet
    codec.encode(arr)
    codec.encode(arr)  # (the first may have filled the shared cache only)
    body = codec._small_array_body(arr)
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
    assert codec._small_array_body(arr) is not None
    assert codec._small_array_body(arr.astype(np.int32)) is None
    assert codec._small_array_body(np.arange(17, dtype=np.int64)) is None
    assert codec._small_array_body(arr.reshape(4, 4)) is None
    large = np.arange(1024, dtype=np.int64)  # 8 KiB of data: above SMALL_BODY
    codec.encode(large)
    codec.encode(large)
    assert codec._small_array_body(large) is None


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
    prefix, total = codec._array_prefix(shape, np.dtype(dtype))
    assert prefix + arr.tobytes() == codec.encode(arr).to_bytes()
    assert total == len(prefix) + arr.nbytes
    assert len(prefix) % BUFFER_ALIGNMENT == 0  # the data starts aligned
    decoded = codec.decode(prefix + arr.tobytes())
    assert decoded.shape == shape and np.array_equal(decoded, arr)


def test_array_prefix_refuses_what_encode_refuses() -> None:
    codec = Codec(max_message_size=1024)
    with pytest.raises(UnregisteredTypeError, match="object"):
        codec._array_prefix((3,), np.dtype(object))
    with pytest.raises(ValueError, match="shape"):
        codec._array_prefix((-1,), np.dtype("u1"))
    with pytest.raises(ValueError, match="shape"):
        codec._array_prefix((1,) * 65, np.dtype("u1"))
    with pytest.raises(MessageTooLargeError):
        codec._array_prefix((2000,), np.dtype("u1"))
    with pytest.raises(MessageTooLargeError):
        codec._array_prefix((1000,), np.dtype("u1"))  # the data fits, the body does not


# -- per-stream hints, and the old names of the fast-path internals -----------------------


def test_a_stream_copy_has_the_class_limit_and_caches_and_hints_of_its_own() -> None:
    class Subclass(Codec):
        __slots__ = ()

    codec = Subclass(max_message_size=4096)
    stream = codec._for_stream()
    assert type(stream) is Subclass and stream is not codec
    assert stream.max_message_size == 4096
    arr = np.arange(4.0)
    for _ in range(3):
        body = stream.encode(arr).to_bytes()
        assert np.array_equal(stream.decode(body), arr)  # type: ignore[arg-type]
    assert stream._last_array is not None and stream._small_array_body(arr) == body
    assert codec._last_array is None and codec._small_array_body(arr) is None
    assert np.array_equal(codec.decode(body), arr)  # type: ignore[arg-type]  # (shared cache)
    assert codec._last_array is not None


def test_the_old_names_of_the_fast_path_internals_warn_and_still_work() -> None:
    codec = Codec()
    arr = np.arange(4.0)
    message = (1, 2, arr)
    for _ in range(3):
        codec.decode(codec.encode(arr).to_bytes())
        codec.decode(codec.encode(message).to_bytes())
    with pytest.warns(DeprecationWarning, match=r"Codec\.small_array_body is internal"):
        assert codec.small_array_body(arr) == codec.encode(arr).to_bytes()
    with pytest.warns(DeprecationWarning, match=r"Codec\.encode_small is internal"):
        assert codec.encode_small(message) == codec.encode(message).to_bytes()
    with pytest.warns(DeprecationWarning, match=r"Codec\.array_prefix is internal"):
        assert codec.array_prefix(arr.shape, arr.dtype) == codec._array_prefix(arr.shape, arr.dtype)
    with pytest.warns(DeprecationWarning, match=r"Codec\.last_array is internal"):
        assert codec.last_array is codec._last_array is not None
    with pytest.warns(DeprecationWarning, match=r"Codec\.last_layout is internal"):
        assert codec.last_layout is codec._last_layout is not None
