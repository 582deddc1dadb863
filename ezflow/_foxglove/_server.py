"""The live Foxglove server: a graph's topics as Foxglove WebSocket channels
(``foxglove.websocket.v1``, served by the Foxglove SDK's Rust server; docs/foxglove.md).

How a topic becomes a channel, and what it costs the graph:

* Every ``FOXGLOVE_GRAPH_INTERVAL`` seconds the server reads the graph (topics with a
  publisher, processes, edges). A topic it has not seen gets a *peek*: a leaky
  subscriber (queue 1) that takes one message to choose the schema
  (:func:`~ezflow._foxglove._mapping.mapping_for`) and closes. Then the topic is
  advertised (or listed as skipped: raw bytes and the ``ezflow`` fallback have no
  schema a viewer can show).
* Nothing more happens until a viewer subscribes to the channel: then one leaky
  subscriber (``FOXGLOVE_QUEUE`` newest messages, drops counted) feeds it, whatever the
  number of viewers; it closes when the last viewer unsubscribes or leaves. A message
  that no longer fits the channel's schema is counted (``mismatched``), logged once.
* The SDK buffers ``FOXGLOVE_BACKLOG`` messages per viewer and drops the oldest for one
  that reads too slowly: a slow viewer never slows the graph. It copies every message
  it is given, for every viewer, whether or not the viewer reads, and says nothing about
  a viewer's backlog; so the server looks at the viewers' connections itself (Linux: the
  bytes each socket has not sent) and does not write an array of ``FOXGLOVE_BUSY_BYTES``
  or more while every viewer is still taking earlier ones (counted as *held*).
* An image-shaped array inside a tuple or registered dataclass is also a channel of its
  own (``/cam[1]``, ``/cam.frame``: :func:`~ezflow._foxglove._mapping.image_parts`),
  fed the same way from the same topic: Foxglove's Image panel shows top-level images.
* ``/ezflow/graph`` (JSON, when a viewer subscribes): the graph's topics, processes,
  edges and per-topic rates, refreshed every interval; the Topic Graph panel shows the
  publishers and subscribers (the protocol's connection graph).

The SDK's callbacks run on its own threads; they only hand the event to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import foxglove
import numpy as np
from foxglove.websocket import Capability, ChannelView, Client, ServerListener

from .._core._config import (
    FOXGLOVE_BACKLOG,
    FOXGLOVE_BUSY_BYTES,
    FOXGLOVE_DEFAULT_PORT,
    FOXGLOVE_GRAPH_INTERVAL,
    FOXGLOVE_MAX_TOPICS,
    FOXGLOVE_QUEUE,
    FOXGLOVE_STOP_TIMEOUT,
)
from .._core._exceptions import ConfigurationError, EndOfStream, EzflowError
from .._graph._context import GraphContext
from .._graph._subscriber import Subscriber
from ._mapping import Mapping, NotMappable, encode_message, image_parts, mapping_for

__all__ = ["GRAPH_TOPIC", "FoxgloveServer", "TopicStats"]

log = logging.getLogger("ezflow.foxglove")

#: The JSON topic of the graph's own picture.
GRAPH_TOPIC: Final = "/ezflow/graph"


@dataclass
class TopicStats:
    """What the server did with one topic: its *schema* (``""`` until its first message
    is seen), *skipped* (why it is not advertised, or ``""``), *sent* messages,
    *dropped* by its leaky subscribers (the viewer was slower than the topic),
    *mismatched* (no longer fitting the schema), *viewers* subscribed now, and *held*:
    large messages not written because every viewer was still taking earlier ones."""

    topic: str
    schema: str = ""
    skipped: str = ""
    sent: int = 0
    dropped: int = 0
    mismatched: int = 0
    viewers: int = 0
    held: int = 0
    mapping: Mapping | None = field(default=None, repr=False)
    channel: Any = field(default=None, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    subscriber: Subscriber | None = field(default=None, repr=False)
    clients: set[int] = field(default_factory=set, repr=False)
    #: an image view (``topic`` is the source topic and a part, e.g. ``/cam[1]``): the
    #: source topic, and how the part is taken from its messages (see image_parts)
    source: str = field(default="", repr=False)
    take: Callable[[Any], object] | None = field(default=None, repr=False)


def _log_failure(task: asyncio.Task[Any]) -> None:
    """A task of the server that failed: logged (the server goes on without it)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("ezflow foxglove: %s failed", task.get_name(), exc_info=task.exception())


