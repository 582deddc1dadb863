"""What the peer frameworks without a graph server share: a rendezvous, a wire layout
for ``(phase, seq, t_ns, payload)`` tuples, and the worker methods every one of them
implements the same way.

Imported by the peer workers (:mod:`._pyzmq`, :mod:`._zenoh`, :mod:`._iceoryx2`) and
the references of ``--selfcheck`` in their own virtualenvs, never by ezflow itself; it
needs numpy, the stdlib and the worker module (:mod:`ezflow._perf._worker`).

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

**The codec of a stream** (:class:`StreamCodec`): what a user of such a library writes
once per stream, since a stream carries one kind of array: the header's constant part
(dtype, ndim, shape) packed once and checked with one ``struct`` call per message on
the way in. It costs a few hundred nanoseconds per message (``ezflow perf peers
--selfcheck`` prints the figure), where the general :func:`encode_header` and
:func:`decode` (kept as the specification: a test pins the cached codec's bytes and
arrays to them) parse the dtype and the shape of every message. ezflow and ezmsg have a
codec of their own and pay neither.

**Flavours.** A library whose users pick between two idioms runs both, as separate
frameworks named ``LIBRARY-FLAVOUR`` (``pyzmq-sync``, ``zenoh-callback``): the worker
command is ``python -m MODULE --flavour FLAVOUR``, and :func:`run_flavoured` takes the
flavour off the arguments before :func:`ezflow._perf._worker.main` reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import math
import struct
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from functools import partial
from operator import contains
from typing import Any, Final, TypeVar

import numpy as np

from .._worker import main

__all__ = [
    "BARE",
    "HEAD",
    "PeerUnavailableError",
    "Rendezvous",
    "RendezvousFramework",
    "StreamCodec",
    "decode",
    "encode_header",
    "header_size",
    "in_daemon_thread",
    "rendezvous",
    "run_flavoured",
    "wait_until",
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
    count = math.prod(shape)
    if payload is None:
        payload, start = buffer, offset + header_size(ndim)
    else:
        start = 0
    array = np.frombuffer(payload, dtype, count, start).reshape(shape)
    return array if phase == BARE else (phase, seq, t_ns, array)


#: The first three fields of the header (what changes from message to message).
_STAMP: Final = struct.Struct("<qqq")


class StreamCodec:
    """The wire layout of one stream's messages (see the module), cached per kind of
    payload: the header's constant part, the dtype, count and shape of the last array
    seen on the way out and on the way in. A message of another kind takes the general
    path once and becomes the cached kind. The bytes and arrays are those of
    :func:`encode_header` and :func:`decode`. One instance per stream and direction
    (not thread-safe: one thread encodes or decodes)."""

    __slots__ = (
        "_in_count",
        "_in_dtype",
        "_in_shape",
        "_in_size",
        "_in_struct",
        "_in_tail",
        "_out_dtype",
        "_out_shape",
        "_out_tail",
    )

    def __init__(self) -> None:
        self._out_dtype: Any = None
        self._out_shape: tuple[int, ...] | None = None
        self._out_tail = b""
        self._in_struct = HEAD
        self._in_tail: tuple[Any, ...] = ()
        self._in_dtype: Any = None
        self._in_count = 0
        self._in_size = 0
        #: None for a 1-D array (``np.frombuffer`` makes it so), else the shape.
        self._in_shape: tuple[int, ...] | None = None

    def header(self, phase: int, seq: int, t_ns: int, payload: Payload) -> bytes:
        """The wire header of ``(phase, seq, t_ns, payload)`` (:func:`encode_header`'s
        bytes); the payload's bytes follow it."""
        dtype, shape = payload.dtype, payload.shape
        if shape != self._out_shape or (dtype is not self._out_dtype and dtype != self._out_dtype):
            tail = HEAD.pack(0, 0, 0, dtype.str.encode(), len(shape))[_STAMP.size :]
            self._out_tail = tail + struct.pack(f"<{len(shape)}q", *shape)
            self._out_dtype, self._out_shape = dtype, shape
        return _STAMP.pack(phase, seq, t_ns) + self._out_tail

    def size(self, payload: Payload) -> int:
        """Bytes of the header of *payload* (:func:`header_size` of its ndim)."""
        return header_size(payload.ndim)

    def decode(self, buffer: Any, offset: int = 0, payload: Any = None) -> Message | Payload:
        """:func:`decode`, with one ``struct`` call for a message of the cached kind."""
        fields = self._in_struct
        if len(buffer) - offset >= self._in_size:
            values = fields.unpack_from(buffer, offset)
            if values[3:] == self._in_tail:
                if payload is None:
                    payload, start = buffer, offset + self._in_size
                else:
                    start = 0
                array = np.frombuffer(payload, self._in_dtype, self._in_count, start)
                if self._in_shape is not None:
                    array = array.reshape(self._in_shape)
                if values[0] == BARE:
                    return array
                return (values[0], values[1], values[2], array)
        message = decode(buffer, offset, payload)
        array = message if isinstance(message, np.ndarray) else message[3]
        ndim = array.ndim
        self._in_struct = struct.Struct(f"<qqq4sB3x{ndim}q")
        self._in_size = self._in_struct.size
        self._in_tail = self._in_struct.unpack_from(buffer, offset)[3:]
        self._in_dtype, self._in_count = array.dtype, array.size
        self._in_shape = None if ndim == 1 else array.shape
        return message


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
    raised as :class:`PeerUnavailableError`, :func:`rendezvous` as the graph server, and
    the flavour. A subclass sets :attr:`library`, :attr:`distribution` and, when its
    users pick between idioms, :attr:`flavours` (the first is the default), and adds
    the pub/sub methods."""

    #: The library's name; the framework's :attr:`name` adds the flavour.
    library: str
    #: The PyPI distribution whose version the results record.
    distribution: str
    #: The idioms this worker can run (empty: one way only).
    flavours: tuple[str, ...] = ()
    unavailable: tuple[type[Exception], ...] = (PeerUnavailableError,)

    def __init__(self, flavour: str | None = None) -> None:
        if flavour is None and self.flavours:
            flavour = self.flavours[0]
        if flavour is not None and flavour not in self.flavours:
            known = ", ".join(self.flavours) or "none"
            raise ValueError(f"{self.library} has no flavour {flavour!r} (flavours: {known})")
        self.flavour = flavour

    @property
    def name(self) -> str:
        """``LIBRARY`` or ``LIBRARY-FLAVOUR``: the framework's name in the results."""
        return self.library if self.flavour is None else f"{self.library}-{self.flavour}"

    def version(self) -> str:
        return importlib.metadata.version(self.distribution)

    def loop_name(self) -> str:
        return "asyncio"

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(main)

    def graph_server(self) -> AbstractAsyncContextManager[tuple[str, int]]:
        return rendezvous()


