"""Channel and Inbox bookkeeping: fan-out, release accounting, leaky drops."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _messages import arrays, assert_same_decoded, messages, outcome
from _soon import Soon
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ezflow
from ezflow import ClosedResourceError, ProtocolError, UndecodableMessageError
from ezflow._core import _channel, _channel_encoded, _inbox
from ezflow._core._channel import Channel
from ezflow._core._codec import HEADER, Codec, _decode_general
from ezflow._core._inbox import Inbox


def make_channel() -> tuple[Channel, list[tuple[int, int]], list[bool]]:
    releases: list[tuple[int, int]] = []
    modes: list[bool] = []
    channel = Channel(
        "p-1",
        "/t",
        Codec(),
        on_release=lambda count, nbytes: releases.append((count, nbytes)),
        on_mode_change=modes.append,
    )
    return channel, releases, modes


def test_release_waits_for_every_lossless_inbox() -> None:
    channel, releases, modes = make_channel()
    a, b = Inbox(), Inbox()
    channel.attach(a)
    channel.attach(b)
    assert modes == [True]
    for seq in (1, 2, 3):
        channel.deliver(seq, f"m{seq}", nbytes=10)
    assert channel.pending == 3 and releases == []
    assert a.get_nowait() == "m1"
    assert releases == []  # b still holds m1
    assert b.get_nowait() == "m1"
    assert releases[-1] == (1, 10)
    assert b.get_nowait() == "m2" and b.get_nowait() == "m3"
    assert releases[-1] == (1, 10)  # a still holds m2 and m3
    a.get_nowait()
    a.get_nowait()
    assert releases[-1] == (3, 30) and channel.pending == 0


def test_detach_releases_what_the_inbox_held_but_keeps_it_readable() -> None:
    channel, releases, modes = make_channel()
    keep, leave = Inbox(), Inbox()
    channel.attach(keep)
    gone = channel.attach(leave)
    channel.deliver(1, "x", nbytes=1)
    keep.get_nowait()
    assert releases == []
    channel.detach(gone)
    assert releases[-1] == (1, 1)
    assert leave.get_nowait() == "x"  # accepted data is not lost
    channel.detach(gone)  # idempotent
    assert modes == [True]


def test_same_object_to_every_inbox() -> None:
    channel, _, _ = make_channel()
    inboxes = [Inbox() for _ in range(4)]
    for inbox in inboxes:
        channel.attach(inbox)
    message = object()
    channel.deliver(1, message)
    assert all(inbox.get_nowait() is message for inbox in inboxes)
    assert channel.stats.deliveries == 4


def test_leaky_inbox_keeps_newest_and_never_holds_release() -> None:
    channel, releases, modes = make_channel()
    inbox = Inbox(leaky=True, maxlen=3)
    channel.attach(inbox)
    assert modes == []  # only leaky: the channel stays non-lossless
    for seq in range(1, 11):
        channel.deliver(seq, seq, nbytes=2)
    assert releases[-1] == (10, 20)
    assert [inbox.get_nowait() for _ in range(3)] == [8, 9, 10]
    assert inbox.stats.dropped == 7


def test_upstream_drops_are_counted_by_leaky_inboxes() -> None:
    channel, _, _ = make_channel()
    leaky = Inbox(leaky=True, maxlen=10)
    channel.attach(leaky)
    channel.deliver(1, "a", upstream_drops=0)
    channel.deliver(5, "b", upstream_drops=3)
    assert leaky.stats.dropped == 3
    assert channel.stats.upstream_drops == 3


def test_undecodable_body_is_counted_and_released(caplog: pytest.LogCaptureFixture) -> None:
    channel, releases, _ = make_channel()
    inbox = Inbox()
    channel.attach(inbox)
    channel.deliver_body(1, b"\x00garbage")
    assert channel.stats.decode_errors == 1
    assert releases[-1][0] == 1  # released at once: nothing waits for it to be taken
    assert "cannot be decoded" not in caplog.text  # recv() raises it: no log line too
    body = Codec().encode([1, 2]).to_bytes()
    channel.deliver_body(2, body)
    with pytest.raises(UndecodableMessageError):
        inbox.get_nowait()
    assert inbox.get_nowait() == [1, 2]


def test_undecodable_body_raises_in_its_place_for_lossless_and_is_a_drop_for_leaky(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel, releases, _ = make_channel()
    lossless, leaky = Inbox(name="s-1"), Inbox(leaky=True, maxlen=8, name="s-2")
    called = Inbox(callback=list, name="s-3")
    for inbox in (lossless, leaky, called):
        channel.attach(inbox)
    codec = Codec()
    channel.deliver_body(1, codec.encode([1]).to_bytes())
    channel.deliver_body(2, b"\x01garbage")
    channel.deliver_body(3, codec.encode([3]).to_bytes())
    assert len(lossless) == 3
    assert lossless.get_nowait() == [1]
    with pytest.raises(UndecodableMessageError) as caught:
        lossless.get_nowait()
    error = caught.value
    assert isinstance(error, ProtocolError)
    assert (error.topic, error.publisher_id) == ("/t", "p-1")
    assert "flags" in error.reason and isinstance(error.__cause__, ProtocolError)
    assert lossless.get_nowait() == [3]
    assert lossless.stats.undecodable == 1 and lossless.stats.dropped == 0
    assert [leaky.get_nowait() for _ in range(len(leaky))] == [[1], [3]]
    assert (leaky.stats.undecodable, leaky.stats.dropped) == (1, 1)
    assert called.stats.undecodable == 1 and called.stats.taken == 2
    assert releases[-1][0] == 3  # the undecodable one too: nothing stalls
    logged = [r.getMessage() for r in caplog.records if "cannot be decoded" in r.getMessage()]
    assert len(logged) == 2 and "s-2 drops" in logged[0] and "s-3 skips" in logged[1]
    assert channel.pending == 0


async def test_undecodable_wakes_a_waiting_get() -> None:
    channel, _, _ = make_channel()
    inbox = Inbox()
    channel.attach(inbox)
    getter = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    channel.deliver_body(1, b"\x01garbage")
    with pytest.raises(UndecodableMessageError):
        await asyncio.wait_for(getter, 5)


def test_a_stream_of_one_array_kind_is_decoded_once_per_message() -> None:
    """Bodies of the kind decoded last take Channel.deliver_body's shortcut (all but
    one message in 16, which are timed through Codec.decode): same results, and every
    one counts as decoded."""
    channel, releases, _ = make_channel()
    inbox = Inbox()
    channel.attach(inbox)
    codec = Codec()
    seq = 0
    for shape, dtype in (((5,), np.int64), ((2, 3), np.float32)):
        for _ in range(40):
            seq += 1
            arr = np.full(shape, seq, dtype=dtype)
            channel.deliver_body(seq, codec.encode(arr).to_bytes())
            got = inbox.get_nowait()
            assert got.dtype == arr.dtype and got.shape == arr.shape
            assert np.array_equal(got, arr) and not got.flags.writeable
    assert channel.stats.decoded == channel.stats.messages == seq
    assert releases[-1][0] == seq
    # A body of the same kind cut short is not taken for one: it fails to decode.
    body = codec.encode(np.full(5, 0, dtype=np.int64)).to_bytes()
    channel.deliver_body(seq + 1, body[:-1])
    assert channel.stats.decode_errors == 1
    with pytest.raises(UndecodableMessageError):
        inbox.get_nowait()


async def test_inbox_get_waits_and_close_wakes() -> None:
    inbox = Inbox()
    channel, _, _ = make_channel()
    channel.attach(inbox)
    getter = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    channel.deliver(1, "hello")
    assert await getter == "hello"
    waiting = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    inbox.close()
    with pytest.raises(ClosedResourceError):
        await waiting


async def test_cancelled_get_takes_nothing() -> None:
    inbox = Inbox()
    channel, _, _ = make_channel()
    channel.attach(inbox)
    getter = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    getter.cancel()
    channel.deliver(1, "kept")
    with pytest.raises(asyncio.CancelledError):
        await getter
    assert inbox.get_nowait() == "kept"


def test_leaky_inbox_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="maxlen"):
        Inbox(leaky=True)


def test_callback_inbox_takes_and_releases_each_message_as_it_returns() -> None:
    channel, releases, _ = make_channel()
    seen: list[tuple[object, int]] = []
    queued = Inbox()

    def on_message(message: object) -> None:
        # Called during delivery: this message is still pending for the other inbox.
        seen.append((message, channel.pending))
        if message == "m2":
            raise RuntimeError("boom")

    calls = Inbox(callback=on_message, name="s-cb")
    channel.attach(calls)
    channel.attach(queued)
    for seq in (1, 2, 3):
        channel.deliver(seq, f"m{seq}", nbytes=10)
    assert seen == [("m1", 1), ("m2", 2), ("m3", 3)]
    assert len(calls) == 0 and calls.stats.taken == 3 and calls.stats.callback_errors == 1
    assert releases == []  # the queueing inbox still holds all three
    assert [queued.get_nowait() for _ in range(3)] == ["m1", "m2", "m3"]
    assert releases[-1] == (3, 30)
    assert channel.pending == 0


@pytest.mark.parametrize("detach_first", [True, False])
def test_a_deferred_release_overtaken_by_a_later_one_then_a_detach(detach_first: bool) -> None:
    """An inbox takes m1 with its release deferred to the loop (a woken get), then m2
    released at once, and is detached before (or after) the loop runs the deferred
    release; the other inbox still takes m1 and m2. Every message is released once its
    last holder took it, never before: neither stuck behind a release that detaching
    dropped (the channel would hold the publisher's window for good) nor released while
    the other inbox still holds it (detaching let go of m2 a second time)."""
    channel, releases, _ = make_channel()
    early, other = Inbox(), Inbox()
    attachment = channel.attach(early)
    channel.attach(other)
    for seq in (1, 2):
        channel.deliver(seq, f"m{seq}", nbytes=10)
    soon = Soon()
    assert early.get_nowait(soon) == "m1"  # type: ignore[arg-type]
    assert early.get_nowait() == "m2"
    assert other.get_nowait() == "m1"
    if detach_first:
        channel.detach(attachment)
        soon.run()
    else:
        soon.run()
        channel.detach(attachment)
    assert releases[-1] == (1, 10)  # m2: the other inbox holds it still
    assert other.get_nowait() == "m2"
    assert releases[-1] == (2, 20) and channel.pending == 0
    channel.deliver(3, "m3", nbytes=10)
    assert other.get_nowait() == "m3"
    assert releases[-1] == (3, 30) and channel.pending == 0


def test_callback_that_detaches_during_delivery_does_not_skip_others() -> None:
    channel, _, _ = make_channel()
    others = Inbox()

    def on_message(message: object) -> None:
        channel.detach(attachment)

    attachment = channel.attach(Inbox(callback=on_message))
    channel.attach(others)
    channel.deliver(1, "m1", nbytes=1)
    channel.deliver(2, "m2", nbytes=1)
    assert [others.get_nowait(), others.get_nowait()] == ["m1", "m2"]
    assert channel.pending == 0


async def test_a_waiting_get_releases_its_message_once_it_yields() -> None:
    channel, releases, _ = make_channel()
    a, b = Inbox(), Inbox()
    taker = channel.attach(a)
    channel.attach(b)

    async def take_then_detach() -> object:
        message = await a.get()
        # Same task step, before the deferred release runs: detaching already stops
        # this inbox holding anything, so the release must not count twice.
        channel.detach(taker)
        return message

    waiting = asyncio.ensure_future(take_then_detach())
    await asyncio.sleep(0)
    channel.deliver(1, "m1", nbytes=10)
    assert await waiting == "m1"
    await asyncio.sleep(0)
    assert releases == [] and channel.pending == 1  # b still holds m1
    assert b.get_nowait() == "m1"
    assert releases == [(1, 10)]

    # Without a detach, the waiting get's release lands as soon as it yields.
    c = Inbox()
    channel.attach(c)
    waiting = asyncio.ensure_future(c.get())
    await asyncio.sleep(0)
    channel.deliver(2, "m2", nbytes=10)
    assert b.get_nowait() == "m2"
    assert await waiting == "m2"
    assert releases[-1] == (2, 20) and channel.pending == 0


# --------------------------------------------------------------------------- differential


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), min_size=1, max_size=3), st.data())
def test_deliver_body_gives_what_the_general_decoder_gives(
    objs: list[object], data: st.DataObject
) -> None:
    """Channel.deliver_body inlines Codec.decode's shortcuts (_last_array, _last_layout)
    for bytes bodies of unsampled messages: whatever the body - repeated, interleaved,
    bytes or memoryview, mutated - an inbox gets what the general decoder gives, and a
    body it refuses is counted as a decode error."""
    codec = Codec()
    channel = Channel("p-1", "/t", codec)
    inbox = Inbox()
    channel.attach(inbox)
    bodies = [b for b in (_encoded(codec, obj) for obj in objs) if b is not None]
    if not bodies:
        return
    order = data.draw(st.lists(st.integers(0, len(bodies) - 1), min_size=3, max_size=12))
    seq = 0
    for i in [*order, 0, 0, 0]:
        body = bodies[i]
        if data.draw(st.booleans()):  # a mutated body now and then
            cut = data.draw(st.integers(0, len(body) - 1))
            body = data.draw(
                st.sampled_from(
                    [
                        body[:cut],
                        body + b"\0",
                        body[:cut] + bytes([body[cut] ^ 0x41]) + body[cut + 1 :],
                    ]
                )
            )
        seq += 1
        as_view = data.draw(st.booleans())
        expected = outcome(lambda b=body: _decode_general(codec, b))  # type: ignore[misc]
        errors = channel.stats.decode_errors
        channel.deliver_body(seq, memoryview(body) if as_view else body)
        if expected[0] == "ok":
            assert channel.stats.decode_errors == errors
            assert_same_decoded(expected[1], inbox.get_nowait())
        else:
            assert channel.stats.decode_errors == errors + 1
            with pytest.raises(UndecodableMessageError):
                inbox.get_nowait()
    assert channel.stats.messages == seq


def _encoded(codec: Codec, obj: object) -> bytes | None:
    try:
        return codec.encode(obj).to_bytes()
    except (TypeError, ValueError):
        return None


def test_deliver_body_takes_the_layout_shortcut_for_a_stream_of_tuples() -> None:
    codec = Codec()
    channel = Channel("p-1", "/t", codec)
    inbox = Inbox()
    channel.attach(inbox)
    for seq in range(1, 40):
        message = (1, seq, 1_000_000 + seq, np.arange(16, dtype=np.float32) + seq)
        channel.deliver_body(seq, codec.encode(message).to_bytes())
        got = inbox.get_nowait()
        assert type(got) is tuple and got[:3] == message[:3]
        assert np.array_equal(got[3], message[3]) and not got[3].flags.writeable
    layout = channel.codec._last_layout  # (the channel's own codec state)
    assert layout is not None
    assert channel.stats.decoded == 39 and channel.stats.decode_errors == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrays(max_side=20), st.data())
def test_deliver_body_array_shortcut_gives_what_the_general_decoder_gives(
    arr: np.ndarray, data: st.DataObject
) -> None:
    """The inlined _last_array shortcut: a stream of one array kind, then bodies of the
    same length that differ in the prefix (header, meta) or data."""
    codec = Codec()
    channel = Channel("p-1", "/t", codec)
    inbox = Inbox()
    channel.attach(inbox)
    body = _encoded(codec, arr)
    if body is None:
        return
    head = HEADER.size + 8 + HEADER.unpack_from(body)[3]
    bodies = [body] * 3
    for _ in range(4):
        at = data.draw(st.integers(0, min(head, len(body)) - 1) | st.integers(0, len(body) - 1))
        bodies.append(
            body[:at] + bytes([body[at] ^ data.draw(st.integers(1, 255))]) + body[at + 1 :]
        )
        bodies.append(body)
    for seq, each in enumerate(bodies, 1):
        expected = outcome(lambda b=each: _decode_general(codec, b))  # type: ignore[misc]
        errors = channel.stats.decode_errors
        channel.deliver_body(seq, each)
        if expected[0] == "ok":
            assert_same_decoded(expected[1], inbox.get_nowait())
        else:
            assert channel.stats.decode_errors == errors + 1
            with pytest.raises(UndecodableMessageError):
                inbox.get_nowait()


# -- per-stream codec state, timing samples ---------------------------------------------------


def test_each_channel_keeps_its_own_codec_hints() -> None:
    """Channels of one process share its codec's limit and caches but not its last-kind
    hints: two interleaved streams of different kinds each keep their shortcut."""
    codec = Codec(max_message_size=1 << 20)
    arrays_channel = Channel("p-1", "/a", codec)
    tuples_channel = Channel("p-2", "/t", codec)
    assert arrays_channel.codec is not codec and tuples_channel.codec is not codec
    assert arrays_channel.codec.max_message_size == codec.max_message_size
    arrays_inbox, tuples_inbox = Inbox(), Inbox()
    arrays_channel.attach(arrays_inbox)
    tuples_channel.attach(tuples_inbox)
    payload = np.arange(16, dtype=np.float32)
    array_body = codec.encode(payload).to_bytes()
    for seq in range(1, 21):
        arrays_channel.deliver_body(seq, array_body)
        tuples_channel.deliver_body(seq, codec.encode((1, seq, payload)).to_bytes())
        assert np.array_equal(arrays_inbox.get_nowait(), payload)
        assert tuples_inbox.get_nowait()[1] == seq
    assert arrays_channel.codec._last_array is not None
    assert arrays_channel.codec._last_layout is None
    assert tuples_channel.codec._last_layout is not None
    assert tuples_channel.codec._last_array is None
    assert codec._last_array is None and codec._last_layout is None


def test_timing_samples_and_decode_seconds_follow_one_constant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decode and handler times are taken for the messages TIMING_SAMPLE_MASK picks, on
    every path (bytes bodies of a known kind, memoryviews, queued and callback inboxes),
    and decode_seconds is scaled by that same constant: a copy of its value anywhere on
    the message path makes the counts or the scale disagree once it changes."""
    monkeypatch.setattr(_channel, "TIMING_SAMPLE_MASK", 3)  # one message in 4
    monkeypatch.setattr(_inbox, "TIMING_SAMPLE_MASK", 3)  # (the inboxes' handler times)
    codec = Codec()
    channel = Channel("p-1", "/t", codec)
    queued = Inbox()
    handled: list[object] = []
    called = Inbox(callback=handled.append)
    channel.attach(queued)
    channel.attach(called)
    bodies = [codec.encode(np.arange(4.0)).to_bytes(), codec.encode((1, 2.0, "x")).to_bytes()]
    for seq in range(1, 66):  # 16 of 64 timed (4, 8, ... 64), and one more to take 64's
        body = bodies[seq > 32]  # a stream of arrays, then of tuples
        channel.deliver_body(seq, memoryview(body) if seq % 5 == 0 else body)
        queued.get_nowait()
    assert len(handled) == 65
    assert sum(called.handler_time.buckets) == 16
    assert sum(queued.handler_time.buckets) == 16  # (timed from one take to the next)
    assert sum(channel.decode_time.buckets) == 16
    assert channel.stats.decode_seconds == pytest.approx(channel.decode_time.total * 4e-9)


def test_no_copy_of_the_timing_sample_mask_in_the_package() -> None:
    """``seq & 15`` spelled out (in any module) would not follow TIMING_SAMPLE_MASK."""
    found = []
    for path in Path(ezflow.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
                operands = (node.left, node.right)
                named = [ast.unparse(x) for x in operands if not isinstance(x, ast.Constant)]
                if any(isinstance(x, ast.Constant) for x in operands) and any(
                    "seq" in name for name in named
                ):
                    found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not found


# -- a lost publisher: not an end, a rejoin, an end when the routes drop it ------------------


def fed_inbox() -> tuple[Channel, Inbox]:
    """A lossless inbox fed by publisher p1's channel, which the routes list."""
    channel = Channel("p1", "/t", Codec())
    inbox = Inbox()
    inbox.routed(frozenset({"p1"}))
    channel.attach(inbox)
    return channel, inbox


def test_a_lost_channel_does_not_end_the_stream_while_its_publisher_is_routed() -> None:
    channel, inbox = fed_inbox()
    channel.deliver(1, "a")
    channel.lost("its connection broke without END (reset)")
    channel.lost("again")  # idempotent: the first reason stays
    assert channel.lost_reason == "its connection broke without END (reset)"
    assert inbox.lost_publishers == {"p1"} and not inbox.at_end
    assert inbox.get_nowait() == "a"
    inbox.routed(frozenset({"p1"}))  # the same routes again: still lost, not ended
    assert not inbox.at_end and inbox.stats.publishers_ended == 0
    # Just after a reconnection the routes may omit it for a while: kept lost.
    inbox.routed(frozenset(), keep_lost=True)
    assert not inbox.at_end and inbox.lost_publishers == {"p1"}
    # Complete routes that drop it: it has ended, broken - once.
    inbox.routed(frozenset())
    inbox.routed(frozenset())
    assert inbox.at_end and inbox.tell_end() and not inbox.tell_end()
    stats = inbox.stats
    assert (stats.publishers_ended, stats.publishers_broken, stats.rejoins) == (1, 1, 0)


def test_a_rejoin_is_counted_once_and_a_clean_end_afterwards_is_not_broken() -> None:
    channel, inbox = fed_inbox()
    channel.lost("cut")
    again = Channel("p1", "/t", Codec())
    again.attach(inbox)  # a new channel: being reopened (still lost until it opens)
    assert inbox.lost_publishers == {"p1"} and not inbox.at_end
    assert inbox.rejoined("p1") and not inbox.rejoined("p1")
    assert inbox.stats.rejoins == 1 and not inbox.lost_publishers
    again.deliver(7, "late joiner")
    assert inbox.get_nowait() == "late joiner"
    again.end()
    assert inbox.at_end
    stats = inbox.stats
    assert (stats.publishers_ended, stats.publishers_broken, stats.rejoins) == (1, 0, 1)


def test_a_failed_reopen_keeps_the_publisher_lost_and_a_late_first_open_is_no_rejoin() -> None:
    channel, inbox = fed_inbox()
    channel.lost("cut")
    failed = Channel("p1", "/t", Codec())
    failed.attach(inbox)
    failed.lost("cut")  # the attempt failed: lost again, nothing counted
    failed.close()
    assert inbox.lost_publishers == {"p1"} and inbox.stats.rejoins == 0
    opened = Channel("p1", "/t", Codec())
    opened.attach(inbox)
    assert inbox.rejoined("p1", count=False)  # (a channel that had never opened)
    assert inbox.stats.rejoins == 0 and not inbox.lost_publishers and not inbox.at_end


def test_a_publisher_that_comes_back_after_its_broken_end_is_not_counted_twice() -> None:
    channel, inbox = fed_inbox()
    channel.lost("cut")
    inbox.routed(frozenset())  # dropped by the routes: ended, broken
    assert (inbox.stats.publishers_ended, inbox.stats.publishers_broken) == (1, 1)
    assert inbox.tell_end()
    # It is routed again and a new channel feeds the inbox: back, no longer ended.
    inbox.routed(frozenset({"p1"}))
    back = Channel("p1", "/t", Codec())
    back.attach(inbox)
    assert inbox.rejoined("p1")
    assert not inbox.at_end
    stats = inbox.stats
    assert (stats.publishers_ended, stats.publishers_broken, stats.rejoins) == (0, 0, 1)
    back.lost("cut")
    inbox.routed(frozenset())
    assert (stats.publishers_ended, stats.publishers_broken) == (1, 1)
    # A clean end is final: a channel of that publisher attached later feeds nothing.
    clean_channel, clean = fed_inbox()
    clean_channel.end()
    Channel("p1", "/t", Codec()).attach(clean)
    assert clean.at_end and not clean.rejoined("p1")


def test_holds_tells_whether_a_channel_still_has_messages_queued() -> None:
    channel, inbox = fed_inbox()
    other = Channel("p2", "/t", Codec())
    other.attach(inbox)
    channel.deliver(1, "from p1")
    other.deliver(1, "from p2")
    other.deliver_body(2, b"\x01garbage")  # an undecodable stand-in holds nothing
    assert inbox.holds(channel) and inbox.holds(other)
    assert inbox.get_nowait() == "from p1"
    assert not inbox.holds(channel) and inbox.holds(other)


# -- the batch paths: Channel.deliver_run, Inbox.get with something queued --------------------


def _deliver_read(channel: Channel, frames: list[tuple[int, int, bytes, int, int]]) -> None:
    """A read's frames through Channel.deliver_run, as ChannelConnection's read loop
    hands them (its contract: the frame a run stops at goes to deliver_body)."""
    index = 0
    while index < len(frames):
        run = channel.deliver_run(frames, index)
        assert channel.run_end == (index if run < 0 else run)
        if run < 0:
            for _, seq, body, drops, sent_ns in frames[index:]:
                channel.deliver_body(seq, body, drops, sent_ns)
            return
        if run < len(frames):
            _, seq, body, drops, sent_ns = frames[run]
            channel.deliver_body(seq, body, drops, sent_ns)
        index = run + 1


def _channel_state(channel: Channel, inboxes: list[Inbox]) -> list[object]:
    taken: list[object] = []
    for inbox in inboxes:
        while len(inbox):
            try:
                message = inbox.get_nowait()
            except UndecodableMessageError as exc:
                taken.append(("raised", str(exc)))
                continue
            taken.append(
                tuple(m.tobytes() if isinstance(m, np.ndarray) else m for m in message)
                if type(message) is tuple
                else message.tobytes()
                if isinstance(message, np.ndarray)
                else message
            )
        taken.append((dataclasses.astuple(inbox.stats), inbox.handler_time.buckets))
    return [
        taken,
        dataclasses.astuple(channel.stats),
        channel.latency.buckets,
        channel.decode_time.buckets,
        channel.released,
        channel.pending,
        channel._pending_bytes,
        channel._last_seq,
    ]


_ORDINARY = st.tuples(st.integers(0, 2), st.integers(-(2**40), 2**40), st.integers(0, 2**62))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    reads=st.lists(
        st.lists(
            st.tuples(
                st.one_of(
                    _ORDINARY.map(lambda t: ("ordinary", t)),
                    _ORDINARY.map(lambda t: ("ordinary", t)),
                    # (a stream's steady values: one layout, so frames in a row make runs)
                    st.integers(256, 65535).map(lambda n: ("ordinary", (0, n, 2**40))),
                    st.integers(256, 65535).map(lambda n: ("ordinary", (1, n, 2**40))),
                    st.just(("other", (1, "x"))),  # another shape (a new layout)
                    st.binary(max_size=80).map(lambda b: ("garbage", b)),
                    st.just(("cut", b"")),  # an ordinary body one byte short
                ),
                st.sampled_from([0, 0, 0, 0, 1]),  # upstream drops before it
                st.sampled_from([0, 1, 1, -1]),  # sent_ns: none, past, future
            ),
            max_size=40,
        ),
        min_size=1,
        max_size=4,
    ),
    inboxes=st.lists(
        st.sampled_from(["lossless", "leaky", "callback", "encoded", "encoded"]), max_size=3
    ),
    take_between=st.booleans(),
)
def test_deliver_run_is_deliver_body_frame_by_frame(
    monkeypatch: pytest.MonkeyPatch,
    reads: list[list[tuple[tuple[str, object], int, int]]],
    inboxes: list[str],
    take_between: bool,
) -> None:
    """Reads of frames through deliver_run (a run per stretch of the layout decoded
    last) and the same frames through deliver_body one by one: the same messages in
    every inbox, in order, the same channel and inbox counters, histograms (a clock
    that moves 1 ns a read: the run reads it once, so only the latency total may differ
    by a few ns), releases and pending entries - with timed frames
    (one in 4, here), upstream drops, garbage, a second shape, and any mix of lossless,
    leaky inboxes (which make the run step aside), callback inboxes (called from the
    run), and encoded ones (a run of bodies, undecoded, when every inbox is one; else
    the run steps aside)."""
    monkeypatch.setattr(_channel, "TIMING_SAMPLE_MASK", 3)  # (one in 4 timed: often)
    monkeypatch.setattr(_inbox, "TIMING_SAMPLE_MASK", 3)
    ticks = itertools.count(5_000_000_000)  # (a clock that moves: timed decodes take 1 ns)
    monkeypatch.setattr(_channel, "time_ns", lambda: next(ticks))
    monkeypatch.setattr(_channel_encoded, "time_ns", lambda: next(ticks))
    monkeypatch.setattr(_inbox, "perf_counter_ns", lambda: 7)
    codec = Codec()
    sides = []
    for _ in range(2):
        releases: list[tuple[int, int]] = []
        channel = Channel("p-1", "/t", codec, on_release=lambda c, b, r=releases: r.append((c, b)))
        handled: list[object] = []
        attached = []
        for kind in inboxes:
            inbox = (
                Inbox(leaky=True, maxlen=1000)
                if kind == "leaky"
                else Inbox(encoded=True)
                if kind == "encoded"
                else Inbox(callback=handled.append)
                if kind == "callback"
                else Inbox()
            )
            channel.attach(inbox)
            attached.append(inbox)
        sides.append((channel, attached, releases, handled))
    array = np.arange(16, dtype=np.float32)
    seq = drops = 0
    for read in reads:
        frames = []
        for (what, value), dropped, when in read:
            seq += 1
            drops += dropped
            if what == "ordinary":
                body = codec.encode((*value, array)).to_bytes()  # type: ignore[misc]
            elif what == "other":
                body = codec.encode(value).to_bytes()
            elif what == "cut":
                body = codec.encode((0, 1, 2, array)).to_bytes()[:-1]
            else:
                assert isinstance(value, bytes)
                body = value
            sent_ns = {0: 0, 1: 4_000_000_000 + seq, -1: 6_000_000_000}[when]
            frames.append((seq, seq, body, drops, sent_ns))
        run_side, each_side = sides
        with quiet_channel_log():
            _deliver_read(run_side[0], frames)
            for _, s, body, d, sent in frames:
                each_side[0].deliver_body(s, body, d, sent)
        assert run_side[2][-1:] == each_side[2][-1:]  # (the run reports its release once)
        if take_between:
            assert _channel_state(run_side[0], run_side[1]) == _channel_state(
                each_side[0], each_side[1]
            )
    assert _channel_state(run_side[0], run_side[1]) == _channel_state(each_side[0], each_side[1])
    assert abs(run_side[0].latency.total - each_side[0].latency.total) < 10_000
    assert [repr(m) for m in run_side[3]] == [repr(m) for m in each_side[3]]


@contextlib.contextmanager
def quiet_channel_log() -> Iterator[None]:
    logger = logging.getLogger("ezflow.channel")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@pytest.mark.parametrize("act", ["none", "raise", "close", "detach", "beside", "leaky"])
def test_a_run_calls_on_message_as_deliver_body_would(
    monkeypatch: pytest.MonkeyPatch, act: str
) -> None:
    """Reads of one layout to an on_message inbox, lossless (or leaky), through runs and
    frame by frame: the same calls, counters, releases and pending entries - also when the
    callback raises, closes its inbox or detaches it in the middle of a run (the rest
    of the run goes to no callback, as frame by frame). Beside a queueing inbox the run
    steps aside (a callback could close or detach it, which a run's appends would not
    see)."""
    monkeypatch.setattr(_inbox, "perf_counter_ns", lambda: 7)  # (the handler time sampled)
    ticks = itertools.count(5_000_000_000)  # (timed decodes take 1 ns on either path)
    monkeypatch.setattr(_channel, "time_ns", lambda: next(ticks))
    codec = Codec()
    array = np.arange(16, dtype=np.float32)
    bodies = [codec.encode((0, 1000 + n, 2**40, array)).to_bytes() for n in range(40)]
    sides = []
    for run in (True, False):
        channel, releases, _ = make_channel()
        called: list[object] = []
        held: list[Any] = []  # (the attachment, once attached)

        def on_message(message: Any, called: list[object] = called, held: list[Any] = held) -> None:
            called.append(message[1])
            if message[1] == 1020:  # (the 21st: in the middle of the second read)
                if act == "raise":
                    raise RuntimeError("a bad callback")
                if act == "close":
                    held[0].inbox.close()
                if act == "detach":
                    held[0].channel.detach(held[0])

        callback_inbox = Inbox(callback=on_message, name="s-cb", leaky=act == "leaky")
        held.append(channel.attach(callback_inbox))
        inboxes = [held[0].inbox]
        if act == "beside":
            inboxes.append(Inbox())
            channel.attach(inboxes[1])
        runs = []
        with quiet_channel_log():
            channel.deliver_body(1, bodies[0])  # (learns the layout: by the second)
            channel.deliver_body(2, bodies[1])
            for start in range(2, 40, 13):
                frames = [
                    (seq, seq, bodies[seq - 1], 0, 0)
                    for seq in range(start + 1, min(start + 14, 41))
                ]
                if run:
                    runs.append(channel.deliver_run(frames, 0))
                    for _, seq, body, drops, sent in frames[max(runs[-1], 0) :]:
                        channel.deliver_body(seq, body, drops, sent)
                else:
                    for _, seq, body, drops, sent in frames:
                        channel.deliver_body(seq, body, drops, sent)
        sides.append((channel, inboxes, releases, called, runs))
    (run_channel, run_inboxes, run_releases, run_called, runs), each = sides
    # (a closed inbox steps aside; the frames of a run are all delivered)
    assert runs == ([-1, -1, -1] if act == "beside" else [13, 13, -1 if act == "close" else 12])
    assert run_called == each[3]
    stopped = act in ("close", "detach")
    assert run_called == list(range(1000, 1021 if stopped else 1040))
    assert _channel_state(run_channel, run_inboxes) == _channel_state(each[0], each[1])
    assert run_releases[-1:] == each[2][-1:]  # (the released totals so far)
    assert run_channel.pending == (19 if act == "close" else 0)  # (held by a closed inbox)
    assert run_inboxes[0].stats.callback_errors == (act == "raise")


def test_deliver_run_takes_a_stream_of_tuples_in_one_call() -> None:
    """A read of ordinary tuples (none timed) is one run: deliver_body is not called, and
    each lossless inbox's waiting get is woken once."""
    codec = Codec()
    channel = Channel("p-1", "/t", codec)
    inbox = Inbox()
    channel.attach(inbox)
    array = np.arange(16, dtype=np.float32)
    body = codec.encode((0, 1, 2, array)).to_bytes()
    channel.deliver_body(1, body)  # (learns the layout)
    inbox.get_nowait()
    frames = [(seq, seq, body, 0, 0) for seq in range(2, 16)]
    assert channel.deliver_run(frames, 0) == len(frames) == channel.run_end
    assert len(inbox) == 14 and channel.pending == 14 and channel.stats.messages == 15
    inbox.close()
    assert channel.deliver_run(frames, 0) == -1  # (a closed inbox: frame by frame)


async def test_a_queued_get_is_get_nowait() -> None:
    """Inbox.get with something queued (get_nowait, inlined: no suspension) against
    get_nowait: the same messages, counters, handler-time samples and releases, for
    two channels feeding one inbox, lossless and leaky, with detaches between."""
    sides = []
    for _ in range(2):
        releases: list[tuple[str, int, int]] = []
        a = Channel("p-1", "/t", Codec(), on_release=lambda c, b, r=releases: r.append(("a", c, b)))
        b = Channel("p-2", "/t", Codec(), on_release=lambda c, n, r=releases: r.append(("b", c, n)))
        inbox, leaky = Inbox(), Inbox(leaky=True, maxlen=3)
        attachments = [a.attach(inbox), b.attach(inbox), a.attach(leaky)]
        sides.append((a, b, inbox, leaky, releases, attachments))
    for step in range(120):
        for a, b, _, _, _, attachments in sides:
            (a if step % 3 else b).deliver(step + 1, f"m{step}", nbytes=step)
            if step == 60:
                a.detach(attachments[0])
        for taker, (_, _, inbox, leaky, _, _) in zip(("get", "get_nowait"), sides, strict=True):
            for box in (inbox, leaky) if step % 4 == 0 else ():
                while len(box):
                    box.get_nowait() if taker == "get_nowait" else await box.get()
    states = [
        (
            dataclasses.astuple(inbox.stats),
            dataclasses.astuple(leaky.stats),
            sum(inbox.handler_time.buckets),
            a.released,
            b.released,
            a.pending,
            b.pending,
            releases,
        )
        for a, b, inbox, leaky, releases, _ in sides
    ]
    assert states[0] == states[1]


# ----------------------------------------------------------------- encoded inboxes


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), min_size=1, max_size=4), st.data())
def test_encoded_inboxes_get_the_body_the_codec_makes_and_the_others_the_message(
    objs: list[object], data: st.DataObject
) -> None:
    """An encoded inbox gets each message's body exactly as Codec.encode makes it - the
    body that arrived (bytes, or a memoryview made read-only), undecoded when every
    inbox is encoded; from a local publisher (no body), encoded once by the channel -
    while an inbox beside it gets what the general decoder gives; a garbled body goes to
    the encoded inbox as it came and to the other as an undecodable message."""
    reference = Codec()
    codec = Codec()
    channel = Channel("p-1", "/t", codec)
    encoded = Inbox(encoded=True)
    channel.attach(encoded)
    plain = Inbox() if data.draw(st.booleans()) else None
    if plain is not None:
        channel.attach(plain)
    seq = 0
    for obj in objs:
        body = _encoded(reference, obj)
        if body is None:
            continue
        how = data.draw(st.sampled_from(["bytes", "memoryview", "local", "garbled"]))
        seq += 1
        if how == "local":
            channel.deliver(seq, obj)
        elif how == "garbled":
            body = body[: len(body) // 2]
            channel.deliver_body(seq, body)
        else:
            channel.deliver_body(seq, body if how == "bytes" else memoryview(bytearray(body)))
        got = encoded.get_nowait()
        assert bytes(got) == body
        assert type(got) is bytes or (type(got) is memoryview and got.readonly)
        if how != "garbled":
            assert_same_decoded(_decode_general(reference, body), reference.decode(got))
        if plain is not None:
            expected = outcome(lambda b=body: _decode_general(reference, b))  # type: ignore[misc]
            actual = outcome(plain.get_nowait)
            if how == "local":
                assert actual[0] == "ok" and (actual[1] is obj or isinstance(obj, np.ndarray))
            elif expected[0] == "raised":
                assert actual == ("raised", UndecodableMessageError)
            else:
                assert_same_decoded(expected[1], actual[1])
        assert not len(encoded) and (plain is None or not len(plain))
    # Nothing decoded for an encoded inbox alone (but a local message, which is one).
    if plain is None:
        assert channel.stats.decoded == 0
    assert channel.pending == 0 and channel._body is None


def test_an_encoded_inbox_holds_and_releases_like_any_lossless_one() -> None:
    channel, releases, _ = make_channel()
    encoded = Inbox(encoded=True)
    channel.attach(encoded)
    for seq in range(1, 4):
        channel.deliver_body(seq, Codec().encode((seq, "x")).to_bytes())
    assert channel.pending == 3 and releases == []
    assert Codec().decode(encoded.get_nowait()) == (1, "x")
    assert channel.released[0] == 1 and channel.pending == 2
    leaky = Inbox(encoded=True, leaky=True, maxlen=1)
    channel.attach(leaky)
    for seq in range(4, 7):
        channel.deliver_body(seq, Codec().encode(seq).to_bytes())
    assert leaky.stats.dropped == 2 and Codec().decode(leaky.get_nowait()) == 6
    calls: list[Any] = []
    channel.attach(Inbox(encoded=True, callback=calls.append))
    channel.deliver(7, (7, "y"))  # (a local message: encoded once for the callback)
    assert calls == [Codec().encode((7, "y")).to_bytes()]


# -- the stock loop's wake-up and deferred-release handles (ezflow._core._loop.ready_queue)

_WAKE_OPS = st.one_of(
    st.just(("wait",)),
    st.just(("deliver",)),
    st.just(("deliver_soon",)),
    st.tuples(st.just("spin"), st.integers(1, 12)),
    st.just(("yield",)),
    st.just(("take_b",)),
    st.just(("detach_a",)),
    st.just(("cancel",)),
)


def _run_wake_script(ops: list[tuple[Any, ...]], *, b_lossless: bool, fast: bool) -> list[Any]:
    """Run *ops* on a new stock asyncio loop: tasks awaiting ``get`` of inbox a (two
    messages each), deliveries now or from a callback of the loop, other callbacks
    queued ahead (a ready queue longer than ``WAKE_QUEUE_SCAN``), takes from inbox b,
    a detach, cancellations; the state after each op. Inbox b is lossless (a message is
    released once both took it) or leaky (a's takes alone release). *fast*: with the
    inboxes' kept handles (what ``ready_queue`` allows on this loop), else as on any
    other loop."""

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        assert (_inbox.ready_queue(loop) is not None) == fast
        channel, releases, _ = make_channel()
        a, b = Inbox(), Inbox() if b_lossless else Inbox(leaky=True, maxlen=4)
        taker = channel.attach(a)
        channel.attach(b)
        seqs = itertools.count(1)
        tasks: list[asyncio.Task[list[Any]]] = []

        def deliver() -> None:
            seq = next(seqs)
            channel.deliver(seq, ("m", seq), nbytes=seq % 5 + 1)

        async def take_two() -> list[Any]:
            return [await a.get(), await a.get()]

        def state() -> Any:
            return (
                list(releases),
                [
                    (t.cancelled(), t.result() if t.done() and not t.cancelled() else None)
                    for t in tasks
                ],
                len(a),
                len(b),
                channel.pending,
                dataclasses.astuple(a.stats),
            )

        trace = []
        for op in ops:
            name = op[0]
            if name == "wait" and sum(not t.done() for t in tasks) < 3:
                tasks.append(asyncio.ensure_future(take_two()))
            elif name == "deliver":
                deliver()
            elif name == "deliver_soon":
                loop.call_soon(deliver)
            elif name == "spin":
                for _ in range(op[1]):
                    loop.call_soon(lambda: None)
            elif name == "yield":
                await asyncio.sleep(0)
            elif name == "take_b" and len(b):
                b.get_nowait()
            elif name == "detach_a":
                channel.detach(taker)
            elif name == "cancel":
                for task in tasks:
                    if not task.done():
                        task.cancel()
                        break
            trace.append(state())
        for _ in range(4):
            await asyncio.sleep(0)
        trace.append(state())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return trace

    runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
    with runner, contextlib.ExitStack() as stack:
        if not fast:
            patch = pytest.MonkeyPatch()
            stack.callback(patch.undo)
            patch.setattr(_inbox, "ready_queue", lambda loop: None)
        return runner.run(main())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_WAKE_OPS, min_size=1, max_size=30), st.booleans())
