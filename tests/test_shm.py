"""The shared-memory transport with real processes, segments and sockets.

Covers the acceptance list of the shm issue: fan-out to 4 subscribers of another process
(mixed sizes, one read and decode per message there), kept messages that never change,
loans that copy nothing, every size boundary, backpressure and leaky edges, crashes of
either side, sweeping of dead processes' segments, fallback to tcp, and hostile peers.
Every test leaves /dev/shm clean (the autouse ``no_leaks`` fixture checks).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from _children import LoanedFrame, arrays_in, digest, mixed_payload, payload, shm_location
from _proc import Child
from _transport_of import shm_of
from _waiting import wait_until
from conftest import HOSTILE_ENTRIES, loop_kind
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ezflow
from ezflow._core._channel import Channel
from ezflow._core._codec import Codec
from ezflow._core._framing import (
    FREE,
    FREE_HEADER,
    HELLO,
    SHM_DATA,
    SHM_HEADER,
    SHM_PREFIX,
    WELCOME,
)
from ezflow._core._inbox import Inbox
from ezflow._core._protocol import PROTOCOL, PublisherInfo
from ezflow._transports._segment import ShmSegment
from ezflow._transports._shm import SegmentUnlinker, ShmTransport, _ShmLink
from ezflow._transports._shmfiles import shm_dir
from ezflow._transports._shmring import ShmRing

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not ShmTransport.available(), reason="needs Linux shared memory"),
]

KiB = 1024
MiB = 1024 * KiB


def _in_use(pub: ezflow.Publisher) -> int:
    """Blocks of *pub*'s shared-memory ring that subscribers hold now."""
    stats = pub.shm_statistics()
    assert stats is not None
    return stats.in_use


def segments_of(pid: int) -> list[str]:
    return [name for name in os.listdir(shm_dir()) if name.startswith(f"ezflow-{pid}-")]


def prefix_size(nbytes: int) -> int:
    """Bytes the codec puts before the data of a 1-D uint8 array of *nbytes*."""
    prefix, total = Codec()._array_prefix((nbytes,), np.dtype(np.uint8))
    assert total == len(prefix) + nbytes
    return len(prefix)


def array_of_encoded_size(total: int, fill: int) -> np.ndarray:
    """A uint8 array whose encoded body is exactly *total* bytes."""
    nbytes = total - prefix_size(total)
    assert prefix_size(nbytes) + nbytes == total
    return np.full(nbytes, fill % 256, dtype=np.uint8)


# -- fan-out to another process --------------------------------------------------------------


async def test_four_subscribers_in_another_process_get_mixed_sizes_zero_copy(
    ctx: ezflow.GraphContext,
) -> None:
    """10,000 arrays of 64 B to 4 MiB to 4 subscribers of one other process over shm:
    content and order verified; one channel, one shm read and one decode per message."""
    count = 10_000
    # Inline (64 B, 1 KiB), ring slots (100 KiB), out-of-line (300 KiB), and 4 MiB.
    sizes = [64, 1 * KiB, 100 * KiB, 64, 300 * KiB, 1 * KiB] * 8 + [4 * MiB]
    child = await Child.start(
        "subscribers",
        loop_kind(),
        address=list(ctx.address),
        topic="/shm/fanout",
        subs=4,
        count=count,
        sizes=sizes,
    )
    try:
        await child.event("ready")
        pub = await ctx.publisher("/shm/fanout")
        await pub.wait_for_channels(1)
        for i in range(count):
            await pub.publish(mixed_payload(i, sizes))
        done = await child.event("done", timeout=90)
        assert done["errors"] == []
        assert done["received"] == [count] * 4
        assert done["channels"] == 1 and done["transports"] == ["shm"]
        assert done["decoded"] == [count]
        assert done["same_object"]
        stats = pub.shm_statistics()
        assert stats is not None
        limit = ezflow.ShmOptions().inline_limit
        large = sum(1 for i in range(count) if sizes[i % len(sizes)] + 64 > limit)
        # One hand-over per message to the one channel: through shm when large - or
        # inline when the child's kept samples (for the identity check) hold the slots.
        assert stats.zero_copy + stats.no_block == large
        assert stats.inline == count - large
        assert stats.zero_copy > large // 2
        assert pub.statistics().encodes == count
        assert await child.stop() == 0
    finally:
        await child.aclose()


# -- keeping messages --------------------------------------------------------------------------


@pytest.fixture
async def shm_pair(
    ctx: ezflow.GraphContext,
) -> Callable[..., Awaitable[tuple[ezflow.Publisher, ezflow.Subscriber]]]:
    """Make a publisher and a subscriber joined by a real shm edge (in this process:
    both ends map the segments separately and talk over the Unix socket)."""

    async def make(
        topic: str, options: ezflow.ShmOptions | None = None, **sub_options: Any
    ) -> tuple[ezflow.Publisher, ezflow.Subscriber]:
        pub = await ctx.publisher(topic, shm=options)
        sub = await ctx.subscriber(topic, transport="shm", **sub_options)
        assert [c.transport for c in ctx.channels if c.topic == topic] == ["shm"]
        return pub, sub

    return make


async def test_a_kept_message_never_changes(shm_pair: Any) -> None:
    options = ezflow.ShmOptions(slot_count=4, slot_size=64 * KiB, inline_limit=1 * KiB)
    pub, sub = await shm_pair("/shm/keep", options)
    for size in (32 * KiB, 200 * KiB):  # a ring slot, an out-of-line block
        await pub.publish(np.full(size, 7, dtype=np.uint8))
        kept = await sub.recv()
        view = kept[100:200]  # a view keeps it just as well
        del kept
        # 10x the ring, all consumed and dropped at once: blocks are reused around it
        for i in range(10 * options.slot_count):
            await pub.publish(np.full(size, i % 200 + 10, dtype=np.uint8))
            assert (await sub.recv())[0] == i % 200 + 10
        assert np.all(view == 7)
        assert not view.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            view[0] = 1
    stats = pub.shm_statistics()
    assert stats is not None and stats.zero_copy == 2 * 41


async def test_keeping_every_message_never_blocks_the_publisher(shm_pair: Any) -> None:
    """Held blocks make messages travel inline; nothing waits, nothing is lost."""
    options = ezflow.ShmOptions(slot_count=2, slot_size=16 * KiB, max_bytes=64 * KiB)
    pub, sub = await shm_pair("/shm/hoard", dataclasses.replace(options, inline_limit=0))
    kept = []
    for i in range(40):
        await asyncio.wait_for(pub.publish(np.full(8 * KiB, i, dtype=np.uint8)), 2)
        kept.append(await sub.recv())
    assert [int(m[0]) for m in kept] == list(range(40))
    assert all(np.all(m == i) for i, m in enumerate(kept))
    stats = pub.shm_statistics()
    # 2 ring slots, then (every slot held) 2 out-of-line blocks (at most slot_count),
    # then inline.
    assert stats is not None and stats.zero_copy == 4 and stats.no_block == 36
    del kept
    gc.collect()

    async def all_free() -> bool:
        stats = pub.shm_statistics()
        return stats is not None and stats.in_use == 0

    await wait_until(all_free, "every block free", 2)
    # The subscriber let go: messages go through shared memory again.
    for i in range(4):
        await pub.publish(np.full(8 * KiB, i, dtype=np.uint8))
        assert (await sub.recv())[0] == i
    stats = pub.shm_statistics()
    assert stats is not None and stats.zero_copy == 8 and stats.no_block == 36


