"""The graph server: the control plane of one graph.

It owns topics, publishers, subscribers, topic -> topic edges and the client processes
that registered them, and pushes each client the routes it needs (which publishers feed
which of its subscribers). It never touches message data.

Guarantees:

* A client's registrations (publishers, subscribers, the edges it created) live exactly
  as long as its connection. When the connection ends — also when the process is
  SIGKILLed, since the kernel closes its sockets — everything is removed and routes are
  pushed to the remaining clients at once.
* A request that changes routing (``register_*``, ``unregister``, ``connect``,
  ``disconnect``) is answered only after every affected client reported that its
  channels match the new routes, or after ``ROUTE_APPLY_TIMEOUT`` (the late clients are
  logged). So when ``await ctx.connect(a, b)`` returns, data published on ``a`` reaches
  the subscribers of ``b``.
* Bad input closes only the connection it arrived on, with a logged reason: a frame
  that is not msgpack, a length header above the limit (checked before allocating), an
  unknown command, a handshake that is missing, late or of another protocol version.
  Connections are capped at ``MAX_SERVER_CONNECTIONS``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._core._config import (
    CONTROL_MAX_FRAME_SIZE,
    HANDSHAKE_MAX_FRAME_SIZE,
    HANDSHAKE_TIMEOUT,
    MAX_SERVER_CONNECTIONS,
    MAX_TELEMETRY_ENTRIES,
    MAX_TELEMETRY_REPORT_SIZE,
    MIN_TELEMETRY_INTERVAL,
    ROUTE_APPLY_TIMEOUT,
    Address,
    format_address,
    graph_address_from_env,
    parse_address,
)
from .._core._exceptions import ProtocolError
from .._core._framing import FramedProtocol
from .._core._protocol import (
    NOTICE_OPS,
    PROTOCOL,
    REQUEST_OPS,
    PublisherInfo,
    address_field,
    check_topic,
    optional_str_field,
    pack_message,
    unpack_message,
)
from .._core._protocol import (
    field as message_field,
)
from .._core._telemetry import ProcessSnapshot
from .._transports._shm import SegmentSweeper
from ._client import host_id
from ._metrics import MetricsServer

__all__ = ["GraphServer"]

log = logging.getLogger("ezflow.server")

# A client that lets this much pushed data pile up unread is dropped.
_MAX_WRITE_BUFFER = 64 * 1024 * 1024
# Requests a client may have waiting for an answer at once.
_MAX_PENDING_REQUESTS = 1024


@dataclass(eq=False)
class _Client:
    id: str
    connection: _ServerConnection
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


@dataclass(eq=False)
class _Publisher:
    id: str
    topic: str
    client: _Client
    address: tuple[str, int]
    transport: str | None
    shm_address: str | None
    ring: str | None = None  # an ezring ring attached with GraphContext.attach_ring


@dataclass(eq=False)
class _Subscriber:
    id: str
    topic: str
    client: _Client
    leaky: bool
    transport: str | None


class GraphServer:
    """The graph server. Use as ``async with GraphServer(address) as server`` or call
    :meth:`start` / :meth:`aclose`.

    *address* is ``(host, port)`` or ``"host:port"``; ``None`` reads
    ``EZFLOW_GRAPH_ADDRESS`` (default ``127.0.0.1:25990``). Port 0 picks a free port;
    :attr:`address` tells which.

    Telemetry: the server keeps the latest snapshot each client reports (dropped with
    the client) and serves them to ``telemetry`` requests (``ezflow top``). With
    *metrics_port* (0: any free port) it also serves them in the Prometheus text format
    at ``http://HOST:PORT/metrics``, on the host of *address*; see :attr:`metrics_address`.
    """

    def __init__(
        self, address: Address | str | None = None, *, metrics_port: int | None = None
    ) -> None:
        if address is None:
            address = graph_address_from_env()
        elif isinstance(address, str):
            address = parse_address(address)
        self._requested_address: Address = address
        self._server: asyncio.AbstractServer | None = None
        self._address: Address | None = None
        self.server_id = secrets.token_hex(4)
        self._connections: set[_ServerConnection] = set()
        self._clients: dict[str, _Client] = {}
        self._publishers: dict[str, _Publisher] = {}
        self._subscribers: dict[str, _Subscriber] = {}
        self._edges: dict[tuple[str, str], set[str]] = {}  # edge -> owning client ids
        self._next_client = 0
        self._version = 0
        self._lock = asyncio.Lock()
        self._closed = asyncio.Event()
        # Shared-memory segments of crashed processes on this host: swept at start and
        # after a client that published goes away.
        self._sweeper = SegmentSweeper()
        self._host_id = host_id()
        self.rejected_connections = 0
        self._shutdown: asyncio.Handle | None = None
        self._shutdown_task: asyncio.Task[None] | None = None
        self._metrics: MetricsServer | None = None
        if metrics_port is not None:
            if isinstance(metrics_port, bool) or not 0 <= metrics_port <= 65535:
                raise ValueError(f"metrics_port={metrics_port!r} is outside 0..65535")
            self._metrics = MetricsServer(
                (address[0], metrics_port), lambda: self.telemetry().items()
            )
        self.ignored_reports = 0

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def address(self) -> Address:
        """The address the server listens on (with the real port when 0 was asked)."""
        if self._address is None:
            raise RuntimeError("the graph server is not started")
        return self._address

    async def start(self) -> None:
        """Bind and start accepting clients. Raises ``OSError`` when the address is
        taken (a running server there can be used instead)."""
        loop = asyncio.get_running_loop()
        host, port = self._requested_address
        self._server = await loop.create_server(
            self._new_connection, host, port, reuse_address=True, backlog=256
        )
        sockname = self._server.sockets[0].getsockname()
        self._address = (sockname[0], sockname[1])
        self._sweeper.sweep_now()
        if self._metrics is not None:
            try:
                await self._metrics.start()
            except OSError:
                self._server.close()
                self._server = None
                raise
        log.info("graph server %s listening on %s", self.server_id, format_address(self._address))

    @property
    def metrics_address(self) -> Address | None:
        """Where the Prometheus endpoint listens (``None`` without *metrics_port*)."""
        return None if self._metrics is None else self._metrics.address

    async def __aenter__(self) -> GraphServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def serve_forever(self) -> None:
        """Run until :meth:`aclose` is called or a client sends ``shutdown``."""
        await self._closed.wait()

    async def aclose(self) -> None:
        """Stop listening and drop every client. Idempotent, cancellation-safe (all the
        closing happens synchronously before the first await)."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.abort()
        self._closed.set()
        try:
            if self._metrics is not None:
                await self._metrics.aclose()
            if self._server is not None:
                server, self._server = self._server, None
                try:
                    await asyncio.wait_for(server.wait_closed(), 2.0)
                except (TimeoutError, asyncio.TimeoutError):
                    log.debug("graph server: connections still closing after 2 s")
        finally:
            await self._sweeper.aclose()

    def _start_shutdown(self) -> None:
        self._shutdown_task = asyncio.ensure_future(self.aclose())

    def _new_connection(self) -> _ServerConnection:
        return _ServerConnection(self)

    # -- connection events -----------------------------------------------------------------

    def _connection_opened(self, connection: _ServerConnection) -> bool:
        if len(self._connections) >= MAX_SERVER_CONNECTIONS:
            self.rejected_connections += 1
            log.warning(
                "graph server: refusing connection from %s: already %d connections "
                "(MAX_SERVER_CONNECTIONS)",
                connection.peer_name(),
                len(self._connections),
            )
            return False
        self._connections.add(connection)
        return True

    def _connection_closed(self, connection: _ServerConnection) -> None:
        self._connections.discard(connection)
        client = connection.client
        if client is None:
            return
        connection.client = None
        del self._clients[client.id]
        client.applied.set()  # nobody waits for a gone client
        log.info(
            "client %s (%s, pid %d) disconnected: removing %d publishers, %d subscribers, %d edges",
            client.id,
            client.name,
            client.pid,
            len(client.publishers),
            len(client.subscribers),
            len(client.edges),
        )
        for pub_id in client.publishers:
            self._publishers.pop(pub_id, None)
        if client.publishers and client.host_id == self._host_id and not self._closed.is_set():
            # A crashed publisher leaves its segments behind; a clean one has removed
            # them already and the sweep finds nothing.
            self._sweeper.sweep_soon()
        for sub_id in client.subscribers:
            self._subscribers.pop(sub_id, None)
        for edge in client.edges:
            owners = self._edges.get(edge)
            if owners is not None:
                owners.discard(client.id)
                if not owners:
                    del self._edges[edge]
        if not self._closed.is_set():
            self._push_routes()

    def _hello(self, connection: _ServerConnection, message: dict[str, Any]) -> _Client:
        protocol = message.get("protocol")
        if protocol != PROTOCOL:
            raise ProtocolError(
                f"client speaks protocol {protocol!r}, this server speaks {PROTOCOL!r}; "
                "use the same ezflow version on every host of a graph"
            )
        self._next_client += 1
        client = _Client(
            id=f"c{self._next_client}",
            connection=connection,
            pid=message_field(message, "pid", int),
            host_id=message_field(message, "host_id", str),
            hostname=str(message.get("hostname", "")),
            name=str(message.get("name", "")),
        )
        self._clients[client.id] = client
        log.debug("client %s connected: %s pid %d", client.id, client.name, client.pid)
        return client

    # -- requests ------------------------------------------------------------------------

    async def _handle_request(self, client: _Client, message: dict[str, Any]) -> dict[str, Any]:
        op = message["op"]
        if op == "ping":
            return {}
        if op == "graph":
            return self.snapshot()
        if op == "telemetry":
            return {
                "processes": {
                    client_id: snapshot.to_wire()
                    for client_id, snapshot in self.telemetry().items()
                }
            }
        if op == "shutdown":
            log.info("graph server: shutdown requested by client %s (%s)", client.id, client.name)
            # After this reply is written; keep a reference, the loop only holds tasks weakly.
            self._shutdown = asyncio.get_running_loop().call_soon(self._start_shutdown)
            return {}
        async with self._lock:
            changed = self._mutate(client, op, message)
            version = self._push_routes() if changed else 0
        if version:
            await self._wait_applied(version)
        return {}

    def _mutate(self, client: _Client, op: str, message: dict[str, Any]) -> bool:
        """Apply one graph change; return whether routing may have changed. Raises
        ``ValueError`` for a request that is well formed but not acceptable."""
        if op == "register_publisher":
            pub_id = message_field(message, "publisher_id", str)
            topic = check_topic(message_field(message, "topic", str))
            address = address_field(message)
            transport = optional_str_field(message, "transport")
            shm_address = optional_str_field(message, "shm")
            if pub_id in self._publishers or pub_id in self._subscribers:
                raise ValueError(f"id {pub_id!r} is already registered")
            self._publishers[pub_id] = _Publisher(
                pub_id,
                topic,
                client,
                address,
                transport,
                shm_address,
                optional_str_field(message, "ring"),
            )
            client.publishers.add(pub_id)
            return True
        if op == "register_subscriber":
            sub_id = message_field(message, "subscriber_id", str)
            topic = check_topic(message_field(message, "topic", str))
            if sub_id in self._publishers or sub_id in self._subscribers:
                raise ValueError(f"id {sub_id!r} is already registered")
            self._subscribers[sub_id] = _Subscriber(
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
                del self._publishers[reg_id]
                return True
            if reg_id in client.subscribers:
                client.subscribers.discard(reg_id)
                del self._subscribers[reg_id]
                return True
            raise ValueError(f"{reg_id!r} is not a publisher or subscriber of this client")
        if op in ("connect", "disconnect"):
            src = check_topic(message_field(message, "src", str))
            dst = check_topic(message_field(message, "dst", str))
            if src == dst:
                raise ValueError(f"cannot connect topic {src!r} to itself")
            edge = (src, dst)
            if op == "connect":
                owners = self._edges.setdefault(edge, set())
                new = not owners
                owners.add(client.id)
                client.edges.add(edge)
                return new
            owners = self._edges.pop(edge, set())
            if not owners:
                raise ValueError(f"there is no edge {src!r} -> {dst!r}")
            for owner_id in owners:
                owner = self._clients.get(owner_id)
                if owner is not None:
                    owner.edges.discard(edge)
            return True
        raise ProtocolError(f"unknown command {op!r}")

    # -- routing -------------------------------------------------------------------------

    def _sources(self, topic: str, reverse: dict[str, list[str]]) -> set[str]:
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
        {pub_id: info}}`` for every subscriber the client owns."""
        reverse: dict[str, list[str]] = {}
        for src, dst in self._edges:
            reverse.setdefault(dst, []).append(src)
        by_topic: dict[str, list[_Publisher]] = {}
        for pub in self._publishers.values():
            by_topic.setdefault(pub.topic, []).append(pub)
        feeds: dict[str, list[_Publisher]] = {}
        routes: dict[str, dict[str, Any]] = {
            client_id: {"subscribers": {}, "publishers": {}} for client_id in self._clients
        }
        for sub in self._subscribers.values():
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
                entry["publishers"][pub.id] = self._publisher_info(pub)
        return routes

    @staticmethod
    def _publisher_info(pub: _Publisher) -> dict[str, Any]:
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
        ).to_wire()

    def _push_routes(self) -> int:
        """Send changed routes to the clients concerned; return the version sent."""
        self._version += 1
        version = self._version
        for client_id, routes in self.compute_routes().items():
            client = self._clients[client_id]
            if routes == client.routes:
                continue
            client.routes = routes
            client.pushed_version = version
            client.connection.send_message({"op": "routes", "version": version, **routes})
        return version

    async def _wait_applied(self, version: int) -> None:
        waiting = [
            c for c in self._clients.values() if c.pushed_version >= version > c.applied_version
        ]
        if not waiting:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ROUTE_APPLY_TIMEOUT
        for client in waiting:
            while client.applied_version < version and client.id in self._clients:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    log.warning(
                        "client %s (%s, pid %d) has not applied routes version %d after "
                        "%.0f s; answering without it",
                        client.id,
                        client.name,
                        client.pid,
                        version,
                        ROUTE_APPLY_TIMEOUT,
                    )
                    break
                # Clearing cannot lose a wake-up: nothing runs between the check above
                # and the wait below, and set() wakes every waiter present at that time.
                client.applied.clear()
                try:
                    await asyncio.wait_for(client.applied.wait(), remaining)
                except (TimeoutError, asyncio.TimeoutError):
                    continue

    def _routes_applied(self, client: _Client, version: int) -> None:
        client.applied_version = max(client.applied_version, version)
        client.applied.set()

    # -- inspection ----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole graph as plain data (what ``ezflow graph`` shows)."""
        topics = sorted(
            {p.topic for p in self._publishers.values()}
            | {s.topic for s in self._subscribers.values()}
            | {t for edge in self._edges for t in edge}
        )
        return {
            "server_id": self.server_id,
            "topics": topics,
            "clients": [
                {
                    "client_id": c.id,
                    "name": c.name,
                    "pid": c.pid,
                    "hostname": c.hostname,
                    "host_id": c.host_id,
                }
                for c in self._clients.values()
            ],
            "publishers": [
                {"id": p.id, "topic": p.topic, "client_id": p.client.id, "transport": p.transport}
                for p in self._publishers.values()
            ],
            "subscribers": [
                {
                    "id": s.id,
                    "topic": s.topic,
                    "client_id": s.client.id,
                    "leaky": s.leaky,
                    "transport": s.transport,
                }
                for s in self._subscribers.values()
            ],
            "edges": [list(edge) for edge in sorted(self._edges)],
        }

    @property
    def clients(self) -> Iterable[str]:
        return tuple(self._clients)

    # -- telemetry -------------------------------------------------------------------------

    def telemetry(self) -> dict[str, ProcessSnapshot]:
        """The latest telemetry snapshot of every connected client that reported, by
        client id."""
        return {
            client.id: client.telemetry
            for client in self._clients.values()
            if client.telemetry is not None
        }

    def _report(self, client: _Client, message: dict[str, Any], size: int) -> None:
        """Keep *client*'s latest snapshot. A report that is too large, too early
        (faster than half of ``MIN_TELEMETRY_INTERVAL``) or malformed is ignored and
        logged (rate-limited): telemetry never costs a client its connection."""
        now = asyncio.get_running_loop().time()
        reason = None
        if size > MAX_TELEMETRY_REPORT_SIZE:
            reason = f"{size} bytes exceeds MAX_TELEMETRY_REPORT_SIZE"
        elif now - client.reported_at < MIN_TELEMETRY_INTERVAL / 2:
            reason = "reports arrive faster than MIN_TELEMETRY_INTERVAL"
        else:
            try:
                client.telemetry = ProcessSnapshot.from_wire(
                    message.get("snapshot"), limit=MAX_TELEMETRY_ENTRIES
                )
                client.reported_at = now
                return
            except ProtocolError as exc:
                reason = str(exc)
        self.ignored_reports += 1
        if self.ignored_reports <= 5 or self.ignored_reports % 1000 == 0:
            log.warning(
                "graph server: ignoring a telemetry report of client %s (%s, pid %d): %s",
                client.id,
                client.name,
                client.pid,
                reason,
            )


