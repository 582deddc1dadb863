"""GraphContext: the low-level API's entry point, one client of the graph server.

A :class:`GraphContext` is one client of the graph server. It owns

* the connection to the graph server (and the server itself when it started an
  embedded one because none answered), and what it registered there: publishers,
  subscribers and topic -> topic edges, kept so that it can register them again on
  whatever server answers after the connection drops (see "Reconnect" below),
* this process's transports, as a :class:`~ezflow._transports.TransportSet` (the
  data servers start with the first publisher),
* its :class:`~ezflow._graph._routing.Router`: one channel per publisher any of its
  subscribers listens to, rebuilt whenever the server pushes new routes.

Publishers (``_publisher.py``) and subscribers (``_subscriber.py``) are created through
the context and closed with it.

Reconnect: when the connection to the graph server drops (the server crashed, was
restarted, or its process left), channels keep flowing (the data plane does not go
through the server) and a background task reconnects with jittered exponential backoff
(``RECONNECT_MIN_DELAY`` to ``RECONNECT_MAX_DELAY``), starting an embedded server itself
when nothing answers and ``auto_start`` allows it (unless the server said it stopped on
request). It then registers everything again under the same ids, edges first, then
publishers, then subscribers, and the router keeps existing channels through the
re-registration of the other processes (``RECONNECT_ROUTE_GRACE``). One warning is
logged when the outage starts and one info line when it ends.

Size: one class, :class:`GraphContext` (about 750 lines), whose methods share its
registration state (publishers, subscribers, edges, the connection, the router), which
reconnection replays as a whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import inspect
import logging
import os
import random
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from .._core._auth import Credentials, TlsFiles, Token
from .._core._codec import Codec
from .._core._config import (
    DEFAULT_LEAKY_QUEUE,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_IN_FLIGHT_BYTES,
    OTHER_ADDRESS_HINT,
    RECONNECT_MAX_DELAY,
    RECONNECT_MIN_DELAY,
    RECONNECT_ROUTE_GRACE,
    RECONNECT_WAIT_TIMEOUT,
    TYPO_GRACE_PERIOD,
    Address,
    ShmOptions,
    check_positive,
    check_stall_timeout,
    check_telemetry_interval,
    check_transport,
    format_address,
    graph_address_from_env,
    max_message_size_from_env,
    parse_address,
    shm_dir_from_env,
    telemetry_interval_from_env,
    transport_from_env,
)
from .._core._exceptions import (
    BrokenResourceError,
    ClosedResourceError,
    ConfigurationError,
    EzflowError,
    GraphError,
    ProtocolError,
)
from .._core._inbox import Inbox
from .._core._outlet import Outlet
from .._core._protocol import check_topic
from .._core._telemetry import ProcessSnapshot
from .._core._tracing import trace_rate_from_env
from .._transports import TransportSet, TransportSettings, ring_registration, transport_names
from ._client import GraphClient, host_id
from ._embedded import EmbeddedGraphServer
from ._publisher import Publisher
from ._reporter import TelemetryReporter
from ._routing import ChannelInfo, ChannelRecord, Router
from ._server import GraphServer
from ._subscriber import Subscriber
from ._traces import hops_from_reply

__all__ = ["GraphContext"]

log = logging.getLogger("ezflow.context")


class GraphContext:
    """A client of the graph server: use as ``async with GraphContext() as ctx``.

    *address* (``(host, port)`` or ``"host:port"``) defaults to ``EZFLOW_GRAPH_ADDRESS``,
    else ``127.0.0.1:25990``. When nothing answers there and *auto_start* is true, the
    context starts an embedded graph server at that address (port 0: any free port), in
    a thread of its own, which lives as long as this context. When the connection to
    the graph server drops, the context reconnects in the background and registers its
    publishers, subscribers and edges again (module docstring); with *auto_start* it
    starts a server itself when none answers any more (taking over from a process that
    left). Calls that need the server wait up to ``RECONNECT_WAIT_TIMEOUT`` (10 s) for
    the reconnection, then raise :class:`~ezflow.BrokenResourceError`.
    *max_message_size* (default ``EZFLOW_MAX_MESSAGE_SIZE``, else 128 MiB) bounds what
    this process sends and accepts. Every *telemetry_interval* seconds (default
    ``EZFLOW_TELEMETRY_INTERVAL``, else 1; 0: never) the context snapshots its
    telemetry, hands it to the ``on_snapshot`` hooks and reports it to the graph server
    (docs/telemetry.md).

    *token* (default ``EZFLOW_TOKEN``, else the file named by ``EZFLOW_TOKEN_FILE``) is
    the graph's shared secret: proved to the graph server and required of every channel
    that connects to this process's publishers (and of the clients of an embedded
    server); its ``repr`` is hidden. *tls* (default ``EZFLOW_TLS_CERT``/``_KEY``/``_CA``)
    puts the graph connection and tcp data under TLS. See docs/security.md. Raises
    :class:`~ezflow.ConfigurationError` for a token shorter than 16 bytes.
    """

    def __init__(
        self,
        address: Address | str | None = None,
        *,
        auto_start: bool = True,
        name: str | None = None,
        max_message_size: int | None = None,
        telemetry_interval: float | None = None,
        token: Token | str | bytes | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self._credentials = Credentials.resolve(token, tls)
        if address is None:
            address = graph_address_from_env()
        elif isinstance(address, str):
            address = parse_address(address)
        self._requested_address: Address = address
        # Where the server is: the requested address, or where the embedded one bound.
        self._address: Address = address
        self._auto_start = auto_start
        self.name = name or f"ezflow-{uuid.uuid4().hex[:6]}"
        self._max_message_size = (
            max_message_size_from_env()
            if max_message_size is None
            else check_positive(max_message_size, setting="max_message_size")
        )
        self._env_transport = check_transport(
            transport_from_env(transport_names()),
            setting="EZFLOW_TRANSPORT",
            names=transport_names(),
        )
        trace_rate_from_env()  # (read at import; an unusable value is reported here)
        shm_dir_from_env()  # (read where shared memory is used; a relative path is an error)
        self._codec = Codec(max_message_size=self._max_message_size)
        self._client: GraphClient | None = None
        # Connections made so far; callbacks of an older one are ignored.
        self._generation = 0
        self._client_generation = -1
        # Set while connected with every registration restored; cleared during an outage.
        self._restored = asyncio.Event()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._server: EmbeddedGraphServer | None = None
        # What this context registered, to register again after a reconnection: the
        # request (op and fields) per registration id, and the edges it created.
        self._registrations: dict[str, dict[str, Any]] = {}
        self._edges: dict[tuple[str, str], None] = {}
        self._transports: TransportSet | None = None
        self._publishers: dict[str, Publisher] = {}
        self._subscribers: dict[str, Subscriber] = {}
        # Subscribers with no publisher yet -> the timer of their typo check.
        self._typo_timers: dict[str, asyncio.TimerHandle] = {}
        self._typo_tasks: set[asyncio.Task[None]] = set()
        self._router: Router | None = None
        self._route_worker: asyncio.Task[None] | None = None
        self._reporter = TelemetryReporter(
            _ReportView(self),
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
        return self._address

    @property
    def server(self) -> GraphServer | None:
        """The embedded graph server, when this context started one (it runs in a
        thread of its own: inspect it, do not call its coroutines)."""
        return None if self._server is None else self._server.server

    @property
    def connected(self) -> bool:
        """Whether the context is connected to a graph server with everything it
        registered restored (false during an outage)."""
        return self._state == "open" and self._restored.is_set()

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
            self._client = await self._connect(start_server=self._auto_start)
            # (Probes whether each transport can work here, off the loop: shm creates and
            # unlinks a file.)
            self._transports = await TransportSet.create(
                TransportSettings(
                    host=self._client.local_host,
                    host_id=host_id(),
                    max_message_size=self._max_message_size,
                    codec=self._codec,
                    credentials=self._credentials,
                )
            )
            self._router = Router(
                codec=self._codec,
                transports=self._transports,
                env_transport=self._env_transport,
                subscribers=self._subscribers,
            )
            self._route_worker = asyncio.ensure_future(self._router.run())
            if self._reporter.interval > 0:
                self._report_task = asyncio.ensure_future(self._reporter.run())
        except BaseException:
            await self.aclose()
            raise
        self._state = "open"
        self._restored.set()
        if not self._client.connected:  # lost while starting: nobody reacted yet
            self._on_lost(self._client_generation, None)

    async def _connect(self, *, start_server: bool) -> GraphClient:
        """Connect to the graph server at :attr:`address`; when nothing answers there
        and *start_server*, start an embedded one (several processes may race to: the
        one that binds serves, the others connect to it). Raises
        :class:`BrokenResourceError` when nothing answers (and none may be started),
        or as :meth:`GraphClient.connect`."""
        address = self._address
        if address[1] == 0 and not start_server:
            # Port 0 names no server to connect to: only one started here could serve.
            raise BrokenResourceError(
                f"no graph server to connect to at {format_address(address)}: port 0 means "
                "'start one on a free port', which auto_start=False forbids; give the "
                "address of a running graph server (`ezflow serve` prints it)"
            )
        in_use: OSError | None = None
        for _ in range(3):
            if address[1] != 0:
                try:
                    return await self._open_client(address)
                except ConnectionRefusedError as exc:
                    if not start_server:
                        raise BrokenResourceError(
                            f"no graph server answers at {format_address(address)}; start one "
                            "with `ezflow serve` or allow GraphContext(auto_start=True)"
                        ) from exc
            credentials = self._credentials
            server = EmbeddedGraphServer(address, token=credentials.token, tls=credentials.tls)
            try:
                await server.start()
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    in_use = exc
                    continue  # another process started one first: connect to it
                raise BrokenResourceError(
                    f"cannot start a graph server at {format_address(address)}: {exc}"
                ) from exc
            previous, self._server = self._server, server
            if previous is not None:  # stopped on request; its thread has ended
                await previous.aclose()
            self._address = server.address
            log.info("started an embedded graph server at %s", format_address(server.address))
            return await self._open_client(server.address)
        # Bound (so no server could start) yet refusing connections, three times: a
        # program that is not a graph server holds the port.
        raise BrokenResourceError(
            f"cannot start a graph server at {format_address(address)}: the port is in use "
            f"({os.strerror(errno.EADDRINUSE)}) but nothing there accepts "
            f"connections; {OTHER_ADDRESS_HINT}"
        ) from in_use

    async def _open_client(self, address: Address) -> GraphClient:
        """Connect and make the connection the current one (its callbacks count)."""
        self._generation += 1
        generation = self._generation
        client = await GraphClient.connect(
            address,
            name=self.name,
            on_routes=functools.partial(self._on_routes, generation),
            on_lost=functools.partial(self._on_lost, generation),
            credentials=self._credentials,
        )
        self._client, self._client_generation = client, generation
        return client

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
        self._restored.set()  # wake calls waiting for a reconnection: they raise Closed
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        if self._route_worker is not None:
            self._route_worker.cancel()
        if self._report_task is not None:
            self._report_task.cancel()
        for subscriber in list(self._subscribers.values()):
            subscriber._closed = True
            subscriber._inbox.close()
        self._subscribers.clear()
        for timer in self._typo_timers.values():
            timer.cancel()
        self._typo_timers.clear()
        for task in list(self._typo_tasks):
            task.cancel()
        for publisher in list(self._publishers.values()):
            publisher._closed = True
            publisher._outlet.close()
        self._publishers.clear()
        if self._router is not None:
            self._router.close()
        try:
            if self._client is not None and self._reporter.interval > 0:
                # The trace hops its subscribers just finished, before the process may
                # end (a report is one write; nothing here waits for the server).
                try:
                    await self._reporter.report_traces()
                except Exception:
                    log.exception("the last telemetry report failed")
            # Remote channels read up to END before this process leaves the graph (and
            # its registrations vanish), so nothing already published is lost. All
            # transports at once (each may wait up to 5 s for slow channels); an error
            # in one does not keep the others open.
            if self._transports is not None:
                await self._transports.aclose()
        finally:
            if self._client is not None:
                self._client.close()
            if self._reconnect_task is not None:
                # Cancelled above; it ends at once (or after joining a server thread it
                # was starting), so that nothing it made outlives the context.
                await asyncio.wait({self._reconnect_task})
            if self._client is not None:
                self._client.close()  # the reconnect task may have made a new one
            if self._server is not None:
                await self._server.aclose()

    def _check_open(self) -> None:
        if self._state != "open":
            raise ClosedResourceError(
                "this GraphContext is not open (use it inside `async with GraphContext()`)"
            )

    async def _ready_client(self) -> GraphClient:
        """The connection to the graph server, once every registration is restored on
        it: waits up to ``RECONNECT_WAIT_TIMEOUT`` during an outage, then raises
        :class:`BrokenResourceError`; :class:`ClosedResourceError` when closed."""
        self._check_open()
        if not self._restored.is_set():
            try:
                await asyncio.wait_for(self._restored.wait(), RECONNECT_WAIT_TIMEOUT)
            except (TimeoutError, asyncio.TimeoutError):
                raise BrokenResourceError(
                    f"no graph server has answered at {format_address(self._address)} for "
                    f"{RECONNECT_WAIT_TIMEOUT:g} s (RECONNECT_WAIT_TIMEOUT); this context "
                    "keeps reconnecting in the background and its channels keep flowing. "
                    "Try again later, or start a graph server there (`ezflow serve`)"
                ) from None
            self._check_open()
        assert self._client is not None
        return self._client

    async def _request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request once connected (see :meth:`_ready_client`). When the
        connection drops before the answer, wait for the reconnection (which restores
        every registration) and send it once more: every request sent through here is
        idempotent on the server (a known id from the same process is accepted)."""
        client = await self._ready_client()
        try:
            return await client.request(op, **fields)
        except BrokenResourceError:
            if self._state != "open":
                raise
        client = await self._ready_client()
        return await client.request(op, **fields)

    # -- publishers and subscribers ------------------------------------------------------

    async def publisher(
        self,
        topic: str,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES,
        transport: str | None = None,
        shm: ShmOptions | None = None,
        stall_timeout: float | None = None,
    ) -> Publisher:
        """Register a publisher on *topic*.

        Returns once every subscriber that already exists is connected to it.
        *max_in_flight* / *max_in_flight_bytes* bound what each lossless channel may hold
        unreleased before ``publish`` waits. *transport* forces ``"local"``, ``"shm"`` or
        ``"tcp"`` for its edges (a subscriber's own choice wins; default: automatic).
        *shm* sizes its shared-memory ring (:class:`~ezflow.ShmOptions`).
        *stall_timeout* (seconds; default ``None``, off) cuts a lossless channel that
        released nothing for that long while ``publish`` waited on it, so that one
        stopped subscriber cannot stall the others forever (counted in
        ``stats.stalled_cut``, logged; its subscribers see the publisher lost).
        """
        self._check_open()
        check_topic(topic)
        check_positive(max_in_flight, setting="max_in_flight")
        check_positive(max_in_flight_bytes, setting="max_in_flight_bytes")
        transport = check_transport(transport, setting="transport", names=transport_names())
        stall_timeout = check_stall_timeout(stall_timeout)
        if shm is not None and not isinstance(shm, ShmOptions):
            raise ConfigurationError(f"shm={shm!r} must be an ezflow.ShmOptions")
        transports = self._transports
        assert transports is not None
        where = await transports.advertise()
        outlet = Outlet(
            f"p-{uuid.uuid4().hex[:16]}",
            topic,
            self._codec,
            max_in_flight=max_in_flight,
            max_in_flight_bytes=max_in_flight_bytes,
            stall_timeout=stall_timeout,
        )
        outlet.handoff = ShmOptions().handoff if shm is None else shm.handoff
        transports.add_outlet(outlet, shm=shm)
        publisher = Publisher(outlet, transports.loans(outlet), self._close_publisher)
        self._publishers[outlet.publisher_id] = publisher
        request: dict[str, Any] = {
            "op": "register_publisher",
            "publisher_id": outlet.publisher_id,
            "topic": topic,
            **where,  # where its process serves it: "address" (tcp), "shm", ...
            "transport": transport,
        }
        self._registrations[outlet.publisher_id] = request
        try:
            await self._request(**request)
        except BaseException:
            self._registrations.pop(outlet.publisher_id, None)
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
        self._check_open()
        # (No file I/O on the loop.)
        declared, fields = await asyncio.to_thread(ring_registration, name)
        topic = topic or declared
        if not topic:
            raise ConfigurationError(
                f"ezring {name} declares no topic: pass attach_ring({name!r}, topic=...)"
            )
        check_topic(topic)
        assert self._transports is not None
        # The fields every registration needs (an "address"): none of this process's
        # data servers serves the ring, each subscribing process reads it itself.
        where = await self._transports.advertise(optional=False)
        publisher_id = f"p-{uuid.uuid4().hex[:16]}"
        request: dict[str, Any] = {
            "op": "register_publisher",
            "publisher_id": publisher_id,
            "topic": topic,
            **where,
            **fields,  # "transport": "ezring", the ring's name and its writer's
        }
        # Kept with the other registrations: restored after a reconnection.
        self._registrations[publisher_id] = request
        try:
            await self._request(**request)
        except BaseException:
            self._registrations.pop(publisher_id, None)
            raise
        return publisher_id

    async def subscriber(
        self,
        topic: str,
        *,
        leaky: bool = False,
        queue: int | None = None,
        transport: str | None = None,
        on_message: Callable[[Any], object] | None = None,
        encoded: bool = False,
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

        *encoded*: hand over each message's encoded body instead of the message (a
        relay that forwards bodies, as the Zenoh bridge does): see
        :attr:`Subscriber.encoded`. Raises :class:`~ezflow.ConfigurationError` when not
        a bool.
        """
        self._check_open()
        check_topic(topic)
        if not isinstance(encoded, bool):
            raise ConfigurationError(
                f"encoded={encoded!r} must be True (receive encoded bodies) or False "
                "(receive messages)"
            )
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
            queue = check_positive(DEFAULT_LEAKY_QUEUE if queue is None else queue, setting="queue")
        transport = check_transport(transport, setting="transport", names=transport_names())
        sub_id = f"s-{uuid.uuid4().hex[:16]}"
        inbox = Inbox(leaky=leaky, maxlen=queue, name=sub_id, callback=on_message, encoded=encoded)
        subscriber = Subscriber(sub_id, topic, inbox, transport, self._close_subscriber)
        self._subscribers[sub_id] = subscriber
        request: dict[str, Any] = {
            "op": "register_subscriber",
            "subscriber_id": sub_id,
            "topic": topic,
            "leaky": leaky,
            "transport": transport,
        }
        self._registrations[sub_id] = request
        try:
            await self._request(**request)
        except BaseException:
            self._registrations.pop(sub_id, None)
            self._subscribers.pop(sub_id, None)
            subscriber._closed = True
            subscriber._inbox.close()
            raise
        if not subscriber.had_publisher:
            self._typo_timers[sub_id] = asyncio.get_running_loop().call_later(
                TYPO_GRACE_PERIOD, self._start_typo_check, subscriber
            )
        return subscriber

    # -- topic names that are probably typos ---------------------------------------------

    def _skip_typo_check(self, subscriber: Subscriber) -> None:
        """Do not look for a typo in *subscriber*'s topic (a unit's input: the unit graph
        checks its topic names itself)."""
        timer = self._typo_timers.pop(subscriber.id, None)
        if timer is not None:
            timer.cancel()

    def _start_typo_check(self, subscriber: Subscriber) -> None:
        self._typo_timers.pop(subscriber.id, None)
        if self._state != "open" or subscriber._closed or subscriber.had_publisher:
            return
        task = asyncio.ensure_future(self._typo_check(subscriber))
        self._typo_tasks.add(task)
        task.add_done_callback(self._typo_tasks.discard)

    async def _typo_check(self, subscriber: Subscriber) -> None:
        """One warning if *subscriber* (no publisher for ``TYPO_GRACE_PERIOD`` s)
        listens on a topic a typo away from one that has a publisher."""
        from ._typos import fed_topics, nearest_topic  # noqa: PLC0415 - rarely needed

        try:
            snapshot = await self.graph()
        except Exception as exc:  # an outage, a closing context: nothing to say
            log.debug("cannot look for a topic near %r: %r", subscriber.topic, exc)
            return
        fed = fed_topics(snapshot)
        if subscriber.had_publisher or subscriber.topic in fed:
            return
        near = nearest_topic(subscriber.topic, fed)
        if near is not None:
            log.warning(
                "the subscriber of %r has had no publisher for %g s; did you mean %r "
                "(a topic that has a publisher)?",
                subscriber.topic,
                TYPO_GRACE_PERIOD,
                near,
            )

    async def connect(self, src: str, dst: str) -> None:
        """Route every message published on *src* to the subscribers of *dst* too.

        Returns once the affected subscribers are connected. The edge lives until
        :meth:`disconnect` or until this context closes.
        """
        self._check_open()
        edge = (check_topic(src), check_topic(dst))
        known = edge in self._edges
        self._edges[edge] = None
        try:
            await self._request("connect", src=src, dst=dst)
        except BaseException:
            if not known:
                self._edges.pop(edge, None)
            raise

    async def disconnect(self, src: str, dst: str) -> None:
        """Remove the edge *src* -> *dst*; returns once no new message follows it.
        Raises :class:`~ezflow.GraphError` when there is no such edge."""
        self._check_open()
        edge = (check_topic(src), check_topic(dst))
        self._edges.pop(edge, None)
        generation = self._generation
        try:
            await self._request("disconnect", src=src, dst=dst)
        except GraphError:
            if generation == self._generation:
                raise
            # Reconnected meanwhile: the new server never had the edge from us, so it
            # is gone as asked.

    async def graph(self) -> dict[str, Any]:
        """The graph server's view: topics, clients, publishers, subscribers, edges."""
        reply = await self._request("graph")
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
        reply = await self._request("telemetry")
        processes = reply.get("processes")
        if not isinstance(processes, dict):
            raise BrokenResourceError("the graph server sent a malformed telemetry reply")
        return {
            str(client_id): ProcessSnapshot.from_wire(data) for client_id, data in processes.items()
        }

    async def graph_traces(self) -> list[dict[str, Any]]:
        """The trace hops the graph server keeps (the newest ``TRACE_SERVER_KEEP``, from
        every process; see :func:`ezflow.set_trace_rate` and docs/tracing.md), oldest
        first, each a dict of the hop's fields (``trace_id``, ``span_id``,
        ``parent_id``, ``topic``, ``subscriber``, stage times in ``CLOCK_MONOTONIC`` ns,
        ``process`` and ``wall_offset``). Raises as :meth:`graph_telemetry`."""
        reply = await self._request("traces")
        try:
            return hops_from_reply(reply)
        except ProtocolError as exc:
            raise BrokenResourceError(str(exc)) from exc

    def _blocks_in_use(self, outlet: Outlet) -> int:
        """Shared-memory blocks of *outlet* leased or being written (0 without shared
        memory)."""
        publisher = self._publishers.get(outlet.publisher_id)
        stats = None if publisher is None else publisher.shm_statistics()
        return 0 if stats is None else stats.in_use

    @property
    def channels(self) -> list[ChannelInfo]:
        """The channels of this context right now, one per (publisher, transport)."""
        return [] if self._router is None else self._router.infos()

    async def _close_publisher(self, publisher: Publisher) -> None:
        self._registrations.pop(publisher.id, None)
        self._drop_outlet(publisher)
        # Unregister only once remote channels have read up to END, so the routing
        # change cannot overtake the last messages.
        if self._transports is not None:
            await self._transports.wait_closed(publisher._outlet)
        await self._unregister(publisher.id)

    def _drop_outlet(self, publisher: Publisher) -> None:
        outlet = publisher._outlet
        self._publishers.pop(outlet.publisher_id, None)
        if self._transports is not None:
            self._transports.remove_outlet(outlet)
        outlet.close()

    async def _close_subscriber(self, subscriber: Subscriber) -> None:
        self._skip_typo_check(subscriber)
        self._registrations.pop(subscriber.id, None)
        self._subscribers.pop(subscriber.id, None)
        if self._router is not None:
            self._router.detach(subscriber.id)
        await self._unregister(subscriber.id)

    async def _unregister(self, registration_id: str) -> None:
        """Remove a registration from the server, if connected: during an outage there
        is nothing to do, since the reconnection restores only what is still kept (a
        restore in progress may not have registered it yet: the refusal is ignored)."""
        client = self._client
        if self._state == "open" and client is not None and client.connected:
            with contextlib.suppress(BrokenResourceError, ClosedResourceError, GraphError):
                await client.request("unregister", registration_id=registration_id)

    # -- routes --------------------------------------------------------------------------

    def _on_routes(self, generation: int, version: int, message: dict[str, Any]) -> None:
        if self._router is not None and generation == self._client_generation:
            self._router.offer(
                version, message, functools.partial(self._routes_applied, generation)
            )

    def _routes_applied(self, generation: int, version: int) -> None:
        client = self._client
        if generation == self._client_generation and client is not None and client.connected:
            client.routes_applied(version)

    # -- reconnect -----------------------------------------------------------------------

    def _on_lost(self, generation: int, reason: BaseException | None) -> None:
        if self._state != "open" or generation != self._client_generation:
            return
        if self._reconnect_task is not None and not self._reconnect_task.done():
            return  # the connection being restored dropped: the task tries again
        client = self._client
        stopped = client is not None and client.server_stopped
        # Take over only from an embedded server: a standalone one (`ezflow serve`) is
        # waited for, so that it can be restarted at its address.
        take_over = (
            self._auto_start and client is not None and client.server_embedded and not stopped
        )
        self._restored.clear()
        log.warning(
            "lost the connection to the graph server at %s (%s); existing channels keep "
            "flowing, reconnecting%s",
            format_address(self._address),
            "it stopped on request" if stopped else reason or "closed",
            " (and starting one if none answers)" if take_over else "",
        )
        self._reconnect_task = asyncio.ensure_future(self._reconnect(start_server=take_over))

    async def _reconnect(self, *, start_server: bool) -> None:
        """Reconnect with jittered exponential backoff until it works (or the context
        closes), then restore every registration; logs one line when done."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        delay = RECONNECT_MIN_DELAY
        attempts = 0
        while self._state == "open":
            attempts += 1
            client: GraphClient | None = None
            try:
                client = await self._connect(start_server=start_server)
                await self._restore(client)
            except Exception as exc:
                if client is not None:
                    client.close()
                if isinstance(exc, (OSError, EzflowError)):
                    log.debug("reconnect attempt %d to the graph server failed: %s", attempts, exc)
                else:  # a bug: say so, and keep trying
                    log.exception("reconnect attempt %d to the graph server failed", attempts)
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, RECONNECT_MAX_DELAY)
                continue
            self._restored.set()
            log.info(
                "reconnected to the graph server at %s after %.1f s (%d attempts); restored "
                "%d registrations and %d edges",
                format_address(self._address),
                loop.time() - began,
                attempts,
                len(self._registrations),
                len(self._edges),
            )
            return

    async def _restore(self, client: GraphClient) -> None:
        """Register again on *client* everything this context keeps: edges first, then
        publishers, then subscribers, so that a subscriber's first routes already name
        its publishers. Raises :class:`BrokenResourceError` (and the like) when the
        connection fails meanwhile; a registration the server refuses is logged and
        left out."""
        if self._router is not None:
            self._router.hold(RECONNECT_ROUTE_GRACE)

        async def again(key: str | tuple[str, str]) -> None:
            if isinstance(key, tuple):
                if key not in self._edges:
                    return
                request: dict[str, Any] = {"op": "connect", "src": key[0], "dst": key[1]}
            else:
                found = self._registrations.get(key)
                if found is None:  # closed meanwhile
                    return
                request = found
            try:
                await client.request(**request)
            except GraphError as exc:
                log.error("could not restore %s after reconnecting: %s", key, exc)

        for batch in (
            list(self._edges),
            [k for k, r in self._registrations.items() if r["op"] == "register_publisher"],
            [k for k, r in self._registrations.items() if r["op"] != "register_publisher"],
        ):
            results = await asyncio.gather(*(again(key) for key in batch), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        if not client.connected:
            raise BrokenResourceError("the connection to the graph server was lost again")


class _ReportView:
    """What the telemetry reporter may read of a :class:`GraphContext`."""

    def __init__(self, context: GraphContext) -> None:
        self._context = context

    @property
    def name(self) -> str:
        return self._context.name

    def channel_records(self) -> Iterable[ChannelRecord]:
        router = self._context._router
        return () if router is None else router.channels.values()

    def outlets(self) -> Iterable[Outlet]:
        return (publisher._outlet for publisher in self._context._publishers.values())

    def shm_in_use(self, outlet: Outlet) -> int:
        return self._context._blocks_in_use(outlet)

    def send_report(self, snapshot: dict[str, Any]) -> bool:
        client = self._context._client
        return client is not None and client.send_report(snapshot)
