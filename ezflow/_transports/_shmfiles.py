"""The shared-memory directory: where it is, how to open what others left there, whose
files are whose.

``/dev/shm`` is world-writable (mode 1777): any local user can put anything there under
a name ezflow uses - a FIFO, a directory, a socket, a symbolic link to another file, a
truncated or huge regular file, or a real segment of their own. Everything ezflow opens
there that it did not just create itself goes through :func:`open_shm_file`, which

* never follows a symbolic link (``O_NOFOLLOW``) and never blocks (``O_NONBLOCK``: a FIFO
  without a writer would otherwise hang the open);
* opens read-only first, ``fstat``\\s the descriptor and refuses anything but a regular
  file owned by this process's user, of at least the expected size (and at most the
  largest size the caller accepts);
* only then, if the caller needs to write, reopens the *same* file
  (``/proc/self/fd/N``: the inode already checked, not whatever the name points to now)
  read-write - so a file of another user is never opened for writing;
* raises :class:`RefusedShmFile` (a :class:`BrokenResourceError`, so shm users fall back
  to tcp) naming the file and what it is. The graph server's sweeps and scans *report*
  what they refuse: each entry logged once, as a WARNING, per server process (a bounded
  set: :data:`SHM_REFUSED_LOG_MAX`); everyone else logs at DEBUG level (a program with
  no server of its own does not repeat what its server says).

Nothing here removes files: the callers (the sweepers) remove only what they opened this
way, which is a regular file of our own user.

The directory is ``/dev/shm`` unless ``EZFLOW_SHM_DIR`` names another (a private tmpfs, a
container mount; the tests point it at a private directory). Every process of a graph
on one host must use the same one, the C writer of ``c/ezflow_ring.h`` included.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import sys
from dataclasses import dataclass

from .._core._config import SHM_REFUSED_LOG_MAX, shm_dir_from_env
from .._core._exceptions import BrokenResourceError

__all__ = [
    "RefusedShmFile",
    "ShmFile",
    "describe_entry",
    "open_shm_file",
    "owner_alive",
    "process_start",
    "refuse_entry",
    "shm_dir",
    "shm_path",
]

log = logging.getLogger("ezflow.shm")

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def shm_dir() -> str:
    """The shared-memory directory of this process now: ``EZFLOW_SHM_DIR``, else
    ``/dev/shm``. Raises :class:`~ezflow.ConfigurationError` for a relative path."""
    return shm_dir_from_env()


def shm_path(name: str) -> str:
    """The path of entry *name* (already checked by the caller) in :func:`shm_dir`."""
    return os.path.join(shm_dir_from_env(), name)


class RefusedShmFile(BrokenResourceError):
    """An entry of the shm directory is not a file ezflow may use: not a regular file,
    another user's, a symbolic link, too small or too large. :attr:`reason` says which."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ShmFile:
    """A checked, open file of the shm directory: the caller closes :attr:`fd`."""

    fd: int
    size: int
    mode: int


def describe_entry(path: str) -> str:
    """What the entry *path* is, for a message ("a FIFO", "a directory", "a symbolic
    link", ...). Only for messages: the answer may be stale by the time it is read."""
    try:
        info = os.lstat(path)
    except OSError as error:
        return f"unreadable ({error.strerror})"
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    for check, kind in kinds:
        if check(info.st_mode):
            return kind
    return "a regular file"


# Entries refused and logged already (path, inode, reason): each is logged once.
_logged: set[tuple[str, int, str]] = set()
_logged_full = False


def refuse_entry(path: str, reason: str, inode: int = 0, *, report: bool = False) -> RefusedShmFile:
    """The error for entry *path* (inode *inode*) refused for *reason* (a sentence: "it
    is a FIFO, ..."). With *report* (the graph server's sweeps and scans: the one
    process that speaks for the shm directory) it is logged as a WARNING the first time
    this process refuses that entry for that reason (at most
    :data:`SHM_REFUSED_LOG_MAX` entries are remembered; then one line says further
    ones are not logged); otherwise at DEBUG level - the caller raises the error, or
    another process reports the entry."""
    global _logged_full
    key = (path, inode, reason)
    if not report:
        log.debug("ignoring %s: %s", path, reason)
    elif key not in _logged:
        if len(_logged) < SHM_REFUSED_LOG_MAX:
            _logged.add(key)
            log.warning("ignoring %s: %s", path, reason)
        elif not _logged_full:
            _logged_full = True
            log.warning(
                "more than %d entries of the shm directory were refused; further ones are"
                " not logged (SHM_REFUSED_LOG_MAX)",
                SHM_REFUSED_LOG_MAX,
            )
    return RefusedShmFile(path, reason)


