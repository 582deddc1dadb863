"""Per-hop tracing of sampled messages (docs/tracing.md).

With tracing on (:func:`set_trace_rate`, ``EZFLOW_TRACE``), each publisher of a process
marks one message in ``rate`` that it publishes on its own - not caused by a traced
message, and not from a unit's input loop (:data:`HANDLING`: those publish because of a
message, so sampling happens at the sources) - as the start of a *trace*. A traced
message carries a small trace record
(``TRACE_BODY``: trace id, parent span, publish and send times, the sender's clock) to
every subscriber, and every subscriber that takes it records one :class:`Hop`::

    publish   publish() called -> written to the link (room wait, encode, write)
    transport written -> the receiving process has the whole frame
    decode    -> decoded (0 for the local transport: nothing to decode)
    queue     -> taken by the subscriber (recv returned, or on_message called)
    handler   -> the subscriber's first publish caused by it, else its next recv

A message published by a task while it handles a traced message - the task that took it
with ``recv()``, or inside that message's ``on_message`` callback - carries the same
trace on, with that hop as its parent: a trace follows a message through every hop of a
graph, and forks where a publisher feeds several subscribers.

Clocks: every timestamp is ``CLOCK_MONOTONIC`` (``time.monotonic_ns``), which all
processes of one boot of one host share. A hop whose publisher ran on another host (its
clock id differs, see :data:`CLOCK_ID`) has no comparable publish and transport stages:
they are reported as unknown (``None``) and left out of path totals.

Cost when off: a publisher reads one module attribute (``TRACING.active``) per publish;
receivers pay nothing (a traced message arrives as its own frame kind). Records are
kept per process in a bounded buffer (``TRACE_BUFFER`` hops; older ones are overwritten
and counted) until the telemetry reporter takes them to the graph server.

Rates: a process has its *own* rate (``EZFLOW_TRACE``, :func:`set_trace_rate`,
``ezflow run --trace``) and may hold the graph's *lease* (``ezflow trace --sample N
--duration S``): a rate the graph server pushes with the seconds it has left
(:func:`apply_lease`). While the lease runs it wins; it ends when the server says so,
and at the latest ``TRACE_LEASE_GRACE`` after its announced end by this process's own
clock (:class:`Lease`: a deadline in ``CLOCK_MONOTONIC``, checked where a trace would
start) - whether or not the server or the command that asked for it is still there.
The lease is per process: a process in two graphs follows the latest word of either.

Completeness: a hop also counts the traced messages its handler sent on (``forwarded``:
one per receiving process, per publish), so that a reader can tell a trace whose hops
were all reported from one cut short (see :mod:`ezflow._graph._traces`).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections import deque
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from time import monotonic_ns, time_ns
from typing import Any, Final, Protocol

from ._config import ENV_TRACE, TRACE_BUFFER, TRACE_LEASE_GRACE
from ._exceptions import ConfigurationError, ProtocolError
from ._framing import TRACE, TRACE_BODY, TRACE_PREFIX

__all__ = [
    "CLOCK_ID",
    "CURRENT",
    "HANDLING",
    "HOP_FIELDS",
    "OWN_SOURCES",
    "PUBLISHER_TIMES",
    "STAGES",
    "STAGE_BOUNDS",
    "TRACING",
    "Hop",
    "HopRow",
    "Lease",
    "TraceState",
    "WireTrace",
    "apply_lease",
    "carry",
    "check_rows",
    "check_trace_rate",
    "check_trace_state",
    "hop_stages",
    "new_id",
    "set_own_rate",
    "set_trace_rate",
    "trace_rate_from_env",
    "wall_offset",
]

#: The stages of one hop, in order (see the module docstring), each with the hop fields
#: it runs from and to: the one definition of a stage (``hop_stages``, the spans of
#: ``ezflow.otel``).
STAGE_BOUNDS: Final = {
    "publish": ("t_publish", "t_sent"),
    "transport": ("t_sent", "t_received"),
    "decode": ("t_received", "t_decoded"),
    "queue": ("t_decoded", "t_taken"),
    "handler": ("t_taken", "t_done"),
}
STAGES: Final = tuple(STAGE_BOUNDS)
#: The times taken on the publisher's clock (the others are the receiver's).
PUBLISHER_TIMES: Final = frozenset({"t_publish", "t_sent"})


def _clock_id() -> int:
    # CLOCK_MONOTONIC counts from boot: processes that share a boot id share the clock.
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
    except OSError:
        boot = os.urandom(16)  # no boot id: only this process is known to share it
    return int.from_bytes(hashlib.blake2b(boot, digest_size=8).digest(), "little") or 1


#: This host's (and boot's) clock: equal for every process whose monotonic_ns agrees.
CLOCK_ID: Final = _clock_id()

_random = random.Random(os.urandom(16))
_pid = os.getpid()  # (a system call: read once per process)


def _forked() -> None:
    global _pid  # (this process's pid, kept across a fork)
    _pid = os.getpid()
    _random.seed(os.urandom(16))


os.register_at_fork(after_in_child=_forked)


def new_id() -> int:
    """A random non-zero 64-bit id (trace and span ids)."""
    return _random.getrandbits(64) or 1


def check_trace_rate(value: int, *, setting: str = "trace rate") -> int:
    """*value* if it is a valid rate: 0 (off) or N >= 1 (one message in N)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"{setting}={value!r} must be 0 (tracing off) or a whole number N >= 1 "
            "(trace one message in N)"
        )
    return value


