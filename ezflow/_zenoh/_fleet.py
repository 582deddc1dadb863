"""Seeing a fleet: each host's graph and telemetry, through Zenoh.

A host's bridge (``ZenohBridge(fleet=DOMAIN)``, ``ezflow zenoh bridge --fleet DOMAIN``)
runs a :class:`FleetAnnouncer`: a liveliness token ``ezflow/fleet/<domain>/<host>`` (so
watchers see hosts join and leave) and a queryable on ``ezflow/fleet/<domain>/<host>/*``
answering ``graph`` (the graph server's view, what ``ezflow graph`` shows) and ``top``
(every process's telemetry snapshot, what ``ezflow top`` shows). Replies are msgpack maps
``{"v": 1, "host": ..., "graph" | "processes": ...}`` (``top`` also carries the bridge's
per-mapping counters, ``"bridge"``: drops, losses between hosts, cross-host latency).
:func:`query_fleet` asks every host of a domain at once (``ezflow graph --fleet``,
``ezflow top --fleet``).

Zenoh calls the queryable on its own thread; the answer is computed on the bridge's
event loop (``run_coroutine_threadsafe``) and sent from Zenoh's thread, so the loop never
waits for Zenoh and Zenoh waits at most :data:`ZENOH_ANSWER_TIMEOUT` for the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import zenoh

from .._core._config import ZENOH_ANSWER_TIMEOUT
from .._core._exceptions import ConfigurationError
from .._graph._context import GraphContext
from ._keys import expand_host

__all__ = ["FLEET_PREFIX", "announce", "fleet_key", "query_fleet"]

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
    context: GraphContext, host: str, what: str, bridge: Callable[[], dict[str, Any]] | None
) -> bytes:
    if what == "graph":
        body: dict[str, Any] = {"graph": await context.graph()}
    else:
        telemetry = await context.graph_telemetry()
        body = {"processes": {cid: snap.to_wire() for cid, snap in telemetry.items()}}
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

    def on_query(query: Any) -> None:  # on a Zenoh thread
        what = str(query.key_expr).rsplit("/", 1)[-1]
        if what not in _WHAT:
            return
        future = asyncio.run_coroutine_threadsafe(_answer(context, host, what, bridge), loop)
        try:
            payload = future.result(ZENOH_ANSWER_TIMEOUT)
        except Exception as exc:
            future.cancel()
            log.warning("fleet query %s: no answer (%s)", query.key_expr, exc)
            return
        query.reply(f"{key}/{what}", payload)

    token = session.liveliness().declare_token(key)
    queryable = session.declare_queryable(f"{key}/*", on_query)
    log.info("announcing this graph as %s", key)
    try:
        yield
    finally:
        for entity in (queryable, token):
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
