"""Publisher: the sending half of the low-level API (created by GraphContext.publisher)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core._codec import EncodedMessage
from .._core._deprecation import warn_deprecated
from .._core._exceptions import ClosedResourceError
from .._core._outlet import Outlet, PublisherStats
from .._transports import Loans, ShmStats
from .._transports._stream_publish import publish_small as _publish_small

if TYPE_CHECKING:  # numpy.typing costs ~15 ms to import; annotations only
    from numpy.typing import DTypeLike

__all__ = ["Publisher"]


class Publisher:
    """Publishes messages on one topic. Create with :meth:`GraphContext.publisher`.

    Messages are delivered to each subscriber in publish order. Do not mutate an object
    after publishing it: the local transport hands subscribers the object itself (arrays
    as read-only views) and tcp may still be sending its buffers. For large arrays,
    :meth:`loan` a buffer in shared memory, fill it, and publish it without any copy.
    """

    def __init__(
        self,
        outlet: Outlet,
        loans: Loans[ShmStats] | None,
        close: Callable[[Publisher], Awaitable[None]],
    ) -> None:
        self._outlet = outlet
        #: the loans its transports offer it (shared memory), or None
        self._loans = loans
        self._close = close
        self._closed = False
        self._loaned = False

    @property
    def id(self) -> str:
        return self._outlet.publisher_id

    @property
    def topic(self) -> str:
        return self._outlet.topic

    def statistics(self) -> PublisherStats:
        """A snapshot of this publisher's counters (messages, bytes, encodes, drops, time
        spent waiting...): a copy taken now, which later publishing does not change."""
        return dataclasses.replace(self._outlet.stats)

    def shm_statistics(self) -> ShmStats | None:
        """A snapshot of this publisher's shared-memory counters (``None`` when this
        process cannot use shared memory)."""
        loans = self._loans
        return None if loans is None else loans.stats()

    @property
    def stats(self) -> PublisherStats:
        """Deprecated (removed in the next release): use :meth:`statistics`. The live
        counters, which change as the publisher works."""
        warn_deprecated("Publisher.stats", "Publisher.statistics()")
        return self._outlet.stats

    @property
    def shm_stats(self) -> ShmStats | None:
        """Deprecated (removed in the next release): use :meth:`shm_statistics`."""
        warn_deprecated("Publisher.shm_stats", "Publisher.shm_statistics()")
        return self.shm_statistics()

    @property
    def channels(self) -> int:
        """Channels (one per subscribing process and transport) connected right now."""
        return len(self._outlet.links)

    @property
    def in_flight(self) -> int:
        """Messages sent on its lossless channels and not released by them yet, on the
        channel furthest behind (0 when every subscriber took everything)."""
        return max((link.in_flight for link in self._outlet.links if link.lossless), default=0)

    @property
    def closed(self) -> bool:
        return self._closed

    async def publish(self, message: Any) -> None:
        """Send *message* to every subscriber routed to this publisher.

        Lossless (default) subscribers: waits while the slowest one is ``max_in_flight``
        messages behind. Leaky subscribers never make this wait. Raises
        :class:`~ezflow.UnregisteredTypeError` (a ``TypeError``) for a message the codec
        cannot encode, :class:`~ezflow.MessageTooLargeError` above ``max_message_size``,
        :class:`~ezflow.ClosedResourceError` after :meth:`aclose` — each before anything
        was sent. When cancelled while waiting, nothing was sent.

        A loaned array (:meth:`loan`) - the message itself, or anywhere inside its
        tuples, lists, dicts and dataclasses - is sent to shm subscribers without being
        copied (see :meth:`loan` for when it is), and is read-only from then on, whoever
        the message went to.
        """
        outlet = self._outlet
        # (one call on the common path of a small message; else the general one)
        if (_publish_small is None or not _publish_small(outlet, message)) and not (
            outlet.publish_nowait(message)
        ):
            await outlet.publish(message)
        if self._loaned:
            loans = self._loans
            if loans is not None:
                loans.spend(message)

    async def publish_encoded(self, message: Any, body: bytes | memoryview) -> None:
        """:meth:`publish` *message* whose ezflow codec body is *body* already - what
        ``Codec().encode(message)`` would produce, as a relay that received the message
        encoded (the Zenoh bridge) has it: subscribers on tcp and shm get *body* as it
        is (it is not encoded again), same-process ones *message*. Waits, raises and
        counts as :meth:`publish`."""
        await self._outlet.publish(message, EncodedMessage([body], len(body)))

    async def publish_encoded_many(
        self, messages: Sequence[Any], bodies: Sequence[bytes | memoryview]
    ) -> None:
        """:meth:`publish_encoded` each of *messages* with its body in *bodies* (one per
        message, in order), in fewer steps: one check for room (and wait) per run of
        messages instead of a coroutine and a check each - what a relay that receives
        messages in batches (the Zenoh bridge) saves per message. Sends the same frames
        and counts the same as calling :meth:`publish_encoded` for each in turn, waits
        where that would (a lossless subscriber's window is never exceeded).

        Raises ``ValueError`` when the two differ in length and ``TypeError`` for a body
        that is not ``bytes``, ``bytearray`` or ``memoryview`` (nothing sent);
        :class:`~ezflow.ClosedResourceError` and :class:`~ezflow.MessageTooLargeError`
        naming the index of the message concerned: those before it were published, it
        and those after it not. Cancelled while waiting, the messages before the wait
        were published and the rest not (``statistics().messages`` counts them)."""
        await self._outlet.publish_encoded_many(messages, bodies)

    async def loan(
        self, shape: int | tuple[int, ...], dtype: DTypeLike = np.uint8
    ) -> np.ndarray[Any, Any]:
        """A writable, uninitialised C-contiguous array of *shape* and *dtype* that lives
        in this publisher's shared memory; fill it in place, then :meth:`publish` it.

        Waits first, as :meth:`publish` would, while a lossless subscriber's window is
        full, so that a buffer is taken (and filled) only once it can be sent; a
        cancelled ``loan`` has taken nothing.

        Publishing that very array, or a message holding it anywhere in its tuples,
        lists, dicts and registered dataclasses (``("frame", seq, t_ns, array)``),
        copies none of its bytes for shm subscribers: the rest of the encoded message is
        written into room kept free around the array's data (``SHM_LOAN_ROOM`` bytes on
        each side), the block goes to them as it is, and they receive read-only views of
        the same memory (tcp and local subscribers get it as any array). When the rest
        of the message does not fit that room (other large buffers), or the message
        holds a view of the array rather than the array, it is copied as any message
        (counted in ``shm_statistics().loans_copied``). After ``publish`` the array is
        read-only; the memory stays valid (and unchanged) for as long as the array or
        any view of it - here or in a subscriber - is alive. An array never published is
        simply dropped.

        When shared memory cannot be used (not Linux, no ``/dev/shm``) or every block is
        leased, the loan is a private array instead (counted in
        ``shm_statistics().loan_fallbacks``): publishing it then copies as usual. Raises
        :class:`~ezflow.UnregisteredTypeError` for a dtype that cannot travel (objects),
        ``ValueError`` for a bad shape, :class:`~ezflow.MessageTooLargeError` above
        ``max_message_size``, :class:`~ezflow.ClosedResourceError` after
        :meth:`aclose`.
        """
        if self._closed:
            raise ClosedResourceError("publisher is closed")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dt = np.dtype(dtype)
        await self._outlet.wait_for_room()
        loans = self._loans
        array = None
        if loans is not None:
            array = loans.loan(shape, dt)
        else:
            # Same checks as a shared-memory loan, so that code behaves alike everywhere.
            self._outlet.codec._array_prefix(shape, dt)
        if array is None:
            return np.empty(shape, dt)
        self._loaned = True
        return array

    async def wait_for_channels(self, count: int = 1) -> None:
        """Wait until at least *count* channels are connected (for start-up ordering
        when subscribers may register after this publisher)."""
        await self._outlet.wait_for_links(count)

    async def aclose(self) -> None:
        """Close: every channel sees a clean end after the messages already published
        (nothing accepted is dropped), and the registration is removed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._close(self)

    async def __aenter__(self) -> Publisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
