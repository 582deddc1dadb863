"""Shared-memory segments: create/attach across processes, teardown, the stale sweep.

Real /dev/shm and real child processes throughout; the autouse ``no_leaks`` fixture
checks that every test removes what it made.
"""

from __future__ import annotations

import errno
import gc
import mmap
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ezflow import BrokenResourceError, ClosedResourceError, ConfigurationError
from ezflow._transports import _segment
from ezflow._transports._segment import ShmSegment, shm_available, sweep_stale_segments
from ezflow._transports._shmfiles import shm_dir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

SHM = Path(shm_dir())  # the run's private shm directory (conftest)
DEAD_PID = 9_999_999  # above the largest pid_max Linux allows (2**22)


def mapped(name: str) -> bool:
    """Whether this process still has the segment *name* mapped."""
    return f"{SHM}/{name}" in Path("/proc/self/maps").read_text()


def own_start() -> int:
    fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
    return int(fields[19])


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# -- create / attach ------------------------------------------------------------------


def test_create_names_sizes_and_maps_the_segment() -> None:
    with ShmSegment.create(10_000, tag="ring_0") as seg:
        match = _segment._NAME.fullmatch(seg.name)
        assert match is not None
        assert (int(match["pid"]), int(match["start"])) == (os.getpid(), own_start())
        assert match["tag"] == "ring_0"
        path = SHM / seg.name
        info = path.stat()
        assert info.st_size == 10_000 and info.st_mode & 0o777 == 0o600
        # Reserved up front (posix_fallocate), not a sparse file.
        assert info.st_blocks * 512 >= 10_000
        assert seg.owner and not seg.closed and seg.size == 10_000
        assert not seg.buffer.readonly and len(seg.buffer) == 10_000
        assert bytes(seg.buffer[:16]) == bytes(16)  # starts zeroed
        assert seg.name in repr(seg)
    assert not path.exists() and seg.closed


def test_names_are_unique_and_untagged_names_end_with_the_token() -> None:
    with ShmSegment.create(1) as a, ShmSegment.create(1) as b:
        assert a.name != b.name
        assert _segment._NAME.fullmatch(a.name)["tag"] is None  # type: ignore[index]


def test_attach_in_the_same_process_shares_memory() -> None:
    with ShmSegment.create(4096) as owner:
        with ShmSegment.attach(owner.name) as reader:
            assert not reader.owner and reader.size == 4096
            owner.buffer[100:104] = b"abcd"
            assert bytes(reader.buffer[100:104]) == b"abcd"
            with ShmSegment.attach(owner.name, writable=True) as writer:
                writer.buffer[0] = 7
            assert owner.buffer[0] == 7 == reader.buffer[0]
        assert (SHM / owner.name).exists()  # leaving an attachment never unlinks


