"""A relayed small body to stream links in one call (``_stream_relay.relay_stream_py`` and
its compiled twin, ``_speedups.PublishPath.relay_stream``): the same frames, counters and
errors as ``Outlet._send_small(..., relayed=True)``, the general path, and what
``publish_encoded_many`` sends through it over a real connection."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np
import pytest
from _leaks import blocks_grown
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_speedups import _CHANGES, _apply_change, _Connection, _state

from ezflow._core import _compiled, _outlet_objects
from ezflow._core._codec import Codec
from ezflow._core._config import SHM_COPY_NT_BYTES, STREAM_FLUSH_MESSAGES
from ezflow._core._outlet import Outlet
from ezflow._core._tracing import TraceState
from ezflow._transports import _stream_publish, _stream_relay
from ezflow._transports._stream_publish import StreamLink
from ezflow._transports._stream_relay import relay_stream_py

needs_extension = pytest.mark.skipif(
    _compiled.SPEEDUPS is None, reason="the C extension ezflow._core._speedups is not built"
)

_RELAY = st.tuples(
    st.just("relay"),
    st.sampled_from(["tuple"] * 6 + ["big", "list", "view", "huge"]),
    st.sampled_from([0, 1, 2, 255, 2**16, 2**40]),
)
#: steps: a change of state, then a few relays
_RELAY_OPS = st.tuples(_CHANGES, st.lists(_RELAY, max_size=20)).map(lambda s: [s[0], *s[1]])


@functools.lru_cache(maxsize=256)
def _encoded(kind: str, n: int) -> bytes:
    return Codec().encode(_MESSAGES[kind](n)).to_bytes()


_MESSAGES: dict[str, Any] = {
    "tuple": lambda n: (0, n, 7, np.zeros(16, np.float32)),
    "big": lambda n: (0, n, 7, np.zeros(1100, np.float32)),
    "list": lambda n: [n, 1],
    "view": lambda n: (0, n),
}


def _body(kind: str, n: int) -> tuple[Any, Any]:
    """A relayed message and its body: what a codec made of it (bytes), a body over
    SMALL_BODY, a memoryview (not bytes: the general path's), one from
    SHM_COPY_NT_BYTES on (its yield share is not its size)."""
    if kind == "huge":
        return b"h", _HUGE
    body = _encoded(kind, n)
    return _MESSAGES[kind](n), (memoryview(body) if kind == "view" else body)


_HUGE = b"x" * SHM_COPY_NT_BYTES


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_extension), False])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from([(True, 1 << 20)] * 3 + [(False, 1 << 20)] * 2 + [(True, 100)]),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from([(4, 1 << 20), (64, 224), (64, 1 << 20), (64, 1 << 20)]),
    st.lists(_RELAY_OPS, min_size=3, max_size=25).map(
        lambda steps: [op for step in steps for op in step]
    ),
    st.sampled_from([3, 16, STREAM_FLUSH_MESSAGES]),
)
@example(  # (a burst: the turn's batch under way, the relay sends each)
    kinds=[(True, 1 << 20)],
    window=(64, 1 << 20),
    ops=[("batch",), *[("relay", "tuple", n) for n in range(20)]],
    flush_messages=16,
)
@example(  # (a handoff outlet in a burst, and paced)
    kinds=[(True, 1 << 20), (False, 1 << 20)],
    window=(64, 1 << 20),
    ops=[
        ("handoff", 1 << 62),
        ("batch",),
        ("relay", "tuple", 1),
        ("handoff", 0),
        ("batch",),
        ("relay", "tuple", 2),
    ],
    flush_messages=16,
)
def test_the_stream_relay_is_send_small(
    compiled: bool,
    kinds: list[tuple[bool, int]],
    window: tuple[int, int],
    ops: list[tuple[Any, ...]],
    flush_messages: int,
) -> None:
    """The same outlets (1-3 stream links: lossless, leaky, small max_message_size; a
    small window), the same steps (relayed bodies of the codec's, over SMALL_BODY, not
    bytes, from SHM_COPY_NT_BYTES on; loop turns; releases; stalls; a closed outlet;
    tracing; a hook; handoff paced or in a burst; out-of-line limits; a batch under way;
    upstream drops) in two worlds, one sending each body through the relay (compiled or
    pure) and ``_send_small(..., relayed=True)`` where it declines, the other through
    ``_send_small`` alone: the same errors, counters, windows, statistics and frames,
    queued and written, after every step."""
    tracing, hooks = TraceState(), []
    saved_flush = _stream_publish._FLUSH_MESSAGES
    _stream_publish._FLUSH_MESSAGES = flush_messages  # type: ignore[misc]
    try:
        path = _stream_publish.compiled_publish_path(
            _compiled.SPEEDUPS if compiled else None, tracing=tracing, hooks=hooks
        )
    finally:
        _stream_publish._FLUSH_MESSAGES = saved_flush  # type: ignore[misc]
    fast = path.relay_stream if compiled else relay_stream_py
    loop = asyncio.new_event_loop()
    saved = _stream_relay.TRACING, _stream_relay.PUBLISH_HOOKS
    _stream_relay.TRACING, _stream_relay.PUBLISH_HOOKS = tracing, hooks  # type: ignore[misc]
    _stream_publish._FLUSH_MESSAGES = flush_messages  # type: ignore[misc]

    async def world() -> Outlet:
        outlet = Outlet(
            "p-1", "/t", Codec(), max_in_flight=window[0], max_in_flight_bytes=window[1]
        )
        for lossless, max_size in kinds:
            link = StreamLink(_Connection(), lossless=lossless, max_size=max_size)  # type: ignore[arg-type]
            outlet.add_link(link)
        return outlet

    fast_sends = 0
    try:
        worlds = [loop.run_until_complete(world()) for _ in range(2)]
        sent_mark = 0
        for op in ops:
            name = op[0]
            if name == "relay":
                message, body = _body(op[1], op[2])
                results = []
                for index, outlet in enumerate(worlds):
                    try:
                        if index == 0 and fast(outlet, message, body):
                            fast_sends += 1
                            results.append("sent")
                            continue
                        outlet._send_small(outlet._links, message, body, relayed=True)  # type: ignore[arg-type]
                        results.append("sent")
                    except Exception as exc:
                        results.append(f"{type(exc).__name__}: {exc}")
                assert results[0] == results[1], (op, results)
            else:
                mark = _apply_change(op, worlds, loop, tracing, hooks)
                sent_mark = sent_mark if mark is None else mark
            # (and whether a paced handoff looked at the thread's sleeps: Outlet._hand_off)
            assert [(_state(w), w._slept) for w in worlds[:1]] == [
                (_state(w), w._slept) for w in worlds[1:]
            ], op
            for outlet in worlds:
                # (the clock decides nothing: a handoff outlet's last send stays where
                # the "handoff" step put it - far back: paced, ahead: a burst)
                outlet._sent_ns = sent_mark
                for link in outlet._links:
                    link._written_ns = 0  # type: ignore[attr-defined]
    finally:
        _stream_relay.TRACING, _stream_relay.PUBLISH_HOOKS = saved  # type: ignore[misc]
        _stream_publish._FLUSH_MESSAGES = saved_flush  # type: ignore[misc]
        loop.close()
    if (
        len(ops) > 1
        and ops[0] == ("batch",)
        and all(op[:2] == ("relay", "tuple") for op in ops[1:])
    ):
        assert fast_sends > 0  # (a burst's bodies are the relay's own)


@needs_extension
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_publish_encoded_many_over_tcp_takes_the_compiled_stream_relay(loop: str) -> None:
    """A relay's run to a subscriber over tcp (the Zenoh import's, in a bridge process of
    its own): the bodies through the compiled relay but a turn's first (which schedules
    the turn's flush) - counted by it -, every message arriving in order as published,
    the publisher's counts those of one publish_encoded each (no encode)."""
    import ezflow  # noqa: PLC0415
    from ezflow._core._loop import run_coroutine  # noqa: PLC0415

    relay = _outlet_objects.relay_stream
    assert relay is not None
    codec = Codec()
    messages = [(0, seq, 1, np.full(16, seq, np.float32)) for seq in range(600)]
    bodies = [codec.encode(m).to_bytes() for m in messages]

    async def main() -> tuple[list[Any], Any]:
        async with (
            ezflow.GraphServer(("127.0.0.1", 0)) as server,
            ezflow.GraphContext(server.address, auto_start=False) as ctx,
        ):
            sub = await ctx.subscriber("/relay", transport="tcp")
            pub = await ctx.publisher("/relay", transport="tcp", max_in_flight=128)
            await pub.wait_for_channels(1)
            got: list[Any] = []

            async def take() -> None:
                while len(got) < len(messages):
                    got.append(await sub.recv())

            taker = asyncio.create_task(take())
            await pub.publish_encoded_many(messages, bodies)
            await asyncio.wait_for(taker, 10)
            return got, pub.statistics()

    before = relay.__self__.stream_relays  # type: ignore[attr-defined]
    got, stats = run_coroutine(main(), loop=loop)
    relayed = relay.__self__.stream_relays - before  # type: ignore[attr-defined]
    assert len(messages) // 2 < relayed < len(messages)
    assert [m[1] for m in got] == list(range(len(messages)))
    assert all(np.array_equal(a[3], b[3]) for a, b in zip(got, messages, strict=True))
    assert stats.messages == len(messages) and stats.encodes == 0
    assert stats.bytes == sum(len(b) for b in bodies) and stats.waits > 0


