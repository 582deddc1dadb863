"""Decode layouts: the fast path for bodies of one shape, learned from bytes.

A :class:`_Layout` is learned from a body the general decoder accepted (the 2nd, 4th,
8th... time a body of that length and header comes, see :func:`_learn`): a body of the
same length whose header and meta bytes equal it except in the value bytes of ints,
floats, bools, strs, bytes and numpy scalars (fixint and bool bytes only in the bits
that make them one; padding is free) is decoded with one ``struct`` unpack, its arrays
being read-only views at known offsets. A str that is not UTF-8 or a constructor that
raises sends the body to the general decoder (:mod:`._general`), which says what is
wrong. The shapes covered are those of :mod:`._templates`; the caches are bounded
(``_LAYOUT_CACHE_SIZE`` keys, emptied when full; ``_LAYOUTS_PER_KEY`` layouts a key).
"""

from __future__ import annotations

import dataclasses
import inspect
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, cast

import numpy as np

from .._compiled import SPEEDUPS
from ._dtypes import _array_from_payload, _dtype_from
from ._format import _U32, EXT_DATACLASS, EXT_NDARRAY, EXT_NPSCALAR, EXT_TUPLE
from ._registry import _TYPES_BY_NAME
from ._templates import _TEMPLATE_MAX_ITEMS

# Keys of the decode caches ((body length, header) -> layouts, and -> bodies seen); a
# full cache is emptied.
_LAYOUT_CACHE_SIZE: Final = 256
# Layouts kept per (body length, header) key: shapes whose bodies have the same length
# and header differ only in where their variable-width values sit.
_LAYOUTS_PER_KEY: Final = 4
# Bodies whose head (header, meta, padding before the first buffer) is longer than this
# take the general path.
_LAYOUT_MAX_HEAD: Final = 2048
# Top-level message types a layout may rebuild (besides registered dataclasses).
_LAYOUT_KINDS: Final = frozenset((tuple, list, dict))


class _Layout:
    """How to decode bodies that differ from one the general decoder accepted only in
    the bytes of their scalar values (a decode template).

    A body matches when it has :attr:`size` bytes and its first :attr:`check_len` bytes,
    masked with :attr:`mask`, equal :attr:`fixed` (both little-endian ints of those
    bytes): every header, msgpack marker, length, key, name and array description byte
    is fixed; a fixint or bool byte is fixed in the bits that make it one; padding and
    value bytes are free. :attr:`values` unpacks the value bytes (big-endian, as msgpack
    writes them) from :attr:`values_at`, and :attr:`build` makes the message of them and
    views into the body, exactly as the general decoder does.
    """

    __slots__ = (
        "build",
        "check_len",
        "codes",
        "decode",
        "fixed",
        "mask",
        "size",
        "spec",
        "values",
        "values_at",
    )

    def __init__(
        self,
        *,
        size: int,
        mask: bytes,
        fixed: bytes,
        values: struct.Struct,
        values_at: int,
        build: Callable[[Any, tuple[Any, ...]], object],
        spec: _Message,
        codes: list[tuple[int, str, int]],
        speedups: ModuleType | None = SPEEDUPS,
    ) -> None:
        self.size = size
        self.check_len = len(mask)
        self.mask = int.from_bytes(mask, "little")
        self.fixed = int.from_bytes(fixed, "little")
        self.values = values
        self.values_at = values_at
        self.build = build
        self.spec = spec
        self.codes = tuple(codes)
        #: ``decode(body)``: the compiled twin of :meth:`decode_py` where the C
        #: extension is active (*speedups*), else that method
        self.decode: Callable[[bytes | memoryview], object] = (
            self.decode_py if speedups is None else self.compiled(speedups)
        )

    def compiled(self, speedups: ModuleType) -> Callable[[bytes | memoryview], object]:
        """The ``decode`` of this layout's compiled twin (``speedups.Layout``)."""
        compiled = speedups.Layout(
            self.size,
            self.mask.to_bytes(self.check_len, "little"),
            self.fixed.to_bytes(self.check_len, "little"),
            self.codes,
            self.spec,
            np.frombuffer,
            np.ndarray,
        )
        decode: Callable[[bytes | memoryview], object] = compiled.decode
        return decode

    def decode_py(self, body: bytes | memoryview) -> object:
        """The message in *body* (bytes or a read-only byte memoryview of :attr:`size`
        bytes; the caller checks the length), or None if *body* does not match this
        layout or a value is invalid (the general decoder then raises)."""
        if int.from_bytes(body[: self.check_len], "little") & self.mask != self.fixed:
            return None
        try:
            return self.build(body, self.values.unpack_from(body, self.values_at))
        except Exception:  # (a str that is not UTF-8, a constructor that raises)
            return None


