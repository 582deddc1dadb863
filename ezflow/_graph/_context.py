"""GraphContext, Publisher and Subscriber: the low-level API.

A :class:`GraphContext` is one client of the graph server. It owns

* the connection to the graph server (and the server itself when it started an
  embedded one because none answered),
* this process's transports (the tcp and shm data servers start with the first
  publisher),
* one :class:`~ezflow._core._channel.Channel` per publisher any of its subscribers
  listens to, rebuilt whenever the server pushes new routes.

Publishers and subscribers are created through the context and closed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from .._core._channel import Attachment, Channel, ChannelStats, Inbox, SubscriberStats
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
from .._core._exceptions import (
    BrokenResourceError,
    ClosedResourceError,
    ConfigurationError,
    EzflowError,
)
from .._core._outlet import Outlet, PublisherStats
from .._core._protocol import PublisherInfo, check_topic
from .._core._telemetry import ProcessSnapshot
from .._transports._base import Inbound, Transport
from .._transports._local import LocalTransport
from .._transports._shm import ShmStats, ShmTransport
from .._transports._tcp import TcpTransport
from ._client import GraphClient, host_id
from ._reporter import TelemetryReporter
from ._server import GraphServer

__all__ = ["ChannelInfo", "GraphContext", "Publisher", "Subscriber"]

log = logging.getLogger("ezflow.context")


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """A snapshot of one channel of a context (see :attr:`GraphContext.channels`)."""

    publisher_id: str
    topic: str
    transport: str
    subscribers: int
    lossless: bool
    pending: int
    stats: ChannelStats


@dataclass(eq=False)
class _ChannelRecord:
    key: tuple[str, str]  # (publisher id, transport)
    channel: Channel
    inbound: Inbound | None = None
    attachments: dict[str, Attachment] = field(default_factory=dict)


class Publisher:
    """Publishes messages on one topic. Create with :meth:`GraphContext.publisher`.

    Messages are delivered to each subscriber in publish order. Do not mutate an object
    after publishing it: the local transport hands subscribers the object itself (arrays
    as read-only views) and tcp may still be sending its buffers. For large arrays,
    :meth:`loan` a buffer in shared memory, fill it, and publish it without any copy.
    """

    def __init__(self, context: GraphContext, outlet: Outlet) -> None:
        self._context = context
        self._outlet = outlet
        self._closed = False
        self._loaned = False

    @property
    def id(self) -> str:
        return self._outlet.publisher_id

    @property
    def topic(self) -> str:
        return self._outlet.topic

    @property
    def stats(self) -> PublisherStats:
        """Live counters: messages, bytes, encodes, drops, time spent waiting."""
        return self._outlet.stats

    @property
    def shm_stats(self) -> ShmStats | None:
        """A snapshot of this publisher's shared-memory counters (``None`` when this
        process cannot use shared memory)."""
        shm = self._context._shm
        return None if shm is None else shm.stats(self._outlet)

    @property
    def channels(self) -> int:
        """Channels (one per subscribing process and transport) connected right now."""
        return len(self._outlet.links)

    @property
    def closed(self) -> bool:
        return self._closed

    async def publish(self, message: Any) -> None:
        """Send *message* to every subscriber routed to this publisher.

        Lossless (default) subscribers: waits while the slowest one is ``max_in_flight``
        messages behind. Leaky subscribers never make this wait. Raises
        :class:`~ezflow.UnregisteredTypeError` (a ``TypeError``) for a message the codec
        cannot encode, :class:`~ezflow.MessageTooLargeError` above ``max_message_size``,
        :class:`~ezflow.ClosedResourceError` after :meth:`aclose` — each before anything
        was sent. When cancelled while waiting, nothing was sent.

        A loaned array (:meth:`loan`) - the message itself, or anywhere inside its
        tuples, lists, dicts and dataclasses - is sent to shm subscribers without being
        copied (see :meth:`loan` for when it is), and is read-only from then on, whoever
        the message went to.
        """
        outlet = self._outlet
        if not outlet.publish_nowait(message):
            await outlet.publish(message)
        if self._loaned:
            shm = self._context._shm
            if shm is not None:
                shm.spend(self._outlet, message)

    async def loan(
        self, shape: int | tuple[int, ...], dtype: DTypeLike = np.uint8
    ) -> np.ndarray[Any, Any]:
        """A writable, uninitialised C-contiguous array of *shape* and *dtype* that lives
        in this publisher's shared memory; fill it in place, then :meth:`publish` it.

        Waits first, as :meth:`publish` would, while a lossless subscriber's window is
        full, so that a buffer is taken (and filled) only once it can be sent; a
        cancelled ``loan`` has taken nothing.

        Publishing that very array, or a message holding it anywhere in its tuples,
        lists, dicts and registered dataclasses (``("frame", seq, t_ns, array)``),
        copies none of its bytes for shm subscribers: the rest of the encoded message is
        written into room kept free around the array's data (``SHM_LOAN_ROOM`` bytes on
        each side), the block goes to them as it is, and they receive read-only views of
        the same memory (tcp and local subscribers get it as any array). When the rest
        of the message does not fit that room (other large buffers), or the message
        holds a view of the array rather than the array, it is copied as any message
        (counted in ``shm_stats.loans_copied``). After ``publish`` the array is
        read-only; the memory stays valid (and unchanged) for as long as the array or
        any view of it - here or in a subscriber - is alive. An array never published is
        simply dropped.

        When shared memory cannot be used (not Linux, no ``/dev/shm``) or every block is
        leased, the loan is a private array instead (counted in
        ``shm_stats.loan_fallbacks``): publishing it then copies as usual. Raises
        :class:`~ezflow.UnregisteredTypeError` for a dtype that cannot travel (objects),
        ``ValueError`` for a bad shape, :class:`~ezflow.MessageTooLargeError` above
        ``max_message_size``, :class:`~ezflow.ClosedResourceError` after
        :meth:`aclose`.
        """
        if self._closed:
            raise ClosedResourceError("publisher is closed")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dt = np.dtype(dtype)
        await self._outlet.wait_for_room()
        shm = self._context._shm
        array = None
        if shm is not None:
            array = shm.loan(self._outlet, shape, dt)
        else:
            # Same checks as a shared-memory loan, so that code behaves alike everywhere.
            self._outlet.codec.array_prefix(shape, dt)
        if array is None:
            return np.empty(shape, dt)
        self._loaned = True
        return array

    async def wait_for_channels(self, count: int = 1) -> None:
        """Wait until at least *count* channels are connected (for start-up ordering
        when subscribers may register after this publisher)."""
        await self._outlet.wait_for_links(count)

    async def aclose(self) -> None:
        """Close: every channel sees a clean end after the messages already published
        (nothing accepted is dropped), and the registration is removed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._context._close_publisher(self)

    async def __aenter__(self) -> Publisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class Subscriber:
    """Receives the messages of every publisher routed to its topic. Create with
    :meth:`GraphContext.subscriber`.

    A subscriber gets messages published after it was routed to their publisher (when
    ``GraphContext.subscriber`` returns, for publishers that already exist); nothing
    older is replayed. Per publisher, messages arrive in publish order; a lossless
    subscriber gets every one of them exactly once, a leaky one the newest ``queue``.

    A subscriber created with ``on_message`` queues nothing: its callback gets each
    message as it is delivered, and :meth:`recv` is refused.
    """

    def __init__(
        self, context: GraphContext, sub_id: str, topic: str, inbox: Inbox, transport: str | None
    ) -> None:
        self._context = context
        self.id = sub_id
        self.topic = topic
        self._inbox = inbox
        self.transport = transport
        self._closed = False

    @property
    def leaky(self) -> bool:
        return self._inbox.leaky

    @property
    def stats(self) -> SubscriberStats:
        """Live counters: received, taken, dropped (leaky only)."""
        return self._inbox.stats

    @property
    def queued(self) -> int:
        """Messages waiting to be received."""
        return len(self._inbox)

    @property
    def closed(self) -> bool:
        return self._closed

    def recv(self) -> Coroutine[Any, Any, Any]:
        """Wait for the next message and return it (a coroutine: ``await sub.recv()``).

        Raises :class:`~ezflow.ClosedResourceError` once the subscriber (or its context)
        is closed and every queued message has been received. Cancellation-safe: a
        cancelled ``recv`` takes no message.
        """
        # The inbox's own coroutine, not one wrapped in another: a paced subscriber
        # resumes through one frame fewer for every message.
        inbox = self._inbox
        if inbox._callback is not None:
            raise self._nothing_to_recv()
        return inbox.get()

    def recv_nowait(self) -> Any:
        """Return the next queued message; raise ``asyncio.QueueEmpty`` when there is none."""
        try:
            return self._inbox.get_nowait()
        except IndexError:
            if self._inbox.callback is not None:
                raise self._nothing_to_recv() from None
            if self._closed:
                raise ClosedResourceError("this subscriber is closed") from None
            raise asyncio.QueueEmpty from None

    def _nothing_to_recv(self) -> ConfigurationError:
        """The error of recv() on a callback (``on_message``) subscriber."""
        return ConfigurationError(
            f"subscriber {self.id} on topic {self.topic!r} hands every message to its "
            "on_message callback, so there is nothing to recv(); create it without "
            "on_message to receive with recv() or async for"
        )

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.recv()
        except ClosedResourceError:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        """Stop receiving and remove the registration. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._inbox.close()
        await self._context._close_subscriber(self)

    async def __aenter__(self) -> Subscriber:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


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
        self._host_id = ""
        # Publishers whose shm edges failed to open: their edges use tcp from then on.
        self._shm_refused: set[str] = set()
        self._publishers: dict[str, Publisher] = {}
        self._subscribers: dict[str, Subscriber] = {}
        self._channels: dict[tuple[str, str], _ChannelRecord] = {}
        self._routes: tuple[int, dict[str, Any]] | None = None
        self._routes_ready = asyncio.Event()
        self._route_worker: asyncio.Task[None] | None = None
        self._reporter = TelemetryReporter(
            self,
            telemetry_interval_from_env()
            if telemetry_interval is None
            else check_telemetry_interval(telemetry_interval),
        )
        self._report_task: asyncio.Task[None] | None = None
        self._warned: set[tuple[str, str]] = set()
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
            self._host_id = host_id()
            if ShmTransport.available():
                self._shm = ShmTransport(max_message_size=self._max_message_size, codec=self._codec)
            self._route_worker = asyncio.ensure_future(self._apply_routes_forever())
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
        for record in list(self._channels.values()):
            self._close_record(record)
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
        publisher = Publisher(self, outlet)
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
        subscriber = Subscriber(self, sub_id, topic, inbox, transport)
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
        return [
            ChannelInfo(
                publisher_id=record.key[0],
                topic=record.channel.topic,
                transport=record.key[1],
                subscribers=len(record.attachments),
                lossless=record.channel.lossless,
                pending=record.channel.pending,
                stats=record.channel.stats,
            )
            for record in self._channels.values()
        ]

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
        for record in list(self._channels.values()):
            attachment = record.attachments.pop(subscriber.id, None)
            if attachment is not None:
                record.channel.detach(attachment)
            if not record.attachments:
                self._close_record(record)
        if self._state == "open" and self._client is not None and self._client.connected:
            with contextlib.suppress(BrokenResourceError, ClosedResourceError):
                await self._client.request("unregister", registration_id=subscriber.id)

    # -- routes --------------------------------------------------------------------------

    def _on_routes(self, version: int, message: dict[str, Any]) -> None:
        self._routes = (version, message)
        self._routes_ready.set()

    def _on_lost(self, reason: BaseException | None) -> None:
        if self._state == "open":
            log.error(
                "lost the connection to the graph server at %s (%s); existing channels keep "
                "flowing but the graph can no longer change",
                format_address(self.address),
                reason or "closed",
            )

    async def _apply_routes_forever(self) -> None:
        while True:
            await self._routes_ready.wait()
            self._routes_ready.clear()
            assert self._routes is not None
            version, message = self._routes
            try:
                await self._apply_routes(message)
            except EzflowError as exc:
                log.error("could not apply routes version %d: %s", version, exc)
            except Exception:
                log.exception("could not apply routes version %d", version)
            if self._client is not None and self._client.connected:
                self._client.routes_applied(version)

    def _choose_transport(self, publisher: PublisherInfo, subscriber: Subscriber) -> str:
        """local in the same process and loop; else shm on the same host when both
        processes can use it; else tcp. A forced choice that cannot work falls back to
        the automatic one, with a warning logged once per edge."""
        wanted = subscriber.transport or publisher.transport or self._env_transport
        if wanted == "tcp":
            return "tcp"
        local = LocalTransport.reachable(publisher.publisher_id)
        shm = (
            self._shm is not None
            and publisher.shm_address is not None
            and publisher.host_id == self._host_id
            and publisher.publisher_id not in self._shm_refused
        )
        if wanted == "shm" and shm:
            return "shm"
        chosen = "local" if local else "shm" if shm else "tcp"
        if wanted is not None and wanted != chosen:
            key = (publisher.publisher_id, subscriber.id)
            if key not in self._warned:
                self._warned.add(key)
                reason = (
                    "the publisher is in another process"
                    if wanted == "local"
                    else "shared memory cannot be used between these processes"
                    " (another host, no /dev/shm, or it failed before)"
                )
                log.warning(
                    "transport %r asked for %s -> %s, but %s; using %s",
                    wanted,
                    publisher.topic,
                    subscriber.topic,
                    reason,
                    chosen,
                )
        return chosen

    def _transport(self, name: str) -> Transport:
        if name == "local":
            return self._local
        if name == "shm":
            assert self._shm is not None
            return self._shm
        assert self._tcp is not None
        return self._tcp

    async def _apply_routes(self, message: dict[str, Any]) -> None:
        publishers = {
            pub_id: PublisherInfo.from_wire(info)
            for pub_id, info in dict(message.get("publishers") or {}).items()
        }
        wanted: dict[tuple[str, str], list[Subscriber]] = {}
        for sub_id, pub_ids in dict(message.get("subscribers") or {}).items():
            subscriber = self._subscribers.get(sub_id)
            if subscriber is None or subscriber.closed:
                continue
            for pub_id in pub_ids:
                info = publishers.get(pub_id)
                if info is None:
                    continue
                key = (pub_id, self._choose_transport(info, subscriber))
                wanted.setdefault(key, []).append(subscriber)
        # Detach what is no longer routed; close channels nobody listens to.
        for key, record in list(self._channels.items()):
            keep = {s.id for s in wanted.get(key, ())}
            for sub_id in [s for s in record.attachments if s not in keep]:
                record.channel.detach(record.attachments.pop(sub_id))
            if not record.attachments:
                self._close_record(record)
        # Attach to existing channels; open the missing ones concurrently.
        opening = []
        for key, subscribers in wanted.items():
            existing = self._channels.get(key)
            if existing is None:
                opening.append(self._open_record(key, publishers[key[0]], subscribers))
                continue
            for subscriber in subscribers:
                if subscriber.id not in existing.attachments and not subscriber.closed:
                    existing.attachments[subscriber.id] = existing.channel.attach(subscriber._inbox)
        if opening:
            await asyncio.gather(*opening)

    async def _open_record(
        self, key: tuple[str, str], info: PublisherInfo, subscribers: list[Subscriber]
    ) -> None:
        channel = Channel(info.publisher_id, info.topic, self._codec, transport=key[1])
        record = _ChannelRecord(key, channel)
        self._channels[key] = record
        for subscriber in subscribers:
            record.attachments[subscriber.id] = channel.attach(subscriber._inbox)
        while True:
            try:
                record.inbound = await self._transport(record.key[1]).open_channel(
                    channel, info, on_lost=lambda: self._lost_record(record)
                )
            except EzflowError as exc:
                if record.key[1] == "shm" and self._channels.get(record.key) is record:
                    if self._fall_back_to_tcp(record, info, exc):
                        continue  # the same record, now over tcp
                    return  # joined the tcp channel this process has to it already
                log.warning("cannot open a channel to %s: %s", info.publisher_id, exc)
                self._close_record(record)
                return
            break
        if self._channels.get(record.key) is not record:
            # Closed (context closing, subscribers gone) while we were connecting.
            record.inbound.close()

    def _fall_back_to_tcp(
        self, record: _ChannelRecord, info: PublisherInfo, error: EzflowError
    ) -> bool:
        """The shm channel to *info* could not open: say so once, and turn *record* into
        a tcp one; true if it is to be opened over tcp, false if it joined an existing
        tcp channel to the same publisher instead."""
        if info.publisher_id not in self._shm_refused:
            self._shm_refused.add(info.publisher_id)
            log.warning(
                "cannot use shared memory for publisher %s on topic %r (%s); its edges to "
                "this process use tcp",
                info.publisher_id,
                info.topic,
                error,
            )
        del self._channels[record.key]
        record.key = (info.publisher_id, "tcp")
        record.channel.transport = "tcp"
        existing = self._channels.get(record.key)
        if existing is None:
            self._channels[record.key] = record
            return True
        # Another channel to it over tcp exists already: join it.
        for sub_id, attachment in list(record.attachments.items()):
            record.channel.detach(attachment)
            subscriber = self._subscribers.get(sub_id)
            if subscriber is not None and sub_id not in existing.attachments:
                existing.attachments[sub_id] = existing.channel.attach(subscriber._inbox)
        record.attachments.clear()
        record.channel.close()
        return False

    def _lost_record(self, record: _ChannelRecord) -> None:
        record.inbound = None
        self._close_record(record)

    def _close_record(self, record: _ChannelRecord) -> None:
        if self._channels.get(record.key) is record:
            del self._channels[record.key]
        record.attachments.clear()
        record.channel.close()
        inbound, record.inbound = record.inbound, None
        if inbound is not None:
            inbound.close()
