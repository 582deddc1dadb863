"""The local transport's one-call publish (``_local.publish_local_py`` and its compiled
twin, a branch of ``_speedups.PublishPath.publish``): the same messages, counters,
waits and errors as ``Outlet.publish_nowait``, the general path."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np
import pytest
from _leaks import blocks_grown
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ezflow._core import _compiled
from ezflow._core._channel import Channel
from ezflow._core._codec import Codec
from ezflow._core._config import SHM_COPY_NT_BYTES
from ezflow._core._exceptions import UndecodableMessageError
from ezflow._core._inbox import Inbox
from ezflow._core._outlet import Outlet
from ezflow._core._outlet_objects import send_objects, yield_share
from ezflow._core._telemetry import PUBLISH_HOOKS
from ezflow._transports import _stream_publish
from ezflow._transports._local import _LocalLink, publish_local_py, relay_local_py

needs_extension = pytest.mark.skipif(
    _compiled.SPEEDUPS is None, reason="the C extension ezflow._core._speedups is not built"
)


def _message(kind: str, seq: int) -> Any:
    """A message of *kind*: two shapes a template covers, near misses and bad ones."""
    if kind == "tuple":
        return ("m", seq, 1.5, np.full(4, seq, np.float32))
    if kind == "dict":
        return {"seq": seq, "name": "n"}
    if kind == "big":  # (the tuple's shape, an int out of msgpack's range)
        return ("m", 2**70, 1.5, np.zeros(4, np.float32))
    if kind == "dtype":  # (the tuple's shape, another dtype)
        return ("m", seq, 1.5, np.zeros(4, np.float64))
    if kind == "set":  # (unregistered: the general path raises)
        return ("m", seq, 1.5, {1, 2})
    if kind == "array":  # (a top-level array: its read-only view is the general path's)
        return np.full(4, seq, np.float32)
    return seq  # "int": a scalar, checked in O(1) by the general path


_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("publish"),
            st.sampled_from(
                ["tuple"] * 12 + ["dict"] * 2 + ["big", "dtype", "set", "array", "int"]
            ),
        ),
        st.tuples(st.just("take"), st.integers(0, 1), st.integers(1, 8)),
        st.tuples(st.just("turn")),  # (a loop turn: the yield counts start again)
        st.tuples(st.just("window"), st.sampled_from([2, 4, 64])),
        st.tuples(st.just("stall"), st.booleans()),
        st.tuples(st.just("hook"), st.booleans()),
        st.tuples(
            st.just("encoded"),
        ),
        st.tuples(
            st.just("close"),
        ),
    ),
    max_size=60,
)


class _World:
    """An outlet with one local link to a channel feeding a lossless inbox and (with
    *leaky*) a leaky one - alone, when *leaky_only* - as LocalTransport builds them."""

    def __init__(self, *, leaky_only: bool) -> None:
        self.outlet = Outlet("p-1", "/t", Codec(), max_in_flight=64, max_in_flight_bytes=1 << 20)
        self.channel = Channel("p-1", "/t", Codec())
        self.inboxes = [Inbox(leaky=True, maxlen=3)] if leaky_only else [Inbox(), Inbox()]
        for inbox in self.inboxes:
            self.channel.attach(inbox)
        self.link = _LocalLink(self.channel, lambda: None)
        self.outlet.add_link(self.link)

    def state(self) -> Any:
        outlet, link, channel = self.outlet, self.link, self.channel
        return (
            outlet._seq,
            outlet._unyielded,
            outlet._unyielded_bytes,
            dataclasses.astuple(outlet.stats),
            (link.sent_count, link.released_count, link.drops, link._parked is not None),
            link.needs_encoding,
            dataclasses.astuple(channel.stats),
            # (the channel encoded nothing itself: an encoded subscriber's body is the one
            # the publisher encoded, handed over)
            channel.codec._last_template is None,
            [list(entry) for entry in channel._pending],
            channel.released,
            [
                (
                    [
                        (item[1], _plain(item[2]))
                        if type(item) is tuple
                        else ("undecodable", str(item.error))  # (an encoded inbox's)
                        for item in inbox._items
                    ],
                    dataclasses.astuple(inbox.stats),
                )
                for inbox in self.inboxes
            ],
        )


def _change(worlds: list[_World], op: tuple[Any, ...]) -> None:
    """Apply one step of the differential tests' other than a send or a hook to both
    worlds: take from an inbox, a loop turn, the window, a stall, an encoded subscriber
    attached, the outlet closed."""
    name = op[0]
    for world in worlds:
        if name == "take":
            inbox = world.inboxes[min(op[1], len(world.inboxes) - 1)]
            for _ in range(min(op[2], len(inbox))):
                # (an encoded inbox's item that could not be encoded - a set relayed to
                # it - is taken as the error it is, in both worlds)
                with contextlib.suppress(UndecodableMessageError):
                    inbox.get_nowait()
        elif name == "turn":
            world.outlet._unyielded = world.outlet._unyielded_bytes = 0
        elif name == "window":
            world.outlet.max_in_flight = op[1]
        elif name == "stall":
            world.link.stalled = op[1]
        elif name == "encoded":
            inbox = Inbox(encoded=True)
            world.inboxes.append(inbox)
            world.channel.attach(inbox)
        elif name == "close":
            world.outlet.close()


def _plain(message: Any) -> Any:
    """*message* comparable with ==, arrays as (dtype, values, writeable)."""
    if isinstance(message, np.ndarray):
        return (str(message.dtype), message.tolist(), message.flags.writeable)
    if isinstance(message, tuple):
        return tuple(_plain(item) for item in message)
    if isinstance(message, dict):
        return {key: _plain(value) for key, value in message.items()}
    return message


def _publish(fast: Any, world: _World, message: Any) -> tuple[str, Any]:
    """*message* through *fast* (None: none), else publish_nowait: ("sent", how) or
    ("wait", None) when publish would have to wait or yield, or the error raised."""
    try:
        if fast is not None and fast(world.outlet, message):
            return "sent", None
        return ("sent", None) if world.outlet.publish_nowait(message) else ("wait", None)
    except Exception as exc:
        return "raised", (type(exc), str(exc))


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_extension), False])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, leaky_only=st.booleans())
@example(ops=[("publish", "tuple")] * 3 + [("take", 0, 2)], leaky_only=False)
# (each after the shape is learned, so that the one-call path is the one that must
# decline: a closed outlet, a publish hook, an encoded subscriber, the yield due)
@example(
    ops=[("publish", "tuple")] * 3 + [("close",)] + [("publish", "tuple")] * 2, leaky_only=False
)
@example(
    ops=[("publish", "tuple")] * 3 + [("hook", True)] + [("publish", "tuple")] * 2, leaky_only=True
)
@example(
    ops=[("publish", "tuple")] * 3 + [("encoded",)] + [("publish", "tuple")] * 2, leaky_only=False
)
@example(ops=[("window", 64)] + [("take", 0, 8), ("publish", "tuple")] * 70, leaky_only=True)
@example(
    ops=[("publish", "tuple")] * 3
    + [("stall", True), ("publish", "tuple"), ("stall", False), ("publish", "tuple")],
    leaky_only=False,
)
@example(  # (an encoded subscriber: the body encoded once, handed over with the message)
    ops=[("publish", "tuple"), ("encoded",)] + [("publish", "tuple"), ("take", 0, 1)] * 6,
    leaky_only=False,
)
@example(  # (a window that fills: the general path answers "wait")
    ops=[("window", 2)] + [("publish", "tuple")] * 4 + [("take", 0, 1), ("take", 1, 1)],
    leaky_only=False,
)
def test_the_local_publish_is_publish_nowait(
    compiled: bool, ops: list[tuple[Any, ...]], leaky_only: bool
) -> None:
    """The same steps in two worlds, one publishing through the local publish (compiled
    or pure) and publish_nowait where it declines, the other through publish_nowait
    alone: the same outcome of every publish (sent, would wait, the error raised), the
    same seq, yield counts, statistics, link counters, deliveries and queues after every
    step - shapes learned and changed, bad messages, arrays, scalars, a full window, a
    stalled link, a publish hook, an encoded subscriber (the body encoded on the way,
    handed over with the message), a closed outlet."""
    fast = (
        _stream_publish.compiled_publish_small(_compiled.SPEEDUPS) if compiled else publish_local_py
    )
    assert fast is not None
    worlds = [_World(leaky_only=leaky_only), _World(leaky_only=leaky_only)]
    events: list[list[Any]] = [[], []]  # (each world's publish events, while hooked)
    hooked = False
    seq = 0
    try:
        for op in ops:
            name = op[0]
            if name == "publish":
                seq += 1
                got = []
                for index, world in enumerate(worlds):
                    PUBLISH_HOOKS[:] = [events[index].append] if hooked else []
                    got.append(_publish(fast if index == 0 else None, world, _message(op[1], seq)))
                assert got[0] == got[1], (op, got)
                assert [(e.seq, e.nbytes, e.channels) for e in events[0]] == [
                    (e.seq, e.nbytes, e.channels) for e in events[1]
                ]
            elif name == "hook":
                hooked = op[1]
            else:
                _change(worlds, op)
            assert worlds[0].state() == worlds[1].state(), op
    finally:
        PUBLISH_HOOKS[:] = []


@needs_extension
def test_the_compiled_local_publish_sends_the_ordinary_message_itself() -> None:
    """The ordinary program's tuple over a local link goes through the compiled branch
    (counted by it), is validated there as the general path would (a bad message is
    the general path's, which raises), and arrives as the very object published."""
    publish = _stream_publish.compiled_publish_small(_compiled.SPEEDUPS)
    assert publish is not None
    world = _World(leaky_only=False)
    world.outlet.max_in_flight = 1000
    body = np.zeros(16, np.float32)
    assert world.outlet.publish_nowait((0, 0, 1, body))  # (the general path learns the shape)
    before = publish.__self__.local_publishes  # type: ignore[attr-defined]
    for seq in range(1, 101):
        world.outlet._unyielded = 0  # (a loop turn between: no yield due)
        assert publish(world.outlet, (0, seq, 1, body))
    assert publish.__self__.local_publishes == before + 100  # type: ignore[attr-defined]
    assert publish(world.outlet, (0, 101, 1, {1})) is False
    with pytest.raises(TypeError, match="set"):
        world.outlet.publish_nowait((0, 101, 1, {1}))
    items = list(world.inboxes[0]._items)
    assert [seq for _, seq, _ in items] == list(range(1, 102))
    assert all(message[3] is body for _, _, message in items)
    assert world.outlet.stats.messages == 101 and world.link.sent_count == 101


@needs_extension
def test_a_publish_path_refuses_a_local_link_type_without_a_delivery() -> None:
    """The local branch's two settings go together; a type whose link counters are not
    Link's own slots is refused when the path is built."""
    speedups = _compiled.SPEEDUPS
    assert speedups is not None
    path_type = speedups.PublishPath
    with pytest.raises(TypeError, match="go together"):
        path_type(*_path_arguments(), local_link_type=_LocalLink)

    class Odd:  # (link counters of its own, not Link's slots)
        __slots__ = ("channel", "drops", "needs_encoding", "released_bytes", "released_count")
        __slots__ += ("sent_bytes", "sent_count", "stalled")

    with pytest.raises(TypeError, match="not the link's slot"):
        path_type(*_path_arguments(), local_link_type=Odd, local_deliver=print)
    assert path_type(*_path_arguments(), local_link_type=_LocalLink, local_deliver=print)


def _path_arguments() -> list[Any]:
    from ezflow._core._codec._templates import _Template  # noqa: PLC0415
    from ezflow._core._framing import DATA  # noqa: PLC0415
    from ezflow._core._outlet import _YIELD_AFTER, PublisherStats  # noqa: PLC0415
    from ezflow._core._tracing import TRACING  # noqa: PLC0415
    from ezflow._transports._stream_frames import HEADER_SIZE  # noqa: PLC0415
    from ezflow._transports._stream_publish import StreamLink  # noqa: PLC0415

    return [
        Outlet, StreamLink, PublisherStats, Codec, _Template, TRACING, PUBLISH_HOOKS,
        _YIELD_AFTER, 1 << 20, 50_000, 128, 1 << 20, DATA, HEADER_SIZE,
    ]  # fmt: skip


@needs_extension
def test_the_compiled_local_publish_leaks_nothing_over_1e5_calls() -> None:
    """1e5 compiled local publishes (each message taken again: its release frees the
    window) leave no memory block behind."""
    publish = _stream_publish.compiled_publish_small(_compiled.SPEEDUPS)
    assert publish is not None
    world = _World(leaky_only=False)
    outlet, inboxes = world.outlet, world.inboxes
    body = np.zeros(16, np.float32)
    assert outlet.publish_nowait((0, 0, 1, body))  # (the general path learns the shape)
    for inbox in inboxes:
        inbox.get_nowait()

    sent = [0]

    def run(times: int) -> None:
        for seq in range(sent[0] + 1, sent[0] + times + 1):
            outlet._unyielded = 0
            assert publish(outlet, (0, seq, 1, body))
            for inbox in inboxes:
                inbox.get_nowait()
        sent[0] += times

    grown = blocks_grown(run, warm=1000, times=100_000)
    assert grown < 100, f"{grown} memory blocks more after 1e5 local publishes"
    assert world.channel.pending == 0 and outlet.stats.messages == 101_001


# -- the relay: a relayed message sent to the one local link (publish_encoded_many) ------


def _relay_path() -> Any:
    """The compiled relay (``PublishPath.relay``) of the built extension."""
    from ezflow._core._tracing import TRACING  # noqa: PLC0415

    path = _stream_publish.compiled_publish_path(
        _compiled.SPEEDUPS, tracing=TRACING, hooks=PUBLISH_HOOKS
    )
    return path.relay


_RELAY_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("relay"),
            st.sampled_from(["tuple"] * 8 + ["dict", "array", "int", "bytes", "set"]),
            st.sampled_from([0, 64, 4096, SHM_COPY_NT_BYTES - 1, SHM_COPY_NT_BYTES, 1 << 20]),
        ),
        st.tuples(st.just("take"), st.integers(0, 1), st.integers(1, 8)),
        st.tuples(st.just("window"), st.sampled_from([2, 4, 64])),
        st.tuples(st.just("stall"), st.booleans()),
        st.tuples(st.just("hook"), st.booleans()),
        st.tuples(st.just("encoded")),
        st.tuples(st.just("close")),
    ),
    max_size=60,
)


