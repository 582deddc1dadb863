"""No ezflow code blocks its event loop: a representative graph under ``blockbuster``.

``blockbuster`` patches the blocking calls of the standard library (file reads, directory
listings, ``os.unlink``, ``time.sleep``, blocking sockets and locks, ...) to raise when
they run on a thread with a running event loop. Only calls made from ezflow's own
modules count (``scanned_modules``): what pytest, asyncio and the test do is not ours.
The graph: an embedded graph server, a publisher, and subscribers over tcp and shm (small
messages inline, large ones through shared-memory segments), opened and closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ezflow

blockbuster = pytest.importorskip("blockbuster")


@pytest.fixture
def no_blocking(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """Blockbuster on for ezflow's modules; yields the blocking calls seen (also those
    raised inside protocol callbacks, which the loop only logs)."""
    seen: list[str] = []
    busted = blockbuster.BlockBuster(scanned_modules=["ezflow"])
    # One allowed: a publisher unlinks its own segments when it closes, synchronously on
    # purpose (no segment outlives its owner, even when the loop stops right after).
    # /dev/shm is a tmpfs: the unlink is a memory operation, never device I/O.
    busted.functions["os.unlink"].can_block_in("ezflow/_transports/_segment.py", {"unlink"})
    busted.activate()
    try:
        yield seen
    finally:
        busted.deactivate()
    seen.extend(
        record.getMessage() + " " + str(record.exc_info[1] if record.exc_info else "")
        for record in caplog.records
        if "Blocking call" in record.getMessage()
        or (record.exc_info and isinstance(record.exc_info[1], blockbuster.BlockingError))
    )


async def test_a_graph_runs_without_blocking_its_loop(no_blocking: list[str]) -> None:
    loop = asyncio.get_running_loop()
    default_handler = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, blockbuster.BlockingError):
            no_blocking.append(str(exc))
        if default_handler is None:
            loop.default_exception_handler(context)
        else:  # pragma: no cover - pytest-asyncio installs none
            default_handler(loop, context)

    loop.set_exception_handler(handler)
    logging.getLogger("ezflow").setLevel(logging.INFO)
    try:
        async with (
            ezflow.GraphContext(("127.0.0.1", 0)) as ctx,
            ezflow.GraphContext(ctx.address, auto_start=False) as other,
        ):
            pub = await ctx.publisher("/blocking")
            subs = [
                await other.subscriber("/blocking", transport=transport)
                for transport in ("tcp", "shm")
            ]
            small, large = np.arange(8.0), np.ones(1 << 18)  # inline, and a 2 MiB segment
            for message in (small, large, small):
                await pub.publish(message)
                for sub in subs:
                    got = await asyncio.wait_for(sub.recv(), 10)
                    assert np.array_equal(got, message)
            await pub.aclose()
    finally:
        loop.set_exception_handler(default_handler)
    assert not no_blocking, no_blocking
