"""The graph server's Prometheus endpoint: text exposition format over plain HTTP.

:func:`render` turns the latest telemetry snapshot of every client into the Prometheus
text format (version 0.0.4); :class:`MetricsServer` serves it at ``GET /metrics`` with
the standard library only. The HTTP side is deliberately small and bounded: one request
per connection, at most ``MAX_METRICS_REQUEST_SIZE`` bytes of request head read within
``METRICS_REQUEST_TIMEOUT`` seconds (else ``408``), at most ``MAX_METRICS_CONNECTIONS``
connections at once (more get ``503``). Requests it cannot answer with metrics get the
status that says why, and are logged per cause, rate-limited like every listener's bad
connections (:class:`~ezflow._core._peerlog.BadPeerLog`: ``limit``, ``timeout``,
``request``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Final

from .._core._config import (
    MAX_METRICS_CONNECTIONS,
    MAX_METRICS_REQUEST_SIZE,
    METRICS_REQUEST_TIMEOUT,
    Address,
    format_address,
)
from .._core._peerlog import BadPeerLog
from .._core._telemetry import HistogramSnapshot, ProcessSnapshot

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "MetricsServer", "render"]

log = logging.getLogger("ezflow.server")

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

#: Upper bounds (nanoseconds) of the exported latency histogram buckets: powers of four
#: from ~1 µs to ~17 s. They are bucket boundaries of ezflow histograms, so the
#: cumulative counts are exact.
LATENCY_BUCKETS: Final = tuple(1 << k for k in range(10, 36, 2))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, str]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in pairs.items()) + "}"


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class _Family:
    """One metric family: its HELP and TYPE lines, then its samples."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def add(self, labels: dict[str, str], value: float, suffix: str = "") -> None:
        self.lines.append(f"{self.name}{suffix}{_labels(labels)} {_number(value)}")

    def histogram(self, labels: dict[str, str], snapshot: HistogramSnapshot) -> None:
        """Cumulative ``_bucket`` samples (seconds), ``_sum`` and ``_count``."""
        for bound in LATENCY_BUCKETS:
            self.add({**labels, "le": repr(bound / 1e9)}, snapshot.count_below(bound), "_bucket")
        self.add({**labels, "le": "+Inf"}, snapshot.count, "_bucket")
        self.add(labels, snapshot.total / 1e9, "_sum")
        self.add(labels, snapshot.count, "_count")


