"""tests/_waiting.py: a wait ends as soon as its condition holds, and fails naming what
it waited for once its deadline has passed."""

from __future__ import annotations

import asyncio
import time

import pytest
from _waiting import wait_until, wait_until_sync


async def test_a_wait_ends_when_its_condition_holds() -> None:
    ready = time.monotonic() + 0.05
    waited = await wait_until(lambda: time.monotonic() >= ready, "the moment")
    assert 0.04 <= waited < 5

    async def later() -> bool:
        await asyncio.sleep(0)
        return time.monotonic() >= ready

    assert await wait_until(later, "the moment, asked by a coroutine") < 5


async def test_a_wait_fails_after_its_deadline_naming_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"not within 0.1 s: the impossible"):
        await wait_until(lambda: False, "the impossible", timeout=0.1)
    assert time.monotonic() - started >= 0.1


def test_the_blocking_wait_does_the_same() -> None:
    ready = time.monotonic() + 0.05
    assert wait_until_sync(lambda: time.monotonic() >= ready, "the moment") >= 0.04
    with pytest.raises(AssertionError, match=r"not within 0.05 s: never"):
        wait_until_sync(lambda: None, "never", timeout=0.05)
