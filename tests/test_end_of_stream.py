"""End of stream (low level): a subscriber ends once every publisher that fed it ended.

Unit-level and whole-graph scenarios (end_when_done, draining on stop) are further down.
"""

from __future__ import annotations

import asyncio

import pytest

import ezflow


async def _drain(sub: ezflow.Subscriber, timeout: float = 10) -> list[object]:
    async def collect() -> list[object]:
        return [message async for message in sub]

    return await asyncio.wait_for(collect(), timeout)


@pytest.mark.parametrize("transport", ["local", "shm", "tcp"])
async def test_async_for_ends_after_the_last_message(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    sub = await ctx.subscriber("/eos/one", transport=transport)
    leaky = await ctx.subscriber("/eos/one", transport=transport, leaky=True, queue=500)

    async def publish() -> None:
        async with await ctx.publisher("/eos/one", max_in_flight=8) as pub:
            for i in range(300):
                await pub.publish(i)

    publishing = asyncio.ensure_future(publish())
    assert await _drain(sub) == list(range(300))  # (backpressure: received meanwhile)
    await publishing
    assert await _drain(leaky) == list(range(300))
    assert sub.ended
    with pytest.raises(ezflow.EndOfStream):
        await sub.recv()
    with pytest.raises(ezflow.EndOfStream):
        sub.recv_nowait()
    assert (sub.stats.publishers_ended, sub.stats.publishers_broken) == (1, 0)


async def test_end_waits_for_every_publisher(ctx: ezflow.GraphContext) -> None:
    sub = await ctx.subscriber("/eos/two")
    first = await ctx.publisher("/eos/two")
    second = await ctx.publisher("/eos/two", transport="tcp")
    await first.publish("a")
    await first.aclose()
    assert await asyncio.wait_for(sub.recv(), 5) == "a"
    assert not sub.ended  # the tcp publisher may still publish
    receiving = asyncio.ensure_future(sub.recv())
    await second.publish("b")
    assert await asyncio.wait_for(receiving, 5) == "b"
    await second.aclose()
    assert await _drain(sub) == []


async def test_a_publisher_routed_before_the_end_keeps_the_stream_open(
    ctx: ezflow.GraphContext,
) -> None:
    sub = await ctx.subscriber("/eos/late")
    first = await ctx.publisher("/eos/late")
    await first.publish(1)
    late = await ctx.publisher("/eos/other", transport="tcp")
    await ctx.connect("/eos/other", "/eos/late")  # routes now list `late` for sub
    await first.aclose()
    assert await asyncio.wait_for(sub.recv(), 5) == 1
    assert not sub.ended
    await late.publish(2)
    await late.aclose()
    assert await _drain(sub) == [2]


async def test_subscriber_without_publisher_keeps_waiting(ctx: ezflow.GraphContext) -> None:
    async with await ctx.publisher("/eos/gone") as pub:
        await pub.publish(0)
    # Created after the only publisher ended: it never had one, so one may still come.
    sub = await ctx.subscriber("/eos/gone")
    waiting = asyncio.ensure_future(sub.recv())
    await asyncio.sleep(0.1)
    assert not waiting.done() and not sub.ended
    async with await ctx.publisher("/eos/gone") as pub:
        await pub.publish(1)
    assert await asyncio.wait_for(waiting, 5) == 1
    assert await _drain(sub) == []


async def test_closed_subscriber_still_raises_closed(ctx: ezflow.GraphContext) -> None:
    sub = await ctx.subscriber("/eos/closed")
    async with await ctx.publisher("/eos/closed") as pub:
        await pub.publish(0)
    await sub.aclose()
    assert sub.recv_nowait() == 0
    with pytest.raises(ezflow.ClosedResourceError):
        await sub.recv()
