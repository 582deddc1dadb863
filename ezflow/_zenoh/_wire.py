"""The bridge's wire: what one Zenoh sample carries (docs/wire-format.md is the spec).

A sample's **payload** depends on the mapping's encoding:

* ``"ezflow"`` (Zenoh encoding :data:`ENCODING`): one ezflow codec body
  (:mod:`ezflow._core._codec`), or a *batch* of several: body *i* starts at the first
  offset that is a multiple of :data:`BATCH_ALIGNMENT` at or after the end of body
  *i - 1* (zero bytes between), and the attachment lists their sizes;
* ``"raw"`` (``zenoh/bytes``): the bytes of one bytes-like message;
* ``"json"`` (``application/json``): one JSON text, UTF-8.

Its **attachment** is a msgpack map: ``"v"`` (:data:`VERSION`), ``"seq"`` (the sequence
number of the sample's first message, counted per export from 0), ``"t"`` (the export
time, unix ns), ``"drops"`` (messages the exporter dropped so far), and optionally
``"n"`` (messages in the sample, default 1), ``"sizes"`` (their body sizes, required
when ``n > 1``) and ``"end": true`` (an end marker: empty payload, ``seq`` is the number
of messages the export sent). Samples without an attachment (a plain Zenoh publisher)
are taken as one message each, without accounting.

Everything here is pure: the bridge calls it inside its per-sample guard, and a sample
that does not follow the format raises :class:`Refused`, naming the cause it is counted
under (:data:`CAUSES`).
"""

from __future__ import annotations

import json
from typing import Any, Final, NamedTuple

import msgpack

__all__ = [
    "ACK_CHUNK",
    "BATCH_ALIGNMENT",
    "CAUSES",
    "ENCODING",
    "JSON_ENCODING",
    "RAW_ENCODING",
    "VERSION",
    "Ack",
    "Meta",
    "Refused",
    "join_batch",
    "join_uniform",
    "pack_ack",
    "pack_attachment",
    "parse_ack",
    "parse_attachment",
    "split_batch",
    "to_json",
    "to_raw",
]

#: The Zenoh encodings of the three payload kinds.
ENCODING: Final = "application/x-ezflow-codec;v=1"
RAW_ENCODING: Final = "zenoh/bytes"
JSON_ENCODING: Final = "application/json"
#: The attachment format's version (its ``"v"``).
VERSION: Final = 1
#: Bodies of a batch start at payload offsets that are multiples of this.
BATCH_ALIGNMENT: Final = 16

#: Why a sample (or one message of it) was refused, as counted in ``refused``:
#: ``attachment`` - not a msgpack map of the format (or another version);
#: ``batch`` - its sizes do not add up to the payload;
#: ``body`` - an ezflow body the codec refuses (garbage, unknown message class);
#: ``json`` - not UTF-8 JSON (a json import);
#: ``key`` - its key maps to no topic (bad escapes), or the import has too many topics;
#: ``publish`` - the graph refused the message (too large for a subscriber);
#: ``encoding`` - an exported message the export's encoding cannot carry (raw: not
#: bytes-like; json: not JSON-able; ezflow: the codec refuses it);
#: ``undecodable`` - an exported topic's message that could not be decoded here;
#: ``ack`` - an acknowledgement an export received that is not of this format.
CAUSES: Final = (
    "attachment",
    "batch",
    "body",
    "json",
    "key",
    "publish",
    "encoding",
    "undecodable",
    "ack",
)
#: The last chunk of the key an importer acknowledges a key's samples on (a verbatim
#: chunk: no wildcard import matches it).
ACK_CHUNK: Final = "@ack"

_MAX_BATCH: Final = 0xFFFF  # sizes listed per sample, at most
_PADDING: Final = tuple(b"\0" * n for n in range(BATCH_ALIGNMENT))


