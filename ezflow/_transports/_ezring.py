"""ezring v1: a shared-memory ring that C/C++ (or Python) producers write and ezflow reads.

The format is specified in ``docs/ezring.md`` (normative; ``c/ezflow_ring.h`` is the C
writer). In short: one file ``/dev/shm/ezflow-ring-<name>``::

    0      header (384 bytes in v1.0): magic, version, geometry, writer pid/start,
           topic; write_seq at 256, writer statistics at 320
    384    reader table: max_readers entries of 64 bytes (state word, mode, pid,
           release cursor, wake-up address)
    page   slot table: slot_count slots of slot_stride bytes (256-byte slot header:
           seq, length, t_ns, typestr, ndim, meta_len, shape[8], meta[128]; payload)

Frame *seq* (1, 2, ...) lives in slot ``(seq - 1) % slot_count``. The writer overwrites a
slot only when every live lossless reader's release cursor has passed the frame in it;
otherwise it drops the new frame and counts it. Leaky readers are never waited for and
detect being lapped seqlock-style. Wake-ups are datagrams to each reader's abstract Unix
socket; liveness is by OFD locks (byte 0 for the writer, the first byte of each reader
entry for its reader).

Atomicity on the Python side: 8-byte fields are read and written through a
``memoryview`` cast to ``"Q"`` over the mapping, i.e. one aligned 8-byte load or store
(CPython copies the item with a fixed-size memcpy, which compilers emit as one ``mov``
on x86-64 and one ``ldr``/``str`` on aarch64; aligned 8-byte accesses are single-copy
atomic on both). The *ordering* this module relies on is x86-64's (TSO: loads are not
reordered with loads, stores not with stores; the one reordering x86-64 does - a later load
passing an earlier store to another address - matters only at registration (state store,
then ``write_seq`` load), where a system call that takes a kernel lock (``F_OFD_GETLK``)
is the full barrier). On aarch64 the Python reader and writer are not guaranteed correct
(the spec's "Atomicity and aarch64" section); the C writer is, because it uses
acquire/release atomics.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import mmap
import os
import re
import secrets
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from .._core._channel import Channel
from .._core._config import (
    DEFAULT_EZRING_MAX_READERS,
    DEFAULT_EZRING_SLOT_COUNT,
    EZRING_ATTACH_TIMEOUT,
    EZRING_POLL_INTERVAL,
)
from .._core._exceptions import (
    BrokenResourceError,
    ClosedResourceError,
    ConfigurationError,
    EndOfStream,
    EzflowError,
    EzflowTimeoutError,
    ProtocolError,
)
from ._base import Inbound
from ._shmfiles import (
    RefusedShmFile,
    describe_entry,
    open_shm_file,
    owner_alive,
    process_start,
    shm_dir,
    shm_path,
)

if TYPE_CHECKING:  # numpy.typing costs ~15 ms to import; annotations only
    import numpy.typing as npt

__all__ = [
    "RingFrame",
    "RingHeader",
    "RingInbound",
    "RingReader",
    "RingStats",
    "RingWriter",
    "open_ring_channel",
    "read_ring_header",
    "remove_ring_if_stale",
    "ring_path",
    "sweep_stale_rings",
]

log = logging.getLogger("ezflow.ezring")

PREFIX: Final = "ezflow-ring-"
NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
FILE_RE: Final = re.compile(r"ezflow-ring-[A-Za-z0-9_-]{1,64}")

MAGIC: Final = int.from_bytes(b"EZRING1\0", "little")
MAJOR: Final = 1
MINOR: Final = 0
HEADER_SIZE: Final = 384
READER_ENTRY_SIZE: Final = 64
SLOT_HEADER_SIZE: Final = 256
MAX_NDIM: Final = 8
TYPESTR_SIZE: Final = 8
TOPIC_SIZE: Final = 128
META_SIZE: Final = 128
ADDR_SIZE: Final = 32
FLAG_CLOSED: Final = 1

# Header offsets (docs/ezring.md, "Segment header").
OFF_MAGIC: Final = 0
OFF_FLAGS: Final = 16
OFF_WRITE_SEQ: Final = 256
OFF_DROPPED: Final = 320
OFF_RECLAIMED: Final = 328
# magic, major, minor, header_size, flags, slot_count, max_readers, slot_size,
# slot_stride, reader_table, slot_table, segment_size, writer_pid, (pad), writer_start,
# created_ns
_HEADER: Final = struct.Struct("<QHHIQIIQQQQQIIQQ")
_TOPIC_OFFSET: Final = 96
# Reader entry: state word (u64: state | generation << 32), mode, pid, cursor.
R_STATE: Final = 0
R_MODE: Final = 8
R_CURSOR: Final = 16
R_ADDR: Final = 32
STATE_FREE: Final = 0
STATE_ACTIVE: Final = 2
MODE_LOSSLESS: Final = 1
MODE_LEAKY: Final = 2
# Slot header: seq at 0; then length, t_ns, typestr, ndim, meta_len; shape at 40.
S_SEQ: Final = 0
_SLOT: Final = struct.Struct("<QQ8sII")
S_SHAPE: Final = 40
S_META: Final = 128

_F_WRLCK: Final = fcntl.F_WRLCK
_F_UNLCK: Final = fcntl.F_UNLCK
_F_OFD_GETLK: Final = getattr(fcntl, "F_OFD_GETLK", 36)
_F_OFD_SETLK: Final = getattr(fcntl, "F_OFD_SETLK", 37)
# struct flock on Linux x86-64/aarch64: short type, short whence, off_t start, off_t len,
# pid_t pid (0 for OFD locks), padded to 32 bytes.
_FLOCK: Final = struct.Struct("hhqqi4x")
_WORD: Final = struct.Struct("<Q")


def ring_path(name: str) -> str:
    """``<shm directory>/ezflow-ring-<name>`` (``/dev/shm`` unless ``EZFLOW_SHM_DIR``);
    *name* must match ``[A-Za-z0-9_-]{1,64}``."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise ConfigurationError(
            f"ring name={name!r} must be 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'"
        )
    return shm_path(PREFIX + name)


