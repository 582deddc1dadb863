"""The pyzmq peer, crashing once: its first sink process exits with status 3 before it
subscribes, every later one works. Runs in the pyzmq venv of the test (which links
this ezflow): ``VENV/bin/python tests/_crashpeer.py graph | units SPEC | info``.

Whether the crash has happened is a file, ``$EZFLOW_TEST_CRASH_MARK``: the first sink
creates it and exits (``os._exit``, as a segfault would: nothing is cleaned up).
"""

from __future__ import annotations

import os
from typing import Any

from ezflow._perf._peers._pyzmq import PyzmqFramework
from ezflow._perf._worker import main


class CrashOnce(PyzmqFramework):
    async def subscriber(self, ctx: Any, topic: str, transport: str) -> Any:
        try:
            fd = os.open(os.environ["EZFLOW_TEST_CRASH_MARK"], os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return await super().subscriber(ctx, topic, transport)
        os.close(fd)
        os._exit(3)


if __name__ == "__main__":
    main(CrashOnce())
