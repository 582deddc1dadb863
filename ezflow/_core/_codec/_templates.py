"""Encode templates: the fast path for messages of one *shape*.

A shape is a tuple, list, dict with str keys or registered dataclass of at most
``_TEMPLATE_MAX_ITEMS`` items, each None, bool, int, float, str, bytes shorter than
``INLINE_BYTES_LIMIT``, a numpy array or a numeric numpy scalar (no nesting), with the
same container type, length, keys or field names, item types and, for arrays, dtype and
ndim. Encoding uses a :class:`_Template` cached per shape key: a ``prepare`` function
generated for the shape (with ``exec``: only names and ints are in its source) checks a
message and lays out its items, one reused per-thread packer packs them, and each
array's ext payload is cached for its last shape. The bytes are exactly the general
encoder's (:mod:`._general`); anything a template does not cover, or any error, goes to
the general path, which raises what it raises. The cache is bounded
(``_TEMPLATE_CACHE_SIZE`` entries, emptied when full). The decoding side of shapes is
:mod:`._layouts`.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

import msgpack
import numpy as np

from .._compiled import SPEEDUPS
from ._dtypes import _ENC_DTYPES, _array_bytes, _encode_dtype
from ._format import (
    _ARRAY_HEADS,
    _HEADER_1BUF,
    _MAX_EMPTY_ITEMS,
    _PADDING,
    _U32,
    BUFFER_ALIGNMENT,
    EXT_DATACLASS,
    EXT_NDARRAY,
    EXT_NPSCALAR,
    EXT_TUPLE,
    FORMAT_VERSION,
    HEADER,
    INLINE_BYTES_LIMIT,
    SMALL_BODY,
    EncodedMessage,
    _assemble,
    _ext,
    _ext_header,
    _new_encoded,
)
from ._registry import _TYPES_BY_CLASS

# Entries of the encode cache (shape key -> _Template); a full cache is emptied.
_TEMPLATE_CACHE_SIZE: Final = 256
# Containers with more items than this take the general path (also on decoding:
# :mod:`._layouts` learns no layout of them).
_TEMPLATE_MAX_ITEMS: Final = 64
# A thread's reusable packer is dropped after packing a meta this large: a msgpack
# packer keeps its largest buffer for ever.
_TEMPLATE_MAX_META: Final = 64 * 1024

# Item types a template encodes: msgpack-native leaves, arrays, numeric numpy scalars.
_TEMPLATE_LEAVES: Final = frozenset((type(None), bool, int, float, str, bytes))
_NP_SCALAR_TYPES: Final = frozenset(np.dtype(code).type for code in "?bBhHiIlLqQefdFD")
_TEMPLATE_TYPES: Final = _TEMPLATE_LEAVES | _NP_SCALAR_TYPES | {np.ndarray}
# Each thread reuses one packer: a packer is not safe to share between threads, and
# making one per message costs a microsecond (the general encoder does).
_PACKERS = threading.local()


def _thread_packer() -> msgpack.Packer:
    try:
        packer: msgpack.Packer = _PACKERS.packer
    except AttributeError:
        packer = _PACKERS.packer = msgpack.Packer(strict_types=True, use_bin_type=True)
    return packer


class _ArraySlot:
    """An item of a template that is an array of *dtype* and *ndim* dimensions, whose
    data is out-of-band buffer *buffer*."""

    __slots__ = ("buffer", "descr", "dtype", "exports", "last", "ndim")

    def __init__(self, buffer: int, dtype: np.dtype[Any], ndim: int) -> None:
        self.buffer = buffer
        self.dtype = dtype
        self.ndim = ndim
        self.descr, self.exports = _ENC_DTYPES.get(dtype) or _encode_dtype(dtype)
        # (shape, EXT_NDARRAY value) of the last array seen here: arrays of a stream
        # keep their shape. One tuple, replaced whole, so threads may share it.
        self.last: tuple[tuple[int, ...], object] = ((-1,), None)

    def ext(self, shape: tuple[int, ...]) -> object:
        """The EXT_NDARRAY value (``u32 buffer | u8 ndim | shape | descr``) for *shape*."""
        last_shape, value = self.last
        if shape != last_shape:
            payload = _ARRAY_HEADS[self.ndim].pack(self.buffer, self.ndim, *shape) + self.descr
            value = _ext(EXT_NDARRAY, payload)
            self.last = (shape, value)
        return value


class _Template:
    """How to encode one message shape: the same meta and buffers as ``_Encoder``,
    with one reused packer and no per-item dispatch.

    *kind* is the container type (tuple, list, dict or a registered dataclass),
    *names* the dict keys or dataclass init fields in order (None for sequences),
    *values* the items of a message of this shape. :attr:`prepare` is a function
    generated for the shape (see :func:`_prepare_source`): ``prepare(obj, limit)``
    checks that *obj* has this shape and returns the object to pack (items, with the
    arrays and numpy scalars as ext values) and the arrays, or None.
    """

    __slots__ = ("check", "encode_small", "entry", "exports", "kind", "prepare")

    def __init__(self, kind: type, names: tuple[str, ...] | None, values: tuple[Any, ...]) -> None:
        self.kind = kind
        self.entry = _TYPES_BY_CLASS.get(kind)
        namespace: dict[str, Any] = {
            "EXT": _ext,
            "EXT_NPSCALAR": EXT_NPSCALAR,
            "INLINE": INLINE_BYTES_LIMIT,
            "NAMES": names,
            "GET": operator.attrgetter(*names) if names else None,
        }
        arrays: list[_ArraySlot] = []
        for i, value in enumerate(values):
            namespace[f"T{i}"] = type(value)
            if names:
                namespace[f"K{i}"] = names[i]
            if type(value) is np.ndarray:
                namespace[f"A{i}"] = slot = _ArraySlot(len(arrays), value.dtype, value.ndim)
                arrays.append(slot)
            elif type(value) in _NP_SCALAR_TYPES:
                descr = _encode_dtype(np.dtype(type(value)))[0]
                namespace[f"P{i}"] = _U32.pack(len(descr)) + descr  # the payload's start
        self.exports = tuple(slot.exports for slot in arrays)
        source = _prepare_source(kind, names, values)
        exec(source, namespace)  # (only names and ints are in the source)
        self.prepare: Callable[[Any, int], tuple[Any, tuple[Any, ...]] | None] = namespace[
            "prepare"
        ]
        compiled = _compiled_template(kind, names, values, self.entry)
        #: ``encode_small(obj, limit)``: the compiled twin of :meth:`encode_small_py`
        #: where the C extension is active and covers the shape, else that method
        self.encode_small: Callable[[Any, int], bytes | None] = (
            self.encode_small_py if compiled is None else compiled.encode_small
        )
        #: ``check(obj)``: True when *obj* has this shape and the general check
        #: (``_general._check``, :meth:`Codec.validate`) raises nothing for it, False
        #: when it must decide (it raises only what is not an ``Exception``, met in a
        #: field's getter); compiled only (None without the extension: the general
        #: check is the pure path's, one pass in Python either way)
        self.check: Callable[[Any], bool] | None = None if compiled is None else compiled.check

    def encode_small_py(self, obj: Any, limit: int) -> bytes | None:
        """The whole body of *obj* as one ``bytes`` object when it has this shape and a
        body of at most ``min(limit, SMALL_BODY)`` bytes, else None (what
        :meth:`encode` returns, capped at ``SMALL_BODY``: its one part)."""
        encoded = self.encode(obj, min(limit, SMALL_BODY))
        return None if encoded is None else encoded.parts[0]  # type: ignore[return-value]

    def encode(self, obj: Any, limit: int) -> EncodedMessage | None:
        """*obj* encoded exactly as the general encoder does it (a body of at most
        ``SMALL_BODY`` as one ``bytes`` part), or None if *obj* is not of this shape or
        the general path must decide (an int out of range, a str that is not Unicode,
        a size over *limit*, ...: it raises what there is to raise). With *limit* at
        most ``SMALL_BODY``, a large message gives up before anything is packed."""
        prepared = self.prepare(obj, limit)
        if prepared is None:
            return None
        items, arrays = prepared
        try:
            packer = _PACKERS.packer
        except AttributeError:
            packer = _thread_packer()
        try:
            inner = packer.pack(items)
        except Exception:  # (OverflowError, UnicodeEncodeError, ...): the general path
            return None
        # meta = head + inner, joined once with the rest of the body
        entry = self.entry
        size = len(inner)
        if self.kind is tuple:
            head = _TUPLE_HEADS[size] if size < 0x100 else _ext_header(EXT_TUPLE, size)
        elif entry is not None:
            size += len(entry.prefix)
            head = _DATACLASS_HEADS[size] if size < 0x100 else _ext_header(EXT_DATACLASS, size)
            head += entry.prefix
        else:
            head = b""
        meta_len = len(head) + len(inner)
        if meta_len > _TEMPLATE_MAX_META:
            del _PACKERS.packer
        if not arrays:
            total = HEADER.size + meta_len
            if total > limit:
                return None
            body = b"".join((HEADER.pack(FORMAT_VERSION, 0, 0, meta_len), head, inner))
            return _new_encoded(EncodedMessage, ([body], total))
        if len(arrays) > 1:
            bufs = [
                _array_bytes(arr, exports, arr.nbytes)
                for arr, exports in zip(arrays, self.exports, strict=True)
            ]
            pos = HEADER.size + 8 * len(bufs) + meta_len
            for buf in bufs:
                pos += (-pos & (BUFFER_ALIGNMENT - 1)) + buf.nbytes
            return None if pos > limit else _assemble(head + inner, bufs, limit, join_small=True)
        arr = arrays[0]
        nbytes = arr.nbytes
        pos = _HEADER_1BUF.size + meta_len
        pad = -pos & (BUFFER_ALIGNMENT - 1)
        total = pos + pad + nbytes
        if total > limit or (nbytes == 0 and arr.size > _MAX_EMPTY_ITEMS):
            return None
        header = _HEADER_1BUF.pack(FORMAT_VERSION, 0, 1, meta_len, nbytes)
        if total <= SMALL_BODY:
            # arr.tobytes() is the C-ordered copy the general path's buffer holds.
            body = b"".join((header, head, inner, _PADDING[pad], arr.tobytes()))
            return _new_encoded(EncodedMessage, ([body], total))
        first = b"".join((header, head, inner, _PADDING[pad]))
        data = _array_bytes(arr, self.exports[0], nbytes)
        return _new_encoded(EncodedMessage, ([first, data], total))


# What _speedups.Template is told each item is.
_ITEM_KINDS: Final[dict[type, int]] = {
    type(None): 0, bool: 1, int: 2, float: 3, str: 4, bytes: 5, np.ndarray: 6,
}  # fmt: skip
_CONTAINERS: Final[dict[type, int]] = {tuple: 0, list: 1, dict: 2}


def _compiled_template(
    kind: type,
    names: tuple[str, ...] | None,
    values: tuple[Any, ...],
    entry: Any,
    speedups: ModuleType | None = SPEEDUPS,
) -> Any:
    """The compiled template of the shape of *values* (a ``_speedups.Template`` of
    *speedups*, the active extension by default: its ``encode_small`` and ``check``),
    or None where no extension is active or it does not cover the shape (numpy
    scalars, two arrays or more: the pure-Python path encodes those). *entry* is the
    dataclass's registry entry."""
    if speedups is None:
        return None
    item_kinds = tuple(_ITEM_KINDS.get(type(value), -1) for value in values)
    if -1 in item_kinds or item_kinds.count(_ITEM_KINDS[np.ndarray]) > 1:
        return None
    array = next((value for value in values if type(value) is np.ndarray), None)
    dtype = None if array is None else array.dtype
    compiled = speedups.Template(
        kind,
        _CONTAINERS.get(kind, 3),
        names,
        tuple(map(type, values)),
        item_kinds,
        dtype,
        0 if array is None else array.ndim,
        b"" if dtype is None else (_ENC_DTYPES.get(dtype) or _encode_dtype(dtype))[0],
        b"" if entry is None else entry.prefix,
        _MAX_EMPTY_ITEMS,
    )
    return compiled


