"""One export: an ezflow topic published on a Zenoh key.

The export's ezflow subscriber (lossless, bounded by the publishers' windows; or leaky,
keeping the newest ``queue``) feeds a loop that takes every message already queued (up
to ``ZENOH_EXPORT_BATCH`` messages or ``ZENOH_EXPORT_BATCH_BYTES``), encodes each, and
hands the batch - one Zenoh sample for an ``ezflow`` export, one per message for ``raw``
and ``json`` - to the export's sender thread, which puts it on Zenoh. A lossless export
puts with ``CongestionControl.BLOCK``: while the far side is full, ``put`` waits in that
thread (never on the event loop), the loop waits for the thread, the subscriber's queue
fills, and the ezflow publisher's ``publish()`` waits: backpressure from the importing
graph to the publishing one. At most two batches are held (one being put, one waiting).

The export follows its topic, not a publisher: when every publisher of the topic has
ended, an end marker goes out (so the importing side ends its topic too) and the export
waits, armed, for the topic's next publisher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zenoh

from .._core._codec import Codec
from .._core._config import ZENOH_EXPORT_BATCH, ZENOH_EXPORT_BATCH_BYTES
from .._core._exceptions import ClosedResourceError, EndOfStream, UndecodableMessageError
from ._mapping import MappingStats, Refusals
from ._wire import (
    BATCH_ALIGNMENT,
    ENCODING,
    JSON_ENCODING,
    RAW_ENCODING,
    Refused,
    pack_attachment,
    to_json,
    to_raw,
)

if TYPE_CHECKING:
    from .._graph._context import GraphContext
    from .._graph._subscriber import Subscriber
    from ._bridge import Export

__all__ = ["ExportRun", "zenoh_encoding"]

log = logging.getLogger("ezflow.zenoh")

_PADDING = tuple(b"\0" * n for n in range(BATCH_ALIGNMENT))
_THREAD_JOIN = 2.0  # seconds a stopping export waits for its sender thread


def zenoh_encoding(encoding: str) -> str:
    """The Zenoh encoding of a mapping's samples."""
    return {"ezflow": ENCODING, "raw": RAW_ENCODING, "json": JSON_ENCODING}[encoding]


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Sender:
    """A thread that runs an export's puts, one job (a batch) at a time, so that a put
    waiting for the link never holds the event loop. :meth:`submit` hands a job over
    and waits only while the previous one is still running."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._cond = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._busy = 0  # messages of the job being run (0: idle)
        self._stop = False
        self._error: tuple[Exception, int] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> int:
        """Messages of the job being put (0 when idle)."""
        return self._busy

    def error(self) -> tuple[Exception, int] | None:
        """The error of the last job that failed and its messages (taken: reported once)."""
        with self._cond:
            error, self._error = self._error, None
            return error

    async def submit(self, job: Callable[[], None], messages: int) -> None:
        """Hand *job* (putting *messages*) over once the previous one is done."""
        await self.idle()
        with self._cond:
            self._job = job
            self._busy = max(1, messages)
            self._cond.notify()

    async def idle(self) -> None:
        """Wait until no job is running (cancellation-safe)."""
        while True:
            with self._cond:
                if not self._busy or self._stop:
                    return
                waiter = self._waiter = self._loop.create_future()
            await waiter

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._stop:
                    self._cond.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
            error: Exception | None = None
            try:
                job()
            except Exception as exc:  # the session closed, Zenoh refused: the loop decides
                error = exc
            with self._cond:
                if error is not None:
                    self._error = (error, self._busy)
                self._busy = 0
                waiter, self._waiter = self._waiter, None
            if waiter is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed: we are stopping
                    self._loop.call_soon_threadsafe(_wake, waiter)

    def stop(self) -> None:
        """Stop the thread after its job (a put blocked on the link ends when the session
        closes: join it after closing the session)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    def join(self) -> None:
        """Wait for the thread a bounded time (it is a daemon: it cannot hold the exit)."""
        self._thread.join(_THREAD_JOIN)
        if self._thread.is_alive():
            log.warning("%s: its Zenoh put did not return; leaving it", self._thread.name)


