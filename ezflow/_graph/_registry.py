"""The graph server's registry: registrations in, routes out, no sockets.

It holds what clients registered - publishers, subscribers, topic -> topic edges, each
owned by the client (connection) that made it - and computes from them the routes each
client needs: which publishers feed which of its subscribers. The graph server
(:mod:`._server`) feeds it requests and pushes what it computes; the ring watcher
(:mod:`._ringwatch`) registers the rings it finds under :attr:`Registry.watcher`, a
client without a connection.

Rules:

* A client's registrations die with it (:meth:`Registry.remove_client`).
* Publisher and subscriber ids are made by clients and kept across reconnections: a
  known id is accepted again from the same client or from another connection of the
  same process (the registration moves), and refused (``ValueError``) when another
  live process owns it.
* A ring attached by a client (``register_publisher`` with ``ring``) replaces the
  watcher's registration of that ring: one publisher per ring.
* A subscriber is fed by every publisher of its topic and of every topic with a path of
  edges to it (cycles included, each publisher once).
* :meth:`Registry.route_pushes` gives only the clients whose routes changed (a client
  that never had routes and still has none gets nothing).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._core._exceptions import ProtocolError
from .._core._protocol import (
    PublisherInfo,
    address_field,
    check_topic,
    optional_int_field,
    optional_str_field,
)
from .._core._protocol import (
    field as message_field,
)
from .._core._telemetry import ProcessSnapshot

__all__ = [
    "ClientConnection",
    "RegisteredClient",
    "RegisteredPublisher",
    "RegisteredSubscriber",
    "Registry",
]

log = logging.getLogger("ezflow.server")

# The routes of a client without subscribers.
_NO_ROUTES: dict[str, Any] = {"subscribers": {}, "publishers": {}}


class ClientConnection(Protocol):
    """What the registry's users need of a client's connection: a way to push to it."""

    def send_message(self, message: dict[str, Any]) -> None: ...


@dataclass(eq=False)
class RegisteredClient:
    """A connected client process and what it registered; the rest is the server's
    bookkeeping about it (routes pushed and applied, telemetry, tracing)."""

    id: str
    connection: ClientConnection | None  # None: the server's own ring watcher
    pid: int
    host_id: str
    hostname: str
    name: str
    publishers: set[str] = field(default_factory=set)
    subscribers: set[str] = field(default_factory=set)
    edges: set[tuple[str, str]] = field(default_factory=set)
    routes: dict[str, Any] | None = None  # last routes pushed
    pushed_version: int = 0
    applied_version: int = 0
    applied: asyncio.Event = field(default_factory=asyncio.Event)
    telemetry: ProcessSnapshot | None = None  # latest report
    reported_at: float = float("-inf")  # loop time of the latest report
    # Tracing: the client's latest trace state (``trace_state`` or a report) and when
    # it came, the latest lease push it confirmed, its report interval, the lease it
    # left last and the last lease whose hops it reported in full (a report since).
    trace_state: dict[str, Any] | None = None
    trace_state_at: float = float("-inf")
    trace_version: int = 0
    report_interval: float = 0.0
    left_lease: str | None = None
    left_at: float = float("-inf")
    flushed_lease: str | None = None


@dataclass(eq=False)
class RegisteredPublisher:
    id: str
    topic: str
    client: RegisteredClient
    address: tuple[str, int]
    transport: str | None
    shm_address: str | None
    ring: str | None = None  # an ezring ring attached with GraphContext.attach_ring
    ring_created_ns: int | None = None  # which writer of that name (its header's)


@dataclass(eq=False)
class RegisteredSubscriber:
    id: str
    topic: str
    client: RegisteredClient
    leaky: bool
    transport: str | None


class Registry:
    """Registrations and the routes they make (see the module docstring). Not
    thread-safe; the server serialises changes (its lock) so that each change's routes
    are pushed before the next change."""

    def __init__(self, host_id: str, hostname: str) -> None:
        self.clients: dict[str, RegisteredClient] = {}
        self.publishers: dict[str, RegisteredPublisher] = {}
        self.subscribers: dict[str, RegisteredSubscriber] = {}
        self.edges: dict[tuple[str, str], set[str]] = {}  # edge -> owning client ids
        #: The owner of the rings the server registers itself: never in :attr:`clients`
        #: (it has no connection and no subscriber), shown with its id in `ezflow graph`.
        self.watcher = RegisteredClient(
            id="rings",
            connection=None,
            pid=os.getpid(),
            host_id=host_id,
            hostname=hostname,
            name="graph server ring watcher",
        )
        self._next_client = 0
        #: the version of the latest routes computed (:meth:`route_pushes`)
        self.version = 0

    # -- clients ---------------------------------------------------------------------------

    def add_client(
        self, connection: ClientConnection | None, hello: dict[str, Any]
    ) -> RegisteredClient:
        """A new client from its ``hello`` (:class:`ProtocolError` when its ``pid`` or
        ``host_id`` is missing or of another type)."""
        self._next_client += 1  # (also for a hello refused here: ids are never reused)
        client = RegisteredClient(
            id=f"c{self._next_client}",
            connection=connection,
            pid=message_field(hello, "pid", int),
            host_id=message_field(hello, "host_id", str),
            hostname=str(hello.get("hostname", "")),
            name=str(hello.get("name", "")),
        )
        self.clients[client.id] = client
        return client

    def remove_client(self, client: RegisteredClient) -> None:
        """Drop *client* and everything it registered (edges that other clients also
        made stay, theirs)."""
        del self.clients[client.id]
        for pub_id in client.publishers:
            self.publishers.pop(pub_id, None)
        for sub_id in client.subscribers:
            self.subscribers.pop(sub_id, None)
        for edge in client.edges:
            owners = self.edges.get(edge)
            if owners is not None:
                owners.discard(client.id)
                if not owners:
                    del self.edges[edge]

    # -- requests --------------------------------------------------------------------------

    def apply(self, client: RegisteredClient, op: str, message: dict[str, Any]) -> bool:
        """Apply one graph change; return whether routing may have changed. Raises
        ``ValueError`` (or ``TypeError``) for a request that is well formed but not
        acceptable, :class:`ProtocolError` for a malformed one or an unknown *op*.

        A request of a client already removed changes nothing (returns False): the
        server reads a request, then waits for its lock, and the connection may close
        meanwhile; applied, it would register for a gone client what nothing removes."""
        if self.clients.get(client.id) is not client:
            return False
        if op == "register_publisher":
            pub_id = message_field(message, "publisher_id", str)
            topic = check_topic(message_field(message, "topic", str))
            address = address_field(message)
            transport = optional_str_field(message, "transport")
            shm_address = optional_str_field(message, "shm")
            self._claim(client, pub_id)
            ring = optional_str_field(message, "ring")
            watched = self.watched().get(ring) if ring is not None else None
            if watched is not None:
                # attach_ring of a ring the server registered: the client's registration
                # takes its place (one publisher per ring, idempotent by ring name).
                self.unwatch(watched)
            self.publishers[pub_id] = RegisteredPublisher(
                pub_id,
                topic,
                client,
                address,
                transport,
                shm_address,
                ring,
                optional_int_field(message, "ring_created"),
            )
            client.publishers.add(pub_id)
            return True
        if op == "register_subscriber":
            sub_id = message_field(message, "subscriber_id", str)
            topic = check_topic(message_field(message, "topic", str))
            self._claim(client, sub_id)
            self.subscribers[sub_id] = RegisteredSubscriber(
                sub_id,
                topic,
                client,
                bool(message.get("leaky", False)),
                optional_str_field(message, "transport"),
            )
            client.subscribers.add(sub_id)
            return True
        if op == "unregister":
            reg_id = message_field(message, "registration_id", str)
            if reg_id in client.publishers:
                client.publishers.discard(reg_id)
                del self.publishers[reg_id]
                return True
            if reg_id in client.subscribers:
                client.subscribers.discard(reg_id)
                del self.subscribers[reg_id]
                return True
            raise ValueError(f"{reg_id!r} is not a publisher or subscriber of this client")
        if op in ("connect", "disconnect"):
            src = check_topic(message_field(message, "src", str))
            dst = check_topic(message_field(message, "dst", str))
            if src == dst:
                raise ValueError(f"cannot connect topic {src!r} to itself")
            edge = (src, dst)
            if op == "connect":
                owners = self.edges.setdefault(edge, set())
                new = not owners
                owners.add(client.id)
                client.edges.add(edge)
                return new
            owners = self.edges.pop(edge, set())
            if not owners:
                raise ValueError(f"there is no edge {src!r} -> {dst!r}")
            for owner_id in owners:
                owner = self.clients.get(owner_id)
                if owner is not None:
                    owner.edges.discard(edge)
            return True
        raise ProtocolError(f"unknown command {op!r}")

    def _claim(self, client: RegisteredClient, reg_id: str) -> None:
        """Make way for *client* to register *reg_id* (a publisher or subscriber id).

        Ids are made by clients and kept across reconnections, so a known id is
        accepted again: from the same connection (a retried request: the new entry
        replaces the old one) or from a new connection of the same process (its old
        connection is stale and not yet closed here: the registration moves). Raises
        ``ValueError`` when another process's live connection owns it.
        """
        existing = self.publishers.get(reg_id) or self.subscribers.get(reg_id)
        if existing is None:
            return
        owner = existing.client
        if owner is not client:
            if owner.pid != client.pid or owner.host_id != client.host_id:
                raise ValueError(
                    f"id {reg_id!r} is already registered by client {owner.id} "
                    f"({owner.name}, pid {owner.pid}), whose connection is still open; "
                    "publisher and subscriber ids are unique, and a process re-registers "
                    "its own only"
                )
            log.info(
                "client %s (%s, pid %d) re-registers %s, held by its stale connection %s",
                client.id,
                client.name,
                client.pid,
                reg_id,
                owner.id,
            )
        owner.publishers.discard(reg_id)
        owner.subscribers.discard(reg_id)
        self.publishers.pop(reg_id, None)
        self.subscribers.pop(reg_id, None)

    # -- rings the server registers itself ---------------------------------------------------

    def watched(self) -> dict[str, str]:
        """The rings :attr:`watcher` registered: publisher id by ring name."""
        return {
            pub.ring: pub.id
            for pub in self.publishers.values()
            if pub.client is self.watcher and pub.ring is not None
        }

    def attached_rings(self) -> set[str]:
        """The names of every registered ring (the watcher's and the clients')."""
        return {pub.ring for pub in self.publishers.values() if pub.ring is not None}

    def watch(
        self, pub_id: str, topic: str, address: tuple[str, int], ring: str, created: int
    ) -> None:
        """Register the ring *ring* (its writer's ``created_ns``: *created*) as publisher
        *pub_id* of *topic*, owned by :attr:`watcher`."""
        self.publishers[pub_id] = RegisteredPublisher(
            pub_id, topic, self.watcher, address, "ezring", None, ring, created
        )
        self.watcher.publishers.add(pub_id)

    def unwatch(self, pub_id: str) -> bool:
        """Unregister the watcher's publisher *pub_id*; whether it was registered."""
        self.watcher.publishers.discard(pub_id)
        return self.publishers.pop(pub_id, None) is not None

    # -- routing ---------------------------------------------------------------------------

    @staticmethod
    def _sources(topic: str, reverse: dict[str, list[str]]) -> set[str]:
        """Every topic whose messages reach *topic* (itself included)."""
        seen = {topic}
        queue = deque([topic])
        while queue:
            for src in reverse.get(queue.popleft(), ()):
                if src not in seen:
                    seen.add(src)
                    queue.append(src)
        return seen

    def compute_routes(self) -> dict[str, dict[str, Any]]:
        """Per client: ``{"subscribers": {sub_id: [pub_id, ...]}, "publishers":
        {pub_id: info}}`` for every subscriber the client owns (publisher ids sorted)."""
        reverse: dict[str, list[str]] = {}
        for src, dst in self.edges:
            reverse.setdefault(dst, []).append(src)
        by_topic: dict[str, list[RegisteredPublisher]] = {}
        for pub in self.publishers.values():
            by_topic.setdefault(pub.topic, []).append(pub)
        feeds: dict[str, list[RegisteredPublisher]] = {}
        routes: dict[str, dict[str, Any]] = {
            client_id: {"subscribers": {}, "publishers": {}} for client_id in self.clients
        }
        for sub in self.subscribers.values():
            pubs = feeds.get(sub.topic)
            if pubs is None:
                pubs = feeds[sub.topic] = sorted(
                    (
                        pub
                        for topic in self._sources(sub.topic, reverse)
                        for pub in by_topic.get(topic, ())
                    ),
                    key=lambda p: p.id,
                )
            entry = routes[sub.client.id]
            entry["subscribers"][sub.id] = [pub.id for pub in pubs]
            for pub in pubs:
                entry["publishers"][pub.id] = publisher_info(pub)
        return routes

    def route_pushes(self) -> tuple[int, list[tuple[RegisteredClient, dict[str, Any]]]]:
        """A new routes version, and the clients whose routes changed with their new
        routes (recorded as pushed: send them)."""
        self.version += 1
        version = self.version
        pushes = []
        for client_id, routes in self.compute_routes().items():
            client = self.clients[client_id]
            # A client that never had routes has none: nothing to push (nor to wait for:
            # a client busy elsewhere must not delay everyone's requests).
            if routes == (client.routes or _NO_ROUTES):
                continue
            client.routes = routes
            client.pushed_version = version
            pushes.append((client, routes))
        return version, pushes

    # -- inspection ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole graph as plain data (what ``ezflow graph`` shows, but the server
        id)."""
        topics = sorted(
            {p.topic for p in self.publishers.values()}
            | {s.topic for s in self.subscribers.values()}
            | {t for edge in self.edges for t in edge}
        )
        return {
            "topics": topics,
            "clients": [
                {
                    "client_id": c.id,
                    "name": c.name,
                    "pid": c.pid,
                    "hostname": c.hostname,
                    "host_id": c.host_id,
                }
                for c in self.clients.values()
            ],
            "publishers": [
                {
                    "id": p.id,
                    "topic": p.topic,
                    "client_id": p.client.id,
                    "transport": p.transport,
                    **({"ring": p.ring} if p.ring is not None else {}),
                }
                for p in self.publishers.values()
            ],
            "subscribers": [
                {
                    "id": s.id,
                    "topic": s.topic,
                    "client_id": s.client.id,
                    "leaky": s.leaky,
                    "transport": s.transport,
                }
                for s in self.subscribers.values()
            ],
            "edges": [list(edge) for edge in sorted(self.edges)],
        }


def publisher_info(pub: RegisteredPublisher) -> dict[str, Any]:
    """*pub* as a ``routes`` push gives it (:class:`PublisherInfo` on the wire)."""
    return PublisherInfo(
        publisher_id=pub.id,
        topic=pub.topic,
        client_id=pub.client.id,
        host_id=pub.client.host_id,
        pid=pub.client.pid,
        address=pub.address,
        transport=pub.transport,
        shm_address=pub.shm_address,
        ring=pub.ring,
        ring_created_ns=pub.ring_created_ns,
    ).to_wire()
