"""Blocks of shared memory written once by a publisher and leased to channels.

This is the layer between the segments (:mod:`._segment`) and the shm transport. It is
made of pure data structures: no sockets, no asyncio, no threads of its own.

Publisher side: :class:`ShmRing`
    Owns the segments. A message is written once into a :class:`Block` obtained with
    :meth:`ShmRing.acquire`, then :meth:`ShmRing.publish`\\ ed to the channels (one per
    subscribing process) it goes to; each of them gets the same small
    :class:`Descriptor`. The block is *leased* by every one of those channels and is
    reused only when each has :meth:`~ShmRing.release`\\ d it, or was
    :meth:`~ShmRing.drop_channel`\\ ped (its process died or disconnected).

    Messages of up to ``slot_size`` bytes go into one of ``slot_count`` fixed slots of
    one ring segment. Larger ones get a dedicated *out-of-line* segment, which is kept
    in a pool once free and reused for a later message of between half its capacity and
    its capacity; so does a small message when every slot is leased. All segments
    together never exceed ``max_bytes``.

    Hot blocks: free slots and pooled blocks are handed out most recently freed first
    (the block a subscriber has just let go of is the likeliest still cached), and every
    segment is pre-faulted when made (see :mod:`._segment`).

Channel side: :class:`ShmRingReader`
    Turns a descriptor into a read-only, zero-copy memoryview of the block and learns
    when the last object referring to it (the view, numpy arrays or slices built on it)
    is gone, so that the channel releases the block only when nothing in its process
    can see the message any more: a message a subscriber keeps never changes under it.

Generations
    Each time a block is acquired its generation goes up by one and travels in the
    descriptor, so a release that arrives late (for an earlier use of the block) or
    twice cannot free a later message.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import logging
import mmap
import weakref
from collections.abc import Callable, Hashable, Iterable
from types import TracebackType
from typing import Any, Final, NamedTuple

import numpy as np

from .._core._config import (
    DEFAULT_SHM_MAX_BYTES,
    DEFAULT_SHM_SLOT_COUNT,
    DEFAULT_SHM_SLOT_SIZE,
    SHM_MAX_MAPPED_SEGMENTS,
)
from .._core._exceptions import ClosedResourceError, ConfigurationError, MessageTooLargeError
from ._segment import ShmSegment

__all__ = ["Block", "Descriptor", "ShmRing", "ShmRingReader", "ShmRingStats"]

log = logging.getLogger("ezflow.shm")

DEFAULT_SLOT_COUNT: Final = DEFAULT_SHM_SLOT_COUNT
DEFAULT_SLOT_SIZE: Final = DEFAULT_SHM_SLOT_SIZE
DEFAULT_MAX_BYTES: Final = DEFAULT_SHM_MAX_BYTES
DEFAULT_MAX_SEGMENTS: Final = SHM_MAX_MAPPED_SEGMENTS


class Descriptor(NamedTuple):
    """Where one published message lives; what a publisher sends to each channel.

    A named tuple: immutable, hashable, cheap to build, and ``list(descriptor)`` /
    ``Descriptor(*fields)`` is its whole wire form (five plain values).

    * ``segment`` - name of the segment in ``/dev/shm``;
    * ``offset``, ``length`` - the message's bytes within it;
    * ``block`` - the block's id in its ring (a slot index below ``slot_count``, an
      out-of-line block above);
    * ``generation`` - how many times that block has been acquired, this use included.
    """

    segment: str
    offset: int
    length: int
    block: int
    generation: int


@dataclasses.dataclass(frozen=True, slots=True)
class Block:
    """A block acquired for writing one message (publisher side).

    ``buffer`` is a writable memoryview of exactly ``descriptor.length`` bytes of shared
    memory. Write the message into it, then :meth:`ShmRing.publish` it; do not write
    after publishing (readers in other processes see the same bytes).
    """

    descriptor: Descriptor
    buffer: memoryview


@dataclasses.dataclass(frozen=True, slots=True)
class ShmRingStats:
    """Counters of a :class:`ShmRing` (a snapshot).

    * ``acquires`` - blocks handed out by :meth:`ShmRing.acquire`;
    * ``failed_acquires`` - calls that returned ``None`` (nothing free);
    * ``blocks_created`` / ``blocks_reused`` - out-of-line blocks newly created or
      taken from the pool;
    * ``blocks_unlinked`` - pooled out-of-line blocks removed to stay within
      ``max_bytes``;
    * ``slot_overflows`` - messages of up to ``slot_size`` bytes that took an
      out-of-line block because every ring slot was leased;
    * ``shm_bytes`` - bytes of shared memory held now (ring and out-of-line blocks, in
      use or pooled).
    """

    acquires: int
    failed_acquires: int
    blocks_created: int
    blocks_reused: int
    blocks_unlinked: int
    slot_overflows: int
    shm_bytes: int


# States of a block.
_FREE: Final = 0  # in the free-slot queue or the out-of-line pool
_WRITING: Final = 1  # acquired, not yet published
_LEASED: Final = 2  # published, some channel still holds it


class _Slot:
    """Bookkeeping for one block (a ring slot or an out-of-line segment)."""

    __slots__ = ("capacity", "generation", "id", "leases", "offset", "segment", "state")

    def __init__(self, block_id: int, segment: ShmSegment, offset: int, capacity: int) -> None:
        self.id = block_id
        self.segment = segment
        self.offset = offset
        self.capacity = capacity
        self.generation = 0
        self.state = _FREE
        self.leases: set[Hashable] = set()


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{name}={value!r} must be a positive int")
    return value


def _round_to_pages(nbytes: int) -> int:
    # Segments are mapped in whole pages anyway; rounding up lets a block be reused for
    # a slightly larger message at no extra cost.
    return -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE


class ShmRing:
    """Shared-memory blocks that a publisher writes once and leases to channels.

    *slot_count* slots of *slot_size* bytes live in one ring segment, created by
    :meth:`open` or on the first :meth:`acquire`. Larger messages get out-of-line
    segments (rounded up to whole pages), pooled after use and reused for messages of
    between half their capacity and their capacity. Everything together - the ring and
    every out-of-line block, in use or pooled - never exceeds *max_bytes*, which must
    hold at least the ring.

    A segment the ring gives up (all of them at :meth:`close`, the oldest pooled blocks
    when room is needed) is closed here and handed to *unlink* (default
    :meth:`ShmSegment.unlink`, at once), which removes its name: the shm transport passes
    one that does it off the event loop. The ring never touches a segment again after
    handing it over.

    Not thread-safe: use it from one thread (the publisher's event loop). Raises
    :class:`ConfigurationError` for non-positive sizes or a ring larger than
    *max_bytes*; :meth:`open` / :meth:`acquire` raise :class:`BrokenResourceError` when
    shared memory is unavailable.
    """

    def __init__(
        self,
        slot_count: int = DEFAULT_SLOT_COUNT,
        slot_size: int = DEFAULT_SLOT_SIZE,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        unlink: Callable[[ShmSegment], None] = ShmSegment.unlink,
    ) -> None:
        self._unlink = unlink
        self._slot_count = _positive_int("slot_count", slot_count)
        self._slot_size = _positive_int("slot_size", slot_size)
        self._max_bytes = _positive_int("max_bytes", max_bytes)
        self._ring_bytes = slot_count * slot_size
        if self._ring_bytes > max_bytes:
            raise ConfigurationError(
                f"a ring of slot_count={slot_count} x slot_size={slot_size} bytes does not"
                f" fit in max_bytes={max_bytes}"
            )
        self._ring: ShmSegment | None = None
        self._closed = False
        self._blocks: dict[int, _Slot] = {}  # every live block by id
        # Free slots, most recently freed last and reused first: a slot a subscriber has
        # just read is still in the shared cache, so writing the next message there is
        # cheaper than into one untouched for a while (a 1 MiB copy runs ~2x faster).
        self._free_slots: list[_Slot] = []
        # Free out-of-line blocks by id, in the order they were freed (oldest first): the
        # ones unlinked first when room is needed.
        self._pool: dict[int, _Slot] = {}
        # The same blocks by capacity (each list most recently freed last), with the
        # capacities present in ascending order, so that finding the smallest fitting
        # block costs a bisection rather than a scan of the pool.
        self._pool_by_capacity: dict[int, list[_Slot]] = {}
        self._pool_capacities: list[int] = []
        self._pool_bytes = 0
        self._by_channel: dict[Hashable, set[int]] = {}
        self._retired: list[str] = []
        self._next_id = slot_count
        self._in_use = 0
        self._oob_bytes = 0
        self._acquires = 0
        self._failed = 0
        self._created = 0
        self._reused = 0
        self._unlinked = 0
        self._overflows = 0
        self._small_blocks = 0  # out-of-line blocks no larger than a slot (overflows)

    # -- properties ---------------------------------------------------------------

    @property
    def slot_count(self) -> int:
        """Number of fixed slots in the ring segment."""
        return self._slot_count

    @property
    def slot_size(self) -> int:
        """Bytes per slot; larger messages go out of line."""
        return self._slot_size

    @property
    def max_bytes(self) -> int:
        """The most shared memory this ring holds at once."""
        return self._max_bytes

    @property
    def name(self) -> str | None:
        """Name of the ring segment (``None`` before :meth:`open` and after :meth:`close`)."""
        return None if self._ring is None else self._ring.name

    @property
    def max_message_size(self) -> int:
        """The largest *nbytes* :meth:`acquire` can ever satisfy: a slot, or what
        *max_bytes* leaves next to the ring."""
        return max(self._slot_size, self._max_bytes - self._ring_bytes)

    @property
    def free_slots(self) -> int:
        """Ring slots free now (out-of-line blocks not counted)."""
        if self._ring is None:
            return 0 if self._closed else self._slot_count
        return len(self._free_slots)

    @property
    def in_use(self) -> int:
        """Blocks acquired or leased now (ring slots and out-of-line blocks)."""
        return self._in_use

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def stats(self) -> ShmRingStats:
        """A snapshot of the counters (see :class:`ShmRingStats`)."""
        return ShmRingStats(
            acquires=self._acquires,
            failed_acquires=self._failed,
            blocks_created=self._created,
            blocks_reused=self._reused,
            blocks_unlinked=self._unlinked,
            slot_overflows=self._overflows,
            shm_bytes=self._shm_bytes(),
        )

    def _shm_bytes(self) -> int:
        return (self._ring_bytes if self._ring is not None else 0) + self._oob_bytes

    # -- lifecycle ----------------------------------------------------------------

    def open(self) -> None:
        """Create the ring segment now (else the first :meth:`acquire` does); idempotent.

        Raises :class:`ClosedResourceError` after :meth:`close` and
        :class:`BrokenResourceError` if shared memory is unavailable.
        """
        if self._closed:
            raise ClosedResourceError("the shared-memory ring is closed")
        if self._ring is not None:
            return
        # Pre-faulted (see _segment): the first write into a slot costs no page faults.
        ring = ShmSegment.create(self._ring_bytes, tag="ring", populate=True)
        self._ring = ring
        for index in range(self._slot_count):
            slot = _Slot(index, ring, index * self._slot_size, self._slot_size)
            self._blocks[index] = slot
            self._free_slots.append(slot)

    def close(self) -> None:
        """Close every segment, pooled and in-use ones too, and have each unlinked (by
        *unlink*); idempotent.

        The owner is going away: channels that still map a block keep their mapping
        (the kernel frees the memory when they unmap), but nobody can attach anew.
        Writable :attr:`Block.buffer` views still alive keep their mapping until they
        go (see :meth:`ShmSegment.close`). In a child forked from the owner, nothing is
        unlinked (the parent still uses the segments); the mappings are closed.
        """
        if self._closed:
            return
        self._closed = True
        segments = {id(slot.segment): slot.segment for slot in self._blocks.values()}
        if self._ring is not None:
            segments[id(self._ring)] = self._ring
        self._ring = None
        self._blocks.clear()
        self._free_slots.clear()
        self._pool.clear()
        self._pool_by_capacity.clear()
        self._pool_capacities.clear()
        self._pool_bytes = 0
        self._by_channel.clear()
        self._in_use = 0
        self._oob_bytes = 0
        self._small_blocks = 0
        for segment in segments.values():
            self._give_up(segment)

    def __enter__(self) -> ShmRing:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- publishing ---------------------------------------------------------------

    def acquire(self, nbytes: int) -> Block | None:
        """A writable block of exactly *nbytes*, or ``None`` if none is free right now.

        ``None`` means every usable block is leased (the caller waits for releases or
        drops the message); it never means "too large". A message of up to
        ``slot_size`` bytes takes a ring slot - the most recently freed one - or, when
        every slot is leased, an out-of-line block as a larger message does: a pooled
        one of capacity within ``[nbytes, 2 * nbytes]`` (the smallest such, of those the
        most recently freed) or a new one, after unlinking the oldest free pooled
        blocks if needed to stay within ``max_bytes``.

        Raises :class:`MessageTooLargeError` if *nbytes* exceeds
        :attr:`max_message_size` (it could never fit), ``ValueError`` for a negative
        *nbytes*, :class:`ClosedResourceError` after :meth:`close`, and
        :class:`BrokenResourceError` if a segment cannot be created.
        """
        if self._closed:
            raise ClosedResourceError("the shared-memory ring is closed")
        if nbytes < 0:
            raise ValueError(f"nbytes={nbytes} must not be negative")
        if nbytes > self.max_message_size:
            raise MessageTooLargeError(
                f"a message of {nbytes} bytes does not fit in this shared-memory ring"
                f" (at most {self.max_message_size} bytes: max_bytes={self._max_bytes}"
                f" minus the {self._ring_bytes}-byte ring)"
            )
        if self._ring is None:
            self.open()
        slot: _Slot | None
        if nbytes > self._slot_size:
            slot = self._out_of_line(nbytes)
        elif self._free_slots:
            slot = self._free_slots.pop()
        else:
            # Every slot leased (a burst runs ahead of its subscribers, or they keep
            # messages): an out-of-line block, as a larger message gets, rather than
            # nothing - which sent the message inline, copied through the socket.
            slot = self._out_of_line(nbytes, overflow=True)
            if slot is not None:
                self._overflows += 1
        if slot is None:
            self._failed += 1
            return None
        slot.generation += 1
        slot.state = _WRITING
        self._in_use += 1
        self._acquires += 1
        descriptor = Descriptor(slot.segment.name, slot.offset, nbytes, slot.id, slot.generation)
        buffer = slot.segment.buffer[slot.offset : slot.offset + nbytes]
        return Block(descriptor, buffer)

    def _out_of_line(self, nbytes: int, *, overflow: bool = False) -> _Slot | None:
        """A pooled or new out-of-line block for *nbytes*; None if the budget is held.
        *overflow*: for a message a slot would hold; a new block then only while fewer
        than ``slot_count`` such small blocks exist (each segment costs two descriptors
        and a mapping in every channel: a ring's worth more is the most worth having)."""
        capacities = self._pool_capacities
        index = bisect.bisect_left(capacities, nbytes)
        # The smallest pooled capacity that holds nbytes, reused only within [capacity /
        # 2, capacity]: a much smaller message in a big block would pin memory a big
        # message may need. Of those, the most recently freed, as for ring slots.
        if index < len(capacities) and capacities[index] // 2 <= nbytes:
            slot = self._pool_by_capacity[capacities[index]][-1]
            self._unpool(slot)
            self._reused += 1
            return slot
        if overflow and self._small_blocks >= self._slot_count:
            return None
        budget = self._max_bytes - self._ring_bytes
        # Never round past the budget: a message that fits must get its block.
        capacity = min(max(_round_to_pages(nbytes), mmap.PAGESIZE), budget)
        if capacity < max(nbytes, 1):
            return None  # an overflow larger than what max_bytes leaves next to the ring
        if self._oob_bytes + capacity > budget:
            in_use = self._oob_bytes - self._pool_bytes
            if in_use + capacity > budget:
                return None  # leased blocks hold the budget: unlinking would not help
            while self._oob_bytes + capacity > budget:
                oldest = next(iter(self._pool.values()))
                self._discard(oldest)
                self._unlinked += 1
        segment = ShmSegment.create(capacity, tag="block", populate=True)
        slot = _Slot(self._next_id, segment, 0, capacity)
        self._next_id += 1
        self._blocks[slot.id] = slot
        self._oob_bytes += capacity
        self._small_blocks += capacity <= self._slot_size
        self._created += 1
        return slot

    def _unpool(self, slot: _Slot) -> None:
        del self._pool[slot.id]
        capacity = slot.capacity
        stack = self._pool_by_capacity[capacity]
        if stack[-1] is slot:
            stack.pop()
        else:  # the oldest of its capacity, unlinked to make room
            stack.remove(slot)
        if not stack:
            del self._pool_by_capacity[capacity]
            self._pool_capacities.remove(capacity)
        self._pool_bytes -= capacity

    def _discard(self, slot: _Slot) -> None:
        self._unpool(slot)
        del self._blocks[slot.id]
        self._oob_bytes -= slot.capacity
        self._small_blocks -= slot.capacity <= self._slot_size
        self._retired.append(slot.segment.name)
        self._give_up(slot.segment)

    def _give_up(self, segment: ShmSegment) -> None:
        """Unmap *segment* and have its name removed (by *unlink*); in a child forked
        from the owner only unmap it (the parent still uses it)."""
        owned = segment.owner
        segment.close()  # (never raises: live views keep the mapping, see there)
        if owned:
            self._unlink(segment)

    def publish(self, block: Block, channels: Iterable[Hashable]) -> Descriptor:
        """Lease *block* to each channel in *channels*; return its descriptor.

        Send the descriptor to every one of those channels. A block published to no
        channel is free again at once (this is also how an acquired block is given
        back unused). Raises ``ValueError`` if *block* is not the current acquisition
        of a block of this ring (already published, or from another ring) and
        :class:`ClosedResourceError` after :meth:`close`.
        """
        if self._closed:
            raise ClosedResourceError("the shared-memory ring is closed")
        descriptor = block.descriptor
        slot = self._blocks.get(descriptor.block)
        if (
            slot is None
            or slot.state != _WRITING
            or slot.generation != descriptor.generation
            or slot.segment.name != descriptor.segment
        ):
            raise ValueError(f"{descriptor} is not an acquired, unpublished block of this ring")
        leases = set(channels)
        if not leases:
            self._free(slot)
            return descriptor
        slot.leases = leases
        slot.state = _LEASED
        for channel in leases:
            self._note_lease(channel, slot)
        return descriptor

    def _note_lease(self, channel: Hashable, slot: _Slot) -> None:
        held = self._by_channel.get(channel)
        if held is None:
            self._by_channel[channel] = {slot.id}
        else:
            held.add(slot.id)

    def _leased(self, block: int, generation: int) -> _Slot | None:
        """The slot of *block* if it is leased in that *generation*, else None."""
        slot = self._blocks.get(block)
        if slot is None or slot.state != _LEASED or slot.generation != generation:
            return None
        return slot

    def add_lease(self, descriptor: Descriptor, channel: Hashable) -> bool:
        """Lease the published block of *descriptor* to one more *channel*; true if done.

        For sending a message already published to some channels to another one. False
        (nothing changed) when the block has been freed or reused since - acquire a new
        one then - or when *channel* holds it already.
        """
        slot = self._leased(descriptor.block, descriptor.generation)
        if slot is None or slot.segment.name != descriptor.segment or channel in slot.leases:
            return False
        slot.leases.add(channel)
        self._note_lease(channel, slot)
        return True

    def release(self, channel: Hashable, descriptor: Descriptor) -> bool:
        """Drop *channel*'s lease on the block of *descriptor*; true if it held one.

        The block is free again once no channel holds it. A stale release - another
        generation, an unknown block or segment, a channel that does not hold it, a
        second release - changes nothing and returns false, so a peer's late or
        repeated message can never free a block someone else still holds. A release
        after :meth:`close` returns false too.
        """
        slot = self._blocks.get(descriptor.block)
        if slot is None or slot.segment.name != descriptor.segment:
            return False
        return self.release_block(channel, descriptor.block, descriptor.generation)

    def release_block(self, channel: Hashable, block: int, generation: int) -> bool:
        """:meth:`release` by block id and generation (what a channel sends back);
        the same guarantees, since a block id names one segment for the ring's life."""
        slot = self._leased(block, generation)
        if slot is None or channel not in slot.leases:
            return False
        slot.leases.discard(channel)
        held = self._by_channel[channel]
        held.discard(slot.id)
        if not held:
            del self._by_channel[channel]
        if not slot.leases:
            self._free(slot)
        return True

    def take_retired(self) -> list[str]:
        """Names of the out-of-line segments unlinked (to stay within ``max_bytes``)
        since the last call: tell channels, so that they drop their mappings and the
        memory really goes."""
        retired, self._retired = self._retired, []
        return retired

    def drop_channel(self, channel: Hashable) -> int:
        """Release every lease *channel* holds (its process died or disconnected);
        return how many. Blocks no other channel holds become free."""
        held = self._by_channel.pop(channel, None)
        if held is None:
            return 0
        for block_id in held:
            slot = self._blocks[block_id]
            slot.leases.discard(channel)
            if not slot.leases:
                self._free(slot)
        return len(held)

    def _free(self, slot: _Slot) -> None:
        slot.state = _FREE
        slot.leases = set()
        self._in_use -= 1
        if slot.id < self._slot_count:
            self._free_slots.append(slot)
        else:
            self._pool[slot.id] = slot  # at the end: the most recently freed
            stack = self._pool_by_capacity.get(slot.capacity)
            if stack is None:
                self._pool_by_capacity[slot.capacity] = [slot]
                bisect.insort(self._pool_capacities, slot.capacity)
            else:
                stack.append(slot)
            self._pool_bytes += slot.capacity

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return (
            f"<ShmRing {self._slot_count}x{self._slot_size} bytes, {self._in_use} in use,"
            f" {self._shm_bytes()}/{self._max_bytes} bytes{state}>"
        )


class _Released:
    """Where dying views drop their descriptors; shared by a reader and the weak
    references it watches its views with (the callback of each).

    Kept apart from :class:`ShmRingReader` so a watched view does not keep the reader
    alive. A weak reference with a callback costs less than ``weakref.finalize`` (which
    adds a registry and at-exit handling nobody needs here): about 0.7 µs per message.
    """

    __slots__ = ("callback", "pending", "watched")

    def __init__(self, callback: Callable[[Descriptor], object] | None) -> None:
        # deque.append / popleft and dict pop are atomic in CPython, so callbacks on any
        # thread and take_released() need no lock (and a callback must never block on
        # one: it may run inside code that holds it).
        self.pending: collections.deque[Descriptor] = collections.deque()
        self.callback = callback
        # id(weak reference) -> (the weak reference, kept alive here; its descriptor)
        self.watched: dict[int, tuple[weakref.ref[Any], Descriptor]] = {}

    def watch(self, array: np.ndarray[Any, Any], descriptor: Descriptor) -> None:
        """Release *descriptor* once *array* is gone."""
        ref = weakref.ref(array, self)
        self.watched[id(ref)] = (ref, descriptor)

    def __call__(self, ref: weakref.ref[Any]) -> None:
        entry = self.watched.pop(id(ref), None)
        if entry is None:  # pragma: no cover - every watched reference is registered
            return
        descriptor = entry[1]
        self.pending.append(descriptor)
        callback = self.callback
        if callback is not None:
            try:
                callback(descriptor)
            except Exception:
                # Raised from a weak-reference callback, it would only be printed to
                # stderr somewhere unrelated; the descriptor is queued anyway.
                log.exception("on_release callback failed for %s", descriptor)


class ShmRingReader:
    """The channel side: zero-copy read-only views of published blocks, and notice of
    when each is no longer referred to.

    :meth:`view` attaches the descriptor's segment (read-only; at most *max_segments*
    attachments are cached, least recently used evicted) and returns a memoryview of
    exactly the block. When the last object built on it is gone - the view itself,
    ``np.frombuffer`` arrays, slices, reshapes, further memoryviews - its descriptor is
    queued for :meth:`take_released` and *on_release* is called with it. *on_release*
    runs inside a weak-reference callback, possibly on another thread or inside
    unrelated code: it must be cheap and thread-safe (e.g.
    ``loop.call_soon_threadsafe``); its exceptions are logged.

    Each :meth:`view` call is one reference: a descriptor viewed twice is reported
    released twice. Not thread-safe except for the release path.
    """

    def __init__(
        self,
        *,
        max_segments: int = DEFAULT_MAX_SEGMENTS,
        on_release: Callable[[Descriptor], object] | None = None,
    ) -> None:
        self._max_segments = _positive_int("max_segments", max_segments)
        self._segments: collections.OrderedDict[str, ShmSegment] = collections.OrderedDict()
        self._released = _Released(on_release)
        self._closed = False

    @property
    def on_release(self) -> Callable[[Descriptor], object] | None:
        """Called with each descriptor as it is released (from a weak-reference
        callback)."""
        return self._released.callback

    @on_release.setter
    def on_release(self, callback: Callable[[Descriptor], object] | None) -> None:
        self._released.callback = callback

    @property
    def attached(self) -> list[str]:
        """Names of the segments attached now, least recently used first."""
        return list(self._segments)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def view(self, descriptor: Descriptor) -> memoryview:
        """A read-only memoryview of exactly the block *descriptor* names.

        The view (and everything built on it) stays valid however long it is kept, even
        after :meth:`forget`, eviction or :meth:`close`. Raises :class:`BrokenResourceError`
        if the segment has gone (its publisher closed it or died), ``ValueError`` if the
        descriptor lies outside the segment, :class:`ClosedResourceError` after
        :meth:`close`.
        """
        segment = self.attach(descriptor.segment)
        offset, length = descriptor.offset, descriptor.length
        if offset < 0 or length < 0 or offset + length > segment.size:
            raise ValueError(
                f"{descriptor} lies outside segment {descriptor.segment} ({segment.size} bytes)"
            )
        # The numpy array is the object whose death means "released": every memoryview
        # or array derived from the view below holds it through the buffer protocol, and
        # CPython frees it (calling the weak reference's callback) as soon as the last
        # one goes.
        array = np.frombuffer(segment.buffer, dtype=np.uint8, count=length, offset=offset)
        self._released.watch(array, descriptor)
        # ndarray.data is memoryview(array): a new view whose .obj is the array.
        return array.data

    def attach(self, name: str) -> ShmSegment:
        """The segment *name*, attached read-only and cached (least recently used
        evicted beyond *max_segments*).

        Raises :class:`BrokenResourceError` if it has gone or shared memory is not
        reachable from here, ``ValueError`` for a name that is not a segment name,
        :class:`ClosedResourceError` after :meth:`close`.
        """
        if self._closed:
            raise ClosedResourceError("the ring reader is closed")
        segment = self._segments.get(name)
        if segment is None:
            # Pre-faulted for reading (see _segment): a subscriber that reads a large
            # message in a segment new to it pays no page faults in its handler.
            segment = ShmSegment.attach(name, populate=True)
            self._segments[name] = segment
            if len(self._segments) > self._max_segments:
                # Closing defers the unmap while views of it live (segment layer).
                self._segments.popitem(last=False)[1].close()
        else:
            self._segments.move_to_end(name)
        return segment

    def take_released(self) -> list[Descriptor]:
        """Descriptors released since the last call, in the order they were released
        (each once per :meth:`view`)."""
        pending = self._released.pending
        taken: list[Descriptor] = []
        # popleft until empty rather than copy-and-clear: a callback on another thread
        # may append in between, and must not be lost.
        while pending:
            taken.append(pending.popleft())
        return taken

    def forget(self, segment_name: str) -> None:
        """The publisher retired *segment_name*: drop the cached attachment (its unmap
        is deferred while views of it live). Unknown names are ignored."""
        segment = self._segments.pop(segment_name, None)
        if segment is not None:
            segment.close()

    def close(self) -> None:
        """Detach every segment (unmaps deferred while views live); idempotent."""
        self._closed = True
        while self._segments:
            self._segments.popitem(last=False)[1].close()

    def __enter__(self) -> ShmRingReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<ShmRingReader {len(self._segments)} segments attached{state}>"