def _relayed(kind: str, seq: int) -> Any:
    """A relayed message: what a codec decoded (read-only arrays), a writable array,
    bytes (messages with a buffer: the general path's), a set (which no body holds, but
    which a relay passes on as it is: no check)."""
    if kind == "bytes":
        return b"raw %d" % seq
    if kind == "tuple":
        body = np.full(4, seq, np.float32)
        body.setflags(write=False)
        return ("m", seq, 1.5, body)
    return _message(kind, seq)


def _relay(fast: Any, world: _World, message: Any, nbytes: int) -> tuple[str, Any]:
    """*message* through *fast* (None: none), else send_objects to the outlet's links,
    as publish_encoded_many sends it; ("sent", how) or the error raised."""
    try:
        if fast is not None and fast(world.outlet, message, nbytes):
            return "sent", "fast"
        send_objects(world.outlet, world.outlet._links, message, nbytes)
        return "sent", None
    except Exception as exc:
        return "raised", (type(exc), str(exc))


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_extension), False])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_RELAY_OPS, leaky_only=st.booleans())
@example(ops=[("relay", "tuple", 64)] * 3 + [("take", 0, 2)], leaky_only=False)
@example(  # (each after a message the relay sent, so that it is the one that must decline)
    ops=[("relay", "tuple", 64), ("close",), ("relay", "tuple", 64)], leaky_only=False
)
@example(ops=[("relay", "tuple", 64), ("hook", True), ("relay", "tuple", 64)], leaky_only=True)
@example(ops=[("relay", "tuple", 64), ("encoded",), ("relay", "tuple", 64)], leaky_only=False)
@example(
    ops=[
        ("relay", "tuple", 64),
        ("stall", True),
        ("relay", "tuple", 64),
        ("stall", False),
        ("relay", "tuple", 64),
    ],
    leaky_only=False,
)
@example(  # (a full window: the relay declines, send_objects sends a lossless one anyway)
    ops=[("window", 2)] + [("relay", "tuple", 64)] * 4 + [("take", 0, 1), ("take", 1, 1)],
    leaky_only=False,
)
@example(ops=[("window", 2)] + [("relay", "tuple", 64)] * 5, leaky_only=True)
@example(ops=[("relay", "array", 64), ("relay", "bytes", 5)], leaky_only=False)
@example(ops=[("relay", "tuple", SHM_COPY_NT_BYTES), ("relay", "tuple", 1 << 20)], leaky_only=True)
def test_the_local_relay_is_send_objects(
    compiled: bool, ops: list[tuple[Any, ...]], leaky_only: bool
) -> None:
    """The same steps in two worlds, one sending each relayed message through the local
    relay (compiled or pure) and send_objects where it declines, the other through
    send_objects alone: the same outcome (sent, the error raised), seq, yield counts,
    statistics, link counters, deliveries and queues after every step - arrays, bytes,
    bodies whose yield share is not their size, a full window, a stalled link, a publish
    hook, an encoded subscriber, a closed outlet."""
    fast = _relay_path() if compiled else relay_local_py
    assert fast is not None
    worlds = [_World(leaky_only=leaky_only), _World(leaky_only=leaky_only)]
    hooked = False
    seq = 0
    relayed = 0
    try:
        for op in ops:
            name = op[0]
            if name == "relay":
                seq += 1
                PUBLISH_HOOKS[:] = [print] if hooked else []
                got = [
                    _relay(fast if index == 0 else None, world, _relayed(op[1], seq), op[2])
                    for index, world in enumerate(worlds)
                ]
                relayed += got[0] == ("sent", "fast")
                assert got[0][0] == got[1][0] and (got[0][0] == "sent" or got[0] == got[1]), (
                    op,
                    got,
                )
            elif name == "hook":
                hooked = op[1]
            else:
                _change(worlds, op)
            assert worlds[0].state() == worlds[1].state(), op
    finally:
        PUBLISH_HOOKS[:] = []
    if [op for op in ops if op[0] == "relay"] == [("relay", "tuple", 64)] * len(ops):
        assert relayed == len(ops)  # (the common case is the relay's own)


