"""Finding the ezring rings (docs/ezring.md) a graph server may register by itself.

:func:`scan_rings` does blocking file I/O: call it with ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass

from .._core._exceptions import BrokenResourceError, ProtocolError
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
    SHM_DIR,
    STATE_ACTIVE,
    RingHeader,
    RingStats,
    _locked_elsewhere,
)

__all__ = ["LiveRing", "scan_rings"]

_WORD = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class LiveRing:
    """A live ring found by :func:`scan_rings`: its header and its counters then."""

    header: RingHeader
    stats: RingStats


def _live_ring(path: str, uid: int) -> LiveRing | None:
    """The header and counters of the ring file *path* if it is a regular mode-0600 file of *uid*,
    an initialised ezring v1 ring, not closed, and its writer holds the liveness lock
    (byte 0); ``None`` otherwise (including a file gone meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        # Only our own user's rings: another user's producer must not inject into the graph.
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != uid
            or stat.S_IMODE(info.st_mode) != 0o600
        ):
            return None
        head = os.pread(fd, HEADER_SIZE, 0)
        header = RingHeader.parse(head, info.st_size)
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
    except (OSError, ProtocolError, BrokenResourceError):
        return None
    finally:
        os.close(fd)


def scan_rings(uid: int | None = None, directory: str = SHM_DIR) -> dict[str, LiveRing]:
    """The live rings in *directory* owned by *uid* (default: this process's user), by
    ring name, with their headers and counters. Never raises for a ring that cannot be read: it is
    left out (a ring being created shows up at a later scan)."""
    uid = os.getuid() if uid is None else uid
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    rings: dict[str, LiveRing] = {}
    for entry in names:
        if not entry.startswith(PREFIX):
            continue
        name = entry[len(PREFIX) :]
        if NAME_RE.fullmatch(name) is None:
            continue
        ring = _live_ring(os.path.join(directory, entry), uid)
        if ring is not None:
            rings[name] = ring
    return rings
