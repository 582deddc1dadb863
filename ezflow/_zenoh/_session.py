"""Opening a Zenoh session from ezflow settings.

Secure defaults: peer mode with multicast scouting off (a session finds only the
endpoints it is given), and no listening endpoint unless one is given (here or in the
file). TLS, mutual TLS and access control come from a Zenoh configuration file (JSON5)
named by ``config_file``, whose settings the explicit ones here override: mode and
scouting always, endpoints when some are given (none given, the file's stand).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import zenoh

from .._core._exceptions import ConfigurationError

__all__ = ["ZenohSettings", "endpoints", "open_session", "session_config"]


@dataclass(frozen=True)
class ZenohSettings:
    """Where a session connects and listens. *mode*: ``"peer"`` (talks to any peer or
    router it reaches), ``"client"`` (through one router: dials out, for NAT) or
    ``"router"``; *connect*/*listen*: endpoints such as ``"tcp/10.0.0.5:7447"``;
    *config_file*: a Zenoh JSON5 configuration (TLS, access control); *scouting*: let
    multicast scouting find peers on the LAN (off by default)."""

    mode: Literal["peer", "client", "router"] = "peer"
    connect: tuple[str, ...] = ()
    listen: tuple[str, ...] = ()
    config_file: str | None = None
    scouting: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ("peer", "client", "router"):
            raise ConfigurationError(
                f"ZenohSettings.mode={self.mode!r}: use 'peer', 'client' or 'router'"
            )
        for endpoint in (*self.connect, *self.listen):
            if "/" not in endpoint:
                raise ConfigurationError(
                    f"Zenoh endpoint {endpoint!r} has no protocol: write it like "
                    "tcp/10.0.0.5:7447 (or tls/..., quic/...)"
                )
        if self.mode == "client" and not self.connect and self.config_file is None:
            raise ConfigurationError("a Zenoh client needs connect=[a router's endpoint]")


def session_config(settings: ZenohSettings) -> Any:
    """The ``zenoh.Config`` for *settings*: the file's, then *mode* and *scouting*, and
    the *connect* and *listen* endpoints when any are given (none given: the file's
    stand). ConfigurationError naming the file or value that Zenoh refused, or a client
    left without an endpoint to connect to."""
    try:
        config = (
            zenoh.Config.from_file(settings.config_file) if settings.config_file else zenoh.Config()
        )
    except Exception as exc:  # zenoh raises ZError (and OSError) for a bad file
        raise ConfigurationError(
            f"cannot read the Zenoh configuration {settings.config_file}: {exc}"
        ) from exc
    values: dict[str, Any] = {
        "mode": settings.mode,
        "scouting/multicast/enabled": settings.scouting,
    }
    if settings.config_file is None:
        # Zenoh's own shared memory (on by default) leaves its /dev/shm/*.zenoh pool
        # files behind when the process exits; ezflow's shm transport already carries
        # same-host edges, so a bridge needs it not. A configuration file decides alone.
        values["transport/shared_memory/enabled"] = False
    for kind, given in (("connect", settings.connect), ("listen", settings.listen)):
        # Given ones override the file's; none given, the file's stand, and where it sets
        # none either, none (Zenoh's default listens on every interface).
        if given or endpoints(config, kind, settings.mode) is None:
            values[f"{kind}/endpoints"] = list(given)
    for key, value in values.items():
        try:
            config.insert_json5(key, json.dumps(value))
        except Exception as exc:
            raise ConfigurationError(f"Zenoh refused {key}={value!r}: {exc}") from exc
    if settings.mode == "client" and not endpoints(config, "connect", "client"):
        raise ConfigurationError(
            f"a Zenoh client needs a router's endpoint: give connect=[...] (--connect), or "
            f"connect/endpoints in {settings.config_file}"
        )
    return config


def endpoints(config: Any, kind: str, mode: str) -> list[str] | None:
    """The *kind* endpoints a ``zenoh.Config`` gives a session in *mode* (Zenoh takes a
    list, or lists per mode: ``{"router": [...], "client": [...]}``); None when it leaves
    them at Zenoh's default."""
    found = config.get_json(f"{kind}/endpoints")
    if found == zenoh.Config().get_json(f"{kind}/endpoints"):
        return None
    listed = json.loads(found)
    if isinstance(listed, dict):
        listed = listed.get(mode, [])
    return [str(endpoint) for endpoint in listed]


@contextlib.asynccontextmanager
async def open_session(settings: ZenohSettings) -> AsyncIterator[Any]:
    """A ``zenoh.Session`` for *settings*, closed on the way out (also on error and
    cancellation). Opening and closing run off the event loop (Zenoh blocks while it
    binds and connects). Raises ConfigurationError for settings Zenoh refuses (a bad
    endpoint, a listen address in use), with Zenoh's error as ``__cause__``."""
    config = session_config(settings)
    try:
        session = await asyncio.to_thread(zenoh.open, config)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot open a Zenoh session (mode {settings.mode}, connect "
            f"{list(settings.connect)}, listen {list(settings.listen)}): {exc}"
        ) from exc
    try:
        yield session
    finally:
        await asyncio.shield(asyncio.to_thread(session.close))