def _foreign(what: str) -> str:
    return (
        f"it is {what}, not a file ezflow made (ezflow never writes or removes it; remove"
        " it if it is yours)"
    )


def _others(owner: int, expected: int) -> str:
    return (
        f"it belongs to uid {owner}, not to this process's uid {expected} (another user's"
        " files are never written or removed)"
    )


def open_shm_file(
    path: str,
    *,
    writable: bool = False,
    min_size: int = 1,
    max_size: int | None = None,
    uid: int | None = None,
    report: bool = False,
) -> ShmFile:
    """Open the existing entry *path* of the shm directory safely (see the module).

    The file must be a regular file owned by *uid* (default: this process's effective
    user) of *min_size* to *max_size* bytes. Opened read-only unless *writable*; the
    descriptor is close-on-exec and non-blocking (which changes nothing for a regular
    file). The caller owns :attr:`ShmFile.fd`.

    Raises ``FileNotFoundError`` when nothing has the name (gone, or not created yet),
    :class:`RefusedShmFile` for an entry that is not such a file (with *report*, logged
    once per entry: see :func:`refuse_entry`), and :class:`BrokenResourceError` for any
    other OS error (``__cause__``), e.g. no permission.
    """
    if not sys.platform.startswith("linux"):
        raise BrokenResourceError(f"shared memory needs Linux, this is {sys.platform}")
    expected_uid = os.geteuid() if uid is None else uid
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise refuse_entry(path, _foreign(describe_entry(path)), report=report) from error
        if error.errno == errno.EACCES:
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if info.st_uid != expected_uid:
                    refused = refuse_entry(
                        path, _others(info.st_uid, expected_uid), info.st_ino, report=report
                    )
                    raise refused from error
        raise BrokenResourceError(f"cannot open {path}: {error}") from error
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse_entry(path, _foreign(describe_entry(path)), info.st_ino, report=report)
        if info.st_uid != expected_uid:
            raise refuse_entry(path, _others(info.st_uid, expected_uid), info.st_ino, report=report)
        if info.st_size < min_size:
            raise refuse_entry(
                path,
                f"it is {info.st_size} bytes, fewer than the {min_size} expected",
                info.st_ino,
                report=report,
            )
        if max_size is not None and info.st_size > max_size:
            raise refuse_entry(
                path,
                f"it is {info.st_size} bytes, more than the {max_size} expected",
                info.st_ino,
                report=report,
            )
        if writable:
            # The inode just checked, whatever the name points to by now.
            try:
                rw = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as error:
                raise BrokenResourceError(f"cannot open {path} for writing: {error}") from error
            os.close(fd)
            fd = rw
    except BaseException:
        os.close(fd)
        raise
    return ShmFile(fd, info.st_size, info.st_mode)


def process_start(pid: int | str) -> tuple[str, int] | None:
    """``(state, starttime)`` of process *pid* from ``/proc/<pid>/stat``, or ``None`` if
    there is no such process (or it is not visible to us)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:  # ENOENT/ESRCH: gone; EACCES: hidden (hidepid) - the lock decides
        return None
    # comm (field 2) may contain spaces and ")", so split after the *last* ")".
    fields = text.rpartition(b")")[2].split()
    try:
        # fields[0] is field 3 (state), so field 22 (starttime) is fields[19].
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (IndexError, ValueError):  # pragma: no cover - not a Linux /proc
        return None


def owner_alive(pid: int | str, start: int) -> bool:
    """Whether process *pid* runs and started at *start* (clock ticks after boot): not
    gone, not a zombie, not a later process that reuses the pid."""
    process = process_start(pid)
    return process is not None and process[0] not in "ZX" and process[1] == start
