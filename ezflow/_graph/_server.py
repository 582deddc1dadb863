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
  unknown command or a malformed request, a handshake that is missing, late or of
  another protocol version. Connections are capped at ``MAX_SERVER_CONNECTIONS``. The
  peer is told why first (``error``, or the ``reply`` of the request at fault), unless
  it is not reading. Such connections are logged per cause and rate-limited, before the
  handshake and after it (:class:`~ezflow._core._peerlog.BadPeerLog`; causes ``limit``,
  ``timeout``, ``protocol``, ``auth`` before, ``request``, ``silent``, ``unread``
  after), and so are the telemetry reports and route updates a client gets wrong.
* With a token, only clients that prove they know it are admitted (challenge-response,
  :mod:`ezflow._core._auth`); without one, a server refuses to bind a non-loopback
  address unless told ``insecure=True``, and then it logs a warning at start and tells
  every client so in ``welcome`` (``insecure``: ``ezflow top`` and ``ezflow graph``
  show it). With TLS files, clients must present a certificate signed by the graph's CA.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._core._auth import Credentials, Responder, TlsFiles, Token, is_loopback
from .._core._config import (
    CONTROL_MAX_FRAME_SIZE,
    EMBEDDED_SERVER_STOP_TIMEOUT,
    EZRING_WATCH_INTERVAL,
    HANDSHAKE_MAX_FRAME_SIZE,
    HANDSHAKE_TIMEOUT,
    MAX_SERVER_CONNECTIONS,
    MAX_TELEMETRY_ENTRIES,
    MAX_TELEMETRY_REPORT_SIZE,
    MIN_TELEMETRY_INTERVAL,
    ROUTE_APPLY_TIMEOUT,
    TRACE_FLUSH_SETTLE,
    TRACE_LEASE_CONFIRM_TIMEOUT,
    TRACE_SERVER_KEEP,
    Address,
    check_trace_lease_duration,
    format_address,
    graph_address_from_env,
    heartbeat_deadline_from_env,
    parse_address,
    shm_dir_from_env,
    watch_rings_from_env,
)
from .._core._exceptions import AuthenticationError, ConfigurationError, ProtocolError
from .._core._framing import FramedProtocol, frame
from .._core._liveness import Heartbeat, tune_keepalive
from .._core._loop import loop_factory
from .._core._peerlog import BadPeerLog
from .._core._protocol import (
    NOTICE_OPS,
    PROTOCOL,
    REQUEST_OPS,
    PublisherInfo,
    address_field,
    check_topic,
    optional_int_field,
    optional_str_field,
    pack_message,
    unpack_message,
)
from .._core._protocol import (
    field as message_field,
)
from .._core._telemetry import HistogramSnapshot, ProcessSnapshot, PublisherSnapshot
from .._core._tracing import check_rows, check_trace_rate, check_trace_state
from .._transports import LiveRing, SegmentSweeper, scan_rings, sweep_stale_rings
from ._client import host_id
from ._metrics import MetricsServer
from ._traces import REPORTED_FIELDS

__all__ = ["EmbeddedGraphServer", "GraphServer"]

log = logging.getLogger("ezflow.server")

# A client that lets this much pushed data pile up unread is dropped.
_MAX_WRITE_BUFFER = 64 * 1024 * 1024
# Requests a client may have waiting for an answer at once.
_MAX_PENDING_REQUESTS = 1024
# The routes of a client without subscribers.
_NO_ROUTES: dict[str, Any] = {"subscribers": {}, "publishers": {}}


def _ring_publisher(name: str, ring: LiveRing) -> str:
    """The publisher id of a watched ring: one per writer (the ring's creation time), so a
    writer that restarts under the same name is a new publisher, not the one that ended."""
    return f"p-ring-{name}-{ring.header.created_ns:x}"


def _sweep_and_scan_rings() -> dict[str, LiveRing]:
    """Remove the files of dead writers' rings, then find the live ones (file I/O: in a
    worker thread)."""
    sweep_stale_rings(report=True)
    return scan_rings(report=True)


@dataclass(eq=False)
class _Client:
    id: str
    connection: _ServerConnection | None  # None: the server's own ring watcher
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
class _Publisher:
    id: str
    topic: str
    client: _Client
    address: tuple[str, int]
    transport: str | None
    shm_address: str | None
    ring: str | None = None  # an ezring ring attached with GraphContext.attach_ring
    ring_created_ns: int | None = None  # which writer of that name (its header's)


