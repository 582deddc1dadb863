"""The graph server's trace store: the hops clients report, and the graph's trace lease.

Clients report the hops of the messages they traced with their telemetry
(:mod:`ezflow._core._tracing`); the store keeps the newest ``TRACE_SERVER_KEEP`` of
them, each with the reporting process's name and wall-clock offset, for ``traces``
requests (``ezflow trace``, ``ezflow top``). A *lease* (``ezflow trace --sample N
--duration S``) sets the graph's trace rate for a while: it is pushed to every client,
in ``welcome`` to those that connect meanwhile, and ended by its timer, a newer lease or
an ``end_trace_lease`` request; a request that starts or ends one is answered once every
client confirmed the push (``trace_state``), or after ``TRACE_LEASE_CONFIRM_TIMEOUT``
with the late ones named. Every client's latest trace state is kept too
(``trace_status``), with the last lease it left and the last one whose hops it
reported in full.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._core._config import (
    TRACE_FLUSH_SETTLE,
    TRACE_LEASE_CONFIRM_TIMEOUT,
    TRACE_SERVER_KEEP,
    check_trace_lease_duration,
)
from .._core._exceptions import ProtocolError
from .._core._protocol import field as message_field
from .._core._tracing import check_rows, check_trace_rate, check_trace_state
from ._registry import RegisteredClient, Registry
from ._traces import REPORTED_FIELDS

__all__ = ["TraceLease", "TraceStore"]

log = logging.getLogger("ezflow.server")


@dataclass(eq=False)
class TraceLease:
    """The graph's trace rate for a while (``ezflow trace --sample N --duration S``)."""

    id: str
    rate: int
    duration: float
    expires_at: float  # loop time
    by: str  # who asked for it
    timer: asyncio.TimerHandle | None = None

    def to_wire(self, now: float) -> dict[str, Any]:
        """What clients get: a duration (``remaining``), not a time - clocks differ."""
        remaining = round(max(0.0, self.expires_at - now), 3)
        return {"id": self.id, "rate": self.rate, "remaining": remaining}

    def describe(self, now: float) -> dict[str, Any]:
        return {**self.to_wire(now), "duration": self.duration, "by": self.by}


def _name(client: RegisteredClient) -> str:
    return f"{client.name or client.id} (pid {client.pid})"


