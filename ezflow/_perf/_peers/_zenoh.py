"""The perf worker on Eclipse Zenoh 1.10 (``python -m ezflow._perf._peers._zenoh
[--flavour F]``).

What a Zenoh user writes for a lossless 1 -> 1 stream between two processes of one host,
with no router and no discovery traffic, in the two ways Zenoh's Python API receives
("Channels and callbacks", ``docs/concepts.rst`` of zenoh-python):

* ``callback`` (the default): the subscriber's handler is a callable, run by Zenoh for
  each sample, as Zenoh's own throughput example does (``examples/z_sub_thr.py``:
  ``zenoh.handlers.Callback``); the sink's accounting runs in it. Zenoh forbids calling
  its API from a callback, so a relay's callback queues each payload and a thread of
  the relay publishes it (the "custom channel" of the same page);
* ``fifo``: a bounded ``zenoh.handlers.FifoChannel`` (:data:`FIFO` samples, blocking
  Zenoh's reader when full) drained by the blocking ``recv`` in a thread
  (``docs/examples/channels.py``): a copy of each sample into the channel and a hand-over
  between threads, which pays off for large messages more than for small ones.

Both flavours:

* one session per publisher and per subscriber, in ``peer`` mode with multicast
  scouting off (``scouting/multicast/enabled=false``, the examples' ``--no-multicast-
  scouting``) and explicit endpoints: the subscriber's session listens, the
  publisher's connects to what the subscriber registered at the run's rendezvous
  (:mod:`._common`). ``tcp`` cells listen on ``tcp/127.0.0.1:PORT`` with Zenoh's shared
  memory off, so the bytes cross the loopback as they would between hosts; ``shm``
  cells listen on a Unix socket (``unixsock-stream/PATH``) with Zenoh's shared memory
  on, its transport optimisation putting every payload above 3 KiB in a shared-memory
  pool (:data:`SHM_POOL` bytes, enough for two 24.9 MB frames) and only a reference on
  the socket;
* the publisher is ``RELIABLE`` with ``CongestionControl.BLOCK`` (as in
  ``examples/z_pub_thr.py``): ``put`` waits rather than drops when the link is busy;
  the receiving side blocks Zenoh's reader while it is busy, so the stream is lossless
  end to end;
* a message is one payload: ``put`` takes bytes, so the header (the wire layout of
  :mod:`._common`, its codec cached per stream) and the array's bytes are joined into
  one ``bytes`` (one copy; numpy arrays are not accepted as they are). A sample's
  ``ZBytes`` has no buffer interface in Python: ``to_bytes()`` copies it once more on
  the receiving side, and the array is a view of those bytes.

Zenoh's Python API has no asyncio integration: ``put`` is a blocking call (made on the
loop, as an asyncio program would).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Final

import zenoh

from .._worker import NewPayload, is_end, private_payload
from ._common import (
    BARE,
    PeerUnavailableError,
    Rendezvous,
    RendezvousFramework,
    StreamCodec,
    in_daemon_thread,
    run_flavoured,
    wait_until,
)

#: Samples the ``fifo`` flavour's FifoChannel holds before Zenoh's reader waits.
FIFO: Final = 256
#: Bytes of Zenoh's shared-memory pool in ``shm`` cells (default 16 MiB: too small for
#: the 24.9 MB frame, which would silently go over the socket instead).
SHM_POOL: Final = 64 * 1024 * 1024
#: Seconds a publisher waits for its subscribers to be matched.
MATCH_TIMEOUT: Final = 30.0
#: Payloads the ``callback`` flavour queues before its callback waits for the sink (or
#: relay) to take them: messages that arrive before ``consume`` starts, a relay's queue.
CALLBACK_QUEUE: Final = 256
#: Seconds the callback waits before it tries a full queue again.
QUEUE_FULL_WAIT: Final = 0.0005


@dataclass(slots=True)
class _Process:
    """The rendezvous client and the sessions of one worker process."""

    rendezvous: Rendezvous
    sessions: list[Any] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)


class _Callbacks:
    """The ``callback`` flavour's handler: runs ``handle(decode(payload))`` in Zenoh's
    thread once :meth:`consume` has given it a handle; payloads that come before (the
    warm-up may start first) or that a relay forwards wait in a bounded queue. The
    outcome of the handle reaches the event loop through a future."""

    def __init__(self) -> None:
        self.codec = StreamCodec()
        self.queue: queue.Queue[bytes] = queue.Queue(CALLBACK_QUEUE)
        self._handle: Callable[[Any], bool] | None = None
        self._finished = False
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future[None] | None = None

    def __call__(self, sample: Any) -> None:
        data = sample.payload.to_bytes()
        handle = self._handle
        if handle is not None and not self._finished:  # the stream's path
            try:
                if handle(self.codec.decode(data)):
                    self._finish(None)
            except BaseException as exc:
                self._finish(exc)
            return
        while handle is None:
            with self._lock:  # atomic with consume()'s hand-over: nothing lost or reordered
                handle = self._handle
                if handle is None:
                    with contextlib.suppress(queue.Full):
                        self.queue.put_nowait(data)
                        return
            time.sleep(QUEUE_FULL_WAIT)  # full: Zenoh's reader waits (lossless)
        if self._finished:
            return
        try:
            finished = handle(self.codec.decode(data))
        except BaseException as exc:
            self._finish(exc)
            return
        if finished:
            self._finish(None)

    def _finish(self, error: BaseException | None) -> None:
        self._finished = True
        loop, done = self._loop, self._done
        if loop is None or done is None:
            return

        def settle() -> None:
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        with contextlib.suppress(RuntimeError):  # the loop is gone: the worker is leaving
            loop.call_soon_threadsafe(settle)

    async def consume(self, handle: Callable[[Any], bool]) -> None:
        self._loop = asyncio.get_running_loop()
        self._done = self._loop.create_future()
        while True:  # what came first, in order; then the callback takes over
            with self._lock:
                try:
                    early = self.queue.get_nowait()
                except queue.Empty:
                    self._handle = handle
                    break
            if handle(self.codec.decode(early)):
                self._finished = True
                return
        await self._done


@dataclass(slots=True)
class _Subscriber:
    subscriber: Any
    #: The ``callback`` flavour's handler (None: the ``fifo`` flavour's channel).
    callbacks: _Callbacks | None
    codec: StreamCodec = field(default_factory=StreamCodec)


@dataclass(slots=True)
class _Publisher:
    publisher: Any
    codec: StreamCodec = field(default_factory=StreamCodec)


def _config(transport: str, *, listen: list[str], connect: list[str]) -> Any:
    config = zenoh.Config()
    config.insert_json5("mode", '"peer"')
    config.insert_json5("scouting/multicast/enabled", "false")
    config.insert_json5("listen/endpoints", json.dumps(listen))
    config.insert_json5("connect/endpoints", json.dumps(connect))
    shm = transport == "shm"
    config.insert_json5("transport/shared_memory/enabled", json.dumps(shm))
    if shm:
        config.insert_json5(
            "transport/shared_memory/transport_optimization/pool_size", str(SHM_POOL)
        )
    return config


def _free_port() -> int:
    """A free loopback port (Zenoh listens on it at once; the race is harmless here:
    nothing else on the machine picks ports in this range on purpose)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _key(topic: str) -> str:
    return topic.strip("/")  # a Zenoh key expression has no leading slash


