"""The outlet's paths through real edges: the small-array path (one bytes body written
at once) against the general one, its limits and parking, and the CPU handoff after a
paced publish to shm subscribers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
from _messages import messages, outcome, templated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ezflow
from ezflow._core import _outlet
from ezflow._core._codec import SMALL_BODY, Codec, EncodedMessage, _encode_general
from ezflow._core._config import (
    PUBLISH_YIELD_BYTES,
    PUBLISH_YIELD_EVERY,
    PUBLISH_YIELD_LARGE_BYTES,
    SHM_COPY_NT_BYTES,
)
from ezflow._transports._shm import ShmTransport

needs_shm = pytest.mark.skipif(not ShmTransport.available(), reason="needs Linux shared memory")


def _arrays() -> list[np.ndarray[Any, Any]]:
    """A stream in which one kind repeats (the small path) and other kinds cut in."""
    out: list[np.ndarray[Any, Any]] = []
    for i in range(40):
        out.append(np.arange(i, i + 16, dtype=np.int64))
        if i % 7 == 3:
            out.append(np.full((2, 3), i, dtype=">f4"))
        if i % 11 == 5:
            out.append(np.arange(24, dtype=np.uint16).reshape(4, 6).T)  # not contiguous
        if i % 13 == 6:
            out.append(np.arange(1024, dtype=np.int64))  # above the small-body limit
    return out


@pytest.mark.parametrize("transport", ["tcp", pytest.param("shm", marks=needs_shm)])
async def test_small_arrays_arrive_whole_and_in_order_on_either_path(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    pub = await ctx.publisher("/outlet/small")
    sub = await ctx.subscriber("/outlet/small", transport=transport)
    sent = _arrays()
    for arr in sent:
        await pub.publish(arr)
        got = await sub.recv()
        assert got.dtype == arr.dtype and got.shape == arr.shape
        assert np.array_equal(got, arr)
        assert not got.flags.writeable
    codec = Codec()
    assert pub.statistics().messages == pub.statistics().encodes == len(sent)
    assert pub.statistics().bytes == sum(codec.encode(arr).nbytes for arr in sent)
    assert sub.statistics().received == len(sent)


async def test_a_local_subscriber_beside_a_remote_one_gets_its_read_only_view(
    ctx: ezflow.GraphContext,
) -> None:
    pub = await ctx.publisher("/outlet/mixed")
    local = await ctx.subscriber("/outlet/mixed", transport="local")
    remote = await ctx.subscriber("/outlet/mixed", transport="tcp")
    for i in range(20):
        arr = np.arange(i, i + 8, dtype=np.int32)
        await pub.publish(arr)
        mine, theirs = await local.recv(), await remote.recv()
        assert np.shares_memory(mine, arr) and not mine.flags.writeable
        assert np.array_equal(theirs, arr) and not np.shares_memory(theirs, arr)
    assert arr.flags.writeable  # the publisher's own array is left as it was


async def test_an_encoded_publish_sends_its_body_as_it_is_and_the_object_locally(
    ctx: ezflow.GraphContext,
) -> None:
    # A relay (the Zenoh bridge) has each message's body already: it is not encoded again.
    pub = await ctx.publisher("/outlet/encoded")
    local = await ctx.subscriber("/outlet/encoded", transport="local")
    remote = await ctx.subscriber("/outlet/encoded", transport="tcp")
    codec = Codec()
    sent = [(i, "x", np.arange(i, i + 4, dtype=np.int16)) for i in range(5)]
    bodies = [codec.encode(m).to_bytes() for m in sent]
    for body in bodies:
        view = memoryview(b"\0" * 16 + body)[16:]  # (a body inside a batch's payload)
        await pub.publish_encoded(codec.decode(body), view)
    for message in sent:
        for sub in (local, remote):
            got = await sub.recv()
            assert got[:2] == message[:2] and np.array_equal(got[2], message[2])
    assert pub.statistics().messages == len(sent) and pub.statistics().encodes == 0
    assert pub.statistics().bytes == sum(len(b) for b in bodies)


async def test_a_cached_kind_too_large_for_a_subscriber_is_refused_before_sending(
    ctx: ezflow.GraphContext,
) -> None:
    small = ezflow.GraphContext(ctx.address, auto_start=False, max_message_size=256)
    async with small:
        sub = await small.subscriber("/outlet/limit", transport="tcp")
        pub = await ctx.publisher("/outlet/limit")
        await pub.wait_for_channels(1)
        big = np.zeros(64, dtype=np.int64)  # a 512-byte array, over 256 with its header
        for _ in range(3):  # the third encode of this kind takes the small path
            with pytest.raises(ezflow.MessageTooLargeError, match="max_message_size"):
                await pub.publish(big)
        await pub.publish(np.arange(4, dtype=np.int64))
        assert (await sub.recv()).tolist() == [0, 1, 2, 3]
        assert pub.statistics().messages == 1


async def test_a_small_array_parked_for_a_full_leaky_channel_is_sent_when_room_frees(
    ctx: ezflow.GraphContext,
) -> None:
    pub = await ctx.publisher("/outlet/park", max_in_flight=1)
    sub = await ctx.subscriber("/outlet/park", transport="tcp", leaky=True)
    await pub.wait_for_channels(1)
    last = 0
    for i in range(1, 200):
        last = i
        await pub.publish(np.full(16, i, dtype=np.int64))
    assert pub.statistics().drops > 0  # parked messages replaced by newer ones
    newest = None
    async with asyncio.timeout(5):
        while newest is None or newest[0] != last:
            newest = await sub.recv()
    assert np.array_equal(newest, np.full(16, last, dtype=np.int64))


class _LoopTurns:
    """Counts the running loop's turns (a task that yields at every turn), from when
    :attr:`count` is set to 0: in a test where nothing waits, its publisher's yields."""

    def __init__(self) -> None:
        self.count = 0

    async def __aenter__(self) -> _LoopTurns:
        self._ticker = asyncio.ensure_future(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._ticker.cancel()
        await asyncio.gather(self._ticker, return_exceptions=True)

    async def _tick(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("size", "every"),
    [
        (512 * 1024, PUBLISH_YIELD_BYTES),
        # (copied into shm with streaming stores: no block to reuse while warm)
        (SHM_COPY_NT_BYTES, PUBLISH_YIELD_LARGE_BYTES),
        # (as large as PUBLISH_YIELD_BYTES: a yield after each, as a frame needs)
        (PUBLISH_YIELD_BYTES, PUBLISH_YIELD_BYTES),
    ],
)
async def test_a_publisher_of_large_messages_yields_to_its_loop_every_few_mib(
    ctx: ezflow.GraphContext, size: int, every: int
) -> None:
    """Besides every PUBLISH_YIELD_EVERY messages, publish yields once per
    PUBLISH_YIELD_BYTES encoded (PUBLISH_YIELD_LARGE_BYTES of messages of 1 MiB up to
    4 MiB): the loop then reads the channels' releases (for shm: blocks come back while
    still in cache) and runs its other tasks."""
    pub = await ctx.publisher("/outlet/yield-bytes", max_in_flight_bytes=1 << 30)
    sub = await ctx.subscriber("/outlet/yield-bytes", transport="shm")
    await pub.wait_for_channels(1)
    payload = np.ones(size, dtype=np.uint8)  # (encoded: a few bytes more)
    count = 2 * (every // size) + 1  # a yield before the last of each every // size
    assert count < PUBLISH_YIELD_EVERY
    async with _LoopTurns() as turns:
        turns.count = 0
        for _ in range(count):
            await pub.publish(payload)
        assert pub.statistics().waits == 0  # (so each tick came from a yield, not a wait)
        assert turns.count == 2
    for _ in range(count):
        assert (await sub.recv()).nbytes == payload.nbytes


@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_a_task_publishing_to_two_topics_in_turn_yields_once_a_turn(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    """Two publishers published in turn by one task: the loop turns once per
    ``PUBLISH_YIELD_EVERY`` messages of each (the first to reach it yields; the turn
    starts the other's count again), not twice in a row. Every message arrives, in order."""
    pubs = [await ctx.publisher(f"/outlet/two-{i}") for i in range(2)]
    subs = [await ctx.subscriber(f"/outlet/two-{i}", transport=transport) for i in range(2)]
    for pub in pubs:
        await pub.wait_for_channels(1)
    rounds = 3
    async with _LoopTurns() as turns:
        turns.count = 0
        for seq in range(rounds * PUBLISH_YIELD_EVERY):
            for pub in pubs:
                await pub.publish((seq, b"x" * 16))
        assert all(pub.statistics().waits == 0 for pub in pubs)  # (each tick from a yield)
        # One yield per PUBLISH_YIELD_EVERY pairs (whichever publisher is due first; the
        # message that yields counts toward the count before the turn): at pairs 63, 126
        # and 189. Counting per publisher alone, both yielded at 63, 127 and 191: six.
        assert turns.count == rounds
    for sub in subs:
        for seq in range(rounds * PUBLISH_YIELD_EVERY):
            assert (await sub.recv())[0] == seq


async def test_a_relay_of_large_bodies_yields_as_a_publisher_of_those_messages(
    ctx: ezflow.GraphContext,
) -> None:
    """``publish_encoded_many`` of 1 MiB bodies (the Zenoh bridge's import) yields as
    often as ``publish`` of the same messages: once per ``PUBLISH_YIELD_LARGE_BYTES``."""
    pub = await ctx.publisher("/outlet/yield-relayed", max_in_flight_bytes=1 << 30)
    sub = await ctx.subscriber("/outlet/yield-relayed", transport="shm")
    await pub.wait_for_channels(1)
    payload = np.ones(SHM_COPY_NT_BYTES, dtype=np.uint8)
    body = Codec().encode(payload).to_bytes()
    count = 2 * (PUBLISH_YIELD_LARGE_BYTES // SHM_COPY_NT_BYTES) + 1
    async with _LoopTurns() as turns:
        turns.count = 0
        await pub.publish_encoded_many([payload] * count, [body] * count)
        assert pub.statistics().waits == 0  # (so each tick came from a yield, not a wait)
        assert turns.count == 2
    for _ in range(count):
        assert (await sub.recv()).nbytes == payload.nbytes


class _OutletClocks:
    """The outlet's clock and its count of the thread's sleeps, made deterministic: a
    busy CI machine can stall a real burst for more than the 50 us that make a publish
    count as paced. Each clock read advances it by 1 us; tests add idle time (the
    thread sleeps), busy time (it works) and preemption (it is made to wait) explicitly.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.wall = time.time_ns()
        self.sleeps = 0
        self.yields = 0
        #: wall time one sched_yield gives away (a busy machine runs others meanwhile)
        self.yield_ns = 0
        monkeypatch.setattr(_outlet, "time_ns", self.time_ns)
        monkeypatch.setattr(_outlet, "_voluntary_switches", lambda: self.sleeps)
        monkeypatch.setattr(_outlet, "_sched_yield", self.sched_yield)

    def time_ns(self) -> int:
        self.wall += 1_000
        return self.wall

    def sched_yield(self) -> None:
        self.yields += 1
        self.wall += self.yield_ns

    def idle(self, seconds: float) -> None:
        self.wall += int(seconds * 1e9)
        self.sleeps += 1

    def busy(self, seconds: float) -> None:
        """Work, or preemption: time passes, the thread does not sleep."""
        self.wall += int(seconds * 1e9)


@needs_shm
@pytest.mark.parametrize(
    ("transport", "options", "handoff"),
    [
        ("shm", None, True),
        ("shm", ezflow.ShmOptions(handoff=False), False),
        ("tcp", None, True),  # (from 127.0.0.1: this host)
        ("tcp", ezflow.ShmOptions(handoff=False), False),
    ],
)
async def test_a_paced_publish_to_subscribers_on_this_host_yields_the_cpu_once(
    ctx: ezflow.GraphContext,
    monkeypatch: pytest.MonkeyPatch,
    transport: str,
    options: ezflow.ShmOptions | None,
    handoff: bool,
) -> None:
    clocks = _OutletClocks(monkeypatch)
    topic = f"/outlet/handoff/{transport}/{options is None}"
    pub = await ctx.publisher(topic, shm=options)
    subs = [await ctx.subscriber(topic, transport=transport) for _ in range(2)]
    await pub.wait_for_channels(1)
    for i in range(5):  # paced: one yield each, after the message went to every link
        clocks.idle(0.002)
        await pub.publish(np.full(8, i, dtype=np.uint8))
        assert [(await sub.recv())[0] for sub in subs] == [i, i]
    assert clocks.yields == (5 if handoff else 0)
    clocks.yields = 0
    clocks.idle(0.002)
    for i in range(50):  # back to back: only the first of the burst is paced
        await pub.publish(np.full(8 * 1024, i % 256, dtype=np.uint8))
    for sub in subs:
        for i in range(50):
            assert (await sub.recv())[0] == i % 256
    assert clocks.yields == (1 if handoff else 0)


@needs_shm
@pytest.mark.parametrize("size", [8, 8 * 1024, 256 * 1024])
async def test_time_given_away_by_a_handoff_does_not_make_the_next_publish_paced(
    ctx: ezflow.GraphContext, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    # On a loaded machine sched_yield can give the CPU away for milliseconds. The next
    # publish of a burst must not count that as idle time, or every message of the
    # burst yields (and wakes its subscriber) once more: the handoff cascade.
    clocks = _OutletClocks(monkeypatch)
    clocks.yield_ns = 2_000_000
    topic = f"/outlet/handoff/cascade/{size}"
    pub = await ctx.publisher(topic)
    sub = await ctx.subscriber(topic, transport="shm")
    await pub.wait_for_channels(1)
    clocks.idle(0.002)
    for i in range(50):  # (fewer than max_in_flight: nothing is received meanwhile)
        await pub.publish(np.full(size, i, dtype=np.uint8))
    for i in range(50):
        assert (await sub.recv())[0] == i
    assert clocks.yields == 1


@needs_shm
async def test_a_busy_or_preempted_publisher_with_gaps_between_publishes_does_not_yield(
    ctx: ezflow.GraphContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A producer that spends 200 us filling each frame, or one preempted for 200 us
    # before each publish on a loaded machine, publishes 200 us apart: that gap is not
    # idleness, and its subscriber is behind, not waiting for this CPU. Only the first
    # publish (nothing to compare with yet) may yield.
    clocks = _OutletClocks(monkeypatch)
    topic = "/outlet/handoff/busy"
    pub = await ctx.publisher(topic)
    sub = await ctx.subscriber(topic, transport="shm")
    await pub.wait_for_channels(1)
    for i in range(30):
        clocks.busy(200e-6)
        await pub.publish(np.full(64 * 1024, i, dtype=np.uint8))
    assert clocks.yields == 1
    for i in range(30):
        assert (await sub.recv())[0] == i
    # Paced again (its loop sleeps between publishes): every publish yields once more.
    clocks.yields = 0
    for i in range(5):
        clocks.busy(20e-6)
        clocks.idle(0.001)
        await pub.publish(np.full(8, i, dtype=np.uint8))
        assert (await sub.recv())[0] == i
    assert clocks.yields == 5


def test_handoff_must_be_a_bool() -> None:
    with pytest.raises(ezflow.ConfigurationError, match="handoff"):
        ezflow.ShmOptions(handoff="yes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- differential


class _RecordingLink(_outlet.Link):
    """A link that keeps the body of every message handed to it (our own ABC, no
    transport): what publish_nowait's small path and send_now give a transport."""

    def __init__(self, *, lossless: bool = True, max_message_size: int = 1 << 27) -> None:
        super().__init__(lossless=lossless, max_message_size=max_message_size)
        self.bodies: list[tuple[str, int, bytes]] = []

    def send(self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage | None) -> None:
        assert encoded is not None
        self.sent_count += 1
        self.bodies.append(("send", seq, b"".join(encoded.parts)))

    def send_small(self, seq: int, time_ns: int, message: Any, body: bytes) -> None:
        assert type(body) is bytes
        self.sent_count += 1
        self.bodies.append(("small", seq, body))

    def close(self) -> None:
        pass


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), min_size=1, max_size=3), st.data())
def test_publish_nowait_hands_links_the_general_encoders_bytes(
    objs: list[object], data: st.DataObject
) -> None:
    """_send_small (one bytes body) and send_now give every link exactly the body the
    general encoder makes, for repeated and interleaved shapes; a message that cannot be
    encoded raises what the general encoder raises and sends nothing."""
    outlet = _outlet.Outlet(
        "p-1", "/t", Codec(), max_in_flight=1 << 20, max_in_flight_bytes=1 << 40
    )
    links = [_RecordingLink(), _RecordingLink()]
    for link in links:
        outlet.add_link(link)
    order = data.draw(st.lists(st.integers(0, len(objs) - 1), min_size=2, max_size=10))
    expected: list[bytes] = []
    for i in [*order, 0, 0, 0]:
        obj = objs[i]
        ref = outcome(lambda o=obj: _encode_general(outlet.codec, o).to_bytes())  # type: ignore[misc]
        outlet._unyielded = 0  # never decline for yielding: this test is about bytes
        got = outcome(lambda o=obj: outlet.publish_nowait(o))  # type: ignore[misc]
        if ref[0] == "raised":
            assert got == ref
            continue
        assert got == ("ok", True)
        expected.append(ref[1])  # type: ignore[arg-type]
    for link in links:
        assert [body for _, _, body in link.bodies] == expected
        assert [seq for _, seq, _ in link.bodies] == list(range(1, len(expected) + 1))
    # A repeated small message of a templated shape (or a bare array) takes the small
    # path: one bytes object for the link, one write for a stream transport.
    last = objs[0]
    if templated(last) and len(expected[-1]) <= SMALL_BODY:
        assert links[0].bodies[-1][0] == "small"


def test_a_paced_tuple_is_handed_over_as_one_bytes_body() -> None:
    outlet = _outlet.Outlet("p-1", "/t", Codec(), max_in_flight=64, max_in_flight_bytes=1 << 30)
    link = _RecordingLink()
    outlet.add_link(link)
    payload = np.arange(16, dtype=np.float32)
    for seq in range(5):
        assert outlet.publish_nowait((1, seq, time.perf_counter_ns(), payload))
    kinds = [kind for kind, _, _ in link.bodies]
    assert kinds == ["send"] + ["small"] * 4  # the first one makes the template
    assert outlet.stats.encodes == outlet.stats.messages == 5


def test_interleaved_publishers_of_other_kinds_each_keep_the_one_bytes_body() -> None:
    """Outlets of one process share its codec's caches, not its last-kind hints: four
    publishers of two tuple shapes and two array kinds, interleaved, each hand over one
    bytes body once they have encoded their kind."""
    codec = Codec()
    kinds = [
        lambda seq: (1, seq, time.perf_counter_ns(), np.arange(16, dtype=np.float32)),
        lambda seq: (seq, "x", 2.0),
        lambda seq: np.full(16, seq, np.float32),
        lambda seq: np.full(4, seq, np.int64),
    ]
    outlets, links = [], []
    for i in range(len(kinds)):
        outlet = _outlet.Outlet(f"p-{i}", "/t", codec, max_in_flight=9, max_in_flight_bytes=1 << 20)
        links.append(_RecordingLink())
        outlet.add_link(links[-1])
        outlets.append(outlet)
    assert all(outlet.codec is not codec for outlet in outlets)
    for seq in range(6):
        for outlet, make in zip(outlets, kinds, strict=True):
            assert outlet.publish_nowait(make(seq))
    for link in links[:2]:  # a template from the first message on
        assert [kind for kind, _, _ in link.bodies] == ["send"] + ["small"] * 5
    for link in links[2:]:  # an array's kind from its second (cached) encoding on
        assert [kind for kind, _, _ in link.bodies][2:] == ["small"] * 4


_LINK_STATE = st.tuples(
    st.booleans(),  # lossless
    st.booleans(),  # stalled
    st.integers(0, 8),  # messages in flight
    st.integers(0, 4096),  # bytes in flight
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_LINK_STATE, max_size=4),
    st.integers(1, 8),
    st.integers(1, 4096),
)
def test_publish_nowait_declines_exactly_when_publish_would_wait(
    states: list[tuple[bool, bool, int, int]], max_in_flight: int, max_in_flight_bytes: int
) -> None:
    """publish_nowait inlines the room rule (Link.has_room, _blocked) for speed: it must
    decline exactly when publish would wait, for every mix of lossless, leaky, stalled
    and full links, and send nothing then."""
    outlet = _outlet.Outlet(
        "p-1",
        "/t",
        Codec(),
        max_in_flight=max_in_flight,
        max_in_flight_bytes=max_in_flight_bytes,
    )
    links = []
    for lossless, stalled, count, nbytes in states:
        link = _RecordingLink(lossless=lossless)
        link.sent_count, link.sent_bytes = count, nbytes if count else 0
        link.stalled = stalled
        outlet.add_link(link)
        links.append(link)
    would_wait = outlet._blocked()
    room = [link.has_room(outlet) for link in links]
    assert outlet.publish_nowait(np.arange(4.0)) is not would_wait
    sent = [len(link.bodies) for link in links]
    if would_wait:
        assert sent == [0] * len(links)
    else:  # every lossless link got it; a leaky one got it if it had room, else parked
        assert sent == [int(link.lossless or r) for link, r in zip(links, room, strict=True)]


