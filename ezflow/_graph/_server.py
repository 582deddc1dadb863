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

This module is the server proper: its lifecycle, the requests and the connection
protocol. What registrations make (routes) is :mod:`._registry`'s, without sockets; the
rings it registers by itself :mod:`._ringwatch`'s; trace hops and leases
:mod:`._tracestore`'s; a connection's handshake state :mod:`ezflow._core._handshake`'s
(shared with the data servers); :mod:`._embedded` runs a server in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections import deque
from collections.abc import Iterable
from typing import Any

from .._core._auth import Credentials, TlsFiles, Token, is_loopback
from .._core._config import (
    CONTROL_MAX_FRAME_SIZE,
    EZRING_WATCH_INTERVAL,
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
    heartbeat_deadline_from_env,
    parse_address,
    shm_dir_from_env,
    watch_rings_from_env,
)
from .._core._config import MAX_PENDING_REQUESTS as _MAX_PENDING_REQUESTS
from .._core._config import SERVER_CLIENT_BACKLOG as _MAX_WRITE_BUFFER
from .._core._exceptions import AuthenticationError, ConfigurationError, ProtocolError
from .._core._framing import FramedProtocol, frame
from .._core._handshake import AcceptingHandshake, Challenge, refuse
from .._core._liveness import Heartbeat, tune_keepalive
from .._core._peerlog import BadPeerLog
from .._core._protocol import (
    NOTICE_OPS,
    PROTOCOL,
    REQUEST_OPS,
    pack_message,
    unpack_message,
)
from .._core._protocol import (
    field as message_field,
)
from .._core._telemetry import ProcessSnapshot
from .._transports import SegmentSweeper
from ._client import host_id
from ._metrics import MetricsServer
from ._registry import RegisteredClient, Registry
from ._ringwatch import RingWatcher
from ._tracestore import TraceLease, TraceStore

__all__ = ["GraphServer"]

