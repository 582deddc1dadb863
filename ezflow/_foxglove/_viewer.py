"""A minimal Foxglove WebSocket viewer (client) on asyncio streams: what
``ezflow perf foxglove`` watches a graph with. RFC 6455 client framing and the v1
messages a viewer uses (serverInfo, advertise, subscribe, MessageData), offering both
subprotocol names the Foxglove app offers (``foxglove.websocket.v1``, and
``foxglove.sdk.v1``, the only one the SDK's server accepts). The tests use their own,
independent client (tests/_foxglove_client.py)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import struct
from typing import Any

__all__ = ["Viewer"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_SUBPROTOCOLS = ("foxglove.websocket.v1", "foxglove.sdk.v1")
#: Bytes of one WebSocket message the viewer accepts at most (a 4K RGB frame is 24 MiB).
_MAX_MESSAGE = 256 * 1024 * 1024


class Viewer:
    """One connection to a Foxglove WebSocket server. :meth:`message` returns the next
    MessageData as ``(subscription id, log time ns, payload)``; JSON messages met on the
    way (advertise...) update :attr:`channels`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._next_id = 1
        #: Advertised channels by topic.
        self.channels: dict[str, dict[str, Any]] = {}

    @classmethod
    async def connect(cls, host: str, port: int) -> Viewer:
        """Connect and upgrade; raises :class:`ConnectionError` if the server refuses."""
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {', '.join(_SUBPROTOCOLS)}\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
        if " 101 " not in head.split("\r\n", 1)[0] or accept not in head:
            writer.close()
            raise ConnectionError(f"the server refused the WebSocket upgrade: {head!r:.200}")
        return cls(reader, writer)

    async def _send(self, payload: bytes) -> None:
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x81, 0x80 | size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x81, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self._writer.write(head + mask + masked)
        await self._writer.drain()

    async def _frame(self) -> tuple[int, bytes]:
        opcode, parts, total = 0, [], 0
        while True:
            first, second = await self._reader.readexactly(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack("!H", await self._reader.readexactly(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", await self._reader.readexactly(8))[0]
            total += size
            if total > _MAX_MESSAGE:
                raise ConnectionError(f"a WebSocket message of more than {_MAX_MESSAGE} bytes")
            mask = await self._reader.readexactly(4) if second & 0x80 else b""
            data = await self._reader.readexactly(size)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            code = first & 0x0F
            if code == 0x9:  # ping: pong, masked as a client must
                self._writer.write(bytes([0x8A, 0x80 | len(data)]) + b"\0\0\0\0" + data)
                continue
            if code == 0x8:
                raise ConnectionError("the server closed the connection")
            if code:
                opcode = code
            parts.append(data)
            if first & 0x80:
                return opcode, b"".join(parts)

    async def _next(self) -> Any:
        opcode, data = await self._frame()
        if opcode == 0x1:
            message = json.loads(data)
            if message.get("op") == "advertise":
                for channel in message.get("channels", []):
                    self.channels[channel["topic"]] = channel
            return message
        subscription, log_time = struct.unpack_from("<IQ", data, 1)
        return subscription, log_time, memoryview(data)[13:]

    async def wait_for_channels(self, topics: list[str], timeout: float) -> None:
        """Read until every topic of *topics* is advertised (at most *timeout* s)."""

        async def wait() -> None:
            while not all(topic in self.channels for topic in topics):
                await self._next()

        await asyncio.wait_for(wait(), timeout)

    async def subscribe(self, topic: str) -> int:
        """Subscribe to the advertised *topic*; return the subscription id."""
        subscription, self._next_id = self._next_id, self._next_id + 1
        channel = self.channels[topic]["id"]
        request = {"op": "subscribe", "subscriptions": [{"id": subscription, "channelId": channel}]}
        await self._send(json.dumps(request).encode())
        return subscription

    async def message(self) -> tuple[int, int, memoryview]:
        """The next MessageData."""
        while True:
            item = await self._next()
            if isinstance(item, tuple):
                return item

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), 5)
