"""The channel's delivery to encoded inboxes (``Subscriber`` ``encoded=True``): the
body of each message instead of the message (see ``Channel.deliver_body``).

A channel counts its encoded inboxes; while it has any, it keeps the body of the message
being delivered (``Channel._body``) for :func:`put_encoded`, and when every inbox it
feeds is an encoded one it decodes nothing: a read's small frames go to them in one run
(:func:`deliver_run_encoded`). A publisher without a body (ezring, or local to a channel
that had no encoded inbox when its link opened) has its message encoded once here for
all of them. Kept apart from :mod:`._channel`, which calls these at
those three points; tests/test_channel.py pins them to the general paths.
"""

from __future__ import annotations

from time import time_ns
from typing import TYPE_CHECKING, Any

from ._codec import EncodedMessage
from ._exceptions import UndecodableMessageError

if TYPE_CHECKING:
    from ._channel import Channel

__all__ = ["deliver_run_encoded", "put_encoded"]


def put_encoded(channel: Channel, seq: int, message: Any) -> None:
    """(``Channel.deliver``, with encoded inboxes attached) Put *message* in each inbox that
    decodes and its body in each encoded one: the body that arrived
    (``Channel.deliver_body``) or that a local link handed over, or - from a publisher
    without one (ezring, a local link that does not encode) - the body
    :meth:`Codec.encode` makes of it, encoded once here for all of them. A local link
    hands a body of several parts (a large array) as its ``EncodedMessage``: an inbox
    that :attr:`~Inbox.takes_parts` gets it as it is, the others one ``bytes`` joined
    once for all of them."""
    body, channel._body = channel._body, None
    if body is None:
        codec = channel.codec
        try:
            # (the codec's one-bytes fast path for a small message of a cached shape:
            # exactly what encode() joins, a sixth of its time for a small tuple)
            body = codec._encode_small(message)
            if body is None:
                body = codec.encode(message).to_bytes()
        except Exception as exc:  # (the publisher validated it: not seen)
            _not_encodable(channel, seq, message, exc)
            return
    whole = body if type(body) is EncodedMessage else None
    joined: bytes | None = None  # (a body in parts joined once, for every inbox needing it)
    for attachment in channel._attachments:
        inbox = attachment.inbox
        if not attachment.encoded:
            inbox.put(attachment, seq, message)
        elif whole is not None and not inbox.takes_parts:
            if joined is None:
                joined = whole.to_bytes()
            inbox.put(attachment, seq, joined)
        else:
            inbox.put(attachment, seq, body)


def _not_encodable(channel: Channel, seq: int, message: Any, exc: Exception) -> None:
    # The encoded inboxes are told in its place (and release it: they never take it).
    for attachment in channel._attachments:
        if not attachment.encoded:
            attachment.inbox.put(attachment, seq, message)
            continue
        reason = f"cannot encode it for an encoded subscriber: {exc}"
        error = UndecodableMessageError(channel.topic, channel.publisher_id, reason)
        attachment.inbox.put_undecodable(error, attachment.lossless)
        if attachment.lossless:
            channel.release(attachment, seq)


def deliver_run_encoded(
    channel: Channel, frames: list[tuple[int, int, bytes, int, int]], index: int
) -> int:
    """``Channel.deliver_run`` for a channel whose inboxes all take encoded bodies (see
    ``Channel.deliver_body``): each frame's body as it came (nothing to decode, time or
    learn), up to the first frame with new upstream drops. ``tests/test_channel.py``
    pins it to ``Channel.deliver_body``."""
    attachments = channel._attachments
    for attachment in attachments:
        inbox = attachment.inbox
        if inbox._callback is not None or inbox.maxlen is not None or inbox._closed:
            return -1
    upstream = channel.stats.upstream_drops
    lossless = channel._lossless
    pending_append = channel._pending.append
    appends = [(attachment, attachment.inbox._items.append) for attachment in attachments]
    buckets = channel.latency.buckets
    now_ns = time_ns()
    latency_total = 0
    nbytes = 0
    end = len(frames)
    i = index
    try:
        while i < end:
            _, seq, body, drops, sent_ns = frames[i]
            if drops > upstream:
                break
            size = len(body)
            if lossless:
                pending_append([seq, lossless, size])
            for attachment, append in appends:
                append((attachment, seq, body))
            nbytes += size
            if sent_ns:
                latency_ns = now_ns - sent_ns
                if latency_ns > 0:
                    buckets[latency_ns.bit_length()] += 1
                    latency_total += latency_ns
                else:  # the clocks of two hosts disagree
                    buckets[0] += 1
            i += 1
    finally:
        channel.end_run(frames, index, i, nbytes, latency_total, decoded=False)
    return i
