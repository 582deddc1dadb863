"""One publisher's shared memory (``_transports/_shm_outlet.py``): how a message's parts
are written into its block.

``_write_parts`` copies large parts with ``copy_into`` (the GIL released; streaming
stores with the C extension) and small ones by slice assignment: a differential test
pins both to the plain concatenation of the parts, and a thread is shown to run during
a large copy; a part of ``SHM_COPY_SPLIT_BYTES`` or more is copied on up to
``SHM_COPY_THREADS`` threads, never more than the CPUs the process may run on. Real shared memory (a
segment of the run's shm directory) throughout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezflow._core._config import SHM_COPY_NOGIL_BYTES, SHM_COPY_THREADS
from ezflow._transports import _shm_outlet
from ezflow._transports._segment import ShmSegment
from ezflow._transports._shm_outlet import _write_parts

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

BIG = SHM_COPY_NOGIL_BYTES
SEGMENT_SIZE = 4 * BIG + 4096


@pytest.fixture(scope="module")
def segment() -> Iterator[ShmSegment]:
    with ShmSegment.create(SEGMENT_SIZE, tag="parts", populate=True) as seg:
        yield seg


def _part(size: int, kind: str, fill: int) -> bytes | memoryview:
    """A part of *size* bytes as the codec hands them over: ``bytes``, or a byte view
    of an array's memory (1-D or not, any dtype)."""
    data = (np.arange(size, dtype=np.uint32) * 2654435761 + fill).astype(np.uint8)
    if kind == "bytes":
        return data.tobytes()
    if kind == "view" or not size or size % 8:
        return memoryview(data)
    # float32 frames, 2-D: the codec's part is the array's memory cast to bytes
    return memoryview(data.view(np.float32).reshape(2, -1)).cast("B")


_SIZES = st.one_of(
    st.integers(0, 300),
    st.sampled_from([BIG - 1, BIG, BIG + 1, BIG + 4096]),
)


@settings(max_examples=40, deadline=None)
@given(
    parts=st.lists(
        st.tuples(_SIZES, st.sampled_from(["bytes", "view", "array"]), st.integers(0, 255)),
        max_size=3,
    ),
    position=st.integers(0, 4096),
)
def test_parts_land_where_their_concatenation_would(
    segment: ShmSegment, parts: list[tuple[int, str, int]], position: int
) -> None:
    made = [_part(size, kind, fill) for size, kind, fill in parts]
    expected = b"".join(bytes(part) for part in made)
    buffer = segment.buffer
    buffer[: len(expected) + position + 1] = b"\xee" * (len(expected) + position + 1)
    _write_parts(buffer, position, made)
    assert bytes(buffer[position : position + len(expected)]) == expected
    # nothing before or after the parts was touched
    assert bytes(buffer[:position]) == b"\xee" * position
    assert buffer[position + len(expected)] == 0xEE


def test_a_large_copy_lets_other_threads_run(segment: ShmSegment) -> None:
    # With a switch interval longer than the test, a thread that wants the GIL gets it
    # while the main thread runs Python code only if the main thread gives it up: during
    # a large part's copy (numpy.copyto), not during a small one's (slice assignment).
    part = memoryview(np.ones(4 * BIG, dtype=np.uint8))
    small = memoryview(np.ones(BIG - 1, dtype=np.uint8))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        ran_during = []
        # small: a fixed number of copies (it never gives the GIL up, however long);
        # large: copies until the other thread ran, or 5 s (a busy machine may take a
        # while to give the woken thread a core)
        for piece, copies in ((small, 200), (part, None)):
            go, ran = threading.Event(), threading.Event()

            def other(go: threading.Event = go, ran: threading.Event = ran) -> None:
                go.wait(10.0)
                ran.set()

            thread = threading.Thread(target=other)
            thread.start()
            # Let it reach go.wait() (the GIL released): set() then only wakes it, and
            # the GIL stays with this thread until it gives it up.
            time.sleep(0.05)
            go.set()
            deadline, done = time.monotonic() + 5.0, 0
            while not ran.is_set() and done != copies and time.monotonic() < deadline:
                _write_parts(segment.buffer, 0, [piece])
                done += 1
            ran_during.append(ran.is_set())  # checked before anything blocks here
            thread.join(10.0)
            assert not thread.is_alive()
    finally:
        sys.setswitchinterval(interval)
    assert ran_during == [False, True]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity: Linux only")
def test_a_large_copy_uses_no_more_threads_than_the_cpus_the_process_may_run_on() -> None:
    """SHM_COPY_THREADS is a ceiling: a process pinned to one CPU copies on one thread
    (a helper there would only take turns with the publishing thread)."""
    script = (
        "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "from ezflow._transports import _shm_outlet; print(_shm_outlet._COPY_THREADS)"
    )
    pinned = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert pinned.stdout.strip() == "1"
    expected = min(SHM_COPY_THREADS, len(os.sched_getaffinity(0)))
    assert _shm_outlet._copy_threads() == expected
