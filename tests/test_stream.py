"""What tcp and shm share (ezflow/_transports/_stream.py): each fast path pinned to the
general path it shortens, on the same inputs (differential, hypothesis-driven).

- ``StreamLink.send_small`` (one small ``bytes`` body, the paced publisher's path) and
  ``StreamLink.send`` with that body as an ``EncodedMessage``: the same bytes, in the same
  writes, the same batching decisions (paced or not: ``PACED_GAP_NS``) and counters.
- ``ChannelConnection.buffer_updated`` (a read that is exactly one ``DATA`` frame is
  delivered straight from the read buffer) and ``FramedProtocol.buffer_updated`` (the
  frame reader, then ``frame_received``): the same messages delivered, in order, the same
  channel counters, the same protocol errors, whatever the split of the byte stream.

The socket is the asyncio transport's business: the publisher side writes into a
recorder of ``write``/``writelines`` calls, the channel side is fed its reads the way the
event loop feeds a ``BufferedProtocol`` (``get_buffer``, then ``buffer_updated``). The
Channel, Inbox, Codec and frame reader are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezflow._core._channel import Channel
from ezflow._core._codec import Codec, EncodedMessage
from ezflow._core._config import PACED_GAP_NS, STREAM_FLUSH_MESSAGES
from ezflow._core._framing import ACK, ACK_BODY, DATA, DATA_PREFIX, LENGTH, FramedProtocol
from ezflow._core._inbox import Inbox
from ezflow._core._protocol import PublisherInfo
from ezflow._transports import _stream_publish
from ezflow._transports._stream_channel import ChannelConnection
from ezflow._transports._stream_frames import HEADER_SIZE, heartbeat_frame
from ezflow._transports._stream_publish import StreamLink
from ezflow.lowlevel import loop_factory

LOOPS = ["asyncio"] + (["uvloop"] if sys.platform != "win32" else [])


def run(kind: str, coroutine: Coroutine[Any, Any, None]) -> None:
    """Run *coroutine* on a new event loop of *kind* (one per example)."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        runner.run(coroutine)


@contextlib.contextmanager
def quiet(name: str) -> Iterator[None]:
    """Without the log lines of the logger *name* (a protocol error's, expected)."""
    logger = logging.getLogger(name)
    level, logger.level = logger.level, logging.CRITICAL + 1
    try:
        yield
    finally:
        logger.level = level


# -- StreamLink.send_small vs StreamLink.send ---------------------------------------------


