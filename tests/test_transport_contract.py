"""The transport contract (ezflow/_transports/_base.py), held by every registered
transport - ezring included - and by the example transport of docs/architecture.md
("Adding a transport"), which is registered here and carries a forced edge end to end.

Each transport is driven through its own publisher side (an outlet, or a ring's
writer) and the same channel side: ``open_channel``, messages in order, the clean end
(``channel.end()`` then ``on_lost``), an inbound closed first (nothing more, no
``on_lost``), a publisher that cannot be reached (refused at once)."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import socket
import types
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ezflow
from ezflow._core._auth import Credentials
from ezflow._core._channel import Channel, Inbox
from ezflow._core._codec import Codec
from ezflow._core._outlet import Outlet
from ezflow._core._protocol import PublisherInfo
from ezflow._graph._client import host_id
from ezflow._transports import (
    Transport,
    TransportSettings,
    register_transport,
    transport_names,
    unregister_transport,
)
from ezflow._transports._ezring import RingWriter
from ezflow._transports._ezring_files import ring_path
from ezflow._transports._registry import REGISTERED

DOCS = Path(__file__).parent.parent / "docs" / "architecture.md"
TOPIC = "/contract"
_names = itertools.count()


def example_transport() -> types.ModuleType:
    """The example transport of docs/architecture.md, run as a module."""
    page = DOCS.read_text()
    section = page[page.index("### Adding a transport") :]
    code = re.search(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    assert code is not None, "docs/architecture.md lost its example transport"
    module = types.ModuleType("memory_transport")
    exec(compile(code[1], f"{DOCS}:Adding a transport", "exec"), module.__dict__)
    return module


MEMORY = example_transport()
CONTRACT = ["ezring", "local", "shm", "tcp", "memory"]


@pytest.fixture
def memory_registered() -> Iterator[type[Transport]]:
    cls: type[Transport] = MEMORY.MemoryTransport
    register_transport(cls)
    try:
        yield cls
    finally:
        unregister_transport(cls.name)


def test_every_registered_transport_is_held_to_the_contract() -> None:
    assert {cls.name for cls in REGISTERED} <= set(CONTRACT)


@dataclass
class Feed:
    """One transport with a publisher that it reaches, and how to drive that publisher."""

    transport: Transport
    info: PublisherInfo
    publish: Callable[[int], Any]  # message i: np.full(4, i)
    end: Callable[[], None]  # the publisher's clean end
    codec: Codec


def settings(codec: Codec) -> TransportSettings:
    return TransportSettings("127.0.0.1", host_id(), 1 << 20, codec, Credentials())


@asynccontextmanager
async def feed(name: str) -> AsyncIterator[Feed]:
    codec = Codec(max_message_size=1 << 20)
    classes = {cls.name: cls for cls in [*REGISTERED, MEMORY.MemoryTransport]}
    cls = classes[name]
    if not await asyncio.to_thread(cls.available):
        pytest.skip(f"{name} cannot work here")
    transport = cls.from_settings(settings(codec))
    pub_id = f"p-contract-{os.getpid()}-{next(_names)}"
    writer: RingWriter | None = None
    outlet: Outlet | None = None
    try:
        if name == "ezring":
            ring = f"contract-{os.getpid()}-{next(_names)}"
            writer = RingWriter.create(ring, slot_size=64, slot_count=32, topic=TOPIC)
            info = PublisherInfo(
                pub_id,
                TOPIC,
                "c0",
                host_id(),
                os.getpid(),
                ("127.0.0.1", 0),
                transport="ezring",
                ring=ring,
                ring_created_ns=writer.header.created_ns,
            )

            async def publish(i: int) -> None:
                assert writer is not None and writer.publish(np.full(4, i))

            end = writer.close
        else:
            outlet = Outlet(pub_id, TOPIC, codec, max_in_flight=64, max_in_flight_bytes=1 << 20)
            fields = await transport.advertise()
            transport.add_outlet(outlet)
            address = fields.get("address", ["127.0.0.1", 0])
            info = PublisherInfo(
                pub_id,
                TOPIC,
                "c0",
                host_id(),
                os.getpid(),
                (address[0], address[1]),
                shm_address=fields.get("shm"),
            )

            async def publish(i: int) -> None:
                assert outlet is not None
                await outlet.publish(np.full(4, i))

            end = outlet.close
        assert transport.reaches(info, host_id())
        yield Feed(transport, info, publish, end, codec)
    finally:
        if writer is not None:
            writer.close()
        if outlet is not None:
            outlet.close()
            transport.remove_outlet(outlet)
        await transport.aclose()
        await transport.aclose()  # idempotent


@dataclass
class Opened:
    channel: Channel
    got: list[list[int]]
    lost: list[bool]  # channel.ended when on_lost was called


async def open_channel(feed: Feed) -> tuple[Opened, Any]:
    got: list[list[int]] = []
    channel = Channel(feed.info.publisher_id, TOPIC, feed.codec, transport=feed.transport.name)
    channel.attach(Inbox(callback=lambda message: got.append(message.tolist())))
    opened = Opened(channel, got, [])
    inbound = await asyncio.wait_for(
        feed.transport.open_channel(
            channel, feed.info, on_lost=lambda: opened.lost.append(channel.ended)
        ),
        10,
    )
    return opened, inbound


async def until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("name", CONTRACT)
async def test_a_channel_gets_every_message_in_order_then_the_end(name: str) -> None:
    async with feed(name) as f:
        opened, inbound = await open_channel(f)
        for i in range(20):
            await f.publish(i)
        f.end()
        await until(lambda: bool(opened.lost), "on_lost after the publisher's end")
        assert opened.got == [[i] * 4 for i in range(20)]
        assert opened.lost == [True]  # called once, after channel.end()
        inbound.close()
        inbound.close()  # idempotent
        assert opened.lost == [True]


@pytest.mark.parametrize("name", CONTRACT)
async def test_a_closed_inbound_gets_nothing_more_and_is_not_lost(name: str) -> None:
    async with feed(name) as f:
        closed, inbound = await open_channel(f)
        witness, witness_inbound = await open_channel(f)
        await f.publish(0)
        await until(lambda: closed.got == [[0] * 4], "the first message")
        inbound.close()
        for i in range(1, 5):
            await f.publish(i)
        f.end()
        # The witness, open all along, got everything and the end: the closed one
        # would have had its messages by then.
        await until(lambda: bool(witness.lost), "the witness's end")
        assert witness.got == [[i] * 4 for i in range(5)]
        assert closed.got == [[0] * 4] and closed.lost == []
        witness_inbound.close()


@pytest.mark.parametrize("name", CONTRACT)
async def test_a_publisher_that_cannot_be_reached_is_refused_at_once(
    name: str, tmp_path: Path
) -> None:
    codec = Codec(max_message_size=1 << 20)
    cls = {cls.name: cls for cls in [*REGISTERED, MEMORY.MemoryTransport]}[name]
    if not await asyncio.to_thread(cls.available):
        pytest.skip(f"{name} cannot work here")
    transport = cls.from_settings(settings(codec))
    with socket.socket() as closed_port:
        closed_port.bind(("127.0.0.1", 0))
        address = closed_port.getsockname()
    ring = f"contract-gone-{os.getpid()}-{next(_names)}"
    info = PublisherInfo(
        "p-nobody",
        TOPIC,
        "c0",
        host_id(),
        os.getpid(),
        address,
        shm_address=f"ezflow-1-{'0' * 16}",
        ring=ring if name == "ezring" else None,
    )
    os.mkdir(ring_path(ring))  # not a ring file: refused at once, not waited for
    try:
        channel = Channel(info.publisher_id, TOPIC, codec, transport=name)
        started = asyncio.get_running_loop().time()
        with pytest.raises((ezflow.BrokenResourceError, ezflow.EzflowTimeoutError)):
            await transport.open_channel(channel, info, on_lost=lambda: None)
        assert asyncio.get_running_loop().time() - started < 5
    finally:
        os.rmdir(ring_path(ring))
        await transport.aclose()


# -- the example transport, registered, end to end -------------------------------------------


async def test_the_example_transport_carries_a_forced_edge_end_to_end(
    memory_registered: type[Transport],
) -> None:
    assert "memory" in transport_names()
    async with ezflow.GraphContext() as ctx:
        pub = await ctx.publisher("/memory", max_in_flight=2)
        sub = await ctx.subscriber("/memory", transport="memory")
        assert [c.transport for c in ctx.channels] == ["memory"]
        sent = np.arange(6.0)
        await pub.publish(("frame", 1, sent))
        kind, seq, got = await asyncio.wait_for(sub.recv(), 10)
        # Through bytes: a new, read-only array with the same values.
        assert (kind, seq) == ("frame", 1) and got.tolist() == sent.tolist()
        assert got is not sent and not got.flags.writeable
        # Flow control is the outlet's: two messages not taken fill the window.
        await pub.publish(2)
        await pub.publish(3)
        assert pub.in_flight == 2 and not pub._outlet.publish_nowait(4)
        assert await asyncio.wait_for(sub.recv(), 10) == 2
        await asyncio.wait_for(pub.publish(4), 10)
        assert [await asyncio.wait_for(sub.recv(), 10) for _ in range(2)] == [3, 4]
        # The publisher's clean end reaches the subscriber as for any transport.
        await pub.aclose()
        with pytest.raises(ezflow.EndOfStream):
            await asyncio.wait_for(sub.recv(), 10)
    # Without it registered, the name is refused with the ones that exist.
    unregister_transport("memory")
    with pytest.raises(ezflow.ConfigurationError, match="local, shm, tcp"):
        await _forced_memory()


async def _forced_memory() -> None:
    async with ezflow.GraphContext() as ctx:
        await ctx.subscriber("/memory", transport="memory")
