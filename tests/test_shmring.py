"""Shared-memory rings: leases, generations, out-of-line blocks, the byte budget, and
readers that release a block only when nothing in their process refers to it.

Real /dev/shm throughout, and a real child process for the cross-process test; the
autouse ``no_leaks`` fixture checks that every test removes what it made.
"""

from __future__ import annotations

import gc
import json
import logging
import mmap
import os
import resource
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ezflow import (
    BrokenResourceError,
    ClosedResourceError,
    ConfigurationError,
    MessageTooLargeError,
)
from ezflow._transports._shmfiles import shm_dir
from ezflow._transports._shmring import Block, Descriptor, ShmRing, ShmRingReader

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

SHM = Path(shm_dir())  # the run's private shm directory (conftest)
PAGE = mmap.PAGESIZE


@pytest.fixture
def ring() -> Iterator[ShmRing]:
    with ShmRing(slot_count=4, slot_size=4096, max_bytes=1 << 22) as r:
        yield r


def take(ring: ShmRing, nbytes: int) -> Block:
    block = ring.acquire(nbytes)
    assert block is not None
    return block


def send(ring: ShmRing, nbytes: int, channels: list[str], fill: int = 0) -> Descriptor:
    block = take(ring, nbytes)
    block.buffer[:] = bytes([fill]) * nbytes
    return ring.publish(block, channels)


# -- publisher side: leases and generations ---------------------------------------------


def test_acquire_publish_release_cycle(ring: ShmRing) -> None:
    block = take(ring, 100)
    d = block.descriptor
    assert len(block.buffer) == 100 and not block.buffer.readonly
    assert (d.offset, d.length, d.generation) == (d.block * 4096, 100, 1)
    assert (SHM / d.segment).exists()
    assert ring.in_use == 1 and ring.free_slots == 3
    block.buffer[:] = b"x" * 100
    assert ring.publish(block, ["a", "b"]) == d
    assert ring.release("a", d)
    assert ring.in_use == 1 and ring.free_slots == 3  # b still holds it
    assert ring.release("b", d)
    assert ring.in_use == 0 and ring.free_slots == 4
    assert ring.stats.acquires == 1 and ring.stats.shm_bytes == 4 * 4096


def test_a_block_is_reused_only_after_every_channel_released_it() -> None:
    # (max_bytes holds the ring alone: no out-of-line block when the slots are leased)
    with ShmRing(slot_count=2, slot_size=64, max_bytes=128) as ring:
        first = send(ring, 10, ["a", "b"])
        second = send(ring, 10, ["a"])
        assert ring.acquire(10) is None and ring.stats.failed_acquires == 1
        assert ring.release("a", first)
        assert ring.acquire(10) is None  # b still holds the first block
        assert ring.release("b", first)
        again = take(ring, 20).descriptor
        assert (again.block, again.generation) == (first.block, first.generation + 1)
        assert again.block != second.block


def test_generations_increase_on_every_reuse() -> None:
    with ShmRing(slot_count=1, slot_size=64) as ring:
        generations = []
        for _ in range(5):
            d = send(ring, 8, ["a"])
            generations.append(d.generation)
            assert ring.release("a", d)
        assert generations == [1, 2, 3, 4, 5]


def test_stale_unknown_and_double_releases_are_ignored() -> None:
    with ShmRing(slot_count=1, slot_size=64, max_bytes=64) as ring:
        old = send(ring, 8, ["a", "b"])
        assert ring.release("a", old)
        assert not ring.release("a", old)  # double release
        assert not ring.release("c", old)  # never held it
        assert not ring.release("b", old._replace(generation=old.generation + 1))
        assert not ring.release("b", old._replace(block=99))
        assert not ring.release("b", old._replace(segment="ezflow-1-1-0000000000000000"))
        assert ring.in_use == 1
        assert ring.release("b", old)
        new = send(ring, 8, ["a", "b"])
        # Late releases of the previous use of the same block must not free it.
        assert not ring.release("a", old) and not ring.release("b", old)
        assert ring.in_use == 1 and ring.acquire(8) is None
        assert ring.release("a", new) and ring.release("b", new)
        assert ring.in_use == 0