@dataclass(eq=False)
class _TraceLease:
    """The graph's trace rate for a while (``ezflow trace --sample N --duration S``)."""

    id: str
    rate: int
    duration: float
    expires_at: float  # loop time
    by: str  # who asked for it
    timer: asyncio.TimerHandle | None = None

    def to_wire(self, now: float) -> dict[str, Any]:
        """What clients get: a duration (``remaining``), not a time - clocks differ."""
        remaining = round(max(0.0, self.expires_at - now), 3)
        return {"id": self.id, "rate": self.rate, "remaining": remaining}

    def describe(self, now: float) -> dict[str, Any]:
        return {**self.to_wire(now), "duration": self.duration, "by": self.by}


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

    Security (docs/security.md): *token* (default ``EZFLOW_TOKEN``, else the file named by
    ``EZFLOW_TOKEN_FILE``) is required of every client in the handshake; *tls*
    (default ``EZFLOW_TLS_CERT``/``_KEY``/``_CA``) makes the connections TLS with
    certificates verified both ways. Bound to an address other than loopback without a
    token, the constructor raises :class:`~ezflow.ConfigurationError` unless *insecure*
    is true (a trusted network); then :attr:`insecure` is true, :meth:`start` logs a
    warning, and every client is told in ``welcome``.

    Rings (docs/ezring.md): with *watch_rings* (default ``EZFLOW_WATCH_RINGS``, else on)
    the server scans the shm
    directory every ``EZRING_WATCH_INTERVAL`` for live ezring rings of its own user
    (mode-0600 files of its uid, writer alive, not closed) and registers each as a
    publisher of the topic in its header, as :meth:`GraphContext.attach_ring` does; it
    unregisters it when the ring is closed, its writer dies or its file is gone. A ring
    some client attached explicitly is left to that client.
    """

    def __init__(
        self,
        address: Address | str | None = None,
        *,
        metrics_port: int | None = None,
        token: Token | str | bytes | None = None,
        tls: TlsFiles | None = None,
        insecure: bool = False,
        watch_rings: bool | None = None,
    ) -> None:
        if address is None:
            address = graph_address_from_env()
        elif isinstance(address, str):
            address = parse_address(address)
        self._credentials = Credentials.resolve(token, tls)
        shm_dir_from_env()  # (its sweeps read it; a relative path is an error here)
        if self._credentials.token is None and not insecure and not is_loopback(address[0]):
            raise ConfigurationError(
                f"refusing to serve on {format_address(address)} without a token: anyone "
                "who reaches it could read, inject and stop the graph; give a token "
                "(--token-file PATH, EZFLOW_TOKEN or token=) or, on a trusted network, "
                "--insecure (insecure=True)"
            )
        #: Whether it serves an address other than loopback without a token
        #: (``insecure=True``): warned about at start and told to every client.
        self.insecure = self._credentials.token is None and not is_loopback(address[0])
        #: bad connections, logged per cause and rate-limited (see the module docstring)
        self.bad_peers = BadPeerLog(log, "graph server")
        #: faults of admitted clients that cost them no connection (a telemetry report
        #: ignored, routes not applied in time), logged the same way
        self.client_faults = BadPeerLog(
            log, "graph server", summary="client faults (ignored reports, late routes)"
        )
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
        self._sweeper = SegmentSweeper(report=True)
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
        #: the newest trace hops every client reported (TRACE_SERVER_KEEP), each row
        #: HOP_FIELDS plus the reporting process's name and wall-clock offset
        self.trace_hops: deque[list[Any]] = deque(maxlen=TRACE_SERVER_KEEP)
        #: how many hops were ever reported (the index the next one gets)
        self.trace_hops_received = 0
        #: the graph's trace lease, pushed to every client (None: each traces at its own
        #: rate); ended by its timer, a newer lease or an ``end_trace_lease`` request
        self.trace_lease: _TraceLease | None = None
        #: the last lease that ended: id, rate, loop time, how
        self._trace_lease_ended: dict[str, Any] | None = None
        self._trace_leases = 0
        self._trace_version = 0  # lease pushes so far
        self._trace_confirmed = asyncio.Event()  # a client confirmed a lease push
        #: Whether a GraphContext runs this server (EmbeddedGraphServer): told to
        #: clients in ``welcome``, so that they take over an embedded server whose
        #: process left, but wait for a standalone one (``ezflow serve``) to come back.
        self.embedded = False
        #: seconds a client may stay silent before it is declared dead (0: never)
        self.heartbeat_deadline = heartbeat_deadline_from_env()
        #: clients declared dead: silent for longer than the heartbeat deadline
        self.dead_clients = 0
        self._watch_rings = watch_rings_from_env() if watch_rings is None else watch_rings
        self._ring_task: asyncio.Task[None] | None = None
        # The owner of the rings the server registers itself: never in _clients (it
        # has no connection and no subscriber), shown with its id in `ezflow graph`.
        self._ring_client = _Client(
            id="rings",
            connection=None,
            pid=os.getpid(),
            host_id=self._host_id,
            hostname=socket.gethostname(),
            name="graph server ring watcher",
        )
        self._watched: dict[str, str] = {}  # ring name -> publisher id
        self._ring_bad_topics: set[str] = set()  # rings whose topic was refused (logged)
        # Telemetry of the watched rings: the latest scan and the one before (rates).
        self._ring_scan: tuple[float, dict[str, LiveRing]] = (0.0, {})
        self._ring_previous: tuple[float, dict[str, LiveRing]] = (0.0, {})

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def address(self) -> Address:
        """The address the server listens on (with the real port when 0 was asked)."""
        if self._address is None:
            raise RuntimeError("the graph server is not started")
        return self._address

    async def start(self) -> None:
        """Bind and start accepting clients. Raises ``OSError`` when the address (or
        the metrics port) is taken - a running server there can be used instead - and
        only then: whatever is in the shm directory, the start does not fail because of
        it. A failed start leaves nothing open (the listening socket is closed)."""
        loop = asyncio.get_running_loop()
        host, port = self._requested_address
        self._server = await loop.create_server(
            self._new_connection,
            host,
            port,
            reuse_address=True,
            backlog=256,
            ssl=self._credentials.server_ssl,
        )
        try:
            sockname = self._server.sockets[0].getsockname()
            self._address = (sockname[0], sockname[1])
            try:
                await self._sweeper.sweep()
            except Exception:  # the sweep never raises; if it did, serving matters more
                log.exception("graph server: sweeping the shm directory failed")
            if self._metrics is not None:
                await self._metrics.start()
            if self._watch_rings:
                self._ring_task = asyncio.create_task(self._watch_rings_forever())
        except BaseException:
            server, self._server = self._server, None
            server.close()
            self._address = None
            raise
        log.info(
            "graph server %s listening on %s (%s)",
            self.server_id,
            format_address(self._address),
            ", ".join(
                [
                    "token required" if self._credentials.token else "no token",
                    "TLS" if self._credentials.tls else "no TLS",
                ]
            ),
        )
        if self.insecure:
            log.warning(
                "graph server %s on %s runs insecure (no token, on an address other than "
                "loopback): anyone who can reach it can read, inject and stop the graph; "
                "give it a token (--token-file PATH) unless this network is trusted",
                self.server_id,
                format_address(self._address),
            )

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
        self.bad_peers.close()
        self.client_faults.close()
        ring_task, self._ring_task = self._ring_task, None
        if ring_task is not None:
            ring_task.cancel()
        try:
            if ring_task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await ring_task
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

    async def _watch_rings_forever(self) -> None:
        """Register and unregister live rings until cancelled (by :meth:`aclose`); remove
        the files of rings whose writer died, at each scan."""
        while True:
            try:
                rings = await asyncio.to_thread(_sweep_and_scan_rings)  # (no file I/O on the loop)
                self._ring_previous, self._ring_scan = self._ring_scan, (time.time(), rings)
                async with self._lock:
                    if self._update_rings(rings):
                        self._push_routes()
            except Exception:  # a bad scan must not stop the watching
                log.exception("graph server: scanning for ezring rings failed")
            await asyncio.sleep(EZRING_WATCH_INTERVAL)

    def _update_rings(self, rings: dict[str, LiveRing]) -> bool:
        """Make the watched publishers those of *rings* (live rings by name); return
        whether anything changed."""
        changed = False
        for name, pub_id in list(self._watched.items()):
            ring = rings.get(name)
            if (
                ring is None
                or pub_id not in self._publishers
                or pub_id != _ring_publisher(name, ring)
            ):
                del self._watched[name]
                self._ring_client.publishers.discard(pub_id)
                changed |= self._publishers.pop(pub_id, None) is not None
                log.info("graph server: ezring %s is gone, unregistered", name)
        attached = {pub.ring for pub in self._publishers.values() if pub.ring is not None}
        for name, ring in rings.items():
            header = ring.header
            if name in attached or not header.topic:
                continue  # a client attached it, or no topic to publish it under
            try:
                topic = check_topic(header.topic)
            except ValueError as error:
                if name not in self._ring_bad_topics:  # (once per ring name)
                    self._ring_bad_topics.add(name)
                    log.warning("graph server: ezring %s is not registered: %s", name, error)
                continue
            pub_id = _ring_publisher(name, ring)
            self._publishers[pub_id] = _Publisher(
                pub_id,
                topic,
                self._ring_client,
                self.address,
                "ezring",
                None,
                name,
                ring.header.created_ns,
            )
            self._ring_client.publishers.add(pub_id)
            self._watched[name] = pub_id
            changed = True
            log.info("graph server: ezring %s registered as a publisher of %r", name, topic)
        return changed

    def _start_shutdown(self) -> None:
        # Tell every client that this is a requested stop, not a crash: their contexts
        # then reconnect to a server someone starts there, but do not start one.
        for connection in list(self._connections):
            if connection.client is not None:
                connection.send_message({"op": "closing", "reason": "shutdown requested"})
        self._shutdown_task = asyncio.ensure_future(self.aclose())

    def _new_connection(self) -> _ServerConnection:
        return _ServerConnection(self)

    # -- connection events -----------------------------------------------------------------

    def _connection_opened(self, connection: _ServerConnection) -> bool:
        if len(self._connections) >= MAX_SERVER_CONNECTIONS:
            self.rejected_connections += 1
            connection.close_for(
                "limit",
                f"the graph server holds {len(self._connections)} connections already "
                "(MAX_SERVER_CONNECTIONS); try again later",
                verb="refusing",
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

    def _check_hello(self, message: dict[str, Any]) -> Responder:
        """A ``hello`` of our protocol version: the responder of its handshake."""
        protocol = message.get("protocol")
        if protocol != PROTOCOL:
            raise ProtocolError(
                f"client speaks protocol {protocol!r}, this server speaks {PROTOCOL!r}; "
                "use the same ezflow version on every host of a graph"
            )
        return Responder(self._credentials.token, "graph")

    def _hello(self, connection: _ServerConnection, message: dict[str, Any]) -> _Client:
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
        if op == "traces":
            return self._traces()
        if op == "trace_lease":
            return await self._grant_trace_lease(client, message)
        if op == "end_trace_lease":
            return await self._end_trace_lease_request(client, message)
        if op == "trace_status":
            return self._trace_status(client)
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
            self._claim(client, pub_id)
            ring = optional_str_field(message, "ring")
            watched = self._watched.pop(ring, None) if ring is not None else None
            if watched is not None:
                # attach_ring of a ring the server registered: the client's registration
                # takes its place (one publisher per ring, idempotent by ring name).
                self._publishers.pop(watched, None)
                self._ring_client.publishers.discard(watched)
            self._publishers[pub_id] = _Publisher(
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

    def _claim(self, client: _Client, reg_id: str) -> None:
        """Make way for *client* to register *reg_id* (a publisher or subscriber id).

        Ids are made by clients and kept across reconnections, so a known id is
        accepted again: from the same connection (a retried request: the new entry
        replaces the old one) or from a new connection of the same process (its old
        connection is stale and not yet closed here: the registration moves). Raises
        ``ValueError`` when another process's live connection owns it.
        """
        existing = self._publishers.get(reg_id) or self._subscribers.get(reg_id)
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
        self._publishers.pop(reg_id, None)
        self._subscribers.pop(reg_id, None)

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
            ring_created_ns=pub.ring_created_ns,
        ).to_wire()

    def _push_routes(self) -> int:
        """Send changed routes to the clients concerned; return the version sent."""
        self._version += 1
        version = self._version
        for client_id, routes in self.compute_routes().items():
            client = self._clients[client_id]
            # A client that never had routes has none: nothing to push (nor to wait for:
            # a client busy elsewhere must not delay everyone's requests).
            if routes == (client.routes or _NO_ROUTES):
                continue
            client.routes = routes
            client.pushed_version = version
            assert client.connection is not None  # the ring watcher owns no subscriber
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
                    self.client_faults(
                        "routes",
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
        client id; the rings the server registered itself (``watch_rings``) are one
        more process, ``rings``, with a publisher each (messages: frames published,
        drops: frames dropped with every slot held, channels: live readers)."""
        snapshots = {
            client.id: client.telemetry
            for client in self._clients.values()
            if client.telemetry is not None
        }
        rings = self._rings_telemetry()
        if rings is not None:
            snapshots[self._ring_client.id] = rings
        return snapshots

    def _rings_telemetry(self) -> ProcessSnapshot | None:
        """The watched rings as a process snapshot (``None`` when there are none)."""
        if not self._watched:
            return None
        now, rings = self._ring_scan
        then, before = self._ring_previous
        interval = now - then if then else 0.0
        publishers = []
        for name, pub_id in sorted(self._watched.items()):
            ring = rings.get(name)
            pub = self._publishers.get(pub_id)
            if ring is None or pub is None:
                continue
            stats = ring.stats
            old = before.get(name)
            rate = (
                (stats.published - old.stats.published) / interval
                if old is not None and interval > 0
                else 0.0
            )
            publishers.append(
                PublisherSnapshot(
                    publisher_id=pub_id,
                    topic=pub.topic,
                    channels=stats.readers_live,
                    messages=stats.published,
                    bytes=0,  # a ring does not count bytes
                    drops=stats.dropped_full,
                    waits=0,  # a ring writer never waits: it drops
                    wait=HistogramSnapshot(),
                    shm_in_use=0,
                    msgs_per_s=rate,
                    bytes_per_s=0.0,
                )
            )
        client = self._ring_client
        return ProcessSnapshot(
            name=client.name,
            pid=client.pid,
            hostname=client.hostname,
            time=now,
            interval=interval,
            publishers=tuple(publishers),
        )

    def _trace_reported(self, client: _Client, trace: object) -> None:
        """Keep the trace hops of a report, and the reporter's trace state and report
        interval when it sends them (:class:`ProtocolError` when malformed)."""
        if not isinstance(trace, dict) or type(trace.get("offset")) is not int:
            raise ProtocolError("a report's trace must be a map with an integer offset")
        offset = trace["offset"]
        extra = [client.name, offset]
        rows = check_rows(trace.get("hops", ()))
        state = trace.get("state")
        interval = trace.get("interval")
        if state is not None:
            state = check_trace_state(state)
        if interval is not None and (
            isinstance(interval, bool) or not isinstance(interval, (int, float))
        ):
            raise ProtocolError("a report's trace interval must be a number of seconds")
        self.trace_hops.extend(row + extra for row in rows)
        self.trace_hops_received += len(rows)
        if interval is not None:
            client.report_interval = float(interval)
        if state is not None:
            self._trace_state(client, state, reported=True)

    # -- tracing: the graph's lease ----------------------------------------------------------

    def _traces(self) -> dict[str, Any]:
        """The ``traces`` request: the hops kept (oldest first), and how many hops were
        ever reported (``received``: the last kept hop's index plus one)."""
        return {
            "fields": list(REPORTED_FIELDS),
            "hops": list(self.trace_hops),
            "received": self.trace_hops_received,
        }

    def _trace_welcome(self, client: _Client) -> dict[str, Any] | None:
        """The lease for *client*'s ``welcome`` (None: it drops any it holds). It gets
        the lease there, so no earlier push is waited for from it."""
        client.trace_version = self._trace_version
        lease = self.trace_lease
        return None if lease is None else lease.to_wire(asyncio.get_running_loop().time())

    async def _grant_trace_lease(self, client: _Client, message: dict[str, Any]) -> dict[str, Any]:
        """``trace_lease``: every client traces one message in ``rate`` for
        ``duration`` seconds (replacing a running lease). ``ValueError`` naming the
        field for a request that is not one: the requester keeps its connection."""
        rate = message.get("rate")
        duration = message.get("duration")
        if rate is None or duration is None:
            raise ValueError(
                "trace_lease needs rate (0, or N >= 1: one message in N) and duration "
                "(seconds); to end a lease, send end_trace_lease"
            )
        check_trace_rate(rate, setting="trace_lease rate")
        duration = check_trace_lease_duration(duration, setting="trace_lease duration")
        loop = asyncio.get_running_loop()
        now = loop.time()
        since = self.trace_hops_received
        replaced = self._close_trace_lease("replaced", now)
        self._trace_leases += 1
        lease = self.trace_lease = _TraceLease(
            id=f"L{self._trace_leases}-{self.server_id}",
            rate=rate,
            duration=duration,
            expires_at=now + duration,
            by=f"{client.name or client.id} (pid {client.pid})",
        )
        lease.timer = loop.call_at(lease.expires_at, self._trace_lease_expired, lease)
        log.info(
            "graph server: trace lease %s: one message in %d for %g s, for %s",
            lease.id,
            rate,
            duration,
            lease.by,
        )
        unconfirmed = await self._wait_trace_confirmed(self._push_trace_lease())
        return {
            "lease": lease.describe(loop.time()),
            "replaced": replaced,
            "received": since,
            "processes": self._trace_processes(client),
            "unconfirmed": [self._trace_name(c) for c in unconfirmed],
        }

    async def _end_trace_lease_request(
        self, client: _Client, message: dict[str, Any]
    ) -> dict[str, Any]:
        """``end_trace_lease``: end the running lease now (only if it is ``lease``, when
        given: a command ending its own, which may have been replaced meanwhile)."""
        lease_id = message.get("lease")
        if lease_id is not None and not isinstance(lease_id, str):
            raise ValueError(
                f"end_trace_lease lease={lease_id!r} must be a lease id (a str, as trace_lease "
                "answered) or absent (any lease)"
            )
        loop = asyncio.get_running_loop()
        lease = self.trace_lease
        ended = None
        unconfirmed: list[_Client] = []
        if lease is not None and lease_id in (None, lease.id):
            ended = self._close_trace_lease(
                f"ended by {client.name or client.id} (pid {client.pid})", loop.time()
            )
            unconfirmed = await self._wait_trace_confirmed(self._push_trace_lease())
        return {
            "ended": ended,
            "lease": None if self.trace_lease is None else self.trace_lease.describe(loop.time()),
            "processes": self._trace_processes(client),
            "unconfirmed": [self._trace_name(c) for c in unconfirmed],
        }

    def _trace_lease_expired(self, lease: _TraceLease) -> None:
        if self.trace_lease is not lease or self._closed.is_set():
            return
        self._close_trace_lease("expired", asyncio.get_running_loop().time())
        self._push_trace_lease()

    def _close_trace_lease(self, how: str, now: float) -> dict[str, Any] | None:
        """Forget the running lease (nothing pushed); what it was, or None."""
        lease, self.trace_lease = self.trace_lease, None
        if lease is None:
            return None
        if lease.timer is not None:
            lease.timer.cancel()
        described = lease.describe(now)
        self._trace_lease_ended = {"id": lease.id, "rate": lease.rate, "at": now, "how": how}
        log.info("graph server: trace lease %s %s", lease.id, how)
        return described

    def _push_trace_lease(self) -> int:
        """Send the lease (or its end) to every client; return the push's version."""
        self._trace_version += 1
        version = self._trace_version
        lease = self.trace_lease
        wire = None if lease is None else lease.to_wire(asyncio.get_running_loop().time())
        for other in self._clients.values():
            if other.connection is not None:
                other.connection.send_message(
                    {"op": "trace_lease", "version": version, "lease": wire}
                )
        return version

    async def _wait_trace_confirmed(self, version: int) -> list[_Client]:
        """Wait until every client confirmed push *version*, at most
        ``TRACE_LEASE_CONFIRM_TIMEOUT``; return those that did not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TRACE_LEASE_CONFIRM_TIMEOUT
        while True:
            waiting = [c for c in self._clients.values() if c.trace_version < version]
            remaining = deadline - loop.time()
            if not waiting or remaining <= 0:
                return waiting
            # (no wake-up lost: nothing runs between the check and the wait)
            self._trace_confirmed.clear()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._trace_confirmed.wait(), remaining)

    def _trace_state_notice(self, client: _Client, message: dict[str, Any]) -> None:
        """A client's ``trace_state``: its rates after a lease push (or welcome)."""
        version = message_field(message, "version", int)
        state = check_trace_state(message.get("state"))
        self._trace_state(client, state, reported=False)
        if version > client.trace_version:
            client.trace_version = version
            self._trace_confirmed.set()

    def _trace_state(self, client: _Client, state: dict[str, Any], *, reported: bool) -> None:
        """Keep *client*'s trace *state*. Once it left a lease, its hops of that lease
        are all at the server with its first report sent ``TRACE_FLUSH_SETTLE`` or
        more after (traced messages sent just before may still be on their way)."""
        now = asyncio.get_running_loop().time()
        held = client.trace_state["lease"] if client.trace_state is not None else None
        if held is not None and state["lease"] != held:
            client.left_lease = held
            client.left_at = now
        if (
            reported
            and client.left_lease is not None
            and now - client.left_at >= TRACE_FLUSH_SETTLE
        ):
            client.flushed_lease = client.left_lease
        client.trace_state = state
        client.trace_state_at = now

    @staticmethod
    def _trace_name(client: _Client) -> str:
        return f"{client.name or client.id} (pid {client.pid})"

    def _trace_processes(self, requester: _Client) -> list[dict[str, Any]]:
        """The trace state of every process of the graph (clients with registrations
        or telemetry; not *requester*, nor other inspecting commands)."""
        now = asyncio.get_running_loop().time()
        return [
            {
                "client_id": c.id,
                "name": c.name,
                "pid": c.pid,
                "hostname": c.hostname,
                "state": c.trace_state,
                "age": None if c.trace_state is None else round(now - c.trace_state_at, 3),
                "interval": c.report_interval or None,
                "left_lease": c.left_lease,
                "flushed_lease": c.flushed_lease,
            }
            for c in self._clients.values()
            if c is not requester and (c.telemetry is not None or c.publishers or c.subscribers)
        ]

    def _trace_status(self, client: _Client) -> dict[str, Any]:
        """``trace_status``: the lease, the last one that ended, every process's rates."""
        now = asyncio.get_running_loop().time()
        lease = self.trace_lease
        ended = self._trace_lease_ended
        return {
            "lease": None if lease is None else lease.describe(now),
            "ended": None
            if ended is None
            else {
                "id": ended["id"],
                "rate": ended["rate"],
                "ago": round(now - ended["at"], 3),
                "how": ended["how"],
            },
            "received": self.trace_hops_received,
            "processes": self._trace_processes(client),
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
                snapshot = message.get("snapshot")
                trace = snapshot.pop("trace", None) if isinstance(snapshot, dict) else None
                client.telemetry = ProcessSnapshot.from_wire(snapshot, limit=MAX_TELEMETRY_ENTRIES)
                client.reported_at = now
                if trace is not None:
                    self._trace_reported(client, trace)
                return
            except ProtocolError as exc:
                reason = str(exc)
        self.ignored_reports += 1
        self.client_faults(
            "report",
            "ignoring a telemetry report of client %s (%s, pid %d): %s",
            client.id,
            client.name,
            client.pid,
            reason,
        )


class EmbeddedGraphServer:
    """A :class:`GraphServer` in its own daemon thread, on its own event loop: what a
    ``GraphContext`` starts when no server answers at its address.

    Running apart from the starting process's loop means a blocking call there (a
    ``time.sleep``, a long computation holding no lock) does not hold up other clients'
    connects and requests. The thread is a daemon: when the process exits without
    :meth:`aclose`, the kernel closes the socket and other clients take over (see
    docs/architecture.md).
    """

    def __init__(
        self, address: Address, *, token: Token | None = None, tls: TlsFiles | None = None
    ) -> None:
        self._requested_address = address
        self._token = token
        self._tls = tls
        self._server: GraphServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._finished: concurrent.futures.Future[None] = concurrent.futures.Future()

    @property
    def server(self) -> GraphServer:
        """The graph server (it lives in another thread: read, do not call into it)."""
        if self._server is None:
            raise RuntimeError("the embedded graph server is not started")
        return self._server

    @property
    def address(self) -> Address:
        return self.server.address

    async def start(self) -> None:
        """Start the thread and bind. Raises ``OSError`` as :meth:`GraphServer.start`
        does (``EADDRINUSE`` when another process serves there already). When it
        fails or is cancelled, it returns only once the thread has ended (at most
        ``EMBEDDED_SERVER_STOP_TIMEOUT``), so no thread or socket is left behind."""
        if self._thread is not None:
            raise RuntimeError("an EmbeddedGraphServer can be started once")
        started: concurrent.futures.Future[GraphServer] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="ezflow-graph-server", daemon=True
        )
        self._thread.start()
        try:
            self._server = await asyncio.wrap_future(started)
        except BaseException:
            # Failed, or cancelled (then the thread sees the cancelled future once it
            # has bound, and closes): either way, wait for the thread to end.
            await self._join()
            raise

    async def _join(self) -> None:
        """Wait (at most ``EMBEDDED_SERVER_STOP_TIMEOUT``) until the thread has ended:
        not only its loop (``_finished``) but the thread itself, so that nothing of it
        is left running when this returns."""
        thread = self._thread
        try:
            if not self._finished.done():
                await asyncio.wait_for(
                    asyncio.shield(asyncio.wrap_future(self._finished)),
                    EMBEDDED_SERVER_STOP_TIMEOUT,
                )
            if thread is not None and thread.is_alive():
                # It set _finished as its very last statement: ending takes microseconds,
                # but joining blocks, so not on this loop.
                await asyncio.to_thread(thread.join, EMBEDDED_SERVER_STOP_TIMEOUT)
        except (TimeoutError, asyncio.TimeoutError):
            pass
        if not self._finished.done() or (thread is not None and thread.is_alive()):
            log.error(
                "the embedded graph server thread did not stop within %.0f s",
                EMBEDDED_SERVER_STOP_TIMEOUT,
            )

    def _run(self, started: concurrent.futures.Future[GraphServer]) -> None:
        try:
            loop = loop_factory()()
            try:
                loop.run_until_complete(self._serve(loop, started))
            finally:
                # As asyncio.run does: connection workers and sweeps still pending end
                # here, not as "Task was destroyed but it is pending" at exit.
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()
        except BaseException as exc:  # the loop could not even be made
            if not started.done() and not started.cancelled():
                started.set_exception(exc)
        finally:
            self._finished.set_result(None)

    async def _serve(
        self, loop: asyncio.AbstractEventLoop, started: concurrent.futures.Future[GraphServer]
    ) -> None:
        server = GraphServer(self._requested_address, token=self._token, tls=self._tls)
        server.embedded = True
        try:
            await server.start()
        except BaseException as exc:
            await server.aclose()
            if not started.cancelled():
                started.set_exception(exc)
            return
        self._loop = loop
        if not started.set_running_or_notify_cancel():
            await server.aclose()  # the starter was cancelled meanwhile
            return
        started.set_result(server)
        try:
            await server.serve_forever()  # until aclose() or a `shutdown` request
        finally:
            await server.aclose()

    def _request_stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return
        # RuntimeError: the loop is closed already, the thread has ended.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(server._closed.set)

    async def aclose(self) -> None:
        """Stop the server (every client is disconnected) and wait up to
        ``EMBEDDED_SERVER_STOP_TIMEOUT`` for its thread to end (logged if it does not).
        Idempotent; the stop is requested before the first await, so a cancelled
        ``aclose`` still stops the server."""
        self._request_stop()
        if self._thread is not None:
            await self._join()


