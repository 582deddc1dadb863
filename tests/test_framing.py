"""FrameReader: small and large frames, any split of the byte stream, limits; over a real
socket, FramedProtocol holding back the reads of a large frame's rest."""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import struct
from pathlib import Path

import numpy as np
import pytest
from _framed import Receiver, receiving
from _waiting import wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from ezflow._core._exceptions import ProtocolError
from ezflow._core._framing import (
    _HOLD_BACK_AT_MOST,
    LENGTH,
    FrameReader,
    _hold_back_socket,
    frame,
)


def held_nothing(reader: FrameReader) -> bool:
    """The reader's documented test that it held nothing before the last read."""
    return not reader.end and reader.big is None


def feed(reader: FrameReader, data: bytes, chunks: list[int], *, sole: bool = False) -> list[bytes]:
    """Push *data* through the reader in pieces no larger than each chunk size (with
    *sole*: taking a read into an empty reader that is exactly one whole frame in one
    step, as the channels do - see FrameReader's docstring)."""
    out: list[bytes] = []
    pos = 0
    sizes = iter(chunks)
    while pos < len(data):
        buffer = reader.get_buffer()
        n = min(len(buffer), next(sizes, 65536), len(data) - pos)
        buffer[:n] = data[pos : pos + n]
        pos += n
        if sole and n >= 4 and held_nothing(reader):
            (size,) = LENGTH.unpack_from(reader.view)
            if size + 4 == n and size <= reader.max_frame_size:
                out.append(bytes(reader.view[4:n]))
                continue
        out.extend(bytes(f) for f in reader.buffer_updated(n))
    return out


@settings(max_examples=150, deadline=None)
@given(
    bodies=st.lists(
        st.one_of(
            st.binary(max_size=300),
            st.integers(0, 200_000).map(lambda n: random.Random(n).randbytes(n)),
        ),
        max_size=8,
    ),
    chunks=st.lists(st.integers(1, 100_000), min_size=1, max_size=50),
)
def test_any_split_yields_the_same_frames(bodies: list[bytes], chunks: list[int]) -> None:
    data = b"".join(frame(b) for b in bodies)
    assert feed(FrameReader(max_frame_size=1 << 20), data, chunks) == bodies
    assert feed(FrameReader(max_frame_size=1 << 20), data, chunks, sole=True) == bodies


def test_an_empty_reader_says_so_and_reads_to_the_start_of_its_view() -> None:
    reader = FrameReader(max_frame_size=100)
    one = frame(b"hello")
    buffer = reader.get_buffer()
    buffer[: len(one) + 3] = one + one[:3]
    assert held_nothing(reader)
    assert bytes(reader.view[: len(one) + 3]) == one + one[:3]
    assert [bytes(f) for f in reader.buffer_updated(len(one) + 3)] == [b"hello"]
    # Three bytes of the next frame are held: the rest of it is not read into an empty
    # reader.
    buffer = reader.get_buffer()
    buffer[: len(one) - 3] = one[3:]
    assert not held_nothing(reader)
    assert [bytes(f) for f in reader.buffer_updated(len(one) - 3)] == [b"hello"]
    buffer = reader.get_buffer()
    buffer[: len(one)] = one
    assert held_nothing(reader) and bytes(reader.view[: len(one)]) == one
    # Taken whole (not passed on): the reader is empty again.
    assert feed(reader, one, [len(one)]) == [b"hello"]


def test_large_frame_is_read_in_place() -> None:
    reader = FrameReader(max_frame_size=1 << 22)
    body = random.Random(1).randbytes(3 << 20)
    data = frame(body)
    frames = []
    pos = 0
    buffers = set()
    while pos < len(data):
        buffer = reader.get_buffer()
        n = min(len(buffer), 256 * 1024, len(data) - pos)
        buffer[:n] = data[pos : pos + n]
        buffers.add(id(buffer.obj))
        pos += n
        frames.extend(reader.buffer_updated(n))
    assert len(frames) == 1 and bytes(frames[0]) == body
    assert isinstance(frames[0], memoryview)  # its own buffer, no join/copy


