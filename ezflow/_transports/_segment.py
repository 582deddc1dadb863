"""Named POSIX shared-memory segments with crash-safe ownership (Linux).

This is the bottom layer of the shared-memory transport: it creates, maps, attaches to
and removes segments; what lives inside them (rings of slots) is built on top.

Ownership
    The process that creates a segment (:meth:`ShmSegment.create`) *owns* it and is the
    only one that unlinks it. Other processes :meth:`~ShmSegment.attach` (read-only by
    default) and never unlink. A segment's name says who owns it::

        ezflow-<pid>-<starttime>-<16 hex digits>[-<tag>]

    where ``starttime`` is field 22 of ``/proc/<pid>/stat`` (clock ticks after boot), so
    a pid reused by a later process is not mistaken for the owner.

Crash safety
    An owner that exits normally unlinks what it still owns (``atexit``); one that
    crashes or is SIGKILLed leaves its segments in ``/dev/shm``, where they would hold
    RAM until reboot. :func:`sweep_stale_segments` removes those: a segment goes when its
    owner pid is gone, is a zombie, or belongs to a process with another start time.
    Because the pid in a name means nothing in another pid namespace (containers that
    share ``/dev/shm``, e.g. ``docker --ipc=host``), the owner also holds a ``flock`` on
    its segment from creation until it unlinks it, and the sweeper never removes a
    segment whose lock is held, whatever the pid says. The kernel drops the lock when
    the owner's descriptors and mappings are gone: a few milliseconds after its death
    (so a sweep right then may keep the segment; the next one removes it), or later if
    a child forked without exec still maps it.

Pre-faulting
    A fresh mapping of a segment costs one page fault per page touched (about 1.5 k for
    a 6 MB block, 6 k for a 24.9 MB frame): several milliseconds on the first write or
    read of a large block, paid inside whatever touched it. With ``populate=True``
    :meth:`ShmSegment.create` maps with ``MAP_POPULATE`` and :meth:`ShmSegment.attach`
    asks for ``MADV_POPULATE_READ`` (Linux 5.14+; ignored where the kernel lacks it), so
    the page tables are filled once, in bulk, when the segment is made or first mapped:
    measured on the reference machine, the first read of a freshly attached 24.9 MB
    segment went from 5.5 ms to 1.4 ms (mapping included), the first write into a new one
    from 11.4 ms to 8.4 ms (creation included). The shm transport populates every segment
    it makes or maps; a segment used by a few pages only would not be worth it.

Errors
    OS errors are translated here: a segment that has gone raises
    :class:`BrokenResourceError` ("its publisher has gone"); no permission, no space, no
    memory or no ``/dev/shm`` raises :class:`BrokenResourceError` saying shared memory is
    unavailable, so the caller falls back to tcp. The OS error is ``__cause__``.

Only Linux is supported (``/dev/shm`` and ``/proc``); elsewhere :func:`shm_available`
is false and :meth:`ShmSegment.create` / :meth:`ShmSegment.attach` raise
:class:`BrokenResourceError`.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import logging
import mmap
import os
import re
import secrets
import sys
import warnings
import weakref
from types import TracebackType
from typing import Final

from .._core._exceptions import (
    BrokenResourceError,
    ClosedResourceError,
    ConfigurationError,
    EzflowError,
)
from ._shmfiles import open_shm_file, owner_alive, process_start, shm_dir, shm_path

__all__ = ["ShmSegment", "shm_available", "sweep_stale_segments"]

log = logging.getLogger("ezflow.shm")

# Named POSIX shared memory lives in the shm directory (/dev/shm, or EZFLOW_SHM_DIR; see
# _shmfiles). We open files there with os.open rather than using
# multiprocessing.shared_memory.SharedMemory: before Python 3.13 that class registers
# every segment it touches - attached ones included - with the resource_tracker, which
# unlinks them when the *attaching* process exits and warns about "leaked" segments,
# while here exactly one process (the creator) owns cleanup. glibc's shm_open is itself
# open("/dev/shm/<name>", O_NOFOLLOW | O_CLOEXEC | ...), so C readers using
# shm_open("/<name>") see the same segments (in /dev/shm).

_PREFIX: Final = "ezflow-"
_TOKEN_BYTES: Final = 8  # 16 hex digits
_MAX_TAG_LENGTH: Final = 64
_TAG = re.compile(rf"[A-Za-z0-9_-]{{1,{_MAX_TAG_LENGTH}}}")
# Anchored with fullmatch, so no trailing newline, no "/", no ".." can slip through.
_NAME = re.compile(
    r"ezflow-(?P<pid>[1-9][0-9]{0,9})-(?P<start>[0-9]{1,20})-(?P<token>[0-9a-f]{16})"
    rf"(?:-(?P<tag>[A-Za-z0-9_-]{{1,{_MAX_TAG_LENGTH}}}))?"
)
_NAME_FORMAT: Final = "ezflow-<pid>-<starttime>-<16 hex digits>[-<tag>]"

# Tries at a fresh random name if one already exists (practically never: 64 random bits
# next to our own pid and start time).
_CREATE_ATTEMPTS: Final = 8

# mmap flag that fills the page tables at mapping time (Linux); 0 where there is none.
_MAP_POPULATE: Final = getattr(mmap, "MAP_POPULATE", 0)
# madvise(2) advice that faults a mapping in for reading (Linux 5.14+; not in Python's
# mmap module before 3.13, hence the number). Older kernels answer EINVAL: no pre-fault.
_MADV_POPULATE_READ: Final = getattr(mmap, "MADV_POPULATE_READ", 22)


def _populate_for_reading(mapping: mmap.mmap) -> None:
    """Fault *mapping* in for reading now, if the kernel can (see Pre-faulting)."""
    # An older kernel (EINVAL), or no madvise here: pages fault in on first use, as always.
    with contextlib.suppress(OSError, ValueError, AttributeError):
        mapping.madvise(_MADV_POPULATE_READ)


def _unavailable(what: str, error: BaseException | None = None) -> BrokenResourceError:
    reason = f": {error}" if error is not None else ""
    return BrokenResourceError(
        f"shared memory is unavailable ({what}{reason}); use the tcp transport for this edge"
    )


def _require_linux() -> None:
    if not sys.platform.startswith("linux"):
        raise _unavailable(f"the shm transport needs Linux, this is {sys.platform}")


@functools.lru_cache(maxsize=4)
def _own_start(pid: int) -> int:
    # Keyed by pid, so a forked child does not reuse its parent's start time.
    found = process_start("self")
    if found is None:
        raise _unavailable("cannot read /proc/self/stat to name the segment")
    return found[1]


if sys.platform.startswith("linux"):
    # Read once at import, so that naming a segment never waits on /proc in a loop.
    with contextlib.suppress(BrokenResourceError):
        _own_start(os.getpid())


def _new_token() -> str:
    return secrets.token_hex(_TOKEN_BYTES)


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise ConfigurationError(
            f"shared-memory segment size={size!r} must be an int (a number of bytes)"
        )
    if not 0 < size <= sys.maxsize:
        raise ConfigurationError(
            f"shared-memory segment size={size!r} must be a positive number of bytes"
            f" (at most {sys.maxsize})"
        )
    return size


def _check_tag(tag: str) -> str:
    if not isinstance(tag, str) or (tag and _TAG.fullmatch(tag) is None):
        raise ConfigurationError(
            f"shared-memory segment tag={tag!r} must be empty or 1 to {_MAX_TAG_LENGTH}"
            " characters from A-Z, a-z, 0-9, '_' and '-'"
        )
    return tag


def _check_name(name: str) -> re.Match[str]:
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"{name!r} is not an ezflow shared-memory segment name ({_NAME_FORMAT})")
    return match


def _try_lock(fd: int) -> bool:
    """Take an exclusive ``flock`` on *fd* without waiting; false if someone holds one."""
    import fcntl  # noqa: PLC0415 - POSIX only; the module itself imports everywhere

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class ShmSegment:
    """A named POSIX shared-memory segment mapped into this process.

    Make one with :meth:`create` (this process owns it and must :meth:`unlink` it) or
    :meth:`attach` (someone else owns it; this process never unlinks it). Used as a
    context manager, it is closed on exit and, for the owner, unlinked.

    Not thread-safe; use it from one thread (the event loop's).
    """

    def __init__(
        self,
        name: str,
        size: int,
        mapping: mmap.mmap,
        *,
        owner: bool,
        writable: bool,
        lock_fd: int | None = None,
        path: str = "",
    ) -> None:
        """Private: use :meth:`create` or :meth:`attach`."""
        self._name = name
        # Where it was made or found (the shm directory may be set differently later).
        self._path = path or shm_path(name)
        self._size = size
        self._mmap: mmap.mmap | None = mapping
        view = memoryview(mapping)
        # A read-only attachment is mapped PROT_READ and exported read-only, so a write
        # raises TypeError instead of killing the process with SIGSEGV.
        self._view: memoryview | None = view if writable else view.toreadonly()
        self._owner_pid = os.getpid() if owner else None
        # The owner keeps one descriptor open holding an exclusive flock until unlink():
        # the kernel drops it when the owner dies, which is what the sweeper checks last.
        # (So an owned segment costs two descriptors: this one and mmap's duplicate.)
        self._lock_fd = lock_fd
        self._unlinked = False
        if owner:
            _owned.add(self)

    # -- construction -------------------------------------------------------------

    @classmethod
    def create(cls, size: int, *, tag: str = "", populate: bool = False) -> ShmSegment:
        """Create, size and map (read-write) a new segment owned by this process.

        The name is ``ezflow-<pid>-<starttime>-<16 random hex digits>[-<tag>]``; it is
        created exclusively (``O_CREAT | O_EXCL``, mode ``0o600``), so an existing file
        is never reused. *size* bytes are reserved in ``/dev/shm`` up front, so running
        out of space is reported here and not as a ``SIGBUS`` on the first write; the
        memory reads as zeros.

        *populate*: fill the mapping's page tables now (``MAP_POPULATE``), so that the
        first write costs no page faults (see the module, Pre-faulting).

        The caller owns the segment and must :meth:`unlink` it (or use ``with``).
        Segments still owned when the process exits normally are unlinked then; those
        of a process that crashed are removed by :func:`sweep_stale_segments`.

        Raises :class:`ConfigurationError` (a ``ValueError``) for a *size* that is not a
        positive int or a *tag* outside ``[A-Za-z0-9_-]{1,64}``, and
        :class:`BrokenResourceError` if shared memory is unavailable (not Linux, no
        ``/dev/shm``, no permission, not enough space or memory) - the caller should
        use tcp.
        """
        _check_size(size)
        _check_tag(tag)
        _require_linux()
        pid = os.getpid()
        prefix = f"{_PREFIX}{pid}-{_own_start(pid)}-"
        suffix = f"-{tag}" if tag else ""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        directory = shm_dir()
        for _ in range(_CREATE_ATTEMPTS):
            name = prefix + _new_token() + suffix
            path = os.path.join(directory, name)
            try:
                fd = os.open(path, flags, 0o600)
            except FileExistsError:
                continue
            except OSError as error:
                raise _unavailable(f"cannot create {path}", error) from error
            break
        else:  # pragma: no cover - 8 collisions of 64 random bits
            raise BrokenResourceError(f"no free segment name after {_CREATE_ATTEMPTS} tries")

        try:
            # Lock before anything else can go wrong: from here on the segment is ours.
            _try_lock(fd)
            mapping = cls._size_and_map(fd, path, size, populate)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            os.close(fd)
            raise
        return cls(name, size, mapping, owner=True, writable=True, lock_fd=fd, path=path)

    @staticmethod
    def _size_and_map(fd: int, path: str, size: int, populate: bool) -> mmap.mmap:
        try:
            # posix_fallocate on tmpfs would first allocate all it can and only then
            # fail, so refuse a size the filesystem cannot hold without trying.
            fs = os.fstatvfs(fd)
            free = fs.f_bavail * fs.f_frsize
            if fs.f_blocks and size > free:
                raise OSError(errno.ENOSPC, f"{size} bytes requested, {free} free", path)
            os.ftruncate(fd, size)
            # ftruncate alone leaves a sparse file: pages are allocated on first touch,
            # and a full tmpfs then answers with SIGBUS. Reserve them now instead.
            os.posix_fallocate(fd, 0, size)
            flags = mmap.MAP_SHARED | (_MAP_POPULATE if populate else 0)
            return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as error:
            raise _unavailable(f"cannot size or map {path} to {size} bytes", error) from error
        except (OverflowError, ValueError) as error:
            raise ConfigurationError(
                f"shared-memory segment size={size!r} cannot be mapped: {error}"
            ) from error

    @classmethod
    def attach(cls, name: str, *, writable: bool = False, populate: bool = False) -> ShmSegment:
        """Map the existing segment *name* (as made by :meth:`create` elsewhere).

        The mapping is read-only (``PROT_READ``; :attr:`buffer` is a read-only
        memoryview) unless *writable*. It covers the whole segment as it is now. An
        attachment never unlinks the segment; :meth:`close` only unmaps it.
        *populate*: fault the whole mapping in for reading now, where the kernel can
        (``MADV_POPULATE_READ``), so that the first read of it costs no page faults
        (see the module, Pre-faulting).

        *name* is checked against ``ezflow-<pid>-<starttime>-<16 hex>[-<tag>]`` before
        the filesystem is touched: anything else (paths, ``..``, a leading ``/``,
        trailing whitespace) raises ``ValueError``. Raises :class:`BrokenResourceError`
        when the segment no longer exists (its publisher has gone), is empty, or when
        shared memory is unavailable (permission, memory; the caller should use tcp).
        """
        _check_name(name)
        _require_linux()
        path = shm_path(name)
        try:
            # A regular file of our own user, not empty (what create() made); a FIFO,
            # directory, symlink or another user's file under this name is refused.
            file = open_shm_file(path, writable=writable, min_size=1)
        except FileNotFoundError as error:
            raise BrokenResourceError(
                f"segment {name} no longer exists: its publisher has gone"
            ) from error
        except BrokenResourceError as error:
            # (The OS error, when there is one, is the cause callers look at.)
            cause = error.__cause__ if isinstance(error.__cause__, OSError) else error
            raise _unavailable(f"cannot use {path}", error) from cause
        fd, size = file.fd, file.size
        try:
            try:
                if writable:
                    mapping = mmap.mmap(
                        fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
                    )
                else:
                    # ACCESS_READ is MAP_SHARED + PROT_READ *and* a read-only buffer;
                    # prot=PROT_READ alone would export a "writable" buffer that
                    # segfaults when written.
                    mapping = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            except OSError as error:
                raise _unavailable(f"cannot map {path}", error) from error
        finally:
            # mmap keeps its own duplicate of the descriptor; ours is not needed.
            os.close(fd)
        if populate:
            _populate_for_reading(mapping)
        return cls(name, size, mapping, owner=False, writable=writable, path=path)

    # -- properties ---------------------------------------------------------------

    @property
    def name(self) -> str:
        """The segment's name in ``/dev/shm`` (no leading ``/``); send it to peers."""
        return self._name

    @property
    def size(self) -> int:
        """Bytes mapped (the whole segment)."""
        return self._size

    @property
    def owner(self) -> bool:
        """True in the process that created the segment (not in a forked child)."""
        return self._owner_pid is not None and self._owner_pid == os.getpid()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (the mapping may outlive it, see there)."""
        return self._view is None

    @property
    def buffer(self) -> memoryview:
        """The whole mapping as a memoryview of bytes (read-only for a read-only
        attachment). Raises :class:`ClosedResourceError` after :meth:`close`."""
        if self._view is None:
            raise ClosedResourceError(f"segment {self._name} is closed")
        return self._view

    # -- teardown -----------------------------------------------------------------

    def close(self) -> None:
        """Stop using the mapping; idempotent. Does not unlink (see :meth:`unlink`).

        If views of :attr:`buffer` still exist (memoryview slices, numpy arrays), the
        memory cannot be unmapped yet without making them dangle. ``close`` then does not
        raise: it drops this object's references, and the mapping is unmapped by the
        last view itself when it is released or garbage-collected (the views keep the
        mmap object alive). Either way :attr:`buffer` raises from now on.
        """
        view, mapping = self._view, self._mmap
        self._view = self._mmap = None
        if mapping is None:
            return
        assert view is not None
        try:
            view.release()
            mapping.close()
        except BufferError:
            # Exported views remain: they hold the mmap object, whose deallocation
            # unmaps it. Nothing to keep here.
            log.debug("segment %s closed with live views; unmapped when they go", self._name)

    def unlink(self) -> None:
        """Remove the segment's name (owner only); idempotent.

        Processes that have it mapped keep their mapping; nobody new can attach. A
        missing file (removed by someone else) is not an error, and the name is removed
        at most once. Raises ``RuntimeError`` in a process that does not own it.
        """
        if not self.owner:
            raise RuntimeError(
                f"segment {self._name} is not owned by this process: only its creator unlinks it"
            )
        if self._unlinked:
            return
        self._unlinked = True
        _owned.discard(self)
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        except OSError as error:  # pragma: no cover - we created it, with this dir
            log.warning("cannot remove shared-memory segment %s: %s", self._name, error)
        self._release_lock()  # only now: the name is gone, nothing left to guard

    def _release_lock(self) -> None:
        # Held from create() until the name is removed: while the name exists, a sweeper
        # in another pid namespace must see the segment as owned.
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            os.close(fd)

    def __enter__(self) -> ShmSegment:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.owner:
                self.unlink()
        finally:
            self.close()

    def __del__(self) -> None:
        # An owner dropped without unlink(): remove the name (it would hold RAM until a
        # sweep after our death), then warn as an unclosed file would.
        if getattr(self, "_unlinked", True):
            return
        if not self.owner:  # a forked child's copy: close our inherited descriptor only
            self._release_lock()
            return
        self.unlink()
        warnings.warn(
            f"shared-memory segment {self._name} was never unlinked; unlinked when"
            " garbage-collected",
            ResourceWarning,
            stacklevel=1,
            source=self,
        )

    def __repr__(self) -> str:
        role = "owner" if self.owner else "attached"
        state = " closed" if self.closed else ""
        return f"<ShmSegment {self._name} {self._size} bytes {role}{state}>"


# Segments this process owns and has not unlinked; unlinked at normal interpreter exit.
_owned: weakref.WeakSet[ShmSegment] = weakref.WeakSet()


@atexit.register
def _unlink_owned_at_exit() -> None:
    for segment in list(_owned):
        if segment.owner:  # not in a forked child: the parent still uses them
            segment.unlink()


def sweep_stale_segments(directory: str | None = None, *, report: bool = False) -> list[str]:
    """Remove the segments in *directory* (default: the shm directory) whose owner has
    died; return their names.

    A file is removed only if its name matches ``ezflow-<pid>-<starttime>-<16
    hex>[-<tag>]``, its owner is dead - no process *pid*, a zombie, or a process with
    another start time (pid reused) - it is a regular file of this user (opened as
    :func:`~ezflow._transports._shmfiles.open_shm_file` does: a FIFO, directory,
    symbolic link or another user's file is logged once and left alone), and no
    process holds the owner's lock on it (an owner in another pid namespace).
    Everything else is left alone. Files removed by a concurrent sweeper are skipped.
    Never raises: a missing *directory*, non-Linux and unreadable entries give fewer
    names, not an error. (ezring rings are swept by ``_ezring.sweep_stale_rings``.)
    *report*: log what is refused as a WARNING, once per entry (the graph server's
    sweeps; see ``_shmfiles.refuse_entry``).

    Cost: one directory listing, plus one ``/proc`` read per ezflow segment and one
    open per stale one; cheap enough at every server start and publisher creation.
    """
    if not sys.platform.startswith("linux"):
        return []
    try:
        directory = shm_dir() if directory is None else directory
        entries = os.listdir(directory)
    except (OSError, ConfigurationError):
        return []
    removed: list[str] = []
    alive: dict[tuple[str, str], bool] = {}
    for name in entries:
        match = _NAME.fullmatch(name)
        if match is None:
            continue
        key = (match["pid"], match["start"])
        if key not in alive:
            alive[key] = owner_alive(key[0], int(key[1]))
        if alive[key]:
            continue
        if _remove_if_unlocked(directory, name, report):
            removed.append(name)
    if removed:
        log.info("removed %d stale shared-memory segment(s): %s", len(removed), removed)
    return removed


def _remove_if_unlocked(directory: str, name: str, report: bool) -> bool:
    path = os.path.join(directory, name)
    try:
        # min_size=0: a creator that died between its open and its ftruncate left an
        # empty file, ours to remove like any other.
        file = open_shm_file(path, min_size=0, report=report)
    except (OSError, EzflowError):  # gone (another sweeper), refused (logged), unreadable
        return False
    try:
        if not _try_lock(file.fd):
            return False
        # Holding the lock: a live owner would hold it, and a concurrent sweeper that
        # got here first has unlinked the name (ENOENT below).
        try:
            os.unlink(path)
        except OSError:
            return False
        return True
    finally:
        os.close(file.fd)  # releases our lock


@functools.lru_cache(maxsize=1)
def shm_available() -> bool:
    """Whether this process can create and map a small segment now (cached).

    False when not on Linux, without ``/dev/shm``, or when creating fails for any
    reason (logged once at info level); the shm transport then falls back to tcp.
    """
    try:
        with ShmSegment.create(mmap.PAGESIZE, tag="probe") as segment:
            segment.buffer[0] = 1
    except (BrokenResourceError, OSError) as error:
        log.info("shared memory unavailable, shm edges will use tcp: %s", error)
        return False
    return True
