"""The periodic telemetry snapshot of one GraphContext.

Every ``telemetry_interval`` seconds (default 1, ``EZFLOW_TELEMETRY_INTERVAL``; 0 turns
it off) the reporter task of a context reads the counters of its channels, subscribers
and publishers into a :class:`ProcessSnapshot`, hands it to the ``on_snapshot`` hooks
and sends it to the graph server as one ``report`` message. It runs off the message
path (reading counters only), and it never waits for the server: a report is skipped
while the connection has unsent data piled up or is gone, and the task carries on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from .._core._channel import Attachment, Channel
from .._core._config import MAX_TELEMETRY_ENTRIES
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

if TYPE_CHECKING:
    from ._context import GraphContext

__all__ = ["TelemetryReporter"]

log = logging.getLogger("ezflow.telemetry")


class TelemetryReporter:
    """Builds snapshots of *context* and, with :meth:`run`, reports them periodically.

    Rates (messages and bytes per second) are computed against the previous periodic
    snapshot; :meth:`snapshot` with ``advance=False`` (what ``GraphContext.telemetry``
    does) leaves that baseline alone.
    """

    def __init__(self, context: GraphContext, interval: float) -> None:
        self._context = context
        self.interval = interval
        self._hostname = socket.gethostname()
        self._pid = os.getpid()
        self._last_time = time.monotonic()
        self._previous: dict[tuple[str, ...], tuple[int, int]] = {}
        self.reports_sent = 0
        self.reports_skipped = 0
        self._failures = 0

    # -- building --------------------------------------------------------------------------

    def snapshot(self, *, advance: bool = False) -> ProcessSnapshot:
        """The counters of the context now."""
        context = self._context
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

        records = () if context._router is None else context._router.channels.values()
        channels, left_channels = snapshot_entries(records, MAX_TELEMETRY_ENTRIES)
        channel_snapshots = tuple(
            self._channel(record.channel, record.key[1], record.attachments, rates)
            for record in channels
        )
        publishers, left_publishers = snapshot_entries(
            context._publishers.values(), max(0, MAX_TELEMETRY_ENTRIES - len(channels))
        )
        publisher_snapshots = tuple(
            self._publisher(p._outlet, context._shm_in_use(p._outlet), rates) for p in publishers
        )
        if advance:
            self._previous = current
            self._last_time = now
        return ProcessSnapshot(
            name=context.name,
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
        )

    # -- reporting -------------------------------------------------------------------------

    def report(self) -> ProcessSnapshot:
        """Take the periodic snapshot: hand it to the hooks and send it to the server
        (skipped, not queued, when the connection cannot take it now)."""
        snapshot = self.snapshot(advance=True)
        if SNAPSHOT_HOOKS:
            emit(SNAPSHOT_HOOKS, snapshot)
        client = self._context._client
        if client is not None and client.send_report(snapshot.to_wire()):
            self.reports_sent += 1
        else:
            self.reports_skipped += 1
        return snapshot

    async def run(self) -> None:
        """Report every :attr:`interval` seconds until cancelled; errors are logged
        (rate-limited) and never end the task."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.report()
            except Exception:
                self._failures += 1
                if self._failures <= 3 or self._failures % 100 == 0:
                    log.exception("telemetry report failed (%d so far)", self._failures)
