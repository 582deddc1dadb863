"""The client side of the graph protocol: one long-lived connection per GraphContext."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import ssl
from collections.abc import Callable
from typing import Any

from .._core._auth import Credentials, Initiator
from .._core._config import (
    CONNECT_TIMEOUT,
    CONTROL_MAX_FRAME_SIZE,
    ENV_HEARTBEAT_DEADLINE,
    HANDSHAKE_TIMEOUT,
    MAX_TELEMETRY_REPORT_SIZE,
    OTHER_ADDRESS_HINT,
    REQUEST_TIMEOUT,
    TELEMETRY_MAX_WRITE_BUFFER,
    Address,
    format_address,
    heartbeat_deadline_from_env,
)
from .._core._exceptions import (
    AuthenticationError,
    BrokenResourceError,
    ClosedResourceError,
    EzflowTimeoutError,
    GraphError,
    ProtocolError,
)
from .._core._framing import FramedProtocol
from .._core._liveness import Heartbeat, tune_keepalive
from .._core._protocol import PROTOCOL, field, pack_message, unpack_message
from .._core._tracing import TRACING, apply_lease

__all__ = ["GraphClient", "host_id"]

log = logging.getLogger("ezflow.client")

RoutesHandler = Callable[[int, dict[str, Any]], None]


@functools.cache
def host_id() -> str:
    """An identifier of this host (and boot): equal for processes that can share memory
    and reach each other on loopback. Read once per process (at import), so that no
    event loop waits on ``/proc``."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


host_id()  # at import, off every event loop