class _ServerConnection(FramedProtocol):
    """One client's control connection, as seen by the server."""

    def __init__(self, server: GraphServer) -> None:
        super().__init__(HANDSHAKE_MAX_FRAME_SIZE)
        self.server = server
        self.client: _Client | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._requests: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_MAX_PENDING_REQUESTS)
        self._worker: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self.server._connection_opened(self):
            self.abort()
            return
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)

    def _handshake_timeout(self) -> None:
        if self.client is None:
            log.warning(
                "graph server: closing connection from %s: no hello within %.0f s",
                self.peer_name(),
                HANDSHAKE_TIMEOUT,
            )
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self._worker is not None:
            self._worker.cancel()
        self.server._connection_closed(self)

    def send_message(self, message: dict[str, Any]) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.send_frame(pack_message(message))
        if transport.get_write_buffer_size() > _MAX_WRITE_BUFFER:
            log.warning(
                "graph server: dropping client at %s: it left %d bytes of pushed data unread",
                self.peer_name(),
                transport.get_write_buffer_size(),
            )
            self.abort()

    def frame_received(self, body: bytes | memoryview) -> None:
        message = unpack_message(body)
        op = message["op"]
        client = self.client
        if client is None:
            if op != "hello":
                raise ProtocolError(f"expected 'hello' first, got {op!r}")
            try:
                client = self.server._hello(self, message)
            except ProtocolError as exc:
                self.send_message({"op": "error", "error": str(exc)})
                raise
            self.client = client
            if self._handshake_timer is not None:
                self._handshake_timer.cancel()
            self.max_frame_size = CONTROL_MAX_FRAME_SIZE
            self.send_message(
                {
                    "op": "welcome",
                    "protocol": PROTOCOL,
                    "client_id": client.id,
                    "server_id": self.server.server_id,
                }
            )
            self._worker = asyncio.ensure_future(self._serve_requests(client))
            return
        if op in NOTICE_OPS:
            if op == "routes_applied":
                self.server._routes_applied(client, message_field(message, "version", int))
            else:
                self.server._report(client, message, len(body))
            return
        if op not in REQUEST_OPS:
            raise ProtocolError(f"unknown command {op!r}")
        message_field(message, "id", int)
        try:
            self._requests.put_nowait(message)
        except asyncio.QueueFull:
            raise ProtocolError(
                f"more than {_MAX_PENDING_REQUESTS} requests waiting for an answer"
            ) from None

    async def _serve_requests(self, client: _Client) -> None:
        while True:
            message = await self._requests.get()
            request_id = message["id"]
            try:
                result = await self.server._handle_request(client, message)
            except (ValueError, TypeError) as exc:
                self.send_message({"op": "reply", "id": request_id, "ok": False, "error": str(exc)})
                continue
            except ProtocolError as exc:
                self.send_message({"op": "reply", "id": request_id, "ok": False, "error": str(exc)})
                log.warning("graph server: closing connection of client %s: %s", client.id, exc)
                self.abort()
                return
            self.send_message({"op": "reply", "id": request_id, "ok": True, **result})
