"""The loop of ``Channel.deliver_run`` (ezflow/_core/_channel_run.py): the compiled twin
(``_speedups.run_frames``) against ``run_frames_py``. Channel-level behaviour (a run is
``deliver_body`` frame by frame) is pinned in tests/test_channel.py."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezflow._core._channel_run import run_frames_py
from ezflow._core._compiled import SPEEDUPS
from ezflow._core._config import TIMING_SAMPLE_MASK

pytestmark = pytest.mark.skipif(SPEEDUPS is None, reason="the C extension is not built")

SIZE = 8
NOW = 10_000


class Stop(BaseException):
    """What a constructor may raise that is not an ``Exception`` (KeyboardInterrupt)."""


def decoder(refuse: set[bytes], stop: set[bytes]) -> Any:
    def decode(body: bytes) -> object:
        if body in stop:
            raise Stop(body)
        if body in refuse:
            return None
        return ("decoded", body)

    return decode


frame_strategy = st.tuples(
    st.integers(0, 40),  # frame end (unused by the loop)
    st.integers(0, 2**20),  # seq: one in TIMING_SAMPLE_MASK + 1 is timed
    st.binary(min_size=SIZE - 1, max_size=SIZE + 1),
    st.integers(0, 3),  # upstream drops
    st.one_of(st.just(0), st.integers(1, 2 * NOW)),  # sent_ns: 0, earlier, or later
)


class Clock:
    """A clock that reads *times* in turn, then times that grow by a different step each
    read (so that a read more or less changes every later duration), counting reads."""

    def __init__(self, times: list[int]) -> None:
        start = times[-1] if times else 0
        later = (start + 7 * k * k for k in itertools.count(1))
        self.readings = itertools.chain(times, later)
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return next(self.readings)


def run(  # noqa: PLR0917 - the cases' parameters, in the loop's order
    loop: Any,
    frames: list[tuple[int, int, bytes, int, int]],
    index: int,
    lossless: int,
    inboxes: int,
    refuse: set[bytes],
    stop: set[bytes],
    times: list[int] = [],  # noqa: B006 - read only
) -> tuple[object, list[Any], list[list[Any]], list[int], list[int], list[int]]:
    """One call of *loop*: what it returned or raised, the pending entries, the items of
    each inbox, the latency buckets, the progress, the decode buckets and clock reads."""
    pending: list[list[int]] = []
    items: list[list[Any]] = [[] for _ in range(inboxes)]
    appends = [(f"attachment-{k}", items[k].append) for k in range(inboxes)]
    buckets = [0] * 64
    decode_buckets = [0] * 64
    progress = [index, 0, 0]
    clock = Clock(times)
    try:
        outcome: object = loop(
            frames,
            index,
            SIZE,
            decoder(refuse, stop),
            1,
            lossless,
            pending.append,
            appends,
            buckets,
            NOW,
            TIMING_SAMPLE_MASK,
            progress,
            clock,
            decode_buckets,
        )
    except Stop as exc:
        outcome = ("stopped", exc.args)
    return outcome, pending, items, buckets, progress, [*decode_buckets, clock.reads]


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(frame_strategy, max_size=12),
    index=st.integers(0, 3),
    lossless=st.integers(0, 2),
    inboxes=st.integers(0, 3),
    times=st.lists(st.integers(0, 10**6), max_size=8),  # (a clock that may step back)
    data=st.data(),
)
def test_the_compiled_loop_is_its_python_twin(  # noqa: PLR0917 - hypothesis's arguments
    frames: list[tuple[int, int, bytes, int, int]],
    index: int,
    lossless: int,
    inboxes: int,
    times: list[int],
    data: st.DataObject,
) -> None:
    bodies = sorted({frame[2] for frame in frames})
    refuse = set(data.draw(st.lists(st.sampled_from(bodies), max_size=2))) if bodies else set()
    stop = set(data.draw(st.lists(st.sampled_from(bodies), max_size=1))) if bodies else set()
    index = min(index, len(frames))
    assert SPEEDUPS is not None
    compiled = run(SPEEDUPS.run_frames, frames, index, lossless, inboxes, refuse, stop, times)
    assert compiled == run(run_frames_py, frames, index, lossless, inboxes, refuse, stop, times)


def test_a_run_stops_at_each_kind_of_frame_it_leaves_to_the_general_path() -> None:
    """The explicit cases: a new upstream drop, another size, a body the layout refuses;
    latencies recorded, a negative one (two hosts' clocks) in bucket 0; an exception
    leaves the index reached and the latency and decode totals so far."""
    good = b"g" * SIZE
    cases: list[tuple[tuple[int, int, bytes, int, int], int]] = [
        ((0, 3, good, 2, 0), 1),  # a new upstream drop (upstream is 1)
        ((0, 3, b"short", 0, 0), 1),  # another size
        ((0, 3, b"r" * SIZE, 0, 0), 1),  # refused by the layout
    ]
    assert SPEEDUPS is not None
    for loop in (SPEEDUPS.run_frames, run_frames_py):
        for stopper, reached in cases:
            frames = [(0, 1, good, 1, NOW - 100), stopper, (0, 5, good, 0, 0)]
            outcome, pending, items, buckets, _, _ = run(
                loop, frames, 0, 1, 1, {b"r" * SIZE}, set()
            )
            assert outcome == (reached, 100, 0), (loop, stopper)
            assert pending == [[1, 1, SIZE]] and items == [[("attachment-0", 1, ("decoded", good))]]
            assert buckets[(100).bit_length()] == 1 and sum(buckets) == 1
        timed = TIMING_SAMPLE_MASK + 1
        later = [(0, 1, good, 0, NOW + 5), (0, timed, good, 0, NOW - 7), (0, 3, b"s" * SIZE, 0, 0)]
        outcome, pending, items, buckets, progress, decoded = run(
            loop, later, 0, 0, 2, set(), {b"s" * SIZE}, [500, 800]
        )
        assert outcome == ("stopped", (b"s" * SIZE,)) and progress == [2, 7, 300]
        assert pending == [] and [len(i) for i in items] == [2, 2]
        assert buckets[0] == 1 and buckets[(7).bit_length()] == 1
        assert decoded[(300).bit_length()] == 1 and sum(decoded[:-1]) == 1 and decoded[-1] == 2


def test_the_compiled_loops_pending_entries_are_untracked_ints() -> None:
    """A lossless run's pending entries (one per message: ``[seq, count, size]``, ints
    only, now and when a release writes the count) are not tracked by the collector on
    the compiled loop: a subscriber's backlog of them is never walked. Equal to the
    twin's, and writable as the channel writes them."""
    import gc  # noqa: PLC0415

    good = b"g" * SIZE
    frames = [(0, seq, good, 0, 0) for seq in (1, 2, 3)]
    assert SPEEDUPS is not None
    _, pending, *_ = run(SPEEDUPS.run_frames, frames, 0, 2, 1, set(), set())
    _, twin, *_ = run(run_frames_py, frames, 0, 2, 1, set(), set())
    assert pending == twin == [[1, 2, SIZE], [2, 2, SIZE], [3, 2, SIZE]]
    assert not any(gc.is_tracked(entry) for entry in pending)
    pending[0][1] -= 1  # (Channel.release)
    assert pending[0] == [1, 1, SIZE] and not gc.is_tracked(pending[0])


def test_a_timed_frame_is_decoded_in_the_run_and_its_time_recorded_once() -> None:
    """One frame in TIMING_SAMPLE_MASK + 1 (by sequence number) has its decode timed, as
    Channel.deliver_body times it: a positive time in its bucket and the total, one that
    is not (the wall clock stepped back) nowhere; the run goes on past it."""
    good = b"g" * SIZE
    timed = 2 * (TIMING_SAMPLE_MASK + 1)
    frames = [(0, 1, good, 0, 0), (0, timed, good, 0, 0), (0, 3, good, 0, 0), (0, 0, good, 0, 0)]
    assert SPEEDUPS is not None
    for loop in (SPEEDUPS.run_frames, run_frames_py):
        # (seq 0 is timed too: its clock steps back, 900 -> 100)
        outcome, _, items, _, _, decoded = run(
            loop, frames, 0, 0, 1, set(), set(), [0, 1, 900, 100]
        )
        assert outcome == (4, 0, 1) and len(items[0]) == 4
        assert decoded[1] == 1 and sum(decoded[:-1]) == 1 and decoded[-1] == 4  # (1 ns counts)