class GraphClient:
    """A connected, handshaken graph-protocol client.

    Create with :meth:`connect`. Routing pushes go to *on_routes*; the owner answers them
    with :meth:`routes_applied`. When the connection breaks, pending and later requests
    raise :class:`BrokenResourceError` and *on_lost* is called once.
    """

    def __init__(self, protocol: _ClientConnection, welcome: dict[str, Any]) -> None:
        self._protocol = protocol
        self.client_id: str = welcome["client_id"]
        self.server_id: str = welcome["server_id"]
        #: Whether a GraphContext embeds the server (else: a standalone `ezflow serve`).
        self.server_embedded = welcome.get("embedded") is True
        #: Whether the server serves an address other than loopback without a token
        #: (``ezflow serve --insecure``): anyone who reaches it controls the graph.
        self.server_insecure = welcome.get("insecure") is True
        self.local_host: str = protocol.local_host

    @classmethod
    async def connect(
        cls,
        address: Address,
        *,
        name: str,
        on_routes: RoutesHandler,
        on_lost: Callable[[BaseException | None], None],
        credentials: Credentials | None = None,
    ) -> GraphClient:
        """Connect and handshake.

        *credentials* (default: from the environment, see :class:`Credentials`) give the
        token this client proves and the TLS settings. Raises ``ConnectionRefusedError``
        when nothing listens at *address* (so the caller may start a server),
        :class:`EzflowTimeoutError` when the connection or handshake takes longer than
        the limits, :class:`ProtocolError` when the peer is not an ezflow graph server of
        this protocol version, :class:`AuthenticationError` when the token or the TLS
        certificates do not match, :class:`BrokenResourceError` for other OS errors.
        """
        if credentials is None:
            credentials = Credentials.resolve()
        loop = asyncio.get_running_loop()
        host, port = address
        where = f"the graph server at {format_address(address)}"
        initiator = Initiator(credentials.token, "graph", where)
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _ClientConnection(on_routes, on_lost, initiator, where),
                    host,
                    port,
                    ssl=credentials.client_ssl,
                ),
                CONNECT_TIMEOUT,
            )
        except ConnectionRefusedError:
            raise
        except ssl.SSLError as exc:
            raise AuthenticationError(
                f"TLS handshake with {where} failed: {exc.reason or exc}; both ends need "
                "certificates signed by the same CA (EZFLOW_TLS_CERT/_KEY/_CA)"
            ) from exc
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise EzflowTimeoutError(
                f"no answer from graph server at {format_address(address)} within "
                f"{CONNECT_TIMEOUT:.0f} s"
            ) from exc
        except OSError as exc:
            raise BrokenResourceError(
                f"cannot reach graph server at {format_address(address)}: {exc}"
            ) from exc
        try:
            welcome = await asyncio.wait_for(protocol.handshake(name), HANDSHAKE_TIMEOUT)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            protocol.abort()
            raise EzflowTimeoutError(
                f"{format_address(address)} accepted the connection but did not complete "
                f"the ezflow handshake within {HANDSHAKE_TIMEOUT:.0f} s: it is not an ezflow "
                f"graph server, or a stuck one; {OTHER_ADDRESS_HINT}"
            ) from exc
        except BaseException:
            protocol.abort()
            raise
        return cls(protocol, welcome)

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its reply.

        Raises :class:`GraphError` when the server refuses it, :class:`BrokenResourceError`
        when the connection is lost, :class:`EzflowTimeoutError` after ``REQUEST_TIMEOUT``.
        """
        return await self._protocol.request(op, fields)

    def routes_applied(self, version: int) -> None:
        self._protocol.send_message({"op": "routes_applied", "version": version})

    def send_report(self, snapshot: dict[str, Any]) -> bool:
        """Send a telemetry snapshot (one-way ``report`` message) unless that would
        queue data: returns False, sending nothing, when the connection is gone, still
        has ``TELEMETRY_MAX_WRITE_BUFFER`` bytes unsent, or the report exceeds
        ``MAX_TELEMETRY_REPORT_SIZE``. Never blocks."""
        protocol = self._protocol
        transport = protocol.transport
        if protocol.lost or transport is None or transport.is_closing():
            return False
        if transport.get_write_buffer_size() > TELEMETRY_MAX_WRITE_BUFFER:
            return False
        body = pack_message({"op": "report", "snapshot": snapshot})
        if len(body) > MAX_TELEMETRY_REPORT_SIZE:
            log.warning(
                "telemetry report of %d bytes exceeds MAX_TELEMETRY_REPORT_SIZE; not sent",
                len(body),
            )
            return False
        protocol.send_frame(body)
        return True

    @property
    def connected(self) -> bool:
        return not self._protocol.lost

    @property
    def server_stopped(self) -> bool:
        """Whether the server said it was stopping on request (``shutdown``) before the
        connection ended, rather than vanishing."""
        return self._protocol.server_closing

    def close(self) -> None:
        self._protocol.close()


class _ClientConnection(FramedProtocol):
    def __init__(
        self,
        on_routes: RoutesHandler,
        on_lost: Callable[[BaseException | None], None],
        initiator: Initiator,
        where: str,
    ) -> None:
        super().__init__(CONTROL_MAX_FRAME_SIZE)
        self._initiator = initiator
        self._where = where
        self._challenged = False
        self._on_routes = on_routes
        self._on_lost = on_lost
        self._welcome: asyncio.Future[dict[str, Any]] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self.lost = False
        self.server_closing = False
        self._closing = False
        self._lost_reason: BaseException | None = None
        self.local_host = "127.0.0.1"
        self.heartbeat_deadline = heartbeat_deadline_from_env()
        self.heartbeat: Heartbeat | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tune_keepalive(sock, self.heartbeat_deadline)
        sockname = transport.get_extra_info("sockname")
        if isinstance(sockname, tuple):
            self.local_host = sockname[0]

    async def handshake(self, name: str) -> dict[str, Any]:
        self._welcome = asyncio.get_running_loop().create_future()
        self.send_message(
            {
                "op": "hello",
                "protocol": PROTOCOL,
                "pid": os.getpid(),
                "host_id": host_id(),
                "hostname": socket.gethostname(),
                "name": name,
                **self._initiator.hello_fields(),
            }
        )
        return await self._welcome

    def send_message(self, message: dict[str, Any]) -> None:
        self.send_frame(pack_message(message))

    async def request(self, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        if self._closing:
            raise ClosedResourceError("the graph context is closed")
        if self.lost:
            raise BrokenResourceError("the connection to the graph server was lost") from (
                self._lost_reason
            )
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self.send_message({**fields, "op": op, "id": request_id})
            try:
                reply = await asyncio.wait_for(future, REQUEST_TIMEOUT)
            except (TimeoutError, asyncio.TimeoutError) as exc:
                raise EzflowTimeoutError(
                    f"graph server did not answer {op!r} within {REQUEST_TIMEOUT:.0f} s"
                ) from exc
        finally:
            self._pending.pop(request_id, None)
        if not reply.get("ok"):
            raise GraphError(f"graph server refused {op!r}: {reply.get('error', '?')}")
        return reply

    def frame_received(self, body: bytes | memoryview) -> None:
        message = unpack_message(body)
        op = message["op"]
        if op == "reply":
            future = self._pending.get(field(message, "id", int))
            if future is not None and not future.done():
                future.set_result(message)
        elif op == "routes":
            self._on_routes(field(message, "version", int), message)
        elif op == "closing":
            # The server stops on request (``ezflow shutdown``), it did not crash.
            self.server_closing = True
        elif op == "welcome":
            if message.get("protocol") != PROTOCOL:
                raise ProtocolError(
                    f"graph server speaks {message.get('protocol')!r}, we speak {PROTOCOL!r}"
                )
            field(message, "client_id", str)
            field(message, "server_id", str)
            if not self._challenged:
                try:
                    self._initiator.welcomed_without_challenge()
                except AuthenticationError as exc:
                    self._refused(exc)
                    return
            # The graph's trace lease, or none: a server without one (a new server
            # after a restart) ends any this process held.
            apply_lease(message.get("trace_lease"))
            if self._welcome is not None and not self._welcome.done():
                self._welcome.set_result(message)
                self.heartbeat = Heartbeat(self, self.heartbeat_deadline)
                self._trace_state(0)
        elif op == "challenge" and not self._challenged:
            self._challenged = True
            try:
                answer = self._initiator.answer(message)
            except AuthenticationError as exc:
                self._refused(exc)
                return
            self.send_message({"op": "auth", **answer})
        elif op == "trace_lease":
            version = field(message, "version", int)
            apply_lease(message.get("lease"))
            self._trace_state(version)
        elif op == "heartbeat":
            if self.heartbeat is not None:
                self.heartbeat.peer_announced(float(field(message, "deadline", (int, float))))
        elif op == "error":
            error: BrokenResourceError | ProtocolError
            if message.get("cause") == "auth":
                error = AuthenticationError(
                    f"{self._where} refused our token: {message.get('error', '?')}; give "
                    "every process of the graph the same token (EZFLOW_TOKEN, --token-file)"
                )
            else:
                error = ProtocolError(f"graph server refused us: {message.get('error', '?')}")
            if self._welcome is not None and not self._welcome.done():
                self._welcome.set_exception(error)
            else:  # it closes the connection next: that is why
                log.error("%s", error)
                self._lost_reason = error
        else:
            raise ProtocolError(f"unknown message {op!r} from the graph server")

    def _trace_state(self, version: int) -> None:
        """Tell the server this process's trace rates, answering its ``trace_lease``
        push *version* (0: its ``welcome``)."""
        self.send_message({"op": "trace_state", "version": version, "state": TRACING.state()})

    def _refused(self, exc: AuthenticationError) -> None:
        """The handshake failed authentication on our side: fail it and close. After a
        challenge, the server is told first (so that it logs the failed attempt too);
        nothing of our token goes with it."""
        self._lost_reason = exc
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_exception(exc)
        if self._challenged and self.transport is not None:
            self.send_message({"op": "error", "cause": "auth"})
            self.transport.close()  # after that last message
        else:
            self.abort()

    # -- heartbeats (see ezflow._core._liveness) ----------------------------------------

    def send_heartbeat(self, deadline: float) -> None:
        self.send_message({"op": "heartbeat", "deadline": deadline})

    def peer_silent(self, silence: float, deadline: float) -> None:
        reason = EzflowTimeoutError(
            f"the graph server at {self.peer_name()} was silent for {silence:.1f} s (heartbeat "
            f"deadline {deadline:g} s, {ENV_HEARTBEAT_DEADLINE})"
        )
        log.warning("%s: declaring it dead and closing the connection", reason)
        self._lost_reason = reason
        self.abort()

    def protocol_error(self, exc: ProtocolError) -> None:
        log.error("closing the connection to the graph server: %s", exc)
        self._lost_reason = exc
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_exception(exc)
        self.abort()

    def close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        self.lost = True
        reason = self._lost_reason or exc
        self._lost_reason = reason
        error = (
            ClosedResourceError("the graph context is closed")
            if self._closing
            else BrokenResourceError("the connection to the graph server was lost")
        )
        error.__cause__ = reason
        if self._welcome is not None and not self._welcome.done():
            if not self._closing:
                error = BrokenResourceError(
                    f"{self._where} closed the connection during the handshake (does it "
                    "use TLS, and do we? EZFLOW_TLS_CERT/_KEY/_CA must be set on both ends)"
                )
                error.__cause__ = reason
            self._welcome.set_exception(error)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        if not self._closing:
            self._on_lost(reason)
