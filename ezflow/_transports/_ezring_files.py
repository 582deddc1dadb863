"""ezring v1 ring files: the format's constants and header, and every look at a ring file.

The format is specified in ``docs/ezring.md`` (normative; ``c/ezflow_ring.h`` is the C
writer); :mod:`._ezring` reads rings and :mod:`._ezring_writer` writes them. Everything
that opens a ring file goes through :func:`open_ring_file` (which opens it as
``_shmfiles.open_shm_file`` does: a regular file of our own user, no symbolic link, no
FIFO) and reads its header once: the reader's mapping (:class:`RingMapping`),
:func:`read_ring_header` (``GraphContext.attach_ring``), the sweeper
(:func:`remove_ring_if_stale`, :func:`sweep_stale_rings`) and the graph server's ring
watcher (:func:`scan_rings`). Nothing here runs on an event loop: it is blocking file
I/O, for a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import re
import stat
import struct
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from .._core._config import EZRING_CREATE_GRACE
from .._core._exceptions import BrokenResourceError, ConfigurationError, EzflowError, ProtocolError
from ._shmfiles import RefusedShmFile, open_shm_file, owner_alive, refuse_entry, shm_dir, shm_path

__all__ = [
    "LiveRing",
    "RingFile",
    "RingHeader",
    "RingMapping",
    "RingStats",
    "open_ring_file",
    "read_ring_header",
    "remove_ring_if_stale",
    "ring_path",
    "scan_rings",
    "sweep_stale_rings",
]

log = logging.getLogger("ezflow.ezring")

PREFIX: Final = "ezflow-ring-"
NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
FILE_RE: Final = re.compile(r"ezflow-ring-[A-Za-z0-9_-]{1,64}")

MAGIC: Final = int.from_bytes(b"EZRING1\0", "little")
MAJOR: Final = 1
MINOR: Final = 1  # 1: the writer keeps scan_count (OFF_SCAN_COUNT)
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
OFF_SCAN_COUNT: Final = 336  # (v1.1) odd while the writer scans the reader table
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


def lock_byte(fd: int, offset: int) -> bool:
    """Take an OFD write lock on byte *offset* without waiting; false if held elsewhere."""
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, _FLOCK.pack(_F_WRLCK, os.SEEK_SET, offset, 1, 0))
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def locked_elsewhere(fd: int, offset: int) -> bool:
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


class RingFile:
    """One open ring file and its header bytes as read at the open: made by
    :func:`open_ring_file`, closed by :meth:`close` (or ``with``)."""

    def __init__(  # noqa: PLR0917 - made in one place, open_ring_file
        self, path: str, fd: int, size: int, mode: int, inode: int, head: bytes
    ) -> None:
        self.path = path
        #: the descriptor (owned: :meth:`close` or :meth:`detach`)
        self.fd = fd
        self.size = size
        self.mode = mode
        self.inode = inode
        #: the first ``HEADER_SIZE`` bytes of the file (fewer for a shorter file)
        self.head = head

    @property
    def initialised(self) -> bool:
        """Whether the writer has finished creating it (its magic word is set)."""
        return self.size > 0 and _WORD.unpack_from(self.head.ljust(8, b"\0"))[0] != 0

    @property
    def closed(self) -> bool:
        """Whether its writer set ``CLOSED`` (as of the open)."""
        return len(self.head) >= OFF_FLAGS + 8 and bool(
            _WORD.unpack_from(self.head, OFF_FLAGS)[0] & FLAG_CLOSED
        )

    def header(self) -> RingHeader:
        """The parsed header; raises :class:`ProtocolError` as :meth:`RingHeader.parse`."""
        return RingHeader.parse(self.head, self.size)

    def writer_alive(self) -> bool:
        """Whether the header names a process that runs with that start time (a
        process-table look; see :meth:`writer_locked` for the lock)."""
        if len(self.head) < _HEADER.size:
            return False
        fields = _HEADER.unpack_from(self.head)
        return bool(fields[0] == MAGIC and owner_alive(fields[12], fields[14]))

    def writer_locked(self) -> bool:
        """Whether someone holds the writer's liveness lock (byte 0) now."""
        return locked_elsewhere(self.fd, 0)

    def stats(self, header: RingHeader) -> RingStats:
        """The writer's counters as of the open, with the reader entries active now (a
        moment's snapshot, for telemetry)."""
        table = os.pread(self.fd, header.max_readers * READER_ENTRY_SIZE, header.reader_table)
        live = sum(
            _WORD.unpack_from(table, i * READER_ENTRY_SIZE)[0] & 0xFFFFFFFF == STATE_ACTIVE
            for i in range(len(table) // READER_ENTRY_SIZE)
        )
        return RingStats(
            _WORD.unpack_from(self.head, OFF_WRITE_SEQ)[0],
            _WORD.unpack_from(self.head, OFF_DROPPED)[0],
            live,
            _WORD.unpack_from(self.head, OFF_RECLAIMED)[0],
        )

    def detach(self) -> int:
        """The descriptor, now the caller's to close."""
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RingFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_ring_file(
    path: str, *, writable: bool = False, uid: int | None = None, report: bool = False
) -> RingFile:
    """Open the ring file *path* safely (``_shmfiles.open_shm_file``: a regular file of
    *uid*, by default this process's user) and read its header.

    Raises ``FileNotFoundError`` when nothing has the name, :class:`RefusedShmFile` for
    an entry that is not such a file (with *report*, logged once as a WARNING), and
    :class:`BrokenResourceError` when it cannot be opened or read.
    """
    file = open_shm_file(path, writable=writable, min_size=0, uid=uid, report=report)
    try:
        head = os.pread(file.fd, HEADER_SIZE, 0)
        inode = os.fstat(file.fd).st_ino
    except OSError as error:
        os.close(file.fd)
        raise BrokenResourceError(f"cannot read ezring {path}: {error}") from error
    except BaseException:
        os.close(file.fd)
        raise
    return RingFile(path, file.fd, file.size, file.mode, inode, head)


class RingMapping:
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
    def create(cls, path: str, size: int) -> RingMapping:
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
                if not lock_byte(fd, 0):  # pragma: no cover - we just created it
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
    def open(cls, path: str) -> RingMapping | None:
        """Open and map the ring file *path* for a reader, or ``None`` while it is not
        ready (empty, or its header not written yet: the writer is starting).

        Only a regular file of this user is opened (see ``_shmfiles``), and only the
        ``segment_size`` bytes its header describes are mapped. Raises
        ``FileNotFoundError`` when there is no such file, :class:`RefusedShmFile` for an
        entry that is not one (logged once), :class:`ProtocolError` for a file that is not
        an ezring v1 ring, :class:`BrokenResourceError` when it cannot be opened.
        """
        file = open_ring_file(path, writable=True)
        try:
            header = file.header() if file.initialised else None
        except BaseException:
            file.close()
            raise
        if header is None:
            file.close()
            return None  # created, not initialised yet
        return cls(path, file.detach(), header.segment_size)

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


def read_ring_header(name: str) -> RingHeader:
    """The header of ring *name* now (one open, read and close; no reader entry).

    Raises :class:`BrokenResourceError` if the ring does not exist or cannot be read
    (its subclass ``RefusedShmFile`` for an entry of that name that is not a ring file
    of this user: a FIFO, a directory, a symbolic link, another user's file) and
    :class:`ProtocolError` if it is not an initialised ezring v1 ring.
    """
    path = ring_path(name)
    try:
        file = open_ring_file(path)
    except FileNotFoundError as error:
        raise BrokenResourceError(
            f"ezring {name} does not exist ({path}): start its writer first"
        ) from error
    except RefusedShmFile as error:
        raise RefusedShmFile(error.path, f"cannot read ezring {name}: {error.reason}") from error
    with file:
        return file.header()


def remove_ring_if_stale(path: str, *, report: bool = False) -> bool:
    """Remove the ring file *path* if its writer is dead; true if removed. Never raises.

    Dead means: the header names a process that no longer runs with that start time (or
    the header is not initialised, for ``EZRING_CREATE_GRACE`` since the file last
    changed: a writer takes its lock just after creating the file) *and* no one holds the
    writer's lock (byte 0). Only a
    regular file of this user is considered (opened with :func:`open_ring_file`,
    read-only: a FIFO, directory, symbolic link or another user's file is logged once and
    left alone; *report*: as a WARNING, see ``_shmfiles.refuse_entry``); a missing file
    is left alone too (false).
    """
    try:
        file = open_ring_file(path, report=report)
    except (OSError, EzflowError):
        return False
    try:
        if file.writer_alive() or file.writer_locked():
            return False
        if not file.initialised and time.time() - os.fstat(file.fd).st_mtime < EZRING_CREATE_GRACE:
            return False  # (its writer may not have taken the lock yet)
        os.unlink(path)
    except OSError:
        return False
    finally:
        file.close()
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


@dataclass(frozen=True, slots=True)
class LiveRing:
    """A live ring found by :func:`scan_rings`: its header and its counters then."""

    header: RingHeader
    stats: RingStats


def _live_ring(path: str, uid: int, report: bool) -> LiveRing | None:
    """The header and counters of the ring file *path* if it is a regular mode-0600 file of *uid*,
    an initialised ezring v1 ring, not closed, and its writer holds the liveness lock
    (byte 0); ``None`` otherwise (including a file gone meanwhile, or one being created).

    Only regular files of *uid* are opened (:func:`open_ring_file`: anything else under
    a ring's name is logged once and skipped), and a ring file that fails validation (a
    wrong magic or version, an impossible geometry, another mode than 0600) is logged
    once with its reason: it is never registered.
    """
    try:
        file = open_ring_file(path, uid=uid, report=report)
    except (OSError, EzflowError):  # gone, refused (logged), unreadable
        return None
    try:
        if not file.initialised:
            return None  # its writer is creating it
        try:
            header = file.header()
        except ProtocolError as error:
            refuse_entry(
                path, f"it is not a usable ezring v1 ring: {error}", file.inode, report=report
            )
            return None
        # Only our own user's rings: another user's producer must not inject into the graph.
        if stat.S_IMODE(file.mode) != 0o600:
            refuse_entry(
                path,
                f"its mode is {stat.S_IMODE(file.mode):o}, not 600: rings readable or "
                "writable by others are not registered by themselves (attach it with "
                "GraphContext.attach_ring if it is meant to be read)",
                file.inode,
                report=report,
            )
            return None
        if file.closed or not file.writer_locked():
            return None
        return LiveRing(header, file.stats(header))
    except (OSError, BrokenResourceError):
        return None
    finally:
        file.close()


def scan_rings(
    uid: int | None = None, directory: str | None = None, *, report: bool = False
) -> dict[str, LiveRing]:
    """The live rings in *directory* (default: the shm directory) owned by *uid*
    (default: this process's effective user), by ring name, with their headers and
    counters. Never raises for a ring that cannot be read: it is left out (a ring being
    created shows up at a later scan; one that fails validation is logged, as a WARNING
    once with *report*: see ``_shmfiles.refuse_entry``). Blocking file I/O: call it
    with ``asyncio.to_thread``."""
    uid = os.geteuid() if uid is None else uid
    try:
        directory = shm_dir() if directory is None else directory
        names = os.listdir(directory)
    except (OSError, EzflowError):
        return {}
    rings: dict[str, LiveRing] = {}
    for entry in names:
        if not entry.startswith(PREFIX):
            continue
        name = entry[len(PREFIX) :]
        if NAME_RE.fullmatch(name) is None:
            continue
        ring = _live_ring(os.path.join(directory, entry), uid, report)
        if ring is not None:
            rings[name] = ring
    return rings