async def test_a_lossless_channel_waits_at_the_block_window_not_inline(shm_pair: Any) -> None:
    """A lossless channel holds at most ``2 * slot_count`` untaken messages in blocks
    (its ``max_in_flight`` is far larger): the next publish waits for it to take one,
    instead of sending the message inline; small inline messages are not counted."""
    options = ezflow.ShmOptions(slot_count=3, slot_size=16 * KiB, inline_limit=1 * KiB)
    pub, sub = await shm_pair("/shm/blockwindow", options)
    (link,) = pub._outlet._links
    assert isinstance(link, _ShmLink) and pub._outlet.max_in_flight > 6
    for i in range(100):  # inline: no block, no wait
        await asyncio.wait_for(pub.publish(np.full(16, i, dtype=np.uint8)), 2)
    for i in range(6):  # 3 slots and 3 small out-of-line blocks
        await asyncio.wait_for(pub.publish(np.full(8 * KiB, i, dtype=np.uint8)), 2)
    assert link.stalled
    link.set_backlogged(True)  # the socket's backlog went over its bound and back:
    link.set_backlogged(False)  # the block window still holds
    assert link.stalled
    publishing = asyncio.ensure_future(pub.publish(np.full(8 * KiB, 6, dtype=np.uint8)))
    await asyncio.sleep(0.1)  # a window in which the publish may not go through
    assert not publishing.done()
    assert pub.statistics().waits == 1
    for i in range(100):
        assert (await asyncio.wait_for(sub.recv(), 2))[0] == i
    assert not publishing.done()  # (inline messages taken: no block released)
    kept = await asyncio.wait_for(sub.recv(), 2)  # taken, and kept: its lease stays
    assert kept[0] == 0
    await asyncio.wait_for(publishing, 2)
    for i in range(1, 7):
        assert (await asyncio.wait_for(sub.recv(), 2))[0] == i
    stats = pub.shm_statistics()
    # The seventh waited for the window, not for a block: every block was still leased
    # (the kept message, and the untaken ones' views in the inbox), so it went inline.
    assert stats is not None and (stats.zero_copy, stats.no_block) == (6, 1)
    assert not link.stalled and not link._unreleased_blocks
    del kept


async def test_release_from_another_thread_frees_the_block(shm_pair: Any) -> None:
    options = ezflow.ShmOptions(slot_count=2, slot_size=16 * KiB, inline_limit=0)
    pub, sub = await shm_pair("/shm/thread", options)
    await pub.publish(np.zeros(1000, dtype=np.uint8))
    holder = [await sub.recv()]
    stats = pub.shm_statistics()
    assert stats is not None and stats.in_use == 1
    thread = threading.Thread(target=holder.clear)  # the last reference dies over there
    thread.start()
    thread.join()

    async def freed() -> bool:
        stats = pub.shm_statistics()
        return stats is not None and stats.in_use == 0

    await wait_until(freed, "the block freed", 2)


# -- sizes around every boundary ---------------------------------------------------------------


async def test_sizes_at_every_boundary(ctx: ezflow.GraphContext, shm_pair: Any) -> None:
    slot, inline = 16 * KiB, 2 * KiB
    options = ezflow.ShmOptions(slot_count=4, slot_size=slot, inline_limit=inline)
    pub, sub = await shm_pair("/shm/sizes", options)
    header = prefix_size(slot)
    cases = [
        # (encoded size, expected path)
        (inline - 1, "inline"),
        (inline, "inline"),
        (inline + 1, "slot"),
        (slot - 1, "slot"),
        (slot, "slot"),  # payload of exactly slot - header bytes
        (slot + 1, "out-of-line"),
        (4 * slot, "out-of-line"),
    ]
    ring = shm_of(ctx)._shm[pub.id].ring
    for index, (total, path) in enumerate(cases):
        message = array_of_encoded_size(total, index)
        if total == slot:
            assert message.nbytes == slot - header
        before = pub.shm_statistics()
        created = ring.stats.blocks_created
        await pub.publish(message)
        got = await sub.recv()
        assert np.array_equal(got, message), total
        after = pub.shm_statistics()
        assert before is not None and after is not None
        if path == "inline":
            assert after.inline == before.inline + 1, total
        else:
            assert after.zero_copy == before.zero_copy + 1, total
            assert (ring.stats.blocks_created > created) == (path == "out-of-line"), total
        del got


async def test_channels_drop_the_mappings_of_retired_blocks(
    ctx: ezflow.GraphContext, shm_pair: Any
) -> None:
    """Out-of-line blocks unlinked to stay within max_bytes are announced (RETIRE), so
    the channel unmaps them: the memory really goes."""
    options = ezflow.ShmOptions(slot_count=2, slot_size=4 * KiB, max_bytes=8 * KiB + 1 * MiB)
    pub, sub = await shm_pair("/shm/retire", options)
    for size in (600 * KiB, 200 * KiB, 900 * KiB, 100 * KiB):  # no pooled block fits the next
        await pub.publish(np.zeros(size, dtype=np.uint8))
        del size
        await sub.recv()
        await wait_until(lambda: _in_use(pub) == 0, "FREE reaches the publisher")
    assert ctx._router is not None
    (record,) = ctx._router.channels.values()
    assert record.inbound is not None
    reader = record.inbound._connection.reader  # type: ignore[attr-defined]
    ring = shm_of(ctx)._shm[pub.id].ring
    assert ring.stats.blocks_unlinked >= 2
    on_disk = {n for n in os.listdir(shm_dir()) if n.startswith(f"ezflow-{os.getpid()}-")}
    assert set(reader.attached) <= on_disk  # nothing mapped that was unlinked


# -- loans -------------------------------------------------------------------------------------


async def test_a_loaned_frame_crosses_to_another_process_without_a_copy(
    ctx: ezflow.GraphContext,
) -> None:
    child = await Child.start("locate", loop_kind(), address=list(ctx.address), topic="/shm/loan")
    try:
        await child.event("ready")
        pub = await ctx.publisher("/shm/loan")
        await pub.wait_for_channels(1)
        frame = await pub.loan((2160, 3840, 3))  # a 4K RGB frame, 24.9 MB
        assert frame.flags.writeable and frame.dtype == np.uint8
        frame[:] = 3
        frame[0, 0, 0] = 250
        where = shm_location(frame)
        assert where is not None and where[0].startswith(f"{shm_dir()}/ezflow-")
        await pub.publish(frame)
        assert not frame.flags.writeable  # published: ezflow's now
        located = await child.event("located", timeout=30)
        assert located["transports"] == ["shm"]
        assert located["where"] == where  # same file, same offset: the very same bytes
        assert located["total"] == 3 * (frame.size - 1) + 250
        stats = pub.shm_statistics()
        assert stats is not None and stats.loans == 1 and stats.loans_published == 1
        assert stats.zero_copy == 1 and stats.inline == 0
        assert await child.stop() == 0
    finally:
        await child.aclose()


