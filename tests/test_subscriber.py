"""Subscriber options through real edges: ``encoded=True`` (a relay's subscriber, handed
each message's encoded body) on local, shm and tcp edges, beside subscribers of
messages, with the flow control, release and errors of any subscriber."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
from _messages import assert_same_decoded, messages
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ezflow
from ezflow._core._codec import Codec, EncodedMessage, _decode_general
from ezflow._transports._shm import ShmTransport

needs_shm = pytest.mark.skipif(not ShmTransport.available(), reason="needs Linux shared memory")
TRANSPORTS = ["local", "tcp"] + (["shm"] if ShmTransport.available() else [])


def _body(obj: object) -> bytes | None:
    try:
        return Codec().encode(obj).to_bytes()
    except (TypeError, ValueError):  # (what publish refuses too)
        return None


async def _through_every_edge(objs: list[object], with_plain: list[bool]) -> None:
    async with ezflow.GraphContext("127.0.0.1:0") as ctx:
        pub = await ctx.publisher("/sub/encoded")
        # Per transport, an encoded subscriber, alone on its channel or beside one of
        # messages (one channel per transport and process: decoded once for that one).
        subs: list[tuple[str, ezflow.Subscriber, ezflow.Subscriber | None]] = []
        for transport, plain in zip(TRANSPORTS, with_plain, strict=False):
            subs.append(
                (
                    transport,
                    await ctx.subscriber("/sub/encoded", transport=transport, encoded=True),
                    await ctx.subscriber("/sub/encoded", transport=transport) if plain else None,
                )
            )
        reference = Codec()
        for obj in objs:
            body = _body(obj)
            if body is None:
                continue
            await pub.publish(obj)
            for transport, encoded, plain in subs:
                got = await encoded.recv()
                assert isinstance(got, bytes | memoryview), transport
                assert bytes(got) == body, transport  # the codec's body, byte for byte
                if isinstance(got, memoryview):
                    assert got.readonly
                decoded = reference.decode(got)
                assert_same_decoded(_decode_general(reference, body), decoded)
                if plain is not None:
                    message = await plain.recv()
                    if transport != "local":  # (local: the object itself)
                        assert_same_decoded(decoded, message)
        for _, encoded, plain in subs:
            assert encoded.encoded and (plain is None or not plain.encoded)
            assert encoded.queued == 0 and encoded.statistics().taken == pub.statistics().messages


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), min_size=1, max_size=6), st.lists(st.booleans(), min_size=3))
def test_an_encoded_subscriber_gets_what_the_codec_encodes_on_every_edge(
    objs: list[object], with_plain: list[bool]
) -> None:
    """Differential: on local, tcp and shm edges, the body an encoded subscriber gets
    equals ``Codec().encode(message)``, and decodes to what a subscriber of messages
    gets (the general decoder's result)."""
    ezflow.lowlevel.run_coroutine(_through_every_edge(objs, with_plain))


@pytest.mark.parametrize("transport", ["local", "tcp", pytest.param("shm", marks=needs_shm)])
async def test_large_and_small_bodies_arrive_whole_with_every_counter(
    ctx: ezflow.GraphContext, transport: str
) -> None:
    pub = await ctx.publisher("/sub/sizes")
    sub = await ctx.subscriber("/sub/sizes", transport=transport, encoded=True)
    sent = [(i, time.time_ns(), np.full(n, i, np.uint8)) for i, n in enumerate((8, 1 << 20, 64))]
    for message in sent:
        await pub.publish(message)
    for message in sent:
        got = Codec().decode(await sub.recv())
        assert got[:2] == message[:2] and np.array_equal(got[2], message[2])
    stats = sub.statistics()
    assert stats.received == stats.taken == len(sent) and stats.dropped == 0


async def test_an_encoded_lossless_subscriber_holds_its_publisher_until_it_takes(
    ctx: ezflow.GraphContext,
) -> None:
    pub = await ctx.publisher("/sub/window", max_in_flight=4)
    sub = await ctx.subscriber("/sub/window", transport="tcp", encoded=True)
    await pub.wait_for_channels(1)
    for i in range(4):
        await pub.publish(i)
    fifth = asyncio.ensure_future(pub.publish(4))
    await asyncio.sleep(0.2)
    assert not fifth.done() and pub.in_flight == 4  # held back: nothing was taken
    assert Codec().decode(await sub.recv()) == 0  # taken: released, room for one
    async with asyncio.timeout(10):
        await fifth
    assert [Codec().decode(await sub.recv()) for _ in range(4)] == [1, 2, 3, 4]


async def test_an_encoded_leaky_subscriber_keeps_the_newest_and_counts_drops(
    ctx: ezflow.GraphContext,
) -> None:
    pub = await ctx.publisher("/sub/leaky")
    sub = await ctx.subscriber("/sub/leaky", transport="tcp", encoded=True, leaky=True, queue=2)
    await pub.wait_for_channels(1)
    for i in range(50):
        await pub.publish(i)
    await pub.aclose()
    got: list[Any] = []
    async with asyncio.timeout(10):
        async for body in sub:
            got.append(Codec().decode(body))
    assert got[-1] == 49 and got == sorted(got)
    assert sub.statistics().dropped == 50 - len(got)


async def test_an_encoded_callback_subscriber_gets_bodies(ctx: ezflow.GraphContext) -> None:
    bodies: list[Any] = []
    await ctx.subscriber("/sub/callback", transport="tcp", encoded=True, on_message=bodies.append)
    pub = await ctx.publisher("/sub/callback")
    for i in range(5):
        await pub.publish((i, "x"))
    async with asyncio.timeout(10):
        while len(bodies) < 5:  # noqa: ASYNC110 - delivered by the tcp read callback
            await asyncio.sleep(0.01)
    assert [Codec().decode(b) for b in bodies] == [(i, "x") for i in range(5)]


async def test_encoded_must_be_a_bool(ctx: ezflow.GraphContext) -> None:
    with pytest.raises(ezflow.ConfigurationError, match="encoded='yes' must be True"):
        await ctx.subscriber("/sub/bad", encoded="yes")  # type: ignore[arg-type]


_LOCAL_SENT: list[Any] = [
    (0, 1, np.arange(4, dtype=np.uint8)),  # small: the outlet's one-bytes path
    np.arange(6.0),  # a writable array
    {"big": np.zeros(1 << 16, np.uint8), "s": "x"},  # several parts, joined
    "text",
]


async def _publish_and_check(
    pub: ezflow.Publisher, encoded: ezflow.Subscriber | None, plain: ezflow.Subscriber
) -> None:
    """Publish :data:`_LOCAL_SENT`; *encoded* gets each codec body, *plain* the objects
    (arrays as read-only views, the publisher's stay writable)."""
    sent = [m.copy() if isinstance(m, np.ndarray) else m for m in _LOCAL_SENT]
    for message in sent:
        await pub.publish(message)
    for message in sent:
        if encoded is not None:
            body = await encoded.recv()
            assert bytes(body) == Codec().encode(message).to_bytes()
        got = await plain.recv()  # (the object, not a copy: same type, same body)
        assert type(got) is type(message)
        assert Codec().encode(got).to_bytes() == Codec().encode(message).to_bytes()
        if isinstance(got, np.ndarray):
            assert not got.flags.writeable  # (a view: the publisher's array stays writable)
    assert sent[1].flags.writeable


@pytest.mark.parametrize("encoded_first", [True, False])
async def test_a_local_channel_with_an_encoded_subscriber_is_fed_bodies_by_the_outlet(
    ctx: ezflow.GraphContext, encoded_first: bool
) -> None:
    """Differential: a local channel with an encoded subscriber, whether it was there
    when the channel opened or came after, gets each body from the outlet (encoded once
    there, the small-message path included). It hands out what the codec and the object
    give: the body to the encoded subscriber, the object (arrays read-only) to the
    other."""
    pub = await ctx.publisher("/sub/local-bodies")
    first = await ctx.subscriber("/sub/local-bodies", transport="local", encoded=encoded_first)
    await pub.wait_for_channels(1)
    (link,) = pub._outlet.links
    assert link.needs_encoding is encoded_first
    second = await ctx.subscriber("/sub/local-bodies", transport="local", encoded=not encoded_first)
    encoded, plain = (first, second) if encoded_first else (second, first)
    assert pub._outlet.links == (link,) and link.needs_encoding  # (the outlet encodes)
    await _publish_and_check(pub, encoded, plain)
    assert pub.statistics().encodes == len(_LOCAL_SENT)
    assert encoded.statistics().taken == plain.statistics().taken == len(_LOCAL_SENT)


async def test_an_encoded_subscriber_that_takes_parts_gets_a_local_body_unjoined(
    ctx: ezflow.GraphContext,
) -> None:
    """A local publisher's body of several parts (a large array: the parts reference it)
    goes to an encoded inbox that takes parts (the Zenoh export's) as they are, not
    joined into a new buffer; an encoded subscriber beside it gets the one joined body,
    and the subscriber of objects the objects - each what the codec gives."""
    pub = await ctx.publisher("/sub/local-parts")
    parts_sub = await ctx.subscriber("/sub/local-parts", transport="local", encoded=True)
    parts_sub._inbox.takes_parts = True
    joined_sub = await ctx.subscriber("/sub/local-parts", transport="local", encoded=True)
    plain = await ctx.subscriber("/sub/local-parts", transport="local")
    await pub.wait_for_channels(1)
    big = {"big": np.arange(1 << 16, dtype=np.uint8), "s": "x"}
    for message in (*_LOCAL_SENT, big):
        await pub.publish(message)
    for message in (*_LOCAL_SENT, big):
        expected = Codec().encode(message).to_bytes()
        in_parts = await parts_sub.recv()
        joined = await joined_sub.recv()
        assert Codec().encode(await plain.recv()).to_bytes() == expected
        assert bytes(joined) == expected and type(joined) is not EncodedMessage
        if type(in_parts) is not EncodedMessage:  # (one part: the same body for both)
            assert message is not big and bytes(in_parts) == expected
            continue
        assert in_parts.to_bytes() == expected and in_parts.nbytes == len(expected)
        if message is big:  # (the array's own memory: no copy was made)
            assert any(
                isinstance(part, memoryview) and np.shares_memory(np.asarray(part), big["big"])
                for part in in_parts.parts
            )


async def test_a_publisher_encodes_only_while_a_local_channel_has_an_encoded_subscriber(
    ctx: ezflow.GraphContext,
) -> None:
    """The last encoded subscriber of a local channel leaving (a Zenoh export unmapped,
    a relay closed) stops the encoding on the publish path; a new one starts it again.
    The subscriber of objects gets every message the same way throughout."""
    pub = await ctx.publisher("/sub/local-encoding")
    plain = await ctx.subscriber("/sub/local-encoding", transport="local")
    await pub.wait_for_channels(1)
    (link,) = pub._outlet.links
    encoded = await ctx.subscriber("/sub/local-encoding", transport="local", encoded=True)
    assert link.needs_encoding
    await _publish_and_check(pub, encoded, plain)
    encodes = pub.statistics().encodes
    assert encodes == len(_LOCAL_SENT)

    await encoded.aclose()
    assert not link.needs_encoding
    await _publish_and_check(pub, None, plain)
    assert pub.statistics().encodes == encodes  # (nothing takes bodies: none encoded)

    again = await ctx.subscriber("/sub/local-encoding", transport="local", encoded=True)
    assert link.needs_encoding and pub._outlet.links == (link,)
    await _publish_and_check(pub, again, plain)
    assert pub.statistics().encodes == encodes + len(_LOCAL_SENT)
    assert plain.statistics().taken == 3 * len(_LOCAL_SENT)
