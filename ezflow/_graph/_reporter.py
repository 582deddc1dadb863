"""The periodic telemetry snapshot of one GraphContext.

Every ``telemetry_interval`` seconds (default 1, ``EZFLOW_TELEMETRY_INTERVAL``; 0 turns
it off) the reporter task of a context reads the counters of its channels, subscribers
and publishers into a :class:`ProcessSnapshot`, hands it to the ``on_snapshot`` hooks
and sends it to the graph server as one ``report`` message. It runs off the message
path (reading counters only), and it never waits for the server: a report is skipped
while the connection has unsent data piled up or is gone, and the task carries on.

The reporter reads a context through :class:`ReportSource` only (its name, channel
records, publishers' outlets, shared-memory use, and a way to send): it knows nothing
else of ``GraphContext``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Iterable
from typing import Any, Protocol

from .._core._channel import Channel
from .._core._config import MAX_TELEMETRY_ENTRIES, MIN_TELEMETRY_INTERVAL, TRACE_REPORT_MAX
from .._core._inbox import Attachment
from .._core._outlet import Outlet
from .._core._telemetry import (
    MAX_SNAPSHOT_SUBSCRIBERS,
    SNAPSHOT_HOOKS,
    ChannelSnapshot,
    ProcessSnapshot,
    PublisherSnapshot,
    SubscriberSnapshot,
    emit,
    snapshot_entries,
)
from .._core._tracing import TRACING, wall_offset
from ._routing import ChannelRecord

__all__ = ["ReportSource", "TelemetryReporter"]

log = logging.getLogger("ezflow.telemetry")


class ReportSource(Protocol):
    """What a :class:`TelemetryReporter` reads: the narrow view a context gives it."""

    @property
    def name(self) -> str:
        """The context's name (shown by ``ezflow top``)."""
        ...

    def channel_records(self) -> Iterable[ChannelRecord]:
        """The channels of the context now."""
        ...

    def outlets(self) -> Iterable[Outlet]:
        """The sending halves of the context's open publishers."""
        ...

    def shm_in_use(self, outlet: Outlet) -> int:
        """Shared-memory blocks of *outlet* leased or being written (0 without shm)."""
        ...

    def send_report(self, snapshot: dict[str, Any]) -> bool:
        """Send a wire snapshot to the graph server without waiting; whether it went."""
        ...


