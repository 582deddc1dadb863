"""numpy data on the wire: dtype descriptions both ways, an array's raw bytes, and the
``EXT_NDARRAY`` / ``EXT_NPSCALAR`` payloads read back as arrays and scalars.

A dtype travels as its ``descr`` (``dtype.str``, or ``dtype.descr`` for structured
dtypes), packed with msgpack; only dtypes whose items are plain bytes (no Python objects,
no pointers) travel, and a received descr is checked against the shapes
``numpy.lib.format.dtype_to_descr`` produces before numpy parses it. Both directions are
cached (``_ENC_DTYPES``, ``_DEC_DTYPES``), bounded by ``_DTYPE_CACHE_SIZE``.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final, cast

import msgpack
import numpy as np
from numpy.lib.format import descr_to_dtype

from .._exceptions import ProtocolError, UnregisteredTypeError
from ._format import (
    _ARRAY_PREFIX,
    _MAX_DIM,
    _MAX_EMPTY_ITEMS,
    _MAX_NDIM,
    _SHAPES,
    _U32,
    EXT_TUPLE,
    MAX_DEPTH,
    _ext,
)

_DTYPE_CACHE_SIZE: Final = 512
_PLAIN_KINDS: Final = frozenset("biufcmMSUV")
# A descr string exactly as numpy's ``dtype.str`` writes it (byte order, kind, size,
# datetime unit). Anything else is refused before numpy parses it: np.dtype() accepts
# many spellings (comma lists, "O", "T", deprecated codes) we never produce.
_DESCR_STR: Final = re.compile(r"[<>|=][biufcmMSUV]\d+(?:\[\d*[A-Za-z]+\])?\Z")

# dtype -> (packed descr, whether arrays of it export a PEP 3118 buffer). Bounded: a
# program creating endless distinct structured dtypes only loses the cache.
_ENC_DTYPES: dict[np.dtype[Any], tuple[bytes, bool]] = {}
# packed descr (as received) -> dtype. Bounded because the keys come from peers.
_DEC_DTYPES: dict[bytes, np.dtype[Any]] = {}


def _is_plain_dtype(dt: np.dtype[Any]) -> bool:
    """True if the dtype's items are plain bytes (no Python objects or pointers)."""
    # Non-legacy dtypes (numpy 2 StringDType, user DTypes) store pointers or need
    # Python code to copy; their raw bytes mean nothing in another process.
    if not getattr(type(dt), "_legacy", True) or dt.hasobject:
        return False
    if dt.names is not None:
        fields = dt.fields
        assert fields is not None
        return all(_is_plain_dtype(fields[n][0]) for n in dt.names)
    if dt.subdtype is not None:
        return _is_plain_dtype(dt.subdtype[0])
    return dt.kind in _PLAIN_KINDS


def _descr_tree(descr: object) -> object:
    if type(descr) is tuple:
        return _ext(EXT_TUPLE, msgpack.packb([_descr_tree(x) for x in descr]))
    if type(descr) is list:
        return [_descr_tree(x) for x in descr]
    if type(descr) in (str, int):
        return descr
    raise TypeError(f"unexpected {type(descr).__name__} in dtype descr")


def _check_descr(descr: object, depth: int = 0) -> None:
    """Raise ValueError unless *descr* has the shape ``dtype_to_descr`` produces."""
    if depth > MAX_DEPTH:
        raise ValueError("dtype descr nested too deeply")
    if type(descr) is str:
        if not _DESCR_STR.match(descr):
            raise ValueError(f"unsupported dtype descr {descr!r}")
        return
    if type(descr) is not list:
        raise ValueError(f"dtype descr must be a str or a list, not {type(descr).__name__}")
    for field in descr:
        if type(field) is not tuple or len(field) not in (2, 3):
            raise ValueError(f"malformed structured dtype field {field!r}")
        name = field[0]
        if type(name) is tuple:
            if len(name) != 2 or not all(type(x) is str for x in name):
                raise ValueError(f"malformed structured dtype field name {name!r}")
        elif type(name) is not str:
            raise ValueError(f"malformed structured dtype field name {name!r}")
        _check_descr(field[1], depth + 1)
        if len(field) == 3:
            shape = field[2]
            if type(shape) is not tuple or not all(
                type(d) is int and 0 <= d <= _MAX_DIM for d in shape
            ):
                raise ValueError(f"malformed subarray shape {shape!r}")


def _encode_dtype(dt: np.dtype[Any]) -> tuple[bytes, bool]:
    """Cache miss of ``_ENC_DTYPES``: the packed descr of *dt* and its buffer export flag.

    Raises :class:`UnregisteredTypeError` for dtypes that cannot travel as raw bytes.
    """
    if not _is_plain_dtype(dt):
        raise UnregisteredTypeError(
            f"cannot encode numpy data of dtype {dt}: it holds Python objects or "
            "pointers; convert it to a numeric or fixed-width string dtype "
            "(arr.astype(...)) or to a list (arr.tolist())"
        )
    # What numpy.lib.format.dtype_to_descr returns for legacy dtypes, minus its warning
    # about dropped dtype metadata (which would be an error under -W error).
    descr: object = dt.descr if dt.names is not None else dt.str
    try:
        _check_descr(descr)
        portable = descr_to_dtype(cast(Any, descr)) == dt
        packed = msgpack.packb(_descr_tree(descr))
    except Exception as exc:
        raise UnregisteredTypeError(
            f"cannot encode numpy data of dtype {dt!r}: it has no portable description"
        ) from exc
    if not portable:
        raise UnregisteredTypeError(
            f"cannot encode numpy data of dtype {dt!r}: it has no portable description"
        )
    try:
        np.zeros(1, dt).data.cast("B")
        exports = True
    except (TypeError, ValueError, NotImplementedError):
        exports = False
    info = (packed, exports)
    if len(_ENC_DTYPES) < _DTYPE_CACHE_SIZE:
        _ENC_DTYPES[dt] = info
    return info


