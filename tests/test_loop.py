"""Event-loop choice."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import ezflow


async def _kind() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EZFLOW_EVENT_LOOP", raising=False)
    assert ezflow.lowlevel.run_coroutine(_kind()).startswith("uvloop")


def test_stock_loop_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ezflow.lowlevel.run_coroutine(_kind(), loop="asyncio").startswith("asyncio")
    monkeypatch.setenv("EZFLOW_EVENT_LOOP", "asyncio")
    assert ezflow.lowlevel.run_coroutine(_kind()).startswith("asyncio")


def test_unknown_loop_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EZFLOW_EVENT_LOOP", "trio")
    with pytest.raises(ezflow.ConfigurationError, match="EZFLOW_EVENT_LOOP='trio'"):
        ezflow.lowlevel.loop_factory()


def test_ready_queue_is_the_stock_loops_own_and_nothing_elsewhere() -> None:
    """ready_queue: the ready queue of a stock asyncio loop (what call_soon appends to),
    None for uvloop (its call_soon is compiled), a loop in debug mode, a loop class with
    a call_soon of its own, and anything that is not a loop."""
    import uvloop  # noqa: PLC0415

    from ezflow._core._loop import ready_queue  # noqa: PLC0415

    async def stock() -> None:
        loop = asyncio.get_running_loop()
        ready = ready_queue(loop)
        assert ready is not None
        handle = loop.call_soon(lambda: None)
        assert ready[-1] is handle
        loop.set_debug(True)
        assert ready_queue(loop) is None

    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        runner.run(stock())

    class Custom(asyncio.SelectorEventLoop):
        def call_soon(self, *args: Any, **kwargs: Any) -> asyncio.Handle:
            return super().call_soon(*args, **kwargs)

    async def elsewhere() -> None:
        assert ready_queue(asyncio.get_running_loop()) is None

    for factory in (Custom, uvloop.new_event_loop):
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(elsewhere())
    assert ready_queue(object()) is None


def test_a_lone_wake_handle_runs_now_and_nothing_else_does() -> None:
    """run_lone_wake runs the one queued handle when it is a WakeHandle (the next the
    loop would run, with nothing of this iteration left before it; a cancelled one is
    taken and skipped, as the loop skips it), and leaves the queue alone otherwise: a
    wake-up behind another handle, a plain handle, an empty queue, a loop that is
    stopping."""
    import contextvars  # noqa: PLC0415

    from ezflow._core._loop import WakeHandle, ready_queue, run_lone_wake  # noqa: PLC0415

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ready = ready_queue(loop)
        assert ready is not None
        await asyncio.sleep(0)  # (whatever the runner queued has run)
        ran: list[str] = []
        empty = contextvars.Context()
        wake = WakeHandle(ran.append, ("wake",), loop, empty)
        other = asyncio.Handle(ran.append, ("other",), loop, empty)
        saved = list(ready)
        ready.clear()
        try:
            run_lone_wake(loop, ready)  # (nothing queued)
            ready.append(wake)
            run_lone_wake(loop, ready)
            assert ran == ["wake"] and not ready
            ready.extend((other, wake))
            run_lone_wake(loop, ready)
            assert ran == ["wake"] and list(ready) == [other, wake]
            ready.clear()
            ready.append(other)
            run_lone_wake(loop, ready)
            assert ran == ["wake"] and list(ready) == [other]
            ready.clear()
            cancelled = WakeHandle(ran.append, ("cancelled",), loop, empty)
            cancelled.cancel()
            ready.append(cancelled)
            run_lone_wake(loop, ready)  # (taken, not run: as the loop skips it)
            assert ran == ["wake"] and not ready
            ready.append(wake)
            loop.stop()  # (the loop's next iteration would not come: the wake waits)
            run_lone_wake(loop, ready)
            assert ran == ["wake"] and list(ready) == [wake]
        finally:
            loop._stopping = False  # type: ignore[attr-defined]
            ready.clear()
            ready.extend(saved)

    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        runner.run(main())