class TelemetryReporter:
    """Builds snapshots of *source* and, with :meth:`run`, reports them periodically.

    Rates (messages and bytes per second) are computed against the previous periodic
    snapshot; :meth:`snapshot` with ``advance=False`` (what ``GraphContext.telemetry``
    does) leaves that baseline alone.
    """

    def __init__(self, source: ReportSource, interval: float) -> None:
        self._source = source
        self.interval = interval
        self._hostname = socket.gethostname()
        self._pid = os.getpid()
        self._last_time = time.monotonic()
        self._previous: dict[tuple[str, ...], tuple[int, int]] = {}
        self.reports_sent = 0
        self.reports_skipped = 0
        self._failures = 0
        self._reported_at = float("-inf")  # monotonic time of the last report

    # -- building --------------------------------------------------------------------------

    def snapshot(self, *, advance: bool = False) -> ProcessSnapshot:
        """The counters of the context now."""
        source = self._source
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        current: dict[tuple[str, ...], tuple[int, int]] = {}

        def rates(key: tuple[str, ...], messages: int, nbytes: int) -> tuple[float, float]:
            current[key] = (messages, nbytes)
            before = self._previous.get(key, (0, 0))
            return (
                max(0, messages - before[0]) / elapsed,
                max(0, nbytes - before[1]) / elapsed,
            )

        channels, left_channels = snapshot_entries(source.channel_records(), MAX_TELEMETRY_ENTRIES)
        channel_snapshots = tuple(
            self._channel(record.channel, record.key[1], record.attachments, rates)
            for record in channels
        )
        outlets, left_publishers = snapshot_entries(
            source.outlets(), max(0, MAX_TELEMETRY_ENTRIES - len(channels))
        )
        publisher_snapshots = tuple(
            self._publisher(outlet, source.shm_in_use(outlet), rates) for outlet in outlets
        )
        if advance:
            self._previous = current
            self._last_time = now
        return ProcessSnapshot(
            name=source.name,
            pid=self._pid,
            hostname=self._hostname,
            time=time.time(),
            interval=elapsed,
            channels=channel_snapshots,
            publishers=publisher_snapshots,
            truncated=left_channels + left_publishers,
        )

    @staticmethod
    def _channel(
        channel: Channel,
        transport: str,
        attachments: dict[str, Attachment],
        rates: Any,
    ) -> ChannelSnapshot:
        stats = channel.stats
        msgs_per_s, bytes_per_s = rates(
            ("c", channel.publisher_id, transport), stats.messages, stats.bytes
        )
        subscribers, _ = snapshot_entries(attachments.items(), MAX_SNAPSHOT_SUBSCRIBERS)
        return ChannelSnapshot(
            publisher_id=channel.publisher_id,
            topic=channel.topic,
            transport=transport,
            lossless=channel.lossless,
            messages=stats.messages,
            bytes=stats.bytes,
            deliveries=stats.deliveries,
            decode_errors=stats.decode_errors,
            dropped_overflow=stats.overflow_drops,
            dropped_upstream=stats.upstream_drops,
            queue_depth=sum(len(a.inbox) for a in attachments.values()),
            buffers_in_use=channel.pending,
            latency=channel.latency.snapshot(),
            decode=channel.decode_time.snapshot(),
            decode_seconds=stats.decode_seconds,
            msgs_per_s=msgs_per_s,
            bytes_per_s=bytes_per_s,
            subscribers=tuple(
                SubscriberSnapshot(
                    subscriber_id=sub_id,
                    leaky=attachment.inbox.leaky,
                    queued=len(attachment.inbox),
                    received=attachment.inbox.stats.received,
                    taken=attachment.inbox.stats.taken,
                    dropped_overflow=attachment.inbox.stats.dropped_overflow,
                    dropped_upstream=attachment.inbox.stats.dropped_upstream,
                    handler=attachment.inbox.handler_time.snapshot(),
                    callback_errors=attachment.inbox.stats.callback_errors,
                )
                for sub_id, attachment in subscribers
            ),
            rejoins=stats.rejoins,
        )

    @staticmethod
    def _publisher(outlet: Outlet, shm_in_use: int, rates: Any) -> PublisherSnapshot:
        stats = outlet.stats
        msgs_per_s, bytes_per_s = rates(("p", outlet.publisher_id), stats.messages, stats.bytes)
        return PublisherSnapshot(
            publisher_id=outlet.publisher_id,
            topic=outlet.topic,
            channels=len(outlet.links),
            messages=stats.messages,
            bytes=stats.bytes,
            drops=stats.drops,
            waits=stats.waits,
            wait=outlet.wait_time.snapshot(),
            shm_in_use=shm_in_use,
            msgs_per_s=msgs_per_s,
            bytes_per_s=bytes_per_s,
            stalled_cut=stats.stalled_cut,
            dead_channels=stats.dead_channels,
        )

    # -- reporting -------------------------------------------------------------------------

    def report(self) -> ProcessSnapshot:
        """Take the periodic snapshot: hand it to the hooks and send it to the server
        (skipped, not queued, when the connection cannot take it now)."""
        self._reported_at = time.monotonic()
        snapshot = self.snapshot(advance=True)
        if SNAPSHOT_HOOKS:
            emit(SNAPSHOT_HOOKS, snapshot)
        wire = snapshot.to_wire()
        hops = TRACING.take(TRACE_REPORT_MAX) if TRACING.hops else []
        # The hops this process finished since the last report, with what turns their
        # monotonic times into wall-clock times (OpenTelemetry wants those), and its
        # trace rates now (``ezflow trace --rate``; after a lease ended, the server
        # knows from it that this report has every hop finished under the lease).
        wire["trace"] = {
            "offset": wall_offset(),
            "hops": [hop.row() for hop in hops],
            "state": TRACING.state(),
            "interval": self.interval,
        }
        if self._source.send_report(wire):
            self.reports_sent += 1
        else:
            self.reports_skipped += 1
            TRACING.lost += len(hops)
        return snapshot

    async def report_traces(self) -> None:
        """Report now if trace hops are waiting (a context that closes: its process
        may end before the next periodic report). Waits first, at most
        ``MIN_TELEMETRY_INTERVAL``, so that the server does not take it for a report
        sent too soon after the last one."""
        if not TRACING.hops:
            return
        wait = self._reported_at + MIN_TELEMETRY_INTERVAL - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self.report()

    async def run(self) -> None:
        """Report every :attr:`interval` seconds until cancelled; errors are logged
        (rate-limited) and never end the task. While it runs, the process reports trace
        hops (``TRACING.reporters``)."""
        TRACING.reporters += 1
        try:
            while True:
                await asyncio.sleep(self.interval)
                try:
                    self.report()
                except Exception:
                    self._failures += 1
                    if self._failures <= 3 or self._failures % 100 == 0:
                        log.exception("telemetry report failed (%d so far)", self._failures)
        finally:
            TRACING.reporters -= 1
