"""ezring: the shared-memory ring a C or C++ producer writes and ezflow reads.

::

    import ezflow.ezring

    async with await ezflow.ezring.RingReader.open("cam0", lossless=True) as reader:
        async for frame in reader:  # a RingFrame: seq, t_ns, array, meta, lost
            ...

The ring's layout, its rules and the C/C++ writers are in docs/ezring.md; a graph
subscribes to a ring through ``GraphContext.attach_ring``. These names were in the
top-level ``ezflow`` namespace before (``ezflow.RingReader``...): those aliases are
deprecated, warn, and go in the next release.
"""

from __future__ import annotations

from ._transports._ezring import RingFrame, RingHeader, RingReader, RingStats, RingWriter

__all__ = ["RingFrame", "RingHeader", "RingReader", "RingStats", "RingWriter"]