def _forgotten(stats: TopicStats, task: asyncio.Task[Any]) -> None:
    """A feeding task that ended: the next subscription starts another one."""
    if stats.task is task:
        stats.task = None


async def _stop(server: Any, port: int) -> None:
    """Stop the SDK's *server* (listening on *port*), bounded. Its ``stop()`` waits until
    every viewer's socket has taken what was queued for it, which a viewer that stopped
    reading never does (foxglove-sdk 0.30 waits for ever). Past ``FOXGLOVE_STOP_TIMEOUT``
    the connections it accepted are shut down, which fails those writes, and the stop
    waits as long again; a stop that still hangs is left to a daemon thread (logged)."""
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stop() -> None:
        try:
            server.stop()
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(done.set)

    # A daemon thread, not the loop's executor: asyncio.run waits for its executor's
    # threads at exit, and a stop that never returns would hang the program there.
    threading.Thread(target=stop, name="ezflow foxglove stop", daemon=True).start()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), FOXGLOVE_STOP_TIMEOUT)
        return
    stalled = _shut_down_accepted(port)
    log.warning(
        "ezflow foxglove: %d viewer connection(s) did not take their messages within %.0f s "
        "of the stop (a viewer that stopped reading): closed",
        stalled,
        FOXGLOVE_STOP_TIMEOUT,
    )
    try:
        await asyncio.wait_for(done.wait(), FOXGLOVE_STOP_TIMEOUT)
    except TimeoutError:
        log.error(
            "ezflow foxglove: the Foxglove SDK's server did not stop within %.0f s; its "
            "threads end with this process",
            2 * FOXGLOVE_STOP_TIMEOUT,
        )


def _accepted(port: int, fds: Iterable[int] | None = None) -> Iterator[tuple[int, socket.socket]]:
    """This process's TCP connections accepted on *port* (local port *port*, with a
    peer: not the listening socket, not a client of the server in this process), among
    *fds* (default: every open descriptor; none where ``/proc`` is missing): each
    descriptor with a duplicate of its socket, closed after the caller's step. The SDK
    owns these sockets: a duplicate is looked at or shut down, never closed for it."""
    if fds is None:
        try:
            fds = [int(name) for name in os.listdir("/proc/self/fd")]
        except OSError:
            return
    for fd in fds:
        try:
            copy = os.dup(fd)
        except OSError:
            continue  # closed meanwhile
        try:
            sock = socket.socket(fileno=copy)
        except OSError:  # not a socket (the duplicate is not closed for us)
            os.close(copy)
            continue
        with sock:
            try:
                if (
                    sock.family not in (socket.AF_INET, socket.AF_INET6)
                    or sock.type != socket.SOCK_STREAM
                    or sock.getsockname()[1] != port
                ):
                    continue
                sock.getpeername()  # (the listening socket has none: OSError)
            except OSError:
                continue
            yield fd, sock


def _shut_down_accepted(port: int) -> int:
    """Shut down the connections accepted on *port* (see :func:`_accepted`); returns
    how many. Shut down, not closed: the SDK's pending and next writes fail, and it
    closes them itself."""
    count = 0
    for _, sock in _accepted(port):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
            count += 1
    return count


try:  # the bytes a socket has not sent: Linux's SIOCOUTQ (= TIOCOUTQ)
    import fcntl
    import termios

    _OUTQ: int | None = termios.TIOCOUTQ
except (ImportError, AttributeError):  # (no such ioctl: no viewer is ever busy)
    _OUTQ = None


def _unsent(sock: socket.socket) -> int:
    """Bytes *sock* has not yet sent (0 where the platform cannot tell)."""
    if _OUTQ is None:
        return 0
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0])
    except OSError:
        return 0


class _Viewers:
    """The viewers' connections on *port*, looked at from this process: :meth:`all_busy`
    says whether every one has ``FOXGLOVE_BUSY_BYTES`` or more not yet sent. The list
    of descriptors is read again every ``rescan`` seconds and when viewers subscribe;
    each check verifies that a descriptor is still such a connection."""

    def __init__(self, port: int, rescan: float) -> None:
        self._port = port
        self._rescan = rescan
        self._fds: list[int] = []
        self._scanned = -rescan

    def changed(self) -> None:
        """A viewer came or went: read the list of connections at the next check."""
        self._scanned = -self._rescan

    def all_busy(self) -> bool:
        now = time.monotonic()
        if now - self._scanned >= self._rescan:
            self._scanned = now
            self._fds = [fd for fd, _ in _accepted(self._port)]
        seen = False
        for _, sock in _accepted(self._port, self._fds):
            if _unsent(sock) < FOXGLOVE_BUSY_BYTES:
                return False
            seen = True
        return seen


