"""ezflow across hosts on Eclipse Zenoh: ``pip install 'ezflow-pubsub[zenoh]'`` (docs/fleets.md).

::

    from ezflow.zenoh import Export, Import, ZenohBridge, ZenohSettings

    async with ezflow.GraphContext() as ctx, ZenohBridge(
        ctx,
        ZenohSettings(connect=("tcp/10.0.0.1:7447",)),
        exports=[Export("/camera/raw", lossless=True)],     # as ezflow/<host>/%/camera/raw
        imports=[Import("ezflow/robot1/**", topic="/robot1")],
    ):
        ...

Or as a unit of a graph (``ZenohBridgeUnit(ZenohBridgeSettings(connect=(...),
exports=(Export("SRC/OUTPUT"),)))`` in ``ezflow.run``), or as a process next to a running
graph: ``ezflow zenoh bridge --connect tcp/... --export
/camera/raw --import 'ezflow/robot1/**=/robot1'``; a router: ``ezflow zenoh router``.
Same-host edges never go through Zenoh: it is for the hops between hosts.
"""

from __future__ import annotations

try:
    import zenoh as _zenoh  # noqa: F401 - only to fail early, with the fix
except ImportError as exc:  # pragma: no cover - the CI installs the extra
    raise ImportError(
        "ezflow.zenoh needs Eclipse Zenoh: pip install 'ezflow-pubsub[zenoh]'"
    ) from exc

from ._zenoh._bridge import (
    ENCODING,
    ENCODINGS,
    Export,
    Import,
    MappingStats,
    ZenohBridge,
    ZenohBridgeSettings,
    ZenohBridgeUnit,
)
from ._zenoh._fleet import announce, query_fleet, silent_hosts
from ._zenoh._keys import key_to_topic, topic_to_key
from ._zenoh._session import ZenohSettings, open_session

__all__ = [
    "ENCODING",
    "ENCODINGS",
    "Export",
    "Import",
    "MappingStats",
    "ZenohBridge",
    "ZenohBridgeSettings",
    "ZenohBridgeUnit",
    "ZenohSettings",
    "announce",
    "key_to_topic",
    "open_session",
    "query_fleet",
    "silent_hosts",
    "topic_to_key",
]
