"""Message codec: Python objects <-> self-describing byte bodies, numpy data zero-copy.

A *body* is one byte string (its layout: :mod:`._format`). :meth:`Codec.encode` returns
it as a list of parts (:class:`EncodedMessage`) so large buffers are handed to
``transport.writelines`` without being joined; :meth:`Codec.decode` takes the whole body
back and builds numpy arrays and byte buffers as read-only views into it (no copy).

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
  fields are recomputed by the constructor); see :mod:`._registry`.

Buffers are referenced, not copied, by :meth:`Codec.encode`: do not modify an array or
bytearray until its message has been written. (A message that takes a fast path and
whose body is at most ``SMALL_BODY``, 4 KiB, is copied into one ``bytes`` part: that
costs less than referencing it, and the sender writes one object.)

One module per job:

- :mod:`._format`: the body layout, writing a body, checking a received one's header;
- :mod:`._registry`: registered message classes and their wire names;
- :mod:`._dtypes`: dtype descriptions, an array's raw bytes, numpy ext payloads;
- :mod:`._general`: the general encoder, validator and decoder - the reference;
- :mod:`._templates`: encode templates, the fast path for messages of one shape;
- :mod:`._layouts`: decode layouts learned from bodies the general decoder accepted;
- here: :class:`Codec`, its top-level array caches and its per-stream hints.

Fast paths. Every fast path produces exactly the general path's bytes and objects, or
hands the message to it (which raises what there is to raise);
tests/test_codec_fastpaths.py checks that (``_encode_general``, ``_decode_general``):

- a top-level array: the body prefix cached per (dtype, shape) on both sides
  (``_ENC_ARRAYS``, ``_DEC_ARRAYS``), :meth:`Codec._small_array_body`,
  :meth:`Codec._array_prefix` (a loan's body laid out ahead);
- a shape (:mod:`._templates` on encoding, :mod:`._layouts` on decoding);
- a relay's batch of bodies of one stream (:meth:`Codec._decode_many`): the layout
  decoded last, over every body in one C loop.

Per-stream hints. On top of those process-wide caches a :class:`Codec` remembers the
kind of message it encoded and decoded last (the array kind, the shape template, the
layout) and tries that first: a stream mostly repeats one kind. So that streams do not
overwrite each other's hints, every publisher's outlet and every channel works with its
own copy (:meth:`Codec._for_stream`); the copy shares the caches and the limit.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Callable
from itertools import repeat
from typing import Any, Final

import msgpack
import numpy as np

from .._config import DEFAULT_MAX_MESSAGE_SIZE, check_positive
from .._exceptions import ProtocolError, UnregisteredTypeError
from ._dtypes import _ENC_DTYPES, _array_bytes, _array_from_payload, _encode_dtype
from ._format import (
    _MAX_DIM,
    _MAX_NDIM,
    _NBUF_META,
    BUFFER_ALIGNMENT,
    EXT_NDARRAY,
    HEADER,
    INLINE_BYTES_LIMIT,
    MAX_DEPTH,
    SMALL_BODY,
    EncodedMessage,
    _array_body_prefix,
    _assemble,
    _body_view,
    _malformed,
    _new_encoded,
    _spans,
    _too_large,
)
from ._general import _LEAVES, _SCALAR_KINDS, _check, _decode_meta
from ._general import _decode_general as _general_decode
from ._general import _encode_general as _general_encode
from ._layouts import _DEC_LAYOUTS, _LAYOUT_KINDS, _Layout, _learn
from ._registry import (
    _TYPES_BY_CLASS,
    KNOWN_MESSAGE_MODULES,
    message,
    message_fields,
    register_message,
    registered_class,
    registered_messages,
    registered_name,
    set_unknown_type_hook,
)
from ._templates import _compiled_check_for, _Template, _template_for

__all__ = [
    "DEFAULT_CODEC",
    "HEADER",
    "INLINE_BYTES_LIMIT",
    "KNOWN_MESSAGE_MODULES",
    "MAX_DEPTH",
    "SMALL_BODY",
    "Codec",
    "EncodedMessage",
    "message",
    "message_fields",
    "register_message",
    "registered_class",
    "registered_messages",
    "registered_name",
    "set_unknown_type_hook",
]

# Entries of each top-level array cache (see ``_ENC_ARRAYS``); a full cache is emptied.
_ARRAY_CACHE_SIZE: Final = 256
# Codec.validate's general checks, after its compiled hint missed (another shape) or
# no template covered the shape, before it looks for the next shape's template: a
# stream of one shape is learned again at once after a change of shape; one whose
# shapes no template covers, or that alternates, pays the lookup once in 17 messages.
_RELEARN_CHECK_AFTER: Final = 16
# A message that is one ndarray (the hot case) has a body that is a fixed prefix (header,
# meta, padding), which depends only on the dtype and shape, followed by the raw data.
# Encoding: (dtype, shape) -> (prefix, body length), for arrays whose data exports a
# buffer and is not empty. Decoding: the prefix exactly as received -> (body length,
# shape, dtype), filled only after the full decoder accepted that prefix. Both are
# bounded (emptied when full), since shapes and prefixes can take endless values.
_ENC_ARRAYS: dict[tuple[np.dtype[Any], tuple[int, ...]], tuple[bytes, int]] = {}
_DEC_ARRAYS: dict[bytes, tuple[int, tuple[int, ...], np.dtype[Any]]] = {}


def _deprecated(old: str, instead: str) -> None:
    warnings.warn(
        f"Codec.{old} is internal and deprecated (it goes away in the next release): {instead}",
        DeprecationWarning,
        stacklevel=3,
    )


class Codec:
    """Encodes messages into bodies and decodes bodies, within a size limit.

    A codec holds no per-message state; one instance may be shared by any number of
    tasks and threads. The dataclass registry it uses is process-global. It remembers
    the kind of message it encoded and decoded last, to try that first (a hint only:
    any kind is encoded and decoded right).
    """

    __slots__ = (
        "_last_array",
        "_last_checked",
        "_last_encoded",
        "_last_layout",
        "_last_template",
        "_learn_check_in",
        "_limit",
    )

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
        # dtype, shape), checked by identity first. Replaced whole, like _last_array.
        self._last_encoded: tuple[bytes, int, np.dtype[Any], tuple[int, ...]] | None = None
        # The layout of the last top-level array decoded: (body length, prefix, data
        # offset, shape, dtype, item count if 1-D else -1). A ``bytes`` body of that
        # length that starts with that prefix holds such an array at that offset, so a
        # stream of one kind of array (the usual case) skips even the _DEC_ARRAYS
        # lookup; Channel.deliver_body reads it too. Replaced whole, so threads may share
        # it.
        self._last_array: tuple[int, bytes, int, tuple[int, ...], np.dtype[Any], int] | None = None
        # The shape template of the last container encoded through one, tried first.
        self._last_template: _Template | None = None
        # The decode template (layout) that decoded the last container: a ``bytes`` body
        # of its ``size`` is first offered to its ``decode`` (None on no match).
        # Channel.deliver_body reads it too. Replaced whole, like _last_array.
        self._last_layout: _Layout | None = None
        # validate's hint: (type, compiled check) of the container shape it checked
        # last, tried first; and how many general checks to run before learning another
        # (see validate: a stream whose shapes no template covers, or alternate, pays
        # the learning once in _RELEARN_CHECK_AFTER + 1 messages, not every one).
        self._last_checked: tuple[type, Callable[[Any], bool]] | None = None
        self._learn_check_in = 0

    @property
    def max_message_size(self) -> int:
        """Largest body, in bytes, this codec encodes or decodes."""
        return self._limit

    def __repr__(self) -> str:
        return f"Codec(max_message_size={self._limit})"

    def _for_stream(self) -> Codec:
        """A codec like this one (same class and limit, the same process-wide caches)
        with hints of its own: what one stream (an outlet, a channel) encodes or decodes
        does not displace another stream's last kind."""
        return type(self)(max_message_size=self._limit)

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
        return _general_encode(obj, self._limit)

    def _encode_small(self, obj: object) -> bytes | None:
        """The whole body of *obj* as one ``bytes`` object when a fast path encodes it
        (a top-level array of the kind encoded last, see :meth:`_small_array_body`, or
        a container of a cached shape) and the body is at most ``SMALL_BODY`` (4 KiB);
        else None (call :meth:`encode`, which raises what there is to raise).

        The body is exactly ``b"".join(encode(obj).parts)``: the paced small-message
        path of a publisher, one object for one write.
        """
        tp = type(obj)
        if tp is np.ndarray:
            return self._small_array_body(obj)  # type: ignore[arg-type]
        template = self._last_template
        if template is None or template.kind is not tp:
            return None
        return template.encode_small(obj, self._limit)

    def _small_array_body(self, arr: np.ndarray[Any, Any]) -> bytes | None:
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
        first, total = _array_body_prefix(arr.shape, info[0], nbytes, self._limit)
        data = _array_bytes(arr, info[1], nbytes)
        if nbytes == 0:
            return EncodedMessage([first], total)
        if info[1]:
            if len(_ENC_ARRAYS) >= _ARRAY_CACHE_SIZE:
                _ENC_ARRAYS.clear()
            _ENC_ARRAYS[dt, arr.shape] = (first, total)
        return EncodedMessage([first, data], total)

    def _array_prefix(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[bytes, int]:
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
        layout = _array_body_prefix(shape, info[0], nbytes, self._limit)
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

        Where the C extension is active, a container of the shape validated last (a
        shape an encode template covers: flat, at most one array) is checked in one
        compiled pass (``_speedups.Template.check``, pinned to the general check by
        tests/test_speedups.py): a publisher whose links are all local validates every
        message, and the general check costs about 0.8 µs a 4-item tuple.
        """
        tp = type(obj)
        if tp in _SCALAR_KINDS:  # (checked in O(1), no template)
            _check(obj, 0)
            return
        hit = self._last_checked
        if hit is not None and hit[0] is tp and hit[1](obj):
            return
        _check(obj, 0)
        if self._learn_check_in:
            self._learn_check_in -= 1
            return
        self._learn_check_in = _RELEARN_CHECK_AFTER
        self._last_checked = _compiled_check_for(obj)

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
            last = self._last_array
            if last is not None and n == last[0] and body.startswith(last[1]):
                if last[5] >= 0:  # 1-D: np.frombuffer costs about half as much, cold
                    return np.frombuffer(body, last[4], last[5], last[2])
                return np.ndarray(last[3], last[4], body, last[2])
            layout = self._last_layout
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
        try:
            return self._decode(body)
        except ProtocolError:
            raise
        except Exception as exc:
            raise _malformed(exc) from exc

    def _decode_many(self, bodies: list[Any]) -> list[object]:
        """:meth:`decode` of each of *bodies*, in order (a relay's batch): the same
        objects, and the same :class:`ProtocolError` for the first body that is wrong
        (the bodies before it are decoded, and lost with the error: decode one by one to
        keep them).

        A batch of one stream - ``bytes`` bodies of one size, the layout this codec
        decoded last, no top-level array hinted - is decoded by that layout in one C
        loop; a body the layout does not take is decoded by :meth:`decode` in its place
        (tests/test_codec_fastpaths.py pins this to :meth:`decode` of each)."""
        layout = self._last_layout
        if (
            layout is not None
            and self._last_array is None
            and bodies
            and set(map(type, bodies)) == {bytes}
            and set(map(len, bodies)) == {layout.size}
        ):
            decoded = list(map(layout.decode, bodies))
            if not any(map(operator.is_, decoded, repeat(None))):
                return decoded
            return [
                self.decode(body) if message is None else message
                for message, body in zip(decoded, bodies, strict=True)
            ]
        return [self.decode(body) for body in bodies]

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
        self._last_array = (n, prefix, start, shape, dtype, count)
        return np.ndarray(shape, dtype, body, start)

    def _decode(self, body: object) -> object:
        """:meth:`decode` past its ``bytes`` shortcuts: the general decoder's steps, with
        the fast paths (hints, the array and layout caches) taken between them and the
        caches filled after it. Raises ProtocolError, or anything (the caller wraps)."""
        mv = _body_view(body, self._limit)
        n = len(mv)
        version, flags, nbuf, meta_len = HEADER.unpack_from(mv)
        # (a memoryview body: frames batched in one read, shared memory)
        layout = self._last_layout
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
                self._last_layout = layout
                return message
        meta_start, meta_end, spans = _spans(mv, version, flags, nbuf, meta_len)
        if nbuf == 1 and meta_len >= 3:
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
        message = _decode_meta(mv, meta_start, meta_end, spans)
        if type(message) in _LAYOUT_KINDS or type(message) in _TYPES_BY_CLASS:
            learned = _learn(key, mv, meta_start, meta_end, spans)
            if learned is not None:
                self._last_layout = learned
        return message

    # ----------------------------------------------------------------- deprecated

    @property
    def last_array(self) -> tuple[int, bytes, int, tuple[int, ...], np.dtype[Any], int] | None:
        """Deprecated: an internal hint (see ``Codec._last_array``)."""
        _deprecated("last_array", "nothing replaces it")
        return self._last_array

    @property
    def last_layout(self) -> _Layout | None:
        """Deprecated: an internal hint (see ``Codec._last_layout``)."""
        _deprecated("last_layout", "nothing replaces it")
        return self._last_layout

    def encode_small(self, obj: object) -> bytes | None:
        """Deprecated: use ``encode(obj)`` (a small body is one ``bytes`` part)."""
        _deprecated("encode_small", "use encode(obj); a small body is its one bytes part")
        return self._encode_small(obj)

    def small_array_body(self, arr: np.ndarray[Any, Any]) -> bytes | None:
        """Deprecated: use ``encode(arr)`` (a small body is one ``bytes`` part)."""
        _deprecated("small_array_body", "use encode(arr); a small body is its one bytes part")
        return self._small_array_body(arr)

    def array_prefix(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[bytes, int]:
        """Deprecated: use ``Publisher.loan`` to fill an array in place."""
        _deprecated("array_prefix", "use Publisher.loan() to fill an array in place")
        return self._array_prefix(shape, dtype)


def _encode_general(codec: Codec, obj: object) -> EncodedMessage:
    """*obj* encoded by the general encoder alone (no cache, no template): the reference
    every encode fast path is tested against. Raises like :meth:`Codec.encode`."""
    return _general_encode(obj, codec.max_message_size)


def _decode_general(codec: Codec, body: object) -> object:
    """*body* decoded by the general decoder alone (no cache read or filled): the
    reference every decode fast path is tested against. Raises like :meth:`Codec.decode`."""
    return _general_decode(body, codec.max_message_size)


#: A codec with the default limits.
DEFAULT_CODEC: Final = Codec()
