"""Graph-protocol messages: decoding, field checks, topic names."""

from __future__ import annotations

import pytest

from ezflow import ProtocolError
from ezflow._core._protocol import (
    PublisherInfo,
    address_field,
    check_topic,
    field,
    optional_str_field,
    pack_message,
    unpack_message,
)


def test_round_trip() -> None:
    message = {"op": "connect", "id": 3, "src": "/a", "dst": "/b"}
    assert unpack_message(pack_message(message)) == message


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"\xc1", "not valid msgpack"),
        (pack_message([1]), "expected a map"),  # type: ignore[arg-type]
        (pack_message({"id": 1}), "no string 'op'"),
        (pack_message({"op": 5}), "no string 'op'"),
    ],
)
def test_malformed_messages(body: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        unpack_message(body)


def test_field_checks_name_the_field() -> None:
    message = {"op": "x", "n": True, "s": "v", "a": ["h", 1], "bad": ["h", "1"]}
    assert field(message, "s", str) == "v"
    with pytest.raises(ProtocolError, match="'n' must be int, got bool"):
        field(message, "n", int)
    assert address_field(message, "a") == ("h", 1)
    with pytest.raises(ProtocolError, match="'bad' must be"):
        address_field(message, "bad")
    assert optional_str_field(message, "missing") is None
    with pytest.raises(ProtocolError, match="'n' must be a str or nil"):
        optional_str_field(message, "n")


def test_publisher_info_round_trip() -> None:
    info = PublisherInfo("p", "/t", "c1", "host/boot", 42, ("127.0.0.1", 9), "tcp")
    assert PublisherInfo.from_wire(info.to_wire()) == info
    with_shm = PublisherInfo("p", "/t", "c1", "h", 42, ("::1", 9), None, "ezflow-42-" + "a" * 16)
    assert PublisherInfo.from_wire(with_shm.to_wire()) == with_shm
    with pytest.raises(ProtocolError):
        PublisherInfo.from_wire({"publisher_id": "p"})
    with pytest.raises(ProtocolError, match="'shm'"):
        PublisherInfo.from_wire({**info.to_wire(), "shm": 5})


@pytest.mark.parametrize(
    ("topic", "error"),
    [("", ValueError), ("a b", ValueError), ("x" * 513, ValueError), (5, TypeError)],
)
def test_bad_topics(topic: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        check_topic(topic)


def test_good_topics() -> None:
    for topic in ("/sensor/raw", "SINE/OUTPUT", "x" * 512, "ünïcode"):
        assert check_topic(topic) == topic