def _lock(fd: int, offset: int) -> bool:
    """Take an OFD write lock on byte *offset* without waiting; false if held elsewhere."""
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, _FLOCK.pack(_F_WRLCK, os.SEEK_SET, offset, 1, 0))
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _locked_elsewhere(fd: int, offset: int) -> bool:
    """Whether another open file description holds a lock on byte *offset* (a system
    call that takes a kernel lock: also this module's full memory barrier)."""
    answer = fcntl.fcntl(fd, _F_OFD_GETLK, _FLOCK.pack(_F_WRLCK, os.SEEK_SET, offset, 1, 0))
    return int(_FLOCK.unpack(answer)[0]) != _F_UNLCK


@dataclass(frozen=True, slots=True)
class RingHeader:
    """The self-description of a ring, as read from its header."""

    major: int
    minor: int
    header_size: int
    slot_count: int
    max_readers: int
    slot_size: int
    slot_stride: int
    reader_table: int
    slot_table: int
    segment_size: int
    writer_pid: int
    writer_start: int
    created_ns: int
    topic: str

    @classmethod
    def parse(cls, buffer: Any, size: int) -> RingHeader:
        """Check and parse the header in *buffer* (a mapping of *size* bytes).

        Raises :class:`ProtocolError` for a wrong magic, another major version, or
        a geometry that does not fit in *size*. Unknown minor versions are accepted:
        their extra header fields lie beyond ``header_size`` bytes we do not read.
        """
        if size < HEADER_SIZE:
            raise ProtocolError(f"ezring segment of {size} bytes is smaller than a header")
        fields = _HEADER.unpack_from(buffer, 0)
        (magic, major, minor, header_size, _flags, slot_count, max_readers, slot_size) = fields[:8]
        stride, reader_table, slot_table, segment_size, pid, _pad, start, created = fields[8:]
        if magic != MAGIC:
            raise ProtocolError(f"not an ezring segment (magic {magic:#x})")
        if major != MAJOR:
            raise ProtocolError(
                f"ezring major version {major} is not supported (this ezflow reads version"
                f" {MAJOR}); upgrade ezflow or rebuild the writer with a matching ezflow_ring.h"
            )
        topic = bytes(buffer[_TOPIC_OFFSET : _TOPIC_OFFSET + TOPIC_SIZE]).split(b"\0")[0]
        header = cls(
            major,
            minor,
            header_size,
            slot_count,
            max_readers,
            slot_size,
            stride,
            reader_table,
            slot_table,
            segment_size,
            pid,
            start,
            created,
            topic.decode("utf-8", "replace"),
        )
        if not (
            header_size >= HEADER_SIZE
            and slot_count >= 2
            and max_readers >= 1
            and stride % 64 == 0
            and stride >= SLOT_HEADER_SIZE + slot_size
            and reader_table >= header_size
            and slot_table >= reader_table + max_readers * READER_ENTRY_SIZE
            and slot_table % 64 == 0
            and slot_table + slot_count * stride <= segment_size <= size
        ):
            raise ProtocolError(f"ezring header describes an impossible geometry: {header}")
        return header