def trace_rate_from_env() -> int:
    """``EZFLOW_TRACE``: unset or ``0`` off, ``N`` traces one message in N."""
    text = os.environ.get(ENV_TRACE, "").strip()
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigurationError(
            f"{ENV_TRACE}={text!r} must be 0 (tracing off) or a whole number N >= 1 "
            "(trace one message in N)"
        )
    return value


#: Where a process's own rate came from: nothing (off), ``EZFLOW_TRACE`` (read at
#: import; the processes of ``ezflow run --trace`` inherit it), :func:`set_trace_rate`,
#: or ``ezflow run --trace`` in the process that runs the graph.
OWN_SOURCES: Final = ("default", "EZFLOW_TRACE", "set_trace_rate", "ezflow run --trace")

#: ``lease_deadline`` without a lease: never.
_NEVER: Final = 2**63 - 1


class Lease:
    """The graph's trace lease as this process holds it: *rate* until *deadline*
    (``monotonic_ns``), when this process ends it by itself."""

    __slots__ = ("deadline", "id", "rate")

    def __init__(self, lease_id: str, rate: int, deadline: int) -> None:
        self.id = lease_id
        self.rate = rate
        self.deadline = deadline


class TraceState:
    """The tracing state of this process (one instance: :data:`TRACING`)."""

    __slots__ = (
        "active",
        "carrying",
        "hops",
        "lease",
        "lease_deadline",
        "lost",
        "own_rate",
        "own_source",
        "rate",
        "recorded",
        "reporters",
    )

    def __init__(self) -> None:
        #: True while this process samples (rate > 0), and for good once it has received
        #: a traced message (:attr:`carrying`): only then does a publish look for a trace
        #: to carry on (and the compiled one-call publish declines)
        self.active = False
        #: this process has received a traced message: a handler of one may still be
        #: running, whose publishes carry its trace on
        self.carrying = False
        #: one message in this many starts a trace (0: this process starts none): the
        #: graph's lease while this process holds one, else its own rate
        self.rate = 0
        self.own_rate = 0  #: this process's rate (set_trace_rate, EZFLOW_TRACE)
        self.own_source = "default"  #: where own_rate came from (:data:`OWN_SOURCES`)
        #: the graph's lease (``ezflow trace --sample``) this process holds, if any
        self.lease: Lease | None = None
        #: the lease's deadline (``monotonic_ns``; a huge number without a lease): read
        #: where a trace would start, so that an ended lease starts none
        self.lease_deadline = _NEVER
        #: finished hops not yet taken by the reporter (bounded; oldest overwritten)
        self.hops: deque[Hop] = deque(maxlen=TRACE_BUFFER)
        self.recorded = 0  #: hops recorded by this process
        #: telemetry reporters running in this process: without one, its hops never
        #: reach the graph server, and its channels ask publishers for no traces
        self.reporters = 0
        #: of those, hops never reported: overwritten in the buffer, or in a report
        #: that could not be sent
        self.lost = 0

    def update(self) -> None:
        lease = self.lease
        if lease is None:
            self.rate = self.own_rate
            self.lease_deadline = _NEVER
        else:
            self.rate = lease.rate
            self.lease_deadline = lease.deadline
        # (A process that only sampled looks for traces no more once its rate is 0 - a
        # lease that ended, a rate set back - and gets its untraced publish back.)
        self.active = bool(self.rate) or self.carrying

    def expire(self, now: int) -> None:
        """End the lease if its deadline is past at *now* (``monotonic_ns``)."""
        lease = self.lease
        if lease is not None and now >= lease.deadline:
            self.lease = None
            self.update()

    def state(self) -> dict[str, Any]:
        """This process's rates now, as reported to the graph server (``trace_state``):
        ``rate`` (in force), ``own`` and ``own_source``, ``lease`` (its id, or None) and
        ``left`` (seconds until this process ends the lease by itself, or None)."""
        now = monotonic_ns()
        self.expire(now)
        lease = self.lease
        return {
            "rate": self.rate,
            "own": self.own_rate,
            "own_source": self.own_source,
            "lease": None if lease is None else lease.id,
            "left": None if lease is None else round((lease.deadline - now) / 1e9, 3),
        }

    def record(self, hop: Hop) -> None:
        hops = self.hops
        if len(hops) == hops.maxlen:
            self.lost += 1
        hops.append(hop)
        self.recorded += 1

    def take(self, limit: int) -> list[Hop]:
        """Up to *limit* finished hops, oldest first, removed from the buffer."""
        hops = self.hops
        return [hops.popleft() for _ in range(min(limit, len(hops)))]