log = logging.getLogger("ezflow.server")


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
        self._host_id = host_id()
        self._registry = Registry(self._host_id, socket.gethostname())
        self._lock = asyncio.Lock()  # one graph change (and its route push) at a time
        self._closed = asyncio.Event()
        # Shared-memory segments of crashed processes on this host: swept at start and
        # after a client that published goes away.
        self._sweeper = SegmentSweeper(report=True)
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
        self._traces = TraceStore(self._registry, self.server_id, self._closed.is_set)
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
        self._ring_watcher = RingWatcher(self._registry)

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
        watcher = self._ring_watcher
        while True:
            try:
                rings = await watcher.scan()
                async with self._lock:
                    if watcher.update(rings, self.address):
                        self._push_routes()
            except Exception:  # a bad scan must not stop the watching
                log.exception("graph server: scanning for ezring rings failed")
            await asyncio.sleep(EZRING_WATCH_INTERVAL)

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
        self._registry.remove_client(client)
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
        if client.publishers and client.host_id == self._host_id and not self._closed.is_set():
            # A crashed publisher leaves its segments behind; a clean one has removed
            # them already and the sweep finds nothing.
            self._sweeper.sweep_soon()
        if not self._closed.is_set():
            self._push_routes()

    def _check_hello(self, message: dict[str, Any]) -> None:
        """Refuse (:class:`ProtocolError`) a first handshake message that is not a
        ``hello`` of our protocol version."""
        op = message["op"]
        if op != "hello":
            raise ProtocolError(f"expected 'hello' first, got {op!r}")
        protocol = message.get("protocol")
        if protocol != PROTOCOL:
            raise ProtocolError(
                f"client speaks protocol {protocol!r}, this server speaks {PROTOCOL!r}; "
                "use the same ezflow version on every host of a graph"
            )

    def _hello(self, connection: _ServerConnection, message: dict[str, Any]) -> RegisteredClient:
        client = self._registry.add_client(connection, message)
        log.debug("client %s connected: %s pid %d", client.id, client.name, client.pid)
        return client

    # -- requests ------------------------------------------------------------------------

    async def _handle_request(
        self, client: RegisteredClient, message: dict[str, Any]
    ) -> dict[str, Any]:
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
            return self._traces.traces()
        if op == "trace_lease":
            return await self._traces.grant(client, message)
        if op == "end_trace_lease":
            return await self._traces.end(client, message)
        if op == "trace_status":
            return self._traces.status(client)
        if op == "shutdown":
            log.info("graph server: shutdown requested by client %s (%s)", client.id, client.name)
            # After this reply is written; keep a reference, the loop only holds tasks weakly.
            self._shutdown = asyncio.get_running_loop().call_soon(self._start_shutdown)
            return {}
        async with self._lock:
            changed = self._registry.apply(client, op, message)
            version = self._push_routes() if changed else 0
        if version:
            await self._wait_applied(version)
        return {}

    # -- routing -------------------------------------------------------------------------

    def compute_routes(self) -> dict[str, dict[str, Any]]:
        """Per client: ``{"subscribers": {sub_id: [pub_id, ...]}, "publishers":
        {pub_id: info}}`` for every subscriber the client owns."""
        return self._registry.compute_routes()

    def _push_routes(self) -> int:
        """Send changed routes to the clients concerned; return the version sent."""
        version, pushes = self._registry.route_pushes()
        for client, routes in pushes:
            assert client.connection is not None  # the ring watcher owns no subscriber
            client.connection.send_message({"op": "routes", "version": version, **routes})
        return version

    async def _wait_applied(self, version: int) -> None:
        clients = self._registry.clients
        waiting = [c for c in clients.values() if c.pushed_version >= version > c.applied_version]
        if not waiting:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ROUTE_APPLY_TIMEOUT
        for client in waiting:
            while client.applied_version < version and client.id in clients:
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

    def _routes_applied(self, client: RegisteredClient, version: int) -> None:
        client.applied_version = max(client.applied_version, version)
        client.applied.set()

    # -- inspection ----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole graph as plain data (what ``ezflow graph`` shows)."""
        return {"server_id": self.server_id, **self._registry.snapshot()}

    @property
    def clients(self) -> Iterable[str]:
        return tuple(self._registry.clients)

    # -- telemetry -------------------------------------------------------------------------

    def telemetry(self) -> dict[str, ProcessSnapshot]:
        """The latest telemetry snapshot of every connected client that reported, by
        client id; the rings the server registered itself (``watch_rings``) are one
        more process, ``rings``, with a publisher each (messages: frames published,
        drops: frames dropped with every slot held, channels: live readers)."""
        snapshots = {
            client.id: client.telemetry
            for client in self._registry.clients.values()
            if client.telemetry is not None
        }
        rings = self._ring_watcher.telemetry()
        if rings is not None:
            snapshots[self._registry.watcher.id] = rings
        return snapshots

    # -- tracing (the store: ._tracestore) -------------------------------------------------

    @property
    def trace_hops(self) -> deque[list[Any]]:
        """The newest trace hops every client reported (``TRACE_SERVER_KEEP``), each row
        ``HOP_FIELDS`` plus the reporting process's name and wall-clock offset."""
        return self._traces.hops

    @property
    def trace_hops_received(self) -> int:
        """How many hops were ever reported (the index the next one gets)."""
        return self._traces.hops_received

    @property
    def trace_lease(self) -> TraceLease | None:
        """The graph's trace lease, pushed to every client (None: each traces at its own
        rate); ended by its timer, a newer lease or an ``end_trace_lease`` request."""
        return self._traces.lease

    def _trace_reported(self, client: RegisteredClient, trace: object) -> None:
        self._traces.reported(client, trace)

    def _report(self, client: RegisteredClient, message: dict[str, Any], size: int) -> None:
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
                    self._traces.reported(client, trace)
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


class _ServerConnection(FramedProtocol):
    """One client's control connection, as seen by the server."""

    def __init__(self, server: GraphServer) -> None:
        super().__init__(HANDSHAKE_MAX_FRAME_SIZE)
        self.server = server
        self.client: RegisteredClient | None = None
        self._handshake = AcceptingHandshake(server._credentials.token, "graph", peer="client")
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
        self._handshake.arm(HANDSHAKE_TIMEOUT, self._handshake_timeout)

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

    def _handshake_timeout(self, reason: str) -> None:
        self.close_for("timeout", reason)

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
        if reply is None:
            reply = {"op": "error", "cause": "protocol", "error": error}
        refuse(self.transport, frame(pack_message(reply)))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        self._handshake.cancel()
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
                hello = self._authenticate(message)
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
            self._handshake.admit()
            self.max_frame_size = CONTROL_MAX_FRAME_SIZE
            self.send_message(
                {
                    "op": "welcome",
                    "protocol": PROTOCOL,
                    "client_id": client.id,
                    "server_id": self.server.server_id,
                    "embedded": self.server.embedded,
                    "insecure": self.server.insecure,
                    "trace_lease": self.server._traces.welcome(client),
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
                self.server._traces.state_notice(client, message)
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

    def _authenticate(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """One handshake message (see :mod:`ezflow._core._protocol`): the ``hello`` to
        admit once the client is authenticated, or ``None`` while a challenge is out.
        Raises :class:`AuthenticationError` or :class:`ProtocolError`."""
        if not self._handshake.started:
            self.server._check_hello(message)
        step = self._handshake.receive(message)
        if isinstance(step, Challenge):
            self.send_message(step.message)
            return None
        return step

    async def _serve_requests(self, client: RegisteredClient) -> None:
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