def _prepare_source(kind: type, names: tuple[str, ...] | None, values: tuple[Any, ...]) -> str:
    """The source of ``prepare(obj, limit)`` for one shape (see :class:`_Template`).

    For ``(1, 2, array)`` it reads::

        def prepare(obj, limit):
            if len(obj) != 3:
                return None
            v0, v1, v2 = obj
            if type(v0) is not T0 or type(v1) is not T1 or type(v2) is not T2:
                return None
            d = v2.dtype
            if (d is not A2.dtype and d != A2.dtype) or v2.ndim != A2.ndim:
                return None
            oob = v2.nbytes
            if oob > limit:
                return None
            return [v0, v1, A2.ext(v2.shape)], (v2,)

    Constants (types T*, array slots A*, keys K*, ...) come from the namespace, never
    from the source.
    """
    count = len(values)
    var = [f"v{i}" for i in range(count)]
    lines = ["def prepare(obj, limit):"]
    if kind is tuple or kind is list:
        lines += [f"    if len(obj) != {count}:", "        return None"]
        source = "obj"
    elif kind is dict:
        lines += [f"    if len(obj) != {count} or tuple(obj) != NAMES:", "        return None"]
        source = "obj.values()"
    else:
        source = "GET(obj)" if count > 1 else "(GET(obj),)"
    if count:
        lines.append(f"    {', '.join(var)}, = {source}")
        checks = " or ".join(f"type({v}) is not T{i}" for i, v in enumerate(var))
        lines += [f"    if {checks}:", "        return None"]
    items = list(var)
    arrays = []
    for i, value in enumerate(values):
        v = var[i]
        if type(value) is bytes:  # long bytes travel out-of-band: the general path's
            lines += [f"    if len({v}) >= INLINE:", "        return None"]
        elif type(value) is np.ndarray:
            lines += [
                f"    d = {v}.dtype",
                f"    if (d is not A{i}.dtype and d != A{i}.dtype) or {v}.ndim != A{i}.ndim:",
                "        return None",
            ]
            arrays.append(v)
            items[i] = f"A{i}.ext({v}.shape)"
        elif type(value) in _NP_SCALAR_TYPES:
            items[i] = f"EXT(EXT_NPSCALAR, P{i} + {v}.tobytes())"
    if arrays:
        lines += [
            f"    oob = {' + '.join(f'{v}.nbytes' for v in arrays)}",
            "    if oob > limit:",
            "        return None",
        ]
    if kind is tuple or kind is list:
        packed = f"[{', '.join(items)}]"
    else:
        packed = "{" + ", ".join(f"K{i}: {item}" for i, item in enumerate(items)) + "}"
    lines.append(f"    return {packed}, ({''.join(f'{v}, ' for v in arrays)})")
    return "\n".join(lines) + "\n"


