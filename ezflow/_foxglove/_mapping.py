"""Messages to Foxglove schemas and back: the one mapping the live server and MCAP share.

Each message gets a :class:`Mapping` (a schema and a message encoding) from
:func:`mapping_for`, chosen by what it is, in this order:

=====================================  =====================  ==========  ======================
message                                schema                 encoding    what a viewer gets
=====================================  =====================  ==========  ======================
``ndarray`` uint8 HxW, HxWx3, HxWx4    ``foxglove.RawImage``  protobuf    Image panel: ``mono8``,
``ndarray`` uint16 the same            ``foxglove.RawImage``  protobuf    ``rgb8``, ``rgba8``,
``ndarray`` float32 HxW                ``foxglove.RawImage``  protobuf    ``mono16``, ``rgb16``,
                                                                          ``rgba16``, ``32FC1``
other numeric ``ndarray`` (bool, int,  ``ezflow.Array``       json        Plot: ``.data[:]``
float; any shape)
registered dataclass (``AxisArray``)   its registered name    json        fields by name
``tuple``                              ``ezflow.Tuple``       json        ``.items[0]``...
``list``                               ``ezflow.List``        json        ``.items[0]``...
``dict`` (str keys)                    ``ezflow.Dict``        json        keys by name
``None``, bool, int, float, str        ``ezflow.Value``       json        ``.value``
``bytes``, ``bytearray``               (none)                 ``raw``     the bytes
anything else the codec carries        (none)                 ``ezflow``  nothing (MCAP only:
                                                                          ezflow's codec bytes)
=====================================  =====================  ==========  ======================

JSON values nest, exactly (:func:`to_json` / :func:`from_json` round-trip every value the
JSON rows above accept): an array is ``{"dtype", "shape", "data": [...]}`` (row-major;
at most ``FOXGLOVE_JSON_LIST_MAX`` elements, all finite) or ``{"dtype", "shape",
"base64"}`` (its little-endian bytes); a nested tuple ``{"tuple": [...]}``, a nested
dataclass its fields and ``"_type"`` (its registered name), bytes ``{"bytes_base64"}``, a
float that is not finite ``{"float": "nan" | "inf" | "-inf"}``, and a dict whose keys
look like one of those ``{"dict": {...}}``. A numpy scalar is an array of shape ``[]``.
Values JSON cannot carry exactly (complex, object or structured arrays, dicts with keys
that are not str, ints beyond 64 bits) make the message ``ezflow``-encoded.

A RawImage is written here (its protobuf is seven fields) rather than by the SDK's
``RawImage(...).encode()``, which would copy a frame three times; the tests pin both
to the same bytes. The schema comes from the SDK (``foxglove-sdk``, the extra).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import struct
import typing
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import numpy as np

from .._core._codec import Codec
from .._core._codec._registry import _entry_for_name, _known_module_entry, registered_name
from .._core._config import FOXGLOVE_JSON_LIST_MAX
from .._core._exceptions import ProtocolError

__all__ = [
    "ARRAY_SCHEMA",
    "ENCODING_EZFLOW",
    "ENCODING_JSON",
    "ENCODING_PROTOBUF",
    "ENCODING_RAW",
    "RAW_ENCODINGS",
    "RAW_IMAGE",
    "Mapping",
    "NotMappable",
    "decode_message",
    "decode_raw_image",
    "encode_message",
    "encode_raw_image",
    "from_json",
    "image_encoding",
    "mapping_for",
    "to_json",
]

ENCODING_JSON: Final = "json"
ENCODING_PROTOBUF: Final = "protobuf"
#: Raw bytes: the message is the bytes. MCAP names no encoding for them; ezflow writes
#: ``raw`` and reads any of :data:`RAW_ENCODINGS`.
ENCODING_RAW: Final = "raw"
RAW_ENCODINGS: Final = ("raw", "", "application/octet-stream", "bytes")
#: ezflow's own codec (docs/wire-format.md), for what JSON cannot carry exactly.
ENCODING_EZFLOW: Final = "ezflow"

RAW_IMAGE: Final = "foxglove.RawImage"

#: Image encodings by (dtype, channels); channels 0: an HxW array.
_IMAGE_ENCODINGS: Final[dict[tuple[str, int], str]] = {
    ("uint8", 0): "mono8",
    ("uint8", 3): "rgb8",
    ("uint8", 4): "rgba8",
    ("uint16", 0): "mono16",
    ("uint16", 3): "rgb16",
    ("uint16", 4): "rgba16",
    ("float32", 0): "32FC1",
}
_IMAGE_LAYOUTS: Final = {name: key for key, name in _IMAGE_ENCODINGS.items()}
# Foreign images ezflow also reads (same layouts under other names).
_IMAGE_LAYOUTS.update({"8UC1": ("uint8", 0), "8UC3": ("uint8", 3), "16UC1": ("uint16", 0)})

_ARRAY_JSON_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "dtype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "data": {"type": "array", "items": {"type": "number"}},
        "base64": {"type": "string", "contentEncoding": "base64"},
    },
}
ARRAY_SCHEMA: Final = "ezflow.Array"
_TUPLE_SCHEMA: Final = "ezflow.Tuple"
_LIST_SCHEMA: Final = "ezflow.List"
_DICT_SCHEMA: Final = "ezflow.Dict"
_VALUE_SCHEMA: Final = "ezflow.Value"

# Key sets that mark a tagged JSON value (a user dict with one of them is wrapped).
_TAGS: Final = (
    frozenset({"dtype", "shape", "data"}),
    frozenset({"dtype", "shape", "base64"}),
    frozenset({"tuple"}),
    frozenset({"bytes_base64"}),
    frozenset({"float"}),
    frozenset({"dict"}),
)
_NUMERIC_KINDS: Final = "biuf"  # bool, signed, unsigned, float: what JSON and Plot carry
_INT64: Final = (-(2**63), 2**64 - 1)


class NotMappable(ValueError):
    """The value has no exact JSON form (the message goes ``ezflow``-encoded)."""


class Mapping(NamedTuple):
    """How one message is written: *schema_name* (``""``: none), its *schema_encoding*
    (``jsonschema``, ``protobuf`` or ``""``) and *schema_data*, and the
    *message_encoding* of each message."""

    schema_name: str
    schema_encoding: str
    schema_data: bytes
    message_encoding: str

    @property
    def viewable(self) -> bool:
        """Whether Foxglove can show it (everything but the ``ezflow`` fallback)."""
        return self.message_encoding != ENCODING_EZFLOW


# -- images -----------------------------------------------------------------------------


def image_encoding(message: object) -> str | None:
    """The RawImage encoding of an array of image shape and dtype (see the module
    table), or None."""
    if type(message) is not np.ndarray or message.size == 0:
        return None
    if message.ndim == 2:
        channels = 0
    elif message.ndim == 3 and message.shape[2] in (3, 4):
        channels = message.shape[2]
    else:
        return None
    return _IMAGE_ENCODINGS.get((message.dtype.name, channels))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_raw_image(frame: np.ndarray[Any, Any], encoding: str, stamp_ns: int) -> bytes:
    """The protobuf of a ``foxglove.RawImage`` of *frame* (C-contiguous, little-endian:
    copied if not) stamped *stamp_ns* (unix ns). One copy of the pixels."""
    if not frame.flags.c_contiguous or frame.dtype.byteorder == ">":
        frame = np.ascontiguousarray(frame, dtype=frame.dtype.newbyteorder("<"))
    height, width = int(frame.shape[0]), int(frame.shape[1])
    step = int(frame.strides[0])
    seconds, nanos = divmod(stamp_ns, 1_000_000_000)
    stamp = b""
    if seconds:
        stamp += b"\x08" + _varint(seconds)
    if nanos:
        stamp += b"\x10" + _varint(nanos)
    head = (
        _len_field(1, stamp)
        + (b"\x15" + struct.pack("<I", width) if width else b"")
        + (b"\x1d" + struct.pack("<I", height) if height else b"")
        + _len_field(4, encoding.encode())
        + (b"\x2d" + struct.pack("<I", step) if step else b"")
        + _varint(6 << 3 | 2)
        + _varint(frame.nbytes)
    )
    return b"".join((head, frame.data.cast("B")))


def _read_varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("varint cut or too long")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def decode_raw_image(data: bytes | memoryview) -> np.ndarray[Any, Any]:
    """The array a ``foxglove.RawImage`` protobuf carries (a read-only view of *data*).
    Raises :class:`ValueError` for an image that is malformed or of an encoding
    ezflow does not read (the module table, and ``8UC1``, ``8UC3``, ``16UC1``)."""
    view = memoryview(data).cast("B")
    fields: dict[int, Any] = {}
    at = 0
    while at < len(view):
        key, at = _read_varint(view, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number], at = _read_varint(view, at)
        elif wire == 5:
            if at + 4 > len(view):
                raise ValueError("fixed32 field cut")
            fields[number] = struct.unpack_from("<I", view, at)[0]
            at += 4
        elif wire == 1:
            at += 8
        elif wire == 2:
            size, at = _read_varint(view, at)
            if at + size > len(view):
                raise ValueError(f"field {number} cut ({size} bytes announced)")
            fields[number] = view[at : at + size]
            at += size
        else:
            raise ValueError(f"protobuf wire type {wire} is not one RawImage uses")
    width, height, step = fields.get(2, 0), fields.get(3, 0), fields.get(5, 0)
    encoding = bytes(fields.get(4, b"")).decode("utf-8", "replace")
    layout = _IMAGE_LAYOUTS.get(encoding)
    if layout is None:
        raise ValueError(f"image encoding {encoding!r} is not one ezflow reads")
    dtype = np.dtype(layout[0]).newbyteorder("<")
    channels = layout[1] or 1
    pixels = fields.get(6, memoryview(b""))
    row = width * channels * dtype.itemsize
    if step < row or len(pixels) < step * max(height - 1, 0) + row:
        raise ValueError(
            f"{width}x{height} {encoding} with step {step} needs more than the "
            f"{len(pixels)} bytes of data"
        )
    shape = (height, width) if layout[1] == 0 else (height, width, channels)
    if step == row:
        flat = np.frombuffer(pixels, dtype, count=height * width * channels)
    else:  # padded rows: the rows without their padding, copied
        rows = np.lib.stride_tricks.as_strided(
            np.frombuffer(pixels, np.uint8), (height, row), (step, 1), writeable=False
        )
        flat = np.ascontiguousarray(rows).view(dtype)
    return flat.reshape(shape).astype(dtype.newbyteorder("="), copy=False)


# -- JSON -------------------------------------------------------------------------------


def _array_to_json(array: np.ndarray[Any, Any], *, raw: bool = False) -> Any:
    """The JSON form of *array*; with *raw*, the base64 form is returned as the JSON
    bytes already (no JSON encoder pass over megabytes of base64: 3x faster)."""
    if array.dtype.kind not in _NUMERIC_KINDS or array.dtype.fields is not None:
        raise NotMappable(f"a {array.dtype} array has no JSON form")
    dtype = array.dtype.newbyteorder("=") if array.dtype.byteorder == ">" else array.dtype
    shape = list(array.shape)
    if array.size <= FOXGLOVE_JSON_LIST_MAX and (
        array.dtype.kind != "f" or bool(np.isfinite(array).all())
    ):
        return {"dtype": dtype.name, "shape": shape, "data": array.ravel().tolist()}
    data = np.ascontiguousarray(array, dtype=dtype.newbyteorder("<")).data
    if raw:
        return b"".join(
            (
                b'{"dtype":"%s","shape":%s,"base64":"' % (dtype.name.encode(), str(shape).encode()),
                binascii.b2a_base64(data, newline=False),
                b'"}',
            )
        )
    return {"dtype": dtype.name, "shape": shape, "base64": base64.b64encode(data).decode()}


def to_json(value: object) -> Any:
    """*value* as a JSON-able value, exactly (module docstring). Raises
    :class:`NotMappable` for a value that has no exact JSON form."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise NotMappable(f"int {value} is beyond 64 bits")
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, np.ndarray):
        return _array_to_json(value)
    if isinstance(value, np.generic):
        return _array_to_json(np.asarray(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes_base64": base64.b64encode(value).decode()}
    if isinstance(value, tuple):
        return {"tuple": [to_json(item) for item in value]}
    if isinstance(value, list):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        out = _dict_to_json(value)
        return {"dict": out} if "_type" in out or frozenset(out) in _TAGS else out
    name = _message_name(type(value)) if dataclasses.is_dataclass(value) else None
    if name is not None:
        return {"_type": name, **_fields_to_json(value)}
    raise NotMappable(f"{type(value).__qualname__} has no JSON form")


def _message_name(cls: type) -> str | None:
    """The wire name of a registered dataclass, or of one of a module every process
    knows (``KNOWN_MESSAGE_MODULES``: ezmsg's AxisArray), registered on first use as the
    codec does."""
    name = registered_name(cls)
    if name is None:
        entry = _known_module_entry(cls)
        name = None if entry is None else entry.name
    return name


def _dict_to_json(value: dict[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise NotMappable(f"a dict key {key!r} is not a str")
        out[key] = to_json(item)
    return out


def _fields_to_json(value: Any) -> dict[str, Any]:
    return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}


def _array_from_json(value: dict[str, Any]) -> np.ndarray[Any, Any]:
    dtype = np.dtype(value["dtype"])
    if dtype.kind not in _NUMERIC_KINDS:
        raise ValueError(f"dtype {value['dtype']!r} is not a numeric dtype")
    shape = tuple(int(n) for n in value["shape"])
    if "base64" in value:
        raw = base64.b64decode(value["base64"], validate=True)
        array = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype, copy=False)
    else:
        data = [math.nan if item is None else item for item in value["data"]]
        array = np.array(data, dtype=dtype)
    return array.reshape(shape)


def from_json(value: Any) -> Any:
    """The value :func:`to_json` made *value* from. Raises :class:`ValueError` (or
    :class:`KeyError`, :class:`TypeError`) for a tagged value that is malformed, and
    :class:`ProtocolError` for a dataclass name this process does not know."""
    if isinstance(value, list):
        return [from_json(item) for item in value]
    if not isinstance(value, dict):
        return value
    keys = frozenset(value)
    if keys == _TAGS[0] or keys == _TAGS[1]:
        array = _array_from_json(value)
        return array[()] if array.ndim == 0 else array
    if keys == _TAGS[2]:
        return tuple(from_json(item) for item in value["tuple"])
    if keys == _TAGS[3]:
        return base64.b64decode(value["bytes_base64"], validate=True)
    if keys == _TAGS[4]:
        return float(value["float"])
    if keys == _TAGS[5]:
        return {key: from_json(item) for key, item in value["dict"].items()}
    if "_type" in value:
        fields = dict(value)
        return _build(str(fields.pop("_type")), fields)
    return {key: from_json(item) for key, item in value.items()}


def _build(name: str, fields: dict[str, Any]) -> object:
    entry = _entry_for_name(name)
    if entry is None:
        raise ProtocolError(
            f"message type {name!r} is not registered in this process: register the "
            "dataclass (ezflow.register_message) before reading it"
        )
    return entry.cls(**{key: from_json(item) for key, item in fields.items()})


# -- schemas ----------------------------------------------------------------------------

_PLAIN_TYPES: Final[dict[Any, dict[str, Any]]] = {
    bool: {"type": "boolean"},
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    np.ndarray: _ARRAY_JSON_SCHEMA,
}


def _schema_of_value(value: object) -> dict[str, Any]:
    if isinstance(value, (bool, int, float, str)):
        return _PLAIN_TYPES[type(value) if type(value) in _PLAIN_TYPES else float]
    if isinstance(value, (np.ndarray, np.generic)):
        return _ARRAY_JSON_SCHEMA
    if isinstance(value, list):
        return {"type": "array"}
    if isinstance(value, tuple):
        return {"type": "object", "properties": {"tuple": {"type": "array"}}}
    if isinstance(value, dict):
        return {
            "type": "object",
            "properties": {str(k): _schema_of_value(v) for k, v in value.items()},
        }
    return {}


def _dataclass_schema(cls: type) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a forward reference this module cannot resolve: no field types
        hints = {}
    properties = {}
    for f in dataclasses.fields(cls):
        if f.init:
            hint = hints.get(f.name)
            if typing.get_origin(hint) is np.ndarray:  # npt.NDArray[...]
                hint = np.ndarray
            properties[f.name] = _PLAIN_TYPES.get(hint, {})
    return {"type": "object", "title": _message_name(cls), "properties": properties}


def _json_mapping(name: str, schema: dict[str, Any]) -> Mapping:
    data = json.dumps(schema, separators=(",", ":")).encode()
    return Mapping(name, "jsonschema", data, ENCODING_JSON)


_raw_image_schema: bytes | None = None


def _raw_image_mapping() -> Mapping:
    global _raw_image_schema
    if _raw_image_schema is None:
        from foxglove.messages import RawImage  # noqa: PLC0415 - the extra, on first use

        _raw_image_schema = bytes(RawImage.get_schema().data)
    return Mapping(RAW_IMAGE, ENCODING_PROTOBUF, _raw_image_schema, ENCODING_PROTOBUF)


_EZFLOW_MAPPING: Final = Mapping("", "", b"", ENCODING_EZFLOW)
_RAW_MAPPING: Final = Mapping("", "", b"", ENCODING_RAW)


def mapping_for(message: object) -> Mapping:
    """The schema and encoding *message* is written with (module table)."""
    if isinstance(message, np.ndarray):
        if image_encoding(message) is not None:
            return _raw_image_mapping()
        if message.dtype.kind in _NUMERIC_KINDS and message.dtype.fields is None:
            return _json_mapping(ARRAY_SCHEMA, _ARRAY_JSON_SCHEMA)
        return _EZFLOW_MAPPING
    if isinstance(message, (bytes, bytearray)):
        return _RAW_MAPPING
    try:
        to_json(message)
    except NotMappable:
        return _EZFLOW_MAPPING
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        name = _message_name(type(message))
        assert name is not None  # to_json refuses unregistered ones
        return _json_mapping(name, _dataclass_schema(type(message)))
    if isinstance(message, tuple):
        items = [_schema_of_value(item) for item in message]
        return _json_mapping(
            _TUPLE_SCHEMA,
            {"type": "object", "properties": {"items": {"type": "array", "prefixItems": items}}},
        )
    if isinstance(message, list):
        return _json_mapping(
            _LIST_SCHEMA, {"type": "object", "properties": {"items": {"type": "array"}}}
        )
    if isinstance(message, dict):
        return _json_mapping(_DICT_SCHEMA, _schema_of_value(message))
    return _json_mapping(_VALUE_SCHEMA, {"type": "object", "properties": {"value": {}}})


def encode_message(
    message: object, mapping: Mapping, stamp_ns: int, codec: Codec | None = None
) -> bytes:
    """*message* in *mapping*'s encoding (a message that fits another mapping, e.g. an
    image topic that published a tuple, raises :class:`NotMappable`). *codec*: for the
    ``ezflow`` encoding (default: a new one)."""
    encoding = mapping.message_encoding
    if encoding == ENCODING_PROTOBUF:
        image = image_encoding(message)
        if image is None:
            raise NotMappable(f"a {type(message).__qualname__} is not an image")
        assert isinstance(message, np.ndarray)
        return encode_raw_image(message, image, stamp_ns)
    if encoding == ENCODING_RAW:
        if not isinstance(message, (bytes, bytearray)):
            raise NotMappable(f"a {type(message).__qualname__} is not bytes")
        return bytes(message)
    if encoding == ENCODING_EZFLOW:
        return (codec or Codec()).encode(message).to_bytes()
    if mapping.schema_name == ARRAY_SCHEMA:
        if not isinstance(message, np.ndarray) or image_encoding(message) is not None:
            raise NotMappable(f"a {type(message).__qualname__} is not a plain array")
        value: Any = _array_to_json(message, raw=True)
        if isinstance(value, bytes):
            return value
    elif mapping.schema_name == _TUPLE_SCHEMA:
        if not isinstance(message, tuple):
            raise NotMappable(f"a {type(message).__qualname__} is not a tuple")
        value = {"items": [to_json(item) for item in message]}
    elif mapping.schema_name == _LIST_SCHEMA:
        if not isinstance(message, list):
            raise NotMappable(f"a {type(message).__qualname__} is not a list")
        value = {"items": [to_json(item) for item in message]}
    elif mapping.schema_name == _DICT_SCHEMA:
        if not isinstance(message, dict):
            raise NotMappable(f"a {type(message).__qualname__} is not a dict")
        value = _dict_to_json(message)  # top level: the schema says it is a dict
    elif mapping.schema_name == _VALUE_SCHEMA:
        if isinstance(message, (tuple, list, dict, np.ndarray)) or dataclasses.is_dataclass(
            message
        ):
            raise NotMappable(f"a {type(message).__qualname__} is not a plain value")
        value = {"value": to_json(message)}
    else:
        if _message_name(type(message)) != mapping.schema_name:
            raise NotMappable(f"a {type(message).__qualname__} is not {mapping.schema_name}")
        value = _fields_to_json(message)
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def decode_message(
    schema_name: str, message_encoding: str, data: bytes | memoryview, codec: Codec | None = None
) -> object:
    """The message that :func:`encode_message` wrote as *data* (and JSON or raw bytes
    of other tools: JSON of an unknown schema decodes to its dicts and lists). Raises
    :class:`ValueError` for data that does not decode, :class:`NotMappable` for an
    encoding (or protobuf schema) ezflow does not read."""
    if message_encoding in RAW_ENCODINGS:
        return bytes(data)
    if message_encoding == ENCODING_PROTOBUF:
        if schema_name != RAW_IMAGE:
            raise NotMappable(f"protobuf schema {schema_name!r} is not one ezflow reads")
        return decode_raw_image(data)
    if message_encoding == ENCODING_EZFLOW:
        return (codec or Codec()).decode(bytes(data))
    if message_encoding != ENCODING_JSON:
        raise NotMappable(f"message encoding {message_encoding!r} is not one ezflow reads")
    value = json.loads(bytes(data))
    decode = _JSON_DECODERS.get(schema_name)
    if decode is not None:
        return decode(value)
    if isinstance(value, dict) and _entry_for_name(schema_name) is not None:
        return _build(schema_name, value)
    return from_json(value)


def _items(value: Any) -> list[Any]:
    items = value["items"]
    if not isinstance(items, list):
        raise ValueError("'items' is not a list")
    return [from_json(item) for item in items]


_JSON_DECODERS: Final[dict[str, Callable[[Any], object]]] = {
    ARRAY_SCHEMA: from_json,
    _TUPLE_SCHEMA: lambda value: tuple(_items(value)),
    _LIST_SCHEMA: _items,
    _DICT_SCHEMA: lambda value: (
        {key: from_json(item) for key, item in value.items()}
        if isinstance(value, dict)
        else from_json(value)
    ),
    _VALUE_SCHEMA: lambda value: from_json(value["value"]),
}
