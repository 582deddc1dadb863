"""GraphContext, Publisher and Subscriber in one process (local and tcp transports)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest
from _waiting import wait_until

import ezflow
from ezflow._transports._tcp import TcpTransport


async def test_local_roundtrip_gives_read_only_view(ctx: ezflow.GraphContext) -> None:
    sub = await ctx.subscriber("/a")
    pub = await ctx.publisher("/a")
    data = np.arange(8.0)
    await pub.publish(data)
    got = await sub.recv()
    assert np.array_equal(got, data)
    assert not got.flags.writeable
    assert np.shares_memory(got, data)  # local: no copy, no encoding
    assert data.flags.writeable  # the publisher's own array is untouched
    [channel] = ctx.channels
    assert channel.transport == "local"
    assert pub.statistics().encodes == 0


@pytest.mark.parametrize("transport", ["local", "tcp"])
async def test_order_and_content(ctx: ezflow.GraphContext, transport: str) -> None:
    pub = await ctx.publisher("/seq")
    sub = await ctx.subscriber("/seq", transport=transport)
    count = 2000

    async def produce() -> None:
        for i in range(count):
            await pub.publish({"i": i, "data": np.full(3, i, dtype=np.int32)})

    producer = asyncio.ensure_future(produce())
    for i in range(count):
        message = await sub.recv()
        assert message["i"] == i
        assert message["data"].tolist() == [i, i, i]
    await producer
    assert [c.transport for c in ctx.channels] == [transport]


@pytest.mark.parametrize("transport", ["local", "tcp"])
async def test_one_channel_one_decode_for_four_subscribers(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    subs = [await ctx.subscriber("/fan", transport=transport) for _ in range(4)]
    pub = await ctx.publisher("/fan")
    for i in range(50):
        await pub.publish(np.arange(i, i + 4))
        got = [await s.recv() for s in subs]
        assert all(g is got[0] for g in got), "every subscriber gets the same object"
        assert got[0].tolist() == list(range(i, i + 4))
    [channel] = ctx.channels
    assert channel.subscribers == 4
    assert channel.statistics.messages == 50
    assert channel.statistics.decoded == (50 if transport == "tcp" else 0)
    assert pub.statistics().encodes == (50 if transport == "tcp" else 0)


@pytest.mark.parametrize("transport", ["local", "tcp"])
async def test_lossless_backpressure_bounds_in_flight(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    pub = await ctx.publisher("/bp", max_in_flight=8)
    sub = await ctx.subscriber("/bp", transport=transport)
    published = 0

    async def produce() -> None:
        nonlocal published
        for i in range(100):
            await pub.publish(i)
            published += 1

    producer = asyncio.ensure_future(produce())
    await asyncio.sleep(0.2)
    # nobody received: the publisher is stuck at the window, not buffering without bound
    assert published == 8
    assert sub.queued <= 8
    assert [await sub.recv() for _ in range(100)] == list(range(100))
    await asyncio.wait_for(producer, 5)
    assert pub.statistics().waits >= 1


@pytest.mark.parametrize("transport", ["local", "tcp"])
async def test_leaky_subscriber_keeps_newest_and_counts_drops(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    pub = await ctx.publisher("/leaky", max_in_flight=16)
    slow = await ctx.subscriber("/leaky", leaky=True, queue=5, transport=transport)
    for i in range(100):  # never waits: the only subscriber is leaky
        await asyncio.wait_for(pub.publish(i), 1)
    # the newest message always reaches the subscriber, nothing arrives out of order
    got = []
    async with asyncio.timeout(5):
        while not got or got[-1] != 99:
            got.append(await slow.recv())
    assert got == sorted(set(got))
    assert slow.statistics().taken + slow.statistics().dropped == 100
    assert slow.statistics().dropped >= 50
    # every message was either handed to the link or dropped on the publisher's side
    assert pub.statistics().sends + pub.statistics().drops == 100


async def test_leaky_does_not_hold_back_lossless(ctx: ezflow.GraphContext) -> None:
    pub = await ctx.publisher("/mix", max_in_flight=4)
    fast = await ctx.subscriber("/mix", transport="tcp")
    slow = await ctx.subscriber("/mix", leaky=True, queue=2, transport="tcp")

    async def produce() -> None:
        for i in range(500):
            await pub.publish(i)

    producer = asyncio.ensure_future(produce())
    assert [await fast.recv() for _ in range(500)] == list(range(500))
    await asyncio.wait_for(producer, 5)
    assert slow.queued <= 2
    assert slow.statistics().dropped >= 400


async def test_fan_in_three_publishers(ctx: ezflow.GraphContext) -> None:
    sub = await ctx.subscriber("/in")
    pubs = [await ctx.publisher("/in", transport=t) for t in ("local", "tcp", "tcp")]

    async def produce(k: int, pub: ezflow.Publisher) -> None:
        for i in range(100):
            await pub.publish((k, i))

    producers = asyncio.gather(*(produce(k, p) for k, p in enumerate(pubs)))
    got = [await sub.recv() for _ in range(300)]
    await producers
    assert sorted(c.transport for c in ctx.channels) == ["local", "tcp", "tcp"]
    for k in range(3):
        assert [i for kk, i in got if kk == k] == list(range(100))


async def test_topic_edge_routes_and_unroutes(ctx: ezflow.GraphContext) -> None:
    pub = await ctx.publisher("/src")
    sub = await ctx.subscriber("/dst")
    await pub.publish("before")
    await ctx.connect("/src", "/dst")
    await pub.publish("during")
    assert await asyncio.wait_for(sub.recv(), 2) == "during"
    await ctx.disconnect("/src", "/dst")
    await pub.publish("after")
    await asyncio.sleep(0.1)  # a window: nothing may arrive in it
    assert sub.queued == 0
    with pytest.raises(ezflow.GraphError, match="no edge"):
        await ctx.disconnect("/src", "/dst")


async def test_chained_edges(ctx: ezflow.GraphContext) -> None:
    pub = await ctx.publisher("/a")
    sub = await ctx.subscriber("/c")
    await ctx.connect("/a", "/b")
    await ctx.connect("/b", "/c")
    await pub.publish(1)
    assert await asyncio.wait_for(sub.recv(), 2) == 1
    snapshot = await ctx.graph()
    assert ["/a", "/b"] in snapshot["edges"] and ["/b", "/c"] in snapshot["edges"]


async def test_late_subscriber_gets_messages_from_when_it_joined(
    ctx: ezflow.GraphContext,
) -> None:
    pub = await ctx.publisher("/late", transport="tcp")
    await pub.publish(0)
    sub = await ctx.subscriber("/late")
    await pub.publish(1)
    assert await sub.recv() == 1


async def test_closed_subscriber_and_publisher(ctx: ezflow.GraphContext) -> None:
    pub = await ctx.publisher("/x")
    sub = await ctx.subscriber("/x", transport="tcp")
    await pub.publish(1)
    await pub.publish(2)
    await pub.aclose()
    # what was published before close is still delivered
    assert [await sub.recv(), await sub.recv()] == [1, 2]
    with pytest.raises(ezflow.ClosedResourceError):
        await pub.publish(3)
    await sub.aclose()
    with pytest.raises(ezflow.ClosedResourceError):
        await sub.recv()
    snapshot = await ctx.graph()
    assert snapshot["publishers"] == [] and snapshot["subscribers"] == []


async def test_async_iteration_ends_when_context_closes(server: ezflow.GraphServer) -> None:
    async with ezflow.GraphContext(server.address) as ctx:
        pub = await ctx.publisher("/it")
        sub = await ctx.subscriber("/it")
        for i in range(3):
            await pub.publish(i)
        received = []

        async def consume() -> None:
            async for message in sub:
                received.append(message)

        consumer = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
    await asyncio.wait_for(consumer, 2)
    assert received == [0, 1, 2]


async def test_unregistered_type_raises_before_sending(ctx: ezflow.GraphContext) -> None:
    pub = await ctx.publisher("/t")
    sub = await ctx.subscriber("/t")

    class Thing:
        pass

    with pytest.raises(TypeError, match="Thing"):
        await pub.publish(Thing())
    with pytest.raises(ezflow.UnregisteredTypeError):
        await pub.publish({1, 2})
    await pub.publish("ok")
    assert await sub.recv() == "ok"
    assert pub.statistics().messages == 1


async def test_a_local_edge_refuses_a_bad_message_amid_a_stream_of_good_ones(
    ctx: ezflow.GraphContext,
) -> None:
    # A local edge encodes nothing: it validates each message, the shape it validated
    # last in one compiled pass. A message of that shape that tcp would refuse (an int
    # out of msgpack's range, an object array) is refused here too, before it is sent,
    # and the stream goes on.
    pub = await ctx.publisher("/t")
    sub = await ctx.subscriber("/t")
    arr = np.zeros(4, np.float32)
    for seq in range(50):
        await pub.publish((0, seq, arr))
    with pytest.raises(ezflow.UnregisteredTypeError, match="64-bit range"):
        await pub.publish((0, 2**64, arr))
    with pytest.raises(ezflow.UnregisteredTypeError, match="object"):
        await pub.publish((0, 1, np.array([None], dtype=object)))
    await pub.publish((0, 50, arr))
    got = [await sub.recv() for _ in range(51)]
    assert [seq for _, seq, _ in got] == list(range(51))
    assert pub.statistics().messages == 51
    assert sub.queued == 0


async def test_message_too_large_for_receiver(server: ezflow.GraphServer) -> None:
    async with (
        ezflow.GraphContext(server.address) as sender,
        ezflow.GraphContext(server.address, max_message_size=4096) as receiver,
    ):
        pub = await sender.publisher("/big")
        sub = await receiver.subscriber("/big", transport="tcp")
        with pytest.raises(ezflow.MessageTooLargeError, match="4096"):
            await pub.publish(np.zeros(1024, dtype=np.float64))
        await pub.publish(np.zeros(16))
        assert (await sub.recv()).shape == (16,)


async def test_bad_options_are_clear_errors(ctx: ezflow.GraphContext) -> None:
    with pytest.raises(ezflow.ConfigurationError, match=r"queue= only applies"):
        await ctx.subscriber("/o", queue=3)
    with pytest.raises(ezflow.ConfigurationError, match=r"carrier-pigeon.*is not a transport"):
        await ctx.subscriber("/o", transport="carrier-pigeon")
    with pytest.raises(ezflow.ConfigurationError, match="max_in_flight"):
        await ctx.publisher("/o", max_in_flight=0)
    with pytest.raises(ValueError, match="whitespace"):
        await ctx.publisher("bad topic")
    with pytest.raises(ezflow.ConfigurationError, match=r"must be an ezflow\.ShmOptions"):
        await ctx.publisher("/o", shm={"slot_count": 4})  # type: ignore[arg-type]
    with pytest.raises(ezflow.ConfigurationError, match="slot_count=0 must be a positive"):
        ezflow.ShmOptions(slot_count=0)
    with pytest.raises(ezflow.ConfigurationError, match="does not fit in max_bytes"):
        ezflow.ShmOptions(slot_count=4, slot_size=1 << 20, max_bytes=1 << 20)
    with pytest.raises(ezflow.ConfigurationError, match="inline_limit=-1"):
        ezflow.ShmOptions(inline_limit=-1)


async def test_embedded_server_when_none_answers(unused_tcp_port: int) -> None:
    address = ("127.0.0.1", unused_tcp_port)
    async with ezflow.GraphContext(address) as first:
        assert first.server is not None
        async with ezflow.GraphContext(address, auto_start=False) as second:
            assert second.server is None
            sub = await second.subscriber("/e")
            pub = await first.publisher("/e")
            await pub.publish("hi")
            assert await sub.recv() == "hi"


async def test_no_server_and_no_auto_start(unused_tcp_port: int) -> None:
    with pytest.raises(ezflow.BrokenResourceError, match="no graph server"):
        async with ezflow.GraphContext(("127.0.0.1", unused_tcp_port), auto_start=False):
            pass


async def test_port_0_without_auto_start_is_refused_naming_why() -> None:
    # Port 0 means "start one on a free port": without auto_start nothing could serve.
    with pytest.raises(ezflow.BrokenResourceError, match="port 0 means") as raised:
        async with ezflow.GraphContext("127.0.0.1:0", auto_start=False):
            pass
    assert "auto_start=False" in str(raised.value)


async def test_environment_address_and_transport(
    server: ezflow.GraphServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, port = server.address
    monkeypatch.setenv("EZFLOW_GRAPH_ADDRESS", f"{host}:{port}")
    monkeypatch.setenv("EZFLOW_TRANSPORT", "tcp")
    async with ezflow.GraphContext(auto_start=False) as ctx:
        assert ctx.server is None
        sub = await ctx.subscriber("/env")
        pub = await ctx.publisher("/env")
        await pub.publish(1)
        assert await sub.recv() == 1
        assert [c.transport for c in ctx.channels] == ["tcp"]
    monkeypatch.setenv("EZFLOW_TRANSPORT", "pigeon")
    with pytest.raises(ezflow.ConfigurationError, match="EZFLOW_TRANSPORT"):
        ezflow.GraphContext()


async def test_cancelled_publish_sends_nothing(ctx: ezflow.GraphContext) -> None:
    pub = await ctx.publisher("/c", max_in_flight=1)
    sub = await ctx.subscriber("/c")
    await pub.publish(0)
    blocked = asyncio.ensure_future(pub.publish(1))
    await asyncio.sleep(0.05)
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert await sub.recv() == 0
    await pub.publish(2)
    assert await sub.recv() == 2


async def test_kept_message_never_changes_under_the_subscriber(ctx: ezflow.GraphContext) -> None:
    pub = await ctx.publisher("/keep")
    sub = await ctx.subscriber("/keep", transport="tcp")
    size = 1 << 17  # 1 MiB of float64: large frames, recycled receive buffers
    await pub.publish(np.full(size, 1.0))
    kept = await sub.recv()
    for value in range(2, 40):
        await pub.publish(np.full(size, float(value)))
        assert (await sub.recv())[0] == value
    assert np.all(kept == 1.0)


async def test_cancelled_close_leaves_nothing_open(server: ezflow.GraphServer) -> None:
    """A subscriber that stops reading makes close wait (to deliver what was published);
    cancelling that wait aborts the connections instead of leaking them."""
    async with ezflow.GraphContext(server.address) as receiver:
        sub = await receiver.subscriber("/stuck", transport="tcp")
        sender = ezflow.GraphContext(server.address)
        await sender.start()
        pub = await sender.publisher("/stuck", max_in_flight=1000)
        for _ in range(200):  # far more than the socket buffers hold: the peer never reads
            await pub.publish(np.zeros(64 * 1024, dtype=np.uint8))
        assert receiver._router is not None
        (receiver_channel,) = receiver._router.channels.values()
        assert receiver_channel.inbound is not None
        receiver_channel.inbound._connection.transport.pause_reading()  # type: ignore[attr-defined]
        closing = asyncio.ensure_future(sender.aclose())
        await asyncio.sleep(0.2)  # a window: closing may not end in it
        assert not closing.done()  # waiting for the stuck channel to read up to END
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert sender._transports is not None
        assert not sender._transports.get("tcp", TcpTransport).connections
        assert sub.statistics().received < 200  # it really was stuck


async def test_a_tight_publishing_loop_does_not_starve_a_leaky_subscriber(
    ctx: ezflow.GraphContext,
) -> None:
    """publish never waits for a leaky subscriber, yet the subscriber's task gets to run
    while a loop publishes without pause."""
    pub = await ctx.publisher("/starve")
    sub = await ctx.subscriber("/starve", leaky=True, queue=1)
    seen: list[int] = []

    async def watch() -> None:
        async for message in sub:
            seen.append(message)

    watcher = asyncio.ensure_future(watch())
    await asyncio.sleep(0)
    for i in range(1000):
        await pub.publish(i)
    assert seen, "the subscriber's task never ran during 1000 publishes"
    assert seen == sorted(seen) and len(seen) < 1000
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher


@pytest.mark.parametrize("transport", ["local", "tcp", "shm"])
async def test_on_message_gets_every_message_in_order(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    got: list[int] = []
    done = asyncio.get_running_loop().create_future()
    count = 3000

    def on_message(message: np.ndarray) -> None:
        got.append(int(message[0]))
        assert not message.flags.writeable
        if len(got) == count:
            done.set_result(None)

    sub = await ctx.subscriber("/cb", transport=transport, on_message=on_message)
    queued = await ctx.subscriber("/cb", transport=transport)  # shares the channel
    pub = await ctx.publisher("/cb", max_in_flight=8)

    async def produce() -> None:
        for i in range(count):
            await pub.publish(np.full(4, i, dtype=np.int64))

    producer = asyncio.ensure_future(produce())
    async with asyncio.timeout(20):
        assert [int((await queued.recv())[0]) for _ in range(count)] == list(range(count))
        await done
        await producer
    assert got == list(range(count))
    assert sub.statistics().received == sub.statistics().taken == count
    assert sub.queued == 0
    assert [c.transport for c in ctx.channels] == [transport]
    [channel] = ctx.channels
    assert channel.subscribers == 2
    # Lossless: the callback returning released each message; nothing is pending.
    await wait_until(lambda: [c.pending for c in ctx.channels] == [0], "no message pending")


async def test_on_message_errors_are_logged_counted_and_delivery_goes_on(
    ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[int] = []
    all_in = asyncio.Event()

    def on_message(message: int) -> None:
        got.append(message)
        if len(got) == 30:
            all_in.set()
        if message % 3 == 0:
            raise KeyError(f"bad {message}")

    sub = await ctx.subscriber("/cberr", on_message=on_message, transport="tcp")
    other = await ctx.subscriber("/cberr", transport="tcp")
    pub = await ctx.publisher("/cberr")
    for i in range(30):
        await pub.publish(i)
    assert [await other.recv() for _ in range(30)] == list(range(30))
    await asyncio.wait_for(all_in.wait(), 5)
    assert got == list(range(30))
    assert sub.statistics().callback_errors == 10
    logged = [r for r in caplog.records if "on_message of subscriber" in r.getMessage()]
    assert len(logged) == 5  # the first five, then one in a thousand
    assert "KeyError: 'bad 0'" in caplog.text  # with the traceback
    assert sub.id in logged[0].getMessage() and "/cberr" in logged[0].getMessage()


async def test_on_message_subscriber_refuses_recv_and_bad_options(
    ctx: ezflow.GraphContext,
) -> None:
    sub = await ctx.subscriber("/cbr", on_message=lambda message: None)
    with pytest.raises(ezflow.ConfigurationError, match="on_message callback"):
        await sub.recv()
    with pytest.raises(ezflow.ConfigurationError, match="on_message callback"):
        sub.recv_nowait()

    async def handler(message: object) -> None:
        pass

    with pytest.raises(ezflow.ConfigurationError, match="plain"):
        await ctx.subscriber("/cbr", on_message=handler)
    with pytest.raises(ezflow.ConfigurationError, match="plain"):
        await ctx.subscriber("/cbr", on_message=42)  # type: ignore[arg-type]
    with pytest.raises(ezflow.ConfigurationError, match="queue= does not apply"):
        await ctx.subscriber("/cbr", on_message=print, leaky=True, queue=3)


async def test_leaky_on_message_never_holds_the_publisher(ctx: ezflow.GraphContext) -> None:
    """A leaky callback subscriber slower than its publisher: the publisher drops for it
    instead of waiting, counts every drop, and the newest message still arrives."""
    got: list[int] = []
    newest = asyncio.Event()

    def slow(message: int) -> None:
        time.sleep(0.002)  # blocks the loop (a callback must not; this one is slow)
        got.append(message)
        if message == 299:
            newest.set()

    sub = await ctx.subscriber("/cbleaky", on_message=slow, leaky=True, transport="tcp")
    pub = await ctx.publisher("/cbleaky", max_in_flight=4)
    async with asyncio.timeout(5):
        for i in range(300):
            await pub.publish(i)
    await asyncio.wait_for(newest.wait(), 5)
    assert got == sorted(got)
    assert pub.statistics().drops > 0
    assert len(got) + sub.statistics().dropped == 300


@pytest.mark.parametrize("transport", ["local", "tcp"])
async def test_statistics_are_snapshots_named_alike(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    # One meaning of "stats": a method (or a snapshot's field) giving a copy.
    pub = await ctx.publisher("/stats")
    sub = await ctx.subscriber("/stats", transport=transport)
    await pub.publish(1)
    assert await asyncio.wait_for(sub.recv(), 5) == 1
    published, received = pub.statistics(), sub.statistics()
    (info,) = ctx.channels
    channel = info.statistics
    assert (published.messages, received.taken, channel.messages) == (1, 1, 1)
    await pub.publish(2)
    assert await asyncio.wait_for(sub.recv(), 5) == 2
    # the snapshots did not move; new ones did
    assert (published.messages, received.taken, channel.messages) == (1, 1, 1)
    assert (pub.statistics().messages, sub.statistics().taken) == (2, 2)
    assert ctx.channels[0].statistics.messages == 2
    assert pub.statistics() is not pub.statistics()
    shm = pub.shm_statistics()
    assert shm is None or shm.zero_copy == 0  # (no shm channel here)


async def test_the_old_stats_names_warn_and_still_answer(ctx: ezflow.GraphContext) -> None:
    pub = await ctx.publisher("/stats/old")
    sub = await ctx.subscriber("/stats/old", transport="tcp")
    await pub.publish(1)
    assert await asyncio.wait_for(sub.recv(), 5) == 1
    with pytest.warns(DeprecationWarning, match=r"Publisher\.stats .*Publisher\.statistics\(\)"):
        assert pub.stats.messages == 1
    with pytest.warns(DeprecationWarning, match=r"Subscriber\.stats .*statistics\(\)"):
        assert sub.stats.taken == 1
    with pytest.warns(DeprecationWarning, match=r"Publisher\.shm_stats .*shm_statistics\(\)"):
        assert pub.shm_stats == pub.shm_statistics()
    with pytest.warns(DeprecationWarning, match=r"ChannelInfo\.stats .*ChannelInfo\.statistics"):
        assert ctx.channels[0].stats.messages == 1


async def test_recv_nowait_on_an_empty_subscriber_raises_would_block(
    ctx: ezflow.GraphContext,
) -> None:
    sub = await ctx.subscriber("/empty")
    with pytest.raises(ezflow.WouldBlock, match=r"topic '/empty' has no message queued") as err:
        sub.recv_nowait()
    # what it raised before, for code that catches that
    assert isinstance(err.value, asyncio.QueueEmpty)
    assert isinstance(err.value, ezflow.EzflowError)
    pub = await ctx.publisher("/empty")
    await pub.publish("x")
    assert sub.recv_nowait() == "x"
    with pytest.raises(asyncio.QueueEmpty):
        sub.recv_nowait()


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure"])
@pytest.mark.parametrize("transport", ["local", "tcp"])
async def test_recv_nowait_drains_a_lossless_window_as_recv_does(
    ctx: ezflow.GraphContext, transport: str, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer that drains what is queued with recv_nowait (as the Zenoh export does)
    takes through the compiled take that recv starts with, where it is built, and
    leaves what recv leaves: every message in order, each taken and released once, the
    publisher's window opened again (it waits on it: a window of 8 for 600 messages)."""
    from ezflow._core import _inbox  # noqa: PLC0415

    compiled_take = _inbox.take_queued
    if compiled and compiled_take is None:
        pytest.skip("the compiled extension is not built")
    takes = 0

    def counting_take(inbox: object) -> object:
        nonlocal takes
        assert compiled_take is not None
        message = compiled_take(inbox)  # type: ignore[arg-type]
        # (recv takes through it too: count the draining subscriber's takes alone, which
        # recv makes only when nothing is queued, and so takes nothing)
        takes += inbox is subs[0]._inbox and message is not _inbox.NOTHING
        return message

    count = 600
    pub = await ctx.publisher("/drain", transport=transport, max_in_flight=8)
    subs = [await ctx.subscriber("/drain", transport=transport) for _ in range(2)]
    monkeypatch.setattr(_inbox, "take_queued", counting_take if compiled else None)
    await pub.wait_for_channels(1)

    async def produce() -> None:
        for i in range(count):
            await pub.publish((i, np.full(4, i, np.float32)))

    async def drain(sub: ezflow.Subscriber, nowait: bool) -> list[int]:
        got: list[int] = []
        while len(got) < count:
            if nowait:
                try:
                    got.append(sub.recv_nowait()[0])
                    continue
                except ezflow.WouldBlock:
                    pass
            got.append((await sub.recv())[0])
        return got

    producer = asyncio.create_task(produce())
    by_nowait, by_recv = await asyncio.wait_for(
        asyncio.gather(drain(subs[0], True), drain(subs[1], False)), 20
    )
    await asyncio.wait_for(producer, 5)
    assert by_nowait == by_recv == list(range(count))
    assert subs[0].statistics() == subs[1].statistics()
    assert subs[0].statistics().taken == count
    if compiled:
        assert takes > count // 2  # (most of them queued when asked for)
    else:
        assert takes == 0
    assert pub.statistics().waits > 0  # (the window was full, and opened again)
    await wait_until(lambda: all(c.pending == 0 for c in ctx.channels), "every message released")
