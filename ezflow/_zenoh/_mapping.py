"""What every bridge mapping shares: its counters and state, the rate-limited log of
the samples it refuses, and the supervisor that restarts it after a failure.

A mapping's **state** (``MappingStats.state``, shown by ``ezflow top --fleet``):
``live`` (data flows: an export's topic has a publisher, an import has an open topic),
``waiting`` (armed, nothing to carry: no publisher of the exported topic, no sample
imported yet or every imported topic ended), ``restarting`` (it failed and starts again
after a backoff; ``reason`` says why), ``failed`` (it stopped for good: its graph closed)
and ``stopped`` (the bridge stopped it).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .._core._config import (
    ZENOH_LOSSLESS_QUEUE,
    ZENOH_QUEUE,
    ZENOH_RESTART_FIRST,
    ZENOH_RESTART_MAX,
)
from .._core._exceptions import ClosedResourceError
from .._core._peerlog import BadPeerLog
from ._wire import Refused

__all__ = ["MappingStats", "queue_of", "supervise"]

log = logging.getLogger("ezflow.zenoh")


def queue_of(lossless: bool, queue: int | None) -> int:
    """The queue of a mapping that names *queue* (None: none): a leaky one's samples
    (messages, on an export's subscriber), ``ZENOH_QUEUE`` by default; a lossless
    import's window in messages, ``ZENOH_LOSSLESS_QUEUE`` by default (a lossless
    export has no queue of its own: its importers' windows bound it)."""
    if queue is not None:
        return queue
    return ZENOH_LOSSLESS_QUEUE if lossless else ZENOH_QUEUE


@dataclass
class MappingStats:
    """Counters and state of one mapping (see the module doc for the states)."""

    messages: int = 0  #: exported, or imported and published
    samples: int = 0  #: Zenoh samples put, or received (a batch carries several messages)
    bytes: int = 0
    dropped_local: int = 0  #: dropped by this end's queue (leaky; or a stalled import)
    lost_remote: int = 0  #: gaps in the importer's sequence: lost between the hosts
    dropped_remote: int = 0  #: drops the exporters reported (their leaky queues)
    #: taken from one side and never handed to the other because a stop cut them (or a
    #: failed put lost them); for an import, also published messages its subscribers had
    #: not taken when the stop came (they may still arrive)
    lost_in_flight: int = 0
    #: samples (or messages of a batch) refused, by cause (see ``_wire.CAUSES``)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    state: str = "waiting"
    reason: str = ""  #: why it is restarting or failed
    restarts: int = 0
    latency_ns: collections.deque[int] = field(
        default_factory=lambda: collections.deque(maxlen=1024)
    )

    def latency_p50_us(self) -> float | None:
        """Median publish → import latency of the latest samples (cross-host clocks)."""
        if not self.latency_ns:
            return None
        ordered = sorted(self.latency_ns)
        return ordered[len(ordered) // 2] / 1e3

    def to_wire(self) -> dict[str, Any]:
        """As plain data (``ZenohBridge.summary``, the fleet's ``top``)."""
        return {
            "state": self.state,
            "reason": self.reason,
            "messages": self.messages,
            "samples": self.samples,
            "bytes": self.bytes,
            "dropped_local": self.dropped_local,
            "lost_remote": self.lost_remote,
            "dropped_remote": self.dropped_remote,
            "lost_in_flight": self.lost_in_flight,
            "refused": dict(sorted(self.refused.items())),
            "restarts": self.restarts,
            "latency_p50_us": self.latency_p50_us(),
        }


class Refusals:
    """Counts refused samples in *stats* by cause and logs them rate-limited (the policy
    of :class:`~ezflow._core._peerlog.BadPeerLog`). Call from the event loop."""

    def __init__(self, name: str, stats: MappingStats) -> None:
        self._stats = stats
        self._log = BadPeerLog(log, name, summary="samples refused")

    def __call__(self, refused: Refused, where: str, count: int = 1) -> None:
        self._stats.refused[refused.cause] += count
        self._log(
            refused.cause, "a sample on %s was refused (%s): %s", where, refused.cause, refused
        )

    def close(self) -> None:
        self._log.close()


async def supervise(
    name: str,
    stats: MappingStats,
    run: Callable[[], Awaitable[None]],
    progress: Callable[[], int],
    recover: Callable[[], Awaitable[None]],
) -> None:
    """Run *run* until it returns (a stop) or the graph closes; when it fails, log it,
    set the state ``restarting``, and after a backoff (``ZENOH_RESTART_FIRST``, doubled
    after each failure without *progress* - a counter that moves when the mapping carries
    something - up to ``ZENOH_RESTART_MAX``) call *recover* (which renews what may have
    broken; a failure there is one more failure) and run it again."""
    delay = ZENOH_RESTART_FIRST
    while True:
        before = progress()
        started = time.monotonic()
        inner = asyncio.ensure_future(run())
        try:
            try:
                await asyncio.shield(inner)
            except asyncio.CancelledError:
                if not inner.done():  # we were cancelled (a stop): so is the mapping
                    inner.cancel()
                    await asyncio.gather(inner, return_exceptions=True)
                    raise
                inner.result()  # the mapping's own failure (or its cancellation)
            return
        except asyncio.CancelledError:
            raise
        except ClosedResourceError as exc:  # its graph context closed: nothing to restart
            stats.state, stats.reason = "failed", f"the graph closed ({exc})"
            log.warning("%s stops: %s", name, stats.reason)
            return
        except Exception as exc:
            if progress() != before or time.monotonic() - started > ZENOH_RESTART_MAX:
                delay = ZENOH_RESTART_FIRST  # it ran well for a while: a new failure
            stats.restarts += 1
            stats.state = "restarting"
            stats.reason = f"{type(exc).__name__}: {exc}"
            log.warning(
                "%s failed (%s); restarting it in %.1f s (the other mappings go on)",
                name,
                stats.reason,
                delay,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, ZENOH_RESTART_MAX)
        try:
            await recover()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # (counted as the next failure, without running)
            stats.reason = f"recovering: {type(exc).__name__}: {exc}"
            log.warning("%s: %s", name, stats.reason)
            continue
        log.info("%s restarts", name)
