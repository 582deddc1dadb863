"""What the peer frameworks without a graph server share: a rendezvous, a wire layout
for ``(phase, seq, t_ns, payload)`` tuples, and the worker methods every one of them
implements the same way.

Imported only inside a peer's own virtualenv (by :mod:`._pyzmq`, :mod:`._zenoh`,
:mod:`._iceoryx2`), never by ezflow itself; it needs nothing but numpy and the stdlib.

**Rendezvous.** pyzmq, Zenoh (in peer mode, with scouting off) and iceoryx2 have no
graph server, but a subscriber must tell its publishers where it listens. The runner's
``graph`` worker of such a peer serves :func:`rendezvous` instead: a line protocol on a
free loopback port (``put TOPIC VALUE`` -> ``ok``; ``get TOPIC`` -> the values put for
TOPIC so far, as one JSON list, once there is at least one). Every units worker of the
run gets its address, as ezflow's workers get the graph server's.

**Wire layout** (:func:`encode_header`, :func:`decode`): what a user of a byte-oriented
library writes for such a tuple: a fixed little-endian header, then the array's bytes::

    int64 phase, int64 seq, int64 t_ns, char[4] dtype (numpy's ``dtype.str``, NUL
    padded), uint8 ndim, 3 pad bytes, int64 shape[ndim], then the payload

The header is a multiple of 8 bytes, so a payload that follows it in the same buffer
stays aligned for every numpy dtype.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import struct
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from functools import partial
from operator import contains
from typing import Any, Final, TypeVar

import numpy as np

__all__ = [
    "BARE",
    "HEAD",
    "PeerUnavailableError",
    "Rendezvous",
    "RendezvousFramework",
    "decode",
    "encode_header",
    "header_size",
    "rendezvous",
]

#: Fixed part of the wire header: phase, seq, t_ns, dtype.str, ndim (then the shape).
HEAD: Final = struct.Struct("<qqq4sB3x")
#: The phase that marks a bare array (the fan-out, fan-in and relay suites publish
#: ``uint8`` arrays that carry their own header): :func:`decode` returns the array alone.
BARE: Final = -1
#: Seconds a ``get`` waits for a topic's first subscriber before it fails.
RENDEZVOUS_TIMEOUT: Final = 30.0
#: Longest line the rendezvous accepts (a topic and an endpoint).
MAX_LINE: Final = 4096

Payload = np.ndarray[Any, Any]
Message = tuple[int, int, int, Payload]
T = TypeVar("T")


class PeerUnavailableError(RuntimeError):
    """This peer cannot do what the cell asks (iceoryx2 over tcp, pyzmq fan-out): the
    cell is reported as unavailable with this message."""


def header_size(ndim: int) -> int:
    """Bytes of the wire header of an array with *ndim* dimensions."""
    return HEAD.size + 8 * ndim


def encode_header(phase: int, seq: int, t_ns: int, payload: Payload) -> bytes:
    """The wire header of ``(phase, seq, t_ns, payload)``; the payload's bytes follow it."""
    shape = payload.shape
    return HEAD.pack(phase, seq, t_ns, payload.dtype.str.encode(), len(shape)) + struct.pack(
        f"<{len(shape)}q", *shape
    )


def decode(buffer: Any, offset: int = 0, payload: Any = None) -> Message | Payload:
    """The tuple whose header is in *buffer* at *offset*, its payload following the
    header there or, when given, in *payload* (a second buffer, as in a two-part
    message). The array is a zero-copy view, valid as long as its buffer is; a
    :data:`BARE` message decodes to the array alone."""
    phase, seq, t_ns, dtype_code, ndim = HEAD.unpack_from(buffer, offset)
    shape = struct.unpack_from(f"<{ndim}q", buffer, offset + HEAD.size)
    dtype = np.dtype(dtype_code.rstrip(b"\0").decode())
    count = int(np.prod(shape)) if ndim else 1
    if payload is None:
        payload, start = buffer, offset + header_size(ndim)
    else:
        start = 0
    array = np.frombuffer(payload, dtype, count, start).reshape(shape)
    return array if phase == BARE else (phase, seq, t_ns, array)


async def _serve_client(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    topics: dict[str, list[str]],
    changed: asyncio.Condition,
) -> None:
    try:
        while line := await reader.readline():
            verb, _, rest = line.decode().strip().partition(" ")
            if verb == "put":
                topic, _, value = rest.partition(" ")
                async with changed:
                    topics.setdefault(topic, []).append(value)
                    changed.notify_all()
                writer.write(b"ok\n")
            elif verb == "get":
                wanted = rest
                async with changed:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(
                            changed.wait_for(partial(contains, topics, wanted)), RENDEZVOUS_TIMEOUT
                        )
                    values = topics.get(wanted, [])
                writer.write(json.dumps(values).encode() + b"\n")
            else:
                writer.write(b"error: unknown command\n")
            await writer.drain()
    except (ConnectionError, ValueError):
        pass  # a worker that went away, or a line beyond MAX_LINE: drop that client only
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def rendezvous() -> AsyncIterator[tuple[str, int]]:
    """Serve the rendezvous on a free loopback port while the block runs; yields its
    address (the :meth:`Framework.graph_server` of a peer without a graph server)."""
    topics: dict[str, list[str]] = {}
    changed = asyncio.Condition()
    server = await asyncio.start_server(
        lambda r, w: _serve_client(r, w, topics, changed), "127.0.0.1", 0, limit=MAX_LINE
    )
    try:
        host, port = server.sockets[0].getsockname()[:2]
        yield (str(host), int(port))
    finally:
        server.close()
        await server.wait_closed()


class RendezvousFramework:
    """The part of :class:`ezflow._perf._worker.Framework` that every peer without a
    graph server implements the same way: the stock asyncio loop (``asyncio.run``, as
    their users write), the version of the peer's distribution, "unavailable" cells
    raised as :class:`PeerUnavailableError`, and :func:`rendezvous` as the graph server.
    A subclass sets :attr:`name` and :attr:`distribution` and adds the pub/sub methods.
    """

    name: str
    #: The PyPI distribution whose version the results record.
    distribution: str
    unavailable: tuple[type[Exception], ...] = (PeerUnavailableError,)

    def version(self) -> str:
        return importlib.metadata.version(self.distribution)

    def loop_name(self) -> str:
        return "asyncio"

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(main)

    def graph_server(self) -> AbstractAsyncContextManager[tuple[str, int]]:
        return rendezvous()


class Rendezvous:
    """A client of :func:`rendezvous` (one connection, used by one task at a time)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _ask(self, line: str) -> str:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(
                *self.address, limit=MAX_LINE
            )
        assert self._reader is not None
        self._writer.write(line.encode() + b"\n")
        await self._writer.drain()
        answer = await self._reader.readline()
        if not answer:
            raise ConnectionError(f"the rendezvous at {self.address} went away")
        return answer.decode().strip()

    async def put(self, topic: str, value: str) -> None:
        """Publish that a subscriber of *topic* is reachable at *value*."""
        await self._ask(f"put {topic} {value}")

    async def get(self, topic: str) -> list[str]:
        """Where the subscribers of *topic* are reachable; raises TimeoutError when none
        registered within :data:`RENDEZVOUS_TIMEOUT` seconds."""
        values: list[str] = json.loads(await self._ask(f"get {topic}"))
        if not values:
            raise TimeoutError(f"no subscriber of {topic} within {RENDEZVOUS_TIMEOUT:.0f} s")
        return values

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()


async def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll *check* (every millisecond, without blocking the loop) until it is true;
    raises TimeoutError naming *what* after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f} s")
        await asyncio.sleep(0.001)