TRACING: Final = TraceState()


def set_trace_rate(rate: int) -> None:
    """Trace one message in *rate* of those each publisher of this process publishes on
    its own (0 starts no traces; messages caused by traced messages from other
    processes are still traced on). Takes effect at each publisher's next message; the
    graph's lease (``ezflow trace --sample N --duration S``) wins while it runs, and this
    rate is back when it ends. Raises :class:`~ezflow.ConfigurationError` for anything
    but a whole number >= 0. ``EZFLOW_TRACE=N`` sets it at import, and processes of a
    unit graph inherit it."""
    set_own_rate(rate, "set_trace_rate")


def set_own_rate(rate: int, source: str) -> None:
    """:func:`set_trace_rate`, saying where the rate came from (:data:`OWN_SOURCES`)."""
    if source not in OWN_SOURCES:
        raise ValueError(f"trace rate source {source!r} is not one of {OWN_SOURCES}")
    TRACING.own_rate = check_trace_rate(rate)
    TRACING.own_source = source
    TRACING.update()


def apply_lease(wire: object) -> None:
    """Hold the lease the graph server sent (``{"id": str, "rate": N, "remaining":
    seconds}``, in ``welcome`` or a ``trace_lease`` push) until its end plus
    ``TRACE_LEASE_GRACE`` by this process's clock, or end the one held (``None``: the
    server has none). :class:`ProtocolError` for anything else."""
    if wire is None:
        TRACING.lease = None
        TRACING.update()
        return
    if not isinstance(wire, dict):
        raise ProtocolError(f"the graph server sent the trace lease {wire!r}")
    lease_id, rate, remaining = wire.get("id"), wire.get("rate"), wire.get("remaining")
    if (
        not isinstance(lease_id, str)
        or type(rate) is not int
        or rate < 0
        or isinstance(remaining, bool)
        or not isinstance(remaining, (int, float))
        or not 0 <= remaining < float("inf")
    ):
        raise ProtocolError(f"the graph server sent the malformed trace lease {wire!r}")
    deadline = monotonic_ns() + int((remaining + TRACE_LEASE_GRACE) * 1e9)
    TRACING.lease = Lease(lease_id, rate, deadline)
    TRACING.update()


