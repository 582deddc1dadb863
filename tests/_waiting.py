"""Waiting for a condition with a deadline, instead of sleeping a fixed time and then
asserting: a loaded machine only makes the wait longer, never the test wrong.

A fixed sleep stays only where a test checks that something does NOT happen within a
window (and says so in a comment).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

#: Seconds before a condition that never holds fails its test: generous, since the wait
#: ends as soon as the condition holds.
TIMEOUT = 10.0
#: Seconds between two looks at the condition.
POLL = 0.01


async def wait_until(
    condition: Callable[[], object | Awaitable[object]],
    what: str,
    timeout: float = TIMEOUT,
    poll: float = POLL,
) -> float:
    """Look at *condition* (a function, or a coroutine function) every *poll* seconds
    until it returns something true; return the seconds waited. After *timeout* seconds,
    fail with an AssertionError naming *what* was awaited."""
    started = time.monotonic()
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(poll)


def wait_until_sync(
    condition: Callable[[], object], what: str, timeout: float = TIMEOUT, poll: float = POLL
) -> float:
    """:func:`wait_until` for tests without an event loop (blocks the thread)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(poll)
    return time.monotonic() - started