def test_oversized_header_rejected_before_allocation() -> None:
    reader = FrameReader(max_frame_size=1024)
    buffer = reader.get_buffer()
    buffer[:4] = (0xFFFFFFFF).to_bytes(4, "little")
    with pytest.raises(ProtocolError, match="4294967295 bytes"):
        list(reader.buffer_updated(4))


@pytest.mark.parametrize(
    ("first", "hint"),
    [
        (b"GET /metrics HTTP/1.1\r\n", "look like an HTTP request"),
        (b"\x16\x03\x01\x02\x00\x01", "look like a TLS handshake (is TLS set on one end only?"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "look like an SSH client"),
        (b"\xff\xff\xff\xff", None),
    ],
)
def test_a_refused_header_of_another_protocol_says_so(first: bytes, hint: str | None) -> None:
    reader = FrameReader(max_frame_size=65536)
    buffer = reader.get_buffer()
    buffer[: len(first)] = first
    with pytest.raises(ProtocolError) as refused:
        list(reader.buffer_updated(len(first)))
    message = str(refused.value)
    assert message.startswith("frame header claims ")
    if hint is None:
        assert "look like" not in message
    else:
        assert f"its bytes {first[:4]!r} {hint}" in message
        assert message.endswith("this port speaks ezflow's length-prefixed frames)")


def test_frames_before_a_bad_header_are_not_lost() -> None:
    reader = FrameReader(max_frame_size=100)
    data = frame(b"one") + frame(b"two") + (0xFFFFFFFF).to_bytes(4, "little")
    buffer = reader.get_buffer()
    buffer[: len(data)] = data
    frames = reader.buffer_updated(len(data))
    assert [next(frames), next(frames)] == [b"one", b"two"]
    with pytest.raises(ProtocolError):
        next(frames)


def test_a_new_limit_applies_to_the_next_frame_of_the_same_read() -> None:
    reader = FrameReader(max_frame_size=10)
    data = frame(b"hello") + frame(b"x" * 1000)
    buffer = reader.get_buffer()
    buffer[: len(data)] = data
    got = []
    for body in reader.buffer_updated(len(data)):
        got.append(bytes(body))
        reader.max_frame_size = 2000  # as a server does after the handshake
    assert got == [b"hello", b"x" * 1000]


def test_limit_is_inclusive() -> None:
    reader = FrameReader(max_frame_size=100)
    assert feed(reader, frame(b"x" * 100), [1000]) == [b"x" * 100]
    with pytest.raises(ProtocolError):
        feed(reader, frame(b"x" * 101), [1000])


def feed_reads(reader: FrameReader, data: bytes) -> tuple[list[bytes | memoryview], list[int]]:
    """Hand *data* to *reader* as a transport would, each read filling the buffer it
    offers: the frames that came out, and the address of each read's buffer (no
    reference kept: the reader reuses only buffers nothing refers to)."""
    frames: list[bytes | memoryview] = []
    reads: list[int] = []
    pos = 0
    while pos < len(data):
        buffer = reader.get_buffer()
        n = min(len(buffer), len(data) - pos)
        buffer[:n] = data[pos : pos + n]
        pos += n
        reads.append(address(buffer))
        frames.extend(reader.buffer_updated(n))
    return frames, reads


def feed_one(reader: FrameReader, data: bytes) -> list[bytes | memoryview]:
    return feed_reads(reader, data)[0]


def address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def test_large_buffers_are_reused_only_when_nothing_refers_to_them() -> None:
    reader = FrameReader(max_frame_size=1 << 22)
    size = 1 << 20
    [first] = feed_one(reader, frame(bytes([1]) * size))
    kept = np.frombuffer(first, dtype=np.uint8)[10:20]  # a view someone keeps
    first_address = address(first)
    del first
    for value in range(2, 8):
        [later] = feed_one(reader, frame(bytes([value]) * size))
        assert address(later) != first_address
        del later
    assert kept.tolist() == [1] * 10  # never overwritten while referenced
    del kept
    pooled = [(int(a.ctypes.data), a.size) for a in reader._pool]
    [again] = feed_one(reader, frame(bytes([9]) * size))
    # a recycled buffer, no fresh allocation (the frame lies in one, maybe not at its start)
    assert any(start <= address(again) < start + n for start, n in pooled)
    assert bytes(again) == bytes([9]) * size
    assert sum(a.size for a in reader._pool) <= 64 * 1024 * 1024


