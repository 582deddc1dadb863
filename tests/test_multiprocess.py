"""Real processes, real sockets: the acceptance scenarios of the core runtime."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest
from _children import mixed_payload, payload
from _proc import Child
from _waiting import wait_until
from conftest import loop_kind

import ezflow

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("subs", [3, 4])
async def test_one_publisher_several_subscribers_in_another_process(
    ctx: ezflow.GraphContext, subs: int
) -> None:
    """10,000 arrays to 3 (and 4) subscribers of one other process, over tcp: content and
    order verified, one channel and one decode per message in that process."""
    count, size = 10_000, 16
    child = await Child.start(
        "subscribers",
        loop_kind(),
        address=list(ctx.address),
        topic="/mp/fanout",
        subs=subs,
        count=count,
        size=size,
        transport="tcp",
    )
    try:
        await child.event("ready")
        pub = await ctx.publisher("/mp/fanout")
        await pub.wait_for_channels(1)
        for i in range(count):
            await pub.publish(payload(i, size))
        done = await child.event("done", timeout=60)
        assert done["errors"] == []
        assert done["received"] == [count] * subs
        # one channel in that process, one decode per message, one object for all three
        assert done["channels"] == 1
        assert done["transports"] == ["tcp"]
        assert done["decoded"] == [count]
        assert done["same_object"]
        assert pub.statistics().encodes == count
        assert await child.stop() == 0
    finally:
        await child.aclose()


async def test_fan_in_from_three_processes(ctx: ezflow.GraphContext) -> None:
    sub = await ctx.subscriber("/mp/fanin")
    count = 2000
    children = [
        await Child.start(
            "publish",
            loop_kind(),
            address=list(ctx.address),
            topic="/mp/fanin",
            count=count,
            tag=tag,
        )
        for tag in range(3)
    ]
    try:
        for child in children:
            await child.event("ready")
        seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
        for _ in range(3 * count):
            tag, i = (await asyncio.wait_for(sub.recv(), 30)).tolist()
            seen[tag].append(i)
        for tag in range(3):
            assert seen[tag] == list(range(count)), f"publisher {tag} out of order or lossy"
        # Other processes on this host: shared memory, chosen automatically.
        assert sorted(c.transport for c in ctx.channels) == ["shm"] * 3
        for child in children:
            assert await child.stop() == 0
    finally:
        for child in children:
            await child.aclose()


async def test_edge_added_and_removed_while_messages_flow(ctx: ezflow.GraphContext) -> None:
    sub = await ctx.subscriber("/mp/dst")
    child = await Child.start(
        "publish_forever", loop_kind(), address=list(ctx.address), topic="/mp/src", pace=0.0005
    )
    try:
        await child.event("ready")
        await asyncio.sleep(0.1)  # a window: nothing may arrive in it
        assert sub.queued == 0  # not connected yet: nothing arrives
        await ctx.connect("/mp/src", "/mp/dst")
        first = int((await asyncio.wait_for(sub.recv(), 5))[0])
        received = [first]
        while len(received) < 300:
            received.append(int((await asyncio.wait_for(sub.recv(), 5))[0]))
        await ctx.disconnect("/mp/src", "/mp/dst")
        while sub.queued:
            received.append(int(sub.recv_nowait()[0]))
        # a contiguous run: nothing lost, duplicated or reordered while connected
        assert received == list(range(first, first + len(received)))
        await asyncio.sleep(0.3)  # a window: nothing may arrive in it
        assert sub.queued == 0, "messages still arrive after disconnect returned"
        # and again: reconnecting resumes the flow
        await ctx.connect("/mp/src", "/mp/dst")
        later = int((await asyncio.wait_for(sub.recv(), 5))[0])
        assert later > received[-1]
    finally:
        await child.aclose()


async def test_killed_subscriber_process_is_dropped_and_publisher_keeps_going(
    ctx: ezflow.GraphContext,
) -> None:
    pub = await ctx.publisher("/mp/kill", max_in_flight=8)
    local = await ctx.subscriber("/mp/kill")
    child = await Child.start(
        "subscribe_forever",
        loop_kind(),
        address=list(ctx.address),
        topic="/mp/kill",
        stall=True,
        transport="tcp",
    )
    try:
        await child.event("ready")
        await pub.wait_for_channels(2)
        # the stalled child holds the lossless window: the publisher blocks after 8 more
        publishing = asyncio.ensure_future(publish_range(pub, 100))
        got = [await local.recv() for _ in range(8)]
        await asyncio.sleep(0.2)  # a window: publishing may not end in it
        assert not publishing.done()

        os.kill(child.pid, signal.SIGKILL)

        async def child_gone() -> bool:
            graph = await ctx.graph()
            return len(graph["subscribers"]) == 1 and len(graph["clients"]) == 1

        assert await wait_until(child_gone, "the child gone", 1.0) < 1.0
        got += [await asyncio.wait_for(local.recv(), 5) for _ in range(92)]
        await asyncio.wait_for(publishing, 5)
        assert got == list(range(100))
        assert pub.channels == 1
    finally:
        await child.aclose()


async def publish_range(pub: ezflow.Publisher, n: int) -> None:
    for i in range(n):
        await pub.publish(i)


async def test_killed_publisher_process_ends_cleanly_for_subscribers(
    ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    sub = await ctx.subscriber("/mp/pubkill")
    healthy = await ctx.publisher("/mp/pubkill")
    child = await Child.start(
        "publish_forever", loop_kind(), address=list(ctx.address), topic="/mp/pubkill", pace=0.001
    )
    try:
        await child.event("ready")
        await asyncio.wait_for(sub.recv(), 5)
        os.kill(child.pid, signal.SIGKILL)

        async def publisher_gone() -> bool:
            graph = await ctx.graph()
            return len(graph["publishers"]) == 1

        await wait_until(publisher_gone, "the publisher gone", 2.0)
        while sub.queued:
            sub.recv_nowait()
        assert len(ctx.channels) == 1  # only the healthy local publisher's channel
        await healthy.publish(np.array([-1]))
        assert (await asyncio.wait_for(sub.recv(), 2)).tolist() == [-1]
        # The killed publisher ended its stream (broken); the healthy one keeps it open.
        assert (sub.statistics().publishers_ended, sub.statistics().publishers_broken) == (1, 1)
        assert not sub.ended
        await healthy.aclose()
        with pytest.raises(ezflow.EndOfStream):
            await asyncio.wait_for(sub.recv(), 2)
        assert "Traceback" not in caplog.text
    finally:
        await child.aclose()


async def test_restart_after_a_crash_works(ctx: ezflow.GraphContext) -> None:
    for _ in range(2):
        child = await Child.start(
            "publish_forever", loop_kind(), address=list(ctx.address), topic="/mp/again"
        )
        try:
            await child.event("ready")
            sub = await ctx.subscriber("/mp/again")
            await asyncio.wait_for(sub.recv(), 5)
            os.kill(child.pid, signal.SIGKILL)
            await child.process.wait()
            await sub.aclose()
        finally:
            await child.aclose()


@pytest.mark.parametrize(
    ("transport", "sizes"),
    [
        # 64 KiB messages: more than the socket buffers hold
        ("tcp", [64 * 1024]),
        # inline, ring slots and out-of-line blocks: the publisher's segments go away
        # right after, yet the subscriber reads everything first
        ("shm", [300 * 1024, 100 * 1024, 64]),
    ],
)
async def test_closing_right_after_publishing_delivers_everything(
    server: ezflow.GraphServer, transport: str, sizes: list[int]
) -> None:
    count = 200
    child = await Child.start(
        "subscribers",
        loop_kind(),
        address=list(server.address),
        topic="/mp/tail",
        subs=1,
        count=count,
        sizes=sizes,
        transport=transport,
    )
    try:
        await child.event("ready")
        async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
            pub = await ctx.publisher("/mp/tail")
            await pub.wait_for_channels(1)
            for i in range(count):
                await pub.publish(mixed_payload(i, sizes))
        done = await child.event("done", timeout=30)
        assert done["errors"] == [] and done["received"] == [count]
    finally:
        await child.aclose()


async def test_on_message_subscriber_over_shm_from_another_process(
    ctx: ezflow.GraphContext,
) -> None:
    """A callback subscriber fed by another process over shm, with zero-copy (128 KiB)
    messages: every message in order, and the ones it keeps never change afterwards."""
    count, size = 1000, 16 * 1024  # float64: 128 KiB, above the inline limit
    got: list[int] = []
    bad: list[int] = []
    kept: dict[int, np.ndarray] = {}
    done = asyncio.get_running_loop().create_future()

    def on_message(message: np.ndarray) -> None:
        i = len(got)
        got.append(int(message[0]))
        if not np.array_equal(message, payload(i, size)):
            bad.append(i)
        if i % 100 == 0:
            kept[i] = message  # kept past the callback: its block stays leased
        if len(got) == count:
            done.set_result(None)

    await ctx.subscriber("/mp/cb", on_message=on_message)
    child = await Child.start(
        "publish", loop_kind(), address=list(ctx.address), topic="/mp/cb", count=count, size=size
    )
    try:
        await child.event("ready")
        await asyncio.wait_for(done, 60)
        assert got == list(range(count))
        assert bad == []
        assert [c.transport for c in ctx.channels] == ["shm"]
        for i, message in kept.items():
            assert np.array_equal(message, payload(i, size)), f"kept message {i} changed"
        assert await child.stop() == 0
    finally:
        await child.aclose()
