"""What a perf run measures: suites, transports, sizes, plans, and each cell's processes.

A *cell* is one (suite, transport, message size, clients N) combination. Its units:

* ``fanout`` — one source publishes, N sinks subscribe to the same topic;
* ``fanin`` — N sources publish on one topic, one sink subscribes;
* ``relay`` — source -> relay 1 -> ... -> relay N -> sink, each relay a subscriber whose
  messages are republished by a publisher on the next topic;
* ``spread`` — the relay chain again, with every unit in its own process;
* ``p2p`` — one source, one sink (N is always 1): the program users write, measured
  in the variants of :class:`Variant` (the default one is the ordinary program).

Where the units run (the *layout*):

* transport ``local``: every unit in one process;
* ``fanout``/``fanin`` over ``shm``/``tcp``: the source(s) in one process, the sink(s)
  in another, so every edge crosses a process boundary and the receiving process gets
  each message once however many sinks it hosts (that is the point of a channel);
* ``relay`` over ``shm``/``tcp``: units alternate between two processes (source,
  relay 2, relay 4, ... in one; relay 1, relay 3, ..., in the other, the sink with the
  other parity), so every one of the N+1 edges crosses a process boundary, on 2 cores;
* ``spread``: N+2 processes (``spread`` over ``local`` is refused: one process cannot
  hold units that each have their own process);
* ``p2p`` over ``shm``/``tcp``: the source in one process, the sink in another.

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

The ``p2p`` suite differs where the ordinary program differs (see :class:`Variant`):

* its message is a tuple ``(phase, seq, t_ns, payload)``: Python ints and the payload,
  a random ``float32`` array of size/4 elements, or, for the named size ``frame``
  (:data:`FRAME_SIZE`), a random ``uint8`` array of shape :data:`FRAME_SHAPE`: the
  same array every message unless it is loaned (then a new loan, filled, each time);
* the LATENCY phase is paced at ``period`` (1 ms) whatever the size, 10 ms
  (:data:`FRAME_PERIOD`) for ``frame``;
* the RATE phase lasts at least ``duration`` seconds *and* at least
  ``min_messages`` messages, but never more than ``max_duration`` seconds (``frame``:
  ``duration`` only), so that a fast cell is not measured over a few milliseconds.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Final

__all__ = [
    "END",
    "FRAME_PERIOD",
    "FRAME_SHAPE",
    "FRAME_SIZE",
    "LATENCY",
    "LOOPS",
    "MESSAGES",
    "MIXED_TOPIC_SUFFIX",
    "QUICK",
    "RATE",
    "RECEIVES",
    "STANDARD",
    "SUITES",
    "SUITE_DESCRIPTIONS",
    "TRANSPORTS",
    "TWO_TOPICS",
    "WARMUP",
    "Cell",
    "Plan",
    "ProcessSpec",
    "SpecError",
    "UnitSpec",
    "Variant",
    "format_size",
    "latency_count",
    "layout",
    "p2p_pacing",
    "pacing",
    "parse_size",
    "parse_variant",
    "payload_layout",
    "suite_pacing",
]

SUITES: Final = ("fanout", "fanin", "relay", "spread", "p2p")
#: What each suite measures, in one line (the report's summary, docs/perf.md).
SUITE_DESCRIPTIONS: Final = {
    "p2p": "the ordinary program: one source, one sink, two processes, tuples and "
    "await recv() (variants: bare arrays, uvloop, on_message, loaned buffers, two topics "
    "mixed, and the same two topics with one shape)",
    "fanout": "1 source -> N sinks on one topic",
    "fanin": "N sources -> 1 sink on one topic",
    "relay": "source -> N relays -> sink, units alternating between two processes",
    "spread": "the relay chain with every unit in its own process (N+2 processes)",
}
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

#: The named size ``frame``: one 4K RGB video frame, a uint8 array of this shape.
FRAME_SHAPE: Final = (2160, 3840, 3)
FRAME_SIZE: Final = 2160 * 3840 * 3
#: Pacing of the p2p LATENCY phase for ``frame`` (a 100 Hz camera).
FRAME_PERIOD: Final = 0.01

#: The second topic of the ``mixed`` and ``pair`` p2p variants: the cell's topic with
#: this suffix.
MIXED_TOPIC_SUFFIX: Final = "/mixed"

#: The values of each field of a :class:`Variant`; the first one is the default.
MESSAGES: Final = ("tuple", "array", "mixed", "pair")
#: The message kinds that publish on two topics and read them with one task alternating
#: between two subscribers.
TWO_TOPICS: Final = ("mixed", "pair")
LOOPS: Final = ("asyncio", "uvloop")
RECEIVES: Final = ("recv", "on_message")

_UNITS = {"": 1, "B": 1, "K": 1024, "KIB": 1024, "KB": 1000, "M": 1024**2, "MIB": 1024**2}
_UNITS |= {"MB": 1000**2, "G": 1024**3, "GIB": 1024**3, "GB": 1000**3}
_SIZE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


class SpecError(ValueError):
    """A bad option (unknown suite, size that does not parse, ...): a one-line message
    meant for the user, never a traceback."""


def parse_size(text: str) -> int:
    """Bytes in *text*: ``64``, ``64B``, ``1KiB``, ``1MiB``, ``4K`` (= KiB), ``1KB``
    (= 1000 B), ..., or ``frame`` (:data:`FRAME_SIZE`). Raises :class:`SpecError` for
    anything else, below 32 B or above 64 MiB."""
    if text.strip().lower() == "frame":
        return FRAME_SIZE
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
    """``1 KiB``, ``1 MiB``, ``64 B``, ``1.5 KiB``: short and exact for powers of two;
    ``frame`` for :data:`FRAME_SIZE`."""
    if size == FRAME_SIZE:
        return "frame"
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            value = size / scale
            return f"{value:g} {unit}" if value == round(value, 2) else f"{value:.2f} {unit}"
    return f"{size} B"


def pacing(size: int, period: float) -> float:
    """Seconds between two latency-phase messages of a cell (all sources together):
    *period*, or longer for large messages (see :data:`PACED_BYTES_PER_S`)."""
    return max(period, size / PACED_BYTES_PER_S)


def p2p_pacing(size: int, period: float) -> float:
    """Seconds between two p2p latency-phase messages: *period*, :data:`FRAME_PERIOD`
    for ``frame`` (the p2p suite measures latency at the pacing users have, not at a
    pacing that spares the framework)."""
    return FRAME_PERIOD if size == FRAME_SIZE else period


def suite_pacing(suite: str, size: int, period: float) -> float:
    """The latency-phase pacing of *suite*: :func:`p2p_pacing` or :func:`pacing`."""
    return p2p_pacing(size, period) if suite == "p2p" else pacing(size, period)


def payload_layout(size: int) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of the p2p payload of *size* bytes: ``float32`` of size/4
    elements, or the ``uint8`` frame for :data:`FRAME_SIZE`."""
    if size == FRAME_SIZE:
        return FRAME_SHAPE, "uint8"
    return (size // 4,), "float32"


def latency_count(plan: Plan, size: int, sources: int, suite: str = "fanout") -> int:
    """Latency-phase messages each of *sources* sources publishes: ``latency_samples``
    in all, fewer when that would take longer than ``latency_seconds`` (but at least
    10 in all and 2 per source)."""
    fits = int(plan.latency_seconds / suite_pacing(suite, size, plan.period))
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
    messages. The p2p RATE phase also runs until ``min_messages`` messages are out,
    but no longer than ``max_duration`` seconds. ``shm_inline_limit`` (ezflow only)
    sets ``ShmOptions.inline_limit`` of every shm publisher: 0 sends every message
    through shared memory, :data:`MAX_SIZE` every one inline (the crossover)."""

    duration: float = 2.0
    count: int | None = None
    warmup: float = 0.2
    latency_samples: int = 1000
    latency_seconds: float = 1.5
    period: float = 0.001
    repeats: int = 3
    floor_round_trips: int = 1000
    loan: bool = True
    min_messages: int = 20_000
    max_duration: float = 6.0
    shm_inline_limit: int | None = None

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
        if not 0 <= self.min_messages <= 100_000_000:
            raise SpecError(f"min messages {self.min_messages!r} must be in [0, 100000000]")
        limit = self.shm_inline_limit
        if limit is not None and not 0 <= limit <= MAX_SIZE:
            raise SpecError(f"shm inline limit {limit!r} must be in [0, {MAX_SIZE}] bytes")
        if not self.duration <= self.max_duration <= 600:
            raise SpecError(f"max duration {self.max_duration!r} s must be in [duration, 600]")

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
    min_messages=5000,
    max_duration=1.5,
)


@dataclass(frozen=True, slots=True)
class Variant:
    """How the p2p program is written (ezflow's variants; peers run the default only).

    The default, ``Variant()``, is the ordinary program: a tuple message, plain
    ``asyncio.run``, ``await sub.recv()``, a private payload array. The others change
    one thing each (or several, joined with ``+``): ``array`` publishes the payload
    alone with the header in its first 32 bytes; ``mixed`` interleaves two topics of
    different shapes, the tuple on the cell's topic and a registered dataclass
    (:data:`MIXED_TOPIC_SUFFIX`), every other message, read by one task alternating
    between two subscribers: what per-stream codec state is for; ``pair`` is its control,
    the same two topics and the same alternating sink with the tuple on both (``mixed``
    against ``pair``: what interleaving two shapes costs, apart from what a second topic
    costs); ``uvloop`` runs on uvloop;
    ``on_message`` receives in a callback; ``loan`` fills a buffer from
    ``Publisher.loan`` (lent for shm at the inline limit and up, a private array
    otherwise).
    """

    message: str = "tuple"
    loop: str = "asyncio"
    receive: str = "recv"
    loan: bool = False

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("message", self.message, MESSAGES),
            ("loop", self.loop, LOOPS),
            ("receive", self.receive, RECEIVES),
        ):
            if value not in allowed:
                raise SpecError(f"unknown {name} {value!r}; use one of {', '.join(allowed)}")
        if self.message in TWO_TOPICS and (self.loan or self.receive != "recv"):
            raise SpecError(
                f"the {self.message} variant reads two subscribers with await recv() and "
                "publishes private arrays: it does not combine with loan or on_message"
            )

    @property
    def is_default(self) -> bool:
        return self == Variant()

    @property
    def label(self) -> str:
        """``ordinary`` for the default, else what differs joined with ``+``, e.g.
        ``array+uvloop+on_message``: :func:`parse_variant` reads it back."""
        parts = [
            value
            for value, default in (
                (self.message, "tuple"),
                (self.loop, "asyncio"),
                (self.receive, "recv"),
            )
            if value != default
        ]
        if self.loan:
            parts.append("loan")
        return "+".join(parts) or "ordinary"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Variant:
        return cls(**data)


def parse_variant(text: str) -> Variant:
    """A :class:`Variant` from its :attr:`Variant.label`: ``ordinary`` (or
    ``default``), or words joined with ``+`` among ``array``, ``tuple``, ``mixed``,
    ``pair``, ``uvloop``,
    ``asyncio``, ``on_message``, ``recv``, ``loan``, ``copy``. Raises
    :class:`SpecError` for an unknown word."""
    fields: dict[str, Any] = {}
    words = {
        "tuple": ("message", "tuple"),
        "array": ("message", "array"),
        "mixed": ("message", "mixed"),
        "pair": ("message", "pair"),
        "asyncio": ("loop", "asyncio"),
        "uvloop": ("loop", "uvloop"),
        "recv": ("receive", "recv"),
        "on_message": ("receive", "on_message"),
        "loan": ("loan", True),
        "copy": ("loan", False),
    }
    for word in text.strip().lower().split("+"):
        if word in ("ordinary", "default"):
            continue
        if word not in words:
            raise SpecError(
                f"unknown variant {word!r} in {text!r}; use ordinary or words joined "
                f"with '+' among {', '.join(words)} (e.g. array+uvloop+on_message)"
            )
        name, value = words[word]
        fields[name] = value
    return Variant(**fields)


@dataclass(frozen=True, slots=True)
class Cell:
    """One measured combination."""

    suite: str
    transport: str
    size: int
    clients: int
    #: How the p2p program is written; None for the other suites (bare arrays, the
    #: framework's default loop, ``Plan.loan``).
    variant: Variant | None = None

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
        if self.suite == "p2p":
            if self.clients != 1:
                raise SpecError(f"p2p has one source and one sink, not N={self.clients}")
            if self.variant is None:
                raise SpecError("a p2p cell needs a variant (Variant() is the ordinary one)")
            if self.size != FRAME_SIZE and self.size % 4:
                raise SpecError(
                    f"p2p size {self.size} B is not a multiple of 4 (its payload is float32)"
                )
        elif self.variant is not None:
            raise SpecError(f"variants are for the p2p suite, not {self.suite}")

    @property
    def label(self) -> str:
        size = format_size(self.size)
        if self.variant is not None:
            return f"{self.suite}/{self.transport}/{size}/{self.variant.label}"
        return f"{self.suite}/{self.transport}/{size}/N={self.clients}"

    @property
    def key(self) -> tuple[str, str, int, int, str]:
        variant = "" if self.variant is None else self.variant.label
        return (self.suite, self.transport, self.size, self.clients, variant)

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
    if cell.suite == "p2p":
        topic = f"{prefix}/p2p"
        pair = [UnitSpec("source", 0, None, topic), UnitSpec("sink", 0, topic, None, sources=1)]
        groups = [pair] if cell.transport == "local" else [pair[:1], pair[1:]]
    elif cell.suite == "fanout":
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