# A layout's message, for its compiled twin (``_speedups.Layout``): (kind, items, keys,
# class), with kind one of _KIND_*, keys the dict keys or dataclass fields (else None;
# None for a dataclass: called with its items as positional arguments, see
# _binds_in_order), class the dataclass (else None); _KIND_FIELDS is a dataclass the
# compiled twin builds by writing its fields (see _builds_by_fields; the pure path
# calls it, which builds the same); each item (op, a, b, c), by op:
#   _OP_NONE          None
#   _OP_VALUE         value a of the unpacked values, as unpacked (int, float, bytes)
#   _OP_BOOL          value a == 0xC3
#   _OP_STR           str(value a, "utf-8")
#   _OP_FROMBUFFER    numpy.frombuffer(body, a (dtype), b (count), c (offset))
#   _OP_NDARRAY       numpy.ndarray(b (shape), a (dtype), body, c (offset))
#   _OP_NPSCALAR      numpy.ndarray((), a (dtype), body, c (offset))[()]
_Item = tuple[int, Any, Any, Any]
_Message = tuple[int, tuple[_Item, ...], tuple[str, ...] | None, type | None]
_OP_NONE, _OP_VALUE, _OP_BOOL, _OP_STR, _OP_FROMBUFFER, _OP_NDARRAY, _OP_NPSCALAR = range(7)
_KIND_TUPLE, _KIND_LIST, _KIND_DICT, _KIND_DATACLASS, _KIND_FIELDS = range(5)

# msgpack markers of fixed-width numbers -> struct code of the value after the marker.
_NUMBER_CODES: Final = {
    0xCC: "B", 0xCD: "H", 0xCE: "I", 0xCF: "Q",
    0xD0: "b", 0xD1: "h", 0xD2: "i", 0xD3: "q",
    0xCA: "f", 0xCB: "d",
}  # fmt: skip
# msgpack str and bin markers with a length field -> size of that field.
_STR_LENGTHS: Final = {0xD9: 1, 0xDA: 2, 0xDB: 4}
_BIN_LENGTHS: Final = {0xC4: 1, 0xC5: 2, 0xC6: 4}


class _NotFlat(Exception):
    """The body is not one a layout covers (nesting, ext kinds, ...)."""