def _descr_ext_hook(code: int, data: bytes) -> object:
    if code != EXT_TUPLE:
        raise ProtocolError(f"unexpected ext type {code} in a dtype descr")
    items = msgpack.unpackb(data, ext_hook=_descr_ext_hook)
    if type(items) is not list:
        raise ProtocolError("malformed tuple in a dtype descr")
    return tuple(items)


def _decode_dtype(packed: bytes) -> np.dtype[Any]:
    """Cache miss of ``_DEC_DTYPES``. Raises ProtocolError (or anything, wrapped later)."""
    descr = msgpack.unpackb(packed, ext_hook=_descr_ext_hook)
    try:
        _check_descr(descr)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from exc
    dt = descr_to_dtype(descr)
    if not isinstance(dt, np.dtype) or not _is_plain_dtype(dt):
        raise ProtocolError(f"refusing dtype {dt!r}: it holds Python objects or pointers")
    if len(_DEC_DTYPES) < _DTYPE_CACHE_SIZE:
        _DEC_DTYPES[packed] = dt
    return dt


def _dtype_from(packed: bytes) -> np.dtype[Any]:
    dt = _DEC_DTYPES.get(packed)
    return dt if dt is not None else _decode_dtype(packed)


_EMPTY_VIEW: Final = memoryview(b"")


def _array_bytes(arr: np.ndarray[Any, Any], exports: bool, nbytes: int) -> memoryview:
    """The raw C-ordered bytes of *arr* as a 1-D unsigned-byte memoryview."""
    if nbytes == 0:
        if arr.size > _MAX_EMPTY_ITEMS:
            raise ValueError(
                f"array of {arr.size} zero-size items: more than {_MAX_EMPTY_ITEMS} cannot be sent"
            )
        # memoryview.cast refuses shapes with zeros.
        return _EMPTY_VIEW
    if not arr.flags.c_contiguous:
        # copy(order="C") rather than np.ascontiguousarray, which turns 0-d into 1-d.
        arr = arr.copy(order="C")
    if exports:
        try:
            return arr.data.cast("B")
        except (TypeError, ValueError, NotImplementedError):
            pass
    # datetime64/timedelta64 (and some structured dtypes) have no PEP 3118 format.
    return arr.reshape(-1).view(np.uint8).data


def _scalar_from_payload(data: bytes) -> object:
    if len(data) < 4:
        raise ProtocolError("numpy scalar payload too short")
    (descr_len,) = _U32.unpack_from(data)
    raw_start = 4 + descr_len
    if raw_start > len(data):
        raise ProtocolError("numpy scalar descr runs past its payload")
    dt = _dtype_from(data[4:raw_start])
    if len(data) - raw_start != dt.itemsize:
        raise ProtocolError(
            f"numpy scalar of dtype {dt} needs {dt.itemsize} bytes, got {len(data) - raw_start}"
        )
    return np.ndarray((), dt, data, raw_start)[()]


def _array_from_payload(
    payload: bytes | memoryview,
    start: int,
    end: int,
    body: memoryview,
    spans: list[tuple[int, int]],
) -> np.ndarray[Any, Any]:
    if end - start < 5:
        raise ProtocolError("ndarray payload too short")
    index, ndim = _ARRAY_PREFIX.unpack_from(payload, start)
    shape_end = start + 5 + 8 * ndim
    if ndim > _MAX_NDIM or shape_end > end:
        raise ProtocolError(f"ndarray payload claims {ndim} dimensions, more than it holds")
    shape = _SHAPES[ndim].unpack_from(payload, start + 5)
    dt = _dtype_from(bytes(payload[shape_end:end]))
    if index >= len(spans):
        raise ProtocolError(f"reference to buffer {index}, but the body has {len(spans)}")
    buf_start, buf_end = spans[index]
    size = buf_end - buf_start
    if math.prod(shape) * dt.itemsize != size:
        raise ProtocolError(
            f"ndarray of shape {shape} and dtype {dt} needs "
            f"{math.prod(shape) * dt.itemsize} bytes, its buffer has {size}"
        )
    if size == 0 and (any(d > _MAX_DIM for d in shape) or math.prod(shape) > _MAX_EMPTY_ITEMS):
        raise ProtocolError(f"ndarray shape {shape} is out of range")
    # The body view is read-only, so the array is too, and numpy refuses to make it
    # writeable again.
    return np.ndarray(shape, dt, body, buf_start)