def test_a_relayed_body_below_the_relays_bound_counts_its_size_toward_the_yield() -> None:
    """The compiled relay counts a body's size toward the outlet's yield below
    ``relay_share_below`` (SHM_COPY_NT_BYTES), and declines from it on: the one rule,
    ``yield_share``, agrees."""
    assert all(yield_share(n) == n for n in (0, 1, 64, 4096, SHM_COPY_NT_BYTES - 1))
    assert yield_share(SHM_COPY_NT_BYTES) != SHM_COPY_NT_BYTES


@needs_extension
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_publish_encoded_many_to_a_local_subscriber_takes_the_compiled_relay(loop: str) -> None:
    """A relay's run to a subscriber in its own process (the Zenoh import's): each
    message through the compiled relay (counted by it), in order, the very objects
    given, the publisher's counts those of one publish_encoded each; a writable array
    goes the general way and arrives read-only."""
    import asyncio  # noqa: PLC0415

    import ezflow  # noqa: PLC0415
    from ezflow._core import _outlet_objects  # noqa: PLC0415
    from ezflow._core._loop import run_coroutine  # noqa: PLC0415

    relay = _outlet_objects.relay_local
    assert relay is not None
    codec = Codec()
    messages = [(0, seq, 1, np.zeros(16, np.float32)) for seq in range(300)]
    bodies = [codec.encode(m).to_bytes() for m in messages]
    decoded = [codec.decode(b) for b in bodies]

    async def main() -> tuple[list[Any], Any, Any]:
        async with (
            ezflow.GraphServer(("127.0.0.1", 0)) as server,
            ezflow.GraphContext(server.address, auto_start=False) as ctx,
        ):
            sub = await ctx.subscriber("/relay")
            pub = await ctx.publisher("/relay", max_in_flight=64)
            got: list[Any] = []

            async def take() -> None:
                while len(got) < len(decoded) + 1:
                    got.append(await sub.recv())

            taker = asyncio.create_task(take())
            await pub.publish_encoded_many(decoded, bodies)
            writable = np.arange(4.0)
            await pub.publish_encoded_many([writable], [codec.encode(writable).to_bytes()])
            await asyncio.wait_for(taker, 10)
            return got, pub.statistics(), writable

    before = relay.__self__.local_relays  # type: ignore[attr-defined]
    got, stats, writable = run_coroutine(main(), loop=loop)
    assert relay.__self__.local_relays - before == len(decoded)  # type: ignore[attr-defined]
    assert all(a is b for a, b in zip(got, decoded, strict=False))
    assert np.array_equal(got[-1], writable) and not got[-1].flags.writeable
    assert stats.messages == len(decoded) + 1 and stats.encodes == 0
    assert stats.bytes == sum(len(b) for b in bodies) + len(codec.encode(writable).to_bytes())
    assert stats.waits > 0  # (a window of 64 for 300: the run waited, and went on)


@needs_extension
def test_the_compiled_relay_refuses_wrong_arguments_and_leaks_nothing_over_1e5_calls() -> None:
    """Wrong arguments raise TypeError (nothing done); 1e5 relays (each message taken
    again) leave no memory block behind."""
    relay = _relay_path()
    assert relay is not None
    world = _World(leaky_only=False)
    outlet, inboxes = world.outlet, world.inboxes
    message = (0, 1, 1, np.zeros(16, np.float32))
    with pytest.raises(TypeError, match="nbytes: int"):
        relay(outlet, message, "64")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nbytes: int"):
        relay(outlet, message)  # type: ignore[call-arg]
    assert relay(object(), message, 64) is False  # type: ignore[arg-type]
    assert relay(outlet, message, -1) is False
    assert world.state()[0] == 0  # (nothing sent)

    def run(times: int) -> None:
        for _ in range(times):
            assert relay(outlet, message, 64)
            for inbox in inboxes:
                inbox.get_nowait()

    grown = blocks_grown(run, warm=1000, times=100_000)
    assert grown < 100, f"{grown} memory blocks more after 1e5 local relays"
    assert world.channel.pending == 0 and outlet.stats.messages == 101_000