async def test_a_stalled_link_makes_publish_wait_until_it_resumes(
    ctx: ezflow.GraphContext,
) -> None:
    # What the data connection does when its unsent backlog passes its bound: the link
    # stalls, a lossless publish (the nowait path included) waits, and resumes after.
    pub = await ctx.publisher("/outlet/stalled")
    sub = await ctx.subscriber("/outlet/stalled", transport="tcp")
    await pub.wait_for_channels(1)
    (link,) = pub._outlet.links
    link.stalled = True
    publishing = asyncio.ensure_future(pub.publish(np.arange(3.0)))
    await asyncio.sleep(0.05)  # a window: publish may not return in it
    assert not publishing.done()
    link.stalled = False
    pub._outlet.wake()
    await asyncio.wait_for(publishing, 5)
    assert list(await sub.recv()) == [0.0, 1.0, 2.0]


# ------------------------------------------------------------- publish_encoded_many


class _WindowLink(_RecordingLink):
    """A recording link that counts bytes too and notes its window at each send."""

    def send(self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage | None) -> None:
        assert encoded is not None and self.outlet is not None
        self.bodies.append(("send", seq, b"".join(encoded.parts)))
        self.windows.append((self.in_flight, self.in_flight_bytes, self.has_room(self.outlet)))
        self.sent_count += 1
        self.sent_bytes += encoded.nbytes

    def __init__(self, *, lossless: bool, max_message_size: int = 1 << 27) -> None:
        super().__init__(lossless=lossless, max_message_size=max_message_size)
        self.windows: list[tuple[int, int, bool]] = []

    def send_small(self, seq: int, time_ns: int, message: Any, body: bytes) -> None:
        # (the same frame on a stream link: send's, for a body in one bytes)
        self.send(seq, time_ns, message, EncodedMessage([body], len(body)))


