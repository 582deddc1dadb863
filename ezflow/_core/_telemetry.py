"""Telemetry: cheap histograms, snapshot types, per-channel events and the hook registry.

Every channel, inbox and outlet keeps plain integer counters and a few
:class:`Histogram` objects (recording a value is a ``bit_length``, two shifts and a list
index). Nothing else happens on the message path unless a *hook* is attached: the
registries below are lists shared by every channel of the process, so a channel checks
one list for emptiness per message and builds an event object only when it is not empty.

A hook is any object with one or more of the methods ``on_publish``, ``on_deliver``,
``on_drop`` and ``on_snapshot`` (subclass :class:`Hook` for the signatures). Only the
methods a hook really defines are registered, so a hook that wants snapshots only adds
nothing per message. Hooks run synchronously on the event loop of the process, must be
quick, and must not block; an exception from a hook is logged (rate-limited) and
otherwise ignored.

Snapshots (:class:`ProcessSnapshot` and its parts) are plain frozen dataclasses with
``to_wire``/``from_wire`` to travel to the graph server as msgpack maps. ``from_wire``
checks every field and raises :class:`ProtocolError` for anything malformed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Final, Literal

from ._config import JSONL_MAX_BYTES, MAX_SNAPSHOT_SUBSCRIBERS
from ._exceptions import ConfigurationError, ProtocolError

__all__ = [
    "HISTOGRAM_BUCKETS",
    "MAX_SNAPSHOT_SUBSCRIBERS",
    "ChannelSnapshot",
    "DeliverEvent",
    "DropEvent",
    "DropReason",
    "Histogram",
    "HistogramSnapshot",
    "Hook",
    "JsonLinesExporter",
    "ProcessSnapshot",
    "PublishEvent",
    "PublisherSnapshot",
    "SubscriberSnapshot",
    "add_hook",
    "bucket_bounds",
    "bucket_index",
    "emit",
    "format_ns",
    "hooks",
    "remove_hook",
    "snapshot_entries",
]

log = logging.getLogger("ezflow.telemetry")

#: Buckets of a :class:`Histogram`: bucket ``i`` holds the values whose ``bit_length()``
#: is ``i`` (0; 1; 2..3; 4..7; ... up to 2**64 - 1): log2 buckets.
HISTOGRAM_BUCKETS: Final = 65

DropReason = Literal["overflow", "upstream", "undecodable"]


def bucket_index(value: int) -> int:
    """The bucket of *value*: its ``bit_length()``, 0 for values below 1, the last bucket
    for values of 2**64 and above."""
    if value < 1:
        return 0
    return min(value.bit_length(), HISTOGRAM_BUCKETS - 1)


def bucket_bounds(index: int) -> tuple[int, int]:
    """``(low, high)``: bucket *index* holds the values ``low <= v < high``."""
    if index == 0:
        return 0, 1
    return 1 << (index - 1), 1 << index


class Histogram:
    """A histogram of non-negative integers (nanoseconds, in ezflow) in log2 buckets,
    with their total and maximum.

    Recording costs an ``int.bit_length()`` and a list index, so the message path does
    it inline (``h.buckets[v.bit_length()] += 1; h.total += v``, and ``h.max`` where
    the maximum is kept); :meth:`record` is the same as a method, for cold paths. The
    count is the sum of the buckets. A histogram whose ``max`` is never set reports the
    top of its highest bucket instead. Percentiles come from :meth:`snapshot`,
    interpolated within a bucket (a bucket spans a factor of two).
    """

    __slots__ = ("buckets", "max", "total")

    def __init__(self) -> None:
        self.buckets = [0] * HISTOGRAM_BUCKETS
        self.total = 0
        self.max = 0

    def record(self, value: int) -> None:
        """Add one value; a negative value (a clock step) counts as 0, values of 2**64
        and above go to the last bucket."""
        if value < 0:  # noqa: PLR1730 - a branch is cheaper than a max() call
            value = 0
        self.buckets[min(value.bit_length(), HISTOGRAM_BUCKETS - 1)] += 1
        self.total += value
        if value > self.max:  # noqa: PLR1730 - a branch is cheaper than a max() call
            self.max = value

    def snapshot(self) -> HistogramSnapshot:
        """The figures now, as an immutable value."""
        buckets = tuple((i, n) for i, n in enumerate(self.buckets) if n)
        top = self.max
        if not top and buckets:
            top = bucket_bounds(buckets[-1][0])[1] - 1
        return HistogramSnapshot(
            count=sum(n for _, n in buckets), total=self.total, max=top, buckets=buckets
        )

    def __repr__(self) -> str:
        return f"<Histogram {self.snapshot().describe()}>"


def _int(data: dict[str, Any], name: str) -> int:
    value = data.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"telemetry field {name!r} must be an int, got {type(value).__name__}")
    return value


def _float(data: dict[str, Any], name: str) -> float:
    value = data.get(name)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ProtocolError(f"telemetry field {name!r} must be a number")
    return float(value)


def _str(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        raise ProtocolError(f"telemetry field {name!r} must be a str")
    return value


def _map(data: object, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(f"telemetry {what} must be a map, got {type(data).__name__}")
    return data


def _list(data: dict[str, Any], name: str, limit: int) -> list[Any]:
    value = data.get(name)
    if not isinstance(value, list):
        raise ProtocolError(f"telemetry field {name!r} must be a list")
    if len(value) > limit:
        raise ProtocolError(f"telemetry field {name!r} has {len(value)} entries (limit {limit})")
    return value


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """An immutable histogram: ``count`` values summing to ``total``, the largest
    ``max``, and ``buckets`` as ``(index, count)`` pairs of the non-empty log2 buckets
    (see :func:`bucket_bounds`). Values are nanoseconds in every ezflow snapshot."""

    count: int = 0
    total: int = 0
    max: int = 0
    buckets: tuple[tuple[int, int], ...] = ()

    def quantile(self, q: float) -> int | None:
        """An estimate of the *q*-quantile (0 <= q <= 1), interpolated linearly within
        the log2 bucket that holds it and never above :attr:`max`; ``None`` when empty."""
        if not self.count:
            return None
        rank = min(max(1.0, q * self.count), float(self.count))
        seen = 0
        for index, n in self.buckets:
            if seen + n >= rank:
                low, high = bucket_bounds(index)
                estimate = low + (high - low) * (rank - seen - 0.5) / n
                return min(max(low, round(estimate)), self.max)
            seen += n
        return self.max

    @property
    def p50(self) -> int | None:
        """The median estimate (``None`` when empty)."""
        return self.quantile(0.5)

    @property
    def p99(self) -> int | None:
        """The 99th percentile estimate (``None`` when empty)."""
        return self.quantile(0.99)

    @property
    def mean(self) -> float | None:
        """``total / count`` (``None`` when empty)."""
        return self.total / self.count if self.count else None

    def count_below(self, bound: int) -> int:
        """Values below *bound*: exact when *bound* is a power of two (a bucket
        boundary), else counted by bucket lower bound."""
        return sum(n for index, n in self.buckets if bucket_bounds(index)[0] < bound)

    def since(self, earlier: HistogramSnapshot) -> HistogramSnapshot:
        """The values recorded after *earlier* (a snapshot of the same histogram);
        ``max`` stays the all-time maximum (the histogram does not keep it per interval)."""
        before = dict(earlier.buckets)
        buckets = tuple(
            (index, n - before.get(index, 0))
            for index, n in self.buckets
            if n > before.get(index, 0)
        )
        return HistogramSnapshot(
            count=max(0, self.count - earlier.count),
            total=max(0, self.total - earlier.total),
            max=self.max,
            buckets=buckets,
        )

    def describe(self) -> str:
        """``count=.. p50=.. p99=.. max=..`` in readable units."""
        return (
            f"count={self.count} p50={format_ns(self.p50)} p99={format_ns(self.p99)} "
            f"max={format_ns(self.max if self.count else None)}"
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "total": self.total,
            "max": self.max,
            "buckets": [list(pair) for pair in self.buckets],
        }

    @classmethod
    def from_wire(cls, data: object) -> HistogramSnapshot:
        data = _map(data, "histogram")
        buckets = []
        for pair in _list(data, "buckets", HISTOGRAM_BUCKETS):
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
                or not 0 <= pair[0] < HISTOGRAM_BUCKETS
            ):
                raise ProtocolError("telemetry histogram bucket must be [index, count]")
            buckets.append((pair[0], pair[1]))
        return cls(_int(data, "count"), _int(data, "total"), _int(data, "max"), tuple(buckets))


def format_ns(value: float | None) -> str:
    """``"42 µs"``-style text for a duration in nanoseconds; ``"-"`` for ``None``."""
    if value is None:
        return "-"
    if value < 1_000:
        return f"{value:.0f} ns"
    if value < 1_000_000:
        return f"{value / 1e3:.3g} µs"
    if value < 1_000_000_000:
        return f"{value / 1e6:.3g} ms"
    return f"{value / 1e9:.3g} s"


@dataclass(frozen=True, slots=True)
class SubscriberSnapshot:
    """One subscriber's share of a channel: its inbox and how fast it consumes.

    ``handler`` is the time from a message being handed to the subscriber until it asks
    for the next one (its callback time, in a unit), sampled: one message in 16.
    ``dropped_overflow`` counts what a leaky inbox discarded to keep the newest
    ``queue`` messages, ``dropped_upstream`` what the publisher dropped for it (parked
    and replaced: the subscriber had no room). ``callback_errors`` counts the exceptions
    an ``on_message`` callback raised (0 for a queueing subscriber, and in reports of
    versions that did not send it).
    """

    subscriber_id: str
    leaky: bool
    queued: int
    received: int
    taken: int
    dropped_overflow: int
    dropped_upstream: int
    handler: HistogramSnapshot
    callback_errors: int = 0

    def to_wire(self) -> dict[str, Any]:
        data = asdict(self)
        data["handler"] = self.handler.to_wire()
        return data

    @classmethod
    def from_wire(cls, data: object) -> SubscriberSnapshot:
        data = _map(data, "subscriber")
        return cls(
            subscriber_id=_str(data, "subscriber_id"),
            leaky=bool(data.get("leaky")),
            queued=_int(data, "queued"),
            received=_int(data, "received"),
            taken=_int(data, "taken"),
            dropped_overflow=_int(data, "dropped_overflow"),
            dropped_upstream=_int(data, "dropped_upstream"),
            handler=HistogramSnapshot.from_wire(data.get("handler")),
            callback_errors=_int(data, "callback_errors") if "callback_errors" in data else 0,
        )


@dataclass(frozen=True, slots=True)
class ChannelSnapshot:
    """One channel (one publisher as received by one process over one transport).

    Counters are cumulative since the channel opened; ``msgs_per_s``/``bytes_per_s`` are
    rates over the last report interval. ``latency`` is publish -> deliver (the
    publisher's clock at publish, this process's clock once decoded and handed to the
    inboxes; meaningful across hosts only as far as their clocks agree). ``queue_depth``
    is the messages waiting in the inboxes, ``buffers_in_use`` the messages the channel
    still holds against the publisher's window (delivered, not yet taken by every
    lossless subscriber). ``decode`` is a histogram of decode times sampled one message
    in 16; ``decode_seconds`` is the total estimated from those samples. ``rejoins``
    counts the times this process reopened a channel to the publisher after one was
    cut (a stall, a dead peer, a broken link): unlike the other counters it carries
    over from channel to channel (0 in reports of versions that did not send it).
    """

    publisher_id: str
    topic: str
    transport: str
    lossless: bool
    messages: int
    bytes: int
    deliveries: int
    decode_errors: int
    dropped_overflow: int
    dropped_upstream: int
    queue_depth: int
    buffers_in_use: int
    latency: HistogramSnapshot
    decode: HistogramSnapshot
    decode_seconds: float
    msgs_per_s: float
    bytes_per_s: float
    subscribers: tuple[SubscriberSnapshot, ...] = ()
    rejoins: int = 0

    @property
    def drops(self) -> int:
        """Every drop, whatever the reason."""
        return self.dropped_overflow + self.dropped_upstream

    def to_wire(self) -> dict[str, Any]:
        data = {
            name: getattr(self, name) for name in self.__dataclass_fields__ if name != "subscribers"
        }
        data["latency"] = self.latency.to_wire()
        data["decode"] = self.decode.to_wire()
        data["subscribers"] = [s.to_wire() for s in self.subscribers]
        return data

    @classmethod
    def from_wire(cls, data: object) -> ChannelSnapshot:
        data = _map(data, "channel")
        return cls(
            publisher_id=_str(data, "publisher_id"),
            topic=_str(data, "topic"),
            transport=_str(data, "transport"),
            lossless=bool(data.get("lossless")),
            messages=_int(data, "messages"),
            bytes=_int(data, "bytes"),
            deliveries=_int(data, "deliveries"),
            decode_errors=_int(data, "decode_errors"),
            dropped_overflow=_int(data, "dropped_overflow"),
            dropped_upstream=_int(data, "dropped_upstream"),
            queue_depth=_int(data, "queue_depth"),
            buffers_in_use=_int(data, "buffers_in_use"),
            latency=HistogramSnapshot.from_wire(data.get("latency")),
            decode=HistogramSnapshot.from_wire(data.get("decode")),
            decode_seconds=_float(data, "decode_seconds"),
            msgs_per_s=_float(data, "msgs_per_s"),
            bytes_per_s=_float(data, "bytes_per_s"),
            subscribers=tuple(
                SubscriberSnapshot.from_wire(s)
                for s in _list(data, "subscribers", MAX_SNAPSHOT_SUBSCRIBERS)
            ),
            rejoins=_int(data, "rejoins") if "rejoins" in data else 0,
        )


@dataclass(frozen=True, slots=True)
class PublisherSnapshot:
    """One publisher: cumulative counters, rates over the last report interval,
    ``wait`` (time ``publish`` spent waiting for lossless subscribers: backpressure),
    ``drops`` (messages dropped on this side for leaky subscribers without room),
    ``shm_in_use`` (its shared-memory blocks leased by subscribers or being written),
    ``stalled_cut`` (lossless channels cut by its ``stall_timeout``) and
    ``dead_channels`` (channels whose peer fell silent past the heartbeat deadline)."""

    publisher_id: str
    topic: str
    channels: int
    messages: int
    bytes: int
    drops: int
    waits: int
    wait: HistogramSnapshot
    shm_in_use: int
    msgs_per_s: float
    bytes_per_s: float
    stalled_cut: int = 0
    dead_channels: int = 0

    def to_wire(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["wait"] = self.wait.to_wire()
        return data

    @classmethod
    def from_wire(cls, data: object) -> PublisherSnapshot:
        data = _map(data, "publisher")
        return cls(
            publisher_id=_str(data, "publisher_id"),
            topic=_str(data, "topic"),
            channels=_int(data, "channels"),
            messages=_int(data, "messages"),
            bytes=_int(data, "bytes"),
            drops=_int(data, "drops"),
            waits=_int(data, "waits"),
            wait=HistogramSnapshot.from_wire(data.get("wait")),
            shm_in_use=_int(data, "shm_in_use"),
            msgs_per_s=_float(data, "msgs_per_s"),
            bytes_per_s=_float(data, "bytes_per_s"),
            stalled_cut=_int(data, "stalled_cut"),
            dead_channels=_int(data, "dead_channels"),
        )


@dataclass(frozen=True, slots=True)
class ProcessSnapshot:
    """Everything one :class:`~ezflow.GraphContext` measures, at one moment.

    ``time`` is the wall clock (Unix seconds) when taken, ``interval`` the seconds the
    rates cover. ``truncated`` counts channels and publishers left out because the
    report would have exceeded its limits (``MAX_TELEMETRY_ENTRIES``).
    """

    name: str
    pid: int
    hostname: str
    time: float
    interval: float
    channels: tuple[ChannelSnapshot, ...] = ()
    publishers: tuple[PublisherSnapshot, ...] = ()
    truncated: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "hostname": self.hostname,
            "time": self.time,
            "interval": self.interval,
            "channels": [c.to_wire() for c in self.channels],
            "publishers": [p.to_wire() for p in self.publishers],
            "truncated": self.truncated,
        }

    @classmethod
    def from_wire(cls, data: object, *, limit: int = 1 << 20) -> ProcessSnapshot:
        """Parse and check a snapshot; at most *limit* channels and publishers each."""
        data = _map(data, "snapshot")
        return cls(
            name=_str(data, "name"),
            pid=_int(data, "pid"),
            hostname=_str(data, "hostname"),
            time=_float(data, "time"),
            interval=_float(data, "interval"),
            channels=tuple(ChannelSnapshot.from_wire(c) for c in _list(data, "channels", limit)),
            publishers=tuple(
                PublisherSnapshot.from_wire(p) for p in _list(data, "publishers", limit)
            ),
            truncated=_int(data, "truncated"),
        )

    def to_json(self) -> str:
        """One line of JSON (what :class:`JsonLinesExporter` writes)."""
        return json.dumps(self.to_wire(), separators=(",", ":"), ensure_ascii=False)


# -- events -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishEvent:
    """A publisher sent a message: *nbytes* encoded (0 when only local subscribers
    needed it), handed to *channels* channels; *time_ns* is the publish time carried to
    the subscribers."""

    topic: str
    publisher_id: str
    seq: int
    nbytes: int
    channels: int
    time_ns: int


@dataclass(frozen=True, slots=True)
class DeliverEvent:
    """A channel delivered a message to *subscribers* local subscribers. *latency_ns* is
    publish -> deliver (``None`` when the transport did not carry the publish time),
    *decode_ns* the decode time when this message was one of the sampled ones (one in
    16), else 0 (always 0 for the local transport)."""

    topic: str
    publisher_id: str
    transport: str
    seq: int
    nbytes: int
    subscribers: int
    latency_ns: int | None
    decode_ns: int


@dataclass(frozen=True, slots=True)
class DropEvent:
    """*count* messages of *topic* will never reach subscriber *subscriber_id*:
    ``reason="overflow"`` — its leaky inbox discarded the oldest to keep the newest;
    ``reason="upstream"`` — the publisher dropped them for it (leaky, no room);
    ``reason="undecodable"`` — it could not be decoded here (leaky subscribers only: a
    lossless one gets the error from ``recv()``). Upstream drops are reported when the
    next message arrives (the count travels with it)."""

    topic: str
    publisher_id: str
    subscriber_id: str
    reason: DropReason
    count: int


class Hook:
    """Base class of telemetry hooks: override any of the methods below and register
    an instance with :func:`add_hook`. Methods not overridden cost nothing.

    Every method is called synchronously on the event loop thread of the process that
    sees the event (per message for ``on_publish``/``on_deliver``: keep them quick); an
    exception is logged and otherwise ignored.
    """

    def on_publish(self, event: PublishEvent) -> None:
        """A publisher of this process sent a message."""

    def on_deliver(self, event: DeliverEvent) -> None:
        """A channel of this process delivered a message to its subscribers."""

    def on_drop(self, event: DropEvent) -> None:
        """Messages were dropped for a leaky subscriber of this process."""

    def on_snapshot(self, snapshot: ProcessSnapshot) -> None:
        """A :class:`~ezflow.GraphContext` of this process took its periodic snapshot
        (every ``telemetry_interval`` seconds, default 1)."""


_METHODS: Final = ("on_publish", "on_deliver", "on_drop", "on_snapshot")

#: The registered callables per event, shared by every channel and outlet of the
#: process (mutated in place, so holders of a reference see changes).
PUBLISH_HOOKS: Final[list[Callable[[PublishEvent], object]]] = []
DELIVER_HOOKS: Final[list[Callable[[DeliverEvent], object]]] = []
DROP_HOOKS: Final[list[Callable[[DropEvent], object]]] = []
SNAPSHOT_HOOKS: Final[list[Callable[[ProcessSnapshot], object]]] = []
_REGISTRIES: Final[dict[str, list[Any]]] = {
    "on_publish": PUBLISH_HOOKS,
    "on_deliver": DELIVER_HOOKS,
    "on_drop": DROP_HOOKS,
    "on_snapshot": SNAPSHOT_HOOKS,
}
_hooks: list[object] = []
_errors = 0


def _methods(hook: object) -> dict[str, Callable[..., object]]:
    found = {}
    for name in _METHODS:
        method = getattr(hook, name, None)
        if not callable(method):
            continue
        if isinstance(hook, Hook) and getattr(type(hook), name, None) is getattr(Hook, name):
            continue  # not overridden: costs nothing
        found[name] = method
    return found


def add_hook(hook: object) -> None:
    """Register *hook* for every event method it defines (``on_publish``,
    ``on_deliver``, ``on_drop``, ``on_snapshot``) in this process, for every channel and
    publisher, existing or future. Adding the same hook twice does nothing. Raises
    ``TypeError`` for an object with none of those methods."""
    if any(h is hook for h in _hooks):
        return
    methods = _methods(hook)
    if not methods:
        raise TypeError(
            f"{type(hook).__name__} is not a telemetry hook: it defines none of "
            f"{', '.join(_METHODS)}"
        )
    _hooks.append(hook)
    for name, method in methods.items():
        _REGISTRIES[name].append(method)


def remove_hook(hook: object) -> None:
    """Unregister *hook* (added with :func:`add_hook`); an unknown hook is ignored."""
    for i, registered in enumerate(_hooks):
        if registered is hook:
            del _hooks[i]
            break
    else:
        return
    for name, method in _methods(hook).items():
        registry = _REGISTRIES[name]
        for j, existing in enumerate(registry):
            if existing == method:
                del registry[j]
                break


def hooks() -> tuple[object, ...]:
    """The hooks registered now, in the order they were added."""
    return tuple(_hooks)


def emit(registry: list[Callable[[Any], object]], event: object) -> None:
    """Call every hook of *registry* with *event*, logging (not raising) their errors."""
    global _errors
    for method in tuple(registry):
        try:
            method(event)
        except Exception:
            _errors += 1
            if _errors <= 5 or _errors % 1000 == 0:
                log.exception("telemetry hook %r failed (%d failures so far)", method, _errors)


class JsonLinesExporter(Hook):
    """Writes every snapshot as one line of JSON to *path* (appending).

    Bounded: when the file would exceed *max_bytes*, it is renamed to ``PATH.1``
    (replacing an older one) and a new file is started, so at most twice *max_bytes* are
    kept. Use ``add_hook(JsonLinesExporter("telemetry.jsonl"))``; :meth:`close` (or
    :func:`remove_hook`, then ``close``) when done. Write errors are logged once and
    stop the exporter.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = JSONL_MAX_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ConfigurationError(f"max_bytes={max_bytes!r} must be a positive integer")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.lines = 0
        self._file: IO[str] | None = None
        self._size = 0
        self._failed = False

    def on_snapshot(self, snapshot: ProcessSnapshot) -> None:
        if self._failed:
            return
        line = snapshot.to_json() + "\n"
        size = len(line.encode())
        try:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                self._size = self._file.tell()
            if self._size and self._size + size > self.max_bytes:
                self._file.close()
                os.replace(self.path, f"{self.path}.1")
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                self._size = 0
            self._file.write(line)
            self._file.flush()
        except OSError as exc:
            self._failed = True
            log.error("telemetry: cannot write %s (%s); the exporter stops", self.path, exc)
            return
        self._size += size
        self.lines += 1

    def close(self) -> None:
        """Close the file (a later snapshot reopens it)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __repr__(self) -> str:
        return f"JsonLinesExporter({str(self.path)!r})"


def snapshot_entries(items: Iterable[Any], limit: int) -> tuple[list[Any], int]:
    """The first *limit* of *items* and how many were left out."""
    kept: list[Any] = []
    left = 0
    for item in items:
        if len(kept) < limit:
            kept.append(item)
        else:
            left += 1
    return kept, left
