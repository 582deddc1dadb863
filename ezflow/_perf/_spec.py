"""What a perf run measures: suites, transports, sizes, plans, and each cell's processes.

A *cell* is one (suite, transport, message size, clients N) combination. Its units:

* ``fanout`` — one source publishes, N sinks subscribe to the same topic;
* ``fanin`` — N sources publish on one topic, one sink subscribes;
* ``relay`` — source -> relay 1 -> ... -> relay N -> sink, each relay a subscriber whose
  messages are republished by a publisher on the next topic;
* ``spread`` — the relay chain again, with every unit in its own process.

Where the units run (the *layout*):

* transport ``local``: every unit in one process;
* ``fanout``/``fanin`` over ``shm``/``tcp``: the source(s) in one process, the sink(s)
  in another, so every edge crosses a process boundary and the receiving process gets
  each message once however many sinks it hosts (that is the point of a channel);
* ``relay`` over ``shm``/``tcp``: units alternate between two processes (source,
  relay 2, relay 4, ... in one; relay 1, relay 3, ..., in the other, the sink with the
  other parity), so every one of the N+1 edges crosses a process boundary, on 2 cores;
* ``spread``: N+2 processes (``spread`` over ``local`` is refused: one process cannot
  hold units that each have their own process).

Every message is a fresh ``uint8`` array of the cell's size, filled by its source the
way a producer fills a new frame: a 32-byte header (four little-endian int64: the
publish time ``time.perf_counter_ns()`` — CLOCK_MONOTONIC, shared by the processes of a
host —, a per-source sequence number, the source index, the phase below) and then the
source's random payload (never zeros). Where a framework can hand out its own buffer to
fill (ezflow's ``Publisher.loan`` for shared memory), the source fills that instead of
a private array (``Plan.loan``; ``--no-loan`` to measure the copying publish).

Each source runs four phases:

0. ``WARMUP``: one message every :func:`pacing` seconds until every sink has received
   a few from every source and the runner says ``measure`` (connections, buffers and
   shared memory of every framework are then set up: none of that is measured);
1. ``LATENCY``, on an idle graph: the sources of a cell together publish one message
   every :func:`pacing` seconds (each source every ``pacing x sources``, staggered),
   :func:`latency_count` messages in all; the sinks record publish -> receive times.
   Pacing is slow enough for large messages that neither framework is saturated (a
   saturated pipeline measures its queue, not its latency).
2. ``RATE``: once every source of the process has finished phase 1, back-to-back for
   ``duration`` seconds (or ``count`` messages): msgs/s, MB/s and the latency under
   load at the sinks.
3. One ``END`` message.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Final

__all__ = [
    "END",
    "LATENCY",
    "QUICK",
    "RATE",
    "STANDARD",
    "SUITES",
    "TRANSPORTS",
    "WARMUP",
    "Cell",
    "Plan",
    "ProcessSpec",
    "SpecError",
    "UnitSpec",
    "format_size",
    "latency_count",
    "layout",
    "pacing",
    "parse_size",
]

SUITES: Final = ("fanout", "fanin", "relay", "spread")
TRANSPORTS: Final = ("local", "shm", "tcp")

RATE: Final = 0
LATENCY: Final = 1
END: Final = 2
WARMUP: Final = 3

#: Largest message size a run accepts: a bound on what each process holds.
MAX_SIZE: Final = 64 * 1024 * 1024
#: Smallest message size: every message starts with a 32-byte header.
MIN_SIZE: Final = 32
#: Largest N: every unit may be a process, and the machine has few cores.
MAX_CLIENTS: Final = 64
#: The latency phase moves at most this many bytes/s in all (50 MB/s: 1 MiB every
#: 21 ms), so that no framework under test is saturated by it.
PACED_BYTES_PER_S: Final = 50e6

_UNITS = {"": 1, "B": 1, "K": 1024, "KIB": 1024, "KB": 1000, "M": 1024**2, "MIB": 1024**2}
_UNITS |= {"MB": 1000**2, "G": 1024**3, "GIB": 1024**3, "GB": 1000**3}
_SIZE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


class SpecError(ValueError):
    """A bad option (unknown suite, size that does not parse, ...): a one-line message
    meant for the user, never a traceback."""


def parse_size(text: str) -> int:
    """Bytes in *text*: ``64``, ``64B``, ``1KiB``, ``1MiB``, ``4K`` (= KiB), ``1KB``
    (= 1000 B), ... Raises :class:`SpecError` for anything else, below 32 B or above
    64 MiB."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise SpecError(
            f"size {text!r} is not a byte count; write e.g. 64, 64B, 1KiB, 64KiB or 1MiB"
        )
    size = int(match.group(1)) * _UNITS[unit]
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise SpecError(f"size {text!r} must be between {MIN_SIZE} B and {format_size(MAX_SIZE)}")
    return size


