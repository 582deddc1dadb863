"""The graph protocol: what clients and the graph server say to each other.

Every control-plane frame body is one msgpack map with a string ``"op"``. A client opens
with ``hello`` (carrying a random ``nonce``) and the server answers ``welcome`` (with
``embedded``: whether a GraphContext runs it, and ``insecure``: whether it serves an
address other than loopback without a token; or ``error`` and closes). A server with a
token first answers ``challenge`` (its nonce and its proof of the token), the client
answers ``auth`` (its proof), and only then comes ``welcome``; see
:mod:`ezflow._core._auth`. An ``error`` in the handshake carries ``"cause"``: ``"auth"``
(a failed authentication, :class:`AuthenticationError` on the client) or ``"protocol"``
(anything else, :class:`ProtocolError`). After that the client sends requests
(``{"op": ..., "id": n, ...}``) and the server answers each with ``{"op": "reply",
"id": n, "ok": true, ...}`` or ``{"op": "reply", "id": n, "ok": false, "error": "..."}``
(a request it refuses). A malformed request gets that refusal too, and then the server
closes the connection; any other breach of the protocol gets an ``error`` naming it
before the close. The server also pushes ``routes`` whenever the set of publishers that
feed one of the client's subscribers changes; the client answers ``routes_applied`` once
its channels match, which is what lets a request such as ``connect`` return only when
data already flows along the new edge. Before it stops on a ``shutdown`` request, the
server pushes ``{"op": "closing", "reason": ...}`` to every client, so that they can tell
a requested stop from a crash.

Telemetry: a client sends ``{"op": "report", "snapshot": {...}}`` (one-way, no reply)
about once a second; the server keeps the latest per client and answers the
``telemetry`` request with ``{"processes": {client_id: snapshot}}`` (see
:mod:`ezflow._core._telemetry`). A snapshot's ``trace`` map carries the trace hops the
process finished since its last report and its trace state (below).

Tracing (docs/tracing.md): the graph's trace rate is a *lease*, ``{"id": str, "rate":
N, "remaining": seconds}`` - a duration, not a time, since clocks of hosts differ. The
``trace_lease`` request (``rate``, ``duration``) makes one; the server sends it to every
client in ``{"op": "trace_lease", "version": v, "lease": {...}}`` and to clients that
connect while it runs in ``welcome``'s ``trace_lease`` (``None``: no lease, so a client
drops any it held), and pushes ``"lease": None`` when it ends (on time, or on an
``end_trace_lease`` request: of any lease, or only of the one its ``lease`` names). A
client holds the lease until then, and at most ``TRACE_LEASE_GRACE`` longer by its own
clock. It answers each push, and ``welcome`` (version 0), with the one-way ``{"op":
"trace_state", "version": v, "state": {...}}`` (its rates: ``rate``, ``own``,
``own_source``, ``lease``, ``left``); the server answers ``trace_lease`` and
``end_trace_lease`` once every client did (or after ``TRACE_LEASE_CONFIRM_TIMEOUT``),
and ``trace_status`` with the lease and every process's state. Its data channels tell
publishers (``HELLO``'s ``traces``) whether the process reports trace hops at all.

The data plane (publisher <-> channel) uses the same framing with a kind byte in front
of each body; see :mod:`ezflow._core._framing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgpack

from ._config import MAX_TOPIC_LENGTH
from ._exceptions import ProtocolError

__all__ = [
    "NOTICE_OPS",
    "PROTOCOL",
    "REQUEST_OPS",
    "PublisherInfo",
    "address_field",
    "check_topic",
    "field",
    "optional_str_field",
    "pack_message",
    "unpack_message",
]

#: Spoken in ``hello``/``welcome`` (graph) and ``HELLO``/``WELCOME`` (data). A peer with
#: another value is refused with a message naming both. Version 2 added the
#: challenge-response handshake (``nonce``, ``challenge``, ``auth``); version 3 made the
#: graph's trace rate a lease (``trace_lease``, ``end_trace_lease``, ``trace_status``,
#: ``trace_state``, replacing ``trace_rate``) and gave trace hops a ``forwarded`` field.
PROTOCOL: Final = "ezflow/3"

#: Requests a client may send after the handshake.
REQUEST_OPS: Final = frozenset(
    {
        "register_publisher",
        "register_subscriber",
        "unregister",
        "connect",
        "disconnect",
        "graph",
        "ping",
        "shutdown",
        "telemetry",
        "traces",
        "trace_lease",
        "end_trace_lease",
        "trace_status",
    }
)

#: One-way messages a client may send after the handshake (no reply).
NOTICE_OPS: Final = frozenset({"routes_applied", "report", "trace_state"})


def pack_message(message: dict[str, Any]) -> bytes:
    """Encode one control message (a frame body, without the length prefix)."""
    return msgpack.packb(message, use_bin_type=True)  # type: ignore[no-any-return]


def unpack_message(body: bytes | memoryview) -> dict[str, Any]:
    """Decode one control message; anything but a map with a str ``op`` is a
    :class:`ProtocolError`."""
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:
        raise ProtocolError(f"control frame is not valid msgpack ({exc})") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"control frame is a {type(message).__name__}, expected a map")
    op = message.get("op")
    if not isinstance(op, str):
        raise ProtocolError("control frame has no string 'op' field")
    return message


def field(message: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``message[name]``, checked to be of *kind*, else :class:`ProtocolError`."""
    value = message.get(name)
    # bool is an int subclass; never accept it where a number is expected.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        expected = (
            kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        )
        raise ProtocolError(
            f"'{message.get('op')}' message field {name!r} must be {expected}, "
            f"got {type(value).__name__}"
        )
    return value


