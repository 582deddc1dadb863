"""A graph live in Foxglove, and recordings as MCAP: ``pip install
'ezflow-pubsub[foxglove]'`` (docs/foxglove.md).

::

    from ezflow.foxglove import FoxgloveServer, McapReader, McapWriter

    async with ezflow.GraphContext() as ctx, FoxgloveServer(ctx) as server:
        print("open", server.app_url())      # ws://127.0.0.1:8765 in the Foxglove app
        ...

    with McapWriter("run.mcap") as mcap:      # zstd chunks, indexed
        mcap.write("/camera", frame)          # foxglove.RawImage
        mcap.write("/spectrum", spectrum)     # JSON, with its dataclass's JSON schema
    for record in McapReader("run.mcap"):     # ezflow's files and other tools' (JSON, raw)
        print(record.topic, record.log_time, record.message)

Or from a shell: ``ezflow foxglove`` (next to a running graph), ``ezflow record --format
mcap``, ``ezflow replay FILE.mcap``; in a graph, ``Recorder(RecorderSettings(path,
format="mcap"))`` and ``Replayer``. :func:`mapping_for` says which schema a message
gets, the same for the live server and for MCAP.
"""

from __future__ import annotations

try:
    import foxglove as _foxglove  # noqa: F401 - only to fail early, with the fix
    import mcap as _mcap  # noqa: F401
except ImportError as exc:  # pragma: no cover - the CI installs the extra
    raise ImportError(
        "ezflow.foxglove needs the Foxglove SDK and mcap: pip install 'ezflow-pubsub[foxglove]'"
    ) from exc

from ._foxglove._mapping import (
    Mapping,
    NotMappable,
    decode_message,
    encode_message,
    image_encoding,
    mapping_for,
)
from ._foxglove._mcap import MCAP_MAGIC, McapReader, McapWriter, RecordedMessage, is_mcap, summary
from ._foxglove._server import GRAPH_TOPIC, FoxgloveServer, TopicStats

__all__ = [
    "GRAPH_TOPIC",
    "MCAP_MAGIC",
    "FoxgloveServer",
    "Mapping",
    "McapReader",
    "McapWriter",
    "NotMappable",
    "RecordedMessage",
    "TopicStats",
    "decode_message",
    "encode_message",
    "image_encoding",
    "is_mcap",
    "mapping_for",
    "summary",
]