class _LayoutWalker:
    """Walks the meta of a body the general decoder accepted and records, byte by byte,
    what is fixed and what is a value: the making of a :class:`_Layout`."""

    def __init__(self, body: memoryview, head: int, spans: list[tuple[int, int]]) -> None:
        self.body = body
        self.spans = spans
        self.pos = 0
        self.mask = bytearray(head)  # 0 (free) unless set
        self.fixed = bytearray(head)
        self.codes: list[tuple[int, str, int]] = []  # (offset, struct code, size)
        self.namespace: dict[str, object] = {"frombuffer": np.frombuffer, "ndarray": np.ndarray}

    def skip_fixed(self, count: int) -> None:
        end = self.pos + count
        if end > len(self.mask):
            raise _NotFlat
        self.mask[self.pos : end] = b"\xff" * count
        self.fixed[self.pos : end] = self.body[self.pos : end]
        self.pos = end

    def value_hole(self, code: str, size: int) -> str:
        """A free span of *size* bytes unpacked with *code*; the expression reading it."""
        if self.pos + size > len(self.mask):
            raise _NotFlat
        self.codes.append((self.pos, code, size))
        self.pos += size
        return f"v[{len(self.codes) - 1}]"

    def constant(self, value: object) -> str:
        name = f"c{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def byte(self) -> int:
        if self.pos >= len(self.body):
            raise _NotFlat
        return self.body[self.pos]

    def length(self, size: int) -> int:
        """Read a big-endian length field of *size* bytes, fixed."""
        value = int.from_bytes(self.body[self.pos + 1 : self.pos + 1 + size], "big")
        self.skip_fixed(1 + size)
        return value

    def ext_header(self) -> tuple[int, int]:
        """Fix an ext header; return (code, payload length)."""
        marker = self.byte()
        if 0xD4 <= marker <= 0xD8:
            size, header = 1 << (marker - 0xD4), 2
        elif marker in (0xC7, 0xC8, 0xC9):
            width = 1 << (marker - 0xC7)
            size = int.from_bytes(self.body[self.pos + 1 : self.pos + 1 + width], "big")
            header = 2 + width
        else:
            raise _NotFlat
        code = self.body[self.pos + header - 1]
        self.skip_fixed(header)
        return code, size

    def count(self, fix: int, fix_top: int, wide: dict[int, int]) -> int:
        """Fix a msgpack array or map header (fixarray/fixmap or the 16/32-bit forms)."""
        marker = self.byte()
        if fix <= marker <= fix_top:
            self.skip_fixed(1)
            return marker - fix
        if marker in wide:
            return self.length(wide[marker])
        raise _NotFlat

    def fixed_str(self) -> str:
        """Fix a str (a dict key, a dataclass name) and return it."""
        marker = self.byte()
        if 0xA0 <= marker <= 0xBF:
            self.skip_fixed(1)
            size = marker & 0x1F
        elif marker in _STR_LENGTHS:
            size = self.length(_STR_LENGTHS[marker])
        else:
            raise _NotFlat
        start = self.pos
        self.skip_fixed(size)
        return bytes(self.body[start : self.pos]).decode()

    def item(self) -> tuple[str, _Item]:
        """Walk one item; return the expression that rebuilds it from ``body`` and
        ``v``, and the same as an :data:`_Item` (for the compiled twin)."""
        marker = self.byte()
        pos = self.pos
        if marker <= 0x7F or marker >= 0xE0:  # fixint: the marker is the value
            self.mask[pos] = 0x80 if marker <= 0x7F else 0xE0
            self.fixed[pos] = 0x00 if marker <= 0x7F else 0xE0
            return self.value("B" if marker <= 0x7F else "b", 1, _OP_VALUE, "{}")
        if marker == 0xC0:
            self.skip_fixed(1)
            return "None", (_OP_NONE, None, None, None)
        if marker in (0xC2, 0xC3):
            self.mask[pos], self.fixed[pos] = 0xFE, 0xC2
            return self.value("B", 1, _OP_BOOL, "({} == 0xC3)")
        if marker in _NUMBER_CODES:
            fmt = _NUMBER_CODES[marker]
            self.skip_fixed(1)
            return self.value(fmt, struct.calcsize(fmt), _OP_VALUE, "{}")
        if 0xA0 <= marker <= 0xBF or marker in _STR_LENGTHS:
            if marker <= 0xBF:
                self.skip_fixed(1)
                size = marker & 0x1F
            else:
                size = self.length(_STR_LENGTHS[marker])
            return self.value(f"{size}s", size, _OP_STR, "str({}, 'utf-8')")
        if marker in _BIN_LENGTHS:
            size = self.length(_BIN_LENGTHS[marker])
            return self.value(f"{size}s", size, _OP_VALUE, "{}")
        code, size = self.ext_header()
        start = self.pos
        if code == EXT_NDARRAY:
            array = _array_from_payload(self.body, start, start + size, self.body, self.spans)
            self.skip_fixed(size)
            offset = self.spans[_U32.unpack_from(self.body, start)[0]][0]
            dtype = self.constant(array.dtype)
            if array.ndim == 1 and array.dtype.itemsize:
                return (
                    f"frombuffer(body, {dtype}, {array.shape[0]}, {offset})",
                    (_OP_FROMBUFFER, array.dtype, array.shape[0], offset),
                )
            return (
                f"ndarray({self.constant(array.shape)}, {dtype}, body, {offset})",
                (_OP_NDARRAY, array.dtype, array.shape, offset),
            )
        if code == EXT_NPSCALAR and size >= 4:
            descr_len = _U32.unpack_from(self.body, start)[0]
            dt = _dtype_from(bytes(self.body[start + 4 : start + 4 + descr_len]))
            if dt.kind not in "biufc" or dt.itemsize != size - 4 - descr_len:
                raise _NotFlat
            self.skip_fixed(4 + descr_len)
            offset = self.pos
            self.pos += dt.itemsize  # the value's bytes are free, read in place
            return (
                f"ndarray((), {self.constant(dt)}, body, {offset})[()]",
                (_OP_NPSCALAR, dt, None, offset),
            )
        raise _NotFlat

    def value(self, code: str, size: int, op: int, form: str) -> tuple[str, _Item]:
        """A value hole (:meth:`value_hole`) made an item: *form* around its read."""
        expr = self.value_hole(code, size)
        return form.format(expr), (op, len(self.codes) - 1, None, None)

    def items(self, count: int) -> list[tuple[str, _Item]]:
        if count > _TEMPLATE_MAX_ITEMS:
            raise _NotFlat
        return [self.item() for _ in range(count)]

    def fields(self) -> tuple[str, tuple[str, ...], list[_Item], list[str]]:
        """Walk a map of str keys to items; return a dict display expression, its keys,
        its items and their expressions."""
        count = self.count(0x80, 0x8F, {0xDE: 2, 0xDF: 4})
        if count > _TEMPLATE_MAX_ITEMS:
            raise _NotFlat
        pairs = []
        keys = []
        specs = []
        exprs = []
        for _ in range(count):
            name = self.fixed_str()
            key = self.constant(name)
            expr, spec = self.item()
            pairs.append(f"{key}: {expr}")
            keys.append(name)
            specs.append(spec)
            exprs.append(expr)
        return "{" + ", ".join(pairs) + "}", tuple(keys), specs, exprs

    def message(self) -> tuple[str, _Message]:
        """Walk the top-level container; return the expression that rebuilds it, and
        the same as a :data:`_Message` (for the compiled twin)."""
        marker = self.byte()
        if 0x90 <= marker <= 0x9F or marker in (0xDC, 0xDD):
            items = self.items(self.count(0x90, 0x9F, {0xDC: 2, 0xDD: 4}))
            expr = "[" + ", ".join(expr for expr, _ in items) + "]"
            return expr, (_KIND_LIST, tuple(spec for _, spec in items), None, None)
        if 0x80 <= marker <= 0x8F or marker in (0xDE, 0xDF):
            expr, keys, specs, _ = self.fields()
            return expr, (_KIND_DICT, tuple(specs), keys, None)
        code, size = self.ext_header()
        end = self.pos + size
        spec: _Message
        if code == EXT_TUPLE:
            items = self.items(self.count(0x90, 0x9F, {0xDC: 2, 0xDD: 4}))
            expr = "(" + "".join(f"{expr}, " for expr, _ in items) + ")"
            spec = (_KIND_TUPLE, tuple(spec for _, spec in items), None, None)
        elif code == EXT_DATACLASS:
            if self.byte() != 0x92:
                raise _NotFlat
            self.skip_fixed(1)
            entry = _TYPES_BY_NAME.get(self.fixed_str())
            if entry is None:
                raise _NotFlat
            fields, keys, specs, exprs = self.fields()
            cls = self.constant(entry.cls)
            if _binds_in_order(entry.cls, keys):
                # (positional: a third of the cost of building and passing a dict)
                expr = f"{cls}({''.join(f'{e}, ' for e in exprs)})"
                spec = (_KIND_DATACLASS, tuple(specs), None, entry.cls)
            else:
                expr = f"{cls}(**{fields})"
                spec = (_KIND_DATACLASS, tuple(specs), keys, entry.cls)
            if _builds_by_fields(entry.cls, keys):
                # (compiled: no Python __init__ frame, a fifth of the cost of the call)
                spec = (_KIND_FIELDS, tuple(specs), keys, entry.cls)
        else:
            raise _NotFlat
        if self.pos != end:
            raise _NotFlat
        return expr, spec