def address_field(message: dict[str, Any], name: str = "address") -> tuple[str, int]:
    """``message[name]`` as a ``(host, port)`` tuple; on the wire it is ``[host, port]``."""
    value = message.get(name)
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], str)
        or not isinstance(value[1], int)
        or isinstance(value[1], bool)
    ):
        raise ProtocolError(f"'{message.get('op')}' message field {name!r} must be [host, port]")
    return value[0], value[1]


def optional_str_field(message: dict[str, Any], name: str) -> str | None:
    """``message[name]`` when it is a str, ``None`` when absent or nil."""
    value = message.get(name)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(
            f"'{message.get('op')}' message field {name!r} must be a str or nil, "
            f"got {type(value).__name__}"
        )
    return value


def optional_int_field(message: dict[str, Any], name: str) -> int | None:
    """``message[name]`` when it is an int (not a bool), ``None`` when absent or nil."""
    value = message.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ProtocolError(
            f"'{message.get('op')}' message field {name!r} must be an int or nil, "
            f"got {type(value).__name__}"
        )
    return value


def check_topic(topic: object) -> str:
    """Validate a topic name; raise ``ValueError`` saying what is wrong.

    A topic is a non-empty str of at most ``MAX_TOPIC_LENGTH`` printable characters with
    no whitespace, for example ``"/sensor/raw"`` or ``"SINE/OUTPUT"``.
    """
    if not isinstance(topic, str):
        raise TypeError(f"a topic is a str, not {type(topic).__name__}")
    if not topic:
        raise ValueError("a topic name cannot be empty")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise ValueError(f"topic name is {len(topic)} characters; the limit is {MAX_TOPIC_LENGTH}")
    if not topic.isprintable() or any(c.isspace() for c in topic):
        raise ValueError(f"topic {topic!r} contains whitespace or unprintable characters")
    return topic


@dataclass(frozen=True, slots=True)
class PublisherInfo:
    """What a client needs to know to reach a publisher; sent in ``routes`` pushes."""

    publisher_id: str
    topic: str
    client_id: str
    host_id: str
    pid: int
    #: TCP address of the data server of the publisher's process
    address: tuple[str, int]
    #: transport the publisher asked for, or None for automatic choice
    transport: str | None = None
    #: name of the publisher process's shm data socket (Linux abstract namespace), or
    #: None when that process cannot serve shared memory
    shm_address: str | None = None
    #: name of the ezring ring (docs/ezring.md) this publisher stands for, or None: its
    #: frames are read from /dev/shm/ezflow-ring-<ring> by each subscribing process
    ring: str | None = None
    #: the ``created_ns`` in that ring's header: which writer of the name it stands for
    #: (a writer restarted under the same name makes another ring, another publisher)
    ring_created_ns: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "publisher_id": self.publisher_id,
            "topic": self.topic,
            "client_id": self.client_id,
            "host_id": self.host_id,
            "pid": self.pid,
            "address": list(self.address),
            "transport": self.transport,
            "shm": self.shm_address,
            "ring": self.ring,
            "ring_created": self.ring_created_ns,
        }

    @classmethod
    def from_wire(cls, data: object) -> PublisherInfo:
        if not isinstance(data, dict):
            raise ProtocolError("publisher info is not a map")
        data.setdefault("op", "publisher")
        return cls(
            publisher_id=field(data, "publisher_id", str),
            topic=field(data, "topic", str),
            client_id=field(data, "client_id", str),
            host_id=field(data, "host_id", str),
            pid=field(data, "pid", int),
            address=address_field(data),
            transport=optional_str_field(data, "transport"),
            shm_address=optional_str_field(data, "shm"),
            ring=optional_str_field(data, "ring"),
            ring_created_ns=optional_int_field(data, "ring_created"),
        )