def test_drop_channel_frees_exactly_that_channels_leases(ring: ShmRing) -> None:
    only_a = send(ring, 8, ["a"])
    both = send(ring, 8, ["a", "b"])
    only_b = send(ring, 8, ["b"])
    assert ring.drop_channel("a") == 2
    assert ring.drop_channel("a") == 0
    assert ring.in_use == 2 and ring.free_slots == 2
    assert not ring.release("a", both)
    assert ring.release("b", both) and ring.release("b", only_b)
    assert ring.in_use == 0 and not ring.release("a", only_a)


def test_publish_to_no_channel_frees_and_publish_twice_is_refused(ring: ShmRing) -> None:
    block = take(ring, 8)
    ring.publish(block, [])
    assert ring.in_use == 0 and ring.free_slots == 4
    with pytest.raises(ValueError, match="not an acquired"):
        ring.publish(block, ["a"])
    block = take(ring, 8)
    ring.publish(block, ["a"])
    with pytest.raises(ValueError, match="not an acquired"):
        ring.publish(block, ["b"])


def test_with_every_slot_leased_small_messages_overflow_into_out_of_line_blocks(
    ring: ShmRing,
) -> None:
    held = [send(ring, 4096, ["a"]) for _ in range(4)]
    assert len({d.block for d in held}) == 4 and ring.free_slots == 0
    # Every slot leased: out-of-line blocks, at most slot_count of them, then nothing.
    overflow = [send(ring, size, ["a"]) for size in (4096, 1, 0, 100)]
    assert all(d.block >= ring.slot_count for d in overflow)
    assert len({d.segment for d in overflow}) == 4
    assert ring.acquire(1) is None and ring.acquire(0) is None
    assert ring.stats.failed_acquires == 2 and ring.stats.slot_overflows == 4
    # A freed overflow block is pooled and reused like any out-of-line block (for
    # between half its capacity and its capacity) ...
    assert ring.release("a", overflow[0])
    assert ring.acquire(10) is None  # (a new one would be the fifth)
    again = take(ring, 3000).descriptor
    assert again.segment == overflow[0].segment
    ring.publish(Block(again, memoryview(b"")), [])  # (given back unused)
    # ... and a freed slot is taken first again.
    assert ring.release("a", held[2])
    assert take(ring, 0).descriptor.block == held[2].block
    assert ring.stats.slot_overflows == 5


def test_acquire_returns_none_when_every_slot_is_leased_and_no_bytes_are_left() -> None:
    with ShmRing(slot_count=2, slot_size=4096, max_bytes=2 * 4096 + 4096) as ring:
        held = [send(ring, 4096, ["a"]) for _ in range(3)]  # 2 slots, 1 one-page block
        assert ring.acquire(1) is None  # a second block would pass max_bytes
        assert ring.stats.failed_acquires == 1 and ring.stats.slot_overflows == 1
        assert ring.release("a", held[0])
        assert take(ring, 1).descriptor.block == held[0].block


def test_bad_arguments() -> None:
    with pytest.raises(ConfigurationError, match="slot_count"):
        ShmRing(slot_count=0)
    with pytest.raises(ConfigurationError, match="does not fit"):
        ShmRing(slot_count=4, slot_size=1024, max_bytes=4095)
    with ShmRing(slot_count=1, slot_size=64) as ring, pytest.raises(ValueError):
        ring.acquire(-1)


# -- out-of-line blocks and the byte budget -----------------------------------------------