class Refused(Exception):
    """A sample, or one message of it, that does not follow the format: *cause* (one of
    :data:`CAUSES`) and what was wrong."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(detail)
        self.cause = cause


class Meta(NamedTuple):
    """A parsed attachment."""

    seq: int
    t: int
    drops: int
    n: int
    sizes: list[int] | None
    end: bool


def pack_attachment(
    seq: int, t: int, drops: int, sizes: list[int] | None = None, *, end: bool = False
) -> bytes:
    """The attachment of a sample whose first message has sequence number *seq*; *sizes*:
    the body sizes of a batch (more than one message)."""
    meta: dict[str, Any] = {"v": VERSION, "seq": seq, "t": t, "drops": drops}
    if sizes is not None and len(sizes) > 1:
        meta["n"] = len(sizes)
        meta["sizes"] = sizes
    if end:
        meta["end"] = True
    return msgpack.packb(meta)  # type: ignore[no-any-return]


def _int(meta: dict[Any, Any], name: str, default: int | None = None) -> int:
    value = meta.get(name, default)
    if type(value) is not int or value < 0:
        raise Refused("attachment", f"attachment field {name!r} is {value!r}, not an int >= 0")
    return value


def parse_attachment(raw: bytes) -> Meta:
    """The attachment *raw* as :class:`Meta`; :class:`Refused` (``"attachment"``) when it is
    not a msgpack map of this format and version."""
    try:
        meta = msgpack.unpackb(raw, strict_map_key=False)
    except Exception as exc:  # msgpack raises several kinds (ExtraData, ValueError, ...)
        raise Refused("attachment", f"attachment is not msgpack ({type(exc).__name__})") from exc
    if type(meta) is not dict:
        raise Refused("attachment", f"attachment is a msgpack {type(meta).__name__}, not a map")
    if meta.get("v") != VERSION:
        raise Refused("attachment", f"attachment version {meta.get('v')!r}, not {VERSION}")
    n = _int(meta, "n", 1)
    sizes = meta.get("sizes")
    if n > 1 or sizes is not None:
        if (
            type(sizes) is not list
            or len(sizes) != n
            or n > _MAX_BATCH
            or not all(type(s) is int and s >= 0 for s in sizes)
        ):
            raise Refused("attachment", f"attachment of {n} messages without their {n} sizes")
    elif n == 0:
        raise Refused("attachment", "attachment of 0 messages")
    end = meta.get("end", False)
    if type(end) is not bool:
        raise Refused("attachment", f"attachment field 'end' is {end!r}, not a bool")
    return Meta(_int(meta, "seq"), _int(meta, "t", 0), _int(meta, "drops", 0), n, sizes, end)


class Ack(NamedTuple):
    """A parsed acknowledgement: importer *id* took every message before *next* (None: a
    hello, from the next one on), and takes *window* messages and *nbytes* bytes beyond;
    *bye*: it stops importing the key."""

    id: str
    next: int | None
    window: int
    nbytes: int
    bye: bool


def pack_ack(
    importer: str, next_seq: int | None, window: int, nbytes: int, *, bye: bool = False
) -> bytes:
    """An acknowledgement (see :class:`Ack` and docs/wire-format.md)."""
    ack: dict[str, Any] = {"v": VERSION, "id": importer, "next": next_seq, "window": window}
    ack["bytes"] = nbytes
    if bye:
        ack["bye"] = True
    return msgpack.packb(ack)  # type: ignore[no-any-return]


def parse_ack(raw: bytes) -> Ack:
    """*raw* as :class:`Ack`; :class:`Refused` (``"ack"``) when it is not one."""
    try:
        ack = msgpack.unpackb(raw)
    except Exception as exc:
        raise Refused("ack", f"acknowledgement is not msgpack ({type(exc).__name__})") from exc
    if type(ack) is not dict or ack.get("v") != VERSION:
        raise Refused("ack", "acknowledgement is not a version-1 msgpack map")
    importer, next_seq = ack.get("id"), ack.get("next")
    window, nbytes, bye = ack.get("window"), ack.get("bytes"), ack.get("bye", False)
    if (
        type(importer) is not str
        or not (next_seq is None or (type(next_seq) is int and next_seq >= 0))
        or type(window) is not int
        or window < 1
        or type(nbytes) is not int
        or nbytes < 1
        or type(bye) is not bool
    ):
        raise Refused("ack", f"acknowledgement with bad fields: {ack!r}"[:200])
    return Ack(importer, next_seq, window, nbytes, bye)


def join_batch(bodies: list[bytes | memoryview]) -> tuple[bytes, list[int]]:
    """The payload of a batch of *bodies* and their sizes (see the module doc)."""
    sizes = [len(b) for b in bodies]
    if len(bodies) == 1:
        body = bodies[0]
        return (body if type(body) is bytes else bytes(body)), sizes
    parts: list[bytes | memoryview] = []
    pos = 0
    for body in bodies:
        pad = -pos & (BATCH_ALIGNMENT - 1)
        if pad:
            parts.append(_PADDING[pad])
        parts.append(body)
        pos += pad + len(body)
    return b"".join(parts), sizes


def join_uniform(bodies: list[Any], limit: int) -> tuple[bytes, list[int]] | None:
    """:func:`join_batch` of *bodies* when they are all ``bytes`` of one size (a stream
    of one kind) and their payload holds at most *limit* bytes, in one join - the
    padding between each two is the same, as :func:`split_batch`'s one-size path reads
    it; else None (then the general packing decides)."""
    count = len(bodies)
    if not count or set(map(type, bodies)) != {bytes}:
        return None
    sizes = list(map(len, bodies))
    size = sizes[0]
    pad = -size & (BATCH_ALIGNMENT - 1)
    if sizes.count(size) != count or count * (size + pad) - pad > limit:
        return None
    return _PADDING[pad].join(bodies), sizes


def split_batch(payload: bytes, sizes: list[int], small: int = 0) -> list[bytes | memoryview]:
    """The bodies of a batch *payload* with these *sizes*: those of at most *small* bytes
    as ``bytes`` of their own (a copy: a small body decodes faster from bytes than from a
    view, and does not hold the whole payload), the others as views (no copy);
    :class:`Refused` (``"batch"``) when they do not add up to the payload."""
    count = len(sizes)
    first = sizes[0] if count else 0
    if 0 < first <= small and sizes.count(first) == count:
        # One size (a stream of one kind): slices at a fixed stride, in one comprehension.
        stride = first + (-first & (BATCH_ALIGNMENT - 1))
        if (count - 1) * stride + first == len(payload):
            return [payload[pos : pos + first] for pos in range(0, count * stride, stride)]
    view = memoryview(payload)
    bodies: list[bytes | memoryview] = []
    pos = 0
    for size in sizes:
        pos += -pos & (BATCH_ALIGNMENT - 1)
        bodies.append(payload[pos : pos + size] if size <= small else view[pos : pos + size])
        pos += size
    if pos != len(payload):
        raise Refused(
            "batch",
            f"batch of {len(sizes)} bodies needs {pos} bytes, the payload has {len(payload)}",
        )
    return bodies


def to_raw(message: object) -> bytes:
    """The bytes of a bytes-like *message* (bytes, bytearray, memoryview, a contiguous
    array); :class:`Refused` (``"encoding"``) for anything else."""
    if type(message) is bytes:
        return message
    try:
        view = memoryview(message)  # type: ignore[arg-type]
    except TypeError:
        raise Refused(
            "encoding", f"a raw export takes bytes-like messages, not {type(message).__name__}"
        ) from None
    if not view.c_contiguous:
        raise Refused("encoding", "a raw export takes contiguous buffers")
    return view.tobytes()


def to_json(message: object) -> bytes:
    """*message* as compact UTF-8 JSON; :class:`Refused` (``"encoding"``) when it is not
    JSON-able (arrays, bytes, NaN are not)."""
    try:
        return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise Refused("encoding", f"a json export cannot carry this message: {exc}") from None