async def test_loan_edge_cases(ctx: ezflow.GraphContext, shm_pair: Any) -> None:
    pub, sub = await shm_pair("/shm/loans")
    # never published: its block comes back once the array is gone
    spare = await pub.loan(100_000)
    stats = pub.shm_statistics()
    assert stats is not None and stats.in_use == 1
    del spare
    await wait_until(lambda: _in_use(pub) == 0, "the release runs on the loop")
    # reshaped and retyped in place after the loan: its bytes are where they were, and
    # the header and meta are written at publish time, so still no copy
    for change in ({"shape": (1000, 100)}, {"dtype": np.uint16}):
        changed = await pub.loan(100_000)
        changed[:] = 1
        for name, value in change.items():
            setattr(changed, name, value)
        before = pub.shm_statistics()
        await pub.publish(changed)
        got = await sub.recv()
        assert got.shape == changed.shape and got.dtype == changed.dtype
        assert np.array_equal(got, changed)
        after = pub.shm_statistics()
        assert before is not None and after is not None
        assert after.loans_published == before.loans_published + 1
        assert after.loans_copied == 0
        del got, changed
    # errors are the codec's
    with pytest.raises(ezflow.UnregisteredTypeError, match="object"):
        await pub.loan(3, dtype=object)
    with pytest.raises(ValueError, match="shape"):
        await pub.loan((-1,))
    with pytest.raises(ezflow.MessageTooLargeError):
        await pub.loan(ezflow.DEFAULT_MAX_MESSAGE_SIZE + 1)
    # room around the data would not fit the ring: a loan without it, still no copy
    # when published alone
    snug = ezflow.ShmOptions(slot_count=1, slot_size=64 * KiB, max_bytes=1 * MiB)
    pub2, sub2 = await shm_pair("/shm/snug", snug)
    largest = 1 * MiB - 64 * KiB - prefix_size(1 * MiB) - 128
    alone = await pub2.loan(largest)
    assert shm_location(alone) is not None
    alone[:] = 5
    await pub2.publish(alone)
    assert np.array_equal(await sub2.recv(), alone)
    stats = pub2.shm_statistics()
    assert stats is not None and stats.loans_published == 1 and stats.loan_fallbacks == 0
    del alone
    # no block free: a private array, published with a copy
    tiny = await ctx.publisher("/shm/tiny", shm=ezflow.ShmOptions(max_bytes=8 * MiB))
    private = await tiny.loan(9 * MiB)
    assert shm_location(private) is None
    stats = tiny.shm_statistics()
    assert stats is not None and stats.loan_fallbacks == 1
    await pub.aclose()
    with pytest.raises(ezflow.ClosedResourceError):
        await pub.loan(10)


# -- loans inside messages --------------------------------------------------------------------

# A 640x480 RGB frame: above every inline limit, out of line (more than a 256 KiB slot).
FRAME_SHAPE = (480, 640, 3)


def fill(frame: np.ndarray, seed: int) -> None:
    frame.reshape(-1)[:] = (np.arange(frame.size) * 7 + seed) % 256


LOANED_FIELDS = ("head", "frame", "tail")


def private_copy(message: Any, frame: np.ndarray) -> Any:
    """*message* with *frame* replaced by a private copy (what a copying publish sends)."""
    if message is frame:
        return frame.copy()
    if isinstance(message, tuple):
        return tuple(private_copy(x, frame) for x in message)
    if isinstance(message, list):
        return [private_copy(x, frame) for x in message]
    if isinstance(message, dict):
        return {k: private_copy(v, frame) for k, v in message.items()}
    if isinstance(message, LoanedFrame):
        return LoanedFrame(*(private_copy(getattr(message, f), frame) for f in LOANED_FIELDS))
    return message


def index_of(message: Any, frame: np.ndarray) -> int:
    """Position of *frame* among the arrays of *message* (see arrays_in)."""
    return next(i for i, a in enumerate(arrays_in(message)) if a is frame)


@pytest.fixture
async def describer(ctx: ezflow.GraphContext) -> Any:
    """A subscriber in another process that reports every message it gets (the
    ``describe`` role), on topic /shm/described; yields the child once connected."""
    child = await Child.start(
        "describe", loop_kind(), address=list(ctx.address), topic="/shm/described"
    )
    try:
        await child.event("ready")
        yield child
        assert await child.stop() == 0
    finally:
        await child.aclose()


async def hop(pub: ezflow.Publisher, child: Child, message: Any) -> dict[str, Any]:
    await pub.publish(message)
    return await child.event("message")


MESSAGES: dict[str, Callable[[np.ndarray], Any]] = {
    "tuple": lambda f: ("phase", 7, 1_234_567_890_123, f),
    "dict": lambda f: {"t": np.arange(5.0), "frame": f, "tags": ["a", "b"], "z": np.ones(3)},
    "dataclass": lambda f: LoanedFrame(head=np.int32(3), frame=f, tail=np.zeros((2, 2))),
    "nested": lambda f: [{"k": (1.5, LoanedFrame(head=b"x" * 1500, frame=[None, f], tail=()))}],
    "small arrays and buffers beside it": lambda f: (
        np.arange(100, dtype=np.float32),
        f,
        bytearray(b"y" * 2000),
        np.full(700, 9, np.int16),
    ),
}


@pytest.mark.parametrize("kind", list(MESSAGES))
async def test_a_loaned_frame_inside_a_message_crosses_without_a_copy(
    ctx: ezflow.GraphContext, describer: Child, kind: str
) -> None:
    """The subscriber in another process gets exactly what a copying publish gives it,
    and the frame it gets lies at the very file offset of the publisher's loan."""
    pub = await ctx.publisher("/shm/described")
    await pub.wait_for_channels(1)
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 1)
    message = MESSAGES[kind](frame)
    copied = private_copy(message, frame)
    where = shm_location(frame)
    assert where is not None and where[0].startswith(f"{shm_dir()}/ezflow-")
    got = await hop(pub, describer, message)
    assert not frame.flags.writeable
    stats = pub.shm_statistics()
    assert stats is not None and stats.loans_published == 1 and stats.loans_copied == 0
    assert got["transports"] == ["shm"]
    position = index_of(message, frame)
    assert got["where"][position] == where  # the loan's own bytes
    assert not any(got["writeable"]) and not any(got["misaligned"])
    assert got["digest"] == digest(copied)
    # The same content copied: the same message on the other side.
    same = await hop(pub, describer, copied)
    assert same["digest"] == got["digest"]
    assert same["where"][position] != where
    stats = pub.shm_statistics()
    assert stats is not None and stats.loans_published == 1 and stats.zero_copy == 2


