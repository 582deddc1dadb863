"""The suite's own leak check (tests/conftest.py): which shm entries count as leaks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import SHM_DIR, ezflow_segments, leaked_segments

from ezflow._transports._shmfiles import process_start


@pytest.fixture
def made() -> Iterator[list[str]]:
    """Names of empty files the test makes in the shm directory, removed after it."""
    names: list[str] = []
    yield names
    for name in names:
        os.unlink(os.path.join(SHM_DIR, name))


def _make(made: list[str], name: str) -> str:
    with open(os.path.join(SHM_DIR, name), "wb"):
        made.append(name)
    return name


def test_a_segment_is_a_leak_unless_its_maker_still_runs(made: list[str]) -> None:
    before = ezflow_segments()
    own = process_start("self")
    assert own is not None
    waiting = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    with subprocess.Popen(waiting, stdin=subprocess.PIPE) as other:
        other_start = process_start(other.pid)
        assert other_start is not None
        mine = _make(made, f"ezflow-{os.getpid()}-{own[1]}-{'0' * 16}")
        alive = _make(made, f"ezflow-{other.pid}-{other_start[1]}-{'1' * 16}-tag")
        # The same pid with another start time: a process that reuses the pid of the
        # maker, which has gone.
        reused = _make(made, f"ezflow-{other.pid}-{other_start[1] + 1}-{'2' * 16}")
        assert leaked_segments(before) == {mine, reused}
        assert other.stdin is not None
        other.stdin.close()
    gone = {mine, alive, reused}
    assert leaked_segments(before) == gone
    assert leaked_segments(before | gone) == set()
    made.clear()
    for name in gone:
        os.unlink(os.path.join(SHM_DIR, name))


def test_a_name_no_ezflow_code_makes_and_a_ring_without_a_header_are_leaks(
    made: list[str],
) -> None:
    before = ezflow_segments()
    odd = _make(made, "ezflow-not-a-segment")
    ring = _make(made, "ezflow-ring-unwritten")
    assert leaked_segments(before) == {odd, ring}
