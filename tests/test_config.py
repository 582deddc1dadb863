"""Address, size and transport settings: parsing and clear errors."""

from __future__ import annotations

import pytest

from ezflow import ConfigurationError
from ezflow._core import _config


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:25990", ("127.0.0.1", 25990)), ("[::1]:80", ("::1", 80)), ("h:0", ("h", 0))],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert _config.parse_address(text) == expected
    assert _config.parse_address(_config.format_address(expected)) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("localhost", "HOST:PORT"),
        ("h:x", "not a number"),
        ("h:70000", "outside"),
        ("[::1]", "IPv6"),
    ],
)
def test_parse_address_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        _config.parse_address(text)


def test_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _config.parse_size("64M", setting="x") == 64 << 20
    assert _config.parse_size("512KiB", setting="x") == 512 << 10
    assert _config.parse_size("1000", setting="x") == 1000
    with pytest.raises(ConfigurationError, match="EZFLOW_MAX_MESSAGE_SIZE"):
        monkeypatch.setenv("EZFLOW_MAX_MESSAGE_SIZE", "lots")
        _config.max_message_size_from_env()
    monkeypatch.setenv("EZFLOW_MAX_MESSAGE_SIZE", "0")
    with pytest.raises(ConfigurationError, match="positive"):
        _config.max_message_size_from_env()


def test_transport_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EZFLOW_TRANSPORT", "auto")
    assert _config.transport_from_env() is None
    monkeypatch.setenv("EZFLOW_TRANSPORT", "TCP")
    assert _config.transport_from_env() == "tcp"
    monkeypatch.setenv("EZFLOW_TRANSPORT", "udp")
    with pytest.raises(ConfigurationError, match="local, shm, tcp"):
        _config.transport_from_env()


def test_drain_timeout_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EZFLOW_DRAIN_TIMEOUT", raising=False)
    assert _config.drain_timeout_from_env() == _config.DEFAULT_DRAIN_TIMEOUT == 5.0
    monkeypatch.setenv("EZFLOW_DRAIN_TIMEOUT", "0.5")
    assert _config.drain_timeout_from_env() == 0.5
    monkeypatch.setenv("EZFLOW_DRAIN_TIMEOUT", "0")
    assert _config.drain_timeout_from_env() == 0.0
    monkeypatch.setenv("EZFLOW_DRAIN_TIMEOUT", "soon")
    with pytest.raises(ConfigurationError, match="EZFLOW_DRAIN_TIMEOUT='soon' is not a number"):
        _config.drain_timeout_from_env()
    monkeypatch.setenv("EZFLOW_DRAIN_TIMEOUT", "-1")
    with pytest.raises(ConfigurationError, match=r"EZFLOW_DRAIN_TIMEOUT=-1.0 must be .* 0 \(no"):
        _config.drain_timeout_from_env()
    with pytest.raises(ConfigurationError, match="drain_timeout=nan"):
        _config.check_drain_timeout(float("nan"))