async def test_the_4k_frame_tuple_and_a_bare_loan_side_by_side(
    ctx: ezflow.GraphContext, describer: Child
) -> None:
    """The benchmark's message (a 3840x2160x3 frame in a tuple) and the bare loaned
    frame of before: both without a copy, the bare one laid out as it always was."""
    pub = await ctx.publisher("/shm/described")
    await pub.wait_for_channels(1)
    for i, wrap in enumerate((lambda f: ("phase", 1, time.perf_counter_ns(), f), lambda f: f)):
        frame = await pub.loan((2160, 3840, 3))
        frame[:] = i
        frame[-1, -1, -1] = 200
        where = shm_location(frame)
        message = wrap(frame)
        got = await hop(pub, describer, message)
        assert got["where"][index_of(message, frame)] == where
        assert got["digest"] == digest(private_copy(message, frame))
        del frame, message
    stats = pub.shm_statistics()
    assert stats is not None and stats.loans_published == 2 and stats.loans_copied == 0


async def test_loans_that_cannot_go_without_a_copy_are_copied_and_counted(
    ctx: ezflow.GraphContext, describer: Child
) -> None:
    pub = await ctx.publisher("/shm/described")
    await pub.wait_for_channels(1)
    room = ezflow._core._config.SHM_LOAN_ROOM

    async def check(message: Any, frame: np.ndarray, *, published: int, copied: int) -> None:
        before = pub.shm_statistics()
        where = shm_location(frame)
        expected = digest(private_copy(message, frame))
        got = await hop(pub, describer, message)
        after = pub.shm_statistics()
        assert before is not None and after is not None
        assert after.loans_published - before.loans_published == published
        assert after.loans_copied - before.loans_copied == copied
        assert got["digest"] == expected
        assert (got["where"][index_of(message, frame)] == where) == bool(published)
        assert not frame.flags.writeable

    # more bytes before the frame than the room holds, and after it
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 2)
    await check((np.ones(room, np.uint8), frame), frame, published=0, copied=1)
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 3)
    await check({"f": frame, "big": b"z" * 2 * room}, frame, published=0, copied=1)
    # just within the room on both sides
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 4)
    within = np.ones(room - 512, np.uint8)
    await check((within, frame, within), frame, published=1, copied=0)
    # the same frame twice: its second reference does not fit the room
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 5)
    await check((frame, 1, frame), frame, published=0, copied=1)
    # two loans in one message: the larger goes as it is, the other is copied beside it
    small = await pub.loan(1000, np.float32)  # 4000 bytes: fits the room
    small[:] = 0.5
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 6)
    await check((small, frame), frame, published=1, copied=1)
    assert not small.flags.writeable
    # a view of a loan is an array like any other: copied; the loan stays the caller's
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 7)
    view = frame[1:]
    before = pub.shm_statistics()
    got = await hop(pub, describer, ("view", view))
    assert got["digest"] == digest(("view", view.copy()))
    after = pub.shm_statistics()
    assert before is not None and after is not None
    assert (after.loans_published, after.loans_copied) == (
        before.loans_published,
        before.loans_copied,
    )
    assert frame.flags.writeable
    await check(("then", frame), frame, published=1, copied=0)


def container_with_loan(depth: int) -> Any:
    """Strategy: a function from a frame to a message holding it at *depth* levels
    of random tuples, lists, dicts and LoanedFrames, with random values beside it."""
    small_arrays = hnp.arrays(
        st.sampled_from([np.uint8, np.int16, np.float32, np.float64, np.complex64]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
    )
    values = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(),
        st.text(max_size=12),
        st.binary(max_size=40),
        st.binary(min_size=1024, max_size=1200),  # out of band, copied on decode
        small_arrays,
        st.sampled_from([512, 3000, 6000]).map(lambda n: np.full(n, n % 251, np.uint8)),
    )
    siblings = st.lists(values, max_size=3)
    kinds = st.lists(st.sampled_from(["tuple", "list", "dict", "dataclass"]), max_size=depth)

    @st.composite
    def build(draw: Any) -> Callable[[np.ndarray], Any]:
        layers = [(kind, draw(siblings), draw(siblings)) for kind in draw(kinds)]

        def wrap(frame: np.ndarray) -> Any:
            node: Any = frame
            for kind, before, after in layers:
                if kind == "tuple":
                    node = (*before, node, *after)
                elif kind == "list":
                    node = [*before, node, *after]
                elif kind == "dict":
                    node = {
                        **{f"b{i}": v for i, v in enumerate(before)},
                        "frame": node,
                        **{f"a{i}": v for i, v in enumerate(after)},
                    }
                else:
                    node = LoanedFrame(head=before, frame=node, tail=after)
            return node

        return wrap

    return build()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    wrap=container_with_loan(4),
    nbytes=st.sampled_from([70_000, 255_000, 400_000]),  # a slot, a whole slot, out of line
    dtype=st.sampled_from([np.uint8, np.float32]),
)
async def test_a_loan_in_a_random_message_arrives_as_a_copied_one_would(
    ctx: ezflow.GraphContext, describer: Child, wrap: Any, nbytes: int, dtype: Any
) -> None:
    """Differential: a loan inside a random container against the same content with a
    private array. Counted once either way; when counted as published, the subscriber's
    array is the loan's own bytes; and the room rule holds at its two ends."""
    pub = await ctx.publisher("/shm/described")
    await pub.wait_for_channels(1)
    try:
        frame = await pub.loan(nbytes // np.dtype(dtype).itemsize, dtype)
        fill(frame.view(np.uint8), nbytes)
        message = wrap(frame)
        copied = private_copy(message, frame)
        where = shm_location(frame)
        other = Codec().encode(copied).nbytes - frame.nbytes
        before = pub.shm_statistics()
        got = await hop(pub, describer, message)
        after = pub.shm_statistics()
        assert before is not None and after is not None
        assert got["digest"] == digest(copied)
        published = after.loans_published - before.loans_published
        event("published" if published else "copied")
        assert published + after.loans_copied - before.loans_copied == 1
        assert (got["where"][index_of(message, frame)] == where) == bool(published)
        assert not any(got["misaligned"])
        room = ezflow._core._config.SHM_LOAN_ROOM
        if other <= 1024:
            assert published
        if other > 2 * room + 256:
            assert not published
        assert not frame.flags.writeable
        # the copying publish of the same content, through the same hop
        assert (await hop(pub, describer, copied))["digest"] == got["digest"]
    finally:
        await pub.aclose()


@pytest.mark.parametrize("transport", ["local", "tcp", None])
async def test_a_loan_inside_a_message_is_spent_on_every_transport(
    ctx: ezflow.GraphContext, transport: str | None
) -> None:
    """Read-only after publish, its loan spent (the block comes back once the array is
    gone) with a local or tcp subscriber only, or none; another loan outstanding stays
    the caller's."""
    pub = await ctx.publisher(f"/shm/spent/{transport}")
    sub = None
    if transport is not None:
        sub = await ctx.subscriber(f"/shm/spent/{transport}", transport=transport)
    spare = await pub.loan(1000)  # outstanding throughout: publish has to look
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 8)
    message = {"meta": [1, 2], "frames": (LoanedFrame(head=0, frame=frame, tail=None),)}
    await pub.publish(message)
    assert not frame.flags.writeable and spare.flags.writeable
    if sub is not None:
        got = await sub.recv()
        assert np.array_equal(got["frames"][0].frame, frame)
        assert not got["frames"][0].frame.flags.writeable
        del got
    stats = pub.shm_statistics()
    assert stats is not None and stats.loans_published == 0 and stats.in_use == 2
    del frame, message
    gc.collect()

    async def one_left() -> bool:
        stats = pub.shm_statistics()
        return stats is not None and stats.in_use == 1

    await wait_until(one_left, "one block left", 2)
    assert spare.flags.writeable


