"""One message from a publisher in this process (a local edge) delivered in one call:
the common case of ``Channel.deliver`` and ``Inbox.put`` for a message of no bytes (and
of ``put_encoded``, for a small body the link hands over).

:func:`deliver_local_py` is the reference; ``_speedups.DeliverPath`` is its compiled
twin (:func:`compiled_deliver_local`), which the local link calls before the general
``Channel.deliver`` where the extension is built (:data:`deliver_local`). Both leave
everything as ``Channel.deliver`` would, or decline and change nothing;
tests/test_speedups.py pins them to each other and to ``Channel.deliver``.
"""

from __future__ import annotations

from collections import deque
from time import time_ns
from types import ModuleType
from typing import Any, Final

from ._channel import Channel, ChannelStats
from ._compiled import SPEEDUPS
from ._inbox import Attachment, Inbox, SubscriberStats
from ._telemetry import DELIVER_HOOKS, Histogram

__all__ = ["compiled_deliver_local", "deliver_local", "deliver_local_py"]


def deliver_local_py(  # noqa: PLR0917 - Channel.deliver's arguments, and the body
    channel: Channel,
    seq: int,
    message: Any,
    upstream_drops: int,
    sent_ns: int,
    body: bytes | None,
) -> bool:
    """Deliver *message* (seq *seq*, published at *sent_ns*, ``time.time_ns()``; 0:
    unknown) exactly as ``channel.deliver(seq, message, 0, upstream_drops, sent_ns)``
    would with ``channel._body`` set to *body* (the local link's hand-over) and return
    True, when that is the common case: *channel* is a ``Channel`` (not a subclass)
    whose encoded inboxes, if it has any, take *body*, a ``bytes`` object (as
    ``put_encoded`` hands them a small body; a body in parts, or none to give, is the
    general path's, as is a ``_body`` set already), no deliver hook is set,
    *upstream_drops* adds none, and every attached inbox is an ``Inbox`` (not a
    subclass). A queueing inbox's append is done here; anything
    else - a callback, a task waiting, a full or closed inbox - by ``Inbox.put``, as
    ``Channel.deliver`` does it. Else change nothing and return False: the caller calls
    ``Channel.deliver``, which decides. Raises what a callback's ``Inbox.put`` raises
    (nothing: it logs and counts), nothing of its own."""
    encoded = channel._encoded
    if (
        type(channel) is not Channel
        or (encoded and (type(body) is not bytes or channel._body is not None))
        or DELIVER_HOOKS
    ):
        return False
    stats = channel.stats
    if upstream_drops > stats.upstream_drops:
        return False
    attachments = channel._attachments
    for attachment in attachments:
        if type(attachment.inbox) is not Inbox:
            return False
    # (what Channel.deliver does, in its order; nbytes is 0)
    now_ns = time_ns() if sent_ns else 0
    channel._last_seq = seq
    if channel._lossless:
        channel._pending.append([seq, channel._lossless, 0])
    else:
        channel._released_count += 1
    for attachment in attachments:
        inbox = attachment.inbox
        given = body if encoded and attachment.encoded else message  # (as put_encoded)
        maxlen = inbox.maxlen
        if (
            inbox._callback is not None
            or inbox._closed
            or inbox._waiter is not None
            or (maxlen is not None and len(inbox._items) >= maxlen)
        ):
            inbox.put(attachment, seq, given)
        else:  # (Inbox.put's queueing case)
            inbox._items.append((attachment, seq, given))
            inbox.stats.received += 1
    stats = channel.stats
    stats.messages += 1
    stats.deliveries += len(attachments)
    if sent_ns:
        latency_ns = now_ns - sent_ns
        if latency_ns > 0:
            latency = channel.latency
            latency.buckets[latency_ns.bit_length()] += 1
            latency.total += latency_ns
        else:  # the clocks of two hosts disagree (never for a local edge: as deliver)
            channel.latency.buckets[0] += 1
    if not channel._lossless:
        channel._notify_release()
    return True


def compiled_deliver_local(speedups: ModuleType | None = SPEEDUPS) -> Any:
    """:func:`deliver_local_py`'s compiled twin (``_speedups.DeliverPath``) of
    *speedups*, the active extension by default; None where no extension is active."""
    if speedups is None:
        return None
    path = speedups.DeliverPath(
        Channel, ChannelStats, Attachment, Inbox, SubscriberStats, Histogram, deque, DELIVER_HOOKS
    )
    return path.deliver


#: The local link's delivery of a message in one call, compiled (None without the
#: extension: the local link calls ``Channel.deliver``, as the pure-Python path did).
deliver_local: Final = compiled_deliver_local()
