"""The perf worker on Eclipse Zenoh 1.10 (``python -m ezflow._perf._peers._zenoh``).

What a Zenoh user writes for a lossless 1 -> 1 stream between two processes of one host,
with no router and no discovery traffic:

* one session per publisher and per subscriber, in ``peer`` mode with multicast
  scouting off (``scouting/multicast/enabled=false``) and explicit endpoints: the
  subscriber's session listens, the publisher's connects to what the subscriber
  registered at the run's rendezvous (:mod:`._common`). ``tcp`` cells listen on
  ``tcp/127.0.0.1:PORT`` with Zenoh's shared memory off, so the bytes cross the
  loopback as they would between hosts; ``shm`` cells listen on a Unix socket
  (``unixsock-stream/PATH``) with Zenoh's shared memory on, as it is by default, its
  transport optimisation putting every payload above 3 KiB in a shared-memory pool
  (:data:`SHM_POOL` bytes, enough for two 24.9 MB frames) and only a reference on the
  socket;
* the publisher is ``RELIABLE`` with ``CongestionControl.BLOCK``: ``put`` waits rather
  than drops when the link is busy; the subscriber's handler is a bounded
  ``FifoChannel`` (:data:`FIFO`), which blocks Zenoh's reader when full, so the stream
  is lossless end to end;
* a message is one payload: ``put`` takes bytes, so the header and the array are
  copied into one ``bytearray`` (one copy; numpy arrays are not accepted as they are).
  A sample's ``ZBytes`` has no buffer interface in Python: ``to_bytes()`` copies it
  once more on the receiving side, and the array is a view of those bytes.

Zenoh's Python API has no asyncio integration: ``put`` is a blocking call (made on the
loop, as an asyncio program would), and the sink receives with the blocking
``Handler.recv`` in a daemon thread, as a Zenoh program does, calling ``handle`` there
(the event loop stays free for the worker's commands).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, TypeVar

import numpy as np
import zenoh

from .._worker import NewPayload, is_end, main, private_payload
from ._common import (
    BARE,
    PeerUnavailableError,
    Rendezvous,
    RendezvousFramework,
    decode,
    encode_header,
    wait_until,
)

T = TypeVar("T")

#: Samples the subscriber's FifoChannel holds before Zenoh's reader waits.
FIFO: Final = 256
#: Bytes of Zenoh's shared-memory pool in ``shm`` cells (default 16 MiB: too small for
#: the 24.9 MB frame, which would silently go over the socket instead).
SHM_POOL: Final = 64 * 1024 * 1024
#: Seconds a publisher waits for its subscribers to be matched.
MATCH_TIMEOUT: Final = 30.0


@dataclass(slots=True)
class _Process:
    """The rendezvous client and the sessions of one worker process."""

    rendezvous: Rendezvous
    sessions: list[Any] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)


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


class _Subscriber:
    """A Zenoh subscriber and its FifoChannel."""

    def __init__(self, subscriber: Any) -> None:
        self.subscriber = subscriber


class ZenohFramework(RendezvousFramework):
    """The :class:`ezflow._perf._worker.Framework` of Eclipse Zenoh (peer mode)."""

    name = "zenoh"
    distribution = "eclipse-zenoh"

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
        return publisher

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
        subscriber = session.declare_subscriber(_key(topic), zenoh.handlers.FifoChannel(FIFO))
        await ctx.rendezvous.put(topic, endpoint)
        return _Subscriber(subscriber)

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        put = pub.put
        frombuffer, uint8 = np.frombuffer, np.uint8

        async def publish(message: Any) -> None:
            if type(message) is np.ndarray:
                phase, seq, t_ns, payload = BARE, 0, 0, message
            else:
                phase, seq, t_ns, payload = message
            header = encode_header(phase, seq, t_ns, payload)
            buffer = bytearray(len(header) + payload.nbytes)
            buffer[: len(header)] = header
            frombuffer(buffer, uint8, offset=len(header))[:] = payload.reshape(-1).view(uint8)
            put(buffer)

        return publish

    def payload_function(
        self, pub: Any, transport: str, shape: tuple[int, ...], dtype: str, loan: bool
    ) -> NewPayload:
        # Zenoh's SHM buffers (ZShmMut) take bytes, not a writable array view: no loan.
        return private_payload(shape, dtype)

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        channel = sub.subscriber.handler

        def receive() -> None:
            recv = channel.recv
            while not handle(decode(recv().payload.to_bytes())):
                pass

        await _in_daemon_thread(receive)

    async def relay(self, sub: Any, pub: Any) -> int:
        channel, put = sub.subscriber.handler, pub.put

        def forward() -> int:
            forwarded = 0
            while True:
                data = channel.recv().payload.to_bytes()
                put(data)
                forwarded += 1
                if is_end(decode(data)):
                    return forwarded

        return await _in_daemon_thread(forward)


async def _in_daemon_thread(work: Callable[[], T]) -> T:
    """Run the blocking *work* in a daemon thread; its result or exception. A daemon
    thread (not ``asyncio.to_thread``): a worker told to leave while it blocks in
    ``recv`` must still exit."""
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

    threading.Thread(target=target, name="zenoh-receive", daemon=True).start()
    return await done


if __name__ == "__main__":
    main(ZenohFramework())