class ZenohFramework(RendezvousFramework):
    """The :class:`ezflow._perf._worker.Framework` of Eclipse Zenoh (peer mode),
    ``callback`` or ``fifo``."""

    library = "zenoh"
    distribution = "eclipse-zenoh"
    flavours = ("callback", "fifo")
    #: The segments of Zenoh's shared memory (shm cells): a Python process that exits
    #: does not always run the handlers that remove them (eclipse-zenoh/zenoh#2787).
    leftovers = ("*.zenoh",)

    @contextlib.asynccontextmanager
    async def _context(self, graph: tuple[str, int]) -> AsyncIterator[_Process]:
        process = _Process(Rendezvous(graph))
        try:
            yield process
        finally:
            for session in process.sessions:
                with contextlib.suppress(Exception):
                    session.close()
            for path in process.sockets:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            await process.rendezvous.aclose()

    def context(self, graph: tuple[str, int]) -> AbstractAsyncContextManager[Any]:
        return self._context(graph)

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        if transport == "local":
            raise PeerUnavailableError("this Zenoh worker measures two processes only")
        endpoints = await ctx.rendezvous.get(topic)
        session = zenoh.open(_config(transport, listen=[], connect=endpoints))
        ctx.sessions.append(session)
        publisher = session.declare_publisher(
            _key(topic),
            congestion_control=zenoh.CongestionControl.BLOCK,
            reliability=zenoh.Reliability.RELIABLE,
        )
        # Nothing may be published before the subscriber is matched: Zenoh would drop it.
        await wait_until(
            lambda: bool(publisher.matching_status), MATCH_TIMEOUT, f"no subscriber of {topic}"
        )
        return _Publisher(publisher)

    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        if transport == "local":
            raise PeerUnavailableError("this Zenoh worker measures two processes only")
        if transport == "tcp":
            endpoint = f"tcp/127.0.0.1:{_free_port()}"
        else:
            path = os.path.join(tempfile.gettempdir(), f"ezflow-zenoh-{uuid.uuid4().hex}.sock")
            ctx.sockets.append(path)
            endpoint = f"unixsock-stream/{path}"
        session = zenoh.open(_config(transport, listen=[endpoint], connect=[]))
        ctx.sessions.append(session)
        callbacks = _Callbacks() if self.flavour == "callback" else None
        handler: Any = (
            zenoh.handlers.Callback(callbacks)
            if callbacks is not None
            else zenoh.handlers.FifoChannel(FIFO)
        )
        subscriber = session.declare_subscriber(_key(topic), handler)
        await ctx.rendezvous.put(topic, endpoint)
        return _Subscriber(subscriber, callbacks)

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        put, header = pub.publisher.put, pub.codec.header
        join: Callable[[Any], bytes] = b"".join  # (numpy arrays are buffers)

        async def publish(message: Any) -> None:
            if type(message) is tuple:
                phase, seq, t_ns, payload = message
            else:  # the array suites: a bare array
                phase, seq, t_ns, payload = BARE, 0, 0, message
            put(join((header(phase, seq, t_ns, payload), payload)))

        return publish

    def payload_function(
        self, pub: Any, transport: str, shape: tuple[int, ...], dtype: str, loan: bool
    ) -> NewPayload:
        # Zenoh's SHM buffers (ZShmMut) take bytes, not a writable array view: no loan.
        return private_payload(shape, dtype)

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        if sub.callbacks is not None:
            await sub.callbacks.consume(handle)
            return
        recv, decode = sub.subscriber.handler.recv, sub.codec.decode

        def receive() -> None:
            while not handle(decode(recv().payload.to_bytes())):
                pass

        await in_daemon_thread(receive, "zenoh-receive")

    async def relay(self, sub: Any, pub: Any) -> int:
        put, decode = pub.publisher.put, sub.codec.decode
        if sub.callbacks is not None:
            # The callback queues (no consume() installs a handle): Zenoh's API stays
            # out of it, as Zenoh requires.
            take = sub.callbacks.queue.get
        else:
            channel = sub.subscriber.handler

            def take() -> bytes:
                data: bytes = channel.recv().payload.to_bytes()
                return data

        def forward() -> int:
            forwarded = 0
            while True:
                data = take()
                put(data)
                forwarded += 1
                if is_end(decode(data)):
                    return forwarded

        return await in_daemon_thread(forward, "zenoh-relay")


if __name__ == "__main__":
    run_flavoured(ZenohFramework)