class _ServerConnection(FramedProtocol):
    """One client's control connection, as seen by the server."""

    def __init__(self, server: GraphServer) -> None:
        super().__init__(HANDSHAKE_MAX_FRAME_SIZE)
        self.server = server
        self.client: _Client | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._responder: Responder | None = None
        self._hello: dict[str, Any] | None = None
        self.heartbeat: Heartbeat | None = None
        self._requests: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_MAX_PENDING_REQUESTS)
        self._worker: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self.server._connection_opened(self):
            return  # (closed, with a reason)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_keepalive(sock, self.server.heartbeat_deadline)
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)

    # -- heartbeats (see ezflow._core._liveness) ----------------------------------------

    def send_heartbeat(self, deadline: float) -> None:
        self.send_message({"op": "heartbeat", "deadline": deadline})

    def peer_silent(self, silence: float, deadline: float) -> None:
        client = self.client
        self.server.dead_clients += 1
        if client is None:  # (heartbeats start with the client's registration)
            self.server.bad_peers("silent", "closing connection from %s: silent", self.peer_name())
        else:
            self.server.bad_peers(
                "silent",
                "client %s (%s, pid %d) at %s silent for %.1f s (heartbeat deadline %g s): "
                "declaring it dead and dropping its %d publishers, %d subscribers and %d "
                "edges",
                client.id,
                client.name,
                client.pid,
                self.peer_name(),
                silence,
                deadline,
                len(client.publishers),
                len(client.subscribers),
                len(client.edges),
            )
        self.abort()

    def _handshake_timeout(self) -> None:
        if self.client is None:
            self.close_for("timeout", f"handshake not done within {HANDSHAKE_TIMEOUT:.0f} s")

    def protocol_error(self, exc: ProtocolError) -> None:
        self.close_for("protocol" if self.client is None else "request", str(exc))

    def describe_peer(self) -> str:
        """Who is at the other end, for log lines: the client once admitted."""
        client = self.client
        if client is None:
            return f"connection from {self.peer_name()}"
        return (
            f"connection of client {client.id} ({client.name}, pid {client.pid}) from "
            f"{self.peer_name()}"
        )

    def close_for(
        self,
        cause: str,
        error: str,
        reply: dict[str, Any] | None = None,
        *,
        verb: str = "closing",
    ) -> None:
        """Close the connection for a fault of the peer's: logged by the server per
        *cause*, rate-limited (``bad_peers``), and told to the peer first - *reply*, by
        default ``{"op": "error", "cause": "protocol", "error": error}`` - unless it
        leaves what we sent unread (then it is dropped at once)."""
        self.server.bad_peers(cause, "%s %s: %s", verb, self.describe_peer(), error)
        self._broken = True  # nothing more is read from it
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if reply is None:
            reply = {"op": "error", "cause": "protocol", "error": error}
        transport.write(frame(pack_message(reply)))
        if transport.get_write_buffer_size():
            transport.abort()  # (it does not read: do not wait on it)
        else:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.heartbeat is not None:
            self.heartbeat.cancel()
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
            self.server.bad_peers(
                "unread",
                "dropping %s: it left %d bytes of pushed data unread",
                self.describe_peer(),
                transport.get_write_buffer_size(),
            )
            self.abort()

    def frame_received(self, body: bytes | memoryview) -> None:
        message = unpack_message(body)
        op = message["op"]
        client = self.client
        if client is None:
            try:
                hello = self._handshake(message)
                if hello is None:
                    return  # challenged: the answer comes next
                client = self.server._hello(self, hello)
            except AuthenticationError as exc:
                reply = {"op": "error", "cause": "auth", "error": str(exc)}
                self.close_for("auth", str(exc), reply, verb="refusing")
                return
            except ProtocolError as exc:
                self.close_for("protocol", str(exc))
                return
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
                    "embedded": self.server.embedded,
                    "insecure": self.server.insecure,
                    "trace_lease": self.server._trace_welcome(client),
                }
            )
            self._worker = asyncio.ensure_future(self._serve_requests(client))
            self.heartbeat = Heartbeat(self, self.server.heartbeat_deadline)
            return
        if op == "heartbeat":
            if self.heartbeat is not None:
                self.heartbeat.peer_announced(
                    float(message_field(message, "deadline", (int, float)))
                )
            return
        if op in NOTICE_OPS:
            if op == "routes_applied":
                self.server._routes_applied(client, message_field(message, "version", int))
            elif op == "trace_state":
                self.server._trace_state_notice(client, message)
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

    def _handshake(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """One handshake message (see :mod:`ezflow._core._protocol`): the ``hello`` to
        admit once the client is authenticated, or ``None`` while a challenge is out.
        Raises :class:`AuthenticationError` or :class:`ProtocolError`."""
        op = message["op"]
        if self._responder is None:
            if op != "hello":
                raise ProtocolError(f"expected 'hello' first, got {op!r}")
            self._responder = self.server._check_hello(message)
            challenge = self._responder.challenge(message)
            if challenge is None:
                return message
            self._hello = message
            self.send_message({"op": "challenge", **challenge})
            return None
        if op == "error" and self._hello is not None:
            # The client checked our proof and gave up: say so here too (its text is
            # not logged: it is the peer's to choose).
            raise AuthenticationError("the client found that our tokens differ")
        if op != "auth" or self._hello is None:
            raise ProtocolError(f"expected 'auth' after the challenge, got {op!r}")
        self._responder.verify(message)
        return self._hello

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
                self.close_for(
                    "request",
                    str(exc),
                    {"op": "reply", "id": request_id, "ok": False, "error": str(exc)},
                )
                return
            self.send_message({"op": "reply", "id": request_id, "ok": True, **result})