class _Recorder:
    """Stands for the asyncio transport a link writes to: one entry per write call."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(("write", bytes(data)))

    def writelines(self, parts: list[bytes | memoryview]) -> None:
        self.writes.append(("writelines", b"".join(bytes(p) for p in parts)))

    def is_closing(self) -> bool:
        return self.closing


@dataclasses.dataclass
class _Connection:
    out: _Recorder | None


def _state(link: StreamLink) -> tuple[Any, ...]:
    out = link.connection.out
    return (
        link.sent_count,
        link.sent_bytes,
        link.inline_sends,
        link._written_ns,
        link._flush_scheduled,
        b"".join(bytes(q) for q in link._queued),
        None if out is None else list(out.writes),
    )


# A step: the gap since the previous publish (around the paced threshold), the size of
# the body (what Codec.small_array_body makes: at most 4 KiB), whether the event loop
# turns before the next one (the end-of-iteration flush).
_GAPS = st.sampled_from([0, 1, PACED_GAP_NS - 1, PACED_GAP_NS, PACED_GAP_NS + 1, 10**9])
_STEPS = st.lists(st.tuples(_GAPS, st.integers(0, 4096), st.booleans()), min_size=1, max_size=40)


@pytest.mark.parametrize("kind", LOOPS)
@settings(max_examples=150, deadline=None)
@given(
    steps=_STEPS,
    closing_at=st.one_of(st.none(), st.integers(1, 40)),
    out_of_line_above=st.sampled_from([sys.maxsize, 2048]),
    drops=st.integers(0, 3),
    # (STREAM_FLUSH_MESSAGES itself is more than a 40-step burst reaches: smaller ones too)
    flush_messages=st.sampled_from([3, 16, STREAM_FLUSH_MESSAGES]),
)
def test_send_small_is_send_of_one_small_body(
    kind: str,
    *,
    steps: list[tuple[int, int, bool]],
    closing_at: int | None,
    out_of_line_above: int,
    drops: int,
    flush_messages: int,
) -> None:
    # (closing_at: the socket starts closing before that message, and stays closing)
    async def drive() -> None:
        small = StreamLink(_Connection(_Recorder()), lossless=True, max_size=1 << 20)  # type: ignore[arg-type]
        general = StreamLink(_Connection(_Recorder()), lossless=True, max_size=1 << 20)  # type: ignore[arg-type]
        links = (small, general)
        for link in links:
            link.out_of_line_above = out_of_line_above
            link.drops = drops
        now = 1_700_000_000_000_000_000
        expected = b""
        for seq, (gap, size, turn) in enumerate(steps, 1):
            now += gap
            body = bytes((seq + i) & 0xFF for i in range(size))
            expected += DATA_PREFIX.pack(HEADER_SIZE + size, DATA, 0, seq, now, drops) + body
            if seq == closing_at:
                for link in links:
                    link.connection.out.closing = True
            small.send_small(seq, now, None, body)
            general.send(seq, now, None, EncodedMessage([body], size))
            assert _state(small) == _state(general), f"after message {seq}"
            if turn:
                await asyncio.sleep(0)
                assert _state(small) == _state(general), f"after the loop turned at {seq}"
        await asyncio.sleep(0)
        assert _state(small) == _state(general)
        if closing_at is None or closing_at > len(steps):
            # what went out is each message's DATA frame, in order
            assert b"".join(data for _, data in general.connection.out.writes) == expected

    saved = _stream_publish._FLUSH_MESSAGES
    _stream_publish._FLUSH_MESSAGES = flush_messages  # type: ignore[misc]
    try:
        run(kind, drive())
    finally:
        _stream_publish._FLUSH_MESSAGES = saved  # type: ignore[misc]


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("small", [True, False])
def test_a_paced_message_is_written_at_once_and_a_bursts_turn_in_one_write(
    kind: str, small: bool
) -> None:
    """A message PACED_GAP_NS or more after the previous one is written at once and
    schedules nothing; every message of a burst's loop turn, its first one too, goes out
    in one write at the turn's end (or at STREAM_FLUSH_MESSAGES)."""

    async def drive() -> None:
        link = StreamLink(_Connection(_Recorder()), lossless=True, max_size=1 << 20)  # type: ignore[arg-type]
        writes = link.connection.out.writes
        now = 1_700_000_000_000_000_000
        seq = 0

        def send(gap: int) -> None:
            nonlocal now, seq
            now += gap
            seq += 1
            body = bytes([seq & 0xFF]) * 8
            if small:
                link.send_small(seq, now, None, body)
            else:
                link.send(seq, now, None, EncodedMessage([body], len(body)))

        send(10**9)  # paced: out at once, nothing scheduled
        assert [kind for kind, _ in writes] == ["write"]
        assert not link._flush_scheduled
        await asyncio.sleep(0)
        assert len(writes) == 1
        for _ in range(5):  # a burst: nothing written before the turn ends
            send(1_000)
        assert len(writes) == 1
        await asyncio.sleep(0)
        assert len(writes) == 2
        assert writes[1][0] == "writelines"
        for _ in range(STREAM_FLUSH_MESSAGES + 3):  # still a burst: flushed at the bound
            send(1_000)
        assert len(writes) == 3
        await asyncio.sleep(0)
        assert len(writes) == 4
        frame = DATA_PREFIX.size + 8  # (each message's frame: its prefix and 8 bytes)
        assert [len(data) / frame for _, data in writes] == [1, 5, STREAM_FLUSH_MESSAGES, 3]
        send(PACED_GAP_NS)  # paced again
        assert len(writes) == 5 and not link._flush_scheduled

    run(kind, drive())


# -- ChannelConnection.buffer_updated vs FramedProtocol.buffer_updated ---------------------


def _connection(codec: Codec, max_size: int = 1 << 16) -> tuple[ChannelConnection, Inbox]:
    channel = Channel("p-1", "/t", codec, transport="tcp")
    inbox = Inbox()
    channel.attach(inbox)
    info = PublisherInfo("p-1", "/t", "c-1", "h-1", 1, ("127.0.0.1", 1))
    return ChannelConnection(channel, info, max_size=max_size, on_lost=lambda: None), inbox


