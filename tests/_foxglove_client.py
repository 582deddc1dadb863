"""A minimal Foxglove WebSocket client for the tests: RFC 6455 client framing over
asyncio streams and the ``foxglove.websocket.v1`` messages a viewer uses (advertise,
subscribe, unsubscribe, binary MessageData), from the protocol's public spec
(github.com/foxglove/ws-protocol, docs/spec.md). Nothing of ezflow's or the SDK's.

It offers the subprotocols the Foxglove app offers: ``foxglove.websocket.v1`` and
``foxglove.sdk.v1``. The SDK's server (0.30) accepts only the second name, for the same
v1 messages (serverInfo, advertise, subscribe, MessageData) this client speaks."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import struct
from typing import Any

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SUBPROTOCOLS = ("foxglove.websocket.v1", "foxglove.sdk.v1")
_MESSAGE_DATA = 0x01


class FoxgloveClient:
    """One viewer connection. :meth:`next_frame` returns the next text frame (a parsed
    JSON dict) or binary MessageData as ``(subscription_id, log_time, payload)``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.channels: dict[str, dict[str, Any]] = {}  # by topic, from advertise
        self.server_info: dict[str, Any] | None = None
        self.subprotocol = ""

    @classmethod
    async def connect(cls, host: str, port: int) -> FoxgloveClient:
        reader, writer = await asyncio.open_connection(host, port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {', '.join(SUBPROTOCOLS)}\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status, *lines = head.split("\r\n")
        assert " 101 " in status, head
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines if line)
        }
        accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
        assert headers["sec-websocket-accept"] == accept, headers
        assert headers["sec-websocket-protocol"] in SUBPROTOCOLS, headers
        client = cls(reader, writer)
        client.subprotocol = headers["sec-websocket-protocol"]
        return client

    async def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(head + mask + masked)
        await self.writer.drain()

    async def send_json(self, message: dict[str, Any]) -> None:
        await self._send(0x1, json.dumps(message).encode())

    async def _frame(self) -> tuple[int, bytes]:
        """One whole message (fragments joined); answers pings."""
        opcode, parts = 0, []
        while True:
            first, second = await self.reader.readexactly(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack("!H", await self.reader.readexactly(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", await self.reader.readexactly(8))[0]
            mask = await self.reader.readexactly(4) if second & 0x80 else b""
            data = await self.reader.readexactly(size)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            code = first & 0x0F
            if code == 0x9:
                await self._send(0xA, data)
                continue
            if code == 0x8:
                raise ConnectionError(f"the server closed the WebSocket: {data!r}")
            if code != 0x0:
                opcode = code
            parts.append(data)
            if first & 0x80:
                return opcode, b"".join(parts)

    async def next_frame(self) -> Any:
        opcode, data = await self._frame()
        if opcode == 0x1:
            message = json.loads(data)
            if message.get("op") == "advertise":
                for channel in message["channels"]:
                    self.channels[channel["topic"]] = channel
            elif message.get("op") == "serverInfo":
                self.server_info = message
            return message
        assert data[0] == _MESSAGE_DATA, data[:1]
        subscription, log_time = struct.unpack_from("<IQ", data, 1)
        return subscription, log_time, data[13:]

    async def subscribe(self, subscription: int, topic: str) -> None:
        channel = self.channels[topic]
        await self.send_json(
            {"op": "subscribe", "subscriptions": [{"id": subscription, "channelId": channel["id"]}]}
        )

    async def unsubscribe(self, subscription: int) -> None:
        await self.send_json({"op": "unsubscribe", "subscriptionIds": [subscription]})

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 5)
