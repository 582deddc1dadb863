"""One publisher's shared memory on the shm transport (:mod:`._shm` tells how it is
used): :class:`_OutletShm` holds its block ring, its loans and its shm links, and counts
in :class:`ShmStats`."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core._codec import MAX_DEPTH, Codec, EncodedMessage, message_fields
from .._core._compiled import copy_into
from .._core._config import (
    SHM_COPY_NOGIL_BYTES,
    SHM_COPY_NT_BYTES,
    SHM_COPY_SPLIT_BYTES,
    SHM_COPY_THREADS,
    SHM_LOAN_ROOM,
    ShmOptions,
)
from .._core._exceptions import BrokenResourceError, MessageTooLargeError, ProtocolError
from .._core._framing import FREE_ENTRY, FREE_HEADER, RETIRE, frame
from .._core._outlet import Outlet
from ._segment import ShmSegment
from ._shmring import Block, Descriptor, ShmRing

if TYPE_CHECKING:
    from ._shm import _LoopCall, _ShmLink

__all__ = ["ShmStats"]

log = logging.getLogger("ezflow.shm")

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


def _copy_threads() -> int:
    """Threads a large part's copy may use: ``SHM_COPY_THREADS``, at most the CPUs this
    process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not Linux)
        cpus = os.cpu_count() or 1
    return max(1, min(SHM_COPY_THREADS, cpus))


_COPY_THREADS = _copy_threads()


def _write_parts(buffer: memoryview, position: int, parts: Iterable[bytes | memoryview]) -> None:
    """Write *parts* one after another into *buffer*, from *position* on.

    A part of ``SHM_COPY_NOGIL_BYTES`` or more is copied by ``copy_into`` (compiled,
    or ``numpy.copyto``), which releases the GIL for the copy, with streaming stores
    from ``SHM_COPY_NT_BYTES`` on and in pieces on several threads from
    ``SHM_COPY_SPLIT_BYTES`` on where the compiled copy makes them; smaller ones by
    slice assignment, which costs less to set up (0.5 µs).
    """
    for part in parts:
        size = len(part)
        end = position + size
        if size >= SHM_COPY_NOGIL_BYTES:
            copy_into(
                buffer,
                position,
                part,
                size >= SHM_COPY_NT_BYTES,
                _COPY_THREADS if size >= SHM_COPY_SPLIT_BYTES else 1,
            )
        else:
            buffer[position:end] = part
        position = end


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
