"""The local edge's delivery of one message in one call (``_channel_local``): the
compiled twin (``_speedups.DeliverPath``), the pure one (``deliver_local_py``) and the
general path (``Channel.deliver``) leave everything alike, and the local link takes it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from _leaks import blocks_grown
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ezflow
from ezflow._core import _compiled
from ezflow._core._channel import Channel
from ezflow._core._channel_local import compiled_deliver_local, deliver_local_py
from ezflow._core._codec import Codec
from ezflow._core._inbox import Inbox
from ezflow._core._telemetry import DELIVER_HOOKS, DeliverEvent

needs_extension = pytest.mark.skipif(
    _compiled.SPEEDUPS is None, reason="the C extension ezflow._core._speedups is not built"
)

# Each op, done alike in every world: deliver a message (its publish time: none, past,
# or ahead of this clock; new upstream drops or not), take from an inbox, detach one,
# close one, a task waiting on one, a deliver hook on or off, an encoded inbox attached.
_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("deliver"), st.sampled_from([0, -1000, 10**9]), st.sampled_from([0, 0, 0, 1])
        ),
        st.tuples(st.just("deliver"), st.sampled_from([0, -1000]), st.just(0)),
        st.tuples(st.just("take"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("detach"), st.integers(0, 3)),
        st.tuples(st.just("close"), st.integers(0, 3)),
        st.tuples(st.just("waiter"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("hook"), st.booleans()),
        st.tuples(
            st.just("encoded"),
        ),
    ),
    max_size=80,
)


class _World:
    """A channel feeding four inboxes: two lossless, a leaky one of 2, a callback one
    (attached when *callback*); its release calls, deliveries and callback calls
    recorded."""

    def __init__(self, *, callback: bool) -> None:
        self.calls: list[Any] = []
        self.channel = Channel(
            "p-1",
            "/t",
            Codec(),
            on_release=lambda count, nbytes: self.calls.append((count, nbytes)),
        )
        self.inboxes = [
            Inbox(name="a"),
            Inbox(name="b"),
            Inbox(name="c", leaky=True, maxlen=2),
            Inbox(name="d", callback=self.calls.append) if callback else Inbox(name="d"),
        ]
        self.attachments = [self.channel.attach(inbox) for inbox in self.inboxes]
        self.loop = asyncio.new_event_loop()
        # (a waiting task's future: its wake-up is recorded as put would queue it)
        self.woken: list[Any] = []

    def state(self) -> Any:
        channel = self.channel
        latency = channel.latency
        return (
            channel._last_seq,
            [list(entry) for entry in channel._pending],
            channel.released,
            channel._pending_bytes,
            dataclasses.astuple(channel.stats),
            # (the bucket a latency falls in depends on the clock: how many, and how many
            # the clocks disagreed on)
            sum(latency.buckets),
            latency.buckets[0],
            latency.total > 0,
            [
                (
                    [(seq, message) for _, seq, message in inbox._items],
                    dataclasses.astuple(inbox.stats),
                )
                for inbox in self.inboxes
            ],
            [attachment.active for attachment in self.attachments],
            [inbox._waiter is None or inbox._waiter.done() for inbox in self.inboxes],
            list(self.calls),
        )


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_extension), False])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, callback=st.booleans())
@example(ops=[("deliver", 0, 0)] * 3 + [("take", 2, 1)], callback=False)
@example(ops=[("deliver", -1000, 0), ("waiter", 1, True), ("deliver", 0, 0)], callback=False)
@example(ops=[("close", 3), ("deliver", 0, 0)], callback=True)  # (a closed callback inbox)
@example(  # (only the leaky inbox left: a leaky channel releases as it delivers)
    ops=[("detach", 0), ("detach", 1), ("detach", 3), ("deliver", -1000, 0), ("deliver", 0, 0)],
    callback=False,
)
def test_the_fast_delivery_leaves_what_channel_deliver_leaves(
    compiled: bool, ops: list[tuple[Any, ...]], callback: bool
) -> None:
    """The same steps in two worlds, one delivering through the fast path (compiled or
    pure) and falling back to ``Channel.deliver`` where it declines, the other through
    ``Channel.deliver`` alone: the same queues, counters, pending entries, releases,
    release and callback calls, hook events, after every step. It declines exactly
    where it must (a hook, new upstream drops) and delivers otherwise, a waiting task, a
    full leaky inbox, a closed or callback inbox included (through ``Inbox.put``), and
    the body to an encoded inbox, the message to the others, as ``put_encoded``."""
    fast = compiled_deliver_local() if compiled else deliver_local_py
    assert fast is not None
    worlds = [_World(callback=callback), _World(callback=callback)]
    events: list[list[Any]] = [[], []]
    seq = upstream = 0
    hooked = False
    try:
        for op in ops:
            name = op[0]
            if name == "deliver":
                seq += 1
                upstream += op[2]
                sent = time.time_ns() + op[1] if op[1] else 0
                # (a callback, a waiting task, a full or closed inbox: Inbox.put, inside;
                # encoded inboxes: the body, as the local link hands it over)
                must_decline = hooked or op[2] > 0
                message = ("m", seq)
                body = Codec().encode(message).to_bytes() if worlds[0].channel._encoded else None
                for index, world in enumerate(worlds):
                    DELIVER_HOOKS[:] = [events[index].append] if hooked else []
                    if index == 0:
                        took = fast(world.channel, seq, message, upstream, sent, body)
                        assert took is not must_decline, (op, took)
                        if took:
                            continue
                    world.channel._body = body  # (as the local link hands it to deliver)
                    world.channel.deliver(seq, message, 0, upstream, sent)
            elif name == "take":
                for world in worlds:
                    inbox = world.inboxes[op[1]]
                    for _ in range(min(op[2], len(inbox))):
                        inbox.get_nowait()
            elif name == "detach":
                for world in worlds:
                    world.channel.detach(world.attachments[op[1]])
            elif name == "close":
                for world in worlds:
                    world.inboxes[op[1]].close()
            elif name == "waiter":
                for world in worlds:
                    inbox = world.inboxes[op[1]]
                    waiter = world.loop.create_future() if op[2] else None
                    if waiter is not None:
                        waiter.add_done_callback(lambda f, w=world, i=op[1]: w.woken.append(i))
                    inbox._waiter = waiter
            elif name == "hook":
                hooked = op[1]
            elif name == "encoded":
                for world in worlds:
                    if len(world.inboxes) == 4:
                        inbox = Inbox(name="e", encoded=True)
                        world.inboxes.append(inbox)
                        world.attachments.append(world.channel.attach(inbox))
            assert worlds[0].state() == worlds[1].state(), op
            assert [(e.seq, e.subscribers) for e in events[0]] == [
                (e.seq, e.subscribers) for e in events[1]
            ]
    finally:
        DELIVER_HOOKS[:] = []
        for world in worlds:
            world.loop.close()


@needs_extension
def test_the_compiled_delivery_refuses_wrong_arguments_and_declines_odd_state() -> None:
    """Not five arguments: a TypeError. A channel subclass, a seq or drop count that is
    not an int, replaced channel statistics, an inbox subclass: declined (False),
    nothing changed. An inbox whose queue is not a deque: Inbox.put's, delivered."""
    deliver = compiled_deliver_local()
    assert deliver is not None
    channel = Channel("p-1", "/t", Codec())
    inbox = Inbox()
    channel.attach(inbox)
    with pytest.raises(TypeError, match="deliver"):
        deliver(channel, 1, "m", 0, 0)

    class SubChannel(Channel):
        pass

    class SubInbox(Inbox):
        pass

    assert deliver(SubChannel("p-2", "/t", Codec()), 1, "m", 0, 0, None) is False
    assert deliver(channel, 1.0, "m", 0, 0, None) is False
    assert deliver(channel, 1, "m", None, 0, None) is False
    stats, channel.stats = channel.stats, None  # type: ignore[assignment]
    assert deliver(channel, 1, "m", 0, 0, None) is False
    channel.stats = stats
    other = Channel("p-3", "/t", Codec())
    other.attach(SubInbox())
    assert deliver(other, 1, "m", 0, 0, None) is False
    assert len(inbox) == 0 and channel.stats.messages == 0 and channel._last_seq == 0
    inbox._items = []  # type: ignore[assignment]
    assert deliver(channel, 1, "m", 0, 0, None) is True
    assert [m for _, _, m in inbox._items] == ["m"] and channel.stats.messages == 1


