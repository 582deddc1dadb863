"""Memory blocks a compiled path leaves behind: run it warm, then count CPython's
allocated blocks around many more calls."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable


def blocks_grown(run: Callable[[int], None], *, warm: int, times: int) -> int:
    """Memory blocks more after ``run(times)`` than before it, once ``run(warm)`` has
    filled caches, interned strings and free lists (collected before and after)."""
    run(warm)
    gc.collect()
    before = sys.getallocatedblocks()
    run(times)
    gc.collect()
    return sys.getallocatedblocks() - before