def _binds_in_order(cls: type, keys: tuple[str, ...]) -> bool:
    """Whether ``cls(*values)`` binds *values* exactly as ``cls(**dict(zip(keys,
    values)))`` does: the first parameters of ``cls`` are *keys*, in order, each one
    positional-or-keyword, and every later one has a default (a dataclass's generated
    ``__init__``, unless a field is keyword-only or the class wrote its own)."""
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):  # (no signature to read: keep the keywords)
        return False
    if len(parameters) < len(keys):
        return False
    for parameter, key in zip(parameters, keys, strict=False):
        if parameter.name != key or parameter.kind is not parameter.POSITIONAL_OR_KEYWORD:
            return False
    return all(
        parameter.default is not parameter.empty or parameter.kind is parameter.VAR_KEYWORD
        for parameter in parameters[len(keys) :]
    )


_TYPE_CALL: Final = type.__dict__["__call__"]
_OBJECT_SETATTR: Final = object.__dict__["__setattr__"]


def _builds_by_fields(cls: type, keys: tuple[str, ...]) -> bool:
    """Whether ``object.__new__(cls)`` followed by ``object.__setattr__(message, key,
    value)`` for each of *keys* in order builds exactly what ``cls(**fields)`` builds.

    True only where nothing but the ``__init__`` that ``@dataclass`` generated runs: no
    metaclass ``__call__``, no ``__new__``, no ``__setattr__`` of the class unless it is
    frozen (whose ``__init__`` uses ``object.__setattr__`` itself), and an ``__init__``
    whose parameters are *keys* (every field, none ``init=False``) and whose code names
    nothing but the fields (so no ``__post_init__``): the generated one stores each
    field in order, which is what the compiled layout does. The compiled layout checks
    that the class's ``__init__``, ``__new__`` and ``__setattr__`` are still the ones
    it learned, and calls the class otherwise."""
    if not dataclasses.is_dataclass(cls) or "__init__" not in cls.__dict__:
        return False
    init = cls.__dict__["__init__"]
    code = getattr(init, "__code__", None)
    if (
        code is None
        or code.co_filename != "<string>"  # (generated: dataclasses execs its source)
        or getattr(init, "__qualname__", None) != f"{cls.__qualname__}.__init__"
        or code.co_varnames[: code.co_argcount + code.co_kwonlyargcount] != ("self", *keys)
        or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        or not set(code.co_names) <= {*keys, "__setattr__"}
    ):
        return False
    if [f.name for f in dataclasses.fields(cls)] != list(keys):
        return False
    params = getattr(cls, "__dataclass_params__", None)
    frozen = bool(getattr(params, "frozen", False))
    return (
        inspect.getattr_static(type(cls), "__call__") is _TYPE_CALL
        and cls.__new__ is object.__new__
        and (frozen or inspect.getattr_static(cls, "__setattr__") is _OBJECT_SETATTR)
    )