# The ext headers of tuple and dataclass payloads shorter than 256 bytes.
_TUPLE_HEADS: Final = tuple(_ext_header(EXT_TUPLE, size) for size in range(0x100))
_DATACLASS_HEADS: Final = tuple(_ext_header(EXT_DATACLASS, size) for size in range(0x100))


# shape key -> template. The key holds the container type, names, item types and each
# array's (dtype, ndim); bounded like the array caches.
_ENC_TEMPLATES: dict[tuple[Any, ...], _Template] = {}


def _template_for(obj: Any, tp: type) -> _Template | None:
    """The (cached) template of *obj*'s shape, or None if no template covers it."""
    names: tuple[str, ...] | None = None
    if (tp is tuple or tp is list or tp is dict) and len(obj) > _TEMPLATE_MAX_ITEMS:
        return None  # (before anything is copied)
    if tp is tuple or tp is list:
        values = tuple(obj)
    elif tp is dict:
        names = tuple(obj)
        if not all(type(k) is str for k in names):
            return None
        values = tuple(obj.values())
    else:
        entry = _TYPES_BY_CLASS.get(tp)
        if entry is None:
            return None
        names = entry.fields
        values = tuple(getattr(obj, name) for name in names)
    if len(values) > _TEMPLATE_MAX_ITEMS or not _TEMPLATE_TYPES.issuperset(map(type, values)):
        return None
    key = (
        tp,
        names,
        tuple(map(type, values)),
        tuple((v.dtype, v.ndim) for v in values if type(v) is np.ndarray),
    )
    template = _ENC_TEMPLATES.get(key)
    if template is None:
        try:
            template = _Template(tp, names, values)
        except Exception:  # (a dtype that cannot travel...): the general path says what
            return None
        if len(_ENC_TEMPLATES) >= _TEMPLATE_CACHE_SIZE:
            _ENC_TEMPLATES.clear()
        _ENC_TEMPLATES[key] = template
    return template


def _compiled_check_for(obj: Any) -> tuple[type, Callable[[Any], bool]] | None:
    """(type, the compiled ``check`` of *obj*'s shape) for :meth:`Codec.validate`'s
    fast path, or None where no compiled template covers the shape. *obj* passed the
    general check."""
    tp = type(obj)
    try:
        template = _template_for(obj, tp)
    except Exception:  # (a dataclass property that raises the second time: no fast path)
        return None
    if template is None or template.check is None:
        return None
    return tp, template.check
