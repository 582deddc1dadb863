"""TransportSet: the transports of one GraphContext, as the graph layer sees them.

The graph layer never names a transport. It makes one set per context
(:meth:`TransportSet.create`: every registered transport that is available here), and
asks it

* which transport an edge uses (:meth:`~TransportSet.choose`): an exclusive transport
  that reaches the publisher (an ezring ring); else the one forced by name (subscriber,
  then publisher, then ``EZFLOW_TRANSPORT``) if it reaches the publisher; else the first
  registered one that does (local, shm, tcp). A forced choice that cannot work is
  logged once per edge, naming why;
* what to do when a channel cannot open (:meth:`~TransportSet.fall_back`): a transport
  with a ``fallback`` (shm -> tcp) hands that publisher's edges to it from then on,
  logged once;
* a transport by name (:meth:`~TransportSet.get`), where this process's publishers are
  (:meth:`~TransportSet.advertise`), to add and remove publishers
  (:meth:`~TransportSet.add_outlet`, ...), their loans (:meth:`~TransportSet.loans`),
  and to close them all (:meth:`~TransportSet.aclose`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from .._core._exceptions import ConfigurationError, EzflowError
from .._core._outlet import Outlet
from .._core._protocol import PublisherInfo
from . import _registry
from ._base import Loans, Transport, TransportSettings

__all__ = ["TransportSet"]

# The choice of an edge is the context's business: logged as it always was.
log = logging.getLogger("ezflow.context")

T = TypeVar("T", bound=Transport)


class TransportSet:
    """The transports of one context, in order of preference (see the module)."""

    def __init__(
        self,
        transports: Iterable[Transport],
        *,
        host_id: str,
        registered: Sequence[type[Transport]] | None = None,
    ) -> None:
        """*transports* in order of preference; *host_id*: this host's (publishers
        with the same are on this host); *registered*: every transport class known,
        available here or not (default: the registry's), for what a warning says."""
        self._transports = tuple(transports)
        self._by_name = {transport.name: transport for transport in self._transports}
        if len(self._by_name) != len(self._transports):
            raise ValueError("two transports of a set have the same name")
        known = _registry.REGISTERED if registered is None else registered
        self._classes = {cls.name: cls for cls in known}
        self.host_id = host_id
        # (transport, publisher id) whose channels could not open: not chosen again.
        self._refused: set[tuple[str, str]] = set()
        # Edges (publisher id, subscriber id) whose forced choice was refused (logged).
        self._warned: set[tuple[str, str]] = set()

    @classmethod
    async def create(
        cls, settings: TransportSettings, classes: Sequence[type[Transport]] | None = None
    ) -> TransportSet:
        """A set of every class of *classes* (default: the registered ones) that is
        available here; the availability probes run in one worker thread (they may
        touch /dev/shm)."""
        classes = tuple(_registry.REGISTERED if classes is None else classes)
        usable = await asyncio.to_thread(lambda: [c for c in classes if c.available()])
        return cls(
            (c.from_settings(settings) for c in usable),
            host_id=settings.host_id,
            registered=classes,
        )

    # -- by name ---------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the transports in the set, in order of preference."""
        return tuple(self._by_name)

    def __iter__(self) -> Iterator[Transport]:
        return iter(self._transports)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def get(self, name: str, kind: type[T] = Transport) -> T:  # type: ignore[assignment]
        """The transport named *name*, checked to be a *kind*. Raises
        :class:`~ezflow.ConfigurationError` when the set has none of that name (not
        registered, or not available in this process)."""
        transport = self._by_name.get(name)
        if transport is None:
            raise ConfigurationError(
                f"no transport {name!r} in this process; it has {', '.join(self._by_name)}"
            )
        if not isinstance(transport, kind):
            raise TypeError(f"transport {name!r} is a {type(transport).__name__}, not a {kind}")
        return transport

    # -- edges -----------------------------------------------------------------------------

    def choose(
        self,
        publisher: PublisherInfo,
        wanted: str | None,
        subscriber_id: str,
        subscriber_topic: str,
    ) -> str:
        """The transport of the edge from *publisher* to the subscriber *subscriber_id*
        (of *subscriber_topic*) in this process, when *wanted* was asked for (``None``:
        automatic). See the module for the rules."""
        publisher_id = publisher.publisher_id
        reached: list[str] = []
        for transport in self._transports:
            if (transport.name, publisher_id) in self._refused:
                continue
            if transport.reaches(publisher, self.host_id):
                if transport.exclusive:
                    return transport.name
                if transport.name == wanted:
                    return wanted
                reached.append(transport.name)
        chosen = reached[0] if reached else self._transports[-1].name
        if wanted is not None:
            edge = (publisher_id, subscriber_id)
            if edge not in self._warned:
                self._warned.add(edge)
                cls = self._classes.get(wanted)
                log.warning(
                    "transport %r asked for %s -> %s, but %s; using %s",
                    wanted,
                    publisher.topic,
                    subscriber_topic,
                    "it is not a transport of this process" if cls is None else cls.unreachable,
                    chosen,
                )
        return chosen

    def fall_back(self, name: str, publisher: PublisherInfo, error: EzflowError) -> str | None:
        """A channel to *publisher* could not open over *name* (*error*): the transport
        its edges use from then on (said once per publisher), or ``None`` when *name*
        has no fall-back (the caller retries)."""
        transport = self._by_name[name]
        fallback = transport.fallback
        if fallback is None or fallback not in self._by_name:
            return None
        key = (name, publisher.publisher_id)
        if key not in self._refused:
            self._refused.add(key)
            log.warning(
                "cannot use %s for publisher %s on topic %r (%s); its edges to this process use %s",
                transport.label or name,
                publisher.publisher_id,
                publisher.topic,
                error,
                fallback,
            )
        return fallback

    # -- this process's publishers ---------------------------------------------------------

    async def advertise(self, *, optional: bool = True) -> dict[str, Any]:
        """Start what serves this process's publishers; the fields of a publisher's
        registration that say where they are (with *optional* false: only the required
        ones, for a publisher that no outlet of this process feeds)."""
        fields: dict[str, Any] = {}
        for transport in self._transports:
            fields.update(await transport.advertise(optional=optional))
        return fields

    def add_outlet(self, outlet: Outlet, **options: Any) -> None:
        """Make *outlet* reachable through every transport; *options* by transport name
        (``shm=ShmOptions(...)``)."""
        unknown = set(options) - set(self._classes)
        if unknown:
            raise ConfigurationError(
                f"options for unknown transports: {', '.join(sorted(unknown))}"
            )
        for transport in self._transports:
            transport.add_outlet(outlet, options.get(transport.name))

    def remove_outlet(self, outlet: Outlet) -> None:
        """Take *outlet* off every transport (its open links close with the outlet)."""
        for transport in self._transports:
            transport.remove_outlet(outlet)

    def loans(self, outlet: Outlet) -> Loans[Any] | None:
        """The loans a transport offers *outlet* (shared memory), or ``None``."""
        for transport in self._transports:
            loans = transport.loans(outlet)
            if loans is not None:
                return loans
        return None

    async def wait_closed(self, outlet: Outlet) -> None:
        """After ``outlet.close()``: until every channel it fed has read up to its end
        (each transport bounds its wait)."""
        await asyncio.gather(*(t.wait_closed(outlet) for t in self._transports))

    async def aclose(self) -> None:
        """Close every transport at once (each may wait for slow channels); an error in
        one is logged and does not keep the others open. Cancellation propagates."""
        results = await asyncio.gather(
            *(t.aclose() for t in self._transports), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # cancellation and the like: not ours to swallow
                log.error("closing a transport failed", exc_info=result)