@pytest.mark.parametrize("nbytes", [4095, 4096, 4097, 3 << 20])
def test_sizes_around_the_slot_size(ring: ShmRing, nbytes: int) -> None:
    ring.open()
    ring_name = take(ring, 1).descriptor.segment
    block = take(ring, nbytes)
    d = block.descriptor
    assert len(block.buffer) == nbytes == d.length
    pattern = np.arange(nbytes, dtype=np.uint8) ^ 0x5A
    np.frombuffer(block.buffer, np.uint8)[:] = pattern
    if nbytes <= ring.slot_size:
        assert d.segment == ring_name and d.block < ring.slot_count
    else:
        assert d.segment != ring_name and d.block >= ring.slot_count and d.offset == 0
        assert (SHM / d.segment).stat().st_size == -(-nbytes // PAGE) * PAGE
        assert ring.stats.blocks_created == 1
    with ShmRingReader() as reader:
        view = reader.view(ring.publish(block, ["a"]))
        assert np.array_equal(np.frombuffer(view, np.uint8), pattern)
        del view
        assert reader.take_released() == [d]
    assert ring.release("a", d)


def test_pooled_blocks_are_reused_within_half_to_full_capacity(ring: ShmRing) -> None:
    big = send(ring, 8 * PAGE, ["a"])
    assert ring.release("a", big)
    half = send(ring, 4 * PAGE, ["a"])  # capacity / 2: reused
    assert (half.segment, half.block, half.generation) == (big.segment, big.block, 2)
    assert ring.stats.blocks_reused == 1 and ring.stats.blocks_created == 1
    assert ring.release("a", half)
    smaller = send(ring, 4 * PAGE - 1, ["a"])  # below half: a new block
    larger = send(ring, 8 * PAGE + 1, ["a"])  # above capacity: a new block
    assert big.segment not in {smaller.segment, larger.segment}
    assert ring.stats.blocks_created == 3 and ring.stats.blocks_reused == 1
    assert ring.release("a", smaller) and ring.release("a", larger)
    # Of the pooled blocks that fit, the smallest is taken: 5 pages fits 8 and 9.
    assert send(ring, 5 * PAGE, ["a"]).segment == big.segment


def test_max_bytes_unlinks_the_oldest_free_pooled_blocks_first() -> None:
    ring_bytes = 2 * 4096
    with ShmRing(slot_count=2, slot_size=4096, max_bytes=ring_bytes + 12 * PAGE) as ring:
        a, b, c = (send(ring, 4 * PAGE, ["x"]) for _ in range(3))
        assert ring.stats.shm_bytes == ring.max_bytes
        for d in (b, a, c):  # freed in this order: b is the oldest free block
            assert ring.release("x", d)
        # 6 pages: no pooled block fits; room is made by unlinking b, then a.
        d = send(ring, 6 * PAGE, ["x"])
        assert not (SHM / b.segment).exists() and not (SHM / a.segment).exists()
        assert (SHM / c.segment).exists() and (SHM / d.segment).exists()
        assert ring.stats.blocks_unlinked == 2
        assert ring.take_retired() == [b.segment, a.segment]  # for channels to forget
        assert ring.take_retired() == []
        assert ring.stats.shm_bytes == ring_bytes + 10 * PAGE <= ring.max_bytes
        assert ring.release("x", d)


def test_max_bytes_held_by_leased_blocks_makes_acquire_return_none() -> None:
    ring_bytes = 2 * 4096
    with ShmRing(slot_count=2, slot_size=4096, max_bytes=ring_bytes + 16 * PAGE) as ring:
        assert ring.max_message_size == 16 * PAGE
        a = send(ring, 8 * PAGE, ["x"])
        b = send(ring, 8 * PAGE, ["x"])
        assert ring.acquire(3 * PAGE) is None  # leased blocks use the whole budget
        assert ring.stats.failed_acquires == 1
        assert (SHM / a.segment).exists() and (SHM / b.segment).exists()
        with pytest.raises(MessageTooLargeError, match="does not fit"):
            ring.acquire(16 * PAGE + 1)
        assert ring.release("x", a)
        small = send(ring, 3 * PAGE, ["x"])  # a (too big to reuse) made room
        assert not (SHM / a.segment).exists()
        whole = ring.stats.shm_bytes
        assert whole == ring_bytes + 11 * PAGE <= ring.max_bytes
        assert ring.release("x", b) and ring.release("x", small)
        assert ring.acquire(16 * PAGE) is not None  # both pooled blocks unlinked
        assert ring.stats.shm_bytes == ring.max_bytes


def test_add_lease_shares_a_published_block_until_it_is_freed(ring: ShmRing) -> None:
    d = send(ring, 100, ["a"])
    assert ring.add_lease(d, "b")
    assert not ring.add_lease(d, "b")  # holds it already
    assert ring.release_block("a", d.block, d.generation)
    assert ring.in_use == 1  # b still holds it
    assert not ring.release_block("a", d.block, d.generation)
    assert not ring.release_block("b", d.block, d.generation + 1)  # another generation
    assert ring.release_block("b", d.block, d.generation)
    assert ring.in_use == 0
    assert not ring.add_lease(d, "c")  # freed: a sender must acquire anew
    again = send(ring, 100, ["a"])
    assert not ring.add_lease(d, "c")  # reused for a later message: still refused
    assert ring.add_lease(again, "c") and ring.drop_channel("c") == 1


def test_the_most_recently_freed_slot_is_reused_first(ring: ShmRing) -> None:
    a, b, c = (send(ring, 10, ["x"]) for _ in range(3))
    for d in (b, c, a):
        assert ring.release("x", d)
    assert take(ring, 10).descriptor.block == a.block  # cache-warm: just read by a channel
    assert take(ring, 10).descriptor.block == c.block


def test_the_most_recently_freed_out_of_line_block_is_reused_first(ring: ShmRing) -> None:
    # The hot-block policy for large messages too: of the pooled blocks that fit, the
    # one a channel gave back last (its pages are the likeliest still cached).
    a, b, c = (send(ring, 8 * PAGE, ["x"]) for _ in range(3))
    for d in (b, a, c):
        assert ring.release("x", d)
    assert take(ring, 8 * PAGE).descriptor.segment == c.segment
    assert take(ring, 8 * PAGE).descriptor.segment == a.segment
    assert ring.stats.blocks_created == 3 and ring.stats.blocks_reused == 2


def test_new_blocks_and_the_segments_a_reader_maps_are_pre_faulted() -> None:
    # A new out-of-line block is written, and read through a reader that maps it for
    # the first time, without a page fault per page (see _segment, Pre-faulting).
    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt

    nbytes = 16 << 20
    with ShmRing(slot_count=2, slot_size=PAGE, max_bytes=64 << 20) as ring:
        block = take(ring, nbytes)
        before = faults()
        np.frombuffer(block.buffer, dtype=np.uint8)[:] = 3
        written = faults() - before
        descriptor = ring.publish(block, ["x"])
        del block
        with ShmRingReader() as reader:
            view = reader.view(descriptor)
            before = faults()
            assert int(np.frombuffer(view, dtype=np.uint8).max()) == 3
            read = faults() - before
            del view
        assert ring.release("x", descriptor)
    assert written < 32, written  # not pre-faulted: 4096, one per page
    with mmap.mmap(-1, PAGE) as probe:
        try:
            probe.madvise(22)  # MADV_POPULATE_READ: Linux 5.14+
        except OSError:
            return  # an older kernel: the reader's pages fault in as they always did
    assert read < 32, read  # not pre-faulted: 256 (16 pages per fault)


def test_a_forked_child_closing_the_ring_unlinks_nothing() -> None:
    with ShmRing(slot_count=2, slot_size=4096) as ring:
        d = send(ring, 10, ["a"])
        with warnings.catch_warnings():
            # Python >= 3.12 warns about fork() in a process with threads; the child
            # only closes the ring and exits.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                ring.close()
                os._exit(0)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (SHM / d.segment).exists()  # the parent still owns and uses it
        assert ring.release("a", d)


def test_close_unlinks_everything_and_is_idempotent() -> None:
    ring = ShmRing(slot_count=2, slot_size=4096)
    assert ring.free_slots == 2 and ring.stats.shm_bytes == 0  # nothing created yet
    leased = send(ring, 10, ["a"])
    pooled = send(ring, 5 * PAGE, ["a"])
    assert ring.release("a", pooled)
    writing = take(ring, 9 * PAGE)
    names = {leased.segment, pooled.segment, writing.descriptor.segment}
    assert len(names) == 3 and all((SHM / name).exists() for name in names)
    ring.close()
    assert not any((SHM / name).exists() for name in names)
    ring.close()
    assert ring.closed and ring.in_use == 0 and ring.free_slots == 0
    assert not ring.release("a", leased) and ring.drop_channel("a") == 0
    with pytest.raises(ClosedResourceError):
        ring.acquire(1)
    with pytest.raises(ClosedResourceError):
        ring.open()
    del writing
    gc.collect()


# -- channel side: views and their release ------------------------------------------------


def test_views_are_read_only_and_zero_copy(ring: ShmRing) -> None:
    block = take(ring, 16)
    d = ring.publish(block, ["a"])
    with ShmRingReader() as reader:
        view = reader.view(d)
        assert view.readonly and len(view) == 16
        with pytest.raises(TypeError):
            view[0] = 1
        array = np.frombuffer(view, np.uint8)
        assert not array.flags.writeable
        block.buffer[3] = 42  # the same memory, not a copy
        assert view[3] == 42 == array[3]
        del view, array


DERIVATIONS: dict[str, Callable[[memoryview], Any]] = {
    "frombuffer": lambda v: np.frombuffer(v, np.uint8),
    "frombuffer-slice": lambda v: np.frombuffer(v, np.uint8)[4:8],
    "reshape": lambda v: np.frombuffer(v, np.uint32).reshape(4, 4),
    "memoryview-slice": lambda v: v[8:],
    "memoryview-cast": lambda v: memoryview(v).cast("I"),
    "array-memoryview": lambda v: np.frombuffer(v, np.uint16)[::2].data,
}


@pytest.mark.parametrize("how", list(DERIVATIONS))
def test_release_happens_when_the_last_derived_object_goes(ring: ShmRing, how: str) -> None:
    d = send(ring, 64, ["a"], fill=7)
    calls: list[Descriptor] = []
    with ShmRingReader(on_release=calls.append) as reader:
        view = reader.view(d)
        derived = DERIVATIONS[how](view)
        del view
        assert reader.take_released() == [] and calls == []
        assert np.asarray(derived).size > 0
        del derived
        assert reader.take_released() == [d] and calls == [d]
        assert reader.take_released() == []
    assert ring.release("a", d)


def test_a_chain_of_derived_objects_keeps_the_block_until_all_are_gone(ring: ShmRing) -> None:
    d = send(ring, 64, ["a"])
    with ShmRingReader() as reader:
        view = reader.view(d)
        array = np.frombuffer(view, np.uint8)
        sliced = array[8:]
        reshaped = sliced.reshape(7, 8)
        sub_view = reshaped.data[1:]
        objects: list[Any] = [view, array, sliced, reshaped]
        del view, array, sliced, reshaped
        while objects:
            objects.pop(0)
            assert reader.take_released() == []  # sub_view still refers to it
        del sub_view
        assert reader.take_released() == [d]
    assert ring.release("a", d)


def test_each_view_is_released_separately(ring: ShmRing) -> None:
    d = send(ring, 8, ["a"])
    with ShmRingReader() as reader:
        first, second = reader.view(d), reader.view(d)
        del first
        assert reader.take_released() == [d]
        del second
        assert reader.take_released() == [d]
    assert ring.release("a", d)


def test_a_failing_on_release_is_logged_and_the_release_still_queued(
    ring: ShmRing, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(descriptor: Descriptor) -> None:
        raise RuntimeError("boom")

    d = send(ring, 8, ["a"])
    with ShmRingReader(on_release=boom) as reader, caplog.at_level(logging.ERROR, "ezflow.shm"):
        view = reader.view(d)
        del view  # the release runs the failing callback
        assert reader.take_released() == [d]
        assert "on_release callback failed" in caplog.text
    assert ring.release("a", d)


def test_finalizers_on_another_thread_still_deliver(ring: ShmRing) -> None:
    descriptors = [send(ring, 32, ["a"]) for _ in range(4)]
    threads: list[int] = []
    with ShmRingReader(on_release=lambda d: threads.append(threading.get_ident())) as reader:
        box = [np.frombuffer(reader.view(d), np.uint8) for d in descriptors]

        def drop_last_references() -> None:
            box.clear()

        worker = threading.Thread(target=drop_last_references)
        worker.start()
        worker.join()
        assert sorted(reader.take_released()) == sorted(descriptors)
        assert len(threads) == 4 and threading.get_ident() not in threads
    for d in descriptors:
        assert ring.release("a", d)


def test_attachment_cache_eviction_forget_and_close() -> None:
    with ShmRing(slot_count=1, slot_size=64) as ring:
        blocks = [send(ring, 2 * PAGE, ["a"], fill=i) for i in range(1, 4)]  # 3 segments
        reader = ShmRingReader(max_segments=2)
        views = [reader.view(d) for d in blocks]
        assert reader.attached == [blocks[1].segment, blocks[2].segment]
        assert views[0][0] == 1  # evicted, but its view stays mapped and valid
        reader.view(blocks[0])  # attached again (the view is dropped at once)
        assert reader.attached == [blocks[2].segment, blocks[0].segment]
        reader.forget(blocks[2].segment)
        reader.forget("unknown")
        assert reader.attached == [blocks[0].segment]
        assert views[2][0] == 3
        reader.close()
        reader.close()
        assert reader.closed and reader.attached == [] and views[1][-1] == 2
        with pytest.raises(ClosedResourceError):
            reader.view(blocks[0])
        del views
        assert sorted(reader.take_released()) == sorted([*blocks, blocks[0]])
        for d in blocks:
            assert ring.release("a", d)


def test_bad_descriptors_are_refused(ring: ShmRing) -> None:
    d = send(ring, 8, ["a"])
    with ShmRingReader() as reader:
        with pytest.raises(ValueError, match="outside"):
            reader.view(d._replace(offset=4 * 4096 - 4))
        with pytest.raises(BrokenResourceError):
            reader.view(d._replace(segment="ezflow-1-1-0000000000000000"))
    assert ring.release("a", d)


# -- across processes ------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from ezflow._transports._shmring import Descriptor, ShmRingReader

    reader = ShmRingReader()
    kept = None
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "view":
            d = Descriptor(*command["d"])
            array = np.frombuffer(reader.view(d), np.uint8)
            ok = bool((array == command["fill"]).all())
            if command["keep"]:
                kept = (array, command["fill"])
            del array
            reply = {"ok": ok}
        elif op == "check_kept":
            reply = {"ok": bool((kept[0] == kept[1]).all())}
        elif op == "drop_kept":
            kept = None
            reply = {"ok": True}
        else:
            break
        reply["released"] = [list(d) for d in reader.take_released()]
        print(json.dumps(reply), flush=True)
    reader.close()
    """
)


def test_a_kept_message_never_changes_while_other_blocks_are_rewritten() -> None:
    slots = 4
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None

    def ask(**command: Any) -> dict[str, Any]:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(command) + "\n")
        child.stdin.flush()
        reply: dict[str, Any] = json.loads(child.stdout.readline())
        return reply

    try:
        with ShmRing(slot_count=slots, slot_size=4096) as ring:
            kept: Descriptor | None = None
            for i in range(10 * slots):
                fill = i % 250 + 1
                block = ring.acquire(4096 if i % 3 else 1000)
                # Every free slot comes back in time; the kept one never does.
                assert block is not None
                assert kept is None or block.descriptor.block != kept.block
                block.buffer[:] = bytes([fill]) * len(block.buffer)
                d = ring.publish(block, ["child"])
                reply = ask(op="view", d=list(d), fill=fill, keep=i == 0)
                assert reply["ok"]
                if i == 0:
                    kept = d
                    assert reply["released"] == []
                else:
                    assert [Descriptor(*r) for r in reply["released"]] == [d]
                    assert ring.release("child", d)
            assert kept is not None
            assert ring.in_use == 1 and ring.free_slots == slots - 1
            assert ask(op="check_kept")["ok"]
            reply = ask(op="drop_kept")
            assert [Descriptor(*r) for r in reply["released"]] == [kept]
            assert ring.release("child", kept)
            assert ring.in_use == 0 and ring.free_slots == slots
            child.stdin.write(json.dumps({"op": "exit"}) + "\n")
            child.stdin.close()
            assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()