def _ack_as_after_welcome(connection: ChannelConnection) -> None:
    """As after WELCOME with a window of 64: an ACK at once every 16 releases, else one at
    the end of the loop iteration."""
    connection.channel.on_release = connection._on_release
    connection._ack_every, connection._ack_bytes = 16, 1 << 20


def _received(inbox: Inbox) -> list[Any]:
    out = []
    while len(inbox):
        try:
            message = inbox.get_nowait()
        except Exception as exc:  # (an undecodable body: raised in its place)
            out.append(("raised", type(exc).__name__))
            continue
        if isinstance(message, np.ndarray):
            out.append(("array", message.dtype.str, message.shape, message.tobytes()))
        elif type(message) is tuple:  # (the ordinary tuple: its array as bytes)
            out.append(("tuple", *(m.tobytes() if type(m) is np.ndarray else m for m in message)))
        else:
            out.append(("object", message))
    return out


# (the ordinary tuple twice: runs of one layout, which the read loop delivers in one
# Channel.deliver_run call each)
_ORDINARY = st.tuples(st.integers(0, 1), st.integers(0, 2**40)).map(
    lambda p: (p[0], p[1], 17, np.arange(16, dtype=np.float32))
)
_MESSAGES = st.one_of(
    _ORDINARY,
    _ORDINARY,
    st.integers(-(2**40), 2**40),
    st.text(max_size=20),
    st.tuples(st.integers(0, 3), st.integers(1, 600)).map(
        lambda p: np.arange(p[1], dtype=["<f8", "<i4", "u1", "<f4"][p[0]])
    ),
    # large frames (read into buffers of their own; repeated sizes read in place)
    st.sampled_from([20_000, 70_000, 70_000, 100_000]).map(lambda n: np.arange(n, dtype="u1")),
)
# What travels: a message's DATA frame, or garbage in a DATA frame (undecodable), or a
# HEARTBEAT frame, or a header claiming more than the connection's limit (a protocol
# error, last).
# (each with how many more messages the publisher dropped for this channel before it)
_FRAMES = st.lists(
    st.tuples(
        st.one_of(
            _MESSAGES.map(lambda m: ("message", m)),
            st.binary(min_size=0, max_size=40).map(lambda b: ("garbage", b)),
            # a control frame between DATA frames (the read loop stops at it)
            st.just(("heartbeat", b"")),
            # a DATA frame shorter than its header (a protocol error)
            st.integers(1, HEADER_SIZE - 1).map(lambda n: ("short", n)),
        ),
        st.sampled_from([0, 0, 0, 1, 2]),
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.parametrize("kind", LOOPS)
@settings(max_examples=150, deadline=None)
@given(
    frames=_FRAMES,
    oversized=st.booleans(),
    one_per_read=st.booleans(),
    chunks=st.lists(st.integers(1, 3000), min_size=1, max_size=60),
    # (a limit below the read loop's small-frame size, too: the loop checks both)
    max_size=st.sampled_from([1 << 16, 1 << 16, 1 << 17, 300]),
)
def test_the_channels_read_loop_is_the_frame_reader(
    kind: str,
    *,
    frames: list[tuple[tuple[str, Any], int]],
    oversized: bool,
    one_per_read: bool,
    chunks: list[int],
    max_size: int,
) -> None:
    codec = Codec()
    stream: list[bytes] = []
    drops, sent_ns = 0, time.time_ns() - 1_000_000
    for seq, ((what, value), dropped) in enumerate(frames, 1):
        if what == "heartbeat":
            stream.append(heartbeat_frame(0))
            continue
        if what == "short":
            stream.append(LENGTH.pack(value) + bytes([DATA]) + bytes(range(1, value)))
            continue
        body = codec.encode(value).to_bytes() if what == "message" else value
        drops += dropped
        head = DATA_PREFIX.pack(HEADER_SIZE + len(body), DATA, 0, seq, sent_ns + seq, drops)
        stream.append(head + body)
    if oversized:
        stream.append(DATA_PREFIX.pack(1 << 20, DATA, 0, len(frames) + 1, 0, 0))
    # reads: each frame alone (a paced stream: the fast path) or any split
    reads = stream if one_per_read else _split(b"".join(stream), chunks)

    async def drive() -> None:
        fast, fast_inbox = _connection(codec, max_size)
        general, general_inbox = _connection(codec, max_size)
        with quiet("ezflow.stream"), quiet("ezflow.channel"):  # (expected errors)
            for data in reads:
                for connection, update in (
                    (fast, fast.buffer_updated),
                    (general, lambda n: FramedProtocol.buffer_updated(general, n)),
                ):
                    position = 0
                    # (a large frame: as its buffers take it; a broken connection is
                    # aborted, it reads nothing more)
                    while position < len(data) and not connection._broken:
                        buffer = connection.get_buffer(-1)
                        n = min(len(buffer), len(data) - position)
                        buffer[:n] = data[position : position + n]
                        position += n
                        update(n)
                got = _received(fast_inbox)
                assert got == _received(general_inbox)
                assert fast._broken == general._broken
        timing = {"decode_seconds": 0.0}
        assert dataclasses.replace(fast.channel.stats, **timing) == dataclasses.replace(
            general.channel.stats, **timing
        )
        assert fast.channel.released == general.channel.released
        # every message carried its publish time: one latency sample per message
        # delivered, on both
        stats = fast.channel.stats
        latencies = [c.channel.latency.snapshot().count for c in (fast, general)]
        assert latencies[0] == latencies[1] == stats.messages - stats.decode_errors

    run(kind, drive())


def _split(data: bytes, chunks: list[int]) -> list[bytes]:
    reads, position, index = [], 0, 0
    while position < len(data):
        size = chunks[index % len(chunks)]
        reads.append(data[position : position + size])
        position += size
        index += 1
    return reads


# -- the end-of-iteration ACK: the stock loop's kept handle vs call_soon -----------------


def _acks_of(
    batches: list[int], *, fast: bool, one_by_one: bool = False, loud: bool = False,
    calls: list[int] | None = None,
) -> list[bytes]:  # fmt: skip
    """The ACK frames a ChannelConnection on a socketpair writes back when
    *batches* of small DATA frames arrive, each batch in one write once a task awaiting
    ``recv`` took everything before it (a paced stream: batches of 1), on the stock
    loop; *fast*: with the connection's kept ACK handle, else with ``call_soon``.
    *one_by_one*: the task takes each batch's messages with ``get_nowait`` after one
    ``get``, each released at once (as the second of two topics read in turn is), and
    *loud* clears the channel's quiet marks before each take (a release call every
    time, as before the marks); the release calls go into *calls*."""
    import socket  # noqa: PLC0415

    from ezflow._transports import _stream_channel  # noqa: PLC0415

    async def main() -> list[bytes]:
        loop = asyncio.get_running_loop()
        codec = Codec()
        body = codec.encode((1, 7, 0, np.arange(8, dtype=np.float32))).to_bytes()
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        connection, inbox = _connection(Codec())
        await loop.create_unix_connection(lambda: connection, sock=ours)
        _ack_as_after_welcome(connection)
        channel = connection.channel
        if calls is not None:
            on_release = connection._on_release

            def counted(count: int, nbytes: int) -> None:
                calls.append(count)
                on_release(count, nbytes)

            channel.on_release = counted
        seq = 0
        for count in batches:
            frames = []
            for _ in range(count):
                seq += 1
                frames.append(DATA_PREFIX.pack(HEADER_SIZE + len(body), DATA, 0, seq, 0, 0) + body)
            theirs.send(b"".join(frames))
            async with asyncio.timeout(10):
                if one_by_one:
                    # (waits for the read without taking: a take by get, woken, would
                    # defer its release to the loop, and the rest with it)
                    while len(inbox) < count:  # noqa: ASYNC110
                        await asyncio.sleep(0.001)
                    for _ in range(count):
                        if loud:
                            channel.release_quiet_count = channel.release_quiet_bytes = 0
                        inbox.get_nowait()
                else:
                    for _ in range(count):
                        await inbox.get()
            for _ in range(3):
                await asyncio.sleep(0)
        written = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := theirs.recv(1 << 16):
                written += chunk
        connection.welcome.cancel()  # (no WELCOME comes: nothing is told of it)
        connection.close()
        theirs.close()
        acks, at = [], 0
        while at < len(written):  # (the frames: HELLO first, then the ACKs)
            (size,) = LENGTH.unpack_from(written, at)
            body = written[at + LENGTH.size : at + LENGTH.size + size]
            if body[0] == ACK:
                acks.append(body)
            at += LENGTH.size + size
        return acks

    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        if fast:
            return runner.run(main())
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_stream_channel, "ready_queue", lambda loop: None)
            return runner.run(main())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1, 1, 1, 2, 5, 17, 40]), min_size=1, max_size=25))
