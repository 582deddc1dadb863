"""The perf worker on iceoryx2 0.10 (``python -m ezflow._perf._peers._iceoryx2``).

What an iceoryx2 user writes for a lossless 1 -> 1 stream of variable-size messages
between two processes of one host (iceoryx2 is shared memory only: ``tcp`` cells are
unavailable; it needs no broker, so the run's rendezvous is not used), following the
Python examples of the iceoryx2 repository (``examples/python/publish_subscribe`` and
``examples/python/event_based_communication``) and its bindings' own helpers
(``iceoryx2/publish_subscribe_extensions.py``: ``send_copy`` and ``write_payload`` copy
into the loaned sample with ``ctypes.memmove`` to ``payload_ptr``):

* one node per process; per topic a ``publish_subscribe`` service of ``Slice[c_uint8]``
  (dynamic size; the publisher's data segment grows by powers of two as larger samples
  are loaned) with safe overflow **off** and a subscriber buffer of :data:`BUFFER`
  samples; the publisher's backpressure strategy is ``RetryUntilDelivered``: ``send``
  waits for room instead of dropping, so the stream is lossless;
* wake-ups through an ``event`` service of the same name, as in the event-based
  example: the publisher notifies after each sample, the subscriber drains every
  sample it has and then waits on its ``Listener`` (``timed_wait``), no polling. The
  sink is a coroutine on the stock loop: it lets the loop run (the worker's commands)
  at most every :data:`YIELD_EVERY` seconds, not after every wake-up;
* a message is one sample: ``loan_slice_uninit`` of the header (the wire layout of
  :mod:`._common`, its codec cached per stream) and the array, both written into the
  loan through ``payload_ptr`` with ``ctypes.memmove`` (a small message as one joined
  ``bytes``, a large one as the header and then straight from the array's memory):
  iceoryx2's "copied" publish. With ``loan`` (``payload_function``) the source fills
  the array inside the loaned sample itself and ``publish`` only writes the header:
  iceoryx2's zero-copy publish. The subscriber's array is a view of the sample in
  shared memory (a ``ctypes`` array at ``payload_ptr``), released when ``handle``
  returns.

The bindings are synchronous: ``send`` and ``timed_wait`` block the calling thread. The
sink waits at most :data:`WAIT` seconds at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import iceoryx2 as iox2
import numpy as np

from .._worker import NewPayload, is_end, private_payload
from ._common import (
    BARE,
    PeerUnavailableError,
    RendezvousFramework,
    StreamCodec,
    header_size,
    run_flavoured,
)

T = TypeVar("T")

#: Samples a subscriber buffers before the publisher's ``send`` waits.
BUFFER: Final = 16
#: The publisher's first data-segment size hint, in bytes (it grows on demand).
INITIAL_SLICE: Final = 4096
#: Longest blocking wait of the sink before it lets the event loop run, in seconds.
WAIT: Final = 0.05
#: Longest time the sink keeps the event loop waiting while samples flow, in seconds.
YIELD_EVERY: Final = 0.02
#: Messages up to this many bytes are joined with their header and copied with one
#: ``memmove``; larger ones are copied from the array's memory (no joined copy).
JOIN_LIMIT: Final = 4096


@dataclass(slots=True)
class _Process:
    """The iceoryx2 node of one worker process and what it created (deleted at exit)."""

    node: Any
    ports: list[Any] = field(default_factory=list)


@dataclass(slots=True)
class _Publisher:
    publisher: Any
    notifier: Any
    #: The array lent by the last ``payload_function`` call and its sample.
    lent: tuple[Any, Any] | None = None
    codec: StreamCodec = field(default_factory=StreamCodec)


@dataclass(slots=True)
class _Subscriber:
    subscriber: Any
    listener: Any
    codec: StreamCodec = field(default_factory=StreamCodec)


class _Addresses:
    """The address of an array's memory, remembered for the last array (the ordinary
    program publishes the same array every time; ``ndarray.ctypes`` costs a
    microsecond)."""

    __slots__ = ("_address", "_array")

    def __init__(self) -> None:
        self._array: Any = None
        self._address = 0

    def __call__(self, array: Any) -> int:
        if array is not self._array:
            self._array, self._address = array, int(array.ctypes.data)
        return self._address


class _Views:
    """A ``ctypes`` byte array over shared memory at an address (the array types cached
    per length), for the codec to read a sample without copying it."""

    __slots__ = ("_types",)

    def __init__(self) -> None:
        self._types: dict[int, Any] = {}

    def __call__(self, address: int, length: int) -> Any:
        kind = self._types.get(length)
        if kind is None:
            kind = self._types[length] = ctypes.c_uint8 * length
        return kind.from_address(address)


def _service_name(topic: str) -> Any:
    return iox2.ServiceName.new(f"ezflow-perf{topic}")


class Iceoryx2Framework(RendezvousFramework):
    """The :class:`ezflow._perf._worker.Framework` of iceoryx2 (publish-subscribe +
    event services, ``ServiceType.Ipc``)."""

    library = "iceoryx2"
    distribution = "iceoryx2"

    @contextlib.asynccontextmanager
    async def _context(self, graph: tuple[str, int]) -> AsyncIterator[_Process]:
        iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
        process = _Process(iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc))
        try:
            yield process
        finally:
            # Ports newest first, each owning shared memory, then the node. Service
            # factories and the node have no delete(): they go with their last reference.
            for port in reversed(process.ports):
                delete = getattr(port, "delete", None)
                if delete is not None:
                    delete()
            process.ports.clear()
            process.node = None

    def context(self, graph: tuple[str, int]) -> AbstractAsyncContextManager[Any]:
        return self._context(graph)

    def _services(self, ctx: _Process, topic: str, transport: str) -> tuple[Any, Any]:
        if transport == "tcp":
            raise PeerUnavailableError("iceoryx2 is shared memory on one host: no tcp")
        name = _service_name(topic)
        data = (
            ctx.node.service_builder(name)
            .publish_subscribe(iox2.Slice[ctypes.c_uint8])
            .enable_safe_overflow(False)
            .subscriber_max_buffer_size(BUFFER)
            .open_or_create()
        )
        event = ctx.node.service_builder(name).event().open_or_create()
        ctx.ports += [data, event]
        return data, event

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        data, event = self._services(ctx, topic, transport)
        publisher = (
            data.publisher_builder()
            .initial_max_slice_len(INITIAL_SLICE)
            .allocation_strategy(iox2.AllocationStrategy.PowerOfTwo)
            .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered)
            .create()
        )
        notifier = event.notifier_builder().create()
        ctx.ports += [publisher, notifier]
        return _Publisher(publisher, notifier)

    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        data, event = self._services(ctx, topic, transport)
        subscriber = data.subscriber_builder().buffer_size(BUFFER).create()
        listener = event.listener_builder().create()
        ctx.ports += [subscriber, listener]
        return _Subscriber(subscriber, listener)

    def publish_function(self, pub: Any) -> Callable[[Any], Awaitable[None]]:
        send = self._send_function(pub)

        async def publish(message: Any) -> None:
            send(message)

        return publish

    def _send_function(self, pub: _Publisher) -> Callable[[Any], None]:
        """Send one message (blocks while the subscriber's buffer is full)."""
        loan, notify, header = (
            pub.publisher.loan_slice_uninit,
            pub.notifier.notify,
            pub.codec.header,
        )
        memmove = ctypes.memmove
        join: Callable[[Any], bytes] = b"".join  # (numpy arrays are buffers)
        address = _Addresses()

        def send(message: Any) -> None:
            if type(message) is np.ndarray:
                phase, seq, t_ns, payload = BARE, 0, 0, message
            else:
                phase, seq, t_ns, payload = message
            head = header(phase, seq, t_ns, payload)
            lent = pub.lent
            if lent is not None and lent[0] is payload:  # filled in place: no copy
                pub.lent = None
                sample = lent[1]
                memmove(sample.payload_ptr, head, len(head))
            else:
                nbytes = payload.nbytes
                sample = loan(len(head) + nbytes)
                if nbytes <= JOIN_LIMIT:
                    memmove(sample.payload_ptr, join((head, payload)), len(head) + nbytes)
                else:
                    pointer = sample.payload_ptr
                    memmove(pointer, head, len(head))
                    memmove(pointer + len(head), address(payload), nbytes)
            sample.assume_init().send()
            notify()

        return send

    def payload_function(
        self, pub: Any, transport: str, shape: tuple[int, ...], dtype: str, loan: bool
    ) -> NewPayload:
        if not loan:
            return private_payload(shape, dtype)
        kind = np.dtype(dtype)
        offset = header_size(len(shape))
        nbytes = math.prod(shape) * kind.itemsize
        lend = pub.publisher.loan_slice_uninit

        views = _Views()

        async def lent() -> Any:
            sample = lend(offset + nbytes)
            memory = views(sample.payload_ptr, offset + nbytes)
            array = np.frombuffer(memory, kind, nbytes // kind.itemsize, offset)
            array = array.reshape(shape)
            pub.lent = (array, sample)
            return array

        return lent

    async def consume(self, sub: Any, handle: Callable[[Any], bool]) -> None:
        receive, wait = sub.subscriber.receive, sub.listener.timed_wait
        timeout = iox2.Duration.from_secs_f64(WAIT)
        decode, views, clock = sub.codec.decode, _Views(), time.monotonic
        yielded, received = clock(), 0
        while True:
            sample = receive()
            if sample is None:
                wait(timeout)
            else:
                view = views(sample.payload_ptr, sample.header.number_of_elements)
                done = handle(decode(view))
                sample.delete()  # back to the publisher at once: the array is not kept
                if done:
                    return
                received += 1
                if received % 256:
                    continue
            if clock() - yielded > YIELD_EVERY:  # the worker's commands, in batches
                await asyncio.sleep(0)
                yielded = clock()

    async def relay(self, sub: Any, pub: Any) -> int:
        send = self._send_function(pub)
        forwarded = [0]

        def forward(message: Any) -> bool:
            send(message)  # copied into a new sample before this one is released
            forwarded[0] += 1
            return is_end(message)

        await self.consume(sub, forward)
        return forwarded[0]


if __name__ == "__main__":
    run_flavoured(Iceoryx2Framework)
