"""The general encoder, validator and decoder: every message the codec supports, one
object at a time (the type mapping is in :mod:`ezflow._core._codec`'s docstring).

They are the reference. The fast paths (:mod:`._templates`, :mod:`._layouts` and the
top-level array caches of :class:`~ezflow._core._codec.Codec`) produce exactly their
bytes and objects or hand the message to them; :func:`_encode_general` and
:func:`_decode_general` run them alone, and tests/test_codec_fastpaths.py checks every
fast path against those two.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Final

import msgpack
import numpy as np

from .._exceptions import ProtocolError, UnregisteredTypeError
from ._dtypes import (
    _ENC_DTYPES,
    _array_bytes,
    _array_from_payload,
    _encode_dtype,
    _scalar_from_payload,
)
from ._format import (
    _ARRAY_HEADS,
    _INT_MAX,
    _INT_MIN,
    _U32,
    EXT_BUFFER,
    EXT_BYTES,
    EXT_DATACLASS,
    EXT_NDARRAY,
    EXT_NPSCALAR,
    EXT_TUPLE,
    HEADER,
    INLINE_BYTES_LIMIT,
    MAX_BUFFERS,
    MAX_DEPTH,
    EncodedMessage,
    _assemble,
    _body_view,
    _ext,
    _malformed,
    _spans,
    _too_deep,
    _too_large,
    _too_many_buffers,
)
from ._registry import (
    _TYPES_BY_CLASS,
    _entry_for_name,
    _known_module_entry,
    _MessageType,
    _qualname,
)

# Types msgpack packs exactly as they are (int is not: it needs a range check).
_LEAVES: Final = frozenset((str, float, bool, type(None)))
# msgpack decodes ext type -1 (timestamp) itself instead of calling ext_hook; these are
# the three encodings of it. Only a meta containing one of them is checked further.
_TIMESTAMP_MARKERS: Final = re.compile(rb"\xd6\xff|\xd7\xff|\xc7\x0c\xff")

_SUPPORTED = (
    "None, bool, int (64-bit), float, str, bytes, bytearray, memoryview, list, tuple, "
    "dict, numpy arrays and scalars (without object dtypes) and dataclasses registered "
    "with ezflow.register_message() or @ezflow.message"
)


def _unsupported(obj: object) -> UnregisteredTypeError:
    tp = type(obj)
    name = _qualname(tp)
    if dataclasses.is_dataclass(tp):
        return UnregisteredTypeError(
            f"cannot encode {name}: it is a dataclass that is not registered; decorate it "
            f"with @ezflow.message or call ezflow.register_message({tp.__qualname__}) in "
            "every process that sends or receives it"
        )
    try:
        memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        return UnregisteredTypeError(
            f"cannot encode an object of type {name}; supported: {_SUPPORTED}"
        )
    return UnregisteredTypeError(
        f"cannot encode an object of type {name}; it holds a buffer: send "
        "numpy.asarray(x) (an array of its items) or memoryview(x) (its bytes) instead"
    )


def _masked(obj: object) -> UnregisteredTypeError:
    return UnregisteredTypeError(
        f"cannot encode a {_qualname(type(obj))}: its mask would be lost; "
        "send .data and .mask (or .filled(...)) instead"
    )


def _int_out_of_range(value: int) -> UnregisteredTypeError:
    text = str(value) if value.bit_length() < 200 else f"{str(value)[:20]}..."
    return UnregisteredTypeError(
        f"int {text} is outside the 64-bit range msgpack can carry "
        "(-2**63 .. 2**64-1); send it as a str or a numpy object"
    )


# --------------------------------------------------------------------------- encode


class _Encoder:
    """State of one ``encode`` call: the out-of-band buffers collected so far."""

    __slots__ = ("bufs", "limit", "oob", "packer")

    def __init__(self, limit: int) -> None:
        self.bufs: list[memoryview] = []
        self.oob = 0
        self.limit = limit
        # One packer per call, not a shared one: a packer keeps its largest buffer
        # forever, and sharing would rely on pack() never releasing the GIL.
        # strict_types: prepare() has already turned everything into exact
        # msgpack-native types; anything else is a bug and must not be packed as a
        # base type. Nested packs (tuples, dataclasses) run one after another while
        # preparing, never inside another pack().
        self.packer = msgpack.Packer(strict_types=True, use_bin_type=True, buf_size=512)

    def prepare(self, obj: object, depth: int) -> object:
        """Return *obj* as a tree msgpack packs natively (ExtType for the rest)."""
        tp = type(obj)
        if tp is str or tp is float or tp is bool or obj is None:
            return obj
        if tp is int:
            if _INT_MIN <= obj <= _INT_MAX:  # type: ignore[operator]
                return obj
            raise _int_out_of_range(obj)  # type: ignore[arg-type]
        if depth >= MAX_DEPTH and (tp in (dict, list, tuple) or tp in _TYPES_BY_CLASS):
            raise _too_deep()
        # Containers test for leaves inline: a method call per str/float costs more
        # than the whole msgpack packing of it.
        if tp is dict:
            prep = self.prepare
            depth += 1
            return {
                k if type(k) is str else prep(k, depth): v if type(v) in _LEAVES else prep(v, depth)
                for k, v in obj.items()  # type: ignore[attr-defined]
            }
        if tp is list:
            prep = self.prepare
            depth += 1
            return [x if type(x) in _LEAVES else prep(x, depth) for x in obj]  # type: ignore[attr-defined]
        if tp is np.ndarray:
            return self.array(obj)  # type: ignore[arg-type]
        entry = _TYPES_BY_CLASS.get(tp)
        if entry is not None:
            return self.dataclass_ext(obj, entry, depth + 1)
        if tp is tuple:
            return self.tuple_ext(obj, depth + 1)  # type: ignore[arg-type]
        if tp is bytes:
            if len(obj) < INLINE_BYTES_LIMIT:  # type: ignore[arg-type]
                return obj
            return self.out_of_band(EXT_BYTES, memoryview(obj))  # type: ignore[arg-type]
        return self.prepare_other(obj, depth)

    def prepare_other(self, obj: object, depth: int) -> object:
        # Order matters: numpy scalars subclass float/str/bytes/complex, and every
        # numpy scalar must keep its dtype.
        if isinstance(obj, np.generic):
            return self.scalar(obj)
        if isinstance(obj, np.ndarray):
            if type(obj).__module__.startswith("numpy.ma"):
                raise _masked(obj)
            return self.array(obj.view(np.ndarray))
        if isinstance(obj, memoryview):
            return self.out_of_band(EXT_BUFFER, self.byte_view(obj))
        if isinstance(obj, bytearray):
            return self.out_of_band(EXT_BUFFER, memoryview(obj))
        if isinstance(obj, bytes):
            view = memoryview(obj)
            if len(view) < INLINE_BYTES_LIMIT:
                return view.tobytes()
            return self.out_of_band(EXT_BYTES, view)
        if isinstance(obj, int):
            value = int.__int__(obj)
            if _INT_MIN <= value <= _INT_MAX:
                return value
            raise _int_out_of_range(value)
        if isinstance(obj, float):
            return float.__float__(obj)
        if isinstance(obj, str):
            return str.__str__(obj)
        if isinstance(obj, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise _too_deep()
            if isinstance(obj, dict):
                prep = self.prepare
                return {prep(k, depth + 1): prep(v, depth + 1) for k, v in dict.items(obj)}
            if isinstance(obj, tuple):
                return self.tuple_ext(obj, depth + 1)
            return [self.prepare(x, depth + 1) for x in obj]
        if _known_module_entry(type(obj)) is not None:
            return self.prepare(obj, depth)  # registered just now
        raise _unsupported(obj)

    def tuple_ext(self, obj: tuple[Any, ...], depth: int) -> object:
        prep = self.prepare
        items = [prep(x, depth) for x in obj]
        return _ext(EXT_TUPLE, self.packer.pack(items))

    def dataclass_ext(self, obj: object, entry: _MessageType, depth: int) -> object:
        prep = self.prepare
        fields: dict[str, object] = {}
        name = ""
        try:
            for name in entry.fields:
                fields[name] = prep(getattr(obj, name), depth)
        except UnregisteredTypeError as exc:
            # Name the field (nested dataclasses add theirs: A.b: B.c: cannot ...).
            where = f"{_qualname(type(obj))}.{name}"
            raise UnregisteredTypeError(f"{where}: {exc}").with_traceback(
                exc.__traceback__
            ) from None
        return _ext(EXT_DATACLASS, entry.prefix + self.packer.pack(fields))

    def scalar(self, obj: np.generic[Any]) -> object:
        dt = obj.dtype
        raw = obj.tobytes()
        if len(raw) != dt.itemsize:
            # Empty np.bytes_/np.str_ have an unsized dtype (S0, U0) but one NUL item
            # of raw data; their 1-item dtype reads back as the same empty scalar.
            dt = np.asarray(obj).dtype
        info = _ENC_DTYPES.get(dt)
        if info is None:
            info = _encode_dtype(dt)
        descr = info[0]
        return _ext(EXT_NPSCALAR, _U32.pack(len(descr)) + descr + raw)

    def array(self, arr: np.ndarray[Any, Any]) -> object:
        dt = arr.dtype
        info = _ENC_DTYPES.get(dt)
        if info is None:
            info = _encode_dtype(dt)
        index = len(self.bufs)
        if index >= MAX_BUFFERS:
            raise _too_many_buffers()
        nbytes = arr.nbytes
        self.oob += nbytes
        if self.oob > self.limit:
            raise _too_large(self.oob, self.limit, at_least=True)
        self.bufs.append(_array_bytes(arr, info[1], nbytes))
        ndim = arr.ndim
        return _ext(EXT_NDARRAY, _ARRAY_HEADS[ndim].pack(index, ndim, *arr.shape) + info[0])

    def byte_view(self, view: memoryview) -> memoryview:
        """*view* as a contiguous 1-D unsigned-byte memoryview (copied if needed)."""
        if view.c_contiguous:
            return view if view.ndim == 1 and view.format == "B" else view.cast("B")
        if self.oob + view.nbytes > self.limit:
            raise _too_large(self.oob + view.nbytes, self.limit, at_least=True)
        return memoryview(view.tobytes())

    def out_of_band(self, code: int, view: memoryview) -> object:
        index = len(self.bufs)
        if index >= MAX_BUFFERS:
            raise _too_many_buffers()
        self.oob += view.nbytes
        if self.oob > self.limit:
            raise _too_large(self.oob, self.limit, at_least=True)
        self.bufs.append(view)
        return _ext(code, _U32.pack(index))


def _encode_general(obj: object, limit: int) -> EncodedMessage:
    """*obj* encoded by the general encoder alone (no cache, no template), in a body of
    at most *limit* bytes. Raises like :meth:`Codec.encode`."""
    encoder = _Encoder(limit)
    tree = encoder.prepare(obj, 0)
    try:
        meta = encoder.packer.pack(tree)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise _too_deep() from exc
        raise
    return _assemble(meta, encoder.bufs, limit)


# --------------------------------------------------------------------------- validate


# The exact types _check accepts as they are (no range, dtype or depth to check).
_PLAIN: Final = frozenset((str, float, bool, type(None), bytes))
# The exact top-level types _check decides in O(1): the plain ones, ints (their range)
# and arrays (their dtype). No encode template covers a message of one of them.
_SCALAR_KINDS: Final = _PLAIN | {int, np.ndarray}


def _check(obj: object, depth: int) -> None:
    """Raise what :meth:`Codec.encode` would raise for *obj*'s types, build nothing.

    Mirrors ``_Encoder.prepare`` / ``prepare_other`` check for check, in the same order.
    """
    tp = type(obj)
    if tp is np.ndarray:  # (first: a message that is one array is the common case)
        _check_dtype(obj.dtype)  # type: ignore[attr-defined]
        return
    if tp in _PLAIN:
        return
    if tp is int:
        if not _INT_MIN <= obj <= _INT_MAX:  # type: ignore[operator]
            raise _int_out_of_range(obj)  # type: ignore[arg-type]
        return
    # (An exact list, tuple or dict goes straight to its items: none of the checks
    # of _check_other applies to it.)
    if tp is not list and tp is not tuple and tp is not dict and _check_other(obj, tp, depth):
        return
    if depth >= MAX_DEPTH:
        raise _too_deep()
    depth += 1
    # (A plain leaf - str, float, bool, None, bytes - has nothing to check: no call.)
    if isinstance(obj, dict):
        for k, v in dict.items(obj):
            if type(k) not in _PLAIN:
                _check(k, depth)
            if type(v) not in _PLAIN:
                _check(v, depth)
    else:
        for x in obj:  # type: ignore[attr-defined]  # (a list or tuple, or a subclass)
            if type(x) not in _PLAIN:
                _check(x, depth)


def _check_other(obj: object, tp: type, depth: int) -> bool:
    """The rest of :func:`_check` for *obj* of type *tp* (not an array, a plain leaf, an
    int or an exact container): True once it is checked, False for a subclass of dict,
    list or tuple (whose items :func:`_check` checks)."""
    entry = _TYPES_BY_CLASS.get(tp)
    if entry is not None:
        if depth >= MAX_DEPTH:
            raise _too_deep()
        name = ""
        try:
            for name in entry.fields:
                value = getattr(obj, name)
                if type(value) not in _PLAIN:  # (a plain leaf: nothing to check)
                    _check(value, depth + 1)
        except UnregisteredTypeError as exc:  # named as _Encoder.dataclass_ext names it
            where = f"{_qualname(tp)}.{name}"
            raise UnregisteredTypeError(f"{where}: {exc}").with_traceback(
                exc.__traceback__
            ) from None
        return True
    if isinstance(obj, np.generic):
        _check_dtype(obj.dtype)
        return True
    if isinstance(obj, np.ndarray):
        if type(obj).__module__.startswith("numpy.ma"):
            raise _masked(obj)
        _check_dtype(obj.dtype)
        return True
    if isinstance(obj, (memoryview, bytearray, bytes, float, str)):
        return True
    if isinstance(obj, int):
        value = int.__int__(obj)
        if not _INT_MIN <= value <= _INT_MAX:
            raise _int_out_of_range(value)
        return True
    if not isinstance(obj, (dict, list, tuple)):
        if _known_module_entry(tp) is not None:
            _check(obj, depth)  # registered just now
            return True
        raise _unsupported(obj)
    return False  # (a subclass of dict, list or tuple: its items are checked)


def _check_dtype(dt: np.dtype[Any]) -> None:
    if dt not in _ENC_DTYPES:
        _encode_dtype(dt)


# --------------------------------------------------------------------------- decode


class _Decoder:
    """State of one ``decode`` call: the body and where its buffers are."""

    __slots__ = ("body", "depth", "spans")

    def __init__(self, body: memoryview, spans: list[tuple[int, int]]) -> None:
        self.body = body
        self.spans = spans
        self.depth = 0

    def unpack(self, data: bytes | memoryview) -> Any:
        return msgpack.unpackb(data, ext_hook=self.ext_hook, strict_map_key=False)

    def span(self, data: bytes) -> tuple[int, int]:
        if len(data) != 4:
            raise ProtocolError(f"buffer reference must be 4 bytes, got {len(data)}")
        index: int = _U32.unpack(data)[0]
        if index >= len(self.spans):
            raise ProtocolError(f"reference to buffer {index}, but the body has {len(self.spans)}")
        return self.spans[index]

    def ext_hook(self, code: int, data: bytes) -> object:
        if code == EXT_NDARRAY:
            return _array_from_payload(data, 0, len(data), self.body, self.spans)
        if code == EXT_BUFFER:
            start, end = self.span(data)
            return self.body[start:end]
        if code == EXT_BYTES:
            start, end = self.span(data)
            return self.body[start:end].tobytes()
        if code in (EXT_TUPLE, EXT_DATACLASS):
            if self.depth >= MAX_DEPTH:
                raise ProtocolError(f"message nests more than {MAX_DEPTH} levels deep")
            self.depth += 1
            try:
                items = self.unpack(data)
            finally:
                self.depth -= 1
            if type(items) is not list:
                raise ProtocolError("malformed tuple or dataclass payload")
            if code == EXT_TUPLE:
                return tuple(items)
            return _build_dataclass(items)
        if code == EXT_NPSCALAR:
            return _scalar_from_payload(data)
        raise ProtocolError(f"unknown msgpack ext type {code} in message")


def _build_dataclass(items: list[Any]) -> object:
    if len(items) != 2 or type(items[0]) is not str or type(items[1]) is not dict:
        raise ProtocolError("malformed dataclass payload: expected [name, {field: value}]")
    name, fields = items
    entry = _entry_for_name(name)
    if entry is None:
        raise ProtocolError(
            f"unknown message type {name!r}: register it with ezflow.register_message(...) "
            "in the receiving process"
        )
    for key in fields:
        if type(key) is not str:
            raise ProtocolError(f"malformed {name!r} payload: field name {key!r}")
    try:
        return entry.cls(**fields)
    except Exception as exc:
        raise ProtocolError(
            f"could not build message type {name!r} ({_qualname(entry.cls)}) from the "
            f"received fields: {type(exc).__name__}: {exc}"
        ) from exc


def _has_timestamp(obj: object) -> bool:
    if isinstance(obj, msgpack.Timestamp):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_has_timestamp(x) for x in obj)
    if isinstance(obj, dict):
        return any(_has_timestamp(k) or _has_timestamp(v) for k, v in obj.items())
    return False


def _scan_ext_hook(code: int, data: bytes) -> object:
    # Only nested payloads can hide a timestamp; the rest is never a Timestamp.
    if code in (EXT_TUPLE, EXT_DATACLASS):
        inner = msgpack.unpackb(data, ext_hook=_scan_ext_hook, strict_map_key=False)
        if _has_timestamp(inner):
            raise ProtocolError("msgpack timestamp (ext type -1) in message")
    return None


def _refuse_timestamps(meta: memoryview) -> None:
    """Raise ProtocolError if *meta* contains a msgpack timestamp anywhere."""
    if _TIMESTAMP_MARKERS.search(meta) is None:
        return
    tree = msgpack.unpackb(meta, ext_hook=_scan_ext_hook, strict_map_key=False)
    if _has_timestamp(tree):
        raise ProtocolError("msgpack timestamp (ext type -1) in message")


def _decode_meta(
    body: memoryview, meta_start: int, meta_end: int, spans: list[tuple[int, int]]
) -> object:
    """The message whose meta is ``body[meta_start:meta_end]`` and whose buffers are at
    *spans* (checked by :func:`._format._spans`). Raises ProtocolError, or anything
    msgpack or a constructor raises (the caller turns it into one)."""
    meta = body[meta_start:meta_end]
    _refuse_timestamps(meta)
    return _Decoder(body, spans).unpack(meta)


def _decode_general(body: object, limit: int) -> object:
    """*body* decoded by the general decoder alone (no cache read or filled), a body of
    at most *limit* bytes. Raises like :meth:`Codec.decode`: ProtocolError only."""
    try:
        mv = _body_view(body, limit)
        version, flags, nbuf, meta_len = HEADER.unpack_from(mv)
        meta_start, meta_end, spans = _spans(mv, version, flags, nbuf, meta_len)
        return _decode_meta(mv, meta_start, meta_end, spans)
    except ProtocolError:
        raise
    except Exception as exc:
        raise _malformed(exc) from exc