def render(processes: Iterable[tuple[str, ProcessSnapshot]], *, now: float | None = None) -> str:
    """The Prometheus text exposition of the latest snapshot of every client."""
    now = time.time() if now is None else now
    families: dict[str, _Family] = {}

    def family(name: str, kind: str, help_text: str) -> _Family:
        found = families.get(name)
        if found is None:
            found = families[name] = _Family(name, kind, help_text)
        return found

    family("ezflow_processes", "gauge", "Clients that reported telemetry.")
    count = 0
    for client_id, snap in processes:
        count += 1
        process = {"client": client_id, "process": snap.name, "pid": str(snap.pid)}
        family(
            "ezflow_report_age_seconds", "gauge", "Seconds since the process took its snapshot."
        ).add(process, max(0.0, now - snap.time))
        for ch in snap.channels:
            labels = {
                **process,
                "topic": ch.topic,
                "publisher": ch.publisher_id,
                "transport": ch.transport,
            }
            family("ezflow_channel_messages_total", "counter", "Messages a channel received.").add(
                labels, ch.messages
            )
            family(
                "ezflow_channel_bytes_total", "counter", "Encoded bytes a channel received."
            ).add(labels, ch.bytes)
            family(
                "ezflow_channel_deliveries_total",
                "counter",
                "Message x subscriber hand-overs of a channel.",
            ).add(labels, ch.deliveries)
            family(
                "ezflow_channel_decode_errors_total",
                "counter",
                "Messages a channel could not decode.",
            ).add(labels, ch.decode_errors)
            drops = family(
                "ezflow_channel_drops_total",
                "counter",
                "Messages dropped for leaky subscribers, by reason (overflow: inbox full; "
                "upstream: dropped by the publisher).",
            )
            drops.add({**labels, "reason": "overflow"}, ch.dropped_overflow)
            drops.add({**labels, "reason": "upstream"}, ch.dropped_upstream)
            family(
                "ezflow_channel_queue_depth", "gauge", "Messages waiting in subscriber inboxes."
            ).add(labels, ch.queue_depth)
            family(
                "ezflow_channel_buffers_in_use",
                "gauge",
                "Messages held against the publisher's window.",
            ).add(labels, ch.buffers_in_use)
            family("ezflow_channel_decode_seconds_total", "counter", "Time spent decoding.").add(
                labels, ch.decode_seconds
            )
            family(
                "ezflow_channel_rejoins_total",
                "counter",
                "Times the channel was reopened after it was cut (stall, dead peer, broken "
                "link): its subscribers rejoined as late joiners.",
            ).add(labels, ch.rejoins)
            family(
                "ezflow_channel_latency_seconds",
                "histogram",
                "Publish to deliver latency (publisher's and receiver's wall clocks).",
            ).histogram(labels, ch.latency)
            for sub in ch.subscribers:
                sub_labels = {**labels, "subscriber": sub.subscriber_id}
                family("ezflow_subscriber_queued", "gauge", "Messages waiting in the inbox.").add(
                    sub_labels, sub.queued
                )
                family(
                    "ezflow_subscriber_taken_total", "counter", "Messages the subscriber took."
                ).add(sub_labels, sub.taken)
                sub_drops = family(
                    "ezflow_subscriber_drops_total",
                    "counter",
                    "Messages a leaky subscriber missed, by reason.",
                )
                sub_drops.add({**sub_labels, "reason": "overflow"}, sub.dropped_overflow)
                sub_drops.add({**sub_labels, "reason": "upstream"}, sub.dropped_upstream)
                family(
                    "ezflow_subscriber_callback_errors_total",
                    "counter",
                    "Exceptions raised by the subscriber's on_message callback.",
                ).add(sub_labels, sub.callback_errors)
                family(
                    "ezflow_subscriber_handler_mean_seconds",
                    "gauge",
                    "Mean time from taking a message until asking for the next one "
                    "(sampled: one message in 16).",
                ).add(sub_labels, (sub.handler.mean or 0.0) / 1e9)
        for pub in snap.publishers:
            labels = {**process, "topic": pub.topic, "publisher": pub.publisher_id}
            family("ezflow_publisher_messages_total", "counter", "Messages published.").add(
                labels, pub.messages
            )
            family("ezflow_publisher_bytes_total", "counter", "Encoded bytes published.").add(
                labels, pub.bytes
            )
            family(
                "ezflow_publisher_drops_total",
                "counter",
                "Messages dropped for leaky subscribers without room.",
            ).add(labels, pub.drops)
            family(
                "ezflow_publisher_wait_seconds_total",
                "counter",
                "Time publish waited for lossless subscribers (backpressure).",
            ).add(labels, pub.wait.total / 1e9)
            family("ezflow_publisher_channels", "gauge", "Channels the publisher feeds.").add(
                labels, pub.channels
            )
            family(
                "ezflow_publisher_shm_blocks_in_use",
                "gauge",
                "Shared-memory blocks leased by subscribers or being written.",
            ).add(labels, pub.shm_in_use)
            cut = family(
                "ezflow_publisher_channels_cut_total",
                "counter",
                "Channels cut: lossless ones stalled past stall_timeout (stall), or silent "
                "past the heartbeat deadline (dead).",
            )
            cut.add({**labels, "reason": "stall"}, pub.stalled_cut)
            cut.add({**labels, "reason": "dead"}, pub.dead_channels)
    families["ezflow_processes"].add({}, count)
    return "\n".join(line for f in families.values() for line in f.lines) + "\n"


