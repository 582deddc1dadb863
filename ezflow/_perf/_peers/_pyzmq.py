"""The perf worker on pyzmq 27 (``python -m ezflow._perf._peers._pyzmq [--flavour F]``).

What a pyzmq user writes for a lossless 1 -> 1 stream, in the two idioms pyzmq's users
pick between (pyzmq has no loop of its own; libzmq's I/O thread does the I/O):

* ``sync`` (the default): blocking sockets, the receiving end in a thread of its own,
  as pyzmq's own throughput script does (``perf/perf.py`` of the pyzmq repository,
  ``thr``: a blocking ``send`` per message, one frame, ``copy=True``, the receiver a
  blocking ``recv`` loop of another process);
* ``asyncio``: ``zmq.asyncio`` sockets on the stock loop (``docs/source/api/
  zmq.asyncio.md``), the non-blocking call tried first on a synchronous shadow of the
  socket (``zmq.Socket.shadow``) and the awaitable one only when it would block: an
  awaited ``zmq.asyncio`` call costs a future and a loop pass per message even when
  the message is already there.

Both flavours:

* a ``PUSH`` socket per publisher, a ``PULL`` socket per subscriber: PUSH never drops;
  at its high-water mark ``send`` waits, so the stream is lossless end to end. The
  high-water marks are libzmq's default, 1000 messages, fewer for large messages
  (:func:`high_water_mark`) so that a queue holds at most :data:`QUEUE_BYTES`;
* the subscriber binds (``shm`` cells: an abstract-namespace ``ipc://`` endpoint, the
  same-host transport of libzmq; ``tcp``: ``tcp://127.0.0.1:*``) and registers its
  endpoint at the rendezvous of the run (:mod:`._common`); the publisher connects;
* a message below pyzmq's copy threshold (``zmq.COPY_THRESHOLD``, 64 KiB: "sending
  small messages (typically < 10s of kB) with ``copy=False`` is often more expensive
  than with ``copy=True``", ``docs/source/api/zmq.md``) is **one frame**, the header
  and the array's bytes joined (one copy, as ``copy=True`` makes anyway); a larger one
  is **two frames**, the header and the array sent with ``copy=False``, which is how
  pyzmq's serialization guide sends numpy arrays without copying them
  (``docs/source/howto/serialization.md``, "Example: numpy arrays"). The receiver's
  array is a view of the received bytes (one frame) or of the zmq frame (two). Both
  ends know which from the cell's message size (:meth:`PyzmqFramework.configure`), as
  a program knows what its stream carries;
* the header is the wire layout of :mod:`._common`, its codec cached per stream.

PUSH load-balances between PULL sockets, so one topic has one subscriber here: a
second one (the fan-out suite) makes the cell unavailable. Transport ``local`` (one
process) uses ``inproc://``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import zmq
import zmq.asyncio

from .._worker import NewPayload, is_end, private_payload
from ._common import (
    BARE,
    PeerUnavailableError,
    Rendezvous,
    RendezvousFramework,
    StreamCodec,
    in_daemon_thread,
    run_flavoured,
)

#: The most bytes of messages one socket's queue may hold: the high-water mark (a count
#: of messages in libzmq) is lowered for large messages so that a back-to-back run of
#: 24.9 MB frames does not queue gigabytes per side.
QUEUE_BYTES: Final = 256 * 1024 * 1024
#: libzmq's default high-water mark, in messages.
DEFAULT_HWM: Final = 1000
#: Milliseconds a blocking call waits before it checks whether the worker is leaving.
BLOCK_MS: Final = 200


def high_water_mark(size: int) -> int:
    """The high-water mark of a stream of *size*-byte messages: libzmq's default,
    fewer when that many messages would be more than :data:`QUEUE_BYTES` (at least 2)."""
    return max(2, min(DEFAULT_HWM, QUEUE_BYTES // max(1, size)))


@dataclass(slots=True)
class _Process:
    """The zmq context, the rendezvous client and the sockets of one worker process."""

    context: zmq.Context[Any]
    rendezvous: Rendezvous
    sockets: list[zmq.Socket[Any]] = field(default_factory=list)
    #: Set when the worker leaves: receiving threads stop at their next timeout.
    leaving: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)


@dataclass(slots=True)
class _Socket:
    """A socket of a stream: the socket itself (asyncio or blocking), its blocking
    shadow and the stream's codec."""

    socket: Any
    shadow: zmq.Socket[Any]
    process: _Process
    codec: StreamCodec = field(default_factory=StreamCodec)