def test_a_child_reads_what_the_owner_wrote_and_writes_back() -> None:
    with ShmSegment.create(1 << 20, tag="x") as seg:
        pattern = np.arange(1 << 17, dtype=np.uint64)  # 1 MiB
        np.frombuffer(seg.buffer, dtype=np.uint64)[:] = pattern
        result = run_child(
            f"""
            import numpy as np
            from ezflow._transports._segment import ShmSegment
            with ShmSegment.attach({seg.name!r}) as seg:
                data = np.frombuffer(seg.buffer, dtype=np.uint64)
                ok = np.array_equal(data, np.arange(1 << 17, dtype=np.uint64))
                try:
                    seg.buffer[0] = 1
                    refused = False
                except TypeError:
                    refused = True
                del data
            with ShmSegment.attach({seg.name!r}, writable=True) as seg:
                seg.buffer[-8:] = b"childwas"
            print(ok, refused)
            """
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["True", "True"]
        assert bytes(seg.buffer[-8:]) == b"childwas"
        assert np.array_equal(np.frombuffer(seg.buffer, np.uint64)[:-1], pattern[:-1])
        assert (SHM / seg.name).exists()  # the child's exit did not unlink it


def test_read_only_attachments_refuse_writes() -> None:
    with ShmSegment.create(4096) as owner, ShmSegment.attach(owner.name) as reader:
        assert reader.buffer.readonly
        with pytest.raises(TypeError):
            reader.buffer[0] = 1
        array = np.frombuffer(reader.buffer, dtype=np.uint8)
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            array.flags.writeable = True
        # ... and the kernel mapping itself is read-only, not just the Python view.
        lines = Path("/proc/self/maps").read_text().splitlines()
        perms = {line.split()[1] for line in lines if line.endswith(owner.name)}
        assert perms == {"rw-s", "r--s"}
        del array


def _minor_faults() -> int:
    """Minor page faults of the calling thread so far."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _can_populate_for_reading() -> bool:
    with mmap.mmap(-1, PAGE) as probe:
        try:
            probe.madvise(_segment._MADV_POPULATE_READ)
        except OSError:
            return False
    return True


PAGE = mmap.PAGESIZE
FAULTS_SIZE = 16 << 20  # 4096 pages: hundreds of faults when not pre-faulted


@pytest.mark.parametrize("populate", [False, True])
def test_populate_fills_the_page_tables_at_create(populate: bool) -> None:
    # The first write into a fresh segment faults once per page unless it was created
    # with populate=True (MAP_POPULATE): then the faults happened inside create().
    payload = np.ones(FAULTS_SIZE, dtype=np.uint8)
    with ShmSegment.create(FAULTS_SIZE, populate=populate) as seg:
        before = _minor_faults()
        np.frombuffer(seg.buffer, dtype=np.uint8)[:] = payload
        faults = _minor_faults() - before
        assert bytes(seg.buffer[-3:]) == b"\x01\x01\x01"
    if populate:
        assert faults < 32, faults
    else:
        assert faults > 512, faults  # (what populate saves: the comparison is meaningful)


@pytest.mark.parametrize("populate", [False, True])
def test_populate_faults_an_attachment_in_for_reading(populate: bool) -> None:
    if populate and not _can_populate_for_reading():
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux 5.14+)")
    with ShmSegment.create(FAULTS_SIZE) as owner:
        np.frombuffer(owner.buffer, dtype=np.uint8)[:] = 7
        with ShmSegment.attach(owner.name, populate=populate) as seg:
            assert seg.buffer.readonly
            before = _minor_faults()
            total = int(np.frombuffer(seg.buffer, dtype=np.uint64).sum(dtype=np.uint64))
            faults = _minor_faults() - before
    word = int.from_bytes(bytes([7]) * 8, "little")
    assert total == word * (FAULTS_SIZE // 8) % 2**64  # (numpy's uint64 sum wraps)
    if populate:
        assert faults < 32, faults
    else:
        assert faults > 64, faults


def test_populate_for_reading_is_a_no_op_where_the_kernel_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An older kernel answers EINVAL: the attachment works, its pages fault in as usual.
    monkeypatch.setattr(_segment, "_MADV_POPULATE_READ", 12345)
    with ShmSegment.create(PAGE) as owner:
        owner.buffer[:3] = b"abc"
        with ShmSegment.attach(owner.name, populate=True) as seg:
            assert bytes(seg.buffer[:3]) == b"abc"


# -- teardown -------------------------------------------------------------------------


def test_unlink_is_idempotent_and_attach_after_unlink_is_broken() -> None:
    seg = ShmSegment.create(4096)
    seg.unlink()
    assert not (SHM / seg.name).exists()
    seg.unlink()  # no error, no second unlink
    seg.buffer[0] = 1  # the mapping outlives the name
    with pytest.raises(BrokenResourceError, match="no longer exists: its publisher") as info:
        ShmSegment.attach(seg.name)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    seg.close()
    seg.close()
    assert seg.closed
    with pytest.raises(ClosedResourceError):
        _ = seg.buffer


def test_unlink_tolerates_a_name_removed_by_someone_else() -> None:
    seg = ShmSegment.create(4096)
    os.unlink(SHM / seg.name)
    seg.unlink()
    seg.close()


def test_only_the_owner_unlinks() -> None:
    with ShmSegment.create(4096) as owner, ShmSegment.attach(owner.name) as reader:
        with pytest.raises(RuntimeError, match="only its creator"):
            reader.unlink()
        assert (SHM / owner.name).exists()


def test_close_with_live_views_defers_the_unmap_until_they_are_gone() -> None:
    seg = ShmSegment.create(4096)
    name = seg.name
    array = np.frombuffer(seg.buffer, dtype=np.uint8)
    window = seg.buffer[10:20]
    array[10] = 42
    seg.close()  # must not raise BufferError
    assert seg.closed
    with pytest.raises(ClosedResourceError):
        _ = seg.buffer
    seg.unlink()
    assert window[0] == 42 and array[10] == 42  # still valid memory
    assert mapped(name)
    del array
    gc.collect()
    assert mapped(name)  # the memoryview slice still holds it
    del window
    gc.collect()
    assert not mapped(name)


def test_close_without_views_unmaps_at_once() -> None:
    with ShmSegment.create(4096) as owner:
        reader = ShmSegment.attach(owner.name)
        assert mapped(owner.name)
        reader.close()
        owner.close()
        assert not mapped(owner.name)
        assert (SHM / owner.name).exists()  # close does not unlink ...
    assert not (SHM / owner.name).exists()  # ... leaving the context does


def test_a_forgotten_owner_is_unlinked_with_a_resource_warning() -> None:
    seg = ShmSegment.create(4096)
    name = seg.name
    with pytest.warns(ResourceWarning, match="never unlinked"):
        seg.__del__()  # what garbage collection does
    assert not (SHM / name).exists()
    seg.close()


def test_segments_still_owned_at_exit_are_unlinked_but_not_by_forked_children() -> None:
    result = run_child(
        """
        import os
        from ezflow._transports._segment import ShmSegment
        kept = ShmSegment.create(4096)
        if os.fork() == 0:  # a forked child exits normally: it does not own `kept`
            assert not kept.owner
            raise SystemExit(0)
        os.wait()
        assert os.path.exists(kept._path)
        print(kept.name)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("ezflow-")
    assert not (SHM / result.stdout.strip()).exists()


# -- argument checks and error translation --------------------------------------------


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "64", sys.maxsize + 1])
def test_bad_sizes(size: object) -> None:
    with pytest.raises(ConfigurationError, match=r"size=.*(int|positive)"):
        ShmSegment.create(size)  # type: ignore[arg-type]