# (a delivery that wakes a task waiting anew while the kept wake-up handle is queued
# still for another task: a get that took the first delivery's message in between)
@example(
    ops=[("wait",), ("yield",), ("deliver_soon",), ("wait",), ("deliver_soon",), ("yield",)],
    b_lossless=False,
)
def test_the_stock_loops_kept_handles_wake_and_release_as_call_soon_does(
    ops: list[tuple[Any, ...]], b_lossless: bool
) -> None:
    """On the stock asyncio loop a delivery wakes a waiting get through the inbox's kept
    wake-up handle (not ``Future.set_result``'s ``call_soon``), and a woken get's
    release is deferred through the inbox's kept release handle (not one ``call_soon``
    each): the same steps with and without them give the same takes, results,
    cancellations, releases and counters after every step - with several tasks waiting
    at once, deliveries from callbacks between their steps, long ready queues (where
    the kept wake-up handle is not used), detaches and cancellations."""
    fast = _run_wake_script(ops, b_lossless=b_lossless, fast=True)
    assert fast == _run_wake_script(ops, b_lossless=b_lossless, fast=False)


def test_a_woken_get_on_the_stock_loop_uses_the_kept_handles() -> None:
    """The fast path of the differential test above is the one taken: a paced get's
    wake-up and its deferred release go through the two handles the inbox keeps, and no
    ``call_soon`` is made for either."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        channel, releases, _ = make_channel()
        inbox = Inbox()
        channel.attach(inbox)
        calls: list[Any] = []
        original = loop.call_soon

        def call_soon(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
            calls.append(callback)
            return original(callback, *args, **kwargs)

        for seq in (1, 2, 3):
            waiting = asyncio.ensure_future(inbox.get())
            await asyncio.sleep(0)  # (the get waits)
            loop.call_soon = call_soon  # type: ignore[method-assign]
            try:
                channel.deliver(seq, f"m{seq}", nbytes=1)
                assert inbox._wake_handle is not None and inbox._wake_handle in loop._ready  # type: ignore[attr-defined]
                assert await waiting == f"m{seq}"  # (its release ran meanwhile)
            finally:
                del loop.call_soon
            assert releases[-1] == (seq, seq) and not inbox._deferred
        assert not any(getattr(c, "__name__", "") == "_release_taken" for c in calls), calls

    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        runner.run(main())