def format_size(size: int) -> str:
    """``1 KiB``, ``1 MiB``, ``64 B``, ``1.5 KiB``: short and exact for powers of two."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            value = size / scale
            return f"{value:g} {unit}" if value == round(value, 2) else f"{value:.2f} {unit}"
    return f"{size} B"


def pacing(size: int, period: float) -> float:
    """Seconds between two latency-phase messages of a cell (all sources together):
    *period*, or longer for large messages (see :data:`PACED_BYTES_PER_S`)."""
    return max(period, size / PACED_BYTES_PER_S)


def latency_count(plan: Plan, size: int, sources: int) -> int:
    """Latency-phase messages each of *sources* sources publishes: ``latency_samples``
    in all, fewer when that would take longer than ``latency_seconds`` (but at least
    10 in all and 2 per source)."""
    fits = int(plan.latency_seconds / pacing(size, plan.period))
    total = max(10, min(plan.latency_samples, fits))
    return max(2, -(-total // sources))


@dataclass(frozen=True, slots=True)
class Plan:
    """How long each cell runs. ``count`` (when set) caps the RATE phase of each source
    at that many messages, ``duration`` always bounds it in seconds; sinks leave the
    first ``warmup`` seconds of the RATE phase out of msgs/s and loaded latency, and
    the first tenth of the LATENCY phase out of the latency figures. The LATENCY phase
    sends ``latency_samples`` messages, fewer when they would take more than
    ``latency_seconds`` at the cell's :func:`pacing`; ``period`` is the pacing of small
    messages."""

    duration: float = 2.0
    count: int | None = None
    warmup: float = 0.2
    latency_samples: int = 300
    latency_seconds: float = 1.5
    period: float = 0.001
    repeats: int = 3
    floor_round_trips: int = 1000
    loan: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.duration <= 600:
            raise SpecError(f"duration {self.duration!r} s must be in (0, 600]")
        if self.count is not None and not 0 < self.count <= 100_000_000:
            raise SpecError(f"count {self.count!r} must be in [1, 100000000]")
        if not 0 <= self.warmup < self.duration:
            raise SpecError(f"warm-up {self.warmup!r} s must be shorter than the duration")
        if not 1 <= self.latency_samples <= 100_000:
            raise SpecError(f"latency samples {self.latency_samples!r} must be in [1, 100000]")
        if not 0 < self.latency_seconds <= 600:
            raise SpecError(f"latency seconds {self.latency_seconds!r} must be in (0, 600]")
        if not 0 < self.period <= 1.0:
            raise SpecError(f"period {self.period!r} s must be in (0, 1]")
        if not 1 <= self.repeats <= 100:
            raise SpecError(f"repeats {self.repeats!r} must be in [1, 100]")
        if not 1 <= self.floor_round_trips <= 1_000_000:
            raise SpecError(f"floor round trips {self.floor_round_trips!r} must be >= 1")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: The default plan (about 3 s per cell and repeat).
STANDARD: Final = Plan()
#: ``--quick``: one short repeat of each cell.
QUICK: Final = Plan(
    duration=0.5,
    warmup=0.1,
    latency_samples=50,
    latency_seconds=0.4,
    repeats=1,
    floor_round_trips=200,
)


@dataclass(frozen=True, slots=True)
class Cell:
    """One measured combination."""

    suite: str
    transport: str
    size: int
    clients: int

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise SpecError(f"unknown suite {self.suite!r}; use one of {', '.join(SUITES)}")
        if self.transport not in TRANSPORTS:
            raise SpecError(
                f"unknown transport {self.transport!r}; use one of {', '.join(TRANSPORTS)}"
            )
        if not MIN_SIZE <= self.size <= MAX_SIZE:
            raise SpecError(
                f"size {self.size} must be between {MIN_SIZE} B and {format_size(MAX_SIZE)}"
            )
        if not 1 <= self.clients <= MAX_CLIENTS:
            raise SpecError(f"clients {self.clients} must be between 1 and {MAX_CLIENTS}")

    @property
    def label(self) -> str:
        return f"{self.suite}/{self.transport}/{format_size(self.size)}/N={self.clients}"

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.suite, self.transport, self.size, self.clients)

    @property
    def applicable(self) -> str | None:
        """Why this cell cannot be measured at all (None when it can)."""
        if self.suite == "spread" and self.transport == "local":
            return "spread puts every unit in its own process; local is same-process only"
        return None


@dataclass(frozen=True, slots=True)
class UnitSpec:
    """One unit of a cell: a ``source`` (publishes *output*; one of *sources* sources,
    which stagger their paced messages), a ``relay`` (subscribes to *input*, republishes
    on *output*) or a ``sink`` (subscribes to *input*, measures; expects the END of
    *sources* sources)."""

    kind: str
    index: int
    input: str | None
    output: str | None
    sources: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UnitSpec:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """The units one worker process hosts."""

    units: tuple[UnitSpec, ...]

    @property
    def roles(self) -> str:
        """``source``, ``4 sinks``, ``relay+sink``: for progress lines and errors."""
        kinds: dict[str, int] = {}
        for unit in self.units:
            kinds[unit.kind] = kinds.get(unit.kind, 0) + 1
        return "+".join(kind if n == 1 else f"{n} {kind}s" for kind, n in kinds.items())


def layout(cell: Cell, prefix: str) -> list[ProcessSpec]:
    """The worker processes of *cell*, topics under *prefix* (unique per cell run)."""
    n = cell.clients
    if cell.applicable is not None:
        raise SpecError(f"{cell.label}: {cell.applicable}")
    if cell.suite == "fanout":
        topic = f"{prefix}/out"
        source = [UnitSpec("source", 0, None, topic)]
        sinks = [UnitSpec("sink", i, topic, None, sources=1) for i in range(n)]
        groups = [source + sinks] if cell.transport == "local" else [source, sinks]
    elif cell.suite == "fanin":
        topic = f"{prefix}/in"
        sources = [UnitSpec("source", i, None, topic, sources=n) for i in range(n)]
        sink = [UnitSpec("sink", 0, topic, None, sources=n)]
        groups = [sources + sink] if cell.transport == "local" else [sources, sink]
    else:  # relay and spread: a chain of n relays
        topics = [f"{prefix}/hop{k}" for k in range(n + 1)]
        chain = [UnitSpec("source", 0, None, topics[0])]
        chain += [UnitSpec("relay", k, topics[k - 1], topics[k]) for k in range(1, n + 1)]
        chain.append(UnitSpec("sink", 0, topics[n], None, sources=1))
        if cell.transport == "local":
            groups = [chain]
        elif cell.suite == "spread":
            groups = [[unit] for unit in chain]
        else:
            groups = [chain[0::2], chain[1::2]]
    return [ProcessSpec(tuple(group)) for group in groups]
