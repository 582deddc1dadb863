"""Event-loop choice."""

from __future__ import annotations

import asyncio

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