class TraceStore:
    """The trace hops and the lease of the graph of *registry* (see the module
    docstring). *server_id* names the leases; *closed* tells whether the server is
    closing (an expiring lease is then not pushed)."""

    def __init__(self, registry: Registry, server_id: str, closed: Callable[[], bool]) -> None:
        self._registry = registry
        self._server_id = server_id
        self._closed = closed
        #: the newest trace hops every client reported (TRACE_SERVER_KEEP), each row
        #: HOP_FIELDS plus the reporting process's name and wall-clock offset
        self.hops: deque[list[Any]] = deque(maxlen=TRACE_SERVER_KEEP)
        #: how many hops were ever reported (the index the next one gets)
        self.hops_received = 0
        #: the graph's trace lease, pushed to every client (None: each traces at its own
        #: rate); ended by its timer, a newer lease or an ``end_trace_lease`` request
        self.lease: TraceLease | None = None
        #: the last lease that ended: id, rate, loop time, how
        self._ended: dict[str, Any] | None = None
        self._leases = 0
        self._version = 0  # lease pushes so far
        self._confirmed = asyncio.Event()  # a client confirmed a lease push

    # -- reports ---------------------------------------------------------------------------

    def reported(self, client: RegisteredClient, trace: object) -> None:
        """Keep the trace hops of a report, and the reporter's trace state and report
        interval when it sends them (:class:`ProtocolError` when malformed)."""
        if not isinstance(trace, dict) or type(trace.get("offset")) is not int:
            raise ProtocolError("a report's trace must be a map with an integer offset")
        offset = trace["offset"]
        extra = [client.name, offset]
        rows = check_rows(trace.get("hops", ()))
        state = trace.get("state")
        interval = trace.get("interval")
        if state is not None:
            state = check_trace_state(state)
        if interval is not None and (
            isinstance(interval, bool) or not isinstance(interval, (int, float))
        ):
            raise ProtocolError("a report's trace interval must be a number of seconds")
        self.hops.extend(row + extra for row in rows)
        self.hops_received += len(rows)
        if interval is not None:
            client.report_interval = float(interval)
        if state is not None:
            self._keep_state(client, state, reported=True)

    def traces(self) -> dict[str, Any]:
        """The ``traces`` request: the hops kept (oldest first), and how many hops were
        ever reported (``received``: the last kept hop's index plus one)."""
        return {
            "fields": list(REPORTED_FIELDS),
            "hops": list(self.hops),
            "received": self.hops_received,
        }

    # -- the lease -------------------------------------------------------------------------

    def welcome(self, client: RegisteredClient) -> dict[str, Any] | None:
        """The lease for *client*'s ``welcome`` (None: it drops any it holds). It gets
        the lease there, so no earlier push is waited for from it."""
        client.trace_version = self._version
        lease = self.lease
        return None if lease is None else lease.to_wire(asyncio.get_running_loop().time())

    async def grant(self, client: RegisteredClient, message: dict[str, Any]) -> dict[str, Any]:
        """``trace_lease``: every client traces one message in ``rate`` for
        ``duration`` seconds (replacing a running lease). ``ValueError`` naming the
        field for a request that is not one: the requester keeps its connection."""
        rate = message.get("rate")
        duration = message.get("duration")
        if rate is None or duration is None:
            raise ValueError(
                "trace_lease needs rate (0, or N >= 1: one message in N) and duration "
                "(seconds); to end a lease, send end_trace_lease"
            )
        check_trace_rate(rate, setting="trace_lease rate")
        duration = check_trace_lease_duration(duration, setting="trace_lease duration")
        loop = asyncio.get_running_loop()
        now = loop.time()
        since = self.hops_received
        replaced = self._close("replaced", now)
        self._leases += 1
        lease = self.lease = TraceLease(
            id=f"L{self._leases}-{self._server_id}",
            rate=rate,
            duration=duration,
            expires_at=now + duration,
            by=f"{client.name or client.id} (pid {client.pid})",
        )
        lease.timer = loop.call_at(lease.expires_at, self._expired, lease)
        log.info(
            "graph server: trace lease %s: one message in %d for %g s, for %s",
            lease.id,
            rate,
            duration,
            lease.by,
        )
        unconfirmed = await self._wait_confirmed(self._push())
        return {
            "lease": lease.describe(loop.time()),
            "replaced": replaced,
            "received": since,
            "processes": self.processes(client),
            "unconfirmed": [_name(c) for c in unconfirmed],
        }

    async def end(self, client: RegisteredClient, message: dict[str, Any]) -> dict[str, Any]:
        """``end_trace_lease``: end the running lease now (only if it is ``lease``, when
        given: a command ending its own, which may have been replaced meanwhile)."""
        lease_id = message.get("lease")
        if lease_id is not None and not isinstance(lease_id, str):
            raise ValueError(
                f"end_trace_lease lease={lease_id!r} must be a lease id (a str, as trace_lease "
                "answered) or absent (any lease)"
            )
        loop = asyncio.get_running_loop()
        lease = self.lease
        ended = None
        unconfirmed: list[RegisteredClient] = []
        if lease is not None and lease_id in (None, lease.id):
            ended = self._close(
                f"ended by {client.name or client.id} (pid {client.pid})", loop.time()
            )
            unconfirmed = await self._wait_confirmed(self._push())
        return {
            "ended": ended,
            "lease": None if self.lease is None else self.lease.describe(loop.time()),
            "processes": self.processes(client),
            "unconfirmed": [_name(c) for c in unconfirmed],
        }

    def _expired(self, lease: TraceLease) -> None:
        if self.lease is not lease or self._closed():
            return
        self._close("expired", asyncio.get_running_loop().time())
        self._push()

    def _close(self, how: str, now: float) -> dict[str, Any] | None:
        """Forget the running lease (nothing pushed); what it was, or None."""
        lease, self.lease = self.lease, None
        if lease is None:
            return None
        if lease.timer is not None:
            lease.timer.cancel()
        described = lease.describe(now)
        self._ended = {"id": lease.id, "rate": lease.rate, "at": now, "how": how}
        log.info("graph server: trace lease %s %s", lease.id, how)
        return described

    def _push(self) -> int:
        """Send the lease (or its end) to every client; return the push's version."""
        self._version += 1
        version = self._version
        lease = self.lease
        wire = None if lease is None else lease.to_wire(asyncio.get_running_loop().time())
        for other in self._registry.clients.values():
            if other.connection is not None:
                other.connection.send_message(
                    {"op": "trace_lease", "version": version, "lease": wire}
                )
        return version

    async def _wait_confirmed(self, version: int) -> list[RegisteredClient]:
        """Wait until every client confirmed push *version*, at most
        ``TRACE_LEASE_CONFIRM_TIMEOUT``; return those that did not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TRACE_LEASE_CONFIRM_TIMEOUT
        while True:
            waiting = [c for c in self._registry.clients.values() if c.trace_version < version]
            remaining = deadline - loop.time()
            if not waiting or remaining <= 0:
                return waiting
            # (no wake-up lost: nothing runs between the check and the wait)
            self._confirmed.clear()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._confirmed.wait(), remaining)

    # -- every client's state --------------------------------------------------------------

    def state_notice(self, client: RegisteredClient, message: dict[str, Any]) -> None:
        """A client's ``trace_state``: its rates after a lease push (or welcome)."""
        version = message_field(message, "version", int)
        state = check_trace_state(message.get("state"))
        self._keep_state(client, state, reported=False)
        if version > client.trace_version:
            client.trace_version = version
            self._confirmed.set()

    def _keep_state(
        self, client: RegisteredClient, state: dict[str, Any], *, reported: bool
    ) -> None:
        """Keep *client*'s trace *state*. Once it left a lease, its hops of that lease
        are all at the server with its first report sent ``TRACE_FLUSH_SETTLE`` or
        more after (traced messages sent just before may still be on their way)."""
        now = asyncio.get_running_loop().time()
        held = client.trace_state["lease"] if client.trace_state is not None else None
        if held is not None and state["lease"] != held:
            client.left_lease = held
            client.left_at = now
        if (
            reported
            and client.left_lease is not None
            and now - client.left_at >= TRACE_FLUSH_SETTLE
        ):
            client.flushed_lease = client.left_lease
        client.trace_state = state
        client.trace_state_at = now

    def processes(self, requester: RegisteredClient) -> list[dict[str, Any]]:
        """The trace state of every process of the graph (clients with registrations
        or telemetry; not *requester*, nor other inspecting commands)."""
        now = asyncio.get_running_loop().time()
        return [
            {
                "client_id": c.id,
                "name": c.name,
                "pid": c.pid,
                "hostname": c.hostname,
                "state": c.trace_state,
                "age": None if c.trace_state is None else round(now - c.trace_state_at, 3),
                "interval": c.report_interval or None,
                "left_lease": c.left_lease,
                "flushed_lease": c.flushed_lease,
            }
            for c in self._registry.clients.values()
            if c is not requester and (c.telemetry is not None or c.publishers or c.subscribers)
        ]

    def status(self, client: RegisteredClient) -> dict[str, Any]:
        """``trace_status``: the lease, the last one that ended, every process's rates."""
        now = asyncio.get_running_loop().time()
        lease = self.lease
        ended = self._ended
        return {
            "lease": None if lease is None else lease.describe(now),
            "ended": None
            if ended is None
            else {
                "id": ended["id"],
                "rate": ended["rate"],
                "ago": round(now - ended["at"], 3),
                "how": ended["how"],
            },
            "received": self.hops_received,
            "processes": self.processes(client),
        }