class MetricsServer:
    """Serves ``render(source())`` at ``GET /metrics`` (and ``/``) on *address*."""

    def __init__(
        self, address: Address, source: Callable[[], Iterable[tuple[str, ProcessSnapshot]]]
    ) -> None:
        self._requested = address
        self._source = source
        self._server: asyncio.AbstractServer | None = None
        self._address: Address | None = None
        self._connections = 0
        self.requests = 0
        #: requests answered with an error status, logged per cause and rate-limited
        self.bad_peers = BadPeerLog(log, "metrics server")

    @property
    def address(self) -> Address:
        if self._address is None:
            raise RuntimeError("the metrics server is not started")
        return self._address

    async def start(self) -> None:
        """Bind; raises ``OSError`` when the port is taken."""
        host, port = self._requested
        self._server = await asyncio.start_server(
            self._serve, host, port, reuse_address=True, limit=MAX_METRICS_REQUEST_SIZE
        )
        sockname = self._server.sockets[0].getsockname()
        self._address = (sockname[0], sockname[1])
        log.info("Prometheus metrics at http://%s/metrics", format_address(self._address))

    async def aclose(self) -> None:
        self.bad_peers.close()
        server, self._server = self._server, None
        if server is not None:
            server.close()
            try:
                await asyncio.wait_for(server.wait_closed(), 2.0)
            except (TimeoutError, asyncio.TimeoutError):
                log.debug("metrics server: connections still closing after 2 s")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            if self._connections > MAX_METRICS_CONNECTIONS:
                await self._refuse(
                    writer,
                    "limit",
                    503,
                    f"already {MAX_METRICS_CONNECTIONS} connections (MAX_METRICS_CONNECTIONS)",
                )
                return
            try:
                head = await asyncio.wait_for(
                    reader.readuntil(b"\r\n\r\n"), METRICS_REQUEST_TIMEOUT
                )
            except (TimeoutError, asyncio.TimeoutError):
                await self._refuse(
                    writer,
                    "timeout",
                    408,
                    f"no complete request head within {METRICS_REQUEST_TIMEOUT:.0f} s "
                    "(METRICS_REQUEST_TIMEOUT)",
                )
                return
            except asyncio.LimitOverrunError:
                await self._refuse(
                    writer,
                    "request",
                    431,
                    f"request head over {MAX_METRICS_REQUEST_SIZE} bytes "
                    "(MAX_METRICS_REQUEST_SIZE)",
                )
                return
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # it went away: nothing to answer
            line = head.split(b"\r\n", 1)[0]
            parts = line.split()
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
                await self._refuse(writer, "request", 400, f"not an HTTP request: {line[:80]!r}")
                return
            method, target = parts[0], parts[1].split(b"?", 1)[0]
            if method != b"GET":
                await self._refuse(writer, "request", 405, f"method {method[:20]!r}, only GET")
            elif target not in (b"/metrics", b"/"):
                await self._refuse(writer, "request", 404, f"no {target[:80]!r}, try /metrics")
            else:
                self.requests += 1
                await self._respond(writer, 200, render(self._source()), CONTENT_TYPE)
        except Exception:
            log.exception("metrics server: request failed")
        finally:
            self._connections -= 1
            writer.close()

    async def _refuse(
        self, writer: asyncio.StreamWriter, cause: str, status: int, reason: str
    ) -> None:
        """Answer *status* with *reason* as the body, and log it per *cause*."""
        peer = writer.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.bad_peers(cause, "answering %d to %s: %s", status, where, reason)
        await self._respond(writer, status, reason + "\n")

    @staticmethod
    async def _respond(
        writer: asyncio.StreamWriter,
        status: int,
        body: str,
        content_type: str = "text/plain; charset=utf-8",
    ) -> None:
        reasons = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            405: "Method Not Allowed",
            408: "Request Timeout",
            431: "Request Header Fields Too Large",
            503: "Service Unavailable",
        }
        data = body.encode()
        writer.write(
            f"HTTP/1.1 {status} {reasons[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        try:
            await asyncio.wait_for(writer.drain(), METRICS_REQUEST_TIMEOUT)
        except (TimeoutError, asyncio.TimeoutError, ConnectionError):
            writer.transport.abort()