async def test_the_block_of_a_loan_in_a_message_lives_while_either_side_holds_it(
    shm_pair: Any,
) -> None:
    pub, sub = await shm_pair("/shm/held")

    async def in_use() -> int:
        await asyncio.sleep(0.02)  # releases run on the loop
        stats = pub.shm_statistics()
        assert stats is not None
        return stats.in_use

    # the subscriber keeps its message after the publisher let go of the frame
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 9)
    await pub.publish(("a", frame))
    got = await sub.recv()
    assert np.array_equal(got[1], frame)
    del frame
    assert await in_use() == 1
    kept = got[1][100:200]  # a slice of the message keeps it too
    del got
    assert await in_use() == 1
    assert np.all(kept.reshape(-1)[:3] == kept.reshape(-1)[:3])
    del kept
    assert await in_use() == 0
    # the publisher keeps the frame after the subscriber let go of the message
    frame = await pub.loan(FRAME_SHAPE)
    fill(frame, 10)
    await pub.publish({"f": frame})
    got = await sub.recv()
    del got
    assert await in_use() == 1
    expected = frame.copy()
    for _ in range(3):  # other messages take other blocks
        await pub.publish(np.zeros(FRAME_SHAPE, np.uint8))
        del _
        assert not np.any(await sub.recv())
    assert await in_use() == 1
    assert np.array_equal(frame, expected)
    del frame
    assert await in_use() == 0
    stats = pub.shm_statistics()
    assert stats is not None and stats.loans_published == 2


async def test_a_loan_in_a_message_to_two_channels_is_laid_out_once(
    ctx: ezflow.GraphContext, shm_pair: Any
) -> None:
    pub, sub = await shm_pair("/shm/twice")
    async with ezflow.GraphContext(ctx.address, auto_start=False) as other:
        sub2 = await other.subscriber("/shm/twice", transport="shm")
        await pub.wait_for_channels(2)
        frame = await pub.loan(FRAME_SHAPE)
        fill(frame, 11)
        await pub.publish(("both", frame))
        first, second = await sub.recv(), await sub2.recv()
        assert first[0] == second[0] == "both"
        assert np.array_equal(first[1], frame) and np.array_equal(second[1], frame)
        stats = pub.shm_statistics()
        assert stats is not None
        assert (stats.loans_published, stats.zero_copy, stats.in_use) == (1, 2, 1)
        del first, second, frame

        async def all_free() -> bool:
            stats = pub.shm_statistics()
            return stats is not None and stats.in_use == 0

        await wait_until(all_free, "every block free", 2)


async def test_a_killed_publisher_leaves_a_loaned_view_valid(ctx: ezflow.GraphContext) -> None:
    sub = await ctx.subscriber("/shm/loankill", transport="shm")
    child = await Child.start(
        "publish_loaned",
        loop_kind(),
        address=list(ctx.address),
        topic="/shm/loankill",
        shape=list(FRAME_SHAPE),
    )
    try:
        await child.event("ready")
        published = await child.event("published")
        assert published["loans_published"] == 1
        phase, seq, t_ns, frame = await asyncio.wait_for(sub.recv(), 5)
        assert (phase, seq, t_ns) == ("phase", 1, 2)
        assert shm_location(frame) == published["where"]  # the child's loan, mapped here
        expected = np.arange(frame.size) % 251
        os.kill(child.pid, signal.SIGKILL)
        await child.process.wait()

        async def swept() -> bool:
            return not segments_of(child.pid)

        await wait_until(swept, "the segments swept", 3.0)
        assert np.array_equal(frame.reshape(-1), expected)  # mapped still, unchanged
    finally:
        await child.aclose()


# -- flow control ------------------------------------------------------------------------------


async def test_a_leaky_shm_subscriber_never_holds_the_publisher_back(shm_pair: Any) -> None:
    pub, sub = await shm_pair("/shm/leaky", leaky=True, queue=2)
    pub_lossless = pub
    for i in range(300):
        await asyncio.wait_for(pub_lossless.publish(np.full(200 * KiB, i % 256, np.uint8)), 1)
    await asyncio.sleep(0.1)
    taken = 0
    while sub.queued:
        last = sub.recv_nowait()
        taken += 1
    assert int(last[0]) == 299 % 256  # the newest one is there
    assert taken + sub.statistics().dropped == 300


async def test_a_lossless_shm_subscriber_gets_everything_in_order(shm_pair: Any) -> None:
    pub, sub = await shm_pair("/shm/lossless")
    sizes = [100, 70 * KiB, 300 * KiB]

    async def produce() -> None:
        for i in range(600):
            await pub.publish(mixed_payload(i, sizes))

    producing = asyncio.ensure_future(produce())
    for i in range(600):
        message = await asyncio.wait_for(sub.recv(), 5)
        assert np.array_equal(message, mixed_payload(i, sizes)), i
        if i % 50 == 0:
            await asyncio.sleep(0.01)  # a slow moment: the publisher must wait, not drop
    await producing
    assert pub.statistics().waits > 0 and pub.statistics().drops == 0


async def test_a_burst_of_large_messages_is_notified_once_a_loop_turn(shm_pair: Any) -> None:
    """Back to back, the notifications of large messages wait for the end of the loop
    turn and go together (one write, one wake-up of the subscriber); a paced message's
    goes out at once, before ``publish`` returns."""
    pub, sub = await shm_pair("/shm/burst")
    (link,) = pub._outlet._links
    assert isinstance(link, _ShmLink)
    frames = [np.full(300 * KiB, i, dtype=np.uint8) for i in range(8)]
    for paced in range(3):
        await asyncio.sleep(0.02)  # the publisher's thread sleeps: the next one is paced
        await pub.publish(frames[0])
        assert not link._queued  # written at once
        await asyncio.sleep(0)  # a turn of the loop, without sleeping: still a burst
        for frame_ in frames[1:4]:
            await pub.publish(frame_)
        assert len(link._queued) == 3  # waiting for the end of the turn, together
        for i in range(4):
            assert (await asyncio.wait_for(sub.recv(), 5))[0] == i, paced
        assert not link._queued


