"""The body layout (ezflow._core._codec._format): bodies built by hand from the documented
layout decode, and every malformed body - truncated, extended, mutated, random, claiming
huge sizes, not bytes-like - raises ProtocolError and nothing else."""

from __future__ import annotations

import struct
import tracemalloc

import msgpack
import numpy as np
import pytest
from _codec_cases import (
    Frozen,
    Point,
    array_payload,
    decode_or_protocol_error,
    ext,
    make_body,
    packed_descr,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from ezflow._core._codec import DEFAULT_CODEC, HEADER
from ezflow._core._codec._format import (
    BUFFER_ALIGNMENT,
    EXT_BUFFER,
    EXT_BYTES,
    EXT_DATACLASS,
    EXT_NDARRAY,
    EXT_NPSCALAR,
    EXT_TUPLE,
    FORMAT_VERSION,
)
from ezflow._core._exceptions import ProtocolError


def test_body_layout() -> None:
    arr = np.arange(3, dtype="<u2")
    body = DEFAULT_CODEC.encode(arr).to_bytes()
    version, flags, nbuf, meta_len = HEADER.unpack_from(body)
    assert (version, flags, nbuf) == (FORMAT_VERSION, 0, 1)
    (length,) = struct.unpack_from("<Q", body, HEADER.size)
    assert length == 6
    meta_end = HEADER.size + 8 + meta_len
    meta = msgpack.unpackb(body[HEADER.size + 8 : meta_end])
    assert isinstance(meta, msgpack.ExtType) and meta.code == EXT_NDARRAY
    index, ndim, dim = struct.unpack_from("<IBQ", meta.data)
    assert (index, ndim, dim) == (0, 1, 3)
    assert msgpack.unpackb(meta.data[13:]) == "<u2"
    start = meta_end + (-meta_end % BUFFER_ALIGNMENT)
    assert body[meta_end:start] == b"\0" * (start - meta_end)
    assert body[start:] == arr.tobytes()
    # A body built by hand from the documented layout decodes the same way.
    again = make_body(msgpack.packb(meta), [arr.tobytes()])
    assert again == body


def test_hand_built_bodies_of_each_ext_kind() -> None:
    descr = packed_descr("<f4")
    data = np.arange(4, dtype="<f4").tobytes()
    meta = msgpack.packb(
        [
            ext(EXT_TUPLE, msgpack.packb([1, "a"])),
            ext(EXT_NDARRAY, array_payload(0, (2, 2), descr)),
            ext(EXT_NPSCALAR, struct.pack("<I", len(descr)) + descr + data[:4]),
            ext(EXT_BYTES, struct.pack("<I", 1)),
            ext(EXT_BUFFER, struct.pack("<I", 1)),
            ext(EXT_DATACLASS, msgpack.packb(["tests.codec.Point", {"x": 1.0, "y": 2.0}])),
        ]
    )
    out = DEFAULT_CODEC.decode(make_body(meta, [data, b"raw"]))
    assert isinstance(out, list)
    assert out[0] == (1, "a")
    assert out[1].shape == (2, 2) and out[1].dtype == np.float32
    assert out[2] == np.float32(0.0) and type(out[2]) is np.float32
    assert out[3] == b"raw" and type(out[3]) is bytes
    assert out[4] == b"raw" and type(out[4]) is memoryview
    assert out[5] == Point(1.0, 2.0)


# --------------------------------------------------------------------------- malformed input


VALID_OBJECTS: list[object] = [
    None,
    "hello",
    [1, 2.5, None, True],
    {"a": (1, 2), (3, 4): b"x"},
    np.arange(5.0),
    np.zeros((2, 0)),
    np.array(7, dtype=">i2"),
    {"t": 1.0, "data": np.arange(4, dtype=np.float32), "name": "n", "raw": bytearray(b"ab")},
    [np.int16(3), np.datetime64("2020-01-01"), b"y" * 1100],
    Frozen("f", Point(1.0, 2.0), ("t",)),
    np.zeros(2, dtype=[("a", "<i4"), ("b", "S3", (2,))]),
]


VALID_BODIES = [DEFAULT_CODEC.encode(o).to_bytes() for o in VALID_OBJECTS]


@pytest.mark.parametrize("body", VALID_BODIES, ids=range(len(VALID_BODIES)))
def test_every_truncation_and_extension_is_protocol_error(body: bytes) -> None:
    DEFAULT_CODEC.decode(body)
    for cut in range(len(body)):
        with pytest.raises(ProtocolError):
            DEFAULT_CODEC.decode(body[:cut])
    for extra in (b"\0", b"x" * 17):
        with pytest.raises(ProtocolError):
            DEFAULT_CODEC.decode(body + extra)


@pytest.mark.parametrize("body", VALID_BODIES, ids=range(len(VALID_BODIES)))
def test_single_byte_mutations(body: bytes) -> None:
    # Bodies with a 1100-byte buffer: mutate the interesting head only.
    for pos in range(min(len(body), 200)):
        for value in {body[pos] ^ 0x01, body[pos] ^ 0x80, 0x00, 0xFF, 0x7F}:
            mutated = bytearray(body)
            mutated[pos] = value
            decode_or_protocol_error(bytes(mutated))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    decode_or_protocol_error(data)


@settings(max_examples=500, deadline=None)
@given(
    st.integers(0, 3),
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(0, 2**64 - 1), max_size=3),
    st.binary(max_size=100),
)
def test_random_bodies_behind_a_plausible_header(
    nbuf: int, meta_len: int, lengths: list[int], rest: bytes
) -> None:
    head = HEADER.pack(FORMAT_VERSION, 0, nbuf, meta_len) + struct.pack(
        f"<{len(lengths)}Q", *lengths
    )
    decode_or_protocol_error(head + rest)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VALID_BODIES), st.data())
