"""One import: the samples of a Zenoh key expression published on ezflow topics.

Zenoh calls :meth:`ImportRun._on_sample` on its own thread (a direct callback: no
channel of zenoh-python's in between, so Zenoh holds no sample of ours). The callback
copies the sample out (key, payload, attachment parsed inside a guard) and puts it in the
import's :class:`SampleQueue`, bounded in samples (``queue``) and bytes
(``ZENOH_QUEUE_BYTES``, one sample admitted whatever its size):

* **lossless**: when the queue is full, the callback waits for room - so Zenoh's
  delivery thread waits, its reliable link fills, and the exporter's ``put`` (BLOCK)
  waits: backpressure. It waits in slices, and gives up on a stop or when the graph took
  nothing for ``ZENOH_IMPORT_STALL`` seconds (then drops, counted in ``dropped_local``);
* **leaky**: it never waits: the oldest queued sample is dropped and counted.

A task on the event loop takes the samples in order and, for each, inside one guard:
the sample's own refusal if its attachment was bad, its key's topic, its sequence
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

from .._core._codec import Codec
from .._core._config import (
    ZENOH_ACK_INTERVAL,
    ZENOH_IMPORT_STALL,
    ZENOH_IMPORT_TOPICS,
    ZENOH_QUEUE_BYTES,
)
from .._core._exceptions import (
    ConfigurationError,
    MessageTooLargeError,
    ProtocolError,
    UnregisteredTypeError,
)
from ._keys import key_to_topic
from ._mapping import MappingStats, Refusals
from ._wire import ACK_CHUNK, Meta, Refused, pack_ack, parse_attachment, split_batch

if TYPE_CHECKING:
    from .._graph._context import GraphContext
    from .._graph._publisher import Publisher
    from ._bridge import Import

__all__ = ["ImportRun", "SampleQueue"]

log = logging.getLogger("ezflow.zenoh")

_WAIT_SLICE = 0.1  # seconds the callback waits for room at a time (it rechecks the stop)


class _Sample:
    """One received sample: its key, payload, parsed attachment (or why it is refused),
    and how many of its messages are published already (a restart resumes there)."""

    __slots__ = ("done", "key", "meta", "payload", "refused", "seen")

    def __init__(self, key: str, payload: bytes, meta: Meta | None, refused: Refused | None):
        self.key = key
        self.payload = payload
        self.meta = meta
        self.refused = refused
        self.done = 0
        self.seen = False  # its sequence was accounted for

    @property
    def messages(self) -> int:
        meta = self.meta
        return 1 if meta is None else (0 if meta.end else meta.n)

    @property
    def weight(self) -> int:
        """What it counts against a queue of ``queue`` messages (an end marker: 1)."""
        return max(1, self.messages)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SampleQueue:
    """The samples between Zenoh's thread and the event loop (see the module doc):
    :meth:`put` from any thread, :meth:`get` and :meth:`done` on the loop. Samples taken
    by :meth:`get` count against the bounds until :meth:`done`."""

    def __init__(self, *, messages: int, nbytes: int, lossless: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._cond = threading.Condition()
        self._items: collections.deque[_Sample] = collections.deque()
        self._messages = messages
        self._bytes = nbytes
        self._lossless = lossless
        self._count = 0  # messages held (queued and taken; a sample weighs >= 1), bytes
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

    def __len__(self) -> int:
        return self._count

    def _full(self, size: int, weight: int) -> bool:
        return self._count > 0 and (
            self._count + weight > self._messages or self._size + size > self._bytes
        )

    def put(self, item: _Sample) -> None:
        """Queue *item*; see the module doc for what happens when the queue is full."""
        size, weight = len(item.payload), item.weight
        waker = None
        with self._cond:
            if self._closed:
                self.cut += item.messages
                return
            if self._lossless:
                if self._full(size, weight) and threading.get_ident() != self._loop_thread:
                    waited = self._wait_for_room(size, weight)
                    if waited == "closed":
                        self.cut += item.messages
                        return
                    if waited == "stalled":  # drop it, counted
                        self._drop(item)
                        return
            elif item.messages:  # (an end marker is never dropped, nor drops another)
                while self._full(size, weight):
                    oldest = next((i for i in self._items if i.messages), None)
                    if oldest is None:
                        break
                    self._items.remove(oldest)
                    self._drop(oldest, queued=True)
            self._items.append(item)
            self._count += weight
            self._size += size
            waker, self._waiter = self._waiter, None
        if waker is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: we are stopping
                self._loop.call_soon_threadsafe(_wake, waker)

    def _wait_for_room(self, size: int, weight: int) -> str:
        # (holding the lock) Bounded: "room", "closed" (a stop), or "stalled" (the graph
        # took nothing for ZENOH_IMPORT_STALL).
        if self._stalled:
            return "stalled"
        deadline = time.monotonic() + ZENOH_IMPORT_STALL
        taken = self._count
        while self._full(size, weight):
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
            self._count -= item.weight
            self._size -= len(item.payload)

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
            self._count -= item.weight
            self._size -= len(item.payload)
            self._stalled = False
            self._cond.notify_all()

    def pending(self) -> int:
        """Messages of the samples still queued (not taken)."""
        with self._cond:
            return sum(item.messages for item in self._items)

    def close(self) -> int:
        """Refuse further samples (counted in :attr:`cut`), wake a waiting callback, and
        return the messages of the samples still queued (they are cut too)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            left = sum(item.messages for item in self._items)
            self._items.clear()
            return left

    def taken_skips(self, key: str) -> int:
        with self._cond:
            return self.skipped.pop(key, 0)


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
        self.key = key
        self.name = name
        self.stats = stats
        self._session = session
        self._context = context
        self._codec = codec
        self._refused = Refusals(name, stats)
        self._literal = key.split("*", maxsplit=1)[0].rsplit("/", 1)[0] if "*" in key else None
        self._queue: SampleQueue | None = None
        self._subscriber: Any = None
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
        self._received: dict[str, int] = {}  # key -> next sequence number not received
        self._acker: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Declare the Zenoh subscriber (ConfigurationError for a key Zenoh refuses)."""
        self._queue = SampleQueue(
            messages=self.mapping.queue, nbytes=ZENOH_QUEUE_BYTES, lossless=self.mapping.lossless
        )
        try:
            self._subscriber = self._session.declare_subscriber(
                self.key, zenoh.handlers.Callback(self._on_sample, indirect=False)
            )
        except Exception as exc:
            raise ConfigurationError(f"import of {self.key!r}: Zenoh refused it: {exc}") from exc
        if self.mapping.lossless:
            self._acker = asyncio.ensure_future(self._ack_periodically())

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

    # -- on Zenoh's thread ---------------------------------------------------------------

    def _on_sample(self, sample: Any) -> None:
        queue = self._queue
        if queue is None:
            return
        meta: Meta | None = None
        refused: Refused | None = None
        try:
            key = str(sample.key_expr)
            payload = sample.payload.to_bytes()
            attachment = sample.attachment
            if attachment is not None:
                try:
                    meta = parse_attachment(attachment.to_bytes())
                except Refused as exc:
                    # Raw and json imports take any publisher's samples: an attachment
                    # that is not ezflow's is theirs to have, not a fault.
                    if self.mapping.encoding == "ezflow":
                        refused = exc
        except Exception as exc:  # nothing from a peer may escape into Zenoh's thread
            key, payload, refused = "?", b"", Refused("body", f"unreadable sample: {exc!r}")
        if meta is not None and refused is None:
            self._received[key] = meta.seq + (0 if meta.end else meta.n)
        queue.put(_Sample(key, payload, meta, refused))

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
                self._took(item.key, meta.seq + item.messages, empty=not len(queue))

    async def _handle(self, item: _Sample) -> None:
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
                    else split_batch(item.payload, meta.sizes or [])
                )
            except Refused as refused:
                self._refused(refused, key)
                return
        else:
            bodies = [item.payload]
        publisher = self._publishers.get(topic)
        if publisher is None:
            publisher = await self._publisher(topic)
        codec = self._codec
        stats = self.stats
        for index in range(item.done, len(bodies)):
            body = bodies[index]
            item.done = index + 1
            try:
                if encoding == "ezflow":
                    message = codec.decode(body)
                elif encoding == "json":
                    message = _from_json(body)
                else:
                    message = body
            except Refused as refused:
                self._refused(refused, key)
                continue
            except ProtocolError as exc:
                self._refused(Refused("body", str(exc)), key)
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

    def _topic(self, key: str) -> str:
        topic = self._topics.get(key)
        if topic is not None:
            return topic
        mapping = self.mapping
        if self._literal is None:
            topic = mapping.topic
        else:
            try:
                suffix = key_to_topic(key, self._literal)
            except (ConfigurationError, UnicodeDecodeError, ValueError) as exc:
                raise Refused("key", f"key {key!r} maps to no topic: {exc}") from None
            topic = mapping.topic.rstrip("/") + "/" + suffix.lstrip("/")
        if len(self._topics) >= ZENOH_IMPORT_TOPICS:
            raise Refused(
                "key", f"more than {ZENOH_IMPORT_TOPICS} keys (ZENOH_IMPORT_TOPICS): {key!r}"
            )
        self._topics[key] = topic
        return topic

    async def _publisher(self, topic: str) -> Publisher:
        publisher = await self._context.publisher(
            topic, max_in_flight=self.mapping.queue, max_in_flight_bytes=ZENOH_QUEUE_BYTES
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

    def _took(self, key: str, next_seq: int, *, empty: bool) -> None:
        """The graph took every message of *key* before *next_seq*: acknowledge it once
        a quarter of the window went (or the queue is empty), so the export sends more."""
        self._taken[key] = next_seq
        acked = self._acked.get(key)
        if acked is None or empty or next_seq - acked >= max(1, self.mapping.queue // 4):
            self._ack(key, next_seq)

    def _ack(self, key: str, next_seq: int | None, *, bye: bool = False) -> None:
        if next_seq is not None:
            self._acked[key] = next_seq
        payload = pack_ack(self._id, next_seq, self.mapping.queue, ZENOH_QUEUE_BYTES, bye=bye)
        try:
            self._session.put(
                f"{key}/{ACK_CHUNK}", payload, congestion_control=zenoh.CongestionControl.DROP
            )
        except Exception as exc:  # the session is closing; the next one repeats it
            log.debug("import of %s: acknowledgement not sent: %s", key, exc)

    def _goodbye(self, keys: list[str]) -> None:
        for key in keys:
            payload = pack_ack(
                self._id, self._received.get(key), self.mapping.queue, ZENOH_QUEUE_BYTES, bye=True
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

    def close_queue(self) -> None:
        """Refuse further samples (a waiting Zenoh thread returns); count what is left."""
        queue = self._queue
        if queue is not None:
            self.stats.lost_in_flight += queue.close()

    def stop_receiving(self) -> None:
        """Undeclare the Zenoh subscriber (a drain delivers what was received)."""
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            with contextlib.suppress(Exception):
                subscriber.undeclare()

    async def close(self) -> None:
        """Undeclare, refuse what still comes (counted), close the topics. Idempotent."""
        acker, self._acker = self._acker, None
        queue = self._queue
        if queue is not None:
            self.stats.lost_in_flight += queue.close()
        await asyncio.to_thread(self.stop_receiving)
        if queue is not None:
            self.stats.lost_in_flight += queue.cut
            queue.cut = 0
        if acker is not None:
            acker.cancel()
            await asyncio.gather(acker, return_exceptions=True)
            # Goodbye: the export counts what it sent that never reached us, and stops
            # waiting for us. Sent reliably (BLOCK), off the loop.
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