def test_the_end_of_iteration_ack_is_the_same_through_the_kept_handle(batches: list[int]) -> None:
    """On the stock loop a connection appends the handle it keeps for its end-of-
    iteration ACK to the loop's ready queue instead of calling ``call_soon`` (a paced
    stream schedules one for every message): the same ACKs, with the same counts, in
    the same order, paced or in bursts (an ACK at once every 16 releases, the rest at
    the end of the iteration)."""
    fast = _acks_of(batches, fast=True)
    assert fast == _acks_of(batches, fast=False)
    assert ACK_BODY.unpack(fast[-1])[1] == sum(batches)  # (the last: every message)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 5, 17, 40]), min_size=1, max_size=12))
def test_quiet_marks_hold_back_release_calls_not_acks(batches: list[int]) -> None:
    """Takes that release one message at a time: while the connection's end-of-iteration
    ACK is scheduled, its channel calls it back only at the next quarter window (the
    quiet marks), and the ACKs written are those of a channel that calls back on every
    release - the same counts, in the same order."""
    quiet_calls: list[int] = []
    loud_calls: list[int] = []
    quiet = _acks_of(batches, fast=True, one_by_one=True, calls=quiet_calls)
    loud = _acks_of(batches, fast=True, one_by_one=True, loud=True, calls=loud_calls)
    assert quiet == loud
    assert ACK_BODY.unpack(quiet[-1])[1] == sum(batches)
    assert loud_calls == list(range(1, sum(batches) + 1))
    # one call a batch to schedule its ACK, one more each quarter window (16) it spans
    assert len(quiet_calls) <= len(batches) + sum(batches) // 16


