"""ezflow/_perf/_leftovers.py: the files a peer's workers leave in /dev/shm, removed after
a cell - and only those: never a file that was there before, another user's, a link, a
FIFO, a directory, or one a running process has open or mapped."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ezflow._perf import _leftovers
from ezflow._perf._peers import _command

PATTERNS = ("*.zenoh",)

#: A child that opens PATH (and with "map", maps it and closes the descriptor), says
#: "ready" and waits for its stdin to close.
HOLDER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
if sys.argv[2] == "map":
    held = mmap.mmap(fd, 4096)
    os.close(fd)
print("ready", flush=True)
sys.stdin.read()
"""


def release(child: subprocess.Popen[str]) -> None:
    """Let a holder go (it exits once its stdin closes) and reap it."""
    if child.returncode is None:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(10)
        child.stdout.close()  # type: ignore[union-attr]


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for child in started:
            release(child)


def hold(path: Path, how: str, holders: list[subprocess.Popen[str]]) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    holders.append(child)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"


def test_only_new_unused_regular_files_of_this_user_are_removed(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    old = tmp_path / "old.zenoh"
    old.write_bytes(b"o" * 10)
    before = _leftovers.snapshot(PATTERNS, tmp_path)
    assert before == {"old.zenoh"}

    left = tmp_path / "1234.zenoh"
    left.write_bytes(b"x" * 5000)
    other = tmp_path / "unrelated.bin"  # (not a pattern of the framework)
    other.write_bytes(b"u")
    opened, mapped = tmp_path / "open.zenoh", tmp_path / "mapped.zenoh"
    for path in (opened, mapped):
        path.write_bytes(b"\0" * 4096)
    hold(opened, "open", holders)
    hold(mapped, "map", holders)
    precious = tmp_path / "precious"
    precious.write_bytes(b"keep me")
    (tmp_path / "link.zenoh").symlink_to(precious)
    (tmp_path / "dir.zenoh").mkdir()
    os.mkfifo(tmp_path / "fifo.zenoh")

    swept = _leftovers.sweep(PATTERNS, before, tmp_path)

    assert swept.removed == (("1234.zenoh", 5000),) and swept.removed_bytes == 5000
    assert dict(swept.kept) == {
        "open.zenoh": "a running process uses it",
        "mapped.zenoh": "a running process uses it",
        "link.zenoh": "not a regular file",
        "dir.zenoh": "not a regular file",
        "fifo.zenoh": "not a regular file",
    }
    assert not left.exists()
    for path in (old, other, opened, mapped, precious, tmp_path / "link.zenoh"):
        assert path.exists(), path
    assert precious.read_bytes() == b"keep me"


def test_a_file_freed_by_its_process_is_removed_at_the_next_sweep(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    before = _leftovers.snapshot(PATTERNS, tmp_path)
    segment = tmp_path / "9.zenoh"
    segment.write_bytes(b"\0" * 4096)
    hold(segment, "map", holders)
    assert [name for name, _ in _leftovers.sweep(PATTERNS, before, tmp_path).kept] == ["9.zenoh"]
    release(holders[0])
    assert _leftovers.sweep(PATTERNS, before, tmp_path).removed == (("9.zenoh", 4096),)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_file_is_left(tmp_path: Path) -> None:
    before = _leftovers.snapshot(PATTERNS, tmp_path)
    theirs = tmp_path / "theirs.zenoh"
    theirs.write_bytes(b"t")
    os.chown(theirs, 65534, 65534)
    swept = _leftovers.sweep(PATTERNS, before, tmp_path)
    assert swept.kept == (("theirs.zenoh", "owned by uid 65534"),) and theirs.exists()


def test_nothing_to_match_touches_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.zenoh").write_bytes(b"a")
    assert _leftovers.sweep((), frozenset(), tmp_path) == _leftovers.Swept()
    assert (tmp_path / "a.zenoh").exists()
    missing = tmp_path / "missing"
    assert _leftovers.snapshot(PATTERNS, missing) == frozenset()
    assert _leftovers.sweep(PATTERNS, frozenset(), missing) == _leftovers.Swept()


def test_the_peers_notes_say_what_was_removed_and_what_was_left() -> None:
    cell = {
        "framework": "zenoh-callback",
        "suite": "p2p",
        "transport": "shm",
        "size": 64,
        "clients": 1,
        "variant": None,
        "status": "ok",
        "reason": None,
        "swept": [{"name": "1.zenoh", "bytes": 67_108_864}, {"name": "2.zenoh", "bytes": 4096}],
        "unswept": [{"name": "3.zenoh", "why": "a running process uses it"}],
    }
    assert _command.notes({"cells": [cell]}) == [
        "zenoh-callback shm/64 B: removed 2 files its workers left in /dev/shm (67.1 MB)",
        "zenoh-callback shm/64 B: left /dev/shm/3.zenoh: a running process uses it",
    ]