def _learn_layout(
    body: memoryview, meta_start: int, meta_end: int, spans: list[tuple[int, int]]
) -> _Layout | None:
    """The layout of *body*, which the general decoder has just accepted (its meta at
    *meta_start*..*meta_end*, its buffers at *spans*); None if no layout covers it."""
    head = spans[0][0] if spans else meta_end
    if head > _LAYOUT_MAX_HEAD:
        return None
    walker = _LayoutWalker(body, head, spans)
    try:
        walker.skip_fixed(meta_start)  # version, flags, counts, buffer lengths
        expr, spec = walker.message()
    except Exception:  # (_NotFlat, mostly) learning is an optimisation: never an error
        return None
    if walker.pos != meta_end:
        return None
    # The padding up to the first buffer stays free (the general decoder ignores it).
    check_len = len(walker.mask.rstrip(b"\0"))
    fmt = [">"]
    at = at_first = walker.codes[0][0] if walker.codes else 0
    for offset, code, size in walker.codes:
        if offset > at:
            fmt.append(f"{offset - at}x")
        fmt.append(code)
        at = offset + size
    source = f"def build(body, v):\n    return {expr}\n"
    namespace = walker.namespace
    exec(source, namespace)
    return _Layout(
        size=len(body),
        mask=bytes(walker.mask[:check_len]),
        fixed=bytes(walker.fixed[:check_len]),
        values=struct.Struct("".join(fmt)),
        values_at=at_first,
        build=cast(Callable[[Any, tuple[Any, ...]], object], namespace["build"]),
        spec=spec,
        codes=walker.codes,
    )


# (body length, first HEADER.size bytes) -> layouts of bodies with that length and header.
_DEC_LAYOUTS: dict[tuple[int, bytes], list[_Layout]] = {}
# The same keys -> how many bodies with that key the general decoder decoded. A layout is
# learned the 2nd, 4th, 8th... time: a stream whose bodies never repeat a key pays nothing
# for learning, and one whose bodies fit no layout (nesting) pays for a few attempts.
_DEC_SEEN: dict[tuple[int, bytes], int] = {}


def _learn(
    key: tuple[int, bytes],
    body: memoryview,
    meta_start: int,
    meta_end: int,
    spans: list[tuple[int, int]],
) -> _Layout | None:
    """After the general decoder accepted *body*: count it under *key*, and on the 2nd,
    4th, 8th... time learn and cache its layout (see ``_DEC_SEEN``). Returns the layout
    learned now, or None."""
    seen = _DEC_SEEN.get(key, 0) + 1
    if seen == 1 and len(_DEC_SEEN) >= _LAYOUT_CACHE_SIZE:
        _DEC_SEEN.clear()
    _DEC_SEEN[key] = seen
    if seen < 2 or seen & (seen - 1):
        return None
    layout = _learn_layout(body, meta_start, meta_end, spans)
    if layout is None:
        return None
    layouts = _DEC_LAYOUTS.get(key)
    if layouts is None:
        if len(_DEC_LAYOUTS) >= _LAYOUT_CACHE_SIZE:
            _DEC_LAYOUTS.clear()
        layouts = _DEC_LAYOUTS[key] = []
    if len(layouts) >= _LAYOUTS_PER_KEY:
        del layouts[0]
    layouts.append(layout)
    return layout
