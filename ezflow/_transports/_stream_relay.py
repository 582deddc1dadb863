"""A relayed small body to stream links in one call: ``relay_stream_py``, the reference
for its compiled twin, ``_speedups.PublishPath.relay_stream`` (installed as
``_outlet_objects.relay_stream`` by :mod:`._stream_publish`), which
``Outlet.publish_encoded_many`` offers each such body first - the Zenoh import
publishing what it received to subscribers in other processes.

Kept apart from :mod:`._stream_publish` (the stream link and the one-call publish), whose
size it would push past the limit of a module; tests/test_speedups.py pins the two
twins together and to ``Outlet._send_small``.
"""

from __future__ import annotations

from time import time_ns
from typing import Any

from .._core._config import PACED_GAP_NS, SHM_COPY_NT_BYTES
from .._core._outlet import Outlet
from .._core._outlet_objects import yield_share
from .._core._telemetry import PUBLISH_HOOKS
from .._core._tracing import TRACING
from ._stream_publish import StreamLink

__all__ = ["relay_stream_py"]


def relay_stream_py(outlet: Outlet, message: Any, body: bytes) -> bool:
    """Send a relayed *message* whose body is *body* (bytes, not encoded here) in one call
    as ``outlet._send_small(outlet._links, message, body, relayed=True)`` does - one
    ``DATA`` frame queued on each link, as ``StreamLink.send_small`` queues a burst's -
    and return True; else change nothing and return False (then ``_send_small``
    decides). The common path: every link is a stream link collecting this loop turn's
    frames (not paced), not stalled, with room in its window and an ``out_of_line_above``
    the body does not pass; the body is ``bytes`` within the outlet's small limit and
    under ``SHM_COPY_NT_BYTES`` (its yield share is its size); the outlet is open and,
    if it hands off the CPU, in a burst (its last send within ``PACED_GAP_NS``: the
    handoff only notes the send time), nothing is traced and no publish hook is
    attached. The caller's
    loop counts the yield (``Outlet.publish_encoded_many``); this counts the seq, the
    links' frames and counters, the outlet's yield bytes and statistics (no encode)."""
    if type(body) is not bytes or len(body) >= SHM_COPY_NT_BYTES:
        return False
    if outlet._closed or TRACING.active or PUBLISH_HOOKS:
        return False
    now = time_ns()
    if outlet._handoff and now - outlet._sent_ns >= PACED_GAP_NS:
        return False  # (paced: _send_small's Outlet._hand_off decides whether to yield)
    size = len(body)
    links = outlet._links
    if not links or size > outlet._small_limit:
        return False
    for link in links:
        if not isinstance(link, StreamLink) or link.stalled or not link._flush_scheduled:
            return False
        if not link.has_room(outlet) or size > link.out_of_line_above:
            return False
    outlet._seq = seq = outlet._seq + 1
    sends = 0
    for link in links:  # (a flush may remove links: as _send_small's loop)
        link.send_small(seq, now, message, body)
        sends += 1
    if outlet._handoff:
        outlet._hand_off(now)  # (in a burst: the send time noted)
    outlet._unyielded_bytes += yield_share(size)
    stats = outlet.stats
    stats.messages += 1
    stats.bytes += size
    stats.sends += sends
    return True
