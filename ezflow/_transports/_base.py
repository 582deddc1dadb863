"""The interface every transport implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from .._core._channel import Channel
from .._core._outlet import Outlet
from .._core._protocol import PublisherInfo

__all__ = ["Inbound", "Transport"]


class Inbound(ABC):
    """The subscriber-side end of one publisher -> channel connection."""

    transport: ClassVar[str]

    @abstractmethod
    def close(self) -> None:
        """Disconnect from the publisher (idempotent). Messages already delivered to
        inboxes stay there."""


class Transport(ABC):
    """One way of moving messages between an outlet and a channel."""

    name: ClassVar[str]

    @abstractmethod
    def add_outlet(self, outlet: Outlet) -> None:
        """Make *outlet* reachable by channels through this transport."""

    @abstractmethod
    def remove_outlet(self, outlet: Outlet) -> None:
        """Stop accepting new channels for *outlet* (links already open are closed by
        ``Outlet.close``)."""

    @abstractmethod
    async def open_channel(
        self, channel: Channel, publisher: PublisherInfo, *, on_lost: Callable[[], None]
    ) -> Inbound:
        """Connect *channel* to *publisher*; return once messages published from now on
        will reach it. *on_lost* is called if the publisher goes away before
        :meth:`Inbound.close` is called: after ``channel.end()`` for a clean end, else
        (the connection broke) after ``channel.lost(reason)`` when the transport can
        say how.

        Raises :class:`~ezflow.BrokenResourceError` when the publisher cannot be reached,
        :class:`~ezflow.EzflowTimeoutError` when it does not answer in time.
        """

    @abstractmethod
    async def aclose(self) -> None:
        """Release every resource of the transport (listening sockets, ...)."""
