"""The ezring writer in Python (docs/ezring.md; ``c/ezflow_ring.h`` is the C one): for
tests and for Python producers that want drop-when-full."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

from .._core._config import DEFAULT_EZRING_MAX_READERS, DEFAULT_EZRING_SLOT_COUNT
from .._core._exceptions import BrokenResourceError, ClosedResourceError, ConfigurationError
from ._ezring_files import (
    _HEADER,
    _SLOT,
    _TOPIC_OFFSET,
    ADDR_SIZE,
    FLAG_CLOSED,
    HEADER_SIZE,
    MAGIC,
    MAJOR,
    MAX_NDIM,
    META_SIZE,
    MINOR,
    MODE_LOSSLESS,
    OFF_DROPPED,
    OFF_FLAGS,
    OFF_MAGIC,
    OFF_RECLAIMED,
    OFF_SCAN_COUNT,
    OFF_WRITE_SEQ,
    R_ADDR,
    R_CURSOR,
    R_MODE,
    R_STATE,
    READER_ENTRY_SIZE,
    S_META,
    S_SEQ,
    S_SHAPE,
    SLOT_HEADER_SIZE,
    STATE_ACTIVE,
    TOPIC_SIZE,
    TYPESTR_SIZE,
    RingHeader,
    RingMapping,
    RingStats,
    locked_elsewhere,
    remove_ring_if_stale,
    ring_path,
)
from ._shmfiles import describe_entry, process_start

if TYPE_CHECKING:  # numpy.typing costs ~15 ms to import; annotations only
    import numpy.typing as npt

__all__ = ["RingWriter"]


class RingWriter:
    """The writer side of the format in Python: for tests and for Python producers that
    want drop-when-full. Never blocks; not thread-safe; one writer per ring.

    ``with RingWriter.create("cam0", slot_size=n) as w: w.publish(array)``
    """

    def __init__(self, name: str, path: str, mapping: RingMapping, header: RingHeader) -> None:
        """Private: use :meth:`create`."""
        self._name = name
        self._path = path
        self._m = mapping
        self._h = header
        self._published = 0
        self._dropped = 0
        self._reclaimed = 0
        self._loaned = 0
        self._scans = 0  # scan_count / 2: the reader-table scans done
        self._closed = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)
        self._payload = memoryview(mapping.rw)

    @classmethod
    def create(
        cls,
        name: str,
        *,
        slot_size: int,
        slot_count: int = DEFAULT_EZRING_SLOT_COUNT,
        max_readers: int = DEFAULT_EZRING_MAX_READERS,
        topic: str = "",
    ) -> RingWriter:
        """Create ring *name* (``/dev/shm/ezflow-ring-<name>``, mode 0600).

        A leftover ring of the same name whose writer is dead is removed first. Raises
        :class:`ConfigurationError` for bad arguments and :class:`BrokenResourceError`
        if a live writer has the name or shared memory is unavailable.
        """
        path = ring_path(name)
        for label, value, low in (
            ("slot_size", slot_size, 1),
            ("slot_count", slot_count, 2),
            ("max_readers", max_readers, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigurationError(f"ezring {label}={value!r} must be an int >= {low}")
        encoded_topic = topic.encode()
        if len(encoded_topic) >= TOPIC_SIZE:
            raise ConfigurationError(f"ezring topic={topic!r} must be under {TOPIC_SIZE} bytes")
        stride = (SLOT_HEADER_SIZE + slot_size + 63) & ~63
        reader_table = HEADER_SIZE
        slot_table = (reader_table + max_readers * READER_ENTRY_SIZE + 4095) & ~4095
        size = slot_table + slot_count * stride
        remove_ring_if_stale(path)
        try:
            mapping = RingMapping.create(path, size)
        except FileExistsError as error:
            what = describe_entry(path)
            if what == "a regular file":
                raise BrokenResourceError(
                    f"ezring {name} exists and its writer is alive (or the file is another"
                    f" user's): {path}"
                ) from error
            raise BrokenResourceError(
                f"cannot create ezring {name}: {path} is {what} (not a ring; remove it if it"
                " is yours, or choose another name)"
            ) from error
        pid = os.getpid()
        found = process_start("self")
        start = found[1] if found else 0
        _HEADER.pack_into(
            mapping.rw,
            0,
            0,  # the magic goes last
            MAJOR,
            MINOR,
            HEADER_SIZE,
            0,
            slot_count,
            max_readers,
            slot_size,
            stride,
            reader_table,
            slot_table,
            size,
            pid,
            0,
            start,
            time.time_ns(),
        )
        mapping.rw[_TOPIC_OFFSET : _TOPIC_OFFSET + len(encoded_topic)] = encoded_topic
        mapping.store(OFF_MAGIC, MAGIC)
        header = RingHeader.parse(mapping.rw, mapping.size)
        return cls(name, path, mapping, header)

    @property
    def path(self) -> str:
        """The ring's file under /dev/shm."""
        return self._path

    @property
    def header(self) -> RingHeader:
        """The ring's self-description."""
        return self._h

    def stats(self) -> RingStats:
        """A snapshot: frames published, loans dropped because every slot was held,
        reader entries now active, dead readers reclaimed."""
        m, h = self._m, self._h
        live = sum(
            m.load(h.reader_table + i * READER_ENTRY_SIZE) & 0xFFFFFFFF == STATE_ACTIVE
            for i in range(h.max_readers)
        )
        return RingStats(self._published, self._dropped, live, self._reclaimed)

    def _reclaim_if_dead(self, index: int, word: int) -> bool:
        m = self._m
        base = self._h.reader_table + index * READER_ENTRY_SIZE
        if locked_elsewhere(m.fd, base):
            return False
        # Not a compare-and-swap (Python has none): a reader that re-registered this
        # entry between the check and the store loses it. The C writer uses a CAS.
        if m.load(base + R_STATE) != word:
            return False
        m.store(base + R_STATE, word & ~0xFFFFFFFF)
        self._reclaimed += 1
        m.store(OFF_RECLAIMED, self._reclaimed)
        return True

    def loan(self, nbytes: int) -> memoryview | None:
        """A writable view of *nbytes* in the next free slot, or ``None`` when every slot
        is held by a live lossless reader (the frame is dropped and counted). Raises
        :class:`ValueError` above ``slot_size`` and :class:`ClosedResourceError` after
        :meth:`close`."""
        if self._closed:
            raise ClosedResourceError(f"ezring writer {self._name} is closed")
        m, h = self._m, self._h
        if not 0 <= nbytes <= h.slot_size:
            raise ValueError(f"{nbytes} bytes do not fit an ezring slot of {h.slot_size}")
        seq = self._published + 1
        offset = h.slot_table + ((seq - 1) % h.slot_count) * h.slot_stride
        if seq <= h.slot_count:
            m.store(offset + S_SEQ, 0)  # seqlock: being written
        elif self._scan(seq - h.slot_count):
            m.store(offset + S_SEQ, 0)
            m.store(OFF_SCAN_COUNT, 2 * self._scans)  # the scan is over (docs/ezring.md)
        else:
            m.store(OFF_SCAN_COUNT, 2 * self._scans)
            self._dropped += 1
            m.store(OFF_DROPPED, self._dropped)
            self._loaned = 0
            return None
        self._loaned = seq
        start = offset + SLOT_HEADER_SIZE
        return self._payload[start : start + nbytes]

    def _scan(self, previous: int) -> bool:
        """The reader-table scan of a loan that overwrites frame *previous*: true when
        no live lossless reader holds it. Announced (``scan_count`` odd) and then a full
        barrier before the first entry is read; the caller ends it (``scan_count`` even)
        after the slot's seqlock store, or at once when the frame is held."""
        m, h = self._m, self._h
        self._scans += 1
        m.store(OFF_SCAN_COUNT, 2 * self._scans - 1)
        # Full barrier between that store and the loads of the entries (docs/ezring.md,
        # "Registration": a Dekker pair with a registering reader): a system call that
        # takes a kernel lock, as the reader's.
        locked_elsewhere(m.fd, 0)
        for i in range(h.max_readers):
            base = h.reader_table + i * READER_ENTRY_SIZE
            word = m.load(base + R_STATE)
            if word & 0xFFFFFFFF != STATE_ACTIVE:
                continue
            if m.rw[base + R_MODE] != MODE_LOSSLESS:
                continue
            if m.load(base + R_CURSOR) >= previous or self._reclaim_if_dead(i, word):
                continue
            return False
        return True

    def commit(
        self,
        nbytes: int,
        typestr: str = "|u1",
        shape: tuple[int, ...] | None = None,
        t_ns: int | None = None,
        meta: bytes = b"",
    ) -> None:
        """Publish the loaned slot (its first *nbytes*) and wake every reader; never
        blocks. *shape* defaults to ``(nbytes // itemsize,)``; *t_ns* to now
        (CLOCK_MONOTONIC). Raises :class:`RuntimeError` without a successful loan and
        :class:`ValueError` for a description that does not fit the format."""
        m, h = self._m, self._h
        seq = self._loaned
        if not seq:
            raise RuntimeError("commit() needs a successful loan() first")
        encoded = typestr.encode("ascii")
        if shape is None:
            shape = (nbytes // np.dtype(typestr).itemsize,)
        if not 0 < len(encoded) < TYPESTR_SIZE or len(shape) > MAX_NDIM:
            raise ValueError(f"typestr {typestr!r} or shape {shape} does not fit the format")
        if len(meta) > META_SIZE:
            raise ValueError(f"ezring metadata is {len(meta)} bytes, at most {META_SIZE}")
        offset = h.slot_table + ((seq - 1) % h.slot_count) * h.slot_stride
        stamp = time.monotonic_ns() if t_ns is None else t_ns
        _SLOT.pack_into(m.rw, offset + 8, nbytes, stamp, encoded, len(shape), len(meta))
        m.rw[offset + S_SHAPE : offset + S_SHAPE + 8 * MAX_NDIM] = struct.pack(
            "<8Q", *shape, *[0] * (8 - len(shape))
        )
        if meta:
            m.rw[offset + S_META : offset + S_META + len(meta)] = meta
        m.store(offset + S_SEQ, seq)
        m.store(OFF_WRITE_SEQ, seq)
        self._published = seq
        self._loaned = 0
        self._wake_all()

    def publish(self, array: npt.ArrayLike, *, t_ns: int | None = None, meta: bytes = b"") -> bool:
        """Copy *array* into the next free slot and commit it; false if dropped."""
        data = np.ascontiguousarray(array)
        view = self.loan(data.nbytes)
        if view is None:
            return False
        np.frombuffer(view, np.uint8)[:] = data.reshape(-1).view(np.uint8)
        self.commit(data.nbytes, data.dtype.str, data.shape, t_ns, meta)
        return True

    def _wake_all(self) -> None:
        m, h = self._m, self._h
        for i in range(h.max_readers):
            base = h.reader_table + i * READER_ENTRY_SIZE
            word = m.load(base + R_STATE)
            if word & 0xFFFFFFFF != STATE_ACTIVE:
                continue
            address = bytes(m.rw[base + R_ADDR : base + R_ADDR + ADDR_SIZE]).rstrip(b"\0")
            if not address:
                continue
            try:
                self._sock.sendto(b"\1", b"\0" + address)
            except (BlockingIOError, InterruptedError):
                pass  # its queue is full of wake-ups already: nothing is lost
            except (ConnectionRefusedError, FileNotFoundError):
                self._reclaim_if_dead(i, word)

    def close(self) -> None:
        """Set CLOSED, wake the readers, remove the name, unmap; idempotent. Readers
        drain what was committed and then see the end of the stream."""
        if self._closed:
            return
        self._closed = True
        m = self._m
        m.store(OFF_FLAGS, m.load(OFF_FLAGS) | FLAG_CLOSED)
        self._wake_all()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)  # before the lock goes: never a lock-free live name
        self._payload.release()
        self._sock.close()
        m.close()

    def __enter__(self) -> RingWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> RingWriter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