class ExportRun:
    """The runtime of one :class:`~ezflow.zenoh.Export` (see the module doc)."""

    def __init__(
        self,
        export: Export,
        key: str,
        *,
        session: Any,
        context: GraphContext,
        codec: Codec,
        stats: MappingStats,
        name: str,
    ) -> None:
        self.export = export
        self.key = key
        self.name = name
        self.stats = stats
        self._session = session
        self._context = context
        self._codec = codec
        self._refused = Refusals(name, stats)
        self._publisher: Any = None
        self._subscriber: Subscriber | None = None
        self._sender: _Sender | None = None
        self._seq = 0
        self._held = 0  # messages taken from the subscriber, not handed to the sender yet
        self._ended = True  # the end of the topic was sent (or nothing was sent yet)
        self.draining = False
        self._zenoh_encoding = zenoh.Encoding(zenoh_encoding(export.encoding))

    async def open(self) -> None:
        """Declare the Zenoh publisher and the ezflow subscriber (ConfigurationError for
        what Zenoh or the graph refuses)."""
        export = self.export
        self._publisher = self._session.declare_publisher(
            self.key,
            encoding=self._zenoh_encoding,
            congestion_control=(
                zenoh.CongestionControl.BLOCK if export.lossless else zenoh.CongestionControl.DROP
            ),
            reliability=zenoh.Reliability.RELIABLE,
        )
        self._subscriber = (
            await self._context.subscriber(export.topic)  # bounded by the publisher's window
            if export.lossless
            else await self._context.subscriber(export.topic, leaky=True, queue=export.queue)
        )
        self._sender = _Sender(f"ezflow-zenoh-export {export.topic}")

    def progress(self) -> int:
        return self.stats.messages + sum(self.stats.refused.values())

    def update_state(self) -> None:
        """``live`` while a publisher feeds the topic, else ``waiting`` (unless failed)."""
        sub = self._subscriber
        if sub is None or self.stats.state in ("restarting", "failed", "stopped"):
            return
        self.stats.state = "live" if sub.had_publisher and not sub.ended else "waiting"

    @property
    def busy(self) -> bool:
        """True while messages are taken and not yet put (the drain waits for this)."""
        sender = self._sender
        return bool(self._held or (sender is not None and sender.busy))

    @property
    def queued(self) -> int:
        sub = self._subscriber
        return 0 if sub is None else sub.queued

    async def run(self) -> None:
        """Export until cancelled (or the graph closes: ClosedResourceError)."""
        sub = self._subscriber
        assert sub is not None and self._sender is not None
        batch_max = ZENOH_EXPORT_BATCH if self.export.encoding == "ezflow" else 1
        while True:
            self._check_sender()
            self.update_state()
            try:
                batch = [await sub.recv()]
            except EndOfStream:
                await self._send_end()
                continue
            except UndecodableMessageError as exc:
                self._refused(Refused("undecodable", str(exc)), self.export.topic)
                continue
            except ClosedResourceError:
                if self.draining:  # everything queued before the drain is exported
                    return
                raise
            ended = False
            while len(batch) < batch_max:
                try:
                    batch.append(sub.recv_nowait())
                except (asyncio.QueueEmpty, ClosedResourceError):
                    break
                except EndOfStream:
                    ended = True
                    break
                except UndecodableMessageError as exc:
                    self._refused(Refused("undecodable", str(exc)), self.export.topic)
            if self._ended:
                self._ended = False
                self.update_state()
            self._held = len(batch)
            try:
                await self._send(batch)
            except asyncio.CancelledError:
                raise  # (a drain: finish() counts what was held)
            except Exception:
                self.stats.lost_in_flight += self._held
                self._held = 0
                raise
            self._held = 0
            if ended:
                await self._send_end()

    def _check_sender(self) -> None:
        """Raise the error of a put job that failed, its messages counted as lost."""
        assert self._sender is not None
        failed = self._sender.error()
        if failed is not None:
            error, messages = failed
            self.stats.messages -= messages
            self.stats.lost_in_flight += messages
            raise error

    async def _send(self, batch: list[Any]) -> None:
        """Encode *batch* and hand it to the sender thread (waiting while it is busy)."""
        encoding = self.export.encoding
        drops = self._subscriber.stats.dropped if self._subscriber is not None else 0
        publisher = self._publisher
        puts: list[tuple[bytes, bytes]] = []
        nbytes = count = 0
        if encoding == "ezflow":
            codec = self._codec
            parts: list[bytes | memoryview] = []
            sizes: list[int] = []
            pos = 0
            for message in batch:
                try:
                    encoded = codec.encode(message)
                except Exception as exc:
                    self._refused(Refused("encoding", f"{type(exc).__name__}: {exc}"), self.key)
                    continue
                if sizes and pos + encoded.nbytes > ZENOH_EXPORT_BATCH_BYTES:
                    puts.append(self._batch(parts, sizes, drops))
                    parts, sizes, pos = [], [], 0
                pad = -pos & (BATCH_ALIGNMENT - 1)
                if pad:
                    parts.append(_PADDING[pad])
                parts += encoded.parts
                sizes.append(encoded.nbytes)
                pos += pad + encoded.nbytes
                nbytes += encoded.nbytes
                count += 1
            if sizes:
                puts.append(self._batch(parts, sizes, drops))
        else:
            convert = to_raw if encoding == "raw" else to_json
            for message in batch:
                try:
                    body = convert(message)
                except Refused as refused:
                    self._refused(refused, self.key)
                    continue
                puts.append((body, pack_attachment(self._seq, time.time_ns(), drops)))
                self._seq += 1
                nbytes += len(body)
                count += 1
        if not puts:
            return

        def put_all() -> None:
            for payload, attachment in puts:
                publisher.put(payload, attachment=attachment)

        assert self._sender is not None
        await self._sender.submit(put_all, count)
        self._held = 0  # (handed over: counted below, or as lost if the put fails)
        stats = self.stats
        stats.messages += count
        stats.bytes += nbytes
        stats.dropped_local = drops

    def _batch(
        self, parts: list[bytes | memoryview], sizes: list[int], drops: int
    ) -> tuple[bytes, bytes]:
        """One sample of a batch: its payload and attachment (the next sequence numbers)."""
        seq = self._seq
        self._seq += len(sizes)
        return b"".join(parts), pack_attachment(seq, time.time_ns(), drops, sizes)

    async def _send_end(self) -> None:
        """The end marker: an empty payload whose attachment says where the sequence
        ended, sent reliably (BLOCK) even on a leaky export, after every put before it,
        so the importer counts what Zenoh dropped at the tail and ends its topic too."""
        if self._ended:
            return
        self._ended = True
        log.info("export of %s: the topic ended; waiting for its next publisher", self.export.topic)
        sub = self._subscriber
        drops = sub.stats.dropped if sub is not None else 0
        attachment = pack_attachment(self._seq, time.time_ns(), drops, end=True)
        session, key, encoding = self._session, self.key, self._zenoh_encoding

        def put_end() -> None:
            session.put(
                key,
                b"",
                attachment=attachment,
                congestion_control=zenoh.CongestionControl.BLOCK,
                encoding=encoding,
            )

        assert self._sender is not None
        await self._sender.submit(put_end, 0)
        self.update_state()

    async def start_drain(self) -> None:
        """Take no new message: the ones queued are still exported, then :meth:`run`
        returns."""
        self.draining = True
        sub = self._subscriber
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.aclose()

    async def finish(self, deadline: float) -> None:
        """After a drain (the run task stopped): wait for the last put until *deadline*
        (loop time), send the end marker if there is time, count what is left."""
        sender = self._sender
        loop = asyncio.get_running_loop()
        if sender is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sender.idle(), max(0.0, deadline - loop.time()))
            if sender.busy:
                self.stats.lost_in_flight += sender.busy  # (may still go out)
            elif loop.time() < deadline and not self._ended:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._send_end(), max(0.0, deadline - loop.time()))
        self.stats.lost_in_flight += self._held + self.queued
        self._held = 0

    async def close(self) -> None:
        """Stop the sender thread (:meth:`join` it once the session is closed), undeclare,
        close the subscriber. Idempotent."""
        sender = self._sender
        if sender is not None:
            sender.stop()
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(publisher.undeclare)
        sub, self._subscriber = self._subscriber, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.aclose()
        self._refused.close()
        if self.stats.state not in ("failed",):
            self.stats.state = "stopped"

    async def join(self) -> None:
        """Wait (bounded) for the sender thread, after the session closed."""
        sender, self._sender = self._sender, None
        if sender is not None:
            await asyncio.to_thread(sender.join)