def test_a_stream_of_large_frames_is_read_a_frame_a_read_in_place() -> None:
    reader = FrameReader(max_frame_size=1 << 22)
    size = 300_000
    kept = []
    for value in range(1, 6):
        got, reads = feed_reads(reader, frame(bytes([value]) * size))
        [body] = got
        assert isinstance(body, memoryview) and bytes(body) == bytes([value]) * size
        assert address(body) % 16 == 0  # the codec's alignment for the arrays in it
        if value > 1:
            # the frame after a large one: one read, into the buffer it is handed on in
            assert len(reads) == 1 and reads[0] + 4 == address(body)
        kept.append(body)
    assert [bytes(b[:1]) for b in kept] == [bytes([v]) for v in range(1, 6)]


@settings(max_examples=60, deadline=None)  # (3,000 run once by hand: 2026-11-27)
@given(
    sizes=st.lists(
        st.sampled_from([0, 5, 300, 20_000, 70_000, 70_000, 70_000, 150_000]), max_size=12
    ),
    chunks=st.lists(st.integers(1, 400_000), min_size=1, max_size=30),
)
def test_frames_read_in_place_are_never_written_over(sizes: list[int], chunks: list[int]) -> None:
    """Frames of sizes that repeat (read in place, after the first) and change (small
    ones, other sizes, several frames in one read, more than scratch holds behind a
    frame read in place), split anyhow: every frame comes out as sent, and stays so
    while it is kept (a buffer is never read into again while a frame lies in it)."""
    bodies = [random.Random(i).randbytes(n) for i, n in enumerate(sizes)]
    data = b"".join(frame(b) for b in bodies)
    reader = FrameReader(max_frame_size=1 << 20)
    kept: list[bytes | memoryview] = []
    pos = 0
    sizes_iter = iter(chunks * (1 + len(data)))
    while pos < len(data):
        buffer = reader.get_buffer()
        n = min(len(buffer), next(sizes_iter), len(data) - pos)
        buffer[:n] = data[pos : pos + n]
        pos += n
        kept.extend(reader.buffer_updated(n))
    assert [bytes(k) for k in kept] == bodies
    assert held_nothing(reader)


# -- over a real socket: the rest of a large frame held back (SO_RCVLOWAT) ----------------


def kernel_cap() -> int:
    """The highest mark Linux sets: half of tcp_rmem's maximum."""
    with open("/proc/sys/net/ipv4/tcp_rmem") as f:
        return int(f.read().split()[2]) // 2


async def test_the_rest_of_a_large_frame_is_held_back_until_it_is_all_there() -> None:
    loop = asyncio.get_running_loop()
    body = random.Random(1).randbytes(1 << 20)
    data = frame(body)
    async with receiving(Receiver) as (receiver, client):
        assert receiver.low_water() == 1
        await loop.sock_sendall(client, data[:100_000])
        # (the first read may take less than was sent: the rest of it is held back too)
        await wait_until(lambda: receiver._reader.rest() > 0, "a large frame begun", 5)
        assert receiver.low_water() == min(receiver._reader.rest(), kernel_cap())
        reads = receiver.reads
        for start in range(100_000, len(data), 16_384):  # the rest in 58 pieces
            await loop.sock_sendall(client, data[start : start + 16_384])
            await asyncio.sleep(0.0005)
        await wait_until(lambda: receiver.frames, "the large frame", 5)
        assert receiver.frames == [body]
        # A few reads for the rest, not one a piece (the kernel wakes a reader early
        # when the small pieces' overhead fills the receive buffer: tcp_rmem_pressure).
        assert receiver.reads - reads <= 8, receiver.reads - reads
        # Held back no longer: a small frame right after is read as soon as it comes.
        assert receiver.low_water() == 1
        await loop.sock_sendall(client, frame(b"after"))
        await wait_until(lambda: len(receiver.frames) == 2, "the small frame", 5)
        assert receiver.frames[1] == b"after"
        # A frame whose rest is below the mark's threshold is read as it comes.
        await loop.sock_sendall(client, frame(bytes(70_000))[:10_000])
        await wait_until(receiver._reader.rest, "a frame under the mark begun", 5)
        assert receiver.low_water() == 1


