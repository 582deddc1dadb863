"""The local transport: publisher and subscriber in the same process and event loop.

The channel receives the published object itself (numpy arrays as a read-only view),
with no encoding at all - except while the channel has an encoded subscriber (a relay
such as the Zenoh bridge's export): the link then asks the outlet for each message's
body (:attr:`Link.needs_encoding`: encoded once, on the publish path, the small-message
fast path included), and the channel hands the body to its encoded subscribers and the
object to the others. Otherwise the channel would encode for its encoded subscribers,
after the outlet walked the message to validate it. Flow control
works exactly as for the other transports. A
publisher that closes ends its channels (``Channel.end``) right after its last message,
as ``END`` does on the other transports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import monotonic_ns, time_ns
from typing import Any, ClassVar

import numpy as np

from .._core._channel import Channel
from .._core._channel_local import deliver_local
from .._core._codec import EncodedMessage
from .._core._config import PUBLISH_YIELD_BYTES, SHM_COPY_NT_BYTES
from .._core._exceptions import BrokenResourceError
from .._core._outlet import _YIELD_AFTER, Link, Outlet
from .._core._outlet_objects import read_only, yield_share
from .._core._protocol import PublisherInfo
from .._core._telemetry import PUBLISH_HOOKS
from .._core._tracing import TRACING, WireTrace
from ._base import Inbound, Transport

__all__ = ["LocalTransport", "publish_local_py", "relay_local_py"]

# Outlets of this process by publisher id, with the loop they run on. Process-global so
# that two GraphContexts on one loop also talk locally.
_OUTLETS: dict[str, tuple[Outlet, asyncio.AbstractEventLoop]] = {}


class _LocalLink(Link):
    """A local link. While its channel has an encoded subscriber (a relay such as the
    Zenoh bridge's export), it asks the outlet for each message's body
    (:attr:`needs_encoding`, encoded once on the publish path) and the channel gets the
    body with the object (``Channel._body``: its encoded subscribers take the body, the
    others the object, a writable array as a read-only view as the outlet hands it to a
    link that does not encode). It follows the channel (``Channel.on_encoded_change``):
    an encoded subscriber that attaches later turns that on, the last one leaving turns
    it off, so that a publisher encodes only while something takes bodies."""

    transport = "local"

    # Slots: the one-call local publish (publish_local_py; its compiled twin, a branch of
    # _speedups.PublishPath, reads them at fixed offsets).
    __slots__ = ("channel", "needs_encoding", "on_lost")

    def __init__(self, channel: Channel, on_lost: Callable[[], None]) -> None:
        super().__init__(lossless=channel.lossless, max_message_size=2**63)
        self.channel = channel
        self.on_lost: Callable[[], None] | None = on_lost
        self.needs_encoding = channel._encoded > 0
        channel.on_release = self.released
        channel.on_mode_change = self.set_lossless
        channel.on_encoded_change = self.set_encoding

    def set_encoding(self, encoding: bool) -> None:
        """Ask the outlet for bodies (*encoding*) or only for objects from now on."""
        self.needs_encoding = encoding
        if self.outlet is not None:
            self.outlet.link_changed(self)

    def send(self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage | None) -> None:
        self.sent_count += 1
        channel = self.channel
        body: bytes | EncodedMessage | None = None
        if encoded is not None and channel._encoded:
            # (one part: itself, no copy; several - a large array - as they are:
            # put_encoded joins them only for an encoded inbox that needs one buffer)
            body = encoded if len(encoded.parts) > 1 else encoded.to_bytes()
        if type(message) is np.ndarray and message.flags.writeable:
            # (what the outlet hands a link that encodes, or one that did when the
            # message was parked: the object as published)
            message = read_only(message)
        # The common case in one compiled call (the body, if any, to encoded inboxes);
        # what it declines, Channel.deliver decides, given the body as Channel._body.
        if deliver_local is None or not deliver_local(
            channel, seq, message, self.drops, time_ns, body
        ):
            channel._body = body
            channel.deliver(seq, message, 0, self.drops, time_ns)

    def send_small(self, seq: int, time_ns: int, message: Any, body: bytes) -> None:
        # (only while needs_encoding: the outlet's one-bytes path)
        self.sent_count += 1
        if type(message) is np.ndarray and message.flags.writeable:
            message = read_only(message)
        channel = self.channel
        given = body if channel._encoded else None  # (as send: see there)
        if deliver_local is None or not deliver_local(
            channel, seq, message, self.drops, time_ns, given
        ):
            channel._body = given
            channel.deliver(seq, message, 0, self.drops, time_ns)

    def send_traced(
        self,
        seq: int,
        time_ns: int,
        message: Any,
        encoded: EncodedMessage | None,
        trace: WireTrace,
    ) -> None:
        self.sent_count += 1
        if type(message) is np.ndarray and message.flags.writeable:
            message = read_only(message)
        trace.t_sent = monotonic_ns()
        # (the object only: an encoded subscriber's body is encoded by the channel)
        self.channel.deliver_traced(trace, seq, message, 0, self.drops, time_ns)

    def cut(self) -> None:
        # The stall policy: the channel loses its publisher (no clean end).
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            self.channel.lost("the publisher cut it (stall_timeout)")
            on_lost()

    def close(self) -> None:
        # Called by Outlet.close after the last message: the publisher's end (unless the
        # channel side closed first, which clears on_lost).
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            self.channel.end()
            on_lost()


def publish_local_py(outlet: Outlet, message: Any) -> bool:
    """Publish *message* in one call on the common path of a local edge and return True;
    else change nothing and return False (then ``Outlet.publish_nowait``, and
    ``Outlet.publish`` if that declines, which decide what the unusual case needs).

    The common path: the outlet's one link is a local link, and *message* passes the
    compiled check of the shape the outlet's codec validated last (``Codec.validate``'s
    hint: never a top-level array, whose read-only view and O(1) check are the general
    path's) - or, while the link takes bodies too (an encoded subscriber on its channel:
    ``needs_encoding``), is encoded by the codec's cached template into a small body
    (``Codec._encode_small``) within the outlet's ``_small_limit``; tracing is off, no
    publish hook is attached, the outlet is open, hands off no CPU and would not yield
    now (``publish_nowait``'s rule), and the link is not stalled and has room in its
    in-flight window (a lossless link would wait, a leaky one park). Then, exactly as
    ``publish_nowait`` -> ``send_now`` -> ``_LocalLink.send`` (or, with a body,
    ``_send_small`` -> ``_LocalLink.send_small``) would: the outlet's yield count, the
    next seq, the link's sent count, the delivery (``deliver_local``, else
    ``Channel.deliver``), the outlet's counts (and the body's bytes and encode).

    Its compiled twin is a branch of ``_speedups.PublishPath.publish`` (the outlet's one
    link a ``_LocalLink``; ``_stream_publish.compiled_publish_small`` builds it);
    tests/test_local.py pins the two together and to ``publish_nowait``.
    """
    links = outlet._links
    if len(links) != 1 or type(links[0]) is not _LocalLink:
        return False
    link = links[0]
    # (the check or the encode first: either may run Python code - a field's getter - so
    # the state is read after it)
    codec = outlet.codec
    body: bytes | None = None
    if link.needs_encoding:
        template = codec._last_template
        if template is None or template.kind is not type(message):
            return False
        body = codec._encode_small(message)
        if body is None or len(body) > outlet._small_limit:
            return False
    else:
        hint = codec._last_checked
        if hint is None or hint[0] is not type(message) or not hint[1](message):
            return False
    if TRACING.active or PUBLISH_HOOKS or outlet._closed or outlet._handoff:
        return False
    if outlet._unyielded >= _YIELD_AFTER or outlet._unyielded_bytes >= PUBLISH_YIELD_BYTES:
        return False
    if outlet._links != [link] or link.needs_encoding is not (body is not None):
        return False
    if not link.has_room(outlet):  # (not stalled, room in the window)
        return False
    outlet._unyielded += 1
    outlet._seq = seq = outlet._seq + 1
    stats = outlet.stats
    if body is None:
        link.send(seq, time_ns(), message, None)
    else:
        link.send_small(seq, time_ns(), message, body)
        outlet._unyielded_bytes += len(body)
        stats.encodes += 1
        stats.bytes += len(body)
    stats.messages += 1
    stats.sends += 1
    return True


def relay_local_py(outlet: Outlet, message: Any, nbytes: int) -> bool:
    """Send a relayed *message* (its body of *nbytes*, not encoded here) in one call as
    ``_outlet_objects.send_objects(outlet, outlet._links, message, nbytes)`` does -
    ``Outlet.publish_encoded_many``'s send to links that take no body, whose loop counts
    and checks the yield - and return True; else change nothing and return False (then
    ``send_objects`` decides). The common path: the outlet's one link is a local link
    that takes no body, has room in its window and is not stalled; the outlet is open,
    hands off no CPU, nothing is traced and no publish hook is attached; *message* has
    no buffer (a writable array's read-only view is the general path's) and *nbytes*
    counts its own size toward the yield (:func:`yield_share`). Then the next seq, the
    link's send (the delivery), the outlet's counts and the body's bytes.

    Its compiled twin is ``_speedups.PublishPath.relay`` (``_stream_publish.
    compiled_publish_path``, installed as ``_outlet_objects.relay_local``);
    tests/test_local.py pins the two together and to ``send_objects``."""
    links = outlet._links
    if len(links) != 1 or type(links[0]) is not _LocalLink:
        return False
    link = links[0]
    if not 0 <= nbytes < SHM_COPY_NT_BYTES:
        return False  # (the compiled twin's bound: below it, yield_share(nbytes) == nbytes)
    try:
        memoryview(message)
    except TypeError:
        pass
    else:
        return False
    if TRACING.active or PUBLISH_HOOKS or outlet._closed or outlet._handoff:
        return False
    if link.needs_encoding or not link.has_room(outlet):
        return False
    outlet._seq = seq = outlet._seq + 1
    link.send(seq, time_ns(), message, None)
    stats = outlet.stats
    stats.messages += 1
    stats.bytes += nbytes
    outlet._unyielded_bytes += yield_share(nbytes)
    stats.sends += 1
    return True


class _LocalInbound(Inbound):
    transport = "local"

    def __init__(self, outlet: Outlet, link: _LocalLink) -> None:
        self._outlet = outlet
        self._link = link

    def close(self) -> None:
        self._link.on_lost = None
        self._outlet.remove_link(self._link)
        self._link.channel.on_release = None
        self._link.channel.on_mode_change = None
        self._link.channel.on_encoded_change = None


class LocalTransport(Transport):
    """Publisher and channel on the same event loop of this process: the object itself."""

    name: ClassVar[str] = "local"
    unreachable: ClassVar[str] = "the publisher is in another process"

    def __init__(self) -> None:
        self._mine: set[str] = set()

    def add_outlet(self, outlet: Outlet, options: Any = None) -> None:
        _OUTLETS[outlet.publisher_id] = (outlet, asyncio.get_running_loop())
        self._mine.add(outlet.publisher_id)

    def remove_outlet(self, outlet: Outlet) -> None:
        self._mine.discard(outlet.publisher_id)
        entry = _OUTLETS.get(outlet.publisher_id)
        if entry is not None and entry[0] is outlet:
            del _OUTLETS[outlet.publisher_id]

    def reaches(self, publisher: PublisherInfo, host_id: str) -> bool:
        """True when the publisher lives in this process, on the running loop."""
        entry = _OUTLETS.get(publisher.publisher_id)
        if entry is None:
            return False
        try:
            return entry[1] is asyncio.get_running_loop()
        except RuntimeError:
            return False

    async def open_channel(
        self, channel: Channel, publisher: PublisherInfo, *, on_lost: Callable[[], None]
    ) -> Inbound:
        entry = _OUTLETS.get(publisher.publisher_id)
        if entry is None or entry[0].closed:
            raise BrokenResourceError(
                f"publisher {publisher.publisher_id} on topic {publisher.topic!r} is no longer "
                "in this process"
            )
        outlet = entry[0]
        link = _LocalLink(channel, on_lost)
        outlet.add_link(link)
        return _LocalInbound(outlet, link)

    async def aclose(self) -> None:
        for publisher_id in list(self._mine):
            entry = _OUTLETS.pop(publisher_id, None)
            if entry is not None:
                entry[0].close()
        self._mine.clear()
