"""How busy this machine is, for the few deadlines a test must measure in wall time."""

from __future__ import annotations

import os


def overcommit() -> float:
    """Runnable threads per core over the last minute (the load average per core), at
    least 1.0.

    A deadline the product promises in wall time (a command exits within its drain
    timeout + 1 s) holds on a machine that gives the process a core; on one running k
    times more work than it has cores each process gets about 1/k of one, and the test's
    margin grows by that factor. Only for margins: the promise itself stays the bound.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1.0, os.getloadavg()[0] / (cores or 1))
