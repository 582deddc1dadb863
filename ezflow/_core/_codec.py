"""Message codec: Python objects <-> self-describing byte bodies, numpy data zero-copy.

A *body* is one byte string. :meth:`Codec.encode` returns it as a list of parts
(:class:`EncodedMessage`) so large buffers are handed to ``transport.writelines`` without
being joined; :meth:`Codec.decode` takes the whole body back and builds numpy arrays and
byte buffers as read-only views into it (no copy).

Body layout (all integers little endian)::

    offset  size        field
    0       u8          version              FORMAT_VERSION (1)
    1       u8          flags                0 (no flag is defined yet)
    2       u16         nbuf                 number of out-of-band buffers
    4       u32         meta_len             length of the msgpack meta
    8       nbuf * u64  buffer lengths       length of buffer i, in order
    ...     meta_len    meta                 msgpack encoding of the message tree
    then, for each buffer i: zero padding up to the next offset (from the body start)
    that is a multiple of BUFFER_ALIGNMENT (16), then buffer i itself.

The body ends exactly after the last buffer (or after the meta when ``nbuf == 0``).
Bulk data never goes through msgpack: the meta refers to out-of-band buffers by index,
through msgpack extension types, one code per kind (``EXT_*`` below). Ext payloads:

- ``EXT_TUPLE``: msgpack array of the items (nested packing; tuples stay tuples, also
  as dict keys, which msgpack alone would turn into lists).
- ``EXT_NDARRAY``: ``u32 buffer index | u8 ndim | ndim x u64 shape | descr``; the
  buffer holds the C-ordered raw data.
- ``EXT_NPSCALAR``: ``u32 descr length | descr | raw value bytes``.
- ``EXT_BYTES``: ``u32 buffer index``; decodes to ``bytes`` (one copy).
- ``EXT_BUFFER``: ``u32 buffer index``; decodes to a read-only ``memoryview`` into the
  body (no copy).
- ``EXT_DATACLASS``: msgpack ``[name, {init field name: value}]``.

``descr`` is what ``numpy.lib.format.dtype_to_descr(dtype)`` returns (a str, or for
structured dtypes a list of field tuples), packed with msgpack, tuples again as
``EXT_TUPLE``; it is read back with ``numpy.lib.format.descr_to_dtype``. Padding bytes
are written as zeros and ignored on reading. Dtype metadata is not sent.

Type mapping (encode -> decode):

- ``None``, ``bool``, ``float``, ``str``: themselves. ``int``: itself, if it fits
  msgpack's range ``-2**63 .. 2**64-1`` (else :class:`UnregisteredTypeError`).
- ``list`` -> ``list``; ``tuple`` -> ``tuple``; ``dict`` -> ``dict`` (keys may be any
  encodable hashable value, including ints and tuples).
- Subclasses of ``dict``, ``list``, ``tuple``, ``str``, ``int``, ``float``, ``bytes`` and
  ``bytearray`` (``OrderedDict``, namedtuples, ``IntEnum``, ...) are sent as their base
  type and decode as the base type.
- ``bytes`` -> ``bytes``. Shorter than ``INLINE_BYTES_LIMIT`` it is inline in the meta;
  longer it travels out-of-band and is copied once on decode. For zero-copy receive send
  a ``bytearray``, ``memoryview`` or uint8 array instead.
- ``bytearray`` and ``memoryview`` -> read-only 1-D ``memoryview`` of unsigned bytes,
  a view into the body. Non-contiguous memoryviews are copied on encode.
- ``numpy.ndarray`` (any dtype without Python objects, any shape incl. 0-d and empty)
  -> read-only ``numpy.ndarray`` of the same dtype and shape, a view into the body.
  Non-C-contiguous arrays are copied to C order on encode. Subclasses (``memmap``, ...)
  decode as plain ndarrays; masked arrays are refused (the mask would be lost).
- numpy scalars (``numpy.generic``) -> numpy scalar of the same dtype and value.
- Dataclasses registered with :func:`register_message` / :func:`message` -> instance
  of the class registered under the same name in the receiving process, rebuilt by
  calling the class with its ``init`` fields as keyword arguments (``init=False``
  fields are recomputed by the constructor).

Buffers are referenced, not copied, by :meth:`Codec.encode`: do not modify an array or
bytearray until its message has been written. (A message that takes a fast path and
whose body is at most ``SMALL_BODY``, 4 KiB, is copied into one ``bytes`` part: that
costs less than referencing it, and the sender writes one object.)

Fast paths. The general encoder (``_Encoder``, forced by ``_encode_general``) and the
general decoder (``_Decoder``, forced by ``_decode_general``) are the reference; every
fast path below produces exactly their bytes and objects, or hands the message to them
(which raise what there is to raise), and tests/test_codec_fastpaths.py checks that:

- a top-level array: the body prefix cached per (dtype, shape) on both sides
  (``_ENC_ARRAYS``, ``_DEC_ARRAYS``, ``Codec.last_array``), ``small_array_body``,
  ``array_prefix``;
- a *shape*: a tuple, list, dict with str keys or registered dataclass of at most
  ``_TEMPLATE_MAX_ITEMS`` items, each None, bool, int, float, str, bytes shorter than
  ``INLINE_BYTES_LIMIT``, a numpy array or a numeric numpy scalar (no nesting). Encoding
  uses a ``_Template`` cached per shape key (container type, keys or fields, item types,
  each array's dtype and ndim): a ``prepare`` function generated for the shape checks
  a message and lays out its items, one reused per-thread packer packs them, each
  array's ext payload is cached for its last shape. Decoding uses a ``_Layout``
  learned from a body the general decoder accepted (the 2nd, 4th, 8th... time a body
  of that length and header comes): a body of the same length whose header and meta bytes equal
  it except in the value bytes of ints, floats, bools, strs, bytes and numpy scalars
  (fixint and bool bytes only in the bits that make them one; padding is free) is
  decoded with one ``struct`` unpack, its arrays being read-only views at known offsets;
  a str that is not UTF-8 or a constructor that raises sends the body to the general
  decoder. Both caches are bounded (``_TEMPLATE_CACHE_SIZE`` entries, emptied when full).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import operator
import re
import struct
import threading
from collections.abc import Callable
from typing import Any, Final, NamedTuple, TypeVar, cast, overload

import msgpack
import numpy as np
from numpy.lib.format import descr_to_dtype

from ._config import DEFAULT_MAX_MESSAGE_SIZE, ENV_MAX_MESSAGE_SIZE, check_positive
from ._exceptions import (
    ConfigurationError,
    MessageTooLargeError,
    ProtocolError,
    UnregisteredTypeError,
)

__all__ = [
    "DEFAULT_CODEC",
    "Codec",
    "EncodedMessage",
    "message",
    "register_message",
]

_T = TypeVar("_T")

# --------------------------------------------------------------------------- layout

#: Value of the first body byte; a decoder refuses any other.
FORMAT_VERSION: Final = 1
#: ``version, flags, nbuf, meta_len``.
HEADER: Final = struct.Struct("<BBHI")
#: Out-of-band buffers start at body offsets that are multiples of this.
BUFFER_ALIGNMENT: Final = 16
#: ``bytes`` shorter than this are inline in the meta; longer ones go out-of-band.
INLINE_BYTES_LIMIT: Final = 1024
#: The header's ``nbuf`` field is a u16.
MAX_BUFFERS: Final = 0xFFFF
#: Containers (lists, dicts, tuples, dataclasses) nested deeper than this are refused.
MAX_DEPTH: Final = 100

EXT_TUPLE: Final = 1
EXT_NDARRAY: Final = 2
EXT_NPSCALAR: Final = 3
EXT_BYTES: Final = 4
EXT_BUFFER: Final = 5
EXT_DATACLASS: Final = 6

_HEADER_1BUF: Final = struct.Struct("<BBHIQ")
_NBUF_META: Final = struct.Struct("<2xHI")  # HEADER's nbuf and meta_len alone
_U32: Final = struct.Struct("<I")
_ARRAY_PREFIX: Final = struct.Struct("<IB")
_MAX_NDIM: Final = 64
_SHAPES: Final = tuple(struct.Struct("<" + "Q" * n) for n in range(_MAX_NDIM + 1))
_ARRAY_HEADS: Final = tuple(struct.Struct("<IB" + "Q" * n) for n in range(_MAX_NDIM + 1))
_LENGTHS: Final = tuple(struct.Struct("<" + "Q" * n) for n in range(17))
_PADDING: Final = tuple(b"\0" * n for n in range(BUFFER_ALIGNMENT))
_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = (1 << 64) - 1
_MAX_DIM: Final = (1 << 63) - 1
# Arrays of zero-size items (dtype [] or V0) cost no bytes whatever their shape; this
# bounds their element count so a peer cannot hand out absurd shapes.
_MAX_EMPTY_ITEMS: Final = DEFAULT_MAX_MESSAGE_SIZE
_DTYPE_CACHE_SIZE: Final = 512
# Entries of each top-level array cache (see ``_ENC_ARRAYS``); a full cache is emptied.
_ARRAY_CACHE_SIZE: Final = 256
#: A message whose whole body is at most this many bytes, and that takes a fast path (a
#: top-level array, or a shape template), is encoded as one ``bytes`` part: copying its
#: arrays costs less than exporting their buffers, and the sender writes one object.
SMALL_BODY: Final = 4096
# Shape templates (see "templates" below). Entries of the encode cache (shape key ->
# _Template) and of the decode cache ((body length, header) -> layouts); a full cache is
# emptied, like the array caches.
_TEMPLATE_CACHE_SIZE: Final = 256
# Layouts kept per (body length, header) key: shapes whose bodies have the same length
# and header differ only in where their variable-width values sit.
_LAYOUTS_PER_KEY: Final = 4
# Containers with more items than this, and bodies whose head (header, meta, padding
# before the first buffer) is longer than this, take the general path.
_TEMPLATE_MAX_ITEMS: Final = 64
_LAYOUT_MAX_HEAD: Final = 2048
# A thread's reusable packer is dropped after packing a meta this large: a msgpack
# packer keeps its largest buffer for ever.
_TEMPLATE_MAX_META: Final = 64 * 1024
_PLAIN_KINDS: Final = frozenset("biufcmMSUV")
# A descr string exactly as numpy's ``dtype.str`` writes it (byte order, kind, size,
# datetime unit). Anything else is refused before numpy parses it: np.dtype() accepts
# many spellings (comma lists, "O", "T", deprecated codes) we never produce.
_DESCR_STR: Final = re.compile(r"[<>|=][biufcmMSUV]\d+(?:\[\d*[A-Za-z]+\])?\Z")
# msgpack decodes ext type -1 (timestamp) itself instead of calling ext_hook; these are
# the three encodings of it. Only a meta containing one of them is checked further.
_TIMESTAMP_MARKERS: Final = re.compile(rb"\xd6\xff|\xd7\xff|\xc7\x0c\xff")

_ExtType = msgpack.ExtType
# Types msgpack packs exactly as they are (int is not: it needs a range check).
_LEAVES: Final = frozenset((str, float, bool, type(None)))


def _ext(code: int, data: bytes) -> Any:
    # ExtType.__new__ re-validates its arguments in Python (~0.3 us); ours are valid by
    # construction, and the packer only reads the two tuple fields.
    return tuple.__new__(_ExtType, (code, data))


def _ext_header(code: int, length: int) -> bytes:
    """The msgpack header of an ext value of *length* payload bytes."""
    if length in (1, 2, 4, 8, 16):
        return bytes((0xD3 + length.bit_length(), code))
    if length < 0x100:
        return bytes((0xC7, length, code))
    if length < 0x10000:
        return b"\xc8" + length.to_bytes(2, "big") + bytes((code,))
    return b"\xc9" + length.to_bytes(4, "big") + bytes((code,))


def _qualname(tp: type) -> str:
    if tp.__module__ == "builtins":
        return tp.__qualname__
    # A script is __main__ where it runs and __mp_main__ in a unit process: the user
    # knows it as __main__ (as the wire name does, see _default_name).
    module = "__main__" if tp.__module__ == "__mp_main__" else tp.__module__
    return f"{module}.{tp.__qualname__}"


def _too_large(size: int, limit: int, *, at_least: bool = False) -> MessageTooLargeError:
    what = "at least " if at_least else ""
    return MessageTooLargeError(
        f"message is {what}{size} bytes encoded, more than max_message_size={limit}; "
        f"raise the limit with the max_message_size option or the {ENV_MAX_MESSAGE_SIZE} "
        "environment variable (on both ends)"
    )


def _too_deep() -> ValueError:
    return ValueError(
        f"message nests lists/dicts/tuples/dataclasses more than {MAX_DEPTH} levels deep "
        "(or contains a reference cycle)"
    )


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


# --------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True, slots=True)
class _MessageType:
    cls: type[Any]
    name: str
    fields: tuple[str, ...]
    # msgpack ``fixarray(2)`` header + packed name: the payload is this + packed fields.
    prefix: bytes


_TYPES_BY_NAME: dict[str, _MessageType] = {}
_TYPES_BY_CLASS: dict[type[Any], _MessageType] = {}
_REGISTRY_LOCK = threading.Lock()


def _default_name(cls: type) -> str:
    module = cls.__module__
    # A script is ``__main__`` where it runs and ``__mp_main__`` where a process started
    # from it (multiprocessing's spawn, ezflow's unit processes) imports it: one script,
    # one name on the wire.
    if module == "__mp_main__":
        module = "__main__"
    return f"{module}.{cls.__qualname__}"


def register_message(cls: type[_T], *, name: str | None = None) -> type[_T]:
    """Make the dataclass *cls* encodable, under *name* on the wire, and return *cls*.

    *name* defaults to ``f"{cls.__module__}.{cls.__qualname__}"`` (a script's module
    counting as ``__main__`` also where a child process imports it as ``__mp_main__``);
    sender and receiver must register the class under the same name. The registry is
    process-global.
    Registering a class again under the same name (or with no name) is a no-op.

    Raises :class:`TypeError` if *cls* is not a dataclass or *name* is not a str, and
    :class:`ConfigurationError` if *name* is empty, if *name* is taken by another class
    (the message names both), or if *cls* is already registered under another name.
    """
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        what = _qualname(cls) if isinstance(cls, type) else f"{cls!r} (not a class)"
        raise TypeError(
            f"register_message() needs a dataclass, and {what} is not one; decorate it "
            "with @dataclasses.dataclass first"
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"message name must be a str, not {type(name).__name__}")
    if name == "":
        raise ConfigurationError(f"message name for {_qualname(cls)} must not be empty")
    with _REGISTRY_LOCK:
        existing = _TYPES_BY_CLASS.get(cls)
        if existing is not None:
            if name is None or name == existing.name:
                return cls
            raise ConfigurationError(
                f"{_qualname(cls)} is already registered as message type "
                f"{existing.name!r}; it cannot also be registered as {name!r}"
            )
        wire_name = name if name is not None else _default_name(cls)
        other = _TYPES_BY_NAME.get(wire_name)
        if other is not None:
            hint = (
                " (a different class object with the same name, e.g. from a reloaded module)"
                if _qualname(other.cls) == _qualname(cls)
                else ""
            )
            raise ConfigurationError(
                f"message type name {wire_name!r} is already taken by "
                f"{_qualname(other.cls)}; cannot register {_qualname(cls)}{hint} under it: "
                "pass another name=..."
            )
        entry = _MessageType(
            cls=cls,
            name=wire_name,
            fields=tuple(f.name for f in dataclasses.fields(cls) if f.init),
            prefix=b"\x92" + msgpack.packb(wire_name),
        )
        _TYPES_BY_NAME[wire_name] = entry
        _TYPES_BY_CLASS[cls] = entry
    return cls


def registered_messages() -> list[tuple[str, str, str]]:
    """``(wire name, module, qualname)`` of every registered class, for another process
    to find and register the same classes (a script's module is ``"__main__"``, as in
    :func:`register_message`'s default names)."""
    with _REGISTRY_LOCK:
        entries = list(_TYPES_BY_NAME.values())
    return [
        (
            entry.name,
            "__main__" if entry.cls.__module__ == "__mp_main__" else entry.cls.__module__,
            entry.cls.__qualname__,
        )
        for entry in entries
    ]


def registered_name(cls: type) -> str | None:
    """The wire name *cls* is registered under, or None."""
    entry = _TYPES_BY_CLASS.get(cls)
    return None if entry is None else entry.name


def registered_class(name: str) -> type | None:
    """The class registered under the wire name *name*, or None."""
    entry = _TYPES_BY_NAME.get(name)
    return None if entry is None else entry.cls


#: Called with the name of a message type this process has not registered, before
#: decoding gives up on it: it may register the class (the unit processes find the
#: classes their parent registered this way), or raise :class:`ProtocolError` saying why
#: it cannot. See :func:`set_unknown_type_hook`.
_unknown_type_hook: Callable[[str], None] | None = None


def set_unknown_type_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or, with None, remove) the process-wide hook that decoding calls once per
    message with a type name that is not registered, before it raises. Only the
    decoding of such a message pays for it."""
    global _unknown_type_hook
    _unknown_type_hook = hook


#: Modules whose dataclasses every process carries without registration, when the module
#: is importable: ezmsg's AxisArray and its axis classes, the message types of the whole
#: ezmsg ecosystem. A class of one of these modules is registered under its default name
#: the first time it is encoded, and the receiving process imports the module (by name:
#: ezflow does not depend on it) the first time it decodes that name.
KNOWN_MESSAGE_MODULES = ("ezmsg.util.messages.axisarray",)


def _known_module_entry(tp: type) -> _MessageType | None:
    """Register *tp* if it is a dataclass of a :data:`KNOWN_MESSAGE_MODULES` module."""
    if tp.__module__ not in KNOWN_MESSAGE_MODULES or not dataclasses.is_dataclass(tp):
        return None
    register_message(tp)
    return _TYPES_BY_CLASS.get(tp)


def _known_name_entry(name: str) -> _MessageType | None:
    """Import and register the class named *name* if it lives in a known module."""
    for module_name in KNOWN_MESSAGE_MODULES:
        if not name.startswith(module_name + "."):
            continue
        try:
            found: object = importlib.import_module(module_name)
        except ImportError:
            return None  # not installed here: the caller reports the unknown name
        for part in name[len(module_name) + 1 :].split("."):
            found = getattr(found, part, None)
        if isinstance(found, type):
            return _known_module_entry(found)
    return None


def message_fields(cls: type) -> tuple[str, ...] | None:
    """The fields the codec sends for an instance of *cls* (its ``init`` fields, in
    order), or None if *cls* is not a registered message class."""
    entry = _TYPES_BY_CLASS.get(cls)
    return None if entry is None else entry.fields


@overload
def message(cls: type[_T]) -> type[_T]: ...


@overload
def message(cls: None = None, *, name: str | None = None) -> Callable[[type[_T]], type[_T]]: ...


def message(
    cls: type[_T] | None = None, *, name: str | None = None
) -> type[_T] | Callable[[type[_T]], type[_T]]:
    """Class decorator form of :func:`register_message`: ``@message`` or
    ``@message(name="...")`` above (outside) ``@dataclass``. Same errors."""
    if cls is None:

        def decorate(inner: type[_T]) -> type[_T]:
            return register_message(inner, name=name)

        return decorate
    return register_message(cls, name=name)


# --------------------------------------------------------------------------- dtypes

# dtype -> (packed descr, whether arrays of it export a PEP 3118 buffer). Bounded: a
# program creating endless distinct structured dtypes only loses the cache.
_ENC_DTYPES: dict[np.dtype[Any], tuple[bytes, bool]] = {}
# packed descr (as received) -> dtype. Bounded because the keys come from peers.
_DEC_DTYPES: dict[bytes, np.dtype[Any]] = {}
# A message that is one ndarray (the hot case) has a body that is a fixed prefix (header,
# meta, padding), which depends only on the dtype and shape, followed by the raw data.
# Encoding: (dtype, shape) -> (prefix, body length), for arrays whose data exports a
# buffer and is not empty. Decoding: the prefix exactly as received -> (body length,
# shape, dtype), filled only after the full decoder accepted that prefix. Both are
# bounded (emptied when full), since shapes and prefixes can take endless values.
_ENC_ARRAYS: dict[tuple[np.dtype[Any], tuple[int, ...]], tuple[bytes, int]] = {}
_DEC_ARRAYS: dict[bytes, tuple[int, tuple[int, ...], np.dtype[Any]]] = {}


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


# --------------------------------------------------------------------------- messages


class EncodedMessage(NamedTuple):
    """One encoded body, as parts to hand to ``transport.writelines``.

    ``b"".join(parts)`` is the body and ``nbytes`` its length. Parts are ``bytes`` or
    1-D unsigned-byte ``memoryview`` objects; the memoryviews reference the caller's
    arrays and buffers, which must not be modified until the parts are written.
    (A named tuple, not a frozen dataclass: one is built per published message, and a
    tuple costs a third of the time to build.)
    """

    parts: list[bytes | memoryview]
    nbytes: int

    def to_bytes(self) -> bytes:
        """The whole body as one ``bytes`` object (copies every part)."""
        return b"".join(self.parts)


# Builds an EncodedMessage from a (parts, nbytes) tuple without the named tuple's
# Python-level __new__: on the per-message path of a paced publisher, with caches cold,
# that call alone costs several microseconds.
_new_encoded = tuple.__new__


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


def _too_many_buffers() -> ValueError:
    return ValueError(
        f"message holds more than {MAX_BUFFERS} out-of-band buffers (arrays, bytearrays, "
        f"memoryviews, bytes of {INLINE_BYTES_LIMIT} bytes or more); combine them into "
        "fewer arrays"
    )


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


# --------------------------------------------------------------------------- validate


def _check(obj: object, depth: int) -> None:
    """Raise what :meth:`Codec.encode` would raise for *obj*'s types, build nothing.

    Mirrors ``_Encoder.prepare`` / ``prepare_other`` check for check, in the same order.
    """
    tp = type(obj)
    if tp is str or tp is float or tp is bool or obj is None or tp is bytes:
        return
    if tp is int:
        if not _INT_MIN <= obj <= _INT_MAX:  # type: ignore[operator]
            raise _int_out_of_range(obj)  # type: ignore[arg-type]
        return
    if tp is np.ndarray:
        _check_dtype(obj.dtype)  # type: ignore[attr-defined]
        return
    entry = _TYPES_BY_CLASS.get(tp)
    if entry is not None:
        if depth >= MAX_DEPTH:
            raise _too_deep()
        name = ""
        try:
            for name in entry.fields:
                _check(getattr(obj, name), depth + 1)
        except UnregisteredTypeError as exc:  # named as _Encoder.dataclass_ext names it
            where = f"{_qualname(tp)}.{name}"
            raise UnregisteredTypeError(f"{where}: {exc}").with_traceback(
                exc.__traceback__
            ) from None
        return
    if isinstance(obj, np.generic):
        _check_dtype(obj.dtype)
        return
    if isinstance(obj, np.ndarray):
        if type(obj).__module__.startswith("numpy.ma"):
            raise _masked(obj)
        _check_dtype(obj.dtype)
        return
    if isinstance(obj, (memoryview, bytearray, bytes, float, str)):
        return
    if isinstance(obj, int):
        value = int.__int__(obj)
        if not _INT_MIN <= value <= _INT_MAX:
            raise _int_out_of_range(value)
        return
    if not isinstance(obj, (dict, list, tuple)):
        if _known_module_entry(tp) is not None:
            _check(obj, depth)  # registered just now
            return
        raise _unsupported(obj)
    if depth >= MAX_DEPTH:
        raise _too_deep()
    depth += 1
    if isinstance(obj, dict):
        for k, v in dict.items(obj):
            _check(k, depth)
            _check(v, depth)
    else:
        for x in obj:
            _check(x, depth)


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
    entry = _TYPES_BY_NAME.get(name)
    if entry is None:
        entry = _known_name_entry(name)
    if entry is None and _unknown_type_hook is not None:
        _unknown_type_hook(name)
        entry = _TYPES_BY_NAME.get(name)
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


def _dtype_from(packed: bytes) -> np.dtype[Any]:
    dt = _DEC_DTYPES.get(packed)
    return dt if dt is not None else _decode_dtype(packed)


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


def _assemble(
    meta: bytes, bufs: list[memoryview], limit: int, *, join_small: bool = False
) -> EncodedMessage:
    """The body of *meta* and *bufs* as parts; one ``bytes`` part when *join_small*, the
    body is at most ``SMALL_BODY`` bytes and holds two buffers or more (templates join
    one buffer themselves). Raises MessageTooLargeError over *limit*."""
    nbuf = len(bufs)
    if nbuf == 0:
        total = HEADER.size + len(meta)
        if total > limit:
            raise _too_large(total, limit)
        return EncodedMessage([HEADER.pack(FORMAT_VERSION, 0, 0, len(meta)) + meta], total)
    if nbuf == 1:
        buf = bufs[0]
        length = buf.nbytes
        pos = _HEADER_1BUF.size + len(meta)
        pad = -pos & (BUFFER_ALIGNMENT - 1)
        total = pos + pad + length
        if total > limit:
            raise _too_large(total, limit)
        first = _HEADER_1BUF.pack(FORMAT_VERSION, 0, 1, len(meta), length) + meta
        if length == 0:
            return EncodedMessage([first + _PADDING[pad]], total)
        return EncodedMessage([first + _PADDING[pad], buf], total)
    lengths = [b.nbytes for b in bufs]
    pos = HEADER.size + 8 * nbuf + len(meta)
    pads = []
    for length in lengths:
        pad = -pos & (BUFFER_ALIGNMENT - 1)
        pads.append(pad)
        pos += pad + length
    if pos > limit:
        raise _too_large(pos, limit)
    packed_lengths = (
        _LENGTHS[nbuf].pack(*lengths)
        if nbuf < len(_LENGTHS)
        else struct.pack(f"<{nbuf}Q", *lengths)
    )
    parts: list[bytes | memoryview] = [
        HEADER.pack(FORMAT_VERSION, 0, nbuf, len(meta)) + packed_lengths + meta + _PADDING[pads[0]]
    ]
    for i, buf in enumerate(bufs):
        if i and pads[i]:
            parts.append(_PADDING[pads[i]])
        if lengths[i]:
            parts.append(buf)
    if join_small and pos <= SMALL_BODY:
        return EncodedMessage([b"".join(parts)], pos)
    return EncodedMessage(parts, pos)


# --------------------------------------------------------------------------- templates
#
# Messages of one *shape* - a tuple, list, dict with str keys or registered dataclass,
# whose items are None, bool, int, float, str, bytes, numpy arrays or numeric numpy
# scalars, with the same container type, length, keys or field names, item types and,
# for arrays, dtype and ndim - are encoded through a cached _Template and decoded through
# a cached _Layout. Both produce exactly what the general path produces (the general
# path is the reference, and tests/test_codec_fastpaths.py checks every fast path
# against it); anything a template does not cover, or any error, goes to the general
# path, which raises what it raises.

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

    __slots__ = ("entry", "exports", "kind", "prepare")

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

    __slots__ = ("build", "check_len", "fixed", "mask", "size", "values", "values_at")

    def __init__(
        self,
        *,
        size: int,
        mask: bytes,
        fixed: bytes,
        values: struct.Struct,
        values_at: int,
        build: Callable[[Any, tuple[Any, ...]], object],
    ) -> None:
        self.size = size
        self.check_len = len(mask)
        self.mask = int.from_bytes(mask, "little")
        self.fixed = int.from_bytes(fixed, "little")
        self.values = values
        self.values_at = values_at
        self.build = build

    def decode(self, body: bytes | memoryview) -> object:
        """The message in *body* (bytes or a read-only byte memoryview of :attr:`size`
        bytes; the caller checks the length), or None if *body* does not match this
        layout or a value is invalid (the general decoder then raises)."""
        if int.from_bytes(body[: self.check_len], "little") & self.mask != self.fixed:
            return None
        try:
            return self.build(body, self.values.unpack_from(body, self.values_at))
        except Exception:  # (a str that is not UTF-8, a constructor that raises)
            return None


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

    def item(self) -> str:
        """Walk one item; return the expression that rebuilds it from ``body`` and ``v``."""
        marker = self.byte()
        pos = self.pos
        if marker <= 0x7F or marker >= 0xE0:  # fixint: the marker is the value
            self.mask[pos] = 0x80 if marker <= 0x7F else 0xE0
            self.fixed[pos] = 0x00 if marker <= 0x7F else 0xE0
            return self.value_hole("B" if marker <= 0x7F else "b", 1)
        if marker == 0xC0:
            self.skip_fixed(1)
            return "None"
        if marker in (0xC2, 0xC3):
            self.mask[pos], self.fixed[pos] = 0xFE, 0xC2
            return f"({self.value_hole('B', 1)} == 0xC3)"
        if marker in _NUMBER_CODES:
            fmt = _NUMBER_CODES[marker]
            self.skip_fixed(1)
            return self.value_hole(fmt, struct.calcsize(fmt))
        if 0xA0 <= marker <= 0xBF or marker in _STR_LENGTHS:
            if marker <= 0xBF:
                self.skip_fixed(1)
                size = marker & 0x1F
            else:
                size = self.length(_STR_LENGTHS[marker])
            return f"str({self.value_hole(f'{size}s', size)}, 'utf-8')"
        if marker in _BIN_LENGTHS:
            size = self.length(_BIN_LENGTHS[marker])
            return self.value_hole(f"{size}s", size)
        code, size = self.ext_header()
        start = self.pos
        if code == EXT_NDARRAY:
            array = _array_from_payload(self.body, start, start + size, self.body, self.spans)
            self.skip_fixed(size)
            offset = self.spans[_U32.unpack_from(self.body, start)[0]][0]
            dtype = self.constant(array.dtype)
            if array.ndim == 1 and array.dtype.itemsize:
                return f"frombuffer(body, {dtype}, {array.shape[0]}, {offset})"
            return f"ndarray({self.constant(array.shape)}, {dtype}, body, {offset})"
        if code == EXT_NPSCALAR and size >= 4:
            descr_len = _U32.unpack_from(self.body, start)[0]
            dt = _dtype_from(bytes(self.body[start + 4 : start + 4 + descr_len]))
            if dt.kind not in "biufc" or dt.itemsize != size - 4 - descr_len:
                raise _NotFlat
            self.skip_fixed(4 + descr_len)
            offset = self.pos
            self.pos += dt.itemsize  # the value's bytes are free, read in place
            return f"ndarray((), {self.constant(dt)}, body, {offset})[()]"
        raise _NotFlat

    def items(self, count: int) -> list[str]:
        if count > _TEMPLATE_MAX_ITEMS:
            raise _NotFlat
        return [self.item() for _ in range(count)]

    def fields(self) -> str:
        """Walk a map of str keys to items; return a dict display expression."""
        count = self.count(0x80, 0x8F, {0xDE: 2, 0xDF: 4})
        if count > _TEMPLATE_MAX_ITEMS:
            raise _NotFlat
        pairs = []
        for _ in range(count):
            key = self.constant(self.fixed_str())
            pairs.append(f"{key}: {self.item()}")
        return "{" + ", ".join(pairs) + "}"

    def message(self) -> str:
        """Walk the top-level container; return the expression that rebuilds it."""
        marker = self.byte()
        if 0x90 <= marker <= 0x9F or marker in (0xDC, 0xDD):
            return "[" + ", ".join(self.items(self.count(0x90, 0x9F, {0xDC: 2, 0xDD: 4}))) + "]"
        if 0x80 <= marker <= 0x8F or marker in (0xDE, 0xDF):
            return self.fields()
        code, size = self.ext_header()
        end = self.pos + size
        if code == EXT_TUPLE:
            items = self.items(self.count(0x90, 0x9F, {0xDC: 2, 0xDD: 4}))
            expr = "(" + "".join(f"{item}, " for item in items) + ")"
        elif code == EXT_DATACLASS:
            if self.byte() != 0x92:
                raise _NotFlat
            self.skip_fixed(1)
            entry = _TYPES_BY_NAME.get(self.fixed_str())
            if entry is None:
                raise _NotFlat
            expr = f"{self.constant(entry.cls)}(**{self.fields()})"
        else:
            raise _NotFlat
        if self.pos != end:
            raise _NotFlat
        return expr


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
        expr = walker.message()
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
    )


# (body length, first HEADER.size bytes) -> layouts of bodies with that length and header.
_DEC_LAYOUTS: dict[tuple[int, bytes], list[_Layout]] = {}
# The same keys -> how many bodies with that key the general decoder decoded. A layout is
# learned the 2nd, 4th, 8th... time: a stream whose bodies never repeat a key pays nothing
# for learning, and one whose bodies fit no layout (nesting) pays for a few attempts.
_DEC_SEEN: dict[tuple[int, bytes], int] = {}


# --------------------------------------------------------------------------- codec


class Codec:
    """Encodes messages into bodies and decodes bodies, within a size limit.

    A codec holds no per-message state; one instance may be shared by any number of
    tasks and threads. The dataclass registry it uses is process-global.
    """

    __slots__ = ("_last_encoded", "_last_template", "_limit", "last_array", "last_layout")

    def __init__(self, *, max_message_size: int | None = None) -> None:
        """*max_message_size*: largest body in bytes that :meth:`encode` produces and
        :meth:`decode` accepts; ``None`` means ``DEFAULT_MAX_MESSAGE_SIZE``.

        Raises :class:`ConfigurationError` if it is not a positive int.
        """
        if max_message_size is None:
            self._limit: int = DEFAULT_MAX_MESSAGE_SIZE
        else:
            self._limit = check_positive(max_message_size, setting="max_message_size")
        # The cache entry of the last top-level array encoded (prefix, body length,
        # dtype, shape), checked by identity first. Replaced whole, like last_array.
        self._last_encoded: tuple[bytes, int, np.dtype[Any], tuple[int, ...]] | None = None
        #: The layout of the last top-level array decoded: (body length, prefix, data
        #: offset, shape, dtype, item count if 1-D else -1). A ``bytes`` body of that
        #: length that starts with that prefix holds such an array at that offset, so a
        #: stream of one kind of array (the usual case) skips even the _DEC_ARRAYS
        #: lookup; :meth:`Channel.deliver_body` reads it too. Read-only outside this
        #: class; replaced whole, so threads may share it.
        self.last_array: tuple[int, bytes, int, tuple[int, ...], np.dtype[Any], int] | None = None
        # The shape template of the last container encoded through one, tried first.
        self._last_template: _Template | None = None
        #: The decode template (layout) that decoded the last container: a ``bytes``
        #: body of its ``size`` is first offered to its ``decode`` (None on no match).
        #: :meth:`Channel.deliver_body` reads it too. Replaced whole, like last_array.
        self.last_layout: _Layout | None = None

    @property
    def max_message_size(self) -> int:
        """Largest body, in bytes, this codec encodes or decodes."""
        return self._limit

    def __repr__(self) -> str:
        return f"Codec(max_message_size={self._limit})"

    # ----------------------------------------------------------------- encode

    def encode(self, obj: object) -> EncodedMessage:
        """Encode *obj* (see the module docstring for the supported types).

        Returns the body as parts; arrays and byte buffers are referenced, not copied
        (except non-contiguous ones, which are copied after the size check, and a
        message that is one array with a body of at most 4 KiB, which is one ``bytes``
        part).

        Raises :class:`UnregisteredTypeError` (a TypeError) naming the first object of
        an unsupported type, :class:`MessageTooLargeError` if the body would exceed
        ``max_message_size`` (raised before any large buffer is copied or joined), and
        :class:`ValueError` for containers nested deeper than ``MAX_DEPTH`` (or cyclic),
        more than ``MAX_BUFFERS`` out-of-band buffers, or a str that is not valid
        Unicode (lone surrogates).
        """
        tp = type(obj)
        if tp is np.ndarray:
            arr: np.ndarray[Any, Any] = obj  # type: ignore[assignment]  # (cast() is a call)
            dtype, shape = arr.dtype, arr.shape
            hit = self._last_encoded
            if hit is None or dtype is not hit[2] or shape != hit[3]:
                # Not the same kind of array as last time: the shared cache (whose key
                # costs numpy's dtype hash), remembered for next time.
                found = _ENC_ARRAYS.get((dtype, shape))
                hit = None
                if found is not None and found[1] <= self._limit:
                    hit = self._last_encoded = (found[0], found[1], dtype, shape)
            if hit is not None:
                if hit[1] <= SMALL_BODY:
                    # Small: one bytes part. Copying these few bytes costs less than
                    # exporting the array's buffer, and a sender writes one object.
                    return _new_encoded(EncodedMessage, ([hit[0] + arr.tobytes()], hit[1]))
                if arr.flags.c_contiguous:
                    try:
                        return _new_encoded(EncodedMessage, ([hit[0], arr.data.cast("B")], hit[1]))
                    except (TypeError, ValueError, NotImplementedError):  # pragma: no cover
                        pass
            return self._encode_array(arr)
        if tp in _LEAVES:
            return _assemble(msgpack.packb(obj), [], self._limit)
        template = self._last_template
        if template is not None and template.kind is tp:
            encoded = template.encode(obj, self._limit)
            if encoded is not None:
                return encoded
        # Not the shape encoded last: the shared cache (or a new template).
        template = _template_for(obj, tp)
        if template is not None:
            encoded = template.encode(obj, self._limit)
            if encoded is not None:
                self._last_template = template
                return encoded
        return _encode_general(self, obj)

    def encode_small(self, obj: object) -> bytes | None:
        """The whole body of *obj* as one ``bytes`` object when a fast path encodes it
        (a top-level array of the kind encoded last, see :meth:`small_array_body`, or a
        container of a cached shape) and the body is at most ``SMALL_BODY`` (4 KiB);
        else None (call :meth:`encode`, which raises what there is to raise).

        The body is exactly ``b"".join(encode(obj).parts)``: the paced small-message
        path of a publisher, one object for one write.
        """
        tp = type(obj)
        if tp is np.ndarray:
            return self.small_array_body(obj)  # type: ignore[arg-type]
        template = self._last_template
        if template is None or template.kind is not tp:
            return None
        encoded = template.encode(obj, min(self._limit, SMALL_BODY))
        if encoded is None:
            return None
        return encoded.parts[0]  # type: ignore[return-value]  # (one bytes part when small)

    def small_array_body(self, arr: np.ndarray[Any, Any]) -> bytes | None:
        """The whole body of *arr* as a top-level message, as one ``bytes`` object, when
        *arr* is of the kind (dtype object and shape) this codec encoded last and that
        body is at most 4 KiB; else None (call :meth:`encode`, which remembers the kind
        for next time).

        The body is exactly what :meth:`encode` would produce. This is the paced small
        message path: one check and one copy, no ``EncodedMessage``. *arr* must be a
        ``numpy.ndarray`` (the caller checks its type).
        """
        hit = self._last_encoded
        if hit is not None and arr.dtype is hit[2] and arr.shape == hit[3] and hit[1] <= SMALL_BODY:
            return hit[0] + arr.tobytes()
        return None

    def _encode_array(self, arr: np.ndarray[Any, Any]) -> EncodedMessage:
        # Same bytes as the general path, built without msgpack or an _Encoder.
        dt = arr.dtype
        info = _ENC_DTYPES.get(dt)
        if info is None:
            info = _encode_dtype(dt)
        nbytes = arr.nbytes
        if nbytes > self._limit:
            raise _too_large(nbytes, self._limit, at_least=True)
        first, total = self._array_prefix(arr.shape, info[0], nbytes)
        data = _array_bytes(arr, info[1], nbytes)
        if nbytes == 0:
            return EncodedMessage([first], total)
        if info[1]:
            if len(_ENC_ARRAYS) >= _ARRAY_CACHE_SIZE:
                _ENC_ARRAYS.clear()
            _ENC_ARRAYS[dt, arr.shape] = (first, total)
        return EncodedMessage([first, data], total)

    def _array_prefix(
        self, shape: tuple[int, ...], packed_dtype: bytes, nbytes: int
    ) -> tuple[bytes, int]:
        ndim = len(shape)
        payload = _ARRAY_HEADS[ndim].pack(0, ndim, *shape) + packed_dtype
        meta = _ext_header(EXT_NDARRAY, len(payload)) + payload
        pos = _HEADER_1BUF.size + len(meta)
        pad = -pos & (BUFFER_ALIGNMENT - 1)
        total = pos + pad + nbytes
        if total > self._limit:
            raise _too_large(total, self._limit)
        first = _HEADER_1BUF.pack(FORMAT_VERSION, 0, 1, len(meta), nbytes) + meta + _PADDING[pad]
        return first, total

    def array_prefix(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[bytes, int]:
        """The bytes that precede the data of a C-contiguous array of *shape* and
        *dtype* in its encoded body, and the body's total size.

        ``encode(arr)`` of such an array is exactly ``prefix + arr's bytes``, and the
        data starts 16-byte aligned, so a body can be laid out before the array is
        filled (a loaned buffer). Raises :class:`UnregisteredTypeError` for a dtype that
        cannot travel, ``ValueError`` for a negative or too large dimension, and
        :class:`MessageTooLargeError` when the body would exceed ``max_message_size``.
        """
        hit = _ENC_ARRAYS.get((dtype, shape))
        if hit is not None and hit[1] <= self._limit:
            return hit
        if len(shape) > _MAX_NDIM or not all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape):
            raise ValueError(
                f"shape {shape!r} is not a tuple of at most {_MAX_NDIM} ints in [0, {_MAX_DIM}]"
            )
        info = _ENC_DTYPES.get(dtype)
        if info is None:
            info = _encode_dtype(dtype)
        if not info[1]:
            raise UnregisteredTypeError(
                f"cannot lay out an array of dtype {dtype} ahead of time: it has no raw "
                "buffer export; use a numeric dtype"
            )
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self._limit:
            raise _too_large(nbytes, self._limit, at_least=True)
        layout = self._array_prefix(shape, info[0], nbytes)
        if nbytes:  # the same entries encode() makes: encoding a loan finds it cached
            if len(_ENC_ARRAYS) >= _ARRAY_CACHE_SIZE:
                _ENC_ARRAYS.clear()
            _ENC_ARRAYS[dtype, shape] = layout
        return layout

    def validate(self, obj: object) -> None:
        """Raise what :meth:`encode` would raise for *obj*'s types, without encoding.

        Same :class:`UnregisteredTypeError` and nesting-depth :class:`ValueError`
        checks as :meth:`encode`. Not checked: sizes (only encoding knows the exact
        size; :class:`MessageTooLargeError` and the buffer count) and str contents
        (lone surrogates). Costs O(1) for a top-level array, bytes, str or number, and
        one visit per element for containers.
        """
        _check(obj, 0)

    # ----------------------------------------------------------------- decode

    def decode(self, body: bytes | bytearray | memoryview | np.ndarray[Any, Any]) -> object:
        """Decode one whole body produced by :meth:`encode` (in any process).

        *body* is any C-contiguous bytes-like object (bytes, bytearray, memoryview,
        uint8 numpy array). Decoded numpy arrays and ``memoryview`` values are read-only
        views into *body* (no copy), keeping it alive; large ``bytes`` are copied once.

        Raises :class:`ProtocolError`, and nothing else, for anything wrong with the
        body: not bytes-like, larger than ``max_message_size``, truncated, trailing
        bytes, an unknown version, lengths that do not add up, malformed meta, unknown
        ext types or message type names, bad dtypes or shapes, or a registered class
        whose constructor fails (the original exception is the ``__cause__``). No
        memory is allocated for sizes the body claims but does not contain.
        """
        if type(body) is bytes:
            # A top-level array whose prefix was seen before, in a bytes body (what the
            # stream transports hand over for small messages): no memoryview needed.
            n = len(body)
            last = self.last_array
            if last is not None and n == last[0] and body.startswith(last[1]):
                if last[5] >= 0:  # 1-D: np.frombuffer costs about half as much, cold
                    return np.frombuffer(body, last[4], last[5], last[2])
                return np.ndarray(last[3], last[4], body, last[2])
            layout = self.last_layout
            if layout is not None and n == layout.size:
                message = layout.decode(body)
                if message is not None:
                    return message
            if HEADER.size <= n <= self._limit:
                nbuf, meta_len = _NBUF_META.unpack_from(body)
                if nbuf == 1:
                    array = self._cached_array(body, n, meta_len)
                    if array is not None:
                        return array
        return self._decode_translated(body)

    def _decode_translated(self, body: object, *, fast: bool = True) -> object:
        """:meth:`_decode`, raising :class:`ProtocolError` and nothing else: any other
        exception becomes one (its ``__cause__``)."""
        try:
            return self._decode(body, fast=fast)
        except ProtocolError:
            raise
        except Exception as exc:
            raise ProtocolError(f"malformed message body ({type(exc).__name__}: {exc})") from exc

    def _cached_array(
        self, body: bytes | memoryview, n: int, meta_len: int
    ) -> np.ndarray[Any, Any] | None:
        """The top-level array that the *n*-byte *body* (one buffer, *meta_len* bytes of
        meta) holds, as a read-only view into it, if its prefix was seen before (see
        ``_DEC_ARRAYS``); else None. The cached body length also rules out truncated
        bodies and trailing bytes. A hit is remembered for :meth:`decode`'s shortcut."""
        start = (HEADER.size + 8 + meta_len + BUFFER_ALIGNMENT - 1) & -BUFFER_ALIGNMENT
        prefix = bytes(body[:start])
        hit = _DEC_ARRAYS.get(prefix)
        if hit is None or hit[0] != n:
            return None
        shape, dtype = hit[1], hit[2]
        count = shape[0] if len(shape) == 1 and dtype.itemsize else -1
        self.last_array = (n, prefix, start, shape, dtype, count)
        return np.ndarray(shape, dtype, body, start)

    def _decode(self, body: object, *, fast: bool = True) -> object:
        # fast=False: the general decoder alone, no cache read or filled (the reference
        # the fast paths are tested against; see _decode_general).
        try:
            mv = memoryview(body)  # type: ignore[arg-type]
        except TypeError as exc:
            raise ProtocolError(
                f"a message body must be bytes-like, not {type(body).__name__}"
            ) from exc
        if mv.ndim != 1 or mv.format != "B":
            if not mv.c_contiguous:
                raise ProtocolError("a message body must be a contiguous buffer")
            mv = mv.cast("B")
        elif not mv.c_contiguous:
            raise ProtocolError("a message body must be a contiguous buffer")
        if not mv.readonly:
            mv = mv.toreadonly()
        n = mv.nbytes
        if n > self._limit:
            raise ProtocolError(f"message body of {n} bytes exceeds max_message_size={self._limit}")
        if n < HEADER.size:
            raise ProtocolError(f"message body of {n} bytes is shorter than its header")
        version, flags, nbuf, meta_len = HEADER.unpack_from(mv)
        if fast:
            # (a memoryview body: frames batched in one read, shared memory)
            layout = self.last_layout
            if layout is not None and n == layout.size:
                message = layout.decode(mv)
                if message is not None:
                    return message
            if nbuf == 1:
                array = self._cached_array(mv, n, meta_len)
                if array is not None:
                    return array
            key = (n, mv[: HEADER.size].tobytes())
            for layout in _DEC_LAYOUTS.get(key, ()):
                message = layout.decode(mv)
                if message is not None:
                    self.last_layout = layout
                    return message
        if version != FORMAT_VERSION:
            raise ProtocolError(
                f"message body version {version} is not supported (this build reads "
                f"version {FORMAT_VERSION})"
            )
        if flags:
            raise ProtocolError(f"unknown message body flags {flags:#x}")
        meta_start = HEADER.size + 8 * nbuf
        meta_end = meta_start + meta_len
        if meta_end > n:
            raise ProtocolError(
                f"message header claims {nbuf} buffers and {meta_len} bytes of meta, "
                f"more than the {n}-byte body holds"
            )
        spans: list[tuple[int, int]] = []
        pos = meta_end
        if nbuf:
            lengths = (
                _LENGTHS[nbuf].unpack_from(mv, HEADER.size)
                if nbuf < len(_LENGTHS)
                else struct.unpack_from(f"<{nbuf}Q", mv, HEADER.size)
            )
            for length in lengths:
                pos += -pos & (BUFFER_ALIGNMENT - 1)
                end = pos + length
                if end > n:
                    raise ProtocolError(
                        f"message buffer lengths add up to more than the {n}-byte body"
                    )
                spans.append((pos, end))
                pos = end
        if pos != n:
            raise ProtocolError(
                f"message body has {n - pos} bytes after its last buffer"
                if pos < n
                else f"message body is {pos - n} bytes short"
            )
        if fast and nbuf == 1 and meta_len >= 3:
            # Fast path for a top-level array: parse its one ext header by hand.
            marker = mv[meta_start]
            if 0xD4 <= marker <= 0xD8:
                ext_len, code, payload_start = 1 << (marker - 0xD4), mv[meta_start + 1], 2
            elif marker == 0xC7:
                ext_len, code, payload_start = mv[meta_start + 1], mv[meta_start + 2], 3
            else:
                code = 0
            if code == EXT_NDARRAY and payload_start + ext_len == meta_len:
                start = meta_start + payload_start
                array = _array_from_payload(mv, start, meta_end, mv, spans)
                if len(_DEC_ARRAYS) >= _ARRAY_CACHE_SIZE:
                    _DEC_ARRAYS.clear()
                _DEC_ARRAYS[mv[: spans[0][0]].tobytes()] = (n, array.shape, array.dtype)
                return array
        meta = mv[meta_start:meta_end]
        _refuse_timestamps(meta)
        message = _Decoder(mv, spans).unpack(meta)
        if fast and (type(message) in _LAYOUT_KINDS or type(message) in _TYPES_BY_CLASS):
            self._learn(key, mv, meta_start, meta_end, spans)
        return message

    def _learn(
        self,
        key: tuple[int, bytes],
        body: memoryview,
        meta_start: int,
        meta_end: int,
        spans: list[tuple[int, int]],
    ) -> None:
        """After the general decoder accepted *body*: learn its layout on the 2nd, 4th,
        8th... time a body with this *key* comes (see ``_DEC_SEEN``)."""
        seen = _DEC_SEEN.get(key, 0) + 1
        if seen == 1 and len(_DEC_SEEN) >= _TEMPLATE_CACHE_SIZE:
            _DEC_SEEN.clear()
        _DEC_SEEN[key] = seen
        if seen < 2 or seen & (seen - 1):
            return
        layout = _learn_layout(body, meta_start, meta_end, spans)
        if layout is None:
            return
        layouts = _DEC_LAYOUTS.get(key)
        if layouts is None:
            if len(_DEC_LAYOUTS) >= _TEMPLATE_CACHE_SIZE:
                _DEC_LAYOUTS.clear()
            layouts = _DEC_LAYOUTS[key] = []
        if len(layouts) >= _LAYOUTS_PER_KEY:
            del layouts[0]
        layouts.append(layout)
        self.last_layout = layout


_LAYOUT_KINDS: Final = frozenset((tuple, list, dict))


def _encode_general(codec: Codec, obj: object) -> EncodedMessage:
    """*obj* encoded by the general encoder alone (no cache, no template): the reference
    every encode fast path is tested against. Raises like :meth:`Codec.encode`."""
    encoder = _Encoder(codec.max_message_size)
    tree = encoder.prepare(obj, 0)
    try:
        meta = encoder.packer.pack(tree)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise _too_deep() from exc
        raise
    return _assemble(meta, encoder.bufs, codec.max_message_size)


def _decode_general(codec: Codec, body: object) -> object:
    """*body* decoded by the general decoder alone (no cache read or filled): the
    reference every decode fast path is tested against. Raises like :meth:`Codec.decode`."""
    return codec._decode_translated(body, fast=False)


#: A codec with the default limits.
DEFAULT_CODEC: Final = Codec()
