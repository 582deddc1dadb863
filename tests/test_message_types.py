"""Message types across processes (issue 13 items 4-6): undecodable messages are loud,
registered classes are known in every unit process, optional run-time type checks."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

import ezflow
from ezflow._core._codec import Codec, EncodedMessage


@ezflow.message
@dataclasses.dataclass
class Ghost:
    value: int


class _Forged:
    """A message whose encoded body is given as is (what a peer with other message
    classes, or a broken one, would send)."""

    def __init__(self, body: bytes) -> None:
        self.body = body


class _ForgingCodec(Codec):
    """The publisher's codec, except that a :class:`_Forged` message is sent as its body."""

    def encode_small(self, obj: object) -> bytes | None:
        return obj.body if isinstance(obj, _Forged) else super().encode_small(obj)

    def encode(self, obj: object) -> EncodedMessage:
        if isinstance(obj, _Forged):
            return EncodedMessage([obj.body], len(obj.body))
        return super().encode(obj)


def _unknown_type_body() -> bytes:
    """A well-formed body of a registered class's name that no process registered."""
    body = Codec().encode(Ghost(7)).to_bytes()
    assert body.count(b"Ghost") == 1
    return body.replace(b"Ghost", b"Ghozt")


@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_undecodable_raises_in_order_for_lossless_and_counts_for_leaky(
    ctx: ezflow.GraphContext, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    pub = await ctx.publisher("/forged", transport=transport)
    lossless = await ctx.subscriber("/forged", transport=transport)
    leaky = await ctx.subscriber("/forged", transport=transport, leaky=True, queue=16)
    pub._outlet.codec = _ForgingCodec()
    sent: list[Any] = [
        Ghost(1),
        _Forged(b"\x01garbage"),
        Ghost(2),
        _Forged(_unknown_type_body()),
        np.arange(4.0),
    ]
    for message in sent:
        await pub.publish(message)
    assert await asyncio.wait_for(lossless.recv(), 5) == Ghost(1)
    with pytest.raises(ezflow.UndecodableMessageError) as garbage:
        await asyncio.wait_for(lossless.recv(), 5)
    assert garbage.value.topic == "/forged" and garbage.value.publisher_id == pub.id
    assert isinstance(garbage.value.__cause__, ezflow.ProtocolError)
    assert await asyncio.wait_for(lossless.recv(), 5) == Ghost(2)
    with pytest.raises(ezflow.UndecodableMessageError, match="Ghozt"):
        await asyncio.wait_for(lossless.recv(), 5)
    assert np.array_equal(await asyncio.wait_for(lossless.recv(), 5), np.arange(4.0))
    assert lossless.stats.undecodable == 2
    assert {channel.transport for channel in ctx.channels} == {transport}
    # Nothing stalls: the publisher's window was released for every message.
    for i in range(3):
        await asyncio.wait_for(pub.publish(Ghost(10 + i)), 5)
        assert await asyncio.wait_for(lossless.recv(), 5) == Ghost(10 + i)
    got = [await asyncio.wait_for(leaky.recv(), 5) for _ in range(6)]
    assert got[:2] == [Ghost(1), Ghost(2)] and got[3:] == [Ghost(10), Ghost(11), Ghost(12)]
    assert (leaky.stats.undecodable, leaky.stats.dropped) == (2, 2)
    assert "cannot be decoded" in caplog.text
