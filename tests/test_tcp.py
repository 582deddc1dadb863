"""The tcp transport against hostile or broken peers, on both of its ends.

Publisher side: garbage, oversized headers, bad handshakes and misbehaving channels on
the data port close only that connection; real subscribers keep receiving. Channel
side: a "publisher" that sends garbage, a 4 GB header or a truncated frame loses its
channel only; the subscriber keeps its other publishers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from _proc import Child
from _rawpeer import closed_by_peer
from _transport_of import tcp_of
from _waiting import wait_until
from conftest import loop_kind

import ezflow
from ezflow._core._channel import Channel
from ezflow._core._codec import Codec
from ezflow._core._framing import (
    ACK,
    ACK_BODY,
    DATA,
    DATA_PREFIX,
    END,
    HELLO,
    WELCOME,
    FramedProtocol,
)
from ezflow._core._inbox import Inbox
from ezflow._core._protocol import PROTOCOL, PublisherInfo
from ezflow._transports import _stream_publish
from ezflow._transports._tcp import TcpTransport, on_this_host


def control(kind: int, message: dict[str, Any]) -> bytes:
    body = bytes([kind]) + msgpack.packb(message)
    return struct.pack("<I", len(body)) + body


def data_port(ctx: ezflow.GraphContext) -> tuple[str, int]:
    address = tcp_of(ctx).address
    assert address is not None
    return address


def hello(publisher_id: str, **extra: Any) -> bytes:
    return control(
        HELLO,
        {
            "op": "hello",
            "protocol": PROTOCOL,
            "publisher_id": publisher_id,
            "lossless": False,
            "max_message_size": 1 << 20,
            **extra,
        },
    )


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"\x16\x03\x01\x02\x00" + b"\x00" * 200, id="tls-hello"),
        pytest.param(struct.pack("<I", 0xFFFFFFFF), id="4GB-header"),
        pytest.param(struct.pack("<I", 3) + b"\x09\x00\x00", id="unknown-kind"),
        pytest.param(control(HELLO, {"op": "hello", "protocol": "ezflow/0"}), id="old-protocol"),
        pytest.param(hello("p-nobody"), id="unknown-publisher"),
        pytest.param(control(HELLO, {"op": "hello", "protocol": PROTOCOL}), id="missing-fields"),
    ],
)
async def test_garbage_on_the_data_port_closes_only_that_connection(
    ctx: ezflow.GraphContext, payload: bytes
) -> None:
    pub = await ctx.publisher("/d")
    sub = await ctx.subscriber("/d", transport="tcp")
    reader, writer = await asyncio.open_connection(*data_port(ctx))
    writer.write(payload)
    await pub.publish(1)
    assert await closed_by_peer(reader)
    writer.close()
    await pub.publish(2)
    assert [await sub.recv(), await sub.recv()] == [1, 2]
    assert pub.channels == 1


@pytest.mark.parametrize(
    ("payload", "cause", "error"),
    [
        pytest.param(
            b"\x16\x03\x01\x02\x00" + b"\x00" * 200,
            "protocol",
            "look like a TLS handshake",
            id="tls-hello",
        ),
        pytest.param(
            struct.pack("<I", 0xFFFFFFFF), "protocol", "claims 4294967295 bytes", id="4GB-header"
        ),
        pytest.param(
            struct.pack("<I", 3) + b"\x09\x00\x00",
            "protocol",
            "expected HELLO, got frame kind 9",
            id="unknown-kind",
        ),
        pytest.param(
            control(HELLO, {"op": "hello", "protocol": PROTOCOL}),
            "protocol",
            "field 'publisher_id' must be str",
            id="missing-fields",
        ),
        pytest.param(
            hello("p-nobody"), "refused", "no publisher 'p-nobody' in this process", id="unknown"
        ),
        pytest.param(struct.pack("<I", 40) + b"\x03", "timeout", "handshake not done", id="late"),
    ],
)
async def test_a_channel_refused_in_its_handshake_is_told_why(
    ctx: ezflow.GraphContext,
    monkeypatch: pytest.MonkeyPatch,
    payload: bytes,
    cause: str,
    error: str,
) -> None:
    monkeypatch.setattr(_stream_publish, "HANDSHAKE_TIMEOUT", 0.3)
    await ctx.publisher("/told")
    reader, writer = await asyncio.open_connection(*data_port(ctx))
    writer.write(payload)
    (size,) = struct.unpack("<I", await asyncio.wait_for(reader.readexactly(4), 5))
    body = await reader.readexactly(size)
    assert body[0] == WELCOME
    refusal = msgpack.unpackb(body[1:])
    assert refusal["ok"] is False and refusal["cause"] == cause, refusal
    assert error in refusal["error"], refusal
    assert await closed_by_peer(reader)
    writer.close()
    assert tcp_of(ctx).bad_peers.counts == {cause: 1}


async def test_misbehaving_channel_after_handshake_is_dropped(
    ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    pub = await ctx.publisher("/m")
    sub = await ctx.subscriber("/m", transport="tcp")
    reader, writer = await asyncio.open_connection(*data_port(ctx))
    writer.write(hello(pub.id))
    await pub.wait_for_channels(2)
    writer.write(struct.pack("<I", 5) + bytes([ACK, 0, 0, 0, 0]))  # an ACK of 5 bytes
    assert await closed_by_peer(reader)
    writer.close()
    await pub.publish("still fine")
    assert await sub.recv() == "still fine"
    # Logged per cause (rate-limited), naming the publisher it was admitted to.
    assert tcp_of(ctx).bad_peers.counts == {"frame": 1}
    assert f"to publisher {pub.id} on topic '/m': ACK frame of 5 bytes" in caplog.text


async def test_leaky_channel_that_never_reads_does_not_hold_the_publisher(
    ctx: ezflow.GraphContext,
) -> None:
    pub = await ctx.publisher("/stall", max_in_flight=4)
    sub = await ctx.subscriber("/stall", transport="tcp")
    _, writer = await asyncio.open_connection(*data_port(ctx))
    writer.write(hello(pub.id, lossless=False))  # then never reads a byte
    await pub.wait_for_channels(2)
    big = np.zeros(64 * 1024, dtype=np.uint8)

    async def produce() -> None:
        for _ in range(200):
            await pub.publish(big)

    producer = asyncio.ensure_future(produce())
    for _ in range(200):
        await asyncio.wait_for(sub.recv(), 5)
    await asyncio.wait_for(producer, 5)
    assert pub.statistics().drops > 0  # the stalled leaky channel got only what fit its window
    writer.close()


class FakePublisher:
    """A raw TCP server that answers HELLO like a publisher, then sends *script*."""

    def __init__(self, script: bytes) -> None:
        self.script = script
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> PublisherInfo:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            (size,) = struct.unpack("<I", await reader.readexactly(4))
            await reader.readexactly(size)
            writer.write(control(WELCOME, {"op": "welcome", "ok": True, "max_in_flight": 8}))
            writer.write(self.script)
            writer.write_eof()
            await reader.read()  # until the channel closes
            writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return PublisherInfo("p-fake", "/fake", "c0", "h", 1, ("127.0.0.1", port))

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def channel_for_fake() -> tuple[TcpTransport, Channel, Inbox, asyncio.Event]:
    """A transport, and a channel with one lossless inbox, to connect to a FakePublisher;
    the event is set when the channel loses its publisher."""
    transport = TcpTransport(max_message_size=1 << 20)
    channel = Channel("p-fake", "/fake", Codec(max_message_size=1 << 20))
    inbox = Inbox()
    channel.attach(inbox)
    return transport, channel, inbox, asyncio.Event()


def data_frame(seq: int, body: bytes) -> bytes:
    return DATA_PREFIX.pack(32 + len(body), DATA, 0, seq, 0, 0) + body


@pytest.mark.parametrize(
    ("script", "log"),
    [
        pytest.param(struct.pack("<I", 0xFFFFFFF0), "4294967280 bytes", id="4GB-header"),
        pytest.param(struct.pack("<I", 2) + b"\x07\x00", "unexpected frame kind 7", id="kind"),
        pytest.param(struct.pack("<I", 4) + bytes([DATA, 0, 0, 0]), "DATA frame of 4", id="short"),
        pytest.param(data_frame(1, b"\x01\x02")[:20], "went away", id="truncated-then-eof"),
    ],
)
async def test_broken_publisher_loses_only_its_channel(
    script: bytes, log: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ezflow")
    transport, channel, inbox, lost = channel_for_fake()
    async with FakePublisher(script) as info:
        inbound = await transport.open_channel(channel, info, on_lost=lost.set)
        await asyncio.wait_for(lost.wait(), 5)
        inbound.close()
    assert log in caplog.text
    assert len(inbox) == 0
    await transport.aclose()


async def test_undecodable_message_raises_in_its_place_and_the_stream_goes_on() -> None:
    good = Codec().encode({"ok": True}).to_bytes()
    script = data_frame(1, b"\x01garbage") + data_frame(2, good) + struct.pack("<IB", 1, END)
    transport, channel, inbox, lost = channel_for_fake()
    async with FakePublisher(script) as info:
        inbound = await transport.open_channel(channel, info, on_lost=lost.set)
        with pytest.raises(ezflow.UndecodableMessageError):
            await asyncio.wait_for(inbox.get(), 5)
        assert await asyncio.wait_for(inbox.get(), 5) == {"ok": True}
        await asyncio.wait_for(lost.wait(), 5)  # END: a clean end
        inbound.close()
    assert channel.stats.decode_errors == 1
    await transport.aclose()


async def test_closing_after_the_subscriber_process_exited_unnoticed(
    ctx: ezflow.GraphContext,
) -> None:
    """The subscriber's process is gone (its socket closed cleanly) before this loop
    read the EOF: closing the publisher sends END into a dead connection and must not
    raise (the stock loop's ``write_eof`` raised ``ENOTCONN`` here)."""
    pub = await ctx.publisher("/gone", transport="tcp")
    child = await Child.start(
        "collect", loop_kind(), address=list(ctx.address), topic="/gone", count=1
    )
    try:
        await child.event("ready")
        await pub.wait_for_channels(1)
        await pub.publish(1)
        assert (await child.event("done"))["values"] == [1]
        os.kill(child.pid, signal.SIGKILL)
        # Block the loop until the process is gone, so that the publisher has not seen
        # its connection close (ChildProcessError: asyncio's watcher thread reaped it).
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # noqa: ASYNC222
        pub._outlet.close()  # END and half-close, at once, on the dead connection
        for _ in range(200):
            if not tcp_of(ctx).connections:
                break
            await asyncio.sleep(0.01)
        assert not tcp_of(ctx).connections
    finally:
        await child.aclose()


@pytest.mark.parametrize(
    ("local", "peer", "same"),
    [
        (("127.0.0.1", 5000), ("127.0.0.1", 6000), True),
        (("127.0.0.1", 5000), ("127.1.2.3", 6000), True),  # all of 127/8 is loopback
        (("::1", 5000, 0, 0), ("::1", 6000, 0, 0), True),
        (("10.0.0.5", 5000), ("10.0.0.5", 6000), True),  # this host's own address
        (("::ffff:10.0.0.5", 1, 0, 0), ("10.0.0.5", 2), True),  # (v4 mapped)
        (("10.0.0.5", 5000), ("10.0.0.6", 6000), False),
        (("fe80::1%eth0", 1, 0, 2), ("fe80::2%eth0", 2, 0, 2), False),
        (("10.0.0.5", 5000), None, False),  # (a transport that knows no peer)
        (("10.0.0.5", 5000), "/tmp/socket", False),
        (("10.0.0.5", 5000), ("not an address", 1), False),
        ((), ("127.0.0.1", 1), False),
    ],
)
def test_a_channel_is_on_this_host_from_loopback_or_its_own_address(
    local: object, peer: object, same: bool
) -> None:
    assert on_this_host(local, peer) is same


async def test_a_tcp_channel_on_this_host_gets_the_handoff_unless_the_publisher_declines(
    ctx: ezflow.GraphContext,
) -> None:
    # (test_outlet.py counts the yields; test_multihost.py has one from another host)
    handoffs = []
    for options in (None, ezflow.ShmOptions(handoff=False)):
        pub = await ctx.publisher(f"/tcp/handoff/{options is None}", shm=options)
        await ctx.subscriber(pub.topic, transport="tcp")
        await pub.wait_for_channels(1)
        handoffs.append([link.handoff for link in pub._outlet.links])
    assert handoffs == [[True], [False]]


async def test_a_flowing_stream_of_large_messages_is_acknowledged_every_quarter_window() -> None:
    """While large frames keep arriving, the channel acknowledges at each quarter of the
    window (16 of 64 messages here), not at the end of every loop iteration that took
    one; once the stream pauses, everything taken is acknowledged at once. (The
    publisher: a thread writing as fast as the socket takes it, as another process;
    the subscriber takes what is queued at once, as ``Subscriber.recv`` does: frames
    read a frame a read can be read ahead of the taking.)
    uvloop reads whatever the socket holds in one callback (libuv loops on ``read``),
    so the subscriber then takes the messages with no read in between: every take is
    acknowledged as before; there the test checks that all of them are.)"""
    count, window = 48, 64
    body = Codec().encode(np.arange(25_000, dtype=np.float32)).to_bytes()  # 100 KB
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    acks: list[int] = []

    def publish() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as incoming:
            conn.settimeout(10)
            (size,) = struct.unpack("<I", incoming.read(4))
            incoming.read(size)  # HELLO
            welcome = {"op": "welcome", "ok": True, "max_in_flight": window}
            conn.sendall(control(WELCOME, {**welcome, "max_in_flight_bytes": 1 << 30}))
            conn.sendall(b"".join(data_frame(seq, body) for seq in range(1, count + 1)))
            while not acks or acks[-1] < count:
                (size,) = struct.unpack("<I", incoming.read(4))
                frame_body = incoming.read(size)
                if frame_body[0] == ACK:
                    acks.append(ACK_BODY.unpack(frame_body)[1])

    port = listener.getsockname()[1]
    info = PublisherInfo("p-fake", "/fake", "c0", "h", 1, ("127.0.0.1", port))
    transport, channel, inbox, lost = channel_for_fake()
    publisher = asyncio.ensure_future(asyncio.to_thread(publish))
    try:
        inbound = await transport.open_channel(channel, info, on_lost=lost.set)
        for _ in range(count):
            # (as Subscriber.recv takes: what is queued at once, else a wait)
            if len(inbox):
                message = inbox.get_nowait()
            else:
                message = await asyncio.wait_for(inbox.get(), 10)
            assert message.nbytes == 100_000
        await asyncio.wait_for(publisher, 10)  # the stream paused: all of it acknowledged
        assert acks == sorted(acks) and acks[-1] == count
        if loop_kind() == "asyncio":
            assert len(acks) <= count // 2, acks
        inbound.close()
    finally:
        listener.close()
        await transport.aclose()


@pytest.mark.parametrize("unreleased", [0, 3])
async def test_a_channel_that_goes_away_is_dropped_with_one_log_line(
    ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture, unreleased: int
) -> None:
    """A subscriber that closes (or whose process dies: from the publisher's side the two
    look alike): the publisher drops its channel and logs it once, naming the publisher,
    the topic, the channel and what it left unreleased; INFO when that is something,
    DEBUG when it took everything."""
    caplog.set_level(logging.DEBUG, logger="ezflow.stream")
    pub = await ctx.publisher("/tcp/gone")
    sub = await ctx.subscriber("/tcp/gone", transport="tcp")
    await pub.wait_for_channels(1)
    for i in range(5):
        await pub.publish(i)
    for _ in range(5 - unreleased):
        await asyncio.wait_for(sub.recv(), 5)
    await asyncio.sleep(0.1)  # (its releases reach the publisher)
    await sub.aclose()

    await wait_until(lambda: not pub.channels, "the channel dropped", 5)
    (record,) = [r for r in caplog.records if "dropped the tcp channel" in r.getMessage()]
    assert record.levelno == (logging.INFO if unreleased else logging.DEBUG)
    assert record.getMessage().startswith(f"publisher {pub.id} on topic '/tcp/gone': ")
    assert f"with {unreleased} messages unreleased" in record.getMessage()


async def test_a_small_message_after_a_large_one_is_not_held_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over a real tcp edge, the kernel holds reads back while a large message's rest
    is on its way (SO_RCVLOWAT, ezflow/_core/_framing.py) and not a moment longer: 2 MiB
    messages arrive whole, and the small message each one is followed by arrives at
    once, not at the next heartbeat look (a mark left set would hold it for seconds)."""
    marks: list[int] = []
    hold_reads = FramedProtocol._hold_reads

    def recording(self: FramedProtocol, mark: int) -> None:
        marks.append(mark)
        hold_reads(self, mark)

    monkeypatch.setattr(FramedProtocol, "_hold_reads", recording)
    async with (
        ezflow.GraphServer(("127.0.0.1", 0)) as server,
        ezflow.GraphContext(server.address, auto_start=False) as ctx,
    ):
        pub = await ctx.publisher("/large-then-small")
        sub = await ctx.subscriber("/large-then-small", transport="tcp")
        await pub.wait_for_channels(1)
        rng = np.random.default_rng(5)
        slowest = 0.0
        for round_ in range(6):
            large = rng.random(1 << 19, dtype=np.float32)  # 2 MiB
            await pub.publish(("large", round_, large))
            got = await asyncio.wait_for(sub.recv(), 10)
            assert got[:2] == ("large", round_) and np.array_equal(got[2], large)
            sent = asyncio.get_running_loop().time()
            await pub.publish(("small", round_))
            assert await asyncio.wait_for(sub.recv(), 10) == ("small", round_)
            slowest = max(slowest, asyncio.get_running_loop().time() - sent)
            await asyncio.sleep(0.05)  # (each large one begins a read of its own)
        # (heartbeat looks come every 2 s by default: a held small message waits that long)
        assert slowest < 0.5, slowest
        # (the rest of each large message was held back, and let go after it)
        assert max(marks) > 1 << 16 and marks[-1] == 1, marks