# -- a paced frame's task runs within the read (the stock loop) ---------------------------


@pytest.mark.parametrize("kind", LOOPS)
def test_a_paced_frame_wakes_the_waiting_task_within_its_read(kind: str) -> None:
    """On the stock loop a task awaiting ``recv`` runs to its next wait within the read
    callback that delivered its message (``run_lone_wake``: one loop iteration less on
    every paced message), and its release and ACK follow as before; elsewhere (uvloop) it
    runs in the loop's next iteration. Either way every message arrives, in order, and
    every one is acknowledged."""
    import socket  # noqa: PLC0415

    async def main() -> None:
        loop = asyncio.get_running_loop()
        codec = Codec()
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        connection, inbox = _connection(Codec())
        read = connection.buffer_updated
        woken_within: list[bool] = []
        got: list[Any] = []

        def buffer_updated(nbytes: int) -> None:
            before = len(got)
            read(nbytes)
            woken_within.append(len(got) > before)

        # (set before the transport exists: uvloop looks the method up once, then)
        connection.buffer_updated = buffer_updated  # type: ignore[method-assign]
        await loop.create_unix_connection(lambda: connection, sock=ours)
        _ack_as_after_welcome(connection)

        arrived = asyncio.Event()

        async def receive(count: int) -> None:
            for _ in range(count):
                got.append((await inbox.get())[1])
                arrived.set()

        task = asyncio.ensure_future(receive(5))
        try:
            for seq in range(1, 6):
                body = codec.encode((0, seq, 0, np.arange(4, dtype=np.float32))).to_bytes()
                await asyncio.sleep(0.002)  # (the task waits, the loop is idle)
                theirs.send(DATA_PREFIX.pack(HEADER_SIZE + len(body), DATA, 0, seq, 0, 0) + body)
                await asyncio.wait_for(arrived.wait(), 10)
                arrived.clear()
            await asyncio.wait_for(task, 10)
            for _ in range(3):
                await asyncio.sleep(0)
            acked = b""
            with contextlib.suppress(BlockingIOError):
                while chunk := theirs.recv(1 << 16):
                    acked += chunk
        finally:
            task.cancel()
            connection.welcome.cancel()
            connection.close()
            theirs.close()
        assert got == [1, 2, 3, 4, 5]
        assert woken_within == [kind == "asyncio"] * 5
        # (the last frame written back: the ACK of all five)
        assert ACK_BODY.unpack(acked[-ACK_BODY.size :])[1] == 5

    run(kind, main())
