"""No ezflow code blocks its event loop: representative graphs under ``blockbuster``.

``blockbuster`` patches the blocking calls of the standard library (file reads, directory
listings, ``os.getcwd``, ``os.unlink``, ``time.sleep``, blocking sockets and locks, ...)
to raise when they run on a thread with a running event loop. Only calls made from
ezflow's own modules count (``scanned_modules``): what pytest, asyncio and the test do is
not ours. The graphs: an embedded graph server, a publisher, and subscribers over tcp and
shm (small messages inline, large ones through shared-memory segments), opened and
closed, in this process; and a unit graph run with ``ezflow.run`` whose unit processes
run blockbuster too (``tests/_blocking_site/sitecustomize.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _unit_graphs import ArraySink, ArraySource, CountSettings

import ezflow

blockbuster = pytest.importorskip("blockbuster")

#: A directory whose sitecustomize.py turns blockbuster on in every process started with
#: it on PYTHONPATH and EZFLOW_TEST_BLOCKBUSTER set (the unit processes).
SITE = str(Path(__file__).with_name("_blocking_site"))


@pytest.fixture
def no_blocking(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """Blockbuster on for ezflow's modules; yields the blocking calls seen (also those
    raised inside protocol callbacks, which the loop only logs)."""
    seen: list[str] = []
    # None allowed: a publisher's segments are unlinked in a worker thread too
    # (SegmentUnlinker: freeing their pages is no work for the loop).
    busted = blockbuster.BlockBuster(scanned_modules=["ezflow"])
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


def test_unit_processes_run_without_blocking_their_loops(
    no_blocking: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ezflow.run`` with two unit processes (a source of 256 KiB arrays, which travel
    through its shared-memory blocks, and a sink) and a sink here, to the end: neither
    this process (starting the graph) nor the unit processes (publishing, closing their
    publishers' segments) block their loops."""
    report = tmp_path / "blocking.jsonl"
    monkeypatch.setenv("EZFLOW_TEST_BLOCKBUSTER", str(report))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([SITE, os.environ.get("PYTHONPATH", "")]))
    source, sink, here = ArraySource(CountSettings(count=20)), ArraySink(), ArraySink()
    try:
        ezflow.run(
            components={"SOURCE": source, "SINK": sink, "HERE": here},
            connections=[(source.OUTPUT, sink.INPUT), (source.OUTPUT, here.INPUT)],
            process_components=[source, sink],
            graph_address="127.0.0.1:0",
            end_when_done=True,
        )
    finally:
        in_children = (
            [json.loads(line) for line in report.read_text().splitlines()]
            if (report.exists())
            else []
        )
        # Each blocking call once, where it was made (they repeat per segment).
        calls = {(c["call"], " <- ".join(c["where"][:4])) for c in in_children}
        assert not calls, "\n".join(sorted(f"{call}: {where}" for call, where in calls))
        assert not no_blocking, no_blocking
    assert here.STATE.received == 20