@pytest.mark.parametrize("tag", ["a/b", "..", "x" * 65, "sp ace", "é", 3])
def test_bad_tags(tag: object) -> None:
    with pytest.raises(ConfigurationError, match="tag="):
        ShmSegment.create(1, tag=tag)  # type: ignore[arg-type]


GOOD = "ezflow-4242-123-0123456789abcdef"  # (a fixed pid: test ids are the same in every run)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "ezflow",
        "/" + GOOD,
        "../" + GOOD,
        GOOD + "/../../etc/passwd",
        GOOD + "\n",
        GOOD + "\0",
        GOOD + "-" + "t" * 65,
        GOOD.replace("abcdef", "ABCDEF"),
        GOOD.replace("0123456789abcdef", "0123"),
        "ezflow-0-123-0123456789abcdef",
        "psm_12345",
        b"ezflow-1-2-0123456789abcdef",
        None,
    ],
)
def test_bad_names_are_rejected_before_touching_the_filesystem(
    name: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_filesystem(*args: object, **kwargs: object) -> None:
        raise AssertionError("touched the filesystem")

    monkeypatch.setattr(os, "open", no_filesystem)
    monkeypatch.setattr(os, "stat", no_filesystem)
    with pytest.raises(ValueError, match="not an ezflow shared-memory segment name"):
        ShmSegment.attach(name)  # type: ignore[arg-type]


def test_attach_refuses_symlinks() -> None:
    with ShmSegment.create(4096) as seg:
        link = f"ezflow-{DEAD_PID}-1-{'1' * 16}"
        os.symlink(SHM / seg.name, SHM / link)
        try:
            with pytest.raises(BrokenResourceError, match="symbolic link"):
                ShmSegment.attach(link)
        finally:
            os.unlink(SHM / link)


def test_permission_errors_say_shared_memory_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_open = os.open

    def denied(path: str, *args: int, **kwargs: int) -> int:
        if str(path).startswith(f"{SHM}/ezflow"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    with ShmSegment.create(4096) as seg:
        monkeypatch.setattr(os, "open", denied)
        attempts: list[Callable[[], ShmSegment]] = [
            lambda: ShmSegment.create(4096),
            lambda: ShmSegment.attach(seg.name),
        ]
        for attempt in attempts:
            with pytest.raises(BrokenResourceError, match=r"unavailable.*use the tcp") as info:
                attempt()
            assert isinstance(info.value.__cause__, PermissionError)


def test_no_space_is_reported_at_create_and_leaves_nothing() -> None:
    fs = os.statvfs(SHM)
    too_big = fs.f_blocks * fs.f_frsize * 2
    with pytest.raises(BrokenResourceError, match=r"unavailable.*use the tcp") as info:
        ShmSegment.create(too_big)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC  # no_leaks checks the file is gone


def test_a_failing_mmap_is_translated_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_memory(*args: object, **kwargs: object) -> mmap.mmap:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", no_memory)
    with pytest.raises(BrokenResourceError, match="unavailable") as info:
        ShmSegment.create(4096)
    assert info.value.__cause__ is not None


def test_a_taken_name_is_never_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = iter(["0" * 16, "1" * 16])
    monkeypatch.setattr(_segment, "_new_token", lambda: next(tokens))
    taken = SHM / f"ezflow-{os.getpid()}-{own_start()}-{'0' * 16}"
    taken.write_bytes(b"someone else's")
    try:
        with ShmSegment.create(4096) as seg:
            assert seg.name.endswith("1" * 16)
        assert taken.read_bytes() == b"someone else's"
    finally:
        taken.unlink()


def test_shm_available(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert shm_available()
    shm_available.cache_clear()
    monkeypatch.setenv("EZFLOW_SHM_DIR", str(tmp_path / "missing"))
    try:
        assert not shm_available()
    finally:
        shm_available.cache_clear()


# -- sweeping stale segments ----------------------------------------------------------


def test_sweep_removes_a_sigkilled_owners_segments_and_keeps_a_live_ones() -> None:
    code = textwrap.dedent(
        """
        import time
        from ezflow._transports._segment import ShmSegment
        a = ShmSegment.create(4096)
        b = ShmSegment.create(4096, tag="ring")
        print(a.name, b.name, flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        names = child.stdout.readline().split()
        assert len(names) == 2
        with ShmSegment.create(4096) as mine:
            removed = sweep_stale_segments()
            assert not set(removed) & {*names, mine.name}  # both owners alive
            assert all((SHM / name).exists() for name in [*names, mine.name])

            child.send_signal(signal.SIGKILL)
            # Sweep while the child is still an unreaped zombie: that is dead too.
            deadline = time.monotonic() + 5
            while Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] != "Z":
                assert time.monotonic() < deadline
                time.sleep(0.01)
            # The kernel drops the dead owner's lock a few ms after it turns zombie
            # (the file goes with its memory mappings); until then the sweep keeps it.
            # (Any process's sweep may remove them: another test running alongside too.)
            removed = []
            while any((SHM / name).exists() for name in names):
                assert time.monotonic() < deadline
                removed += sweep_stale_segments()
                time.sleep(0.005)
            assert mine.name not in removed and (SHM / mine.name).exists()
            assert not any((SHM / name).exists() for name in names)
            assert not set(names) & set(sweep_stale_segments())  # nothing twice
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def write_segment(directory: Path, pid: int, start: int, tag: str = "") -> str:
    name = f"ezflow-{pid}-{start}-{os.urandom(8).hex()}" + (f"-{tag}" if tag else "")
    (directory / name).write_bytes(b"\0" * 64)
    return name


def test_sweep_checks_the_start_time_against_pid_reuse(tmp_path: Path) -> None:
    live = write_segment(tmp_path, os.getpid(), own_start())
    reused = write_segment(tmp_path, os.getpid(), own_start() + 1, tag="t")
    dead = write_segment(tmp_path, DEAD_PID, 1)
    assert sorted(sweep_stale_segments(str(tmp_path))) == sorted([reused, dead])
    assert sorted(os.listdir(tmp_path)) == [live]


def test_sweep_leaves_everything_else_alone(tmp_path: Path) -> None:
    stale = f"ezflow-{DEAD_PID}-1-{'a' * 16}"
    decoys = [
        "ezflow",
        "ezflow-notes.txt",
        f"ezflow-{DEAD_PID}-1-{'a' * 15}",
        f"ezflow-{DEAD_PID}-1-{'a' * 16}-bad tag",
        f"psm_{DEAD_PID}",
        "sem.ezflow",
    ]
    for name in decoys:
        (tmp_path / name).write_text("not ours")
    (tmp_path / f"ezflow-{DEAD_PID}-2-{'b' * 16}").mkdir()  # matches, not a file
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / f"ezflow-{DEAD_PID}-3-{'c' * 16}").symlink_to(target)  # never followed
    (tmp_path / stale).write_bytes(b"")
    before = set(os.listdir(tmp_path))
    assert sweep_stale_segments(str(tmp_path)) == [stale]
    assert set(os.listdir(tmp_path)) == before - {stale}
    assert target.read_text() == "keep"
    assert sweep_stale_segments(str(tmp_path / "missing")) == []


def test_sweep_never_removes_a_locked_segment(tmp_path: Path) -> None:
    # An owner in another pid namespace: its pid means nothing here, its lock does.
    name = write_segment(tmp_path, DEAD_PID, 1)
    fd = os.open(tmp_path / name, os.O_RDONLY)
    try:
        assert _segment._try_lock(fd)
        assert sweep_stale_segments(str(tmp_path)) == []
    finally:
        os.close(fd)
    assert sweep_stale_segments(str(tmp_path)) == [name]


def test_an_owner_holds_its_lock_until_unlink() -> None:
    seg = ShmSegment.create(4096)
    try:
        fd = os.open(SHM / seg.name, os.O_RDONLY)
        try:
            assert not _segment._try_lock(fd)
            seg.close()  # closing keeps the name, so it keeps the lock
            assert not _segment._try_lock(fd)
        finally:
            os.close(fd)
    finally:
        seg.unlink()
