"""What both halves of a stream connection (:mod:`._stream`) write and read: the data
header's size, handshake (control) frames and heartbeat frames."""

from __future__ import annotations

from typing import Any

from .._core._exceptions import ProtocolError
from .._core._framing import DATA_HEADER, HEARTBEAT, HEARTBEAT_BODY, frame
from .._core._liveness import Heartbeat
from .._core._protocol import pack_message, unpack_message

__all__ = ["HEADER_SIZE", "control", "heartbeat_frame", "heartbeat_received", "unpack_control"]

HEADER_SIZE = DATA_HEADER.size


def control(kind: int, message: dict[str, Any]) -> bytes:
    """A handshake frame: the kind byte and a msgpack map."""
    return frame(bytes([kind]) + pack_message(message))


def unpack_control(body: bytes | memoryview) -> dict[str, Any]:
    return unpack_message(memoryview(body)[1:])


def heartbeat_frame(deadline: float) -> bytes:
    """A ``HEARTBEAT`` frame announcing *deadline* (seconds; 0: heartbeats off)."""
    return frame(HEARTBEAT_BODY.pack(HEARTBEAT, round(deadline * 1000)))


def heartbeat_received(heartbeat: Heartbeat | None, body: bytes | memoryview) -> None:
    """A ``HEARTBEAT`` frame arrived (its bytes already counted as life): learn the
    peer's deadline."""
    if len(body) != HEARTBEAT_BODY.size:
        raise ProtocolError(f"HEARTBEAT frame of {len(body)} bytes")
    _, milliseconds = HEARTBEAT_BODY.unpack(body)
    if heartbeat is not None:
        heartbeat.peer_announced(milliseconds / 1000)
