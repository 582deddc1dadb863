"""The loop of ``Channel.deliver_run``: a read's small frames decoded and queued, one
message after another, until the first that needs the general path.

:func:`run_frames_py` is the loop; ``_speedups.run_frames`` is its compiled twin, chosen
at import where the C extension is active (:data:`run_frames`). tests/test_channel.py
pins the two together: the same index reached, the same entries, items and histogram
buckets, the same progress on an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._compiled import SPEEDUPS

__all__ = ["RunFrames", "run_frames", "run_frames_py"]

#: ``run_frames(frames, index, size, decode, upstream, lossless, pending_append,
#: appends, buckets, now_ns, mask, progress, clock, decode_buckets) -> (index reached,
#: latency total, decode total)``
RunFrames = Callable[..., tuple[int, int, int]]


def run_frames_py(  # noqa: PLR0917 - the loop's state, passed once per read
    frames: list[tuple[int, int, bytes, int, int]],
    index: int,
    size: int,
    decode: Callable[[bytes], Any],
    upstream: int,
    lossless: int,
    pending_append: Callable[[list[int]], None],
    appends: list[tuple[Any, Callable[[tuple[Any, int, Any]], None]]],
    buckets: list[int],
    now_ns: int,
    mask: int,
    progress: list[int],
    clock: Callable[[], int],
    decode_buckets: list[int],
) -> tuple[int, int, int]:
    """Decode and queue ``frames[index:]`` - ``(frame end, seq, body, upstream drops,
    sent_ns)`` each - up to the first that reports a new upstream drop (``>
    upstream``), is not *size* bytes or does not *decode* (None); return the index of
    that frame (``len(frames)`` when none is), the sum of the latencies (``now_ns -
    sent_ns``) recorded in *buckets*, and the sum of the decode times recorded in
    *decode_buckets*. A timed frame (``not seq & mask``: one in ``mask + 1``) has its
    decode timed with *clock* (``time.time_ns``, as ``Channel.deliver_body`` times it;
    a time that is not positive, across a clock step, is not recorded). For each
    message: a pending entry ``[seq, lossless, size]`` when *lossless* (the count of
    lossless inboxes) is not 0, then ``(attachment, seq, message)`` handed to every
    ``append`` of *appends*. On an exception (a constructor that raises what is not an
    ``Exception``, a full memory) *progress* holds the index reached and the latency and
    decode totals so far, and the exception propagates. ``ValueError`` for a negative
    *index*."""
    if index < 0:
        raise ValueError("index must not be negative")
    latency_total = decode_total = 0
    end = len(frames)
    i = index
    try:
        while i < end:
            _, seq, body, drops, sent_ns = frames[i]
            if drops > upstream or len(body) != size:
                break
            if seq & mask:
                if (message := decode(body)) is None:
                    break
            else:  # (a timed one)
                started = clock()
                if (message := decode(body)) is None:
                    break
                decode_ns = clock() - started
                if decode_ns > 0:
                    decode_buckets[decode_ns.bit_length()] += 1
                    decode_total += decode_ns
            if lossless:
                pending_append([seq, lossless, size])
            for attachment, append in appends:
                append((attachment, seq, message))
            if sent_ns:
                latency_ns = now_ns - sent_ns
                if latency_ns > 0:
                    buckets[latency_ns.bit_length()] += 1
                    latency_total += latency_ns
                else:  # the clocks of two hosts disagree
                    buckets[0] += 1
            i += 1
    except BaseException:
        progress[:] = [i, latency_total, decode_total]
        raise
    return i, latency_total, decode_total


#: The loop of ``Channel.deliver_run``: the compiled twin where the C extension is
#: active, else :func:`run_frames_py`.
run_frames: RunFrames = run_frames_py if SPEEDUPS is None else SPEEDUPS.run_frames
