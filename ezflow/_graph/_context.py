"""GraphContext: the low-level API's entry point, one client of the graph server.

A :class:`GraphContext` is one client of the graph server. It owns

* the connection to the graph server (and the server itself when it started an
  embedded one because none answered),
* this process's transports (the tcp and shm data servers start with the first
  publisher),
* its :class:`~ezflow._graph._routing.Router`: one channel per publisher any of its
  subscribers listens to, rebuilt whenever the server pushes new routes.

Publishers (``_publisher.py``) and subscribers (``_subscriber.py``) are created through
the context and closed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import logging
import uuid
from collections.abc import Callable
from typing import Any

from .._core._channel import Inbox
from .._core._codec import Codec
from .._core._config import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_IN_FLIGHT_BYTES,
    Address,
    ShmOptions,
    check_positive,
    check_telemetry_interval,
    check_transport,
    format_address,
    graph_address_from_env,
    max_message_size_from_env,
    parse_address,
    telemetry_interval_from_env,
    transport_from_env,
)
from .._core._exceptions import BrokenResourceError, ClosedResourceError, ConfigurationError
from .._core._outlet import Outlet
from .._core._protocol import check_topic
from .._core._telemetry import ProcessSnapshot
from .._transports._ezring import read_ring_header
from .._transports._local import LocalTransport
from .._transports._shm import ShmTransport
from .._transports._tcp import TcpTransport
from ._client import GraphClient, host_id
from ._publisher import Publisher
from ._reporter import TelemetryReporter
from ._routing import ChannelInfo, Router
from ._server import GraphServer
from ._subscriber import Subscriber

__all__ = ["GraphContext"]

log = logging.getLogger("ezflow.context")


class GraphContext:
    """A client of the graph server: use as ``async with GraphContext() as ctx``.

    *address* (``(host, port)`` or ``"host:port"``) defaults to ``EZFLOW_GRAPH_ADDRESS``,
    else ``127.0.0.1:25990``. When nothing answers there and *auto_start* is true, the
    context starts an embedded graph server at that address (port 0: any free port),
    which lives as long as this context. *max_message_size* (default
    ``EZFLOW_MAX_MESSAGE_SIZE``, else 128 MiB) bounds what this process sends and
    accepts. Every *telemetry_interval* seconds (default ``EZFLOW_TELEMETRY_INTERVAL``,
    else 1; 0: never) the context snapshots its telemetry, hands it to the
    ``on_snapshot`` hooks and reports it to the graph server (docs/telemetry.md).
    """

    def __init__(
        self,
        address: Address | str | None = None,
        *,
        auto_start: bool = True,
        name: str | None = None,
        max_message_size: int | None = None,
        telemetry_interval: float | None = None,
    ) -> None:
        if address is None:
            address = graph_address_from_env()
        elif isinstance(address, str):
            address = parse_address(address)
        self._requested_address: Address = address
        self._auto_start = auto_start
        self.name = name or f"ezflow-{uuid.uuid4().hex[:6]}"
        self._max_message_size = (
            max_message_size_from_env()
            if max_message_size is None
            else check_positive(max_message_size, setting="max_message_size")
        )
        self._env_transport = check_transport(transport_from_env(), setting="EZFLOW_TRANSPORT")
        self._codec = Codec(max_message_size=self._max_message_size)
        self._client: GraphClient | None = None
        self._server: GraphServer | None = None
        self._local = LocalTransport()
        self._tcp: TcpTransport | None = None
        self._shm: ShmTransport | None = None
        self._publishers: dict[str, Publisher] = {}
        self._subscribers: dict[str, Subscriber] = {}
        self._router: Router | None = None
        self._route_worker: asyncio.Task[None] | None = None
        self._reporter = TelemetryReporter(
            self,
            telemetry_interval_from_env()
            if telemetry_interval is None
            else check_telemetry_interval(telemetry_interval),
        )
        self._report_task: asyncio.Task[None] | None = None
        self._state = "new"

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def address(self) -> Address:
        """The graph server address in use."""
        if self._server is not None:
            return self._server.address
        return self._requested_address

    @property
    def server(self) -> GraphServer | None:
        """The embedded graph server, when this context started one."""
        return self._server

    async def __aenter__(self) -> GraphContext:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Connect to the graph server (starting an embedded one if allowed)."""
        if self._state != "new":
            raise RuntimeError("a GraphContext can be started once")
        self._state = "starting"
        try:
            self._client = await self._connect()
            self._tcp = TcpTransport(
                host=self._client.local_host, max_message_size=self._max_message_size
            )
            if ShmTransport.available():
                self._shm = ShmTransport(max_message_size=self._max_message_size, codec=self._codec)
            self._router = Router(
                codec=self._codec,
                local=self._local,
                tcp=self._tcp,
                shm=self._shm,
                host_id=host_id(),
                env_transport=self._env_transport,
                subscribers=self._subscribers,
            )
            self._route_worker = asyncio.ensure_future(self._router.run(self._routes_applied))
            if self._reporter.interval > 0:
                self._report_task = asyncio.ensure_future(self._reporter.run())
        except BaseException:
            await self.aclose()
            raise
        self._state = "open"

    async def _connect(self) -> GraphClient:
        address = self._requested_address
        for _ in range(3):
            if address[1] != 0:
                try:
                    return await GraphClient.connect(
                        address, name=self.name, on_routes=self._on_routes, on_lost=self._on_lost
                    )
                except ConnectionRefusedError as exc:
                    if not self._auto_start:
                        raise BrokenResourceError(
                            f"no graph server answers at {format_address(address)}; start one "
                            "with `ezflow serve` or allow GraphContext(auto_start=True)"
                        ) from exc
            server = GraphServer(address)
            try:
                await server.start()
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue  # another process started one first: connect to it
                raise BrokenResourceError(
                    f"cannot start a graph server at {format_address(address)}: {exc}"
                ) from exc
            self._server = server
            log.info("started an embedded graph server at %s", format_address(server.address))
            return await GraphClient.connect(
                server.address, name=self.name, on_routes=self._on_routes, on_lost=self._on_lost
            )
        raise BrokenResourceError(
            f"cannot connect to or start a graph server at {format_address(address)}"
        )

    async def aclose(self) -> None:
        """Close every publisher, subscriber and channel of this context, the connection
        to the graph server, and the embedded server if this context started one.

        Publishers end cleanly: channels in other processes receive everything already
        published, then ``END``, before this context leaves the graph (bounded by 5 s per
        connection for a peer that stops reading). Idempotent; if cancelled while waiting
        for that, connections are aborted and nothing is left open.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        if self._route_worker is not None:
            self._route_worker.cancel()
        if self._report_task is not None:
            self._report_task.cancel()
        for subscriber in list(self._subscribers.values()):
            subscriber._closed = True
            subscriber._inbox.close()
        self._subscribers.clear()
        for publisher in list(self._publishers.values()):
            publisher._closed = True
            publisher._outlet.close()
        self._publishers.clear()
        if self._router is not None:
            self._router.close()
        try:
            # Remote channels read up to END before this process leaves the graph (and
            # its registrations vanish), so nothing already published is lost.
            await self._local.aclose()
            # Both at once (each may wait up to 5 s for slow channels); an error in one
            # must not keep the other open.
            results = await asyncio.gather(
                *(t.aclose() for t in (self._tcp, self._shm) if t is not None),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result  # cancellation and the like: not ours to swallow
                    log.error("closing a transport failed", exc_info=result)
        finally:
            if self._client is not None:
                self._client.close()
            if self._server is not None:
                await self._server.aclose()

    def _check_open(self) -> GraphClient:
        if self._state != "open" or self._client is None:
            raise ClosedResourceError(
                "this GraphContext is not open (use it inside `async with GraphContext()`)"
            )
        return self._client

    # -- publishers and subscribers ------------------------------------------------------

    async def publisher(
        self,
        topic: str,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES,
        transport: str | None = None,
        shm: ShmOptions | None = None,
    ) -> Publisher:
        """Register a publisher on *topic*.

        Returns once every subscriber that already exists is connected to it.
        *max_in_flight* / *max_in_flight_bytes* bound what each lossless channel may hold
        unreleased before ``publish`` waits. *transport* forces ``"local"``, ``"shm"`` or
        ``"tcp"`` for its edges (a subscriber's own choice wins; default: automatic).
        *shm* sizes its shared-memory ring (:class:`~ezflow.ShmOptions`).
        """
        client = self._check_open()
        check_topic(topic)
        check_positive(max_in_flight, setting="max_in_flight")
        check_positive(max_in_flight_bytes, setting="max_in_flight_bytes")
        transport = check_transport(transport, setting="transport")
        if shm is not None and not isinstance(shm, ShmOptions):
            raise ConfigurationError(f"shm={shm!r} must be an ezflow.ShmOptions")
        assert self._tcp is not None
        address = await self._tcp.start()
        shm_address = None if self._shm is None else await self._shm.start()
        outlet = Outlet(
            f"p-{uuid.uuid4().hex[:16]}",
            topic,
            self._codec,
            max_in_flight=max_in_flight,
            max_in_flight_bytes=max_in_flight_bytes,
        )
        publisher = Publisher(outlet, self._shm, self._close_publisher)
        self._publishers[outlet.publisher_id] = publisher
        self._local.add_outlet(outlet)
        self._tcp.add_outlet(outlet)
        if self._shm is not None:
            self._shm.add_outlet(outlet, shm)
        try:
            await client.request(
                "register_publisher",
                publisher_id=outlet.publisher_id,
                topic=topic,
                address=list(address),
                transport=transport,
                shm=shm_address,
            )
        except BaseException:
            self._drop_outlet(publisher)
            raise
        return publisher

    async def attach_ring(self, name: str, *, topic: str | None = None) -> str:
        """Register the ezring ring *name* (``/dev/shm/ezflow-ring-<name>``, written by a
        C/C++ or Python producer, docs/ezring.md) as a publisher of *topic* (default:
        the topic in the ring's header); return its publisher id.

        Every subscriber of *topic* on this host, in any process, then receives the
        ring's frames as read-only numpy arrays (zero-copy; a slot is released when the
        subscribers have dropped the array). The registration lasts until this context
        closes; a ring whose writer closes or dies ends its channels. Raises
        :class:`BrokenResourceError` if the ring does not exist, :class:`ProtocolError`
        if it is not ezring v1, :class:`ConfigurationError` without a topic.
        """
        client = self._check_open()
        header = read_ring_header(name)  # one small read of a tmpfs file
        topic = topic or header.topic
        if not topic:
            raise ConfigurationError(
                f"ezring {name} declares no topic: pass attach_ring({name!r}, topic=...)"
            )
        check_topic(topic)
        assert self._tcp is not None
        address = await self._tcp.start()
        publisher_id = f"p-{uuid.uuid4().hex[:16]}"
        await client.request(
            "register_publisher",
            publisher_id=publisher_id,
            topic=topic,
            address=list(address),
            transport="ezring",  # shown by `ezflow graph`; routers read `ring`
            shm=None,
            ring=name,
        )
        return publisher_id

    async def subscriber(
        self,
        topic: str,
        *,
        leaky: bool = False,
        queue: int | None = None,
        transport: str | None = None,
        on_message: Callable[[Any], object] | None = None,
    ) -> Subscriber:
        """Register a subscriber on *topic*.

        Returns once it is connected to every publisher that already feeds *topic*.
        ``leaky=True`` makes it keep only the newest *queue* messages (default 1),
        counting drops, and never hold publishers back; lossless subscribers (default)
        are bounded by each publisher's ``max_in_flight`` instead, so *queue* is only
        accepted with ``leaky=True``. *transport* forces ``"local"``, ``"shm"`` or ``"tcp"``.

        *on_message*: a plain function called with each message as it is delivered,
        instead of queueing it for :meth:`Subscriber.recv` - the lowest latency, since no
        task has to wake up. It runs synchronously on the event loop (for a ``local``
        edge, inside the publisher's ``publish``), so it must not block; a message
        counts as taken when it returns. An exception it raises is logged and counted
        (``stats.callback_errors``), and delivery goes on. With ``leaky=True`` the
        publisher drops messages for this subscriber instead of waiting when its
        process falls behind. Raises :class:`~ezflow.ConfigurationError` for a
        coroutine function or with *queue*.
        """
        client = self._check_open()
        check_topic(topic)
        if on_message is not None:
            if not callable(on_message) or inspect.iscoroutinefunction(on_message):
                raise ConfigurationError(
                    f"on_message={on_message!r} must be a plain (not async) function: it is "
                    "called synchronously with each message; for async handling, create "
                    "the subscriber without on_message and use recv() or async for"
                )
            if queue is not None:
                raise ConfigurationError(
                    "queue= does not apply with on_message: a callback subscriber queues nothing"
                )
        elif queue is not None and not leaky:
            raise ConfigurationError(
                "queue= only applies to leaky subscribers (leaky=True); a lossless "
                "subscriber is bounded by each publisher's max_in_flight"
            )
        if leaky and on_message is None:
            queue = check_positive(1 if queue is None else queue, setting="queue")
        transport = check_transport(transport, setting="transport")
        sub_id = f"s-{uuid.uuid4().hex[:16]}"
        inbox = Inbox(leaky=leaky, maxlen=queue, name=sub_id, callback=on_message)
        subscriber = Subscriber(sub_id, topic, inbox, transport, self._close_subscriber)
        self._subscribers[sub_id] = subscriber
        try:
            await client.request(
                "register_subscriber",
                subscriber_id=sub_id,
                topic=topic,
                leaky=leaky,
                transport=transport,
            )
        except BaseException:
            self._subscribers.pop(sub_id, None)
            subscriber._closed = True
            subscriber._inbox.close()
            raise
        return subscriber

    async def connect(self, src: str, dst: str) -> None:
        """Route every message published on *src* to the subscribers of *dst* too.

        Returns once the affected subscribers are connected. The edge lives until
        :meth:`disconnect` or until this context closes.
        """
        client = self._check_open()
        await client.request("connect", src=check_topic(src), dst=check_topic(dst))

    async def disconnect(self, src: str, dst: str) -> None:
        """Remove the edge *src* -> *dst*; returns once no new message follows it.
        Raises :class:`~ezflow.GraphError` when there is no such edge."""
        client = self._check_open()
        await client.request("disconnect", src=check_topic(src), dst=check_topic(dst))

    async def graph(self) -> dict[str, Any]:
        """The graph server's view: topics, clients, publishers, subscribers, edges."""
        client = self._check_open()
        reply = await client.request("graph")
        reply.pop("op", None)
        reply.pop("id", None)
        reply.pop("ok", None)
        return reply

    def telemetry(self) -> ProcessSnapshot:
        """A telemetry snapshot of this context now: every channel (counters, latency,
        decode and handler histograms, drops by reason, queue depth, buffers in use) and
        every publisher (counters, backpressure wait). Rates cover the time since the
        last periodic snapshot."""
        return self._reporter.snapshot()

    async def graph_telemetry(self) -> dict[str, ProcessSnapshot]:
        """The latest snapshot every client of the graph server reported, by client id
        (what ``ezflow top`` shows). Raises :class:`~ezflow.GraphError` when the server
        refuses, :class:`~ezflow.BrokenResourceError` when it is gone."""
        client = self._check_open()
        reply = await client.request("telemetry")
        processes = reply.get("processes")
        if not isinstance(processes, dict):
            raise BrokenResourceError("the graph server sent a malformed telemetry reply")
        return {
            str(client_id): ProcessSnapshot.from_wire(data) for client_id, data in processes.items()
        }

    def _shm_in_use(self, outlet: Outlet) -> int:
        """Shared-memory blocks of *outlet* leased or being written (0 without shm)."""
        stats = None if self._shm is None else self._shm.stats(outlet)
        return 0 if stats is None else stats.in_use

    @property
    def channels(self) -> list[ChannelInfo]:
        """The channels of this context right now, one per (publisher, transport)."""
        return [] if self._router is None else self._router.infos()

    async def _close_publisher(self, publisher: Publisher) -> None:
        self._drop_outlet(publisher)
        # Unregister only once remote channels have read up to END, so the routing
        # change cannot overtake the last messages.
        await asyncio.gather(
            *(t.wait_closed(publisher._outlet) for t in (self._tcp, self._shm) if t is not None)
        )
        if self._state == "open" and self._client is not None and self._client.connected:
            with contextlib.suppress(BrokenResourceError, ClosedResourceError):
                await self._client.request("unregister", registration_id=publisher.id)

    def _drop_outlet(self, publisher: Publisher) -> None:
        outlet = publisher._outlet
        self._publishers.pop(outlet.publisher_id, None)
        self._local.remove_outlet(outlet)
        for transport in (self._tcp, self._shm):
            if transport is not None:
                transport.remove_outlet(outlet)
        outlet.close()

    async def _close_subscriber(self, subscriber: Subscriber) -> None:
        self._subscribers.pop(subscriber.id, None)
        if self._router is not None:
            self._router.detach(subscriber.id)
        if self._state == "open" and self._client is not None and self._client.connected:
            with contextlib.suppress(BrokenResourceError, ClosedResourceError):
                await self._client.request("unregister", registration_id=subscriber.id)

    # -- routes --------------------------------------------------------------------------

    def _on_routes(self, version: int, message: dict[str, Any]) -> None:
        if self._router is not None:
            self._router.offer(version, message)

    def _routes_applied(self, version: int) -> None:
        if self._client is not None and self._client.connected:
            self._client.routes_applied(version)

    def _on_lost(self, reason: BaseException | None) -> None:
        if self._state == "open":
            log.error(
                "lost the connection to the graph server at %s (%s); existing channels keep "
                "flowing but the graph can no longer change",
                format_address(self.address),
                reason or "closed",
            )
