"""Topic names that are probably typos (ezflow/_graph/_typos.py): the nearest topic, and
the one warning a graph (at start) or a low-level subscriber (after a grace period) gets."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from _cli_graphs import Takes
from hypothesis import given
from hypothesis import strategies as st

import ezflow
from ezflow._graph import _context
from ezflow._graph._typos import edit_distance, fed_topics, nearest_topic, read_topics
from ezflow.units import Clock


def _reference_distance(a: str, b: str) -> int:
    """Edits with a swap of neighbours counting one (optimal string alignment)."""
    d = [[max(i, j) if not (i and j) else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


@given(st.text("abc/", max_size=8), st.text("abc/", max_size=8), st.integers(0, 4))
def test_edit_distance_is_the_reference_up_to_its_limit(a: str, b: str, limit: int) -> None:
    assert edit_distance(a, b, limit) == min(_reference_distance(a, b), limit + 1)


def test_the_nearest_topic_is_a_typo_away() -> None:
    topics = ["/sensor/raw", "/sensor/filtered", "/fan/2", "/a"]
    assert nearest_topic("/sensor/rwa", topics) == "/sensor/raw"  # a swap: one edit
    assert nearest_topic("/sensor/ra", topics) == "/sensor/raw"
    assert nearest_topic("/sensor/raw", topics) is None  # itself
    assert nearest_topic("/imaging/frames", topics) is None  # nothing near
    assert nearest_topic("/fan/3", topics) is None  # a family of numbered topics
    assert nearest_topic("/b", topics) is None  # too short to tell a typo


def test_fed_and_read_topics_follow_edges() -> None:
    snapshot = {
        "publishers": [{"topic": "/a"}],
        "subscribers": [{"topic": "/z"}],
        "edges": [["/a", "/b"], ["/b", "/c"], ["/y", "/z"]],
    }
    assert fed_topics(snapshot) == {"/a", "/b", "/c"}
    assert read_topics(snapshot) == {"/y", "/z"}


async def test_a_graph_connected_to_a_typo_gets_one_warning(
    server: ezflow.GraphServer, caplog: pytest.LogCaptureFixture
) -> None:
    clock, show = Clock(rate=100.0), Takes()
    async with ezflow.GraphRunner(
        CLOCK=clock,
        SHOW=show,
        connections=[(clock.OUTPUT, "/sensor/raw"), ("/sensor/rwa", show.INPUT)],
        graph_address=server.address,
    ):
        deadline = time.monotonic() + 10
        while "did you mean" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # (nothing more comes)
    warnings = [r.getMessage() for r in caplog.records if "did you mean" in r.getMessage()]
    # One warning for the pair of ends: each names the other.
    assert warnings == [
        "connection 0: nothing subscribes to '/sensor/raw', so what CLOCK.OUTPUT publishes "
        "there goes nowhere; did you mean '/sensor/rwa' (a topic that has a subscriber)?"
    ]


async def test_a_subscriber_of_a_typo_gets_one_warning_after_a_grace_period(
    ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_context, "TYPO_GRACE_PERIOD", 0.2)
    caplog.set_level(logging.WARNING, logger="ezflow.context")
    await ctx.publisher("/sensor/raw")
    await ctx.subscriber("/sensor/rwa")  # no publisher
    await ctx.subscriber("/sensor/raw")  # has one
    late = await ctx.subscriber("/sensor/rae")
    await ctx.publisher("/sensor/rae")  # one came within the grace period
    deadline = time.monotonic() + 10
    while "did you mean" not in caplog.text:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # a window: no second warning in it
    warnings = [r.getMessage() for r in caplog.records if "did you mean" in r.getMessage()]
    assert warnings == [
        "the subscriber of '/sensor/rwa' has had no publisher for 0.2 s; did you mean "
        "'/sensor/raw' (a topic that has a publisher)?"
    ]
    assert late.had_publisher