class _Listener(ServerListener):
    """The SDK's server listener: hands subscriptions to the loop."""

    def __init__(self, server: FoxgloveServer, loop: asyncio.AbstractEventLoop) -> None:
        self._server = server
        self._loop = loop

    def on_subscribe(self, client: Client, channel: ChannelView) -> None:
        self._call(self._server._subscribed, client.id, channel.id, True)

    def on_unsubscribe(self, client: Client, channel: ChannelView) -> None:
        self._call(self._server._subscribed, client.id, channel.id, False)

    def _call(self, *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing to feed
            self._loop.call_soon_threadsafe(*args)


class FoxgloveServer:
    """A Foxglove WebSocket server showing the graph of *context* (an open
    :class:`~ezflow.GraphContext`) on *host*:*port* (``port=0``: any free port; see
    :attr:`port`). Loopback by default: the protocol has no authentication, anyone who
    reaches the port sees every topic (docs/security.md). *tls_cert*/*tls_key* (PEM
    bytes) make it ``wss://`` only.

    *topics*: only these topics (default: every topic with a publisher). Use as an
    async context manager, or ``await start()`` and ``await aclose()``."""

    def __init__(
        self,
        context: GraphContext,
        *,
        host: str = "127.0.0.1",
        port: int = FOXGLOVE_DEFAULT_PORT,
        name: str = "ezflow",
        topics: list[str] | None = None,
        queue: int = FOXGLOVE_QUEUE,
        backlog: int = FOXGLOVE_BACKLOG,
        interval: float = FOXGLOVE_GRAPH_INTERVAL,
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
    ) -> None:
        if (tls_cert is None) != (tls_key is None):
            raise ConfigurationError("tls_cert and tls_key go together (PEM bytes of both)")
        for setting, value in (("queue", queue), ("backlog", backlog)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{setting}={value!r} must be a positive int")
        if not interval > 0:
            raise ConfigurationError(f"interval={interval!r} must be > 0 seconds")
        self._context = context
        self._host = host
        self._wanted_port = port
        self._name = name
        self._only = None if topics is None else set(topics)
        self._queue = queue
        self._backlog = backlog
        self._interval = interval
        self._tls = (tls_cert, tls_key)
        self._fox_context = foxglove.Context()
        self._server: Any = None
        self._viewers: _Viewers | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._by_channel: dict[int, TopicStats] = {}
        self._graph_channel: Any = None
        self._graph_clients: set[int] = set()
        self._mismatch_logged: set[str] = set()
        #: Every topic seen, by name.
        self.topics: dict[str, TopicStats] = {}
        #: Topics seen beyond ``FOXGLOVE_MAX_TOPICS`` (not advertised).
        self.over_limit = 0

    # -- lifecycle ------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the server listens on."""
        if self._server is None:
            raise EzflowError("the Foxglove server is not started")
        return int(self._server.port)

    @property
    def url(self) -> str:
        """``ws://host:port`` (``wss://`` with TLS): what a Foxglove app connects to."""
        scheme = "wss" if self._tls[0] is not None else "ws"
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{scheme}://{host}:{self.port}"

    def app_url(self) -> str:
        """The Foxglove web app's URL that opens this server as its data source."""
        from urllib.parse import quote  # noqa: PLC0415

        return "https://app.foxglove.dev/~/view?ds=foxglove-websocket&ds.url=" + quote(
            self.url, safe=""
        )

    async def start(self) -> None:
        """Start listening and looking at the graph. Raises
        :class:`~ezflow.ConfigurationError` when the port cannot be bound."""
        loop = asyncio.get_running_loop()
        try:
            self._server = foxglove.start_server(
                name=self._name,
                host=self._host,
                port=self._wanted_port,
                context=self._fox_context,
                server_listener=_Listener(self, loop),
                capabilities=[Capability.ConnectionGraph],
                message_backlog_size=self._backlog,
                tls_cert=self._tls[0],
                tls_key=self._tls[1],
            )
        except Exception as exc:  # the SDK raises its own RuntimeError-like errors
            raise ConfigurationError(
                f"cannot serve Foxglove on {self._host}:{self._wanted_port}: {exc} (another "
                "program on that port? choose another with --port)"
            ) from exc
        self._viewers = _Viewers(int(self._server.port), self._interval)
        self._graph_channel = foxglove.Channel(
            GRAPH_TOPIC,
            schema=foxglove.Schema(
                name="ezflow.Graph",
                encoding="jsonschema",
                data=json.dumps({"type": "object"}).encode(),
            ),
            message_encoding="json",
            context=self._fox_context,
        )
        self._poller = asyncio.create_task(self._poll(), name="ezflow foxglove graph")

    async def aclose(self) -> None:
        """Stop the server and close every subscriber it made (idempotent)."""
        tasks = [t for t in (self._poller, *self._tasks) if t is not None]
        for stats in self.topics.values():
            if stats.task is not None:
                tasks.append(stats.task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._poller = None
        if self._server is not None:
            server, self._server = self._server, None
            await _stop(server, int(server.port))

    async def __aenter__(self) -> FoxgloveServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the graph ------------------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            try:
                snapshot = await self._context.graph()
                self._discover(snapshot)
                if self._graph_channel.has_sinks():
                    await self._publish_graph(snapshot)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the graph server gone or restarting: try again
                log.warning("ezflow foxglove: cannot read the graph: %s", exc)
            await asyncio.sleep(self._interval)

    def _discover(self, snapshot: dict[str, Any]) -> None:
        topics = sorted({str(p["topic"]) for p in snapshot.get("publishers", [])})
        for topic in topics:
            if topic in self.topics or (self._only is not None and topic not in self._only):
                continue
            if len(self.topics) >= FOXGLOVE_MAX_TOPICS:
                self.over_limit += 1
                continue
            self.topics[topic] = TopicStats(topic)
            self._spawn(self._peek(self.topics[topic]), f"ezflow foxglove peek {topic}")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)

    async def _peek(self, stats: TopicStats) -> None:
        """Take one message of the topic to choose its schema, then advertise it."""
        subscriber = await self._context.subscriber(stats.topic, leaky=True, queue=1)
        try:
            message = await subscriber.recv()
        except EndOfStream:
            del self.topics[stats.topic]  # seen again at the next look, if it comes back
            return
        finally:
            await subscriber.aclose()
        mapping = mapping_for(message)
        stats.schema = mapping.schema_name
        if mapping.message_encoding not in ("json", "protobuf"):
            stats.skipped = (
                "raw bytes: no schema to show"
                if mapping.message_encoding == "raw"
                else f"{type(message).__qualname__}: no JSON form (docs/foxglove.md)"
            )
            log.info("ezflow foxglove: not showing %s (%s)", stats.topic, stats.skipped)
            return
        self._advertise(stats, mapping)
        # An image inside a tuple or dataclass (a frame with its number, say) is also a
        # channel of its own: Foxglove's Image panel shows top-level images only.
        for suffix, take in image_parts(message):
            name = stats.topic + suffix
            if name in self.topics or len(self.topics) >= FOXGLOVE_MAX_TOPICS:
                continue
            part = self.topics[name] = TopicStats(name, source=stats.topic, take=take)
            self._advertise(part, mapping_for(take(message)))

    def _advertise(self, stats: TopicStats, mapping: Mapping) -> None:
        stats.schema = mapping.schema_name
        stats.mapping = mapping
        stats.channel = foxglove.Channel(
            stats.topic,
            schema=foxglove.Schema(
                name=mapping.schema_name,
                encoding=mapping.schema_encoding,
                data=mapping.schema_data,
            ),
            message_encoding=mapping.message_encoding,
            context=self._fox_context,
        )
        self._by_channel[stats.channel.id()] = stats

    async def _publish_graph(self, snapshot: dict[str, Any]) -> None:
        rates: dict[str, float] = {}
        try:
            telemetry = await self._context.graph_telemetry()
        except EzflowError:
            telemetry = {}
        for process in telemetry.values():
            for publisher in process.publishers:
                rates[publisher.topic] = rates.get(publisher.topic, 0.0) + publisher.msgs_per_s
        clients = {c.get("client_id"): c for c in snapshot.get("clients", [])}
        topics: dict[str, dict[str, Any]] = {}
        for kind in ("publishers", "subscribers"):
            for entry in snapshot.get(kind, []):
                row = topics.setdefault(
                    str(entry["topic"]), {"publishers": 0, "subscribers": 0, "rate": 0.0}
                )
                row[kind] += 1
        for topic, row in topics.items():
            row["rate"] = rates.get(topic, 0.0)
        picture = {
            "topics": topics,
            "edges": [list(edge) for edge in snapshot.get("edges", [])],
            "processes": [
                {"name": c.get("name", ""), "pid": c.get("pid"), "host": c.get("host", "")}
                for c in clients.values()
            ],
        }
        self._graph_channel.log(json.dumps(picture).encode(), log_time=time.time_ns())
        graph = foxglove.ConnectionGraph()
        for kind, setter in (
            ("publishers", graph.set_published_topic),
            ("subscribers", graph.set_subscribed_topic),
        ):
            ids: dict[str, list[str]] = {}
            for entry in snapshot.get(kind, []):
                client = clients.get(entry.get("client_id"), {})
                label = f"{client.get('name', '?')} ({client.get('pid', '?')})"
                ids.setdefault(str(entry["topic"]), []).append(label)
            for topic, labels in ids.items():
                setter(topic, sorted(set(labels)))
        if self._server is not None:
            self._server.publish_connection_graph(graph)

    # -- subscriptions --------------------------------------------------------------

    def _subscribed(self, client_id: int, channel_id: int, subscribed: bool) -> None:
        if self._graph_channel is not None and channel_id == self._graph_channel.id():
            (self._graph_clients.add if subscribed else self._graph_clients.discard)(client_id)
            return
        stats = self._by_channel.get(channel_id)
        if stats is None:
            return
        if self._viewers is not None:
            self._viewers.changed()
        if subscribed:
            stats.clients.add(client_id)
        else:
            stats.clients.discard(client_id)
        stats.viewers = len(stats.clients)
        if stats.clients and stats.task is None:
            stats.task = asyncio.create_task(
                self._forward(stats), name=f"ezflow foxglove {stats.topic}"
            )
            stats.task.add_done_callback(_log_failure)
            stats.task.add_done_callback(lambda task: _forgotten(stats, task))
        elif not stats.clients and stats.task is not None:
            stats.task.cancel()
            stats.task = None

    async def _forward(self, stats: TopicStats) -> None:
        """Feed the topic's channel while a viewer is subscribed."""
        mapping, channel = stats.mapping, stats.channel
        assert mapping is not None and channel is not None
        while True:
            subscriber = await self._context.subscriber(
                stats.source or stats.topic, leaky=True, queue=self._queue
            )
            stats.subscriber = subscriber
            try:
                await self._feed(stats, subscriber, mapping, channel)
            except EndOfStream:
                pass  # its publishers ended: wait for new ones
            finally:
                stats.subscriber = None
                stats.dropped += subscriber.statistics().dropped
                await subscriber.aclose()
            await asyncio.sleep(self._interval)

    async def _feed(
        self, stats: TopicStats, subscriber: Subscriber, mapping: Mapping, channel: Any
    ) -> None:
        take = stats.take
        viewers = self._viewers
        while True:
            message = await subscriber.recv()
            now = time.time_ns()
            try:
                if take is not None:
                    try:
                        message = take(message)
                    except (LookupError, AttributeError, TypeError) as exc:
                        raise NotMappable(f"no {stats.topic} in it ({exc})") from exc
                if (
                    viewers is not None
                    and isinstance(message, np.ndarray)
                    and message.nbytes >= FOXGLOVE_BUSY_BYTES
                    and viewers.all_busy()
                ):
                    stats.held += 1  # (its copies would wait behind the earlier ones)
                    continue
                data = encode_message(message, mapping, now)
            except NotMappable as exc:
                stats.mismatched += 1
                if stats.topic not in self._mismatch_logged:
                    self._mismatch_logged.add(stats.topic)
                    log.warning(
                        "ezflow foxglove: %s: a message no longer fits its schema %s (%s); "
                        "such messages are not shown (counted)",
                        stats.topic,
                        mapping.schema_name,
                        exc,
                    )
                continue
            channel.log(data, log_time=now)
            stats.sent += 1

    def statistics(self) -> list[TopicStats]:
        """A copy of every topic's :class:`TopicStats` now (drops include those of the
        subscriber feeding a channel now)."""
        out = []
        for stats in self.topics.values():
            copy = TopicStats(
                stats.topic,
                stats.schema,
                stats.skipped,
                stats.sent,
                stats.dropped
                + (0 if stats.subscriber is None else stats.subscriber.statistics().dropped),
                stats.mismatched,
                stats.viewers,
                stats.held,
            )
            out.append(copy)
        return out
