"""numpy data on the wire (ezflow._core._codec._dtypes): every dtype and array layout
round-trips, scalars keep their type, dtypes that cannot travel are refused, and bad
array, scalar and dtype payloads are protocol errors."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from _codec_cases import (
    all_dtypes,
    array_payload,
    assert_same,
    ext,
    make_body,
    packed_descr,
    roundtrip,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ezflow._core._codec import DEFAULT_CODEC
from ezflow._core._codec._format import EXT_NDARRAY, EXT_NPSCALAR, EXT_TUPLE
from ezflow._core._exceptions import ProtocolError, UnregisteredTypeError


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


def test_string_dtype_refused() -> None:
    string_dtype = getattr(np.dtypes, "StringDType", None) if hasattr(np, "dtypes") else None
    if string_dtype is None:
        pytest.skip("numpy without StringDType")
    arr = np.array(["a", "bc"], dtype=string_dtype())
    for operation in (DEFAULT_CODEC.encode, DEFAULT_CODEC.validate):
        with pytest.raises(UnregisteredTypeError):
            operation(arr)


F8 = packed_descr("<f8")


def bad_ext(code: int, payload: bytes, bufs: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
    return make_body(msgpack.packb([ext(code, payload)]), bufs)


@pytest.mark.parametrize(
    "body",
    [
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
def test_malformed_dtypes_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        DEFAULT_CODEC.decode(body)