def run_flavoured(factory: Callable[[str | None], Any], argv: list[str] | None = None) -> None:
    """The entry point of a peer worker: ``[--flavour FLAVOUR] graph | units SPEC |
    info`` (:func:`ezflow._perf._worker.main` after the flavour is taken off)."""
    args = sys.argv[1:] if argv is None else list(argv)
    flavour = None
    if args[:1] == ["--flavour"] and len(args) >= 2:
        flavour, args = args[1], args[2:]
    try:
        framework = factory(flavour)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    main(framework, args)


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


async def in_daemon_thread(
    work: Callable[[], T], name: str, threads: list[threading.Thread] | None = None
) -> T:
    """Run the blocking *work* in a daemon thread named *name* (appended to *threads*
    when given, for a caller that joins it when leaving); its result or exception. A
    daemon thread (not ``asyncio.to_thread``): a worker told to leave while the thread
    blocks in a library's receive call must still exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def succeed(result: T) -> None:
        if not done.done():  # cancelled meanwhile: nobody waits any more
            done.set_result(result)

    def fail(error: BaseException) -> None:
        if not done.done():
            done.set_exception(error)

    def target() -> None:
        try:
            result = work()
        except BaseException as exc:
            settle: Callable[[], object] = partial(loop.call_soon_threadsafe, fail, exc)
        else:
            settle = partial(loop.call_soon_threadsafe, succeed, result)
        with contextlib.suppress(RuntimeError):  # the loop is gone: the worker is leaving
            settle()

    thread = threading.Thread(target=target, name=name, daemon=True)
    if threads is not None:
        threads.append(thread)
    thread.start()
    return await done
