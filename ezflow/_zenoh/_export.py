"""One export: an ezflow topic published on a Zenoh key.

The export's ezflow subscriber (lossless, bounded by the publishers' windows; or leaky,
keeping the newest ``queue``; for an ``ezflow`` export an encoded subscriber, which
hands over each message's body as it arrived: nothing is decoded and encoded again)
feeds a loop that takes every message already queued (up to half the smallest importer
window of a lossless export, else ``ZENOH_EXPORT_BATCH`` messages, and
``ZENOH_EXPORT_BATCH_BYTES``: each sample costs both ends Zenoh's calls and thread
wake-ups, whatever it holds) and hands the batch - one Zenoh sample for an
``ezflow`` export, one per message for ``raw`` and ``json`` - to the export's sender
thread, which puts it on Zenoh; a batch of at most
``ZENOH_INLINE_PUT`` bytes is put from the event loop instead when the thread is idle
and (lossless) an importer acknowledges and no more than that is unacknowledged, saving
the thread hop. A lossless export puts with ``CongestionControl.BLOCK``: while the far
side is full, ``put`` waits in that thread (not on the event loop: credits keep the
small inline puts off a full link, and one that waits anyway turns them off for a
second), the loop waits for the thread, the subscriber's queue fills, and the ezflow
publisher's ``publish()`` waits: backpressure from the importing graph to the
publishing one. At most three batches are held (one being put, one waiting for the
thread, one being packed).

The export follows its topic, not a publisher: when every publisher of the topic has
ended, an end marker goes out (so the importing side ends its topic too) and the export
waits, armed, for the topic's next publisher.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zenoh

from .._core._codec import Codec, EncodedMessage
from .._core._config import (
    ZENOH_ACK_INTERVAL,
    ZENOH_ACK_TIMEOUT,
    ZENOH_EXPORT_BATCH,
    ZENOH_EXPORT_BATCH_BYTES,
    ZENOH_EXPORT_POOL_BYTES,
    ZENOH_EXPORT_POOLED,
    ZENOH_INLINE_PUT,
)
from .._core._exceptions import ClosedResourceError, EndOfStream, UndecodableMessageError
from ._mapping import MappingStats, Refusals, queue_of
from ._wire import (
    ACK_CHUNK,
    BATCH_ALIGNMENT,
    ENCODING,
    JSON_ENCODING,
    RAW_ENCODING,
    Ack,
    Refused,
    join_uniform,
    pack_attachment,
    parse_ack,
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
_SENDER_DEPTH = 2  # jobs handed to the sender thread and not done, at most
_INLINE_SLOW = 0.005  # seconds: an inline put that took longer found the link congested
_INLINE_PAUSE = 1.0  # seconds without inline puts after such a put


def zenoh_encoding(encoding: str) -> str:
    """The Zenoh encoding of a mapping's samples."""
    return {"ezflow": ENCODING, "raw": RAW_ENCODING, "json": JSON_ENCODING}[encoding]


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Sender:
    """A thread that runs an export's puts, one job (a batch) at a time, so that a put
    waiting for the link never holds the event loop. :meth:`submit` hands a job over
    and waits only while two are not done."""

    def __init__(self, name: str, on_error: Callable[[Exception, int], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_error = on_error
        self._cond = threading.Condition()
        # Jobs (and their messages) not done: the first one is running.
        self._jobs: collections.deque[tuple[Callable[[], None], int]] = collections.deque()
        self._pending = 0  # messages of the jobs not done
        self._stop = False
        self._waiter: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """True while a job is being put or waits to be."""
        return bool(self._jobs)

    @property
    def pending(self) -> int:
        """Messages of the jobs being put or waiting to be (an end marker is none)."""
        return self._pending

    async def submit(self, job: Callable[[], None], messages: int) -> None:
        """Hand *job* (putting *messages*) over; waits while ``_SENDER_DEPTH`` jobs are
        not done (one running, the next waiting: the thread never waits for the loop
        between two jobs)."""
        await self._fewer_than(_SENDER_DEPTH)
        with self._cond:
            self._jobs.append((job, messages))
            self._pending += messages
            self._cond.notify()

    async def idle(self) -> None:
        """Wait until every job is done (cancellation-safe)."""
        await self._fewer_than(1)

    async def _fewer_than(self, jobs: int) -> None:
        while True:
            with self._cond:
                if len(self._jobs) < jobs or self._stop:
                    return
                waiter = self._waiter = self._loop.create_future()
            await waiter

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stop:
                    self._cond.wait()
                if not self._jobs:
                    return
                job, messages = self._jobs[0]  # (counted as not done while it runs)
            error: Exception | None = None
            try:
                job()
            except Exception as exc:  # the session closed, Zenoh refused: the loop decides
                error = exc
            with self._cond:
                self._jobs.popleft()
                failed = messages
                if error is not None:  # the jobs after it are not put either
                    failed += sum(m for _, m in self._jobs)
                    self._jobs.clear()
                self._pending -= failed
                waiter, self._waiter = self._waiter, None
            with contextlib.suppress(RuntimeError):  # the loop closed: we are stopping
                if error is not None:  # (told on the loop, at once: the export restarts)
                    self._loop.call_soon_threadsafe(self._on_error, error, failed)
                if waiter is not None:
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


class _Buffers:
    """Reused buffers for large payloads (``ZENOH_EXPORT_POOLED`` bytes or more), by exact size.

    Joining a large sample's parts into a new ``bytes`` costs more than the copy: in an
    exporting process, where the payloads are freed by the sender thread while others
    are built, the allocator hands out fresh pages most times (measured at 1 MiB: 120
    page faults and 370 µs a join, against 35 µs for the copy into a reused buffer).
    Zenoh's ``put`` copies the payload before it returns, so a buffer is free again
    once its put returned (:meth:`give_back`, from any thread). At most
    ``ZENOH_EXPORT_POOL_BYTES`` of free buffers are kept; a stream of one message size (frames,
    tensors) reuses the same few."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[bytearray]] = {}
        self._bytes = 0  # of the free buffers

    def build(self, parts: list[bytes | memoryview], nbytes: int) -> bytearray:
        """The concatenation of *parts* (*nbytes* in all), in a free buffer of that
        size or a new one."""
        with self._lock:
            free = self._free.get(nbytes)
            buffer = free.pop() if free else None
            if buffer is not None:
                self._bytes -= nbytes
        if buffer is None:
            buffer = bytearray(nbytes)
        with memoryview(buffer) as view:
            pos = 0
            for part in parts:
                end = pos + len(part)
                view[pos:end] = part
                pos = end
        return buffer

    def give_back(self, buffer: bytearray) -> None:
        """*buffer* (from :meth:`build`) was put: keep it for the next payload of its
        size, unless ``ZENOH_EXPORT_POOL_BYTES`` of free buffers are kept already."""
        nbytes = len(buffer)
        with self._lock:
            if self._bytes + nbytes <= ZENOH_EXPORT_POOL_BYTES:
                self._free.setdefault(nbytes, []).append(buffer)
                self._bytes += nbytes


class _Importer:
    """What a lossless export knows of one importer: every message before *next* was
    taken, *window* messages and *nbytes* bytes beyond it may be in flight."""

    __slots__ = ("heard", "nbytes", "next", "window")

    def __init__(self, next_seq: int, window: int, nbytes: int, heard: float) -> None:
        self.next = next_seq
        self.window = window
        self.nbytes = nbytes
        self.heard = heard


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
        self._end_put: int | None = None  # the sequence number the last end marker put had
        self.draining = False
        self._task: asyncio.Task[Any] | None = None
        self._broken: Exception | None = None
        self._zenoh_encoding = zenoh.Encoding(zenoh_encoding(export.encoding))
        # Lossless flow control: the importers that acknowledge this key, the byte count
        # sent before each sample still unacknowledged by one of them, the total.
        self._importers: dict[str, _Importer] = {}
        self._sent: collections.deque[tuple[int, int]] = collections.deque()
        self._sent_bytes = 0
        self._credit = asyncio.Event()
        self._inline_after = 0.0  # (monotonic) no inline put before this
        self._acks: Any = None
        self._buffers = _Buffers()

    async def open(self) -> None:
        """Declare the Zenoh publisher and the ezflow subscriber (ConfigurationError for
        what Zenoh or the graph refuses)."""
        export = self.export
        self._publisher = self._declare_publisher()
        # An ezflow export forwards each message's body as it arrived (encoded=True:
        # nothing decoded here, nothing encoded again); raw and json convert messages.
        encoded = export.encoding == "ezflow"
        self._subscriber = (
            # (bounded by the publisher's window)
            await self._context.subscriber(export.topic, encoded=encoded)
            if export.lossless
            else await self._context.subscriber(
                export.topic, leaky=True, queue=queue_of(False, export.queue), encoded=encoded
            )
        )
        # A publisher in this process hands a large body in its parts (the array's
        # memory, not joined into a new buffer: its samples copy them once anyway).
        self._subscriber._inbox.takes_parts = encoded
        self._sender = _Sender(f"ezflow-zenoh-export {export.topic}", self._put_failed)
        if export.lossless:
            loop = asyncio.get_running_loop()

            def on_ack(sample: Any) -> None:  # on a Zenoh thread
                try:
                    ack: Ack | Refused = parse_ack(sample.payload.to_bytes())
                except Refused as refused:
                    ack = refused
                except Exception as exc:  # nothing from a peer may escape into Zenoh
                    ack = Refused("ack", f"unreadable acknowledgement: {exc!r}")
                with contextlib.suppress(RuntimeError):  # the loop closed: stopping
                    loop.call_soon_threadsafe(self._on_ack, ack)

            self._acks = self._session.declare_subscriber(
                f"{self.key}/{ACK_CHUNK}", zenoh.handlers.Callback(on_ack, indirect=False)
            )

    async def recover(self) -> None:
        """Before a restart: declare the Zenoh publisher again (a failed put may mean it
        broke); the ezflow subscriber and the sequence go on."""
        old, self._publisher = self._publisher, None
        if old is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(old.undeclare)
        self._publisher = self._declare_publisher()
        if self.stats.state == "restarting":
            self.stats.state, self.stats.reason = "waiting", ""
        self.update_state()

    def _declare_publisher(self) -> Any:
        export = self.export
        return self._session.declare_publisher(
            self.key,
            encoding=self._zenoh_encoding,
            congestion_control=(
                zenoh.CongestionControl.BLOCK if export.lossless else zenoh.CongestionControl.DROP
            ),
            reliability=zenoh.Reliability.RELIABLE,
        )

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
        """Export until cancelled (or the graph closes: ClosedResourceError); raises the
        error of a put that failed (the supervisor restarts)."""
        self._task = asyncio.current_task()
        try:
            await self._run()
        except asyncio.CancelledError:
            broken, self._broken = self._broken, None
            if broken is not None:  # interrupted by _put_failed: a failure, not a stop
                self.stats.lost_in_flight += self._held  # (the batch it was preparing)
                self._held = 0
                raise broken from None
            raise
        finally:
            self._task = None

    async def _run(self) -> None:
        sub = self._subscriber
        assert sub is not None and self._sender is not None
        ezflow = self.export.encoding == "ezflow"
        recv_nowait = sub.recv_nowait
        while True:
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
            batch_max = self._batch_limit() if ezflow else 1
            # (Only what is queued: an end met here is met by the next recv() too.)
            for _ in range(min(batch_max - 1, sub.queued)):
                try:
                    batch.append(recv_nowait())
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

    # -- lossless flow control (credits) ---------------------------------------------

    def _on_ack(self, ack: Ack | Refused) -> None:
        if isinstance(ack, Refused):
            self._refused(ack, f"{self.key}/{ACK_CHUNK}")
            return
        if ack.bye:
            if self._importers.pop(ack.id, None) is not None:
                # It stopped: what it never received was in flight, and is counted here.
                lost = max(0, self._seq - (ack.next if ack.next is not None else self._seq))
                self.stats.lost_in_flight += lost
                log.info(
                    "export of %s: importer %s left (%d messages in flight to it)",
                    self.export.topic,
                    ack.id,
                    lost,
                )
        else:
            # A hello (next None) counts from now; an acknowledgement past what was sent
            # is from before this export restarted its sequence: also from now.
            next_seq = self._seq if ack.next is None or ack.next > self._seq else ack.next
            importer = self._importers.get(ack.id)
            now = time.monotonic()
            if importer is None:
                self._importers[ack.id] = _Importer(next_seq, ack.window, ack.nbytes, now)
                log.info("export of %s: importer %s joined", self.export.topic, ack.id)
            else:
                importer.next = (
                    max(importer.next, next_seq) if ack.next is not None else importer.next
                )
                importer.window, importer.nbytes, importer.heard = ack.window, ack.nbytes, now
        self._prune()
        self._credit.set()

    def _prune(self) -> None:
        """Forget the byte counts every importer acknowledged."""
        oldest = min((i.next for i in self._importers.values()), default=self._seq)
        sent = self._sent
        while len(sent) > 1 and sent[1][0] <= oldest:
            sent.popleft()
        if not self._importers:
            sent.clear()

    def _bytes_before(self, seq: int) -> int:
        """Bytes sent before message *seq* (an acknowledged point)."""
        sent = self._sent
        if not sent or seq >= self._seq:
            return self._sent_bytes
        index = bisect.bisect_right(sent, (seq, self._sent_bytes + 1)) - 1
        return sent[max(index, 0)][1]

    def _room(self, messages: int, nbytes: int) -> bool:
        """True when every importer takes *messages* more (of *nbytes*), or has nothing
        in flight (one batch always goes)."""
        for importer in self._importers.values():
            in_flight = self._seq - importer.next
            if in_flight <= 0:
                continue
            if in_flight + messages > importer.window:
                return False
            if self._sent_bytes - self._bytes_before(importer.next) + nbytes > importer.nbytes:
                return False
        return True

    def _batch_limit(self) -> int:
        """Messages a batch takes at most: half the smallest importer window of a
        lossless export (they acknowledge every half window in messages: when an
        acknowledgement comes, one batch has room; the window bounds what the importer
        holds, whatever the batches), else ``ZENOH_EXPORT_BATCH`` (a leaky export's
        importer keeps the newest *queue* samples: larger ones would hold older
        messages)."""
        importers = self._importers
        if not importers:
            return ZENOH_EXPORT_BATCH
        return max(1, min(importer.window for importer in importers.values()) // 2)

    async def _wait_for_credit(self, messages: int, nbytes: int) -> None:
        """Wait until every importer has room (lossless exports): backpressure. An
        importer silent for ``ZENOH_ACK_TIMEOUT`` is forgotten (it went away)."""
        while not self._room(messages, nbytes):
            now = time.monotonic()
            for name, importer in list(self._importers.items()):
                if now - importer.heard > ZENOH_ACK_TIMEOUT:
                    del self._importers[name]
                    log.warning(
                        "export of %s: importer %s sent no acknowledgement for %.0f s; "
                        "no longer waiting for it",
                        self.export.topic,
                        name,
                        ZENOH_ACK_TIMEOUT,
                    )
            if self._room(messages, nbytes):
                return
            self._credit.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._credit.wait(), ZENOH_ACK_INTERVAL)

    def _record(self, messages: int, nbytes: int) -> None:
        """Count a sample sent (for the importers' byte windows)."""
        if self._importers:
            self._sent.append((self._seq - messages, self._sent_bytes))
        self._sent_bytes += nbytes

    def _put_failed(self, error: Exception, messages: int) -> None:
        """(On the loop) A put job failed: its messages are lost, and the export restarts
        now (its task is interrupted with the error), not at its next message."""
        self.stats.messages -= messages
        self.stats.lost_in_flight += messages
        task = self._task
        if task is not None and not task.done():
            self._broken = error
            task.cancel()

    async def _send(self, batch: list[Any]) -> None:
        """Pack *batch* (bodies for an ezflow export, messages to convert for raw and
        json), wait for credit (lossless), hand it to the sender thread."""
        encoding = self.export.encoding
        # Samples as (payload parts, body sizes): one per batch of ezflow bodies (split at
        # ZENOH_EXPORT_BATCH_BYTES), one per message for raw and json.
        samples: list[tuple[list[bytes | memoryview], list[int]]] = []
        if encoding == "ezflow":
            # The bodies as they arrived (the subscriber is an encoded one: what
            # Codec.encode makes of each message, bytes or a read-only memoryview - of
            # the publisher's shared memory - or, from a publisher in this process, the
            # parts of a large one; held until the payload is built below).
            uniform = join_uniform(batch, ZENOH_EXPORT_BATCH_BYTES)
            if uniform is not None:  # (one stream of one kind: one join, one sample)
                samples.append(([uniform[0]], uniform[1]))
            else:
                parts: list[bytes | memoryview] = []
                sizes: list[int] = []
                pos = 0
                for body in batch:
                    in_parts = type(body) is EncodedMessage
                    nbytes = body.nbytes if in_parts else len(body)
                    if sizes and pos + nbytes > ZENOH_EXPORT_BATCH_BYTES:
                        samples.append((parts, sizes))
                        parts, sizes, pos = [], [], 0
                    pad = -pos & (BATCH_ALIGNMENT - 1)
                    if pad:
                        parts.append(_PADDING[pad])
                    if in_parts:
                        parts.extend(body.parts)
                    else:
                        parts.append(body)
                    sizes.append(nbytes)
                    pos += pad + nbytes
                if sizes:
                    samples.append((parts, sizes))
        else:
            convert = to_raw if encoding == "raw" else to_json
            for message in batch:
                try:
                    body = convert(message)
                except Refused as refused:
                    self._refused(refused, self.key)
                    continue
                samples.append(([body], [len(body)]))
        if not samples:
            return
        # Jobs of at most half the smallest importer window in bytes (one sample at
        # least): credit for one comes back while the one before is in flight.
        limit = min((i.nbytes // 2 for i in self._importers.values()), default=0)
        job: list[tuple[list[bytes | memoryview], list[int]]] = []
        job_bytes = 0
        for sample in samples:
            size = sum(sample[1])
            if job and limit and job_bytes + size > limit:
                await self._submit(job)
                job, job_bytes = [], 0
            job.append(sample)
            job_bytes += size
        await self._submit(job)

    async def _submit(self, samples: list[tuple[list[bytes | memoryview], list[int]]]) -> None:
        """Wait for credit (lossless), then hand *samples* to the sender thread."""
        count = sum(len(sizes) for _, sizes in samples)
        nbytes = sum(sum(sizes) for _, sizes in samples)
        if self._importers:
            await self._wait_for_credit(count, nbytes)
        sub = self._subscriber
        # (A lossless subscriber drops nothing: no snapshot of its statistics to take.)
        drops = 0 if sub is None or self.export.lossless else sub.statistics().dropped
        puts: list[tuple[bytes | bytearray, bytes]] = []
        counts = []
        now = time.time_ns()
        buffers = self._buffers
        for parts, sizes in samples:
            n = len(sizes)
            seq = self._seq
            self._seq += n
            self._record(n, sum(sizes))
            payload: bytes | bytearray
            if len(parts) == 1 and type(parts[0]) is bytes:
                payload = parts[0]
            else:
                length = sum(len(part) for part in parts)
                if length >= ZENOH_EXPORT_POOLED:
                    payload = buffers.build(parts, length)
                else:
                    payload = b"".join(parts)
            puts.append((payload, pack_attachment(seq, now, drops, sizes)))
            counts.append(n)
        publisher = self._publisher
        sender = self._sender
        assert sender is not None
        if not sender.busy and self._inline(puts):
            # Small, and nothing of ours queued before it: put from the loop, saving the
            # thread hop (tens of microseconds of latency a paced message).
            started = time.monotonic()
            for index, (payload, attachment) in enumerate(puts):
                try:
                    publisher.put(payload, attachment=attachment)
                    if type(payload) is bytearray:  # (copied by Zenoh: free again)
                        buffers.give_back(payload)
                except Exception:  # (the supervisor restarts the export)
                    lost = sum(counts[index:])
                    self.stats.messages += count - lost
                    self.stats.samples += index
                    self.stats.lost_in_flight += lost
                    self._held = 0
                    raise
            waited = time.monotonic() - started
            if waited > _INLINE_SLOW:  # the link is congested (a slow plain subscriber?)
                self._inline_after = started + waited + _INLINE_PAUSE
        else:

            def put_all() -> None:
                for payload, attachment in puts:
                    publisher.put(payload, attachment=attachment)
                    if type(payload) is bytearray:  # (copied by Zenoh: free again)
                        buffers.give_back(payload)

            await sender.submit(put_all, count)
        self._held = max(0, self._held - count)  # (handed over: counted, or lost if it fails)
        stats = self.stats
        stats.messages += count
        stats.samples += len(puts)
        stats.bytes += nbytes
        stats.dropped_local = drops

    def _inline(self, puts: list[tuple[bytes | bytearray, bytes]]) -> bool:
        """True when *puts* may run on the event loop: at most ``ZENOH_INLINE_PUT``
        bytes, and (lossless) an importer acknowledges and at most that much is not
        acknowledged, so Zenoh's link queue has room and the put does not wait for the
        link. After an inline put that waited longer than ``_INLINE_SLOW`` anyway (a link
        congested by something else), none for ``_INLINE_PAUSE``."""
        nbytes = sum(len(payload) for payload, _ in puts)
        if nbytes > ZENOH_INLINE_PUT or (
            self._inline_after and time.monotonic() < self._inline_after
        ):
            return False
        if not self.export.lossless:
            return True  # (CongestionControl.DROP: a put waits at most ~1 ms for the link)
        if not self._importers:
            return False  # (no credit to go by: whoever reads may be slow)
        oldest = min(i.next for i in self._importers.values())
        return self._sent_bytes - self._bytes_before(oldest) <= ZENOH_INLINE_PUT

    async def _send_end(self) -> None:
        """The end marker: an empty payload whose attachment says where the sequence
        ended, sent reliably (BLOCK) even on a leaky export, after every put before it,
        so the importer counts what Zenoh dropped at the tail and ends its topic too.
        Returns once the sender thread has it (:meth:`finish` waits for the put)."""
        if self._ended:
            return
        sub = self._subscriber
        drops = sub.statistics().dropped if sub is not None else 0
        seq = self._seq
        attachment = pack_attachment(seq, time.time_ns(), drops, end=True)
        session, key, encoding = self._session, self.key, self._zenoh_encoding

        def put_end() -> None:
            session.put(
                key,
                b"",
                attachment=attachment,
                congestion_control=zenoh.CongestionControl.BLOCK,
                encoding=encoding,
            )
            self._end_put = seq  # (on the sender thread: the drain checks it)

        assert self._sender is not None
        await self._sender.submit(put_end, 0)
        # (Only once handed over: a submit cancelled while waiting sends it again later.)
        self._ended = True
        log.info("export of %s: the topic ended; waiting for its next publisher", self.export.topic)
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
        (loop time), then put the end marker (if the topic's end was not sent yet) and
        wait for that put too, so that the session closes after it; count what is left.
        An end marker that did not go out by *deadline* is logged (the importing side's
        topic does not end; what was not put before it is counted here)."""
        sender = self._sender
        loop = asyncio.get_running_loop()
        if sender is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sender.idle(), max(0.0, deadline - loop.time()))
            if not sender.busy and not self._ended and loop.time() < deadline:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._send_end(), max(0.0, deadline - loop.time()))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(sender.idle(), max(0.0, deadline - loop.time()))
            self.stats.lost_in_flight += sender.pending  # (may still go out)
            if self._seq and self._end_put != self._seq:
                log.warning(
                    "export of %s: its end marker did not go out within the drain timeout: "
                    "the importing side's topic does not end",
                    self.export.topic,
                )
        self.stats.lost_in_flight += self._held + self.queued
        self._held = 0

    async def close(self) -> None:
        """Stop the sender thread (:meth:`join` it once the session is closed), undeclare,
        close the subscriber. Idempotent."""
        sender = self._sender
        if sender is not None:
            sender.stop()
        for entity in (self._acks, self._publisher):
            if entity is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(entity.undeclare)
        self._acks = self._publisher = None
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
