"""One import: the samples of a Zenoh key expression published on ezflow topics.

Zenoh runs the import's callback on its own network thread (``indirect=False``: no
channel of zenoh-python's in between, nothing queued outside the import, and one
wake-up fewer a sample than a channel drained by a thread of ours, which is tens of
microseconds of latency on a busy machine). The callback wakes the loop if it waits
(:meth:`SampleQueue.wake_early`), copies the sample out and parses its attachment
(inside the per-sample guard) while the loop wakes, and puts it in the import's
:class:`SampleQueue`, bounded in samples (``queue``) and bytes (``ZENOH_QUEUE_BYTES``,
one sample admitted whatever its size):

* **lossless**: the exporters do not send more than the import acknowledged room for
  (docs/wire-format.md: acknowledgements), so the queue does not fill; a publisher that
  ignores acknowledgements (a plain Zenoh one) is held back: Zenoh's thread waits in
  the callback for room, so Zenoh's delivery waits. It waits in slices, and gives
  up on a stop or when the graph took nothing for ``ZENOH_IMPORT_STALL`` seconds (then
  drops, counted in ``dropped_local``);
* **leaky**: it never waits: the oldest queued sample is dropped and counted.

A task on the event loop takes the samples in order and, for each, inside one guard:
the sample's own refusal if its copy or attachment was bad, its key's topic, its sequence
accounting, its bodies (split, decoded) and their publication on the graph. A bad sample
is counted in ``refused`` by cause and logged rate-limited; it never ends the import.
Publishing waits while the topic's subscribers are behind (the import's ezflow publisher
has a window of ``queue`` messages and ``ZENOH_QUEUE_BYTES``); a sample leaves the queue
(making room) once all its messages are published, so the import holds at most ``queue``
samples and ``ZENOH_QUEUE_BYTES`` (plus one sample) between Zenoh and the graph, and the
graph's own window beyond.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import zenoh

from .._core._codec import SMALL_BODY, Codec
from .._core._config import (
    DEFAULT_MAX_IN_FLIGHT,
    ZENOH_ACK_INTERVAL,
    ZENOH_IMPORT_STALL,
    ZENOH_IMPORT_TOPICS,
    ZENOH_QUEUE_BYTES,
    ShmOptions,
)
from .._core._exceptions import (
    ConfigurationError,
    MessageTooLargeError,
    ProtocolError,
    UnregisteredTypeError,
)
from ._keys import imported_topic, literal_prefix
from ._mapping import MappingStats, Refusals, queue_of
from ._wire import ACK_CHUNK, Meta, Refused, pack_ack, parse_attachment, split_batch

if TYPE_CHECKING:
    from .._graph._context import GraphContext
    from .._graph._publisher import Publisher
    from ._bridge import Import

__all__ = ["ImportRun", "SampleQueue"]

log = logging.getLogger("ezflow.zenoh")

_WAIT_SLICE = 0.1  # seconds Zenoh's thread waits for room at a time (rechecking the stop)
_UNDECLARE_WAIT = 2.0  # seconds a stop waits for Zenoh's last callback


class _Sample:
    """One received sample: Zenoh's sample until :meth:`parse` copies it out (its key,
    payload, attachment - or why it is refused), then how many of its messages are
    published already (a restart resumes there)."""

    __slots__ = (
        "counted",
        "done",
        "encoding",
        "key",
        "meta",
        "payload",
        "raw",
        "refused",
        "seen",
        "size",
    )

    def __init__(self, raw: Any, size: int, encoding: str) -> None:
        self.raw = raw
        self.size = size
        self.encoding = encoding
        self.key = "?"
        self.payload = b""
        self.meta: Meta | None = None
        self.refused: Refused | None = None
        self.done = 0
        self.seen = False  # its sequence was accounted for
        self.counted = False  # counted as received

    def parse(self) -> None:
        """Copy the sample out of Zenoh, its attachment parsed inside a guard (once)."""
        raw, self.raw = self.raw, None
        if raw is None:
            return
        try:
            self.key = str(raw.key_expr)
            self.payload = raw.payload.to_bytes()
            attachment = raw.attachment
            if attachment is not None:
                try:
                    self.meta = parse_attachment(attachment.to_bytes())
                except Refused as exc:
                    # Raw and json imports take any publisher's samples: an attachment
                    # that is not ezflow's is theirs to have, not a fault.
                    if self.encoding == "ezflow":
                        self.refused = exc
        except Exception as exc:  # nothing from a peer may escape
            self.payload, self.meta = b"", None
            self.refused = Refused("body", f"unreadable sample: {exc!r}")

    @property
    def messages(self) -> int:
        self.parse()
        meta = self.meta
        return 1 if meta is None or self.refused is not None else (0 if meta.end else meta.n)


def _noop() -> None:
    pass


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SampleQueue:
    """The samples between Zenoh's thread and the event loop (see the module doc):
    :meth:`put` from any thread, :meth:`get` and :meth:`done` on the loop. Samples taken
    by :meth:`get` count against the bounds until :meth:`done`."""

    def __init__(self, *, samples: int, nbytes: int, lossless: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._cond = threading.Condition()
        self._items: collections.deque[_Sample] = collections.deque()
        self._samples = samples
        self._bytes = nbytes
        self._lossless = lossless
        self._count = 0  # samples held (queued and taken), and their payload bytes
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._stalled = False  # the graph took nothing for ZENOH_IMPORT_STALL
        #: counted under the lock, from Zenoh's thread: messages dropped here (leaky, or
        #: a stalled lossless queue), per key (the sequence accounting subtracts them),
        #: and messages that came after the stop
        self.dropped = 0
        self.skipped: dict[str, int] = {}
        self.cut = 0
        #: per key, the next sequence number after the samples cut by the stop
        self.reached: dict[str, int] = {}

    def __len__(self) -> int:
        return self._count

    def _full(self, size: int) -> bool:
        return self._count > 0 and (self._count >= self._samples or self._size + size > self._bytes)

    def put(self, item: _Sample) -> None:
        """Queue *item*; see the module doc for what happens when the queue is full."""
        size = item.size
        waker = None
        with self._cond:
            if self._closed:
                self.cut += item.messages
                self._reached(item)
                return
            if self._lossless:
                if self._full(size) and threading.get_ident() != self._loop_thread:
                    waited = self._wait_for_room(size)
                    if waited == "closed":
                        self.cut += item.messages
                        self._reached(item)
                        return
                    if waited == "stalled":  # drop it, counted
                        self._drop(item)
                        return
            elif self._full(size) and item.messages:  # (an end marker is never dropped)
                while self._full(size):
                    oldest = next((i for i in self._items if i.messages), None)
                    if oldest is None:
                        break
                    self._items.remove(oldest)
                    self._drop(oldest, queued=True)
            self._items.append(item)
            self._count += 1
            self._size += size
            waker, self._waiter = self._waiter, None
        if waker is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: we are stopping
                self._loop.call_soon_threadsafe(_wake, waker)

    def wake_early(self) -> None:
        """(From Zenoh's thread, before it prepares a sample for :meth:`put`) When the
        loop waits in :meth:`get`, start waking it now: waking a sleeping loop from
        another thread takes 50-100 µs here, and copying the sample out meanwhile
        overlaps with it (the loop, once awake, waits for the GIL this thread holds,
        then finds the sample queued). Nothing when the loop is busy."""
        if self._waiter is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: we are stopping
                self._loop.call_soon_threadsafe(_noop)

    def _wait_for_room(self, size: int) -> str:
        # (holding the lock) Bounded: "room", "closed" (a stop), or "stalled" (the graph
        # took nothing for ZENOH_IMPORT_STALL).
        if self._stalled:
            return "stalled"
        deadline = time.monotonic() + ZENOH_IMPORT_STALL
        taken = self._count
        while self._full(size):
            if self._closed:
                return "closed"
            if self._count < taken:  # progress: the graph took one
                deadline = time.monotonic() + ZENOH_IMPORT_STALL
                taken = self._count
            left = deadline - time.monotonic()
            if left <= 0:
                self._stalled = True
                log.warning(
                    "a lossless import's graph took nothing for %.0f s: its samples are "
                    "dropped (counted) until it takes one again",
                    ZENOH_IMPORT_STALL,
                )
                return "stalled"
            self._cond.wait(min(left, _WAIT_SLICE))
        return "closed" if self._closed else "room"

    def _drop(self, item: _Sample, *, queued: bool = False) -> None:
        n = item.messages
        self.dropped += n
        if item.meta is not None and n:
            self.skipped[item.key] = self.skipped.get(item.key, 0) + n
        if queued:
            self._count -= 1
            self._size -= item.size

    async def get(self) -> _Sample:
        """The next sample (it counts against the bounds until :meth:`done`)."""
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                waiter = self._waiter = self._loop.create_future()
            await waiter

    def done(self, item: _Sample) -> None:
        """*item* (from :meth:`get`) is handled: its room is free again."""
        with self._cond:
            self._count -= 1
            self._size -= item.size
            self._stalled = False
            self._cond.notify_all()

    def close(self) -> int:
        """Refuse further samples (counted in :attr:`cut`), wake a waiting thread, and
        return the messages of the samples still queued (they are cut too)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            left = 0
            for item in self._items:
                left += item.messages
                self._reached(item)
            self._items.clear()
            return left

    def _reached(self, item: _Sample) -> None:
        # (holding the lock) A cut sample reached this import: the goodbye says so.
        meta = item.meta
        if meta is not None and item.refused is None:
            self.reached[item.key] = max(self.reached.get(item.key, 0), meta.seq + item.messages)

    def taken_skips(self, key: str) -> int:
        with self._cond:
            return self.skipped.pop(key, 0)


class _AckSender:
    """Puts a lossless import's acknowledgements from a thread of its own: a put from the
    event loop waits for Zenoh's delivery thread, which holds the session while the
    import's callback waits for the GIL (measured: 45 µs median, 300 µs p90, a fifth of
    an importing loop's time at 64 B). The loop hands over the latest acknowledgement of
    each key (:meth:`send`: no wait); the thread declares a publisher per key and puts.
    :meth:`close` puts what is pending, then stops the thread (bounded)."""

    def __init__(self, session: Any, name: str) -> None:
        self._session = session
        self._cond = threading.Condition()
        self._pending: dict[str, bytes] = {}
        self._publishers: dict[str, Any] = {}  # key -> its acknowledgement publisher
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, key: str, payload: bytes) -> None:
        """Put *payload* on *key*'s acknowledgement key soon (replacing one not put yet)."""
        with self._cond:
            self._pending[key] = payload
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if not self._pending:
                    return
                pending, self._pending = self._pending, {}
            for key, payload in pending.items():
                try:
                    publisher = self._publishers.get(key)
                    if publisher is None:  # (one per key: a declared publisher puts faster)
                        publisher = self._publishers[key] = self._session.declare_publisher(
                            f"{key}/{ACK_CHUNK}", congestion_control=zenoh.CongestionControl.DROP
                        )
                    publisher.put(payload)
                except Exception as exc:  # the session is closing; the next one repeats it
                    log.debug("import of %s: acknowledgement not sent: %s", key, exc)

    def close(self) -> None:
        """Put what is pending, stop the thread and wait for it (bounded: it is a daemon)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(_UNDECLARE_WAIT)


class ImportRun:
    """The runtime of one :class:`~ezflow.zenoh.Import` (see the module doc)."""

    def __init__(
        self,
        mapping: Import,
        key: str,
        *,
        session: Any,
        context: GraphContext,
        codec: Codec,
        stats: MappingStats,
        name: str,
    ) -> None:
        self.mapping = mapping
        #: samples held (leaky), or the window in messages (lossless): queue_of's rule
        self.window = queue_of(mapping.lossless, mapping.queue)
        self.key = key
        self.name = name
        self.stats = stats
        self._session = session
        self._context = context
        self._codec = codec
        self._refused = Refusals(name, stats)
        self._literal = literal_prefix(key)
        self._queue: SampleQueue | None = None
        self._subscriber: Any = None
        self._undeclared = threading.Event()  # Zenoh ran its last callback
        self._current: _Sample | None = None  # taken from the queue, not done
        self._publishers: dict[str, Publisher] = {}
        self._topics: dict[str, str] = {}  # key -> topic (bounded: ZENOH_IMPORT_TOPICS)
        self._expected: dict[str, int] = {}  # key -> next sequence number
        self._drops: dict[str, int] = {}  # key -> its exporter's drops
        # Lossless flow control: this importer's name in acknowledgements, per key the
        # next sequence number its graph has not taken yet, and what was acknowledged.
        self._id = f"{uuid.uuid4().hex[:12]}"
        self._taken: dict[str, int] = {}
        self._acked: dict[str, int] = {}
        self._unacked_bytes: dict[str, int] = {}
        self._acks: _AckSender | None = None
        self._received: dict[str, int] = {}  # key -> next sequence number not received
        self._acker: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Declare the Zenoh subscriber (ConfigurationError for a key Zenoh refuses)."""
        self._queue = SampleQueue(
            samples=self.window, nbytes=ZENOH_QUEUE_BYTES, lossless=self.mapping.lossless
        )
        self._undeclared = threading.Event()
        try:
            # Run by Zenoh's own thread (indirect=False: no channel of zenoh-python's
            # in between, no thread of ours): one wake-up fewer a sample.
            self._subscriber = self._session.declare_subscriber(
                self.key,
                zenoh.handlers.Callback(self._on_sample, self._undeclared.set, indirect=False),
            )
        except Exception as exc:
            raise ConfigurationError(f"import of {self.key!r}: Zenoh refused it: {exc}") from exc
        if self.mapping.lossless:
            self._acks = _AckSender(self._session, f"ezflow-zenoh-acks {self.key}")
            self._acker = asyncio.ensure_future(self._ack_periodically())

    async def recover(self) -> None:
        """Before a restart: nothing to renew (the Zenoh side never failed; the sample
        being published is published again from where it stopped)."""
        if self.stats.state == "restarting":
            self.stats.state, self.stats.reason = "waiting", ""
        self.update_state()

    def progress(self) -> int:
        return self.stats.messages + sum(self.stats.refused.values())

    def update_state(self) -> None:
        if self.stats.state in ("restarting", "failed", "stopped"):
            return
        self.stats.state = "live" if self._publishers else "waiting"

    def sync(self) -> None:
        """Bring the counters kept by Zenoh's thread into :attr:`stats`."""
        queue = self._queue
        if queue is not None:
            self.stats.dropped_local = queue.dropped

    @property
    def busy(self) -> bool:
        queue = self._queue
        return self._current is not None or (queue is not None and len(queue) > 0)

    # -- on a Zenoh thread -------------------------------------------------------------------

    def _on_sample(self, sample: Any) -> None:
        """(On a Zenoh thread) Queue *sample*, copied out of Zenoh and its attachment
        parsed (in the per-sample guard), while the loop wakes if it was waiting
        (:meth:`SampleQueue.wake_early`). Decoding and publishing stay on the loop."""
        queue = self._queue
        if queue is None:
            return
        queue.wake_early()  # (the loop wakes while this thread copies the sample out)
        try:
            size = len(sample.payload)
        except Exception:  # (never seen; and then the loop refuses it)
            size = 0
        item = _Sample(sample, size, self.mapping.encoding)
        item.parse()
        queue.put(item)

    # -- on the event loop ---------------------------------------------------------------

    async def run(self) -> None:
        """Publish the queued samples until cancelled; raises what the graph raises
        (the supervisor restarts, resuming at the sample being published)."""
        queue = self._queue
        assert queue is not None
        while True:
            self.sync()
            self.update_state()
            item = self._current
            if item is None:
                item = self._current = await queue.get()
            await self._handle(item)
            self._current = None
            queue.done(item)
            meta = item.meta
            if meta is not None and self._acker is not None and item.refused is None:
                self._took(item.key, meta.seq + item.messages, item.size)

    async def _handle(self, item: _Sample) -> None:
        if not item.counted:
            item.counted = True
            item.parse()
            self.stats.samples += 1
            if item.meta is not None and item.refused is None:
                self._received[item.key] = item.meta.seq + item.messages
        key, meta = item.key, item.meta
        if item.refused is not None:
            self._refused(item.refused, key)
            return
        if meta is not None and meta.end:
            self._end(key, meta)
            return
        try:
            topic = self._topic(key)
        except Refused as refused:
            self._refused(refused, key)
            return
        if meta is not None and not item.seen:
            item.seen = True
            self._account(key, meta)
        encoding = self.mapping.encoding
        if encoding == "ezflow":
            try:
                bodies: list[Any] = (
                    [item.payload]
                    if meta is None or meta.n == 1
                    else split_batch(item.payload, meta.sizes or [], SMALL_BODY)
                )
            except Refused as refused:
                self._refused(refused, key)
                return
        else:
            bodies = [item.payload]
        publisher = self._publishers.get(topic)
        if publisher is None:
            try:
                publisher = await self._publisher(topic)
            except ConfigurationError as exc:  # the graph refuses this topic: the key's fault
                self._refused(Refused("key", str(exc)), key)
                return
        if encoding == "ezflow":
            await self._publish_bodies(item, bodies, publisher, key)
            return
        stats = self.stats
        for index in range(item.done, len(bodies)):
            body = bodies[index]
            item.done = index + 1
            try:
                message = _from_json(body) if encoding == "json" else body
            except Refused as refused:
                self._refused(refused, key)
                continue
            try:
                await publisher.publish(message)
            except (MessageTooLargeError, UnregisteredTypeError) as exc:
                self._refused(Refused("publish", str(exc)), key)
                continue
            except BaseException:
                item.done = index  # not published: a restart publishes it again
                raise
            stats.messages += 1
            stats.bytes += len(body)

    async def _publish_bodies(
        self, item: _Sample, bodies: list[Any], publisher: Publisher, key: str
    ) -> None:
        """Publish *item*'s ezflow *bodies* from ``item.done`` on, as they came (not
        encoded again): decoded here only to refuse a bad one (and for subscribers in
        this process), in runs - each with one ``publish_encoded_many``, one room check
        (and wait) for the run instead of one coroutine a message. ``item.done`` counts
        the bodies published or refused (a restart resumes after them)."""
        decode, decode_many = self._codec.decode, self._codec._decode_many
        outlet_stats = publisher._outlet.stats  # (the live counters: statistics() copies)
        count = len(bodies)
        index = item.done
        while index < count:
            start = index
            messages: list[Any] = []
            refused: Refused | None = None
            with contextlib.suppress(ProtocolError):  # (all of them at once; else each)
                messages = decode_many(bodies[index:] if index else bodies)
                index = count
            while index < count:
                # (A small body of a batch came as bytes of its own, split_batch's copy:
                # it costs less than it saves - the codec decodes bytes faster than a
                # view, 0.47 against 0.81 µs with the copy, 64 B - a link writes it in one
                # piece, and the message does not hold the whole payload.)
                body = bodies[index]
                try:
                    messages.append(decode(body))
                except ProtocolError as exc:
                    refused = Refused("body", str(exc))
                    break
                index += 1
            if messages:
                run = bodies[start:index] if start or index < count else bodies
                before = outlet_stats.messages
                try:
                    await publisher.publish_encoded_many(messages, run)
                except MessageTooLargeError as exc:  # (one of them: the others go on)
                    refused = Refused("publish", str(exc))
                    index = start + outlet_stats.messages - before
                except BaseException:
                    index = start + outlet_stats.messages - before
                    self._published(run, index - start)
                    item.done = index  # the rest is not published: a restart publishes it
                    raise
                self._published(run, index - start)
            item.done = index
            if refused is not None:  # (the body at index)
                self._refused(refused, key)
                index += 1
                item.done = index

    def _published(self, bodies: list[Any], count: int) -> None:
        stats = self.stats
        stats.messages += count
        stats.bytes += sum(map(len, bodies[:count] if count < len(bodies) else bodies))

    def _topic(self, key: str) -> str:
        topic = self._topics.get(key)
        if topic is not None:
            return topic
        mapping = self.mapping
        if self._literal is None:
            topic = mapping.topic
        else:
            try:
                topic = imported_topic(mapping.topic, key, self._literal)
            except (ConfigurationError, UnicodeDecodeError, ValueError) as exc:
                raise Refused("key", f"key {key!r} maps to no topic: {exc}") from None
        if len(self._topics) >= ZENOH_IMPORT_TOPICS:
            raise Refused(
                "key", f"more than {ZENOH_IMPORT_TOPICS} keys (ZENOH_IMPORT_TOPICS): {key!r}"
            )
        self._topics[key] = topic
        return topic

    async def _publisher(self, topic: str) -> Publisher:
        publisher = await self._context.publisher(
            topic,
            max_in_flight=min(self.window, DEFAULT_MAX_IN_FLIGHT),
            max_in_flight_bytes=ZENOH_QUEUE_BYTES,
            # No CPU handoff after a paced publish: the yield would hand the GIL to
            # Zenoh's thread, and the loop would queue behind it to take it back.
            shm=ShmOptions(handoff=False),
        )
        self._publishers[topic] = publisher
        self.update_state()
        return publisher

    def _account(self, key: str, meta: Meta, *, latency: bool = True) -> None:
        """Count a gap in *key*'s sequence, less what our own queue dropped, as messages
        lost between the hosts (the first sample of a key sets where counting starts),
        and the exporter's drops and the latency."""
        stats = self.stats
        assert self._queue is not None
        expected = self._expected.get(key, meta.seq)
        gap = meta.seq - expected - self._queue.taken_skips(key)
        if gap > 0:
            stats.lost_remote += gap
            log.warning("import of %s: %d messages lost between the hosts", key, gap)
        self._expected[key] = meta.seq + meta.n
        if self._drops.get(key, 0) != meta.drops:
            self._drops[key] = meta.drops
            stats.dropped_remote = sum(self._drops.values())
        if latency:
            stats.latency_ns.append(time.time_ns() - meta.t)

    def _end(self, key: str, meta: Meta) -> None:
        """An end marker: count the tail that was lost, end the key's topic (its
        subscribers see the end of stream, as they would locally)."""
        if key in self._expected:
            self._account(key, Meta(meta.seq, meta.t, meta.drops, 0, None, True), latency=False)
        self._expected.pop(key, None)
        topic = self._topics.get(key)
        publisher = None if topic is None else self._publishers.pop(topic, None)
        if publisher is not None:  # the end crosses over: subscribers see it
            task = asyncio.ensure_future(publisher.aclose())
            task.add_done_callback(_retrieve)
        self.update_state()

    async def finish(self, deadline: float) -> None:
        """After a drain (the run task stopped): count what is left, wait for the graph to
        take what was published until *deadline* (loop time), then count the rest."""
        queue = self._queue
        stats = self.stats
        if queue is not None:
            left = queue.close()
            current = self._current
            if current is not None:
                left += max(0, current.messages - current.done)
                self._current = None
            stats.lost_in_flight += left
        loop = asyncio.get_running_loop()
        busy = self._publishers.values()
        while loop.time() < deadline and any(p.in_flight for p in busy):  # noqa: ASYNC110 - other processes release
            await asyncio.sleep(0.01)
        stats.lost_in_flight += sum(p.in_flight for p in self._publishers.values())

    # -- lossless flow control: acknowledgements ----------------------------------------

    def _took(self, key: str, next_seq: int, nbytes: int) -> None:
        """The graph took every message of *key* before *next_seq* (the last sample had
        *nbytes*): acknowledge once half the window went in messages, or a quarter in
        bytes, so the export (whose batches take at most half of it) has room for one
        when the acknowledgement comes, while this import keeps up. (Every half window,
        not every quarter, in messages: each acknowledgement costs both bridges and the
        router a Zenoh sample and its wake-ups; halving them took 2-5 µs of CPU a 64 B
        message off the three processes together, perf/micro/bridge_cli_cpu.py.)"""
        self._taken[key] = next_seq
        acked = self._acked.get(key)
        unacked = self._unacked_bytes.get(key, 0) + nbytes
        if (
            acked is None
            or next_seq - acked >= max(1, self.window // 2)
            or unacked >= ZENOH_QUEUE_BYTES // 4
        ):
            self._ack(key, next_seq)
            unacked = 0
        self._unacked_bytes[key] = unacked

    def _ack(self, key: str, next_seq: int | None, *, bye: bool = False) -> None:
        if next_seq is not None:
            self._acked[key] = next_seq
        acks = self._acks
        if acks is not None:
            acks.send(key, pack_ack(self._id, next_seq, self.window, ZENOH_QUEUE_BYTES, bye=bye))

    def _goodbye(self, keys: list[str]) -> None:
        for key in keys:
            payload = pack_ack(
                self._id, self._received.get(key), self.window, ZENOH_QUEUE_BYTES, bye=True
            )
            with contextlib.suppress(Exception):  # (the session is closing)
                self._session.put(
                    f"{key}/{ACK_CHUNK}", payload, congestion_control=zenoh.CongestionControl.BLOCK
                )

    async def _ack_periodically(self) -> None:
        """Repeat each key's acknowledgement every ``ZENOH_ACK_INTERVAL`` (a lost one is
        repaired, and the export knows this importer is alive); for a key without
        wildcards not seen yet, a hello."""
        exact = "*" not in self.key
        while True:
            if exact and self.key not in self._taken:
                self._ack(self.key, None)
            for key, next_seq in list(self._taken.items()):
                self._ack(key, next_seq)
            await asyncio.sleep(ZENOH_ACK_INTERVAL)

    def count_cut(self) -> None:
        """Count the samples that reached the import after its queue closed."""
        queue = self._queue
        if queue is not None:
            self.stats.lost_in_flight += queue.cut
            queue.cut = 0

    def close_queue(self) -> None:
        """Refuse further samples (a waiting Zenoh thread returns); count what is left."""
        queue = self._queue
        if queue is not None:
            self.stats.lost_in_flight += queue.close()

    def stop_receiving(self) -> None:
        """Undeclare the Zenoh subscriber (a drain delivers what was received) and wait
        (bounded) until Zenoh ran its last callback (a full queue that is closed refuses
        at once)."""
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            with contextlib.suppress(Exception):
                subscriber.undeclare()
            self._undeclared.wait(_UNDECLARE_WAIT)

    async def close(self) -> None:
        """Undeclare, refuse what still comes (counted), close the topics. Idempotent."""
        acker, self._acker = self._acker, None
        queue = self._queue
        if queue is not None:
            self.stats.lost_in_flight += queue.close()
        await asyncio.to_thread(self.stop_receiving)
        self.count_cut()
        if acker is not None:
            acker.cancel()
            await asyncio.gather(acker, return_exceptions=True)
            acks, self._acks = self._acks, None
            if acks is not None:  # (every acknowledgement goes before the goodbye)
                await asyncio.to_thread(acks.close)
            # Goodbye: the export counts what it sent that never reached us, and stops
            # waiting for us. Sent reliably (BLOCK), off the loop.
            if queue is not None:
                for key, reached in queue.reached.items():
                    self._received[key] = max(self._received.get(key, 0), reached)
            keys = list(self._received) or ([self.key] if "*" not in self.key else [])
            await asyncio.to_thread(self._goodbye, keys)
        self.sync()
        publishers, self._publishers = self._publishers, {}
        for publisher in publishers.values():
            with contextlib.suppress(Exception):
                await publisher.aclose()
        self._refused.close()
        if self.stats.state != "failed":
            self.stats.state = "stopped"


def _from_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        raise Refused("json", f"not UTF-8 JSON: {exc}") from None


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("closing an imported topic failed: %s", task.exception())
