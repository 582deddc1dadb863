"""``Outlet.publish_encoded_many``'s send to links that take objects, not bodies (local
ones): what ``Outlet.send_now`` does for a relayed message (its body given, not encoded
here) when no link takes its body, nothing is traced, no publish hook is set and no link
hands off the CPU - without send_now's per-link encoding checks and the body wrapper
those links never read. Kept apart from :mod:`._outlet`, which calls it per message of
such a run (and uses its :func:`yield_share`, the one rule of what a message counts
toward a yield); tests/test_outlet.py pins it to one ``publish`` per message.
"""

from __future__ import annotations

from collections.abc import Callable
from time import time_ns
from typing import TYPE_CHECKING, Any

import numpy as np

from ._config import PUBLISH_YIELD_BYTES, PUBLISH_YIELD_LARGE_BYTES, SHM_COPY_NT_BYTES
from ._exceptions import ClosedResourceError

if TYPE_CHECKING:
    from ._outlet import Link, Outlet

__all__ = ["relay_local", "relay_stream", "send_objects", "yield_share"]

# What a message of SHM_COPY_NT_BYTES up to PUBLISH_YIELD_BYTES counts toward
# PUBLISH_YIELD_BYTES: its size divided by this.
_LARGE_SHARE = PUBLISH_YIELD_LARGE_BYTES // PUBLISH_YIELD_BYTES


def yield_share(nbytes: int) -> int:
    """What a sent message of *nbytes* counts toward the outlet's next yield
    (``Outlet._unyielded_bytes``, ``PUBLISH_YIELD_BYTES``): its size, or a quarter of it
    for a message whose copy is streamed, short of ``PUBLISH_YIELD_BYTES``
    (``PUBLISH_YIELD_LARGE_BYTES``: no warm block to win back)."""
    return nbytes // _LARGE_SHARE if SHM_COPY_NT_BYTES <= nbytes < PUBLISH_YIELD_BYTES else nbytes


def read_only(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A read-only view of *array*: what the receivers of a local edge get for a
    writable array, as they would from shm or tcp, so a unit that mutates its input
    fails the same way on every transport. (``setflags``: a third cheaper than setting
    ``flags.writeable``, which makes a flags object.)"""
    view = array.view()
    view.setflags(write=False)
    return view


#: The compiled send of a relayed message to an outlet's one local link
#: (``_speedups.PublishPath.relay``, twin of ``_transports._local.relay_local_py``),
#: installed by the transports layer where the extension is built: True when it sent
#: *message* as :func:`send_objects` would, False when it did nothing (then
#: ``send_objects``).
relay_local: Callable[[Outlet, Any, int], bool] | None = None
#: Likewise the compiled send of a relayed small body to an outlet's stream links
#: (``_speedups.PublishPath.relay_stream``, twin of
#: ``_transports._stream_relay.relay_stream_py``): True when it sent it as
#: ``Outlet._send_small(links, message, body, relayed=True)`` would, False when it did
#: nothing (then ``_send_small``).
relay_stream: Callable[[Outlet, Any, bytes], bool] | None = None


def send_objects(outlet: Outlet, links: list[Link], message: Any, nbytes: int) -> None:
    """Send *message* (its body of *nbytes*) to *links*, none of which takes bodies, as
    ``outlet.send_now(message, None, body)`` would: a writable array as a read-only
    view, each link that has room (or is lossless) sent to, the others parked, the same
    counters. The caller checked for room, tracing, hooks and handoff."""
    if outlet._closed:
        raise ClosedResourceError("publisher is closed")
    if type(message) is np.ndarray and message.flags.writeable:
        message = read_only(message)
    outlet._seq = seq = outlet._seq + 1
    now = time_ns()
    sends = drops = 0
    for link in links:
        if link.lossless or link.has_room(outlet):
            link.send(seq, now, message, None)
            sends += 1
        else:
            before = link.drops
            link.park(seq, now, message, None)
            drops += link.drops - before
    stats = outlet.stats
    stats.messages += 1
    stats.bytes += nbytes
    outlet._unyielded_bytes += yield_share(nbytes)
    stats.sends += sends
    stats.drops += drops
