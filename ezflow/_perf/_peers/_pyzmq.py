"""The perf worker on pyzmq 27 (``python -m ezflow._perf._peers._pyzmq``, in its venv).

What a pyzmq user writes for a lossless 1 -> 1 stream on ``zmq.asyncio`` and the stock
asyncio loop (pyzmq has no loop of its own; its I/O thread is libzmq's default one):

* a ``PUSH`` socket per publisher and a ``PULL`` socket per subscriber. PUSH never drops:
  at its high-water mark ``send`` waits, so the stream is lossless end to end. The
  high-water marks (:data:`HWM`, messages) bound the memory in flight on each side;
* the subscriber binds (``shm`` cells: an abstract-namespace ``ipc://`` endpoint, the
  same-host transport of libzmq; ``tcp``: ``tcp://127.0.0.1:*``) and registers its
  endpoint at the rendezvous of the run (:mod:`._common`); the publisher connects;
* a message is two frames, the header and the array, ``send_multipart(..., copy=False)``
  and ``recv_multipart(copy=False)``: the array goes out and comes in without a copy in
  Python, the receiver's array is a view of the zmq frame.

PUSH load-balances between PULL sockets, so one topic has one subscriber here: a
second one (the fan-out suite) makes the cell unavailable. Transport ``local`` (one
process) uses ``inproc://``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import numpy as np
import zmq
import zmq.asyncio

from .._worker import NewPayload, is_end, main, private_payload
from ._common import (
    BARE,
    PeerUnavailableError,
    Rendezvous,
    RendezvousFramework,
    decode,
    encode_header,
)

T = TypeVar("T")

#: High-water mark of every socket, in messages: PUSH waits beyond it (never drops).
#: Below libzmq's default of 1000 so that a back-to-back run of 24.9 MB frames queues
#: at most a few GB per side (the queue is counted in messages, not bytes).
HWM: Final = 100


@dataclass(slots=True)
class _Process:
    """The zmq context and the rendezvous client of one worker process."""

    context: zmq.asyncio.Context
    rendezvous: Rendezvous
    sockets: list[zmq.asyncio.Socket] = field(default_factory=list)


def _endpoint(transport: str) -> str:
    if transport == "shm":
        return f"ipc://@ezflow-perf-{uuid.uuid4().hex}"
    if transport == "tcp":
        return "tcp://127.0.0.1:*"
    return f"inproc://ezflow-perf-{uuid.uuid4().hex}"


class PyzmqFramework(RendezvousFramework):
    """The :class:`ezflow._perf._worker.Framework` of pyzmq (PUSH/PULL, zmq.asyncio)."""

    name = "pyzmq"
    distribution = "pyzmq"

    @contextlib.asynccontextmanager
    async def _context(self, graph: tuple[str, int]) -> AsyncIterator[_Process]:
        process = _Process(zmq.asyncio.Context(), Rendezvous(graph))
        try:
            yield process
        finally:
            for sock in process.sockets:
                sock.close(linger=0)
            process.context.term()
            await process.rendezvous.aclose()

    def context(self, graph: tuple[str, int]) -> AbstractAsyncContextManager[Any]:
        return self._context(graph)

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        endpoints = await ctx.rendezvous.get(topic)
        if len(endpoints) > 1:
            raise PeerUnavailableError(
                "pyzmq PUSH/PULL is one-to-one (PUSH load-balances between subscribers)"
            )
        sock = ctx.context.socket(zmq.PUSH)
        ctx.sockets.append(sock)
        sock.setsockopt(zmq.SNDHWM, HWM)
        sock.connect(endpoints[0])
        return sock

    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        sock = ctx.context.socket(zmq.PULL)
        ctx.sockets.append(sock)
        sock.setsockopt(zmq.RCVHWM, HWM)
        sock.bind(_endpoint(transport))
        await ctx.rendezvous.put(topic, sock.getsockopt_string(zmq.LAST_ENDPOINT))
        return sock

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        send = pub.send_multipart

        async def publish(message: Any) -> None:
            if type(message) is np.ndarray:  # the array suites: one bare frame
                await send([encode_header(BARE, 0, 0, message), message], copy=False)
                return
            phase, seq, t_ns, payload = message
            await send([encode_header(phase, seq, t_ns, payload), payload], copy=False)

        return publish

    def payload_function(
        self, pub: Any, transport: str, shape: tuple[int, ...], dtype: str, loan: bool
    ) -> NewPayload:
        # zmq has no buffer to lend: a private array, sent without a copy in Python.
        return private_payload(shape, dtype)

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        receive = sub.recv_multipart
        while True:
            header, payload = await receive(copy=False)
            if handle(decode(header.buffer, payload=payload.buffer)):
                return

    async def relay(self, sub: Any, pub: Any) -> int:
        receive, send = sub.recv_multipart, pub.send_multipart
        forwarded = 0
        while True:
            header, payload = await receive(copy=False)
            await send([header, payload], copy=False)
            forwarded += 1
            if is_end(decode(header.buffer, payload=payload.buffer)):
                return forwarded


if __name__ == "__main__":
    main(PyzmqFramework())