def _endpoint(transport: str) -> str:
    if transport == "shm":
        return f"ipc://@ezflow-perf-{uuid.uuid4().hex}"
    if transport == "tcp":
        return "tcp://127.0.0.1:*"
    return f"inproc://ezflow-perf-{uuid.uuid4().hex}"


class PyzmqFramework(RendezvousFramework):
    """The :class:`ezflow._perf._worker.Framework` of pyzmq (PUSH/PULL), ``sync`` or
    ``asyncio``."""

    library = "pyzmq"
    distribution = "pyzmq"
    flavours = ("sync", "asyncio")

    def __init__(self, flavour: str | None = None) -> None:
        super().__init__(flavour)
        self._hwm = DEFAULT_HWM
        #: Whether a message is two frames (header, array with copy=False).
        self._two_frames = False

    def configure(self, spec: dict[str, Any]) -> None:
        """The stream's message size decides the high-water mark and the framing."""
        size = int(spec["size"])
        self._hwm = high_water_mark(size)
        self._two_frames = size >= zmq.COPY_THRESHOLD

    @contextlib.asynccontextmanager
    async def _context(self, graph: tuple[str, int]) -> AsyncIterator[_Process]:
        context: zmq.Context[Any] = (
            zmq.asyncio.Context() if self.flavour == "asyncio" else zmq.Context()
        )
        process = _Process(context, Rendezvous(graph))
        try:
            yield process
        finally:
            process.leaving.set()
            for thread in process.threads:
                thread.join(timeout=2 * BLOCK_MS / 1000)
            for sock in process.sockets:
                sock.close(linger=0)
            process.context.term()
            await process.rendezvous.aclose()

    def context(self, graph: tuple[str, int]) -> AbstractAsyncContextManager[Any]:
        return self._context(graph)

    def _socket(self, ctx: _Process, kind: int) -> _Socket:
        sock = ctx.context.socket(kind)
        ctx.sockets.append(sock)
        sock.setsockopt(zmq.SNDHWM if kind == zmq.PUSH else zmq.RCVHWM, self._hwm)
        if self.flavour == "asyncio":  # (zmq.asyncio would turn a timeout into an error)
            return _Socket(sock, zmq.Socket.shadow(sock.underlying), ctx)
        sock.setsockopt(zmq.SNDTIMEO if kind == zmq.PUSH else zmq.RCVTIMEO, BLOCK_MS)
        return _Socket(sock, sock, ctx)

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        endpoints = await ctx.rendezvous.get(topic)
        if len(endpoints) > 1:
            raise PeerUnavailableError(
                "pyzmq PUSH/PULL is one-to-one (PUSH load-balances between subscribers)"
            )
        pub = self._socket(ctx, zmq.PUSH)
        pub.socket.connect(endpoints[0])
        return pub

    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        sub = self._socket(ctx, zmq.PULL)
        sub.socket.bind(_endpoint(transport))
        await ctx.rendezvous.put(topic, sub.socket.getsockopt_string(zmq.LAST_ENDPOINT))
        return sub

    def _frames(self, pub: _Socket) -> Callable[[Any], list[Any]]:
        """The frames of one message: ``[header + bytes]`` or ``[header, array]``."""
        header, two = pub.codec.header, self._two_frames
        # Typed loosely: numpy arrays are buffers, which typeshed's Buffer does not know.
        join: Callable[[Any], bytes] = b"".join

        def frames(message: Any) -> list[Any]:
            if type(message) is np.ndarray:  # the array suites: a bare array
                phase, seq, t_ns, payload = BARE, 0, 0, message
            else:
                phase, seq, t_ns, payload = message
            head = header(phase, seq, t_ns, payload)
            return [head, payload] if two else [join((head, payload))]

        return frames

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        frames, send = self._frames(pub), self._sender(pub)

        async def publish(message: Any) -> None:
            await send(frames(message))

        return publish

    def _sender(self, pub: _Socket) -> Callable[[list[Any]], Awaitable[None]]:
        """Send one message's frames (waits at the high-water mark)."""
        shadow = pub.shadow
        send, send_multipart = shadow.send, shadow.send_multipart
        two, again, noblock = self._two_frames, zmq.Again, zmq.NOBLOCK
        if self.flavour == "asyncio":
            wait_send = pub.socket.send_multipart

            async def send_async(frames: list[Any]) -> None:
                try:  # the non-blocking call first: no future when there is room
                    if two:
                        send_multipart(frames, noblock, copy=False)
                    else:
                        send(frames[0], noblock)
                except again:
                    await wait_send(frames, copy=not two)

            return send_async

        async def send_blocking(frames: list[Any]) -> None:
            while True:
                try:  # blocks up to BLOCK_MS at the high-water mark
                    if two:
                        send_multipart(frames, copy=False)
                    else:
                        send(frames[0])
                    return
                except again:
                    await asyncio.sleep(0)  # the worker's commands (end of stdin: leave)

        return send_blocking

    def payload_function(
        self, pub: Any, transport: str, shape: tuple[int, ...], dtype: str, loan: bool
    ) -> NewPayload:
        # zmq has no buffer to lend: a private array (sent without a copy when large).
        return private_payload(shape, dtype)

    def _receiver(self, sub: _Socket, *, patient: bool) -> Callable[[], Any]:
        """Blocking receive of one message as its raw frames: ``(buffer, None)`` or
        ``(header, payload buffer)``. None when the worker is leaving, or (unless
        *patient*: the ``sync`` flavour's receiving thread) when nothing came within
        :data:`BLOCK_MS`, so that a caller on the event loop can let it run."""
        shadow, leaving = sub.shadow, sub.process.leaving
        recv, again, two = shadow.recv, zmq.Again, self._two_frames

        def receive() -> Any:
            while True:
                try:
                    first = recv()
                    if not two:
                        return first, None
                    return first, recv(copy=False).buffer
                except again:
                    if leaving.is_set() or not patient:
                        return None

        return receive

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        decode = sub.codec.decode
        if self.flavour == "asyncio":
            receive = self._async_receiver(sub)
            while True:
                first, payload = await receive()
                if handle(decode(first, 0, payload)):
                    return
        blocking = self._receiver(sub, patient=True)

        def work() -> None:
            while (got := blocking()) is not None:
                if handle(decode(got[0], 0, got[1])):
                    return

        await in_daemon_thread(work, "pyzmq-receive", sub.process.threads)

    def _async_receiver(self, sub: _Socket) -> Callable[[], Awaitable[tuple[Any, Any]]]:
        shadow, sock = sub.shadow, sub.socket
        recv, again, noblock, two = shadow.recv, zmq.Again, zmq.NOBLOCK, self._two_frames
        wait_recv = sock.recv_multipart

        async def receive() -> tuple[Any, Any]:
            try:  # the non-blocking call first: no future when a message is there
                first = recv(noblock)
                return (first, recv(copy=False).buffer) if two else (first, None)
            except again:
                frames = await wait_recv(copy=not two)
                return (frames[0], frames[1].buffer) if two else (frames[0], None)

        return receive

    async def relay(self, sub: Any, pub: Any) -> int:
        decode, send = sub.codec.decode, self._sender(pub)
        forwarded = 0
        if self.flavour == "asyncio":
            receive = self._async_receiver(sub)
            while True:
                first, payload = await receive()
                await send([first] if payload is None else [first, payload])
                forwarded += 1
                if is_end(decode(first, 0, payload)):
                    return forwarded
        blocking = self._receiver(sub, patient=False)
        while True:
            got = blocking()
            if got is None:
                await asyncio.sleep(0)  # the worker's commands (end of stdin: leave)
                continue
            first, payload = got
            await send([first] if payload is None else [first, payload])
            forwarded += 1
            if is_end(decode(first, 0, payload)):
                return forwarded


if __name__ == "__main__":
    run_flavoured(PyzmqFramework)
