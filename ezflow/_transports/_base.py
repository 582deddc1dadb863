"""The interface every transport implements, and what the transport set gives each one.

A transport is a class with a :attr:`Transport.name`, listed once in
:mod:`._registry`. The graph layer never names one: it calls the
:class:`~._set.TransportSet`, which asks each registered transport whether it
:meth:`~Transport.reaches` a publisher, opens channels on the chosen one, and hands
publishers (:class:`~ezflow._core._outlet.Outlet`) to every transport. Only
:meth:`~Transport.add_outlet`, :meth:`~Transport.remove_outlet`,
:meth:`~Transport.open_channel` and :meth:`~Transport.aclose` must be written; the rest
has defaults that suit a transport with nothing to advertise (docs/architecture.md,
"Adding a transport", shows one in 25 lines).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from .._core._auth import Credentials
from .._core._channel import Channel
from .._core._codec import Codec
from .._core._outlet import Outlet
from .._core._protocol import PublisherInfo

if TYPE_CHECKING:  # numpy.typing costs ~15 ms to import; annotations only
    import numpy as np

__all__ = ["Inbound", "Loans", "Transport", "TransportSettings"]

StatsT_co = TypeVar("StatsT_co", covariant=True)


class Inbound(ABC):
    """The subscriber-side end of one publisher -> channel connection."""

    transport: ClassVar[str]

    @abstractmethod
    def close(self) -> None:
        """Disconnect from the publisher (idempotent). Messages already delivered to
        inboxes stay there."""


@dataclass(frozen=True, slots=True)
class TransportSettings:
    """What a :class:`~._set.TransportSet` knows when it makes its transports: one
    context's settings (see :meth:`Transport.from_settings`)."""

    #: the host this process reaches the graph server from (data servers bind it)
    host: str
    #: this host's id (``GraphClient.host_id``): publishers with the same one are here
    host_id: str
    #: the largest message this process sends and accepts
    max_message_size: int
    #: the context's codec
    codec: Codec
    #: token and TLS settings of the graph
    credentials: Credentials


class Loans(Protocol[StatsT_co]):
    """What a transport offers one publisher beyond sending: buffers in its memory that
    the publisher fills in place (``Publisher.loan``), and counters of that memory.
    Returned by :meth:`Transport.loans`."""

    def loan(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any] | None:
        """A writable array of *shape* and *dtype* in the transport's memory, or
        ``None`` when none can be had now (the caller uses a private array)."""

    def spend(self, message: Any) -> None:
        """*message* was published: every loaned array in it is spent (read-only)."""

    def stats(self) -> StatsT_co | None:
        """A snapshot of the publisher's counters, or ``None`` once it is removed."""


class Transport(ABC):
    """One way of moving messages between an outlet and a channel."""

    #: the name users force it by (``transport="..."``), shown in ``ChannelInfo``
    name: ClassVar[str]
    #: true for a transport that alone carries the publishers it reaches (an ezring
    #: ring is read from shared memory, whatever a subscriber asked for); such a
    #: transport cannot be forced by name
    exclusive: ClassVar[bool] = False
    #: why a forced choice of this transport cannot work for an edge it does not
    #: reach, for the warning logged then ("transport 'x' asked for a -> b, but ...")
    unreachable: ClassVar[str] = "it cannot reach the publisher"
    #: the transport that takes over an edge whose channel could not open on this one
    #: (the publisher's edges to this process use it from then on), or None: retried
    fallback: ClassVar[str | None] = None
    #: what the fall-back warning calls this transport ("cannot use <label> for ...")
    label: ClassVar[str] = ""

    @classmethod
    def available(cls) -> bool:
        """Whether the transport can work in this process (may block: probes run in a
        worker thread). A transport that cannot is left out of the set."""
        return True

    @classmethod
    def from_settings(cls, settings: TransportSettings) -> Transport:
        """The transport of a context with *settings*."""
        return cls()

    def reaches(self, publisher: PublisherInfo, host_id: str) -> bool:
        """Whether an edge from *publisher* to a channel of this process (on host
        *host_id*) can use this transport."""
        return True

    async def advertise(self, *, optional: bool = True) -> dict[str, Any]:
        """Start serving this process's publishers if needed; return the fields that a
        publisher's registration carries so that other processes can reach it (``{}``:
        none). With *optional* false, only fields the registration requires."""
        return {}

    @abstractmethod
    def add_outlet(self, outlet: Outlet, options: Any = None) -> None:
        """Make *outlet* reachable by channels through this transport. *options*: the
        publisher's options for this transport (``publisher(shm=...)``), or None."""

    @abstractmethod
    def remove_outlet(self, outlet: Outlet) -> None:
        """Stop accepting new channels for *outlet* (links already open are closed by
        ``Outlet.close``)."""

    def loans(self, outlet: Outlet) -> Loans[Any] | None:
        """The loans this transport offers *outlet*, or ``None`` (the default)."""
        return None

    async def wait_closed(self, outlet: Outlet) -> None:
        """After ``outlet.close()``: return once every channel it fed through this
        transport has read up to its end (bounded); at once by default."""
        return

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
