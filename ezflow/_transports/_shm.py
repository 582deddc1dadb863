"""The shared-memory transport: same-host edges between processes.

Each publishing process listens on one Unix-domain stream socket in Linux's abstract
namespace (``@ezflow-<pid>-<16 hex>``: no file to clean up, gone when the process is).
A channel in another process connects to it exactly as it would over tcp (the frames
of :mod:`._stream`); what differs is where message bytes travel:

* an encoded message of at most ``ShmOptions.inline_limit`` bytes goes *inline*, in a
  ``DATA`` frame on the socket: copying a small message is cheaper than leasing a block;
* a larger one is written once into a block of the publisher's :class:`ShmRing` (a ring
  slot, or an out-of-line segment above the slot size), and every channel it goes to
  gets a ``SHM_DATA`` notification: sequence number, timestamp, drops, and where the
  block lies. The channel maps the segment read-only (mappings are cached), decodes the
  message *in place* - arrays are read-only views into shared memory - and delivers it.
  Notifications are batched like any frame, so a burst of messages costs one write and
  one wake-up, not one per message.

Leases and releases
    A block stays leased to a channel while anything in that process still refers to the
    message: the :class:`ShmRingReader` learns from a weak reference when the last view is
    gone, and the channel sends ``FREE`` (block, generation) records back, batched per
    event-loop iteration. A subscriber that keeps a message therefore sees it unchanged
    for as long as it keeps it. This is separate from flow control: the ``max_in_flight``
    window (``ACK``) counts messages not yet *taken* by every subscriber, and is what
    makes a lossless ``publish`` wait. When no block is free because subscribers keep
    old messages alive, a message travels inline instead - kept messages never block a
    publisher, and never make it drop anything.

Loans
    :meth:`ShmTransport.loan` hands out a writable array that sits in a block with
    ``SHM_LOAN_ROOM`` bytes free on each side of its data (64-byte aligned in the
    segment). A message holding that array - the array itself, or a tuple, list, dict
    or dataclass with it at any depth - is laid out *around* it at publish time: the
    encoded parts before the array's data are written into the room just before it, the
    parts after it just after, and the ``SHM_DATA`` notification names that span of the
    block. The array's bytes are never copied or moved. The codec places every buffer at
    a body offset that is a multiple of 16, so the body starts 16-byte aligned too and
    every array a channel decodes from it is an aligned view. When the other parts do
    not fit the room (large buffers beside the array), the message is copied into a
    block of its own as any message (``ShmStats.loans_copied``). The loan holds its own
    lease until the array (and every view of it) is gone, so the publisher's copy never
    changes either; once published - whatever it went to - the array is made read-only.

Crashes and cleanup
    A channel whose publisher dies sees its socket close without ``END``: it ends like a
    clean close (``on_lost``), its subscribers keep the messages they hold (the mappings
    outlive the segments' names), and the dead publisher's segments are swept from
    ``/dev/shm`` (see :class:`SegmentSweeper`). A channel that dies drops its socket;
    the publisher then drops all its leases at once, so it is never blocked for long.
    A publisher closes its ring (unlinking every segment, in a worker thread:
    :class:`SegmentUnlinker`) once every channel it fed has read up to ``END``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import mmap
import os
import re
import secrets
import socket
import sys
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, ClassVar

import numpy as np

from .._core._auth import Credentials
from .._core._channel import Channel
from .._core._codec import MAX_DEPTH, Codec, EncodedMessage, message_fields
from .._core._config import SHM_FREE_PER_FRAME as _FREE_PER_FRAME
from .._core._config import SHM_LOAN_ROOM, ShmOptions
from .._core._config import SHM_SWEEP_DELAYS as _SWEEP_DELAYS
from .._core._exceptions import BrokenResourceError, MessageTooLargeError, ProtocolError
from .._core._framing import (
    FREE,
    FREE_ENTRY,
    FREE_HEADER,
    RETIRE,
    SHM_DATA,
    SHM_HEADER,
    SHM_PREFIX,
    frame,
)
from .._core._outlet import Outlet
from .._core._protocol import PublisherInfo, field
from ._base import Loans, Transport, TransportSettings
from ._ezring_files import sweep_stale_rings
from ._segment import ShmSegment, shm_available, sweep_stale_segments
from ._shmring import Block, Descriptor, ShmRing, ShmRingReader
from ._stream import ChannelConnection, PublisherConnection, StreamLink, StreamTransport

__all__ = ["SegmentSweeper", "ShmStats", "ShmTransport", "sweep_shm_dir", "valid_socket_name"]

log = logging.getLogger("ezflow.shm")

_SOCKET_NAME = re.compile(r"ezflow-[0-9]{1,10}-[0-9a-f]{16}")
# Encoded segment names kept per publisher (emptied when full).
_NAME_CACHE_SIZE = 256
# Where a loaned array's data starts in its segment: a multiple of this. The codec needs
# 16 (its buffer alignment); a cache line costs nothing more and suits wide copies.
_LOAN_ALIGNMENT = 64
# Leaf types of a message, skipped when looking for loaned arrays in it.
_LEAF_TYPES = frozenset((str, int, float, bool, bytes, bytearray, memoryview, type(None)))
# Builds a Descriptor from a tuple of its fields without the named tuple's Python-level
# __new__ (a loan placed on a paced publisher's path, with caches cold).
_new_descriptor = tuple.__new__


def _write_parts(buffer: memoryview, position: int, parts: Iterable[bytes | memoryview]) -> None:
    """Write *parts* one after another into *buffer*, from *position* on."""
    for part in parts:
        end = position + len(part)
        buffer[position:end] = part
        position = end


def valid_socket_name(name: str) -> bool:
    """Whether *name* looks like a shm data socket this library creates."""
    return _SOCKET_NAME.fullmatch(name) is not None


@dataclasses.dataclass(slots=True)
class ShmStats:
    """Counters of one publisher's use of shared memory (see ``Publisher.shm_statistics()``).

    * ``zero_copy`` - message x channel hand-overs through a shared-memory block;
    * ``inline`` - hand-overs inline on the socket because the message was small;
    * ``no_block`` - hand-overs inline because no block was free (subscribers keep
      messages alive) or the message could never fit the ring's ``max_bytes``;
    * ``loans`` / ``loan_fallbacks`` - loans served from shared memory / as a private
      array because no block was free or shared memory is unavailable;
    * ``loans_published`` - loaned arrays published to shm channels without any copy
      (alone, or anywhere inside a tuple, list, dict or dataclass);
    * ``loans_copied`` - loaned arrays published to shm channels with a copy: the rest
      of the message did not fit the room around the array (``SHM_LOAN_ROOM``), or
      another, larger loaned array of the same message went without a copy, or the
      codec copied the array's data (strides set in place since the loan);
    * ``shm_bytes`` - bytes of ``/dev/shm`` the ring holds now; ``in_use`` - its blocks
      leased or being written.
    """

    zero_copy: int = 0
    inline: int = 0
    no_block: int = 0
    loans: int = 0
    loan_fallbacks: int = 0
    loans_published: int = 0
    loans_copied: int = 0
    shm_bytes: int = 0
    in_use: int = 0


class _LoopCall:
    """Schedules a callback on the loop's thread from anywhere - weak-reference callbacks
    included, which may run on another thread or in the middle of unrelated code."""

    __slots__ = ("_loop", "_thread")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.get_ident()

    def __call__(self, callback: Callable[..., object], *args: Any) -> None:
        try:
            if threading.get_ident() == self._thread:
                self._loop.call_soon(callback, *args)
            else:
                self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop is closed: nobody is left to tell


def sweep_shm_dir(*, report: bool = False) -> list[str]:
    """Remove every stale file of the shm directory - segments of dead processes and
    ezring rings of dead writers - and return their names. Never raises (an entry that
    cannot be read is skipped; a foreign one is logged, as a WARNING once with *report*).
    Blocking file I/O: call it from a worker thread."""
    return sweep_stale_segments(report=report) + sweep_stale_rings(report=report)


class SegmentSweeper:
    """Removes segments of dead processes from ``/dev/shm``: now, and again a few times
    shortly after :meth:`sweep_soon` (a crashed owner's lock goes a little after it).

    Every sweep (a directory listing, ``/proc`` reads, opens and unlinks) runs in a
    worker thread, never on the event loop. Owned by a graph server or a shm transport;
    :meth:`aclose` cancels what is pending.
    """

    def __init__(self, *, report: bool = False) -> None:
        """*report*: log foreign entries of the shm directory as WARNINGs, once each (the
        graph server's sweeper; see ``_shmfiles.refuse_entry``)."""
        self._report = report
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._closed = False

    async def sweep(self) -> list[str]:
        """One sweep, now (in a worker thread); the names removed. Never raises (but
        ``CancelledError``); cancelling the caller does not stop a sweep under way."""
        return await asyncio.to_thread(sweep_shm_dir, report=self._report)

    def sweep_soon(self) -> None:
        """Sweep at ``_SWEEP_DELAYS`` from now (restarting the delays if one is pending);
        after :meth:`aclose`, once at once."""
        if self._closed:
            sweep_shm_dir(report=self._report)
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.ensure_future(self._sweep_later())

    async def _sweep_later(self) -> None:
        while True:
            self._again = False
            for delay in _SWEEP_DELAYS:
                await asyncio.sleep(delay)
                await self.sweep()
            if not self._again:
                return

    async def aclose(self) -> None:
        """Cancel the pending sweeps and, if one was pending, sweep once more now."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.sweep()


class SegmentUnlinker:
    """Removes the names of segments this process owns and gave up, in a worker thread:
    an unlink frees the segment's pages, which is no work for the event loop.

    :meth:`unlink` takes a segment that its owner will not touch again (closed, or to be
    closed by nobody else), so the worker thread is the only one using it from then on -
    :class:`ShmSegment` asks for one thread at a time. The segment stays owned (its
    name, and the lock that keeps sweepers off it) until the worker has unlinked it;
    at a normal interpreter exit whatever is left is unlinked by ``ShmSegment``'s own
    ``atexit`` hook, and after a crash the sweeper removes it. :meth:`unlink` only
    queues, so a cancelled caller cannot stop an unlink half-way; :meth:`wait` waits
    until the queue is empty (a transport's ``aclose``).
    """

    def __init__(self) -> None:
        self._pending: collections.deque[ShmSegment] = collections.deque()
        self._job: asyncio.Future[None] | None = None

    def unlink(self, segment: ShmSegment) -> None:
        """Have *segment* unlinked (owner only): soon, in a worker thread; at once when
        no event loop runs here (nothing to keep free)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            segment.unlink()
            return
        self._pending.append(segment)
        if self._job is None:
            self._start(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            job = loop.run_in_executor(None, self._drain)
        except RuntimeError:  # the executor is shut down: the loop is ending
            self._drain()
            return
        self._job = job
        job.add_done_callback(self._drained)

    def _drain(self) -> None:
        # In the worker thread: deque.popleft is atomic, the loop only appends.
        pending = self._pending
        while pending:
            segment = pending.popleft()
            try:
                segment.unlink()
            except Exception:  # (logged; the others still go)
                log.exception("cannot remove shared-memory segment %s", segment.name)

    def _drained(self, job: asyncio.Future[None]) -> None:
        # On the loop: a segment queued after the worker found the queue empty (and
        # before this callback) starts another round.
        self._job = None
        if self._pending:
            self._start(asyncio.get_running_loop())

    async def wait(self) -> None:
        """Return once every segment queued so far is unlinked. Cancelling the caller
        does not stop the unlinks."""
        while (job := self._job) is not None:
            # (asyncio.wait yields even for a done job, so that its done-callback, which
            # may start the next round, runs first; it never cancels the job)
            await asyncio.wait({job})


# -- publisher side ------------------------------------------------------------------------


class _Loan:
    """A loaned array not yet published: its block, and where its data lies in it."""

    __slots__ = ("array", "bare", "buffer", "data_start", "descriptor", "key", "nbytes", "prefix")

    def __init__(
        self,
        array: weakref.ref[np.ndarray[Any, Any]],
        *,
        descriptor: Descriptor,
        key: Hashable,
        buffer: memoryview,
        data_start: int,
        prefix: bytes,
        nbytes: int,
    ) -> None:
        self.array = array
        self.descriptor = descriptor  # the whole block
        self.key = key  # the loan's own lease on it
        self.buffer = buffer  # the whole block, writable
        self.data_start = data_start  # of the array's data, in the block
        self.nbytes = nbytes  # of the array's data
        # The array alone as a message: its body, written at loan time, is the prefix
        # (just before the data) and the data.
        self.prefix = prefix
        self.bare = _new_descriptor(
            Descriptor,
            (
                descriptor.segment,
                descriptor.offset + data_start - len(prefix),
                len(prefix) + nbytes,
                descriptor.block,
                descriptor.generation,
            ),
        )


class _OutletShm:
    """One publisher's shared memory: its ring, its loans, and its shm links."""

    def __init__(
        self,
        outlet: Outlet,
        options: ShmOptions,
        codec: Codec,
        call: _LoopCall,
        unlink: Callable[[ShmSegment], None],
    ) -> None:
        self.outlet = outlet
        self.options = options
        self.codec = codec
        self.ring = ShmRing(
            options.slot_count, options.slot_size, max_bytes=options.max_bytes, unlink=unlink
        )
        self.stats = ShmStats()
        self.links: set[_ShmLink] = set()
        self.lost_inline = 0  # inline sends of links gone by
        self.loans: dict[int, _Loan] = {}
        # id(weak reference) -> (it, the loan's lease key, its block): the arrays whose
        # death gives a loaned block back
        self._holders: dict[int, tuple[weakref.ref[Any], Hashable, Descriptor]] = {}
        self.usable = True
        self.closing = False
        self._call = call
        # The block of the message being sent right now, shared by every link it goes to.
        self._seq = 0
        self._descriptor: Descriptor | None = None
        self._name = b""
        self._names: dict[str, bytes] = {}  # segment name -> its ASCII bytes

    # -- placing messages ---------------------------------------------------------

    def place(
        self, seq: int, message: Any, encoded: EncodedMessage, link: _ShmLink
    ) -> tuple[Descriptor, bytes] | None:
        """The block holding message *seq*, leased to *link*; ``None``: send it inline.

        The first link a message goes to writes it into a block (or finds it in a loan);
        the others of the same ``Outlet.send_now`` add their lease to that block.
        """
        descriptor = self._descriptor
        if descriptor is not None and seq == self._seq and self.ring.add_lease(descriptor, link):
            return descriptor, self._name
        self._seq = seq
        self._descriptor = None
        if self.loans:
            descriptor = self._place_in_loan(message, encoded)
            if descriptor is not None and self.ring.add_lease(descriptor, link):
                self.stats.loans_published += 1
                return self._current(descriptor)
        block = self._acquire(encoded.nbytes)
        if block is None:
            return None
        _write_parts(block.buffer, 0, encoded.parts)
        self.ring.publish(block, (link,))
        return self._current(block.descriptor)

    def _current(self, descriptor: Descriptor) -> tuple[Descriptor, bytes]:
        self._descriptor = descriptor
        name = self._names.get(descriptor.segment)
        if name is None:
            if len(self._names) >= _NAME_CACHE_SIZE:
                self._names.clear()
            name = self._names[descriptor.segment] = descriptor.segment.encode("ascii")
        self._name = name
        return descriptor, name

    def _acquire(self, nbytes: int) -> Block | None:
        if not self.usable:
            return None
        try:
            block = self.ring.acquire(nbytes)
        except MessageTooLargeError:
            return None  # larger than the ring could ever hold: inline
        except BrokenResourceError as exc:
            self.usable = False
            log.warning(
                "shared memory failed for publisher %s on topic %r (%s); its messages now "
                "travel inline on the local socket",
                self.outlet.publisher_id,
                self.outlet.topic,
                exc,
            )
            return None
        retired = self.ring.take_retired()
        if retired:
            frames = [frame(bytes([RETIRE]) + name.encode("ascii")) for name in retired]
            for link in self.links:
                for data in frames:
                    link.queue_frame(data)
        return block

    # -- loans --------------------------------------------------------------------

    def loan(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any] | None:
        """A writable array of *shape* and *dtype* in a block of this ring, with room
        around its data for the rest of a message; ``None`` when no block can be had.
        Raises like :meth:`Codec._array_prefix`."""
        prefix, total = self.codec._array_prefix(shape, dtype)
        if self.closing:
            return None
        nbytes = total - len(prefix)
        block = self._acquire(self._loan_size(len(prefix), nbytes))
        if block is None:
            self.stats.loan_fallbacks += 1
            return None
        descriptor = block.descriptor
        buffer = block.buffer
        data_start = self._loan_data_start(descriptor, len(prefix), nbytes)
        buffer[data_start - len(prefix) : data_start] = prefix
        key = ("loan", descriptor.block, descriptor.generation)
        self.ring.publish(block, (key,))
        # The uint8 array over the whole block is what dies last: the loaned array and
        # every view of it hold it through the buffer protocol (see ShmRingReader.view).
        holder = np.frombuffer(buffer, dtype=np.uint8)
        ref = weakref.ref(holder, self._holder_died)
        self._holders[id(ref)] = (ref, key, descriptor)
        array = np.frombuffer(
            holder.data, dtype=dtype, count=math.prod(shape), offset=data_start
        ).reshape(shape)
        del holder
        loans = self.loans
        array_id = id(array)

        def forget(ref: weakref.ref[np.ndarray[Any, Any]]) -> None:
            # Runs while the array is being freed, before its id can be reused.
            entry = loans.get(array_id)
            if entry is not None and entry.array is ref:
                del loans[array_id]

        loans[array_id] = _Loan(
            weakref.ref(array, forget),
            descriptor=descriptor,
            key=key,
            buffer=buffer,
            data_start=data_start,
            prefix=prefix,
            nbytes=nbytes,
        )
        self.stats.loans += 1
        return array

    def _loan_size(self, prefix: int, nbytes: int) -> int:
        """Bytes to acquire for a loan of *nbytes* whose bare-array prefix is *prefix*
        bytes: ``SHM_LOAN_ROOM`` on each side of the data, unless that would take the
        loan out of a ring slot its bare body fits (then the whole slot), or out of the
        ring's reach (then just the bare body); plus slack for the alignment."""
        slack = 2 * _LOAN_ALIGNMENT
        bare = prefix + nbytes + slack
        size = max(prefix, SHM_LOAN_ROOM) + nbytes + SHM_LOAN_ROOM + slack
        slot = self.ring.slot_size
        if bare <= slot < size:
            size = slot
        if size > self.ring.max_message_size:
            size = bare
        return size

    @staticmethod
    def _loan_data_start(descriptor: Descriptor, prefix: int, nbytes: int) -> int:
        """Where a loan's data starts in its block (of ``descriptor.length`` bytes, as
        :meth:`_loan_size` chose): at least *prefix* bytes in, ``SHM_LOAN_ROOM`` if the
        block leaves that much on both sides (else half of what it leaves), at an offset
        in the segment that is a multiple of ``_LOAN_ALIGNMENT``."""
        offset, size = descriptor.offset, descriptor.length
        align = _LOAN_ALIGNMENT
        lowest = -(-(offset + prefix) // align) * align - offset
        highest = (offset + size - nbytes) // align * align - offset
        wanted = max(prefix, min(SHM_LOAN_ROOM, (size - nbytes) // 2))
        start = min(max(-(-(offset + wanted) // align) * align - offset, lowest), highest)
        # _loan_size's slack guarantees lowest <= highest.
        assert prefix <= start and start + nbytes <= size
        return start

    def _place_in_loan(self, message: Any, encoded: EncodedMessage) -> Descriptor | None:
        """Spend every loaned array whose data *encoded* (the encoding of *message*)
        refers to; when the rest of the message fits around the largest one's data,
        write it there and return the descriptor of the body in that block (to lease
        and send). ``None``: copy the message.

        A loaned array's part is the codec's memoryview of that very array (its
        ``.obj``), covering all its data; a view of a loaned array is another object
        and is copied like any buffer. Every other part is written into the room around
        the host's data, so a second reference to the same array in the message is a
        (small) copy too, and a shape or dtype set in place since the loan is simply
        what the meta says: the array's bytes are the same bytes either way.
        """
        parts = encoded.parts
        if type(message) is np.ndarray:
            # The array alone, laid out as loaned: its body is in the block already.
            entry = self._take_loan(message)
            if entry is None:
                return None
            data = parts[-1]
            exporter: object = data.obj if type(data) is memoryview else None
            if exporter is not message or len(data) != entry.nbytes:
                # Its data was copied by the codec (strides set in place since the loan).
                self.stats.loans_copied += 1
                return None
            if len(parts) == 2 and parts[0] == entry.prefix:
                return entry.bare
            return self._lay_out(entry, parts, len(parts) - 1, encoded.nbytes, 1)
        loans = self.loans
        host: _Loan | None = None
        host_index = 0
        taken = 0
        for index, part in enumerate(parts):
            if type(part) is not memoryview:
                continue
            owner: object = part.obj
            entry = loans.get(id(owner))
            if entry is None:
                continue
            array = entry.array()
            if array is None or array is not owner:
                continue
            del loans[id(owner)]
            array.setflags(write=False)
            taken += 1
            if len(part) == entry.nbytes and (host is None or entry.nbytes > host.nbytes):
                host, host_index = entry, index
        if host is None:
            self.stats.loans_copied += taken
            return None
        return self._lay_out(host, parts, host_index, encoded.nbytes, taken)

    def _lay_out(
        self, host: _Loan, parts: list[bytes | memoryview], index: int, nbytes: int, taken: int
    ) -> Descriptor | None:
        """Write the *nbytes*-byte body whose part *index* is *host*'s data around it,
        and return its descriptor; ``None`` if the other parts do not fit the room.
        *taken* loans were spent for this message: all but the host count as copied."""
        data_start = host.data_start
        before = 0
        for part in parts[:index]:
            before += len(part)
        buffer = host.buffer
        if before > data_start or data_start + nbytes - before > len(buffer):
            self.stats.loans_copied += taken
            return None
        if taken > 1:
            self.stats.loans_copied += taken - 1
        _write_parts(buffer, data_start - before, parts[:index])
        _write_parts(buffer, data_start + host.nbytes, parts[index + 1 :])
        block = host.descriptor
        return _new_descriptor(
            Descriptor,
            (
                block.segment,
                block.offset + data_start - before,
                nbytes,
                block.block,
                block.generation,
            ),
        )

    def spend(self, message: Any) -> None:
        """*message* was published: every loaned array in it - itself, or at any depth
        of its tuples, lists, dicts and dataclasses - is spent (read-only, forgotten).

        Costs one visit per container element while loans are outstanding (the caller
        skips the call when none is), and stops as soon as none is left.
        """
        if type(message) is np.ndarray:
            self._take_loan(message)
        else:
            self._spend_in(message, 0)

    def _spend_in(self, obj: Any, depth: int) -> None:
        # Mirrors what the codec encodes (it refused deeper or cyclic messages).
        if depth > MAX_DEPTH:
            return
        loans = self.loans
        depth += 1
        tp = type(obj)
        items: Iterable[Any]
        if tp is tuple or tp is list:
            items = obj
        elif tp is dict:
            items = itertools.chain.from_iterable(obj.items())
        elif isinstance(obj, (tuple, list)):
            items = obj
        elif isinstance(obj, dict):
            items = itertools.chain.from_iterable(dict.items(obj))
        else:
            # (a dataclass in a published message is a registered one: the codec
            # refused the message otherwise)
            names = message_fields(tp)
            if names is None:
                return
            items = [getattr(obj, name, None) for name in names]
        for item in items:
            kind = type(item)
            if kind is np.ndarray:
                if id(item) in loans:
                    self._take_loan(item)
                    if not loans:
                        return
            elif kind not in _LEAF_TYPES:
                self._spend_in(item, depth)
                if not loans:
                    return

    def _take_loan(self, message: np.ndarray[Any, Any]) -> _Loan | None:
        """The loan of *message* if it is a loaned array, spent: forgotten, and the
        array made read-only."""
        entry = self.loans.get(id(message))
        if entry is None or entry.array() is not message:
            return None
        del self.loans[id(message)]
        message.setflags(write=False)
        return entry

    def _holder_died(self, ref: weakref.ref[Any]) -> None:
        # A weak-reference callback: any thread, any moment. Only schedule the release.
        entry = self._holders.pop(id(ref), None)
        if entry is not None:
            self._call(self._loan_gone, entry[1], entry[2])

    def _loan_gone(self, key: Hashable, descriptor: Descriptor) -> None:
        self.ring.release(key, descriptor)

    # -- channels -----------------------------------------------------------------

    def free(self, link: _ShmLink, body: bytes | memoryview) -> None:
        if len(body) < FREE_HEADER.size:
            raise ProtocolError(f"FREE frame of {len(body)} bytes")
        _, count = FREE_HEADER.unpack_from(body)
        if len(body) != FREE_HEADER.size + count * FREE_ENTRY.size:
            raise ProtocolError(f"FREE frame of {len(body)} bytes for {count} records")
        release = self.ring.release_block
        for block, generation in FREE_ENTRY.iter_unpack(memoryview(body)[FREE_HEADER.size :]):
            release(link, block, generation)

    def link_lost(self, link: _ShmLink) -> None:
        if link in self.links:
            self.links.discard(link)
            self.lost_inline += link.inline_sends
        self.ring.drop_channel(link)
        self._maybe_close()

    def _maybe_close(self) -> None:
        # Close (unlink everything) only once no channel can still be reading a
        # notification for one of our blocks; loans outstanding keep their mappings.
        if self.closing and not self.links:
            self.ring.close()

    def close(self) -> None:
        self.closing = True
        self._maybe_close()

    def snapshot(self) -> ShmStats:
        stats = self.stats
        # Counted by each link (no_block ones included); lost links left theirs behind.
        stats.inline = self.lost_inline + sum(link.inline_sends for link in self.links)
        stats.inline -= stats.no_block
        ring = self.ring
        stats.shm_bytes = 0 if ring.closed else ring.stats.shm_bytes
        stats.in_use = ring.in_use
        return dataclasses.replace(stats)


class _ShmLink(StreamLink):
    transport = "shm"

    def __init__(
        self, connection: PublisherConnection, *, lossless: bool, max_size: int, shm: _OutletShm
    ) -> None:
        super().__init__(connection, lossless=lossless, max_size=max_size)
        self.shm = shm
        self.out_of_line_above = shm.options.inline_limit
        self.handoff = shm.options.handoff

    def send_out_of_line(
        self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage
    ) -> bool:
        placed = self.shm.place(seq, message, encoded, self)
        if placed is None:
            self.shm.stats.no_block += 1
            return False
        d, name = placed
        self.shm.stats.zero_copy += 1
        self.queue_frame(
            SHM_PREFIX.pack(
                SHM_HEADER.size + len(name),
                SHM_DATA,
                0,
                seq,
                time_ns,
                self.drops,
                d.block,
                d.generation,
                d.offset,
                d.length,
            )
            + name
        )
        return True


# -- subscriber side -----------------------------------------------------------------------


class _ShmChannelConnection(ChannelConnection):
    def __init__(
        self,
        channel: Channel,
        publisher: PublisherInfo,
        max_size: int,
        on_lost: Callable[[], None],
        transport: ShmTransport,
    ) -> None:
        super().__init__(channel, publisher, max_size, on_lost)
        self._shm = transport
        self._call = transport.call
        self.reader = ShmRingReader(on_release=self._block_released)
        self._free_scheduled = False
        self._closed_here = False

    def welcomed(self, reply: dict[str, Any]) -> None:
        # Mapping the publisher process's probe segment now proves that /dev/shm is
        # shared with it (a container may have its own); if not, the caller falls back
        # to tcp.
        probe = field(reply, "segment", str)
        try:
            self.reader.attach(probe)
        except (BrokenResourceError, ValueError) as exc:
            raise BrokenResourceError(
                f"cannot map the shared memory of publisher {self.publisher.publisher_id}: {exc}"
            ) from exc

    def publisher_frame(self, kind: int, body: bytes | memoryview) -> None:
        if kind == SHM_DATA:
            if len(body) <= SHM_HEADER.size:
                raise ProtocolError(f"SHM_DATA frame of {len(body)} bytes")
            _, _, seq, sent_ns, drops, block, generation, offset, length = SHM_HEADER.unpack_from(
                body
            )
            try:
                name = bytes(body[SHM_HEADER.size :]).decode("ascii")
                view = self.reader.view(Descriptor(name, offset, length, block, generation))
            except (UnicodeDecodeError, ValueError, BrokenResourceError) as exc:
                raise ProtocolError(f"unusable shared-memory notification: {exc}") from exc
            self.channel.deliver_body(seq, view, drops, sent_ns)
        elif kind == RETIRE:
            try:
                self.reader.forget(bytes(body[1:]).decode("ascii"))
            except UnicodeDecodeError as exc:
                raise ProtocolError("RETIRE frame with a name that is not ASCII") from exc
        else:
            super().publisher_frame(kind, body)

    def _block_released(self, descriptor: Descriptor) -> None:
        # From a weak-reference callback (any thread, any moment): only schedule the send.
        if not self._free_scheduled:
            self._free_scheduled = True
            self._call(self._send_free)

    def _send_free(self) -> None:
        # Reset before taking: a release racing in from another thread either is taken
        # now or schedules another call.
        self._free_scheduled = False
        released = self.reader.take_released()
        transport = self.transport
        if not released or transport is None or transport.is_closing():
            return
        pack = FREE_ENTRY.pack
        frames = []
        for start in range(0, len(released), _FREE_PER_FRAME):
            chunk = released[start : start + _FREE_PER_FRAME]
            frames.append(
                frame(
                    FREE_HEADER.pack(FREE, len(chunk))
                    + b"".join([pack(d.block, d.generation) for d in chunk])
                )
            )
        transport.writelines(frames)

    def close(self) -> None:
        self._closed_here = True
        super().close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        # Views handed out stay valid (they keep their mappings); only the cache goes.
        self.reader.close()
        if not (self.ended or self._closed_here):
            # The publisher went away without END: it may have crashed and left its
            # segments behind.
            self._shm.sweeper.sweep_soon()


# -- the transport -------------------------------------------------------------------------


class _ShmLoans:
    """One publisher's handle on its shared memory (:meth:`ShmTransport.loans`)."""

    __slots__ = ("_outlet", "_transport")

    def __init__(self, transport: ShmTransport, outlet: Outlet) -> None:
        self._transport = transport
        self._outlet = outlet

    def loan(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any] | None:
        return self._transport.loan(self._outlet, shape, dtype)

    def spend(self, message: Any) -> None:
        self._transport.spend(self._outlet, message)

    def stats(self) -> ShmStats | None:
        return self._transport.stats(self._outlet)


class ShmTransport(StreamTransport[str]):
    """Shared-memory data server for this process's publishers, and connector for its
    channels. Linux only; :meth:`available` says whether it can work here."""

    name: ClassVar[str] = "shm"
    unreachable: ClassVar[str] = (
        "shared memory cannot be used between these processes"
        " (another host, no /dev/shm, or it failed before)"
    )
    fallback: ClassVar[str | None] = "tcp"
    label: ClassVar[str] = "shared memory"

    def __init__(
        self, *, max_message_size: int, codec: Codec, credentials: Credentials | None = None
    ) -> None:
        super().__init__(max_message_size=max_message_size, credentials=credentials)
        self._codec = codec
        self._shm: dict[str, _OutletShm] = {}
        self._call: _LoopCall | None = None
        self._probe: ShmSegment | None = None
        self._probe_error: str | None = None
        self.sweeper = SegmentSweeper()
        #: removes the names of the segments our publishers give up, off the loop
        self.unlinker = SegmentUnlinker()

    @classmethod
    def available(cls) -> bool:
        """Whether shared memory and abstract Unix sockets work in this process (the
        first call probes /dev/shm: it creates and unlinks a file)."""
        return sys.platform.startswith("linux") and shm_available()

    @classmethod
    def from_settings(cls, settings: TransportSettings) -> Transport:
        return cls(
            max_message_size=settings.max_message_size,
            codec=settings.codec,
            credentials=settings.credentials,
        )

    def reaches(self, publisher: PublisherInfo, host_id: str) -> bool:
        """A publisher on this host whose process serves shared memory."""
        return publisher.shm_address is not None and publisher.host_id == host_id

    async def advertise(self, *, optional: bool = True) -> dict[str, Any]:
        """``{"shm": <socket name>}``: the data socket's name (optional)."""
        return {"shm": await self.start()} if optional else {}

    @property
    def call(self) -> _LoopCall:
        if self._call is None:
            self._call = _LoopCall(asyncio.get_running_loop())
        return self._call

    async def listen(
        self, factory: Callable[[], PublisherConnection]
    ) -> tuple[asyncio.AbstractServer, str]:
        # Segments of processes that died before us go first.
        await self.sweeper.sweep()
        name = f"ezflow-{os.getpid()}-{secrets.token_hex(8)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind("\0" + name)
            sock.listen(256)
            sock.setblocking(False)
            server = await asyncio.get_running_loop().create_unix_server(factory, sock=sock)
        except BaseException:
            sock.close()
            raise
        return server, name

    async def connect(
        self, factory: Callable[[], ChannelConnection], publisher: PublisherInfo
    ) -> ChannelConnection:
        name = publisher.shm_address
        if name is None or not valid_socket_name(name):
            raise OSError(f"publisher advertises no usable shm socket ({name!r})")
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, "\0" + name)
            _, connection = await loop.create_unix_connection(factory, sock=sock)
        except BaseException:
            sock.close()
            raise
        return connection

    def where(self, publisher: PublisherInfo) -> str:
        return f"unix socket @{publisher.shm_address}"

    def new_channel_connection(
        self, channel: Channel, publisher: PublisherInfo, on_lost: Callable[[], None]
    ) -> ChannelConnection:
        return _ShmChannelConnection(channel, publisher, self.max_message_size, on_lost, self)

    # -- publishers ---------------------------------------------------------------

    def add_outlet(self, outlet: Outlet, options: ShmOptions | None = None) -> None:
        super().add_outlet(outlet)
        self._shm[outlet.publisher_id] = _OutletShm(
            outlet, options or ShmOptions(), self._codec, self.call, self.unlinker.unlink
        )

    def remove_outlet(self, outlet: Outlet) -> None:
        super().remove_outlet(outlet)
        shm = self._shm.pop(outlet.publisher_id, None)
        if shm is not None:
            shm.close()

    def make_link(
        self, connection: PublisherConnection, outlet: Outlet, hello: dict[str, Any]
    ) -> tuple[StreamLink, dict[str, Any]]:
        shm = self._shm[outlet.publisher_id]
        probe = self._probe_segment()
        if not shm.usable:
            raise BrokenResourceError("shared memory failed for this publisher earlier")
        link = _ShmLink(
            connection,
            lossless=bool(hello.get("lossless")),
            max_size=field(hello, "max_message_size", int),
            shm=shm,
        )
        shm.links.add(link)
        return link, {"segment": probe.name}

    def _probe_segment(self) -> ShmSegment:
        """One page of this process that every channel maps at its handshake, to prove
        it shares /dev/shm with us; created with the first shm channel. (Rings are
        created at their first large message, so a publisher of small messages costs
        nothing more.) Raises :class:`BrokenResourceError` when shared memory cannot be
        created here, logged once."""
        if self._probe is None:
            if self._probe_error is not None:
                raise BrokenResourceError(self._probe_error)
            try:
                self._probe = ShmSegment.create(mmap.PAGESIZE, tag="probe")
            except BrokenResourceError as exc:
                self._probe_error = f"the publisher's process cannot create shared memory: {exc}"
                log.warning(
                    "cannot create shared memory (%s); channels to this process's "
                    "publishers use tcp",
                    exc,
                )
                raise BrokenResourceError(self._probe_error) from exc
        return self._probe

    def channel_frame(
        self, connection: PublisherConnection, link: StreamLink, kind: int, body: bytes | memoryview
    ) -> None:
        if kind != FREE or not isinstance(link, _ShmLink):
            super().channel_frame(connection, link, kind, body)
            return
        link.shm.free(link, body)

    def link_lost(self, connection: PublisherConnection, outlet: Outlet, link: StreamLink) -> None:
        if isinstance(link, _ShmLink):
            link.shm.link_lost(link)

    def loan(
        self, outlet: Outlet, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> np.ndarray[Any, Any] | None:
        """A writable array of *shape* and *dtype* in *outlet*'s shared memory, laid out
        so that publishing it - alone or inside a message - copies nothing (see the
        module docstring, Loans); ``None`` when no block can be had (use a private array
        then). Raises like :meth:`Codec._array_prefix`."""
        shm = self._shm.get(outlet.publisher_id)
        if shm is None:
            return None
        return shm.loan(shape, dtype)

    def spend(self, outlet: Outlet, message: Any) -> None:
        """*message* was published by *outlet*: every loaned array in it, at any depth,
        is read-only and spent now. Costs nothing while *outlet* has no loan
        outstanding."""
        shm = self._shm.get(outlet.publisher_id)
        if shm is not None and shm.loans:
            shm.spend(message)

    def stats(self, outlet: Outlet) -> ShmStats | None:
        """A snapshot of *outlet*'s counters; ``None`` when it is not (or no longer) here."""
        shm = self._shm.get(outlet.publisher_id)
        return None if shm is None else shm.snapshot()

    def loans(self, outlet: Outlet) -> Loans[ShmStats]:
        """*outlet*'s loans (``Publisher.loan``) and counters (``Publisher.shm_stats``)."""
        return _ShmLoans(self, outlet)

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            for shm in list(self._shm.values()):
                shm.links.clear()
                shm.close()
            self._shm.clear()
            probe, self._probe = self._probe, None
            if probe is not None:
                owned = probe.owner  # (not in a forked child)
                probe.close()
                if owned:
                    self.unlinker.unlink(probe)
            try:
                await self.unlinker.wait()  # every segment we gave up is gone from here on
            finally:
                await self.sweeper.aclose()