def check_trace_state(state: object) -> dict[str, Any]:
    """A process's trace state from the wire (:meth:`TraceState.state`), checked
    (:class:`ProtocolError` for anything else)."""
    if not isinstance(state, dict):
        raise ProtocolError("a trace state must be a map")
    rate, own, source = state.get("rate"), state.get("own"), state.get("own_source")
    lease, left = state.get("lease"), state.get("left")
    if type(rate) is not int or type(own) is not int or rate < 0 or own < 0:
        raise ProtocolError("a trace state's rates must be whole numbers >= 0")
    if source not in OWN_SOURCES:
        raise ProtocolError(f"a trace state's own_source must be one of {OWN_SOURCES}")
    if lease is None:
        if left is not None:
            raise ProtocolError("a trace state without a lease has no time left")
    elif (
        not isinstance(lease, str)
        or len(lease) > 64
        or isinstance(left, bool)
        or not isinstance(left, (int, float))
    ):
        raise ProtocolError("a trace state's lease must be an id (str) with seconds left")
    return {"rate": rate, "own": own, "own_source": source, "lease": lease, "left": left}


def _rate_at_import() -> int:
    # An unusable EZFLOW_TRACE must not make importing ezflow fail: it is ignored here
    # and reported by GraphContext, which checks it (trace_rate_from_env) when created.
    try:
        return trace_rate_from_env()
    except ConfigurationError:
        return 0


TRACING.own_rate = _rate_at_import()
if os.environ.get(ENV_TRACE, "").strip():
    TRACING.own_source = "EZFLOW_TRACE"
TRACING.update()


def wall_offset() -> int:
    """``time_ns() - monotonic_ns()`` now: add it to this host's monotonic times to get
    wall-clock times (as exact as the wall clock is)."""
    return time_ns() - monotonic_ns()


class WireTrace:
    """What a traced message carries to its subscribers (``TRACE_BODY``); on the
    sending side also the hop it carries on (*cause*), whose ``forwarded`` the
    publisher counts up per receiving process."""

    __slots__ = ("cause", "clock", "parent_id", "t_publish", "t_sent", "trace_id")

    def __init__(  # noqa: PLR0917 - the frame's fields, in its order
        self,
        trace_id: int,
        parent_id: int,
        t_publish: int,
        t_sent: int = 0,
        clock: int = CLOCK_ID,
        cause: Hop | None = None,
    ) -> None:
        self.trace_id = trace_id
        self.parent_id = parent_id
        self.t_publish = t_publish
        self.t_sent = t_sent
        self.clock = clock
        self.cause = cause

    def frame(self) -> bytes:
        """The TRACE frame (length prefix included), stamped as sent now."""
        self.t_sent = now = monotonic_ns()
        return TRACE_PREFIX.pack(
            TRACE_BODY.size, TRACE, self.trace_id, self.parent_id, self.t_publish, now, self.clock
        )

    @classmethod
    def from_frame(cls, body: bytes | memoryview) -> WireTrace:
        """Parse a TRACE frame body (no length prefix); :class:`ProtocolError` when it
        is not one."""
        if len(body) != TRACE_BODY.size:
            raise ProtocolError(f"TRACE frame of {len(body)} bytes")
        _, trace_id, parent_id, t_publish, t_sent, clock = TRACE_BODY.unpack(body)
        return cls(trace_id, parent_id, t_publish, t_sent, clock)


#: The hop whose message the current task (or on_message callback) is handling: what a
#: publish from it carries on.
CURRENT: Final[ContextVar[Hop | None]] = ContextVar("ezflow_trace_hop", default=None)

#: True in a context that handles received messages (a unit's input loop): its
#: publishes are caused by messages, so only a traced one gives them a trace - they
#: start none of their own, and sampling happens at the sources.
HANDLING: Final[ContextVar[bool]] = ContextVar("ezflow_trace_handling", default=False)

#: The fields of a hop as they travel to the graph server and out of ``ezflow trace
#: --json`` (one row per hop, in this order).
HOP_FIELDS: Final = (
    "trace_id",
    "span_id",
    "parent_id",
    "topic",
    "publisher_id",
    "subscriber",
    "transport",
    "pid",
    "same_clock",
    "t_publish",
    "t_sent",
    "t_received",
    "t_decoded",
    "t_taken",
    "t_done",
    "forwarded",
)
HopRow = list[Any]
_FIELD_INDEX: Final = {name: index for index, name in enumerate(HOP_FIELDS)}