async def test_a_larger_rest_is_held_back_a_piece_at_a_time() -> None:
    """A frame whose rest is larger than _HOLD_BACK_AT_MOST (a 4K frame) is held back
    that much at a time: the mark never asks for more, and the reader reads the rest in
    a few pieces as they come (not once, after the last byte, with the sender stalled
    on the full window)."""
    loop = asyncio.get_running_loop()
    body = random.Random(2).randbytes(6 << 20)
    data = frame(body)
    async with receiving(Receiver) as (receiver, client):
        await loop.sock_sendall(client, data[:100_000])
        await wait_until(lambda: receiver._reader.rest() > 0, "a large frame begun", 5)
        assert receiver._reader.rest() > _HOLD_BACK_AT_MOST
        assert receiver.low_water() == min(_HOLD_BACK_AT_MOST, kernel_cap())
        marks = set()
        reads = receiver.reads
        for start in range(100_000, len(data), 256 * 1024):
            await loop.sock_sendall(client, data[start : start + 256 * 1024])
            marks.add(receiver.low_water())
        await wait_until(lambda: receiver.frames, "the large frame", 5)
        assert receiver.frames == [body]
        assert max(marks) <= _HOLD_BACK_AT_MOST
        # (about one read a MiB: the rest in ~24 pieces of 256 KiB came in far fewer)
        assert 2 <= receiver.reads - reads <= 16, receiver.reads - reads
        assert receiver.low_water() == 1


@pytest.mark.parametrize("size", [1 << 20, 6 << 20])  # (a rest held back whole; 1 MiB of it)
@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_peer_gone_in_the_middle_of_a_held_back_frame_is_noticed_at_once(
    how: str, size: int
) -> None:
    loop = asyncio.get_running_loop()
    async with receiving(Receiver) as (receiver, client):
        await loop.sock_sendall(client, frame(bytes(size))[:100_000])
        await wait_until(lambda: receiver.low_water() > 1, "reads held back", 5)
        if how == "reset":
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        # The kernel reports a closed or reset connection whatever the mark.
        await asyncio.wait_for(receiver.lost, 2)
        assert receiver.frames == []


async def test_reads_are_held_back_only_on_plain_tcp(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    # A unix socket: not worth it (and not everywhere honoured by poll).
    made: list[Receiver] = []
    server = await loop.create_unix_server(
        lambda: made.append(Receiver()) or made[-1], str(tmp_path / "s")
    )
    try:
        _, writer = await asyncio.open_unix_connection(str(tmp_path / "s"))
        await wait_until(lambda: made and made[0].transport is not None, "the connection", 5)
        assert made[0]._hold_socket is None
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()

    # Under TLS the kernel counts ciphertext, and the TLS layer may hold part of a record:
    # a mark could wait for bytes that never come. (A stand-in for asyncio's transport;
    # tests/test_auth.py sends 1 MiB messages through a real TLS edge.)
    class TlsTransport(asyncio.Transport):
        def __init__(self, sock: socket.socket) -> None:
            super().__init__()
            self.extra = {"sslcontext": ssl.create_default_context(), "socket": sock}

        def get_extra_info(self, name: str, default: object = None) -> object:
            return self.extra.get(name, default)

    with socket.socket() as raw:
        tls = TlsTransport(raw)
        assert _hold_back_socket(tls) is None
        del tls.extra["sslcontext"]
        assert _hold_back_socket(tls) is raw
