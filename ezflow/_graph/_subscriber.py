"""Subscriber: the receiving half of the low-level API (created by GraphContext.subscriber)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from .._core import _inbox
from .._core._deprecation import warn_deprecated
from .._core._exceptions import ClosedResourceError, ConfigurationError, EndOfStream, WouldBlock
from .._core._inbox import NOTHING, Inbox, SubscriberStats

__all__ = ["Subscriber"]


class Subscriber:
    """Receives the messages of every publisher routed to its topic. Create with
    :meth:`GraphContext.subscriber`.

    A subscriber gets messages published after it was routed to their publisher (when
    ``GraphContext.subscriber`` returns, for publishers that already exist); nothing
    older is replayed. Per publisher, messages arrive in publish order; a lossless
    subscriber gets every one of them exactly once, a leaky one the newest ``queue``.

    A subscriber created with ``on_message`` queues nothing: its callback gets each
    message as it is delivered, and :meth:`recv` is refused.

    Rejoin: when its channel to a publisher is cut (the publisher's ``stall_timeout``,
    a peer declared dead by heartbeats, a broken link) while the routes still list that
    publisher, this process opens a new channel to it (once this subscriber took what
    the old one delivered) and the subscriber receives again from then on, like one
    that just joined: what was published meanwhile is not replayed. Counted in
    ``statistics().rejoins`` and logged. A cut does not end the stream.

    End of stream: once every publisher that fed it has ended (closed: ``aclose()`` or
    leaving its context; or gone: its channel was lost and the routes no longer list
    it - its process died or left the graph), no publisher that has not ended is
    routed to it, and every message was received, :meth:`recv` raises
    :class:`~ezflow.EndOfStream` and ``async for`` ends (see :attr:`ended`) - once per
    end: after that, ``recv`` waits again, for a publisher that may be routed to it
    later (a long-lived subscriber can catch ``EndOfStream`` and go on). A subscriber
    that never had a publisher keeps waiting; a publisher that is only disconnected
    (``GraphContext.disconnect``) has not ended. Routes are those this process knows:
    a publisher registered elsewhere a moment before the last one ended may come too
    late to keep the stream open.
    """

    def __init__(
        self,
        sub_id: str,
        topic: str,
        inbox: Inbox,
        transport: str | None,
        close: Callable[[Subscriber], Awaitable[None]],
    ) -> None:
        self._close = close
        self.id = sub_id
        self.topic = topic
        self._inbox = inbox
        self.transport = transport
        self._closed = False
        if inbox.callback is None:
            # recv() is the inbox's own get(), bound here: no call of ours before it,
            # one Python call fewer for every message (the method below says what it
            # does; a callback subscriber keeps it, to refuse).
            self.recv = inbox.get  # type: ignore[method-assign]

    @property
    def leaky(self) -> bool:
        return self._inbox.leaky

    @property
    def encoded(self) -> bool:
        """True for a subscriber created with ``encoded=True``: :meth:`recv`,
        :meth:`recv_nowait` and ``on_message`` get each message's encoded body, not the
        message - what a relay forwards without decoding it and encoding it again.

        The body is exactly what ``ezflow.Codec().encode(message)`` makes of the message
        (``Codec().decode(body)`` gives it back): the bytes that arrived from a tcp or
        shm publisher, not decoded in this process at all when every subscriber of that
        publisher here is an encoded one (else decoded once for the others, as ever); from
        a publisher in this process (a local edge, which carries no bytes) or an ezring
        stream, encoded here once for every encoded subscriber of it. It is ``bytes`` or
        a read-only ``memoryview``, valid for as long as it is referenced: from shm, a
        view of the publisher's shared memory, whose block is not reused until the view
        (and everything made from it) is gone - hold it as briefly as a zero-copy array.
        Flow control, release, counters, end of stream and errors are those of a
        subscriber of messages: a body is taken (and released, for a lossless one) when
        ``recv`` returns it. Bodies are not checked: one a publisher's peer garbled is
        handed over as it came (a subscriber of messages of the same publisher in this
        process gets :class:`~ezflow.UndecodableMessageError` in its place)."""
        return self._inbox.encoded

    def statistics(self) -> SubscriberStats:
        """A snapshot of this subscriber's counters (received, taken, dropped,
        undecodable, publishers ended, rejoins...): a copy taken now, which later
        deliveries do not change."""
        return dataclasses.replace(self._inbox.stats)

    @property
    def stats(self) -> SubscriberStats:
        """Deprecated (removed in the next release): use :meth:`statistics`. The live
        counters, which change as messages arrive."""
        warn_deprecated("Subscriber.stats", "Subscriber.statistics()")
        return self._inbox.stats

    @property
    def queued(self) -> int:
        """Messages waiting to be received."""
        return len(self._inbox)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ended(self) -> bool:
        """True when :meth:`recv` would raise :class:`~ezflow.EndOfStream`: every
        publisher that fed this subscriber ended, none that has not is routed to it,
        nothing is queued. Not final: a publisher routed afterwards makes it wait
        again. ``statistics().publishers_broken`` counts the publishers that went away without
        ending cleanly."""
        return self._inbox.at_end

    @property
    def had_publisher(self) -> bool:
        """True once a publisher was routed to this subscriber (ended or not)."""
        return self._inbox.had_publisher

    def recv(self) -> Coroutine[Any, Any, Any]:
        """Wait for the next message and return it (a coroutine: ``await sub.recv()``).

        Raises :class:`~ezflow.ClosedResourceError` once the subscriber (or its context)
        is closed and every queued message has been received, and
        :class:`~ezflow.EndOfStream` once every publisher that fed it has ended (cleanly,
        or by going away: see the class docstring) and every message was received -
        once; called again, it waits for a publisher routed to it later.
        Cancellation-safe: a cancelled ``recv`` takes no message.

        A message that cannot be decoded here (garbage, or a message class not
        registered in this process) is never skipped in silence: a lossless subscriber's
        ``recv`` raises :class:`~ezflow.UndecodableMessageError` (topic, publisher and
        the codec's reason) in that message's place, and the next ``recv`` goes on with
        the message after it; a leaky subscriber counts it as dropped
        (``statistics()``: ``undecodable``, ``dropped``) and logs it, rate-limited.
        """
        # (Bound to the inbox's own get() in __init__, unless the inbox has a callback:
        # its coroutine, not one wrapped in another or behind a call of ours.)
        inbox = self._inbox
        if inbox._callback is not None:
            raise self._nothing_to_recv()
        return inbox.get()

    def recv_nowait(self) -> Any:
        """Return the next queued message; raise :class:`~ezflow.WouldBlock` when there
        is none (an ``asyncio.QueueEmpty`` too, for code written before it existed),
        :class:`~ezflow.EndOfStream` at the end (once, as :meth:`recv`),
        :class:`~ezflow.ClosedResourceError` once closed and empty, and
        :class:`~ezflow.UndecodableMessageError` as :meth:`recv` does."""
        take = _inbox.take_queued
        if take is not None:
            # (The compiled take recv() starts with, or NOTHING: get_nowait decides.)
            message = take(self._inbox)
            if message is not NOTHING:
                return message
        try:
            return self._inbox.get_nowait()
        except IndexError:
            if self._inbox.callback is not None:
                raise self._nothing_to_recv() from None
            if self._closed:
                raise ClosedResourceError("this subscriber is closed") from None
            if self._inbox.tell_end():
                raise self._inbox.end_of_stream() from None
            raise WouldBlock(
                f"subscriber {self.id} on topic {self.topic!r} has no message queued; "
                "await recv() to wait for one"
            ) from None

    def _nothing_to_recv(self) -> ConfigurationError:
        """The error of recv() on a callback (``on_message``) subscriber."""
        return ConfigurationError(
            f"subscriber {self.id} on topic {self.topic!r} hands every message to its "
            "on_message callback, so there is nothing to recv(); create it without "
            "on_message to receive with recv() or async for"
        )

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.recv()
        except (ClosedResourceError, EndOfStream):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        """Stop receiving and remove the registration. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._inbox.close()
        await self._close(self)

    async def __aenter__(self) -> Subscriber:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