class _ObjectLink(_WindowLink):
    """A recording link that takes objects, not bodies (as a local one): its window
    counts messages only, as the local transport's does."""

    needs_encoding = False

    def send(self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage | None) -> None:
        assert self.outlet is not None
        self.bodies.append(("object", seq, message))
        self.windows.append((self.in_flight, self.in_flight_bytes, self.has_room(self.outlet)))
        self.sent_count += 1


async def _publish_both_ways(
    batch: bool,
    bodies: list[bytes | memoryview],
    links: list[bool],
    window: tuple[int, int],
    link_type: type[_WindowLink] = _WindowLink,
) -> tuple[list[Any], tuple[int, ...]]:
    outlet = _outlet.Outlet(
        "p-1", "/t", Codec(), max_in_flight=window[0], max_in_flight_bytes=window[1]
    )
    recording = [link_type(lossless=lossless) for lossless in links]
    for link in recording:
        outlet.add_link(link)
    done = False

    async def consumer() -> None:  # releases everything sent whenever the publisher waits
        while not done:
            await asyncio.sleep(0)
            if outlet._waiter is not None:
                for link in recording:
                    link.released(link.sent_count, link.sent_bytes)

    task = asyncio.ensure_future(consumer())
    messages: list[Any] = list(range(len(bodies)))
    if link_type is _ObjectLink:  # (arrays too: a writable one goes as a read-only view)
        messages = [np.full(2, i) if i % 4 == 1 else i for i in messages]
    try:
        if batch:
            await outlet.publish_encoded_many(messages, bodies)
        else:
            for message, body in zip(messages, bodies, strict=True):
                await outlet.publish(message, EncodedMessage([body], len(body)))
    finally:
        done = True
        await task
    stats = outlet.stats
    counters = (stats.messages, stats.bytes, stats.encodes, stats.sends, stats.drops)
    return [(link.bodies, link.windows, link.drops) for link in recording], counters


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.binary(min_size=1, max_size=64).map(
            lambda b: memoryview(b) if len(b) % 3 == 0 else b  # (views: never "small")
        ),
        min_size=1,
        max_size=150,
    ),
    st.lists(st.booleans(), min_size=1, max_size=3),
    st.tuples(st.integers(1, 8), st.integers(1, 400)),
)
def test_publish_encoded_many_sends_what_publishing_one_by_one_sends(
    bodies: list[bytes | memoryview], links: list[bool], window: tuple[int, int]
) -> None:
    """Differential: the same frames (seq, body) to every link, each with the same room
    at its send (a lossless window is never exceeded), the same parked drops on leaky
    links, the same counters, as one publish of each body in turn."""
    one_by_one = asyncio.run(_publish_both_ways(False, bodies, links, window))
    batched = asyncio.run(_publish_both_ways(True, bodies, links, window))
    assert batched == one_by_one
    for lossless, (_, windows, _) in zip(links, batched[0], strict=True):
        if lossless:  # every message went with room for it: the window was never exceeded
            assert all(room for _, _, room in windows)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=150),
    st.lists(st.booleans(), min_size=1, max_size=3),
    st.tuples(st.integers(1, 8), st.integers(1, 400)),
)
def test_publish_encoded_many_to_links_of_objects_sends_what_one_by_one_sends(
    bodies: list[bytes | memoryview], links: list[bool], window: tuple[int, int]
) -> None:
    """Differential: to links that take objects (local ones: publish_encoded_many's
    path through ezflow._core._outlet_objects.send_objects), the same messages (arrays
    as read-only views), each with the same room at its send, the same parked drops, the
    same counters, as one publish of each in turn (send_now)."""
    one_by_one = asyncio.run(_publish_both_ways(False, bodies, links, window, _ObjectLink))
    batched = asyncio.run(_publish_both_ways(True, bodies, links, window, _ObjectLink))

    def plain(result: tuple[list[Any], tuple[int, ...]]) -> Any:
        sent = [
            ([(how, seq, _as_list(message)) for how, seq, message in got], windows, drops)
            for got, windows, drops in result[0]
        ]
        return sent, result[1]

    assert plain(batched) == plain(one_by_one)
    for got, _, _ in batched[0]:
        for _, _, message in got:
            if isinstance(message, np.ndarray):
                assert not message.flags.writeable
    for lossless, (_, windows, _) in zip(links, batched[0], strict=True):
        if lossless:
            assert all(room for _, _, room in windows)