# -- crashes -----------------------------------------------------------------------------------


async def test_killed_publisher_ends_cleanly_and_its_segments_are_reclaimed(
    ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    sub = await ctx.subscriber("/shm/pubkill")
    healthy = await ctx.publisher("/shm/pubkill")
    child = await Child.start(
        "publish_forever",
        loop_kind(),
        address=list(ctx.address),
        topic="/shm/pubkill",
        size=100_000,  # 800 kB: out-of-line blocks
        pace=0.001,
    )
    try:
        await child.event("ready")
        held = await asyncio.wait_for(sub.recv(), 5)  # keep one: its mapping outlives it
        assert held.nbytes == 800_000
        assert sorted(c.transport for c in ctx.channels) == ["local", "shm"]
        assert segments_of(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()

        async def publisher_gone() -> bool:
            graph = await ctx.graph()
            return len(graph["publishers"]) == 1

        assert await wait_until(publisher_gone, "the publisher gone", 2.0) < 2.0

        async def reclaimed() -> bool:
            return not segments_of(child.pid)

        await wait_until(reclaimed, "the blocks reclaimed", 3.0)
        assert time.monotonic() - killed < 3.0
        assert np.all(held == held[0])  # still readable, unchanged
        while sub.queued:
            sub.recv_nowait()
        await healthy.publish(np.array([-1]))
        assert (await asyncio.wait_for(sub.recv(), 2)).tolist() == [-1]
        assert "Traceback" not in caplog.text
    finally:
        await child.aclose()


@pytest.mark.parametrize(
    "options",
    [None, ezflow.ShmOptions(slot_count=2, slot_size=128 * KiB)],
    ids=["ring", "overflow"],  # (2 slots: the window's other messages overflow)
)
async def test_killed_subscriber_holding_blocks_releases_the_publisher(
    ctx: ezflow.GraphContext, options: ezflow.ShmOptions | None
) -> None:
    pub = await ctx.publisher("/shm/subkill", max_in_flight=8, shm=options)
    child = await Child.start(
        "subscribe_forever",
        loop_kind(),
        address=list(ctx.address),
        topic="/shm/subkill",
        stall=True,
    )
    try:
        await child.event("ready")
        await pub.wait_for_channels(1)

        async def publish_many() -> None:
            for i in range(100):
                await pub.publish(np.full(100 * KiB, i % 256, dtype=np.uint8))

        publishing = asyncio.ensure_future(publish_many())
        await asyncio.sleep(0.3)  # a window: publishing may not end in it
        assert not publishing.done()  # the stalled child holds the window and its blocks
        stats = pub.shm_statistics()
        assert stats is not None and stats.in_use >= 1
        os.kill(child.pid, signal.SIGKILL)
        started = time.monotonic()
        await asyncio.wait_for(publishing, 2.0)
        assert time.monotonic() - started < 2.0
        stats = pub.shm_statistics()
        assert stats is not None and stats.in_use == 0  # its leases went with it
        if options is not None:
            ring = shm_of(ctx)._shm[pub.id].ring
            assert ring.stats.slot_overflows >= 1  # blocks of its own held, and freed
    finally:
        await child.aclose()


def leave_a_stale_segment() -> str:
    """A child process creates a segment and dies without unlinking it."""
    script = (
        "import os; from ezflow._transports._segment import ShmSegment\n"
        "s = ShmSegment.create(4096, tag='ring'); print(s.name, flush=True); os._exit(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    name = done.stdout.strip()
    assert segment_exists(name)
    return name


def segment_exists(name: str) -> bool:
    return os.path.exists(os.path.join(shm_dir(), name))


# -- unlinking off the loop ------------------------------------------------------------------


async def test_segments_a_publisher_gives_up_are_unlinked_off_the_loop() -> None:
    """A ring handing its segments to a SegmentUnlinker: closed at once, unlinked in a
    worker thread (each while still owned: the unlink itself checks), all gone once
    ``wait`` returns; the caller's cancellation stops none of it."""
    unlinker = SegmentUnlinker()
    threads: list[int] = []

    def unlink(segment: ShmSegment) -> None:
        def recorded() -> None:
            threads.append(threading.get_ident())
            original()

        original = segment.unlink
        segment.unlink = recorded  # type: ignore[method-assign]
        unlinker.unlink(segment)

    for cancel in (False, True):
        threads.clear()
        ring = ShmRing(4, 4 * KiB, max_bytes=4 * MiB, unlink=unlink)
        blocks = [ring.acquire(n) for n in (KiB, 600 * KiB, 700 * KiB)]  # the ring, 2 out of line
        names = {block.descriptor.segment for block in blocks if block is not None}
        assert len(names) == 3 and all(segment_exists(name) for name in names)
        del blocks
        ring.close()
        waiting = asyncio.ensure_future(unlinker.wait())
        if cancel:
            await asyncio.sleep(0)
            waiting.cancel()
            for _ in range(500):  # the worker goes on: gone within 5 s
                if not any(segment_exists(name) for name in names):
                    break
                await asyncio.sleep(0.01)
        else:
            await asyncio.wait_for(waiting, 10)
        assert not any(segment_exists(name) for name in names)
        assert len(threads) == 3 and threading.get_ident() not in threads
    # Without a running loop (nothing to keep free), at once.
    segment = ShmSegment.create(KiB)
    await asyncio.to_thread(unlinker.unlink, segment)
    assert not segment_exists(segment.name)
    segment.close()


async def test_segments_of_dead_processes_are_swept_when_a_server_starts() -> None:
    name = leave_a_stale_segment()
    async with ezflow.GraphServer(("127.0.0.1", 0)):
        assert not segment_exists(name)


async def test_segments_of_dead_processes_are_swept_when_a_publisher_starts() -> None:
    name = leave_a_stale_segment()
    transport = ShmTransport(max_message_size=1 << 20, codec=Codec())
    try:
        await transport.start()  # what the first publisher of a process does
        assert not segment_exists(name)
    finally:
        await transport.aclose()


# -- choice and fallback -----------------------------------------------------------------------


async def test_shm_is_chosen_for_other_processes_and_can_be_forced_or_refused(
    ctx: ezflow.GraphContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    pub = await ctx.publisher("/shm/choice")
    local = await ctx.subscriber("/shm/choice")
    forced = await ctx.subscriber("/shm/choice", transport="shm")
    tcp = await ctx.subscriber("/shm/choice", transport="tcp")
    assert sorted(c.transport for c in ctx.channels) == ["local", "shm", "tcp"]
    await pub.publish(np.arange(100_000))
    for sub in (local, forced, tcp):
        assert np.array_equal(await sub.recv(), np.arange(100_000))
    monkeypatch.setenv("EZFLOW_TRANSPORT", "shm")
    async with ezflow.GraphContext(ctx.address, auto_start=False) as other:
        via_env = await other.subscriber("/shm/choice")
        assert [c.transport for c in other.channels] == ["shm"]
        await pub.publish(np.arange(3))
        assert (await via_env.recv()).tolist() == [0, 1, 2]


async def test_shm_that_cannot_be_created_falls_back_to_tcp_once(
    ctx: ezflow.GraphContext, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # /dev/shm full or missing: creating the publisher's ring fails.
    def refuse(size: int, *, tag: str = "") -> ShmSegment:
        raise ezflow.BrokenResourceError("shared memory is unavailable: no space left")

    pub = await ctx.publisher("/shm/fallback")
    monkeypatch.setattr(ShmSegment, "create", staticmethod(refuse))
    # Another process: its edge falls back to tcp, and everything arrives.
    child = await Child.start(
        "subscribers",
        loop_kind(),
        address=list(ctx.address),
        topic="/shm/fallback",
        subs=1,
        count=100,
        size=16,
        transport="shm",
    )
    try:
        await child.event("ready")
        await pub.wait_for_channels(1)
        for i in range(100):
            await pub.publish(payload(i, 16))
        done = await child.event("done", timeout=30)
        assert done["errors"] == [] and done["transports"] == ["tcp"]
        assert await child.stop() == 0
    finally:
        await child.aclose()
    # This process: said once, however many edges and route changes follow.
    with caplog.at_level(logging.WARNING, logger="ezflow"):
        first = await ctx.subscriber("/shm/fallback", transport="shm")
        assert [c.transport for c in ctx.channels] == ["tcp"]
        await pub.publish(np.arange(10))
        assert (await first.recv()).tolist() == list(range(10))
        # Later edges from that publisher skip shm: here the automatic choice, local.
        second = await ctx.subscriber("/shm/fallback", transport="shm")
        await pub.publish(np.arange(3))
        assert (await first.recv()).tolist() == (await second.recv()).tolist() == [0, 1, 2]
    said = [r.getMessage() for r in caplog.records if "cannot use shared memory" in r.getMessage()]
    assert len(said) == 1 and "no space left" in said[0] and "use tcp" in said[0]


async def test_a_ring_that_cannot_be_created_later_sends_inline_and_says_so_once(
    shm_pair: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rings are created at their first large message: if /dev/shm is full by then, the
    messages travel inline on the same socket - nothing lost, one warning."""
    pub, sub = await shm_pair("/shm/late")

    def refuse(size: int, *, tag: str = "", populate: bool = False) -> ShmSegment:
        raise ezflow.BrokenResourceError("shared memory is unavailable: no space left")

    monkeypatch.setattr(ShmSegment, "create", staticmethod(refuse))
    with caplog.at_level(logging.WARNING, logger="ezflow"):
        for i in range(3):
            await pub.publish(np.full(200_000, i, np.uint8))
            got = await sub.recv()
            assert got.shape == (200_000,) and np.all(got == i)
    stats = pub.shm_statistics()
    assert stats is not None and stats.zero_copy == 0 and stats.no_block == 3
    said = [r.getMessage() for r in caplog.records if "shared memory failed" in r.getMessage()]
    assert len(said) == 1 and "inline" in said[0]


async def test_a_publisher_of_small_messages_creates_no_ring(shm_pair: Any) -> None:
    pub, sub = await shm_pair("/shm/small")
    for i in range(100):
        await pub.publish(i)
        assert await sub.recv() == i
    stats = pub.shm_statistics()
    assert stats is not None and stats.shm_bytes == 0 and stats.inline == 100


async def test_shm_stats_keep_the_counts_of_channels_gone_by(
    shm_pair: Any, ctx: ezflow.GraphContext
) -> None:
    options = ezflow.ShmOptions(inline_limit=1 * KiB)
    pub, sub = await shm_pair("/shm/gone", options)
    for i in range(10):
        await pub.publish(np.full(100 if i % 2 else 4 * KiB, i, dtype=np.uint8))
        await sub.recv()
    await sub.aclose()

    async def channel_gone() -> bool:
        return pub.channels == 0

    await wait_until(channel_gone, "the channel gone", 5)
    stats = pub.shm_statistics()
    assert stats is not None and (stats.inline, stats.zero_copy, stats.no_block) == (5, 5, 0)


async def test_forcing_shm_to_a_publisher_on_another_host_uses_tcp(
    ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    remote = PublisherInfo(
        publisher_id="p-remote",
        topic="/shm/remote",
        client_id="c9",
        host_id="another-host/0",
        pid=1,
        address=("192.0.2.1", 4000),
        shm_address=f"ezflow-1-{'0' * 16}",
    )
    sub = await ctx.subscriber("/shm/remote", transport="shm")
    router = ctx._router
    assert router is not None
    with caplog.at_level(logging.WARNING, logger="ezflow"):
        assert router.choose_transport(remote, sub) == "tcp"
        assert router.choose_transport(remote, sub) == "tcp"
    said = [r.getMessage() for r in caplog.records if "transport 'shm' asked for" in r.getMessage()]
    assert len(said) == 1 and "using tcp" in said[0]
    same_host = dataclasses.replace(remote, host_id=router.host_id)
    assert router.choose_transport(same_host, sub) == "shm"


# -- hostile peers -----------------------------------------------------------------------------


def control(kind: int, message: dict[str, Any]) -> bytes:
    body = bytes([kind]) + msgpack.packb(message)
    return struct.pack("<I", len(body)) + body


async def test_garbage_free_records_close_only_that_channel(ctx: ezflow.GraphContext) -> None:
    pub = await ctx.publisher("/shm/free")
    sub = await ctx.subscriber("/shm/free", transport="shm")
    address = shm_of(ctx).address
    assert address is not None
    loop = asyncio.get_running_loop()
    for garbage in (
        struct.pack("<I", 5) + bytes([FREE]) + b"\x00" * 4,  # truncated header
        struct.pack("<I", 8) + FREE_HEADER.pack(FREE, 1000),  # claims 1000 records
    ):
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.setblocking(False)
        await loop.sock_connect(raw, "\0" + address)
        hello = {
            "op": "hello",
            "protocol": PROTOCOL,
            "publisher_id": pub.id,
            "lossless": False,
            "max_message_size": 1 << 20,
        }
        await loop.sock_sendall(raw, control(HELLO, hello))
        welcome = await asyncio.wait_for(loop.sock_recv(raw, 65536), 5)
        assert welcome[4] == WELCOME
        await loop.sock_sendall(raw, garbage)
        closed = False
        for _ in range(50):
            try:
                data = await asyncio.wait_for(loop.sock_recv(raw, 65536), 2)
            except ConnectionResetError:
                closed = True
                break
            if not data:
                closed = True
                break
        raw.close()
        assert closed
    await pub.publish(np.arange(100_000))
    assert np.array_equal(await sub.recv(), np.arange(100_000))
    assert pub.channels == 1


async def test_a_hostile_publisher_loses_its_channel_only(caplog: pytest.LogCaptureFixture) -> None:
    """A "publisher" whose notifications point outside its segment, at a segment that is
    not there, or at a bad name: the channel closes with a clear error, nothing else."""
    codec = Codec()
    name = f"ezflow-{os.getpid()}-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(4)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    transport = ShmTransport(max_message_size=1 << 20, codec=codec)
    info = PublisherInfo(
        publisher_id="p-hostile",
        topic="/hostile",
        client_id="c0",
        host_id="h",
        pid=os.getpid(),
        address=("127.0.0.1", 1),
        shm_address=name,
    )
    with ShmSegment.create(4096, tag="ring") as ring:

        def note(segment: str, offset: int, length: int) -> bytes:
            name = segment.encode()
            return (
                SHM_PREFIX.pack(
                    SHM_HEADER.size + len(name), SHM_DATA, 0, 1, 0, 0, 0, 1, offset, length
                )
                + name
            )

        notes = [
            note(ring.name, 4000, 200),  # runs past the end of the segment
            note(f"ezflow-1-1-{'0' * 16}-gone", 0, 10),  # no such segment
            note("../../etc/passwd", 0, 10),  # not a segment name at all
        ]
        try:
            for data in notes:
                lost = asyncio.Event()
                channel = Channel("p-hostile", "/hostile", codec)
                inbox = Inbox()
                channel.attach(inbox)
                opening = asyncio.ensure_future(
                    transport.open_channel(channel, info, on_lost=lost.set)
                )
                peer, _ = await asyncio.wait_for(loop.sock_accept(listener), 5)
                await asyncio.wait_for(loop.sock_recv(peer, 65536), 5)  # HELLO
                welcome = {"op": "welcome", "ok": True, "max_in_flight": 8, "segment": ring.name}
                await loop.sock_sendall(peer, control(WELCOME, welcome))
                inbound = await asyncio.wait_for(opening, 5)
                await loop.sock_sendall(peer, data)
                await asyncio.wait_for(lost.wait(), 5)
                assert len(inbox) == 0
                inbound.close()
                peer.close()
        finally:
            listener.close()
            await transport.aclose()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 3
    assert all("unusable shared-memory notification" in e for e in errors)
    assert "Traceback" not in caplog.text


async def test_a_loan_waits_while_the_window_is_full(shm_pair: Any) -> None:
    pub, sub = await shm_pair("/shm/loanwait")
    pub._outlet.max_in_flight = 2  # a small window, to fill it quickly
    for _ in range(2):
        await pub.publish(await pub.loan(100_000))
    loaning = asyncio.ensure_future(pub.loan(100_000))
    await asyncio.sleep(0.1)  # a window: the loan may not be granted in it
    assert not loaning.done()  # nothing taken while publish would have to wait
    stats = pub.shm_statistics()
    assert stats is not None and stats.loans == 2
    await sub.recv()  # room again
    frame = await asyncio.wait_for(loaning, 2)
    assert frame.flags.writeable
    await pub.publish(frame)  # the window is full again
    loaning = asyncio.ensure_future(pub.loan(100_000))
    await asyncio.sleep(0.05)  # the loan waits (no state to look at: it is a future)
    loaning.cancel()  # a cancelled loan takes nothing
    with pytest.raises(asyncio.CancelledError):
        await loaning
    stats = pub.shm_statistics()
    assert stats is not None and stats.loans == 3


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_sizes_and_kept_messages_never_corrupt(
    ctx: ezflow.GraphContext, shm_pair: Any, seed: int
) -> None:
    """Random sizes around every boundary, random messages kept and dropped, and a leaky
    subscriber in another channel that reads only now and then: every message arrives
    intact, every kept one stays intact, and once nothing is kept every block is free."""
    rng = np.random.default_rng(seed)
    slot, inline = 8 * KiB, 1 * KiB
    options = ezflow.ShmOptions(
        slot_count=6, slot_size=slot, inline_limit=inline, max_bytes=1 * MiB
    )
    topic = f"/shm/random{seed}"
    pub, sub = await shm_pair(topic, options)
    async with ezflow.GraphContext(ctx.address, auto_start=False) as other:
        leaky = await other.subscriber(topic, leaky=True, queue=2, transport="shm")
        sizes = [8, inline - 100, inline + 1, slot - 200, slot, slot + 1, 100 * KiB, 400 * KiB]
        kept: dict[int, Any] = {}
        for i in range(400):
            size = int(rng.choice(sizes)) + int(rng.integers(0, 64))
            await pub.publish(np.full(size, i % 251, dtype=np.uint8))
            got = await sub.recv()
            assert got.shape == (size,) and got[0] == i % 251 and got[-1] == i % 251, i
            if rng.random() < 0.2:
                kept[i] = got
            if kept and rng.random() < 0.1:
                del kept[int(rng.choice(list(kept)))]
            del got
            if rng.random() < 0.05:
                await asyncio.sleep(0.002)  # the leaky subscriber catches up now and then
                while leaky.queued:
                    late = leaky.recv_nowait()
                    assert np.all(late == late[0])
                    del late
        assert all(np.all(message == i % 251) for i, message in kept.items())
        kept.clear()
        stats = pub.shm_statistics()
        assert stats is not None and stats.zero_copy > 0 and stats.inline > 0
        while leaky.queued:
            leaky.recv_nowait()
        assert leaky.statistics().dropped > 0

    async def all_free() -> bool:
        stats = pub.shm_statistics()
        return stats is not None and stats.in_use == 0

    await wait_until(all_free, "every block free", 2)


def test_no_resource_tracker_and_nothing_on_stderr() -> None:
    """Shared memory is handled without multiprocessing's resource_tracker (which would
    unlink segments other processes still use and warn about "leaks" at exit)."""
    script = """if True:
        import sys, numpy as np, ezflow

        async def main():
            async with ezflow.GraphContext(("127.0.0.1", 0)) as ctx:
                pub = await ctx.publisher("/rt")
                sub = await ctx.subscriber("/rt", transport="shm")
                frame = await pub.loan(1 << 20)
                frame[:] = 1
                await pub.publish(frame)
                await pub.publish(np.ones(1 << 20, np.uint8))
                assert (await sub.recv()).sum() == (await sub.recv()).sum() == 1 << 20
                print(sorted(c.transport for c in ctx.channels))

        ezflow.lowlevel.run_coroutine(main())
        print(sorted(m for m in sys.modules if "resource_tracker" in m or "shared_memory" in m))
    """
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['shm']", "[]"]
    # Only its embedded graph server's one line for each hostile entry of the shm
    # directory (conftest), as a warning, once.
    lines = done.stderr.splitlines()
    assert all(line.startswith("ignoring ") for line in lines), done.stderr
    assert len(lines) == len(set(lines)) == len(HOSTILE_ENTRIES)
