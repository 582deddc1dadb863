"""Shared-memory files a framework's worker processes leave behind, removed after a cell.

Some frameworks remove their shared-memory segments in exit handlers that a Python
process does not always run: Zenoh's ``*.zenoh`` segments outlive the zenoh-python
process that made them (eclipse-zenoh/zenoh#2787), 64 MiB and more per shm cell of
``ezflow perf peers``, so a long run would fill /dev/shm. A framework names the patterns
of such files (:attr:`._worker.Framework.leftovers`, sent in its ``info`` event); the
runner takes a :func:`snapshot` of them before each cell and, once the cell's workers
are gone, :func:`sweep` removes the matching files that

1. were not there before the cell (a file that was is someone else's, or in use),
2. are regular files owned by this user (not a symlink, FIFO or directory, not another
   user's), and
3. no running process has open or mapped (``/proc/*/fd``, ``/proc/*/maps``): a segment
   a live program - the user's own Zenoh application - uses is never touched.

Everything else stays; a file that cannot be checked or removed is left and reported.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["SHM_DIR", "Swept", "in_use", "snapshot", "sweep"]

#: Where POSIX shared memory (shm_open) lives on Linux.
SHM_DIR: Final = Path("/dev/shm")


@dataclass(frozen=True, slots=True)
class Swept:
    """What one :func:`sweep` did: the files it removed (name, bytes) and those it
    left although they matched and were new (name, why)."""

    removed: tuple[tuple[str, int], ...] = ()
    kept: tuple[tuple[str, str], ...] = ()

    @property
    def removed_bytes(self) -> int:
        return sum(size for _, size in self.removed)


def _matching(patterns: Iterable[str], directory: Path) -> set[str]:
    patterns = tuple(patterns)
    if not patterns:
        return set()
    try:
        names = os.listdir(directory)
    except OSError:  # (no such directory: nothing was left there)
        return set()
    return {name for name in names if any(fnmatch.fnmatchcase(name, p) for p in patterns)}


def snapshot(patterns: Iterable[str], directory: Path = SHM_DIR) -> frozenset[str]:
    """The names in *directory* that match *patterns* now."""
    return frozenset(_matching(patterns, directory))


def in_use(paths: Iterable[Path]) -> set[Path]:
    """Those of *paths* that a running process has open (a file descriptor) or mapped
    (``/proc/PID/maps``), as far as this user can see. Processes that end while they
    are read are skipped."""
    wanted = {str(path): path for path in paths}
    found: set[Path] = set()
    if not wanted:
        return found
    try:
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return set(wanted.values())  # (cannot tell: treat all as in use)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    # (the path is the line's last field; a deleted one ends " (deleted)")
                    path = line.rstrip("\n").partition("/")[2]
                    if path and (hit := wanted.get("/" + path)) is not None:
                        found.add(hit)
        except OSError:
            pass
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (hit := wanted.get(target)) is not None:
                found.add(hit)
        if len(found) == len(wanted):
            break
    return found


def sweep(patterns: Iterable[str], before: frozenset[str], directory: Path = SHM_DIR) -> Swept:
    """Remove the files of *directory* matching *patterns* that are not in *before*,
    are regular files of this user and that no running process has open or mapped (see
    the module doc). Never raises for a file: what it could not remove is in
    :attr:`Swept.kept` with the reason."""
    new = sorted(_matching(patterns, directory) - before)
    candidates: dict[Path, int] = {}
    kept: list[tuple[str, str]] = []
    uid = os.geteuid()
    for name in new:
        path = directory / name
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue  # (its owner removed it meanwhile)
        except OSError as exc:
            kept.append((name, f"cannot stat it: {exc.strerror}"))
            continue
        if not stat.S_ISREG(info.st_mode):
            kept.append((name, "not a regular file"))
        elif info.st_uid != uid:
            kept.append((name, f"owned by uid {info.st_uid}"))
        else:
            candidates[path] = info.st_size
    busy = in_use(candidates)
    removed: list[tuple[str, int]] = []
    for path, size in candidates.items():
        if path in busy:
            kept.append((path.name, "a running process uses it"))
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            kept.append((path.name, f"cannot remove it: {exc.strerror}"))
            continue
        removed.append((path.name, size))
    return Swept(tuple(removed), tuple(kept))