@pytest.mark.asyncio
async def test_a_local_edge_delivers_through_the_fast_path_and_still_wakes_a_waiting_recv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A local edge's messages go through the fast path, a burst's and those for a
    subscriber waiting in recv() (woken by Inbox.put inside it) alike - through the
    compiled local publish, which delivers them itself, or ``_LocalLink.send`` - every
    message arrives once, in order, and the counters agree."""
    from ezflow._graph import _publisher  # noqa: PLC0415
    from ezflow._transports import _local  # noqa: PLC0415

    fast = _local.deliver_local
    if fast is None or _publisher._publish_small is None:
        pytest.skip("the C extension ezflow._core._speedups is not built")
    path = _publisher._publish_small.__self__  # type: ignore[attr-defined]
    published_before = path.local_publishes
    taken = declined = 0

    def counting(*args: Any) -> bool:
        nonlocal taken, declined
        result: bool = fast(*args)
        taken += result
        declined += not result
        return result

    monkeypatch.setattr(_local, "deliver_local", counting)
    async with ezflow.GraphContext("127.0.0.1:0") as ctx:
        pub = await ctx.publisher("/fast", transport="local")
        sub = await ctx.subscriber("/fast")
        await pub.wait_for_channels(1)

        async def produce() -> None:
            for seq in range(2000):
                await pub.publish(("m", seq))
                if seq % 500 == 499:
                    await asyncio.sleep(0.01)  # the subscriber waits meanwhile

        task = asyncio.create_task(produce())
        got = [await sub.recv() for _ in range(2000)]
        await task
        assert got == [("m", seq) for seq in range(2000)]
        stats = sub.statistics()
        assert (stats.received, stats.taken, stats.dropped) == (2000, 2000, 0)
    in_one_call = path.local_publishes - published_before
    assert (taken + in_one_call, declined) == (2000, 0) and in_one_call > 1000


def test_deliver_hooks_see_every_message_of_a_local_edge() -> None:
    """With a deliver hook set, the fast path declines: the hook sees each message."""
    channel = Channel("p-1", "/t", Codec())
    inbox = Inbox()
    channel.attach(inbox)
    seen: list[DeliverEvent] = []
    DELIVER_HOOKS.append(seen.append)
    try:
        for fast in filter(None, (compiled_deliver_local(), deliver_local_py)):
            assert fast(channel, 1, "m", 0, 0, None) is False
    finally:
        DELIVER_HOOKS.remove(seen.append)
    assert seen == [] and len(inbox) == 0


@pytest.mark.parametrize("detach_all", [False, True])
@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_extension), False])
def test_a_callback_that_publishes_again_is_counted_as_channel_deliver_counts_it(
    compiled: bool, detach_all: bool
) -> None:
    """A callback that delivers the next message on the same channel (a local unit that
    publishes to the topic it listens to, as far as the channel sees it), closes an
    inbox after it and detaches another: the fast path's counters, queues and pending
    entries end as Channel.deliver's, the nested deliveries counted, the closed inbox
    given nothing more. With *detach_all* the (leaky) callback detaches every lossless
    inbox: the channel turns leaky mid-delivery and releases as Channel.deliver does."""
    fast = compiled_deliver_local() if compiled else deliver_local_py
    assert fast is not None

    def run(deliver: Any) -> Any:
        releases: list[Any] = []
        channel = Channel("p-1", "/t", Codec(), on_release=lambda *r: releases.append(r))
        later, closing = Inbox(name="later"), Inbox(name="closing")
        seen: list[Any] = []
        attachments: list[Any] = []

        def callback(message: Any) -> None:
            seen.append(message)
            if message[1] < 3:  # (the nested one: the next seq)
                deliver(channel, message[1] + 1, ("m", message[1] + 1), 0, 0, None)
            if message[1] == 2:
                closing.close()
                channel.detach(attachments[2])
                if detach_all:
                    channel.detach(attachments[0])
                    channel.detach(attachments[3])

        attachments.append(channel.attach(Inbox(name="first")))
        calls = Inbox(name="calls", callback=callback, leaky=detach_all)
        attachments.append(channel.attach(calls))
        attachments.append(channel.attach(later))
        attachments.append(channel.attach(closing))
        deliver(channel, 1, ("m", 1), 0, 0, None)
        return (
            seen,
            releases,
            channel.released,
            dataclasses.astuple(channel.stats),
            channel._last_seq,
            [list(e) for e in channel._pending],
            [
                ([m for _, _, m in a.inbox._items], dataclasses.astuple(a.inbox.stats))
                for a in attachments
            ],
        )

    def general(channel: Channel, seq: int, message: Any, drops: int, sent: int, _: Any) -> None:
        channel.deliver(seq, message, 0, drops, sent)

    def through_fast(
        channel: Channel, seq: int, message: Any, drops: int, sent: int, _: Any
    ) -> None:
        assert fast(channel, seq, message, drops, sent, None) is True

    assert run(through_fast) == run(general)


@needs_extension
def test_the_compiled_delivery_leaks_nothing_over_1e5_calls() -> None:
    """1e5 compiled deliveries to a queueing inbox (each message taken again, its
    pending entry released), a callback inbox and a leaky one at its bound (Inbox.put,
    inside), with a latency sample each: no memory block left behind."""
    deliver = compiled_deliver_local()
    assert deliver is not None
    channel = Channel("p-1", "/t", Codec(), on_release=lambda count, nbytes: None)
    queue, leaky = Inbox(), Inbox(leaky=True, maxlen=1)
    calls: list[Any] = []
    for inbox in (queue, Inbox(callback=calls.append), leaky):
        channel.attach(inbox)

    sent = [0]

    def run(times: int) -> None:
        for seq in range(sent[0] + 1, sent[0] + times + 1):
            assert deliver(channel, seq, ("m", seq), 0, time.time_ns() - 1000, None)
            assert queue.get_nowait() == ("m", seq)
        sent[0] += times
        calls.clear()

    grown = blocks_grown(run, warm=1000, times=100_000)
    assert grown < 100, f"{grown} memory blocks more after 1e5 deliveries"
    assert channel.pending == 0 and channel.stats.messages == 101_000


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_extension), False])
def test_an_encoded_inbox_takes_the_body_given_and_anything_else_is_the_general_path(
    compiled: bool,
) -> None:
    """With an encoded inbox attached, the fast path hands it the bytes body given (the
    others the message) as put_encoded would; with no body, a body in parts or a
    Channel._body set already it declines, having changed nothing (put_encoded then
    encodes, joins or takes that body)."""
    from ezflow._core._codec import EncodedMessage  # noqa: PLC0415

    fast = compiled_deliver_local() if compiled else deliver_local_py
    assert fast is not None
    channel = Channel("p-1", "/t", Codec())
    plain, encoded = Inbox(), Inbox(encoded=True)
    channel.attach(plain)
    channel.attach(encoded)
    body = Codec().encode(("m", 1)).to_bytes()
    assert fast(channel, 1, ("m", 1), 0, 0, None) is False
    assert (
        fast(channel, 1, ("m", 1), 0, 0, EncodedMessage([body[:3], body[3:]], len(body))) is False
    )
    channel._body = body
    assert fast(channel, 1, ("m", 1), 0, 0, body) is False
    channel._body = None
    assert (len(plain), len(encoded), channel.stats.messages) == (0, 0, 0)
    assert fast(channel, 1, ("m", 1), 0, 0, body) is True
    assert plain.get_nowait() == ("m", 1) and encoded.get_nowait() is body
    assert channel._body is None and channel.pending == 0
