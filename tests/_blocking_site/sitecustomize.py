"""Blockbuster in every Python process started with this directory on ``PYTHONPATH``
and ``EZFLOW_TEST_BLOCKBUSTER`` set to a file: the unit processes of a graph under
test (tests/test_blocking.py). Each blocking call made from ezflow's modules on a
thread with a running event loop is appended to that file as one JSON line (pid, call,
the ezflow frames), and raises ``BlockingError`` as in the test process itself.
"""

from __future__ import annotations

import os

_REPORT = os.environ.get("EZFLOW_TEST_BLOCKBUSTER")

if _REPORT:
    import json
    import traceback

    from blockbuster import BlockBuster, blockbuster

    _raised = blockbuster.BlockingError.__init__

    def _recorded(self: blockbuster.BlockingError, func: str) -> None:
        _raised(self, func)
        # (blockbuster does not look at calls made while it raises: this write is free)
        frames = traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False)
        where = [f"{f.filename.split('/ezflow/')[-1]}:{f.lineno} {f.name}" for f in frames]
        with open(_REPORT, "a", encoding="utf-8") as report:
            report.write(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "call": str(self),
                        "where": [
                            w
                            for w, f in zip(where, frames, strict=True)
                            if "/ezflow/" in f.filename
                        ],
                    }
                )
                + "\n"
            )

    blockbuster.BlockingError.__init__ = _recorded  # type: ignore[method-assign]
    BlockBuster(scanned_modules=["ezflow"]).activate()
