"""The perf worker on ezmsg 3.9.0's public API (``python -m ezflow._perf._peers._ezmsg``).

The runner starts this module, in the venv ``ezflow perf peers --install`` makes for it
(:mod:`._install`), exactly as it starts ezflow's own workers (``graph`` | ``units
SPEC`` | ``info``), so both frameworks run the same sources, relays and sinks
(:mod:`ezflow._perf._worker`), in the same process layout, with the same messages; only
the pub/sub calls differ.

What is ezmsg's here (all public, ``import ezmsg.core as ez``):

* ``ez.GraphServer`` (a thread) started on a free loopback port, the graph server;
* ``ez.GraphContext(address, auto_start=False)`` per process, the low-level client
  API the Unit runtime itself is built on;
* ``ctx.publisher(topic, force_tcp=..., allow_local=...)`` and ``Publisher.broadcast``;
  transport ``tcp`` is ``force_tcp=True``; ``shm`` is ezmsg's default between processes
  (``allow_local=False`` so that nothing takes the in-process path); ``local`` is its
  in-process fast path (``allow_local=True``, every unit in one process);
* ``ctx.subscriber(topic)`` and ``Subscriber.recv_zero_copy()``, what ezmsg Units use
  to call their subscriber methods (``recv()`` would add a deep copy per message).

A p2p message, the ``(phase, seq, t_ns, payload)`` tuple, is broadcast as it is: ezmsg
pickles it (protocol 5, the array out of band into its shared memory, or onto its
socket for tcp), as it does for any message of an ezmsg Unit.

ezmsg runs on the stock asyncio event loop, as ``ez.run`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import ezmsg.core as ez

from .._worker import NewPayload, is_end, main, private_payload

T = TypeVar("T")


class EzmsgFramework:
    """The :class:`ezflow._perf._worker.Framework` of ezmsg."""

    name = "ezmsg"
    unavailable: tuple[type[Exception], ...] = ()

    def version(self) -> str:
        return importlib.metadata.version("ezmsg")

    def loop_name(self) -> str:
        return "asyncio"

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(main)

    @contextlib.asynccontextmanager
    async def graph_server(self) -> AsyncIterator[tuple[str, int]]:
        server = ez.GraphServer()
        server.start(("127.0.0.1", 0))
        try:
            yield (str(server.address.host), int(server.address.port))
        finally:
            server.stop()

    def context(self, graph: tuple[str, int]) -> AbstractAsyncContextManager[Any]:
        context: AbstractAsyncContextManager[Any] = ez.GraphContext(graph, auto_start=False)
        return context

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        return await ctx.publisher(
            topic, force_tcp=transport == "tcp", allow_local=transport == "local"
        )

    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        return await ctx.subscriber(topic)

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        broadcast: Callable[[Any], Awaitable[None]] = pub.broadcast
        return broadcast

    def payload_function(
        self, pub: Any, transport: str, shape: tuple[int, ...], dtype: str, loan: bool
    ) -> NewPayload:
        return private_payload(shape, dtype)  # nothing to lend either

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        receive = sub.recv_zero_copy
        while True:
            async with receive() as message:
                if handle(message):
                    return

    async def relay(self, sub: Any, pub: Any) -> int:
        receive, broadcast = sub.recv_zero_copy, pub.broadcast
        forwarded = 0
        while True:
            async with receive() as message:
                await broadcast(message)
                forwarded += 1
                if is_end(message):
                    return forwarded


if __name__ == "__main__":
    main(EzmsgFramework())