@needs_extension
def test_the_compiled_stream_relay_refuses_wrong_arguments_and_leaks_nothing() -> None:
    """Wrong arguments raise TypeError; 1e5 relays (the frames taken away, the window
    released) leave no memory block behind."""
    relay = _outlet_objects.relay_stream
    assert relay is not None
    loop = asyncio.new_event_loop()
    try:

        async def world() -> Outlet:
            outlet = Outlet(
                "p-1", "/t", Codec(), max_in_flight=1 << 30, max_in_flight_bytes=1 << 60
            )
            outlet.add_link(StreamLink(_Connection(), lossless=True, max_size=1 << 20))  # type: ignore[arg-type]
            return outlet

        outlet = loop.run_until_complete(world())
        (link,) = outlet._links
        with pytest.raises(TypeError, match="relay_stream"):
            relay(outlet, b"x")  # type: ignore[call-arg]
        assert relay(object(), (1,), b"x") is False  # type: ignore[arg-type]
        assert relay(outlet, (1,), b"x") is False  # (not collecting: paced)
        link._flush_scheduled = True  # type: ignore[attr-defined]
        body = Codec().encode((0, 1, 7, np.zeros(16, np.float32))).to_bytes()

        def run(times: int) -> None:
            for _ in range(times):
                assert relay(outlet, (0,), body)
                link._queued.clear()  # type: ignore[attr-defined]
                link._queued_messages = link._queued_bytes = 0  # type: ignore[attr-defined]
            link.released(link.sent_count, link.sent_bytes)

        grown = blocks_grown(run, warm=1000, times=100_000)
        assert grown < 100, f"{grown} memory blocks more after 1e5 stream relays"
        assert outlet.stats.messages == 101_000
    finally:
        loop.close()
