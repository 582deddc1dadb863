"""Which codec path runs: the compiled one (``ezflow._core._speedups``, an optional C
extension built at install when a compiler is there) or the pure-Python one.

Chosen here, once, when ezflow is imported; every module that has a compiled twin asks
:data:`SPEEDUPS`, nothing else imports the extension. ``EZFLOW_PURE_PYTHON=1``
(``ENV_PURE_PYTHON``) forces the pure-Python path. Both paths give the same bytes and
the same errors: tests/test_speedups.py pins each compiled function to its pure-Python
twin. docs/architecture.md ("The compiled hot path") says what is compiled and why.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ._config import ENV_PURE_PYTHON

__all__ = [
    "SPEEDUPS",
    "active_path",
    "copy_into",
    "copy_into_py",
    "voluntary_switches",
    "voluntary_switches_py",
]


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(ENV_PURE_PYTHON, "").strip() not in ("", "0"):
        return None, f"pure Python ({ENV_PURE_PYTHON} is set)"
    try:
        from . import _speedups  # noqa: PLC0415 - optional: absent without a compiler
    except ImportError:
        return None, "pure Python (the C extension ezflow._core._speedups is not built)"
    return _speedups, "compiled (ezflow._core._speedups)"


SPEEDUPS, _PATH = _load()


def active_path() -> str:
    """Which codec path this process runs, and why, in a few words."""
    return _PATH


def copy_into_py(dst: Any, offset: int, src: Any, nontemporal: bool, threads: int = 1) -> None:
    """Copy the bytes of the contiguous buffer *src* into the writable contiguous buffer
    *dst* at *offset*, with the GIL released (``numpy.copyto``: a ``memmove``).

    Raises ``TypeError`` when *src* is not a C-contiguous buffer or *dst* not a
    writable one, ``ValueError`` when the span lies outside *dst* or *threads* is below
    1. *nontemporal* asks for stores that bypass the cache, *threads* for the copy in
    pieces on up to that many threads at once; only ``_speedups.copy_into``, the
    compiled twin, can do either (tests/test_speedups.py pins the two together): the shm
    publisher's copy of a part of ``SHM_COPY_NT_BYTES`` or ``SHM_COPY_SPLIT_BYTES`` or
    more.
    """
    try:
        source = memoryview(src)
    except TypeError:
        source = None
    if source is None or not source.c_contiguous:
        raise TypeError("copy_into: the source is not a contiguous buffer")
    try:
        target = memoryview(dst)
    except TypeError:
        target = None
    if target is None or target.readonly or not target.c_contiguous:
        raise TypeError("copy_into: the destination is not a writable contiguous buffer")
    n, length = source.nbytes, target.nbytes
    if offset < 0 or offset > length or n > length - offset:
        raise ValueError(f"copy_into: {n} bytes at {offset} of a buffer of {length} bytes")
    if threads < 1:
        raise ValueError(f"copy_into: threads must be 1 or more, not {threads}")
    np.copyto(
        np.frombuffer(target.cast("B"), np.uint8, n, offset),
        np.frombuffer(source.cast("B"), np.uint8, n),
    )


#: The copy this process runs: ``_speedups.copy_into`` or :func:`copy_into_py`.
copy_into: Callable[[Any, int, Any, bool, int], None] = (
    copy_into_py if SPEEDUPS is None else SPEEDUPS.copy_into
)


#: ``resource.RUSAGE_THREAD`` (Linux only), or None.
RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)


def voluntary_switches_py() -> int:
    """Times this thread has blocked (slept) so far: its voluntary context switches
    (``getrusage(RUSAGE_THREAD).ru_nvcsw``; Linux only).

    An event loop waiting for its next timer or I/O blocks in the kernel and counts one;
    a thread that is preempted, or that yields with ``sched_yield``, counts an
    involuntary one instead. One system call, and a 16-field ``struct_rusage`` built
    for one of them: ``_speedups.voluntary_switches``, the compiled twin, reads the same
    count without it (with the caches cold, ~6 µs less on a paced publish's handoff;
    tests/test_speedups.py pins the two together)."""
    return resource.getrusage(RUSAGE_THREAD).ru_nvcsw  # type: ignore[arg-type]


#: What this process runs: ``_speedups.voluntary_switches`` or :func:`voluntary_switches_py`.
voluntary_switches: Callable[[], int] = getattr(
    SPEEDUPS, "voluntary_switches", voluntary_switches_py
)
