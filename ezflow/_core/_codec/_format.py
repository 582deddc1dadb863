"""The body: its byte layout, writing one from meta and buffers, reading its header.

A *body* is one byte string. Layout (all integers little endian)::

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
``EXT_TUPLE``; it is read back with ``numpy.lib.format.descr_to_dtype`` (see
:mod:`._dtypes`). Padding bytes are written as zeros and ignored on reading. Dtype
metadata is not sent.

This module writes a body from its parts (:func:`_assemble`, :func:`_array_body_prefix`)
and checks a received one up to its meta (:func:`_body_view`, :func:`_spans`); what the
meta means is :mod:`._general`'s job.
"""

from __future__ import annotations

import struct
from typing import Any, Final, NamedTuple

import msgpack

from .._config import DEFAULT_MAX_MESSAGE_SIZE, ENV_MAX_MESSAGE_SIZE
from .._exceptions import MessageTooLargeError, ProtocolError

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
#: A message whose whole body is at most this many bytes, and that takes a fast path (a
#: top-level array, or a shape template), is encoded as one ``bytes`` part: copying its
#: arrays costs less than exporting their buffers, and the sender writes one object.
SMALL_BODY: Final = 4096

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

_ExtType = msgpack.ExtType


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


# --------------------------------------------------------------------------- errors


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


def _too_many_buffers() -> ValueError:
    return ValueError(
        f"message holds more than {MAX_BUFFERS} out-of-band buffers (arrays, bytearrays, "
        f"memoryviews, bytes of {INLINE_BYTES_LIMIT} bytes or more); combine them into "
        "fewer arrays"
    )


def _malformed(exc: Exception) -> ProtocolError:
    """The ProtocolError a decoder raises for *exc*, an error that is not one (its
    ``__cause__`` is set by the caller's ``raise ... from exc``)."""
    return ProtocolError(f"malformed message body ({type(exc).__name__}: {exc})")


# --------------------------------------------------------------------------- writing


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


def _array_body_prefix(
    shape: tuple[int, ...], packed_dtype: bytes, nbytes: int, limit: int
) -> tuple[bytes, int]:
    """What precedes the *nbytes* of data of a top-level array of *shape* (its dtype
    packed as *packed_dtype*) in its body - header, meta, padding - and the body's
    length. Raises MessageTooLargeError over *limit*."""
    ndim = len(shape)
    payload = _ARRAY_HEADS[ndim].pack(0, ndim, *shape) + packed_dtype
    meta = _ext_header(EXT_NDARRAY, len(payload)) + payload
    pos = _HEADER_1BUF.size + len(meta)
    pad = -pos & (BUFFER_ALIGNMENT - 1)
    total = pos + pad + nbytes
    if total > limit:
        raise _too_large(total, limit)
    first = _HEADER_1BUF.pack(FORMAT_VERSION, 0, 1, len(meta), nbytes) + meta + _PADDING[pad]
    return first, total


# --------------------------------------------------------------------------- reading


def _body_view(body: object, limit: int) -> memoryview:
    """*body* as a read-only 1-D unsigned-byte memoryview of at least a header and at
    most *limit* bytes. Raises ProtocolError."""
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
    if n > limit:
        raise ProtocolError(f"message body of {n} bytes exceeds max_message_size={limit}")
    if n < HEADER.size:
        raise ProtocolError(f"message body of {n} bytes is shorter than its header")
    return mv


def _spans(
    mv: memoryview, version: int, flags: int, nbuf: int, meta_len: int
) -> tuple[int, int, list[tuple[int, int]]]:
    """Check the header fields (*version* ... *meta_len*, unpacked from the body *mv*,
    a view of :func:`_body_view`) against the body; return where its meta starts and
    ends and the ``(start, end)`` of each buffer. Raises ProtocolError."""
    n = len(mv)
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
                raise ProtocolError(f"message buffer lengths add up to more than the {n}-byte body")
            spans.append((pos, end))
            pos = end
    if pos != n:
        raise ProtocolError(
            f"message body has {n - pos} bytes after its last buffer"
            if pos < n
            else f"message body is {pos - n} bytes short"
        )
    return meta_start, meta_end, spans