class Hop:
    """One traced message, taken by one subscriber (see the module docstring)."""

    __slots__ = (*HOP_FIELDS, "carries", "called")

    def __init__(  # noqa: PLR0917 - one field per stage boundary
        self,
        wire: WireTrace,
        topic: str,
        publisher_id: str,
        subscriber: str,
        transport: str,
        t_received: int,
        t_decoded: int,
    ) -> None:
        self.trace_id = wire.trace_id
        self.span_id = new_id()
        self.parent_id = wire.parent_id
        self.topic = topic
        self.publisher_id = publisher_id
        self.subscriber = subscriber
        self.transport = transport
        self.pid = _pid
        self.same_clock = wire.clock == CLOCK_ID
        self.t_publish = wire.t_publish
        self.t_sent = wire.t_sent
        self.t_received = t_received
        self.t_decoded = t_decoded
        self.t_taken = 0
        self.t_done = 0
        #: the traced messages its handler sent on, one per receiving process per
        #: publish: so many deliveries of this trace have this hop as parent
        self.forwarded = 0
        #: publishes from the context that took it carry its trace on: from its take
        #: until the subscriber asks for the next message (or, for an on_message
        #: callback, for good: tasks the callback started run in copies of its context)
        self.carries = False
        self.called = False  #: handed to an on_message callback

    def row(self) -> HopRow:
        return [getattr(self, name) for name in HOP_FIELDS]

    def finish(self, now: int) -> None:
        """The subscriber is done with it (asked for its next message): record it."""
        self.carries = self.called
        if not self.t_done:
            self.t_done = now
        TRACING.record(self)


class Sampled(Protocol):
    #: messages until the next one that starts a trace (1: the next one)
    trace_countdown: int


def carry(publisher: Sampled) -> WireTrace | None:
    """The trace a publish starting now carries, if any (only called while
    ``TRACING.active``): the current hop's trace, with that hop as parent, else a new
    trace for one message in ``TRACING.rate`` of *publisher*'s. Ends the current hop's
    handler stage at its first publish.
    """
    now = monotonic_ns()
    hop = CURRENT.get()
    if hop is not None and hop.carries:
        if not hop.t_done:
            hop.t_done = now
        return WireTrace(hop.trace_id, hop.span_id, now, cause=hop)
    if now >= TRACING.lease_deadline:  # (the lease ran out: this process ends it)
        TRACING.expire(now)
    rate = TRACING.rate
    if not rate or HANDLING.get():
        return None
    left = publisher.trace_countdown - 1
    if left > 0:
        publisher.trace_countdown = left
        return None
    publisher.trace_countdown = rate
    return WireTrace(new_id(), 0, now)


def hop_stages(row: Sequence[Any]) -> dict[str, int | None]:
    """A hop row's stage durations (ns) by name, in :data:`STAGES` order; ``None`` for
    stages whose clocks are not comparable (a bound on another host's clock:
    :data:`PUBLISHER_TIMES` when ``same_clock`` is false) and, while a hop is being
    handled, for its handler (``t_done`` is 0)."""
    same_clock = row[_FIELD_INDEX["same_clock"]]
    stages: dict[str, int | None] = {}
    for name, (first, last) in STAGE_BOUNDS.items():
        end = row[_FIELD_INDEX[last]]
        foreign = not same_clock and (first in PUBLISHER_TIMES or last in PUBLISHER_TIMES)
        stages[name] = None if foreign or not end else end - row[_FIELD_INDEX[first]]
    return stages


def check_rows(rows: Iterable[Any]) -> list[HopRow]:
    """Hop rows from the wire, checked (:class:`ProtocolError` for anything else)."""
    checked: list[HopRow] = []
    for row in rows:
        if not isinstance(row, list) or len(row) != len(HOP_FIELDS):
            raise ProtocolError(f"a trace hop must be a list of {len(HOP_FIELDS)} fields")
        ids, names, numbers = row[:3], row[3:7], row[9:]
        if not all(type(v) is int for v in (*ids, row[7], *numbers)) or not all(
            type(v) is str for v in names
        ):
            raise ProtocolError("a trace hop has a field of the wrong type")
        if type(row[8]) is not bool:
            raise ProtocolError("a trace hop has a field of the wrong type")
        checked.append(row)
    return checked
