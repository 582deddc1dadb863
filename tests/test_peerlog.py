"""BadPeerLog: at most BAD_PEER_LOG_FIRST lines per cause and period, and summaries."""

from __future__ import annotations

import asyncio
import logging

import pytest
from _waiting import wait_until
from conftest import loop_kind

from ezflow._core import _peerlog
from ezflow._core._config import BAD_PEER_LOG_FIRST, BAD_PEER_LOG_MAX_CHARS
from ezflow._core._peerlog import BadPeerLog

INTERVAL = 0.4
log = logging.getLogger("ezflow.test_peerlog")


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == log.name]


async def test_each_cause_logs_its_first_few_per_period_and_summaries_count_the_rest(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loop_kind() == "uvloop":
        pytest.skip("only the loop's clock is used; once is enough")
    monkeypatch.setattr(_peerlog, "BAD_PEER_LOG_INTERVAL", INTERVAL)
    caplog.set_level(logging.WARNING, logger=log.name)
    bad = BadPeerLog(log, "test listener")
    for i in range(20):
        bad("protocol", "closing connection %d", i)
    bad("auth", "refusing connection %d", 99)
    lines = _lines(caplog)
    # The first few of each cause, the last of them saying that more are only counted.
    last = BAD_PEER_LOG_FIRST - 1
    assert lines[:last] == [f"test listener: closing connection {i}" for i in range(last)]
    assert lines[last] == (
        f"test listener: closing connection {last} (further ones of this cause are counted "
        f"and summarized, for up to {INTERVAL:.0f} s)"
    )
    assert lines[BAD_PEER_LOG_FIRST:] == ["test listener: refusing connection 99"]
    assert bad.counts == {"protocol": 20, "auth": 1}
    # One summary per interval, for every cause.
    summary = (
        "test listener: 15 more bad connections closed (protocol 15); totals so far: "
        "auth 1, protocol 20"
    )
    await wait_until(lambda: _lines(caplog)[-1] == summary, "the interval's summary")
    # The period is over: the next ones of the cause are logged one by one again.
    caplog.clear()
    for i in range(BAD_PEER_LOG_FIRST + 2):
        bad("protocol", "closing connection %d", i)
    assert len(_lines(caplog)) == BAD_PEER_LOG_FIRST
    bad.close()  # what was not logged is summarized at once, and the timer is gone
    assert _lines(caplog)[-1].startswith("test listener: 2 more bad connections closed")
    assert len(_lines(caplog)) == BAD_PEER_LOG_FIRST + 1
    await asyncio.sleep(INTERVAL * 1.5)  # a window: no other summary in it
    assert len(_lines(caplog)) == BAD_PEER_LOG_FIRST + 1


async def test_a_flood_costs_the_bound_whatever_its_length(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over several periods: at most BAD_PEER_LOG_FIRST lines per cause and period, and
    at most one summary per interval (plus the one at close)."""
    if loop_kind() == "uvloop":
        pytest.skip("only the loop's clock is used; once is enough")
    monkeypatch.setattr(_peerlog, "BAD_PEER_LOG_INTERVAL", INTERVAL)
    caplog.set_level(logging.WARNING, logger=log.name)
    bad = BadPeerLog(log, "flooded", summary="faults")
    loop = asyncio.get_running_loop()
    started = loop.time()
    causes = ("protocol", "timeout", "request")
    while loop.time() - started < INTERVAL * 3.2:
        for cause in causes:
            bad(cause, "bad %s", cause)
        await asyncio.sleep(0.002)
    bad.close()
    elapsed = loop.time() - started
    lines = _lines(caplog)
    summaries = [
        line for line in lines if line.startswith("flooded: ") and " more faults (" in line
    ]
    periods = 1 + int(elapsed / INTERVAL)
    assert len(summaries) <= periods + 1
    for cause in causes:
        one_by_one = [line for line in lines if line.startswith(f"flooded: bad {cause}")]
        assert BAD_PEER_LOG_FIRST * 2 <= len(one_by_one) <= BAD_PEER_LOG_FIRST * periods
    assert sum(bad.counts.values()) > len(lines) * 10  # the flood was mostly counted


def test_a_line_quoting_a_peer_is_cut_to_its_limit(caplog: pytest.LogCaptureFixture) -> None:
    """A 100,000-character command name in a line is cut to BAD_PEER_LOG_MAX_CHARS."""
    caplog.set_level(logging.WARNING, logger=log.name)
    bad = BadPeerLog(log, "cut")
    bad("request", "closing connection: %s", f"unknown command {'x' * 100_000!r}")
    [line] = _lines(caplog)
    assert line.startswith("cut: closing connection: unknown command 'xxx")
    cut = 100_000 + len("closing connection: unknown command ''") - BAD_PEER_LOG_MAX_CHARS
    assert line.endswith(f"xxx... ({cut} more characters)")
    assert len(line) < BAD_PEER_LOG_MAX_CHARS + 50
