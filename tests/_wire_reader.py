"""A plain Zenoh reader of ezflow exports, written from docs/wire-format.md alone.

``python tests/_wire_reader.py ROUTER KEY COUNT``: subscribes to KEY through the Zenoh
router at ROUTER, decodes COUNT messages (batches split) with nothing but zenoh-python,
msgpack and numpy, and prints one JSON line per message: the message made plain
(``{"tuple": [...]}``, ``{"ndarray": descr, "shape": [...], "data": [...]}``,
``{"dataclass": name, "fields": {...}}``, ``{"bytes": hex}``), its sequence number, and
finally ``{"ezflow_imported": false}``. It must never import ezflow.
"""

from __future__ import annotations

import json
import queue
import struct
import sys
from typing import Any

import msgpack
import numpy as np
import zenoh
from numpy.lib.format import descr_to_dtype


def align16(x: int) -> int:
    return (x + 15) & ~15


def descr_hook(code: int, data: bytes) -> Any:  # tuples inside a structured descr
    assert code == 1
    return tuple(msgpack.unpackb(data, ext_hook=descr_hook))


def dtype_of(packed: bytes) -> np.dtype[Any]:
    return descr_to_dtype(msgpack.unpackb(packed, ext_hook=descr_hook))


def decode_body(body: bytes) -> Any:
    """Section 3: header, buffer lengths, meta, 16-aligned buffers."""
    version, flags, nbuf, meta_len = struct.unpack_from("<BBHI", body, 0)
    assert version == 1 and flags == 0
    lengths = struct.unpack_from(f"<{nbuf}Q", body, 8)
    meta_start = 8 + 8 * nbuf
    pos = meta_start + meta_len
    buffers = []
    for length in lengths:
        pos = align16(pos)
        buffers.append(body[pos : pos + length])
        pos += length
    assert pos == len(body)

    def ext_hook(code: int, data: bytes) -> Any:
        if code == 1:  # tuple
            return tuple(msgpack.unpackb(data, ext_hook=ext_hook, strict_map_key=False))
        if code == 2:  # ndarray: u32 buffer, u8 ndim, ndim x u64 shape, descr
            index, ndim = struct.unpack_from("<IB", data, 0)
            shape = struct.unpack_from(f"<{ndim}Q", data, 5)
            dtype = dtype_of(data[5 + 8 * ndim :])
            return np.frombuffer(buffers[index], dtype).reshape(shape)
        if code == 3:  # numpy scalar: u32 descr length, descr, raw value
            (length,) = struct.unpack_from("<I", data, 0)
            dtype = dtype_of(data[4 : 4 + length])
            return np.frombuffer(data[4 + length :], dtype)[0]
        if code in (4, 5):  # bytes, bytearray/memoryview: u32 buffer index
            return bytes(buffers[struct.unpack_from("<I", data, 0)[0]])
        if code == 6:  # dataclass: [name, {field: value}]
            name, fields = msgpack.unpackb(data, ext_hook=ext_hook, strict_map_key=False)
            return {"dataclass": name, "fields": fields}
        raise ValueError(f"unknown ext type {code}")

    meta = body[meta_start : meta_start + meta_len]
    return msgpack.unpackb(meta, ext_hook=ext_hook, strict_map_key=False)


def plain(value: Any) -> Any:
    """A decoded value as JSON-able data."""
    if isinstance(value, tuple):
        return {"tuple": [plain(v) for v in value]}
    if isinstance(value, np.ndarray):
        return {"ndarray": value.dtype.str, "shape": list(value.shape), "data": value.tolist()}
    if isinstance(value, np.generic):
        return {"scalar": value.dtype.str, "value": value.item()}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        if "dataclass" in value and "fields" in value:
            return {"dataclass": value["dataclass"], "fields": plain(value["fields"])}
        return {str(k): plain(v) for k, v in value.items()}
    return value


def messages(sample: Any) -> list[tuple[int | None, Any]]:
    """Sections 1 and 2: the attachment, then one body or a batch of them."""
    payload = sample.payload.to_bytes()
    meta = {} if sample.attachment is None else msgpack.unpackb(sample.attachment.to_bytes())
    if meta.get("end"):
        return []
    assert meta.get("v", 1) == 1
    seq = meta.get("seq")
    n = meta.get("n", 1)
    if n == 1:
        return [(seq, decode_body(payload))]
    out, end = [], 0
    for i, size in enumerate(meta["sizes"]):
        start = align16(end)
        out.append((None if seq is None else seq + i, decode_body(payload[start : start + size])))
        end = start + size
    assert end == len(payload)
    return out


def main() -> None:
    router, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config = zenoh.Config()
    config.insert_json5("mode", '"client"')
    config.insert_json5("connect/endpoints", json.dumps([router]))
    config.insert_json5("scouting/multicast/enabled", "false")
    samples: queue.Queue[Any] = queue.Queue()
    with zenoh.open(config) as session:
        session.declare_subscriber(key, samples.put)
        print(json.dumps({"ready": True}), flush=True)
        done = 0
        while done < count:
            decoded = messages(samples.get(timeout=30))
            for seq, message in decoded:
                line = {"seq": seq, "batch": len(decoded), "message": plain(message)}
                print(json.dumps(line), flush=True)
                done += 1
    print(json.dumps({"ezflow_imported": "ezflow" in sys.modules}), flush=True)


if __name__ == "__main__":
    main()