def test_random_edits_of_valid_bodies(body: bytes, data: st.DataObject) -> None:
    mutated = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(body) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    decode_or_protocol_error(bytes(mutated))


def test_huge_claims_allocate_nothing() -> None:
    claims = [
        HEADER.pack(FORMAT_VERSION, 0, 0xFFFF, 0),
        HEADER.pack(FORMAT_VERSION, 0, 0, 0xFFFFFFFF) + b"\x90",
        HEADER.pack(FORMAT_VERSION, 0, 1, 1) + struct.pack("<Q", 2**64 - 1) + b"\xc0",
        HEADER.pack(FORMAT_VERSION, 0, 2, 1) + struct.pack("<2Q", 2**63, 2**63) + b"\xc0",
        # msgpack array/str/bin/map headers claiming 2**32-1 items.
        make_body(b"\xdd\xff\xff\xff\xff"),
        make_body(b"\xdb\xff\xff\xff\xff"),
        make_body(b"\xc6\xff\xff\xff\xff"),
        make_body(b"\xdf\xff\xff\xff\xff"),
        make_body(b"\xc9\xff\xff\xff\xff\x02"),
        # An array claiming 2**40 float64 items from an 8-byte buffer.
        make_body(
            msgpack.packb(ext(EXT_NDARRAY, array_payload(0, (2**40,), packed_descr("<f8")))),
            [b"\0" * 8],
        ),
        # Zero-size dtype claiming an enormous shape.
        make_body(
            msgpack.packb(ext(EXT_NDARRAY, array_payload(0, (2**64 - 1, 0), packed_descr("<f8")))),
            [b""],
        ),
        make_body(
            msgpack.packb(ext(EXT_NDARRAY, array_payload(0, (2**63, 2**63), packed_descr("|V0")))),
            [b""],
        ),
        make_body(
            msgpack.packb(ext(EXT_NDARRAY, array_payload(0, (2**62,), packed_descr("|V0")))), [b""]
        ),
    ]
    tracemalloc.start()
    try:
        for body in claims:
            with pytest.raises(ProtocolError):
                DEFAULT_CODEC.decode(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(make_body(b"\xc0")[:-1], id="no-meta"),
        pytest.param(bytes([2]) + make_body(b"\xc0")[1:], id="version"),
        pytest.param(bytes([1, 1]) + make_body(b"\xc0")[2:], id="flags"),
    ],
)
def test_malformed_format_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        DEFAULT_CODEC.decode(body)


def test_non_bytes_bodies_are_protocol_errors() -> None:
    for body in ("text", 12, None, [1, 2], np.zeros(4, dtype=np.uint8)[::2]):
        with pytest.raises(ProtocolError):
            DEFAULT_CODEC.decode(body)  # type: ignore[arg-type]


def test_other_buffer_formats_are_accepted() -> None:
    body = DEFAULT_CODEC.encode(np.arange(4, dtype=np.int32)).to_bytes()
    assert len(body) % 4 == 0
    for view in (
        np.frombuffer(body, dtype=np.uint32),
        np.frombuffer(body, dtype=np.uint8).reshape(4, -1),
        memoryview(body).cast("i"),
    ):
        out = DEFAULT_CODEC.decode(view)
        assert np.array_equal(out, np.arange(4))  # type: ignore[arg-type]
        assert np.shares_memory(out, view)
