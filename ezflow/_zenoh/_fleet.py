"""Seeing a fleet: each host's graph and telemetry, through Zenoh.

A host's bridge (``ZenohBridge(fleet=DOMAIN)``, ``ezflow zenoh bridge --fleet DOMAIN``)
runs a :class:`FleetAnnouncer`: a liveliness token ``ezflow/fleet/<domain>/<host>`` (so
watchers see hosts join and leave) and a queryable on ``ezflow/fleet/<domain>/<host>/*``
answering ``graph`` (the graph server's view, what ``ezflow graph`` shows) and ``top``
(every process's telemetry snapshot, what ``ezflow top`` shows). Replies are msgpack maps
``{"v": 1, "host": ..., "graph" | "processes": ..., "hosts": ...}`` (``top`` also carries
the bridge's per-mapping state and counters, ``"bridge"``: state, refusals, drops, losses
between hosts, cross-host latency). ``"hosts"`` is what the announcer saw of the fleet's
liveliness tokens: ``{host: {"alive": bool, "last_seen": unix time}}`` (at most
``ZENOH_FLEET_HOSTS``), so that a watcher can name the hosts that did not answer and
how long ago they were last seen (:func:`silent_hosts`). :func:`query_fleet` asks every
host of a domain at once (``ezflow graph --fleet``, ``ezflow top --fleet``).

Zenoh calls the queryable on its own thread; the answer is computed on the bridge's
event loop (``run_coroutine_threadsafe``) and sent from Zenoh's thread, so the loop never
waits for Zenoh and Zenoh waits at most :data:`ZENOH_ANSWER_TIMEOUT` for the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import unquote

import msgpack
import zenoh

from .._core._config import ZENOH_ANSWER_TIMEOUT, ZENOH_FLEET_HOSTS
from .._core._exceptions import ConfigurationError
from .._graph._context import GraphContext
from ._keys import expand_host

__all__ = ["FLEET_PREFIX", "announce", "fleet_key", "query_fleet", "silent_hosts"]

log = logging.getLogger("ezflow.zenoh")

FLEET_PREFIX = "ezflow/fleet"
_WHAT = ("graph", "top")


def fleet_key(domain: str, host: str = "*") -> str:
    """The key of *host* in fleet *domain* (``*``: every host)."""
    if not domain or any(c in domain for c in "/*$?#"):
        raise ConfigurationError(
            f"fleet domain {domain!r}: one word, without '/', '*', '$', '?' or '#'"
        )
    return f"{FLEET_PREFIX}/{domain}/" + (host if host == "*" else expand_host("{host}", host))


async def _answer(
    context: GraphContext,
    host: str,
    what: str,
    bridge: Callable[[], dict[str, Any]] | None,
    hosts: dict[str, dict[str, Any]],
) -> bytes:
    now = time.time()
    seen = {
        name: {"alive": h["alive"], "last_seen": now if h["alive"] else h["last_seen"]}
        for name, h in hosts.items()
    }
    if what == "graph":
        body: dict[str, Any] = {"graph": await context.graph(), "hosts": seen}
    else:
        telemetry = await context.graph_telemetry()
        body = {
            "processes": {cid: snap.to_wire() for cid, snap in telemetry.items()},
            "hosts": seen,
        }
        if bridge is not None:  # the bridge's mappings: cross-host drops, losses, latency
            body["bridge"] = bridge()
    return msgpack.packb({"v": 1, "host": host, **body})  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def announce(
    session: Any,
    domain: str,
    host: str,
    context: GraphContext,
    bridge: Callable[[], dict[str, Any]] | None = None,
) -> AsyncIterator[None]:
    """Announce this host's graph in fleet *domain* while the context is open (see the
    module doc); *bridge* gives the announcing bridge's per-mapping counters for ``top``.
    Undeclared on the way out, also on error or cancellation."""
    loop = asyncio.get_running_loop()
    key = fleet_key(domain, host)
    hosts: dict[str, dict[str, Any]] = {}  # (read and written on the loop only)

    def seen(name: str, alive: bool) -> None:  # on the loop
        if name not in hosts and len(hosts) >= ZENOH_FLEET_HOSTS:
            gone = [h for h, v in hosts.items() if not v["alive"]]
            if not gone:
                return
            del hosts[min(gone, key=lambda h: hosts[h]["last_seen"])]
        hosts[name] = {"alive": alive, "last_seen": time.time()}

    def on_token(sample: Any) -> None:  # on a Zenoh thread
        try:
            name = unquote(str(sample.key_expr).rsplit("/", 1)[-1])
            alive = sample.kind == zenoh.SampleKind.PUT
        except Exception:  # nothing from a peer may escape into Zenoh
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: we are stopping
            loop.call_soon_threadsafe(seen, name, alive)

    def on_query(query: Any) -> None:  # on a Zenoh thread
        what = str(query.key_expr).rsplit("/", 1)[-1]
        if what not in _WHAT:
            return
        future = asyncio.run_coroutine_threadsafe(_answer(context, host, what, bridge, hosts), loop)
        try:
            payload = future.result(ZENOH_ANSWER_TIMEOUT)
        except Exception as exc:
            future.cancel()
            log.warning("fleet query %s: no answer (%s)", query.key_expr, exc)
            return
        query.reply(f"{key}/{what}", payload)

    token = session.liveliness().declare_token(key)
    watcher = session.liveliness().declare_subscriber(
        fleet_key(domain), zenoh.handlers.Callback(on_token, indirect=False), history=True
    )
    queryable = session.declare_queryable(f"{key}/*", on_query)
    log.info("announcing this graph as %s", key)
    try:
        yield
    finally:
        for entity in (queryable, watcher, token):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(entity.undeclare)


async def query_fleet(
    session: Any, domain: str, what: str, timeout: float = ZENOH_ANSWER_TIMEOUT
) -> dict[str, dict[str, Any]]:
    """Ask every host of fleet *domain* for its ``"graph"`` or ``"top"``: the decoded
    replies by host name. Hosts that do not answer within *timeout* are left out."""
    if what not in _WHAT:
        raise ConfigurationError(f"query_fleet: what={what!r}, not one of {_WHAT}")
    selector = f"{fleet_key(domain)}/{what}"

    def ask() -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        replies = session.get(
            selector,
            target=zenoh.QueryTarget.ALL,  # every host, not the nearest queryable
            consolidation=zenoh.ConsolidationMode.NONE,
            timeout=timeout,
        )
        for reply in replies:
            if reply.ok is None:
                continue
            try:
                body = msgpack.unpackb(reply.ok.payload.to_bytes())
            except ValueError:
                continue
            if isinstance(body, dict) and isinstance(body.get("host"), str):
                found[body["host"]] = body
        return found

    return await asyncio.to_thread(ask)


def silent_hosts(
    replies: dict[str, dict[str, Any]], now: float | None = None
) -> list[dict[str, Any]]:
    """The hosts that did not answer a :func:`query_fleet`, as the answering hosts saw the
    fleet: ``{"host", "alive" (its token is still there: it did not answer in time),
    "seconds_since_seen" (None while alive)}``, by host name."""
    now = time.time() if now is None else now
    known: dict[str, dict[str, Any]] = {}
    for reply in replies.values():
        hosts = reply.get("hosts")
        if not isinstance(hosts, dict):
            continue
        for name, seen in hosts.items():
            if name in replies or not isinstance(seen, dict):
                continue
            alive, last = bool(seen.get("alive")), seen.get("last_seen")
            if not isinstance(last, (int, float)):
                continue
            mine = known.get(name)
            if mine is None or last > mine["last_seen"]:
                known[name] = {"alive": alive, "last_seen": last}
    return [
        {
            "host": name,
            "alive": seen["alive"],
            "seconds_since_seen": None
            if seen["alive"]
            else round(max(0.0, now - seen["last_seen"]), 1),
        }
        for name, seen in sorted(known.items())
    ]