def _as_list(message: Any) -> Any:
    return ("array", message.tolist()) if isinstance(message, np.ndarray) else message


def test_publish_encoded_many_names_the_message_it_refuses() -> None:
    async def main() -> None:
        outlet = _outlet.Outlet("p-1", "/t", Codec(), max_in_flight=64, max_in_flight_bytes=1 << 20)
        link = _RecordingLink(max_message_size=10)
        outlet.add_link(link)
        bodies = [b"a" * 5, b"b" * 10, b"c" * 11, b"d"]
        with pytest.raises(ezflow.MessageTooLargeError, match=r"message 2 of the 4 .*the 2 before"):
            await outlet.publish_encoded_many([0, 1, 2, 3], bodies)
        assert [body for _, _, body in link.bodies] == bodies[:2]
        assert outlet.stats.messages == 2
        with pytest.raises(ValueError, match="2 messages and 1 bodies"):
            await outlet.publish_encoded_many([0, 1], [b"x"])
        with pytest.raises(TypeError, match="body 1 given to publish_encoded_many is a str"):
            await outlet.publish_encoded_many([0, 1], [b"x", "y"])  # type: ignore[list-item]
        assert outlet.stats.messages == 2  # (nothing sent for either)
        outlet.close()
        with pytest.raises(ezflow.ClosedResourceError, match="message 0 of the 1"):
            await outlet.publish_encoded_many([0], [b"x"])

    asyncio.run(main())


async def test_publish_encoded_many_through_a_real_edge_waits_for_its_subscriber(
    ctx: ezflow.GraphContext,
) -> None:
    pub = await ctx.publisher("/outlet/many", max_in_flight=8)
    local = await ctx.subscriber("/outlet/many", transport="local")
    remote = await ctx.subscriber("/outlet/many", transport="tcp")
    await pub.wait_for_channels(2)
    codec = Codec()
    sent = [(i, "x", np.arange(i, i + 4, dtype=np.int16)) for i in range(100)]
    bodies = [codec.encode(m).to_bytes() for m in sent]
    task = asyncio.ensure_future(pub.publish_encoded_many(sent, bodies))
    async with asyncio.timeout(20):
        for message in sent:
            for sub in (local, remote):
                got = await sub.recv()
                assert got[:2] == message[:2] and np.array_equal(got[2], message[2])
                assert pub.in_flight <= 8
        await task
    stats = pub.statistics()
    assert stats.messages == 100 and stats.encodes == 0 and stats.waits > 0
    assert stats.bytes == sum(len(b) for b in bodies)