@dataclass(frozen=True, slots=True)
class RingStats:
    """A snapshot of a ring's writer-side counters."""

    published: int
    dropped_full: int
    readers_live: int
    readers_reclaimed: int


@dataclass(frozen=True, slots=True)
class RingFrame:
    """One frame received from a ring.

    *array* is read-only. For a lossless reader it is a zero-copy view of the slot, and
    the slot stays held (the writer will not overwrite it) until *array* and every view
    derived from it are gone; for a leaky reader it is a private copy. *lost* counts the
    frames a leaky reader missed just before this one (lapped); always 0 when lossless.
    """

    seq: int
    t_ns: int
    array: npt.NDArray[Any]
    meta: bytes
    lost: int


class _Mapping:
    """The ring file mapped twice: read-write for the control words, read-only for the
    payload views handed out (so no view can be made writable). Make one with
    :meth:`create` (a writer) or :meth:`open` (a reader)."""

    def __init__(self, path: str, fd: int, size: int) -> None:
        """Map *size* bytes of *fd* (which this object then owns and closes)."""
        self.fd = fd
        self.size = size
        try:
            self.rw = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
            self.ro = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except OSError as error:
            os.close(fd)
            raise BrokenResourceError(f"cannot map ezring {path}: {error}") from error
        except BaseException:
            os.close(fd)
            raise
        self.words = memoryview(self.rw).cast("Q")

    @classmethod
    def create(cls, path: str, size: int) -> _Mapping:
        """Create *path* exclusively (mode 0600), take the writer lock, size it. Raises
        ``FileExistsError`` if the name exists, :class:`BrokenResourceError` otherwise."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_CREAT | os.O_EXCL
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise
        except OSError as error:
            raise BrokenResourceError(f"cannot create ezring {path}: {error}") from error
        try:
            try:
                os.fchmod(fd, 0o600)
                if not _lock(fd, 0):  # pragma: no cover - we just created it
                    raise BrokenResourceError(f"cannot lock the new ezring {path}")
                os.ftruncate(fd, size)
                os.posix_fallocate(fd, 0, size)
            except OSError as error:
                raise BrokenResourceError(f"cannot size ezring {path}: {error}") from error
            return cls(path, fd, size)
        except BaseException:
            # Ours (created exclusively just now): remove the name, then drop the lock.
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):
                os.close(fd)
            raise

    @classmethod
    def open(cls, path: str) -> _Mapping | None:
        """Open and map the ring file *path* for a reader, or ``None`` while it is not
        ready (empty, or its header not written yet: the writer is starting).

        Only a regular file of this user is opened (see ``_shmfiles``), and only the
        ``segment_size`` bytes its header describes are mapped. Raises
        ``FileNotFoundError`` when there is no such file, :class:`RefusedShmFile` for an
        entry that is not one (logged once), :class:`ProtocolError` for a file that is not
        an ezring v1 ring, :class:`BrokenResourceError` when it cannot be opened.
        """
        file = open_shm_file(path, writable=True, min_size=0)
        try:
            head = os.pread(file.fd, HEADER_SIZE, 0)
            if file.size == 0 or _WORD.unpack_from(head.ljust(8, b"\0"))[0] == 0:
                os.close(file.fd)
                return None  # created, not initialised yet
            header = RingHeader.parse(head, file.size)
        except OSError as error:
            os.close(file.fd)
            raise BrokenResourceError(f"cannot read ezring {path}: {error}") from error
        except BaseException:
            os.close(file.fd)
            raise
        return cls(path, file.fd, header.segment_size)

    def load(self, offset: int) -> int:
        return self.words[offset >> 3]

    def store(self, offset: int, value: int) -> None:
        self.words[offset >> 3] = value

    def close(self) -> None:
        self.words.release()
        # Views handed out (payload views, a writer's loans) keep their mapping alive;
        # it is unmapped with the last of them.
        with contextlib.suppress(BufferError):
            self.rw.close()
        with contextlib.suppress(BufferError):
            self.ro.close()
        os.close(self.fd)  # releases our OFD locks


class RingReader:
    """One reader of a ring: ``async with await RingReader.open(name) as reader``.

    *lossless* readers hold the writer back (it drops new frames while every slot is
    still held by some lossless reader); leaky readers never do and may be lapped
    (:attr:`RingFrame.lost`). A reader receives every frame committed after it began
    registering (so a writer that waits for ``readers_live`` loses none). Not
    thread-safe: use it from one event loop.
    """

    def __init__(self, name: str, mapping: _Mapping, header: RingHeader, lossless: bool) -> None:
        """Private: use :meth:`open`."""
        self._name = name
        self._m = mapping
        self._header = header
        self._lossless = lossless
        self._closed = False
        self._entry = -1
        self._sock: socket.socket | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._watching = False
        self._next = 0
        self._held: dict[int, int] = {}  # seq -> 1 while a lossless view is alive
        self._delivered = 0
        self._cursor = 0
        self._dtypes: dict[bytes, np.dtype[Any]] = {}
        # Views may die in another thread (a @thread unit): releases go back to this one.
        self._thread = threading.get_ident()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lost = 0  #: frames skipped because this (leaky) reader was lapped

    @classmethod
    async def open(
        cls, name: str, *, lossless: bool = True, timeout: float = EZRING_ATTACH_TIMEOUT
    ) -> RingReader:
        """Attach to ring *name* and register a reader entry.

        Waits up to *timeout* seconds for the ring to exist and be initialised (polling
        every 10 ms; an open, a read and the mmap of a tmpfs file are the only system
        calls). Raises :class:`EzflowTimeoutError` if it is not ready in time,
        :class:`ProtocolError` for a segment that is not ezring v1 (another major
        version is refused), :class:`BrokenResourceError` when every reader entry is
        taken or the ring cannot be mapped, and its subclass ``RefusedShmFile`` at once
        for an entry of that name that is not a ring file of this user (a FIFO, a
        directory, a symbolic link, another user's file; logged once).
        Cancellation-safe: nothing stays registered.
        """
        path = ring_path(name)
        deadline = time.monotonic() + timeout
        while True:
            try:
                mapping = _Mapping.open(path)
            except RefusedShmFile as error:
                raise RefusedShmFile(
                    error.path, f"cannot read ezring {name}: {error.reason}"
                ) from error
            except FileNotFoundError as error:
                if time.monotonic() > deadline:
                    raise EzflowTimeoutError(
                        f"ezring {name} ({path}) did not appear within {timeout} s; start its"
                        " writer first, or give a longer timeout"
                    ) from error
                await asyncio.sleep(0.01)
                continue
            if mapping is None:  # created but not initialised yet
                if time.monotonic() > deadline:
                    raise EzflowTimeoutError(
                        f"ezring {name} ({path}) exists but its writer did not finish creating"
                        f" it within {timeout} s"
                    )
                await asyncio.sleep(0.01)
                continue
            break
        try:
            header = RingHeader.parse(mapping.rw, mapping.size)
            reader = cls(name, mapping, header, lossless)
            reader._loop = asyncio.get_running_loop()
            reader._register()
        except BaseException:
            mapping.close()
            raise
        return reader

    def _register(self) -> None:
        h, m = self._header, self._m
        for i in range(h.max_readers):
            if _lock(m.fd, h.reader_table + i * READER_ENTRY_SIZE):
                self._entry = i
                break
        else:
            raise BrokenResourceError(
                f"ezring {self._name} has all {h.max_readers} reader entries in use;"
                " close a reader or create the ring with a larger max_readers"
            )
        base = self._entry_offset
        generation = ((m.load(base + R_STATE) >> 32) + 1) & 0xFFFFFFFF
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            address = f"ezr-{os.getpid()}-{secrets.token_hex(6)}"
            sock.bind("\0" + address)
            sock.setblocking(False)
        except OSError as error:
            sock.close()
            raise BrokenResourceError(f"cannot bind the ezring wake-up socket: {error}") from error
        self._sock = sock
        mode = MODE_LOSSLESS if self._lossless else MODE_LEAKY
        struct.pack_into("<II", m.rw, base + R_MODE, mode, os.getpid())
        m.rw[base + R_ADDR : base + R_ADDR + ADDR_SIZE] = address.encode().ljust(ADDR_SIZE, b"\0")
        before = m.load(OFF_WRITE_SEQ)
        m.store(base + R_CURSOR, before)
        m.store(base + R_STATE, STATE_ACTIVE | generation << 32)
        # Full barrier between the state store and the write_seq load (docs/ezring.md,
        # "Registration"): a system call taking a kernel lock. It doubles as the first
        # liveness check of the writer.
        _locked_elsewhere(m.fd, 0)
        after = m.load(OFF_WRITE_SEQ)
        # Frames after `before` are intact unless the writer, not yet seeing us, lapped
        # the ring meanwhile; only then do we start at `after`.
        start = before if after - before < self._header.slot_count else after
        m.store(base + R_CURSOR, start)
        self._next = start + 1
        self._delivered = self._cursor = start

    @property
    def _entry_offset(self) -> int:
        return self._header.reader_table + self._entry * READER_ENTRY_SIZE

    @property
    def header(self) -> RingHeader:
        """The ring's self-description (geometry, writer, topic)."""
        return self._header

    @property
    def topic(self) -> str:
        """The topic the writer declared (may be empty)."""
        return self._header.topic

    def stats(self) -> RingStats:
        """A snapshot of the writer's counters as published in the segment."""
        m, h = self._m, self._header
        live = sum(
            m.load(h.reader_table + i * READER_ENTRY_SIZE) & 0xFFFFFFFF == STATE_ACTIVE
            for i in range(h.max_readers)
        )
        return RingStats(m.load(OFF_WRITE_SEQ), m.load(OFF_DROPPED), live, m.load(OFF_RECLAIMED))

    # -- receiving ------------------------------------------------------------------

    def _view_dropped(self, seq: int) -> None:
        # The finalizer of a lossless view: runs in whichever thread dropped it last.
        if threading.get_ident() == self._thread or self._loop is None:
            self._release(seq)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to tell
                self._loop.call_soon_threadsafe(self._release, seq)

    def _release(self, seq: int) -> None:
        if self._closed:
            return
        self._held.pop(seq, None)
        cursor = min(self._held) - 1 if self._held else self._delivered
        if cursor != self._cursor:
            self._cursor = cursor
            self._m.store(self._entry_offset + R_CURSOR, cursor)

    def _dtype(self, typestr: bytes) -> np.dtype[Any]:
        dtype = self._dtypes.get(typestr)
        if dtype is None:
            text = typestr.split(b"\0")[0].decode("ascii", "replace")
            try:
                dtype = np.dtype(text)
            except TypeError as error:
                raise ProtocolError(f"ezring slot has an invalid typestr {text!r}") from error
            if dtype.hasobject:
                raise ProtocolError(f"ezring slot typestr {text!r} is an object type")
            self._dtypes[typestr] = dtype
        return dtype

    def receive_nowait(self) -> RingFrame | None:
        """The next frame if one is committed, else ``None``; never waits.

        Raises :class:`ClosedResourceError` after :meth:`aclose` and
        :class:`ProtocolError` for a slot that does not describe its payload.
        """
        if self._closed:
            raise ClosedResourceError(f"this reader of ezring {self._name} is closed")
        m, h = self._m, self._header
        lost = 0
        while True:
            written = m.load(OFF_WRITE_SEQ)
            seq = self._next
            if seq > written:
                self.lost += lost
                return None
            offset = h.slot_table + ((seq - 1) % h.slot_count) * h.slot_stride
            if m.load(offset + S_SEQ) != seq:
                # Lapped: the slot already holds (or is being filled with) a later frame.
                # Resume at the oldest frame that cannot be in the writer's hands.
                resume = max(seq + 1, written - h.slot_count + 2)
                lost += resume - seq
                self._next = resume
                continue
            length, t_ns, typestr, ndim, meta_len = _SLOT.unpack_from(m.ro, offset + 8)
            if ndim > MAX_NDIM or meta_len > META_SIZE or length > h.slot_size:
                raise ProtocolError(f"ezring slot of frame {seq} has an invalid header")
            shape = struct.unpack_from(f"<{ndim}Q", m.ro, offset + S_SHAPE)
            dtype = self._dtype(typestr)
            count = 1
            for n in shape:
                count *= n
            if count * dtype.itemsize != length:
                raise ProtocolError(
                    f"ezring frame {seq}: shape {shape} of {dtype.str} is not {length} bytes"
                )
            meta = bytes(m.ro[offset + S_META : offset + S_META + meta_len]) if meta_len else b""
            data = np.frombuffer(m.ro, dtype, count, offset + SLOT_HEADER_SIZE)
            self._next = seq + 1
            if self._lossless:
                self._delivered = seq
                self._held[seq] = 1
                weakref.finalize(data, self._view_dropped, seq)
                array = data if ndim == 1 else data.reshape(shape)
            else:
                array = data.reshape(shape).copy()
                array.flags.writeable = False
                # Seqlock check: the slot still holds this frame after the copy.
                if m.load(offset + S_SEQ) != seq:
                    lost += 1
                    continue
                self._delivered = self._cursor = seq
                m.store(self._entry_offset + R_CURSOR, seq)
            self.lost += lost
            return RingFrame(seq, t_ns, array, meta, lost)

    def _writer_alive(self) -> bool:
        return _locked_elsewhere(self._m.fd, 0)

    async def receive(self) -> RingFrame:
        """Wait for the next frame.

        Raises :class:`EndOfStream` once the writer closed the ring and every frame
        committed before has been received, :class:`BrokenResourceError` if the writer
        died (no close) and nothing more is committed, :class:`ClosedResourceError`
        after :meth:`aclose`. Cancellation-safe: a cancelled receive takes nothing.
        """
        while True:
            frame = self.receive_nowait()
            if frame is not None:
                return frame
            m = self._m
            if m.load(OFF_FLAGS) & FLAG_CLOSED:
                if self._next > m.load(OFF_WRITE_SEQ):
                    raise EndOfStream(f"ezring {self._name} was closed by its writer")
                continue
            if not self._writer_alive():
                if m.load(OFF_FLAGS) & FLAG_CLOSED or self._next <= m.load(OFF_WRITE_SEQ):
                    continue  # closed (or committed) just before it went
                raise BrokenResourceError(
                    f"the writer of ezring {self._name} (pid {self._header.writer_pid}) died"
                    " without closing it"
                )
            await self._wait()

    async def recv(self) -> npt.NDArray[Any]:
        """:meth:`receive`, returning only the read-only array."""
        return (await self.receive()).array

    async def _wait(self) -> None:
        # A bare future and call_later, not wait_for(Event.wait()): wait_for makes a task
        # per wait, which costs more than the rest of a frame's receive path together.
        loop = asyncio.get_running_loop()
        if not self._watching:
            assert self._sock is not None
            loop.add_reader(self._sock.fileno(), self._on_wake)
            self._watching = True
        waiter = self._waiter = loop.create_future()
        # A commit between our last look and the future's creation would have woken
        # nobody: look again now that the future is in place (the writer publishes
        # write_seq before it sends the datagram).
        if self._next <= self._m.load(OFF_WRITE_SEQ):
            self._waiter = None
            return
        timer = loop.call_later(EZRING_POLL_INTERVAL, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _on_wake(self) -> None:
        assert self._sock is not None
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                self._sock.recv(64)
        if self._waiter is not None:
            _wake(self._waiter)

    def __aiter__(self) -> RingReader:
        return self

    async def __anext__(self) -> RingFrame:
        try:
            return await self.receive()
        except EndOfStream:
            raise StopAsyncIteration from None

    # -- teardown -------------------------------------------------------------------

    async def aclose(self) -> None:
        """Unregister and unmap; idempotent. Views already handed out stay valid (the
        read-only mapping lives as long as they do), but their slots are released: the
        writer may overwrite them from now on."""
        self.close()

    def close(self) -> None:
        """Synchronous :meth:`aclose`."""
        if self._closed:
            return
        self._closed = True
        m = self._m
        if self._entry >= 0:
            base = self._entry_offset
            m.store(base + R_STATE, m.load(base + R_STATE) & ~0xFFFFFFFF)
        if self._sock is not None:
            if self._watching:
                with contextlib.suppress(RuntimeError):
                    asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
        m.close()

    async def __aenter__(self) -> RingReader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class RingWriter:
    """The writer side of the format in Python: for tests and for Python producers that
    want drop-when-full. Never blocks; not thread-safe; one writer per ring.

    ``with RingWriter.create("cam0", slot_size=n) as w: w.publish(array)``
    """

    def __init__(self, name: str, path: str, mapping: _Mapping, header: RingHeader) -> None:
        """Private: use :meth:`create`."""
        self._name = name
        self._path = path
        self._m = mapping
        self._h = header
        self._published = 0
        self._dropped = 0
        self._reclaimed = 0
        self._loaned = 0
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
            mapping = _Mapping.create(path, size)
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
        if _locked_elsewhere(m.fd, base):
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
        if seq > h.slot_count:
            previous = seq - h.slot_count
            for i in range(h.max_readers):
                base = h.reader_table + i * READER_ENTRY_SIZE
                word = m.load(base + R_STATE)
                if word & 0xFFFFFFFF != STATE_ACTIVE:
                    continue
                if m.rw[base + R_MODE] != MODE_LOSSLESS:
                    continue
                if m.load(base + R_CURSOR) >= previous or self._reclaim_if_dead(i, word):
                    continue
                self._dropped += 1
                m.store(OFF_DROPPED, self._dropped)
                self._loaned = 0
                return None
        offset = h.slot_table + ((seq - 1) % h.slot_count) * h.slot_stride
        m.store(offset + S_SEQ, 0)  # seqlock: being written
        self._loaned = seq
        start = offset + SLOT_HEADER_SIZE
        return self._payload[start : start + nbytes]

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


def read_ring_header(name: str) -> RingHeader:
    """The header of ring *name* now (one open, read and close; no reader entry).

    Raises :class:`BrokenResourceError` if the ring does not exist or cannot be read
    (its subclass ``RefusedShmFile`` for an entry of that name that is not a ring file
    of this user: a FIFO, a directory, a symbolic link, another user's file) and
    :class:`ProtocolError` if it is not an initialised ezring v1 ring.
    """
    path = ring_path(name)
    try:
        file = open_shm_file(path, min_size=0)
    except FileNotFoundError as error:
        raise BrokenResourceError(
            f"ezring {name} does not exist ({path}): start its writer first"
        ) from error
    except RefusedShmFile as error:
        raise RefusedShmFile(error.path, f"cannot read ezring {name}: {error.reason}") from error
    try:
        head = os.pread(file.fd, HEADER_SIZE, 0)
    except OSError as error:
        raise BrokenResourceError(f"cannot read ezring {name} ({path}): {error}") from error
    finally:
        os.close(file.fd)
    return RingHeader.parse(head, file.size)


class RingInbound(Inbound):
    """A graph channel fed by a ring: one lossless :class:`RingReader` whose frames are
    delivered to a :class:`~ezflow._core._channel.Channel` as read-only numpy views.

    A slot is released when every subscriber has dropped the array (the view's
    lifetime), so slow subscribers make the ring's writer drop, never wait. The
    publish time handed to the channel is the slot's ``t_ns`` converted from
    CLOCK_MONOTONIC to ``time.time_ns()``.
    """

    transport = "ezring"

    def __init__(self, reader: RingReader, task: asyncio.Task[None]) -> None:
        """Private: use :func:`open_ring_channel`."""
        self._reader = reader
        self._task = task

    def close(self) -> None:
        """Stop feeding the channel and unregister the reader (idempotent)."""
        self._task.cancel()
        self._reader.close()


async def open_ring_channel(
    channel: Channel,
    ring: str,
    *,
    on_lost: Callable[[], None],
    created_ns: int | None = None,
) -> RingInbound:
    """Attach a reader to ring *ring* and feed *channel* from it until the writer closes
    or dies, or the inbound is closed. Raises as :meth:`RingReader.open`.

    The stream ends like any publisher's: after every frame committed before it, the
    channel ends (:meth:`Channel.end`; ``broken`` when the writer died without closing,
    or wrote a slot that does not describe its payload), one line is logged naming the
    ring and how it ended, and *on_lost* is called. A dead writer's file is removed at
    once (if its lock is free, as the sweeper would). Closing the inbound ends nothing.

    *created_ns*: the ``created_ns`` of the writer's ring the publisher stands for; a
    ring of another writer found under the name (the first one is gone, a new one took
    the name) is not read: the channel ends at once, broken, logged.
    """
    reader = await RingReader.open(ring)
    path = ring_path(ring)

    async def feed() -> None:
        frames = 0
        if created_ns is not None and reader.header.created_ns != created_ns:
            reader.close()
            log.warning(
                "ezring %s feeding topic %r: the writer it stood for is gone and pid %d"
                " made a new ring under the name: that stream ended (the new writer is"
                " another publisher)",
                ring,
                channel.topic,
                reader.header.writer_pid,
            )
            channel.end(broken=True)
            on_lost()
            return
        try:
            async for frame in reader:
                seq, array = frame.seq, frame.array
                sent_ns = frame.t_ns + time.time_ns() - time.monotonic_ns()
                del frame  # from here the subscribers hold the only references
                channel.deliver(seq, array, array.nbytes, 0, sent_ns)
                del array
                frames += 1
        except ClosedResourceError:
            return  # the inbound was closed: this process stopped listening
        except BrokenResourceError as error:
            log.warning(
                "ezring %s feeding topic %r ended after %d frames: %s",
                ring,
                channel.topic,
                frames,
                error,
            )
            channel.end(broken=True)
            # (In a thread: a sweep is file I/O, and the loop must not wait on it.)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(remove_ring_if_stale, path)
        except ProtocolError as error:
            log.error(
                "ezring %s feeding topic %r: stopped reading after %d frames: %s",
                ring,
                channel.topic,
                frames,
                error,
            )
            channel.end(broken=True)
        else:
            log.info(
                "ezring %s feeding topic %r ended after %d frames: its writer closed it",
                ring,
                channel.topic,
                frames,
            )
            channel.end()
        finally:
            reader.close()
        on_lost()

    task = asyncio.ensure_future(feed())
    return RingInbound(reader, task)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def remove_ring_if_stale(path: str, *, report: bool = False) -> bool:
    """Remove the ring file *path* if its writer is dead; true if removed. Never raises.

    Dead means: the header names a process that no longer runs with that start time (or
    the header is not initialised) *and* no one holds the writer's lock (byte 0). Only a
    regular file of this user is considered (opened as ``_shmfiles.open_shm_file`` does,
    read-only: a FIFO, directory, symbolic link or another user's file is logged once and
    left alone; *report*: as a WARNING, see ``_shmfiles.refuse_entry``); a missing file
    is left alone too (false).
    """
    try:
        file = open_shm_file(path, min_size=0, report=report)
    except (OSError, EzflowError):
        return False
    fd = file.fd
    try:
        head = os.pread(fd, _HEADER.size, 0)
        if len(head) == _HEADER.size:
            fields = _HEADER.unpack(head)
            if fields[0] == MAGIC and owner_alive(fields[12], fields[14]):
                return False
        if _locked_elsewhere(fd, 0):
            return False
        os.unlink(path)
    except OSError:
        return False
    finally:
        os.close(fd)
    log.info("removed stale ezring %s", path)
    return True


def sweep_stale_rings(directory: str | None = None, *, report: bool = False) -> list[str]:
    """Remove the ring files (``ezflow-ring-<name>``) in *directory* (default: the shm
    directory) whose writer is dead, as :func:`remove_ring_if_stale`; return their file
    names. Never raises (a missing directory gives ``[]``)."""
    try:
        directory = shm_dir() if directory is None else directory
        entries = os.listdir(directory)
    except (OSError, ConfigurationError):
        return []
    return [
        entry
        for entry in entries
        if FILE_RE.fullmatch(entry)
        and remove_ring_if_stale(os.path.join(directory, entry), report=report)
    ]
