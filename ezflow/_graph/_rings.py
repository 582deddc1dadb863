"""Finding the ezring rings (docs/ezring.md) a graph server may register by itself.

:func:`scan_rings` does blocking file I/O: call it with ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass

from .._core._exceptions import BrokenResourceError, EzflowError, ProtocolError
from .._transports._ezring import (
    FLAG_CLOSED,
    HEADER_SIZE,
    NAME_RE,
    OFF_DROPPED,
    OFF_FLAGS,
    OFF_RECLAIMED,
    OFF_WRITE_SEQ,
    PREFIX,
    READER_ENTRY_SIZE,
    STATE_ACTIVE,
    RingHeader,
    RingStats,
    _locked_elsewhere,
)
from .._transports._shmfiles import open_shm_file, refuse_entry, shm_dir

__all__ = ["LiveRing", "scan_rings"]

_WORD = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class LiveRing:
    """A live ring found by :func:`scan_rings`: its header and its counters then."""

    header: RingHeader
    stats: RingStats


def _live_ring(path: str, uid: int, report: bool) -> LiveRing | None:
    """The header and counters of the ring file *path* if it is a regular mode-0600 file of *uid*,
    an initialised ezring v1 ring, not closed, and its writer holds the liveness lock
    (byte 0); ``None`` otherwise (including a file gone meanwhile, or one being created).

    Only regular files of *uid* are opened (``_shmfiles.open_shm_file``: anything else
    under a ring's name is logged once and skipped), and a ring file that fails
    validation (a wrong magic or version, an impossible geometry, another mode than
    0600) is logged once with its reason: it is never registered.
    """
    try:
        file = open_shm_file(path, min_size=0, uid=uid, report=report)
    except (OSError, EzflowError):  # gone, refused (logged), unreadable
        return None
    fd = file.fd
    try:
        head = os.pread(fd, HEADER_SIZE, 0)
        if file.size == 0 or _WORD.unpack_from(head.ljust(8, b"\0"))[0] == 0:
            return None  # its writer is creating it
        try:
            header = RingHeader.parse(head, file.size)
        except ProtocolError as error:
            info = os.fstat(fd)
            refuse_entry(
                path, f"it is not a usable ezring v1 ring: {error}", info.st_ino, report=report
            )
            return None
        # Only our own user's rings: another user's producer must not inject into the graph.
        if stat.S_IMODE(file.mode) != 0o600:
            info = os.fstat(fd)
            refuse_entry(
                path,
                f"its mode is {stat.S_IMODE(file.mode):o}, not 600: rings readable or "
                "writable by others are not registered by themselves (attach it with "
                "GraphContext.attach_ring if it is meant to be read)",
                info.st_ino,
                report=report,
            )
            return None
        if _WORD.unpack_from(head, OFF_FLAGS)[0] & FLAG_CLOSED:
            return None
        # The writer holds an OFD lock on byte 0 for as long as it lives.
        if not _locked_elsewhere(fd, 0):
            return None
        # Counters as the writer publishes them (a moment's snapshot, for telemetry).
        table = os.pread(fd, header.max_readers * READER_ENTRY_SIZE, header.reader_table)
        live = sum(
            _WORD.unpack_from(table, i * READER_ENTRY_SIZE)[0] & 0xFFFFFFFF == STATE_ACTIVE
            for i in range(len(table) // READER_ENTRY_SIZE)
        )
        stats = RingStats(
            _WORD.unpack_from(head, OFF_WRITE_SEQ)[0],
            _WORD.unpack_from(head, OFF_DROPPED)[0],
            live,
            _WORD.unpack_from(head, OFF_RECLAIMED)[0],
        )
        return LiveRing(header, stats)
    except (OSError, BrokenResourceError):
        return None
    finally:
        os.close(fd)


def scan_rings(
    uid: int | None = None, directory: str | None = None, *, report: bool = False
) -> dict[str, LiveRing]:
    """The live rings in *directory* (default: the shm directory) owned by *uid*
    (default: this process's effective user), by ring name, with their headers and
    counters. Never raises for a ring that cannot be read: it is left out (a ring being
    created shows up at a later scan; one that fails validation is logged, as a WARNING
    once with *report*: see ``_shmfiles.refuse_entry``)."""
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
