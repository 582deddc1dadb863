"""Length-prefixed frames, shared by the graph protocol and the tcp and shm transports.

On the wire every frame is ``u32 length`` (little endian) followed by ``length`` bytes of
body. :class:`FrameReader` is a sans-I/O parser built for :class:`asyncio.BufferedProtocol`:
the event loop reads straight into the buffer it hands out, so

* small frames are parsed out of one reusable scratch buffer (and copied once into their
  own ``bytes`` so that zero-copy views built on them stay valid), and
* a large frame gets its own buffer, allocated once its header has been read and checked
  against the limit, and the loop reads the rest of it *directly* into that buffer — no
  intermediate copies however large the message.

The length is checked against ``max_frame_size`` before anything is allocated, so a
header claiming 4 GB costs nothing but the connection it arrived on.

Large-frame buffers are recycled: the reader keeps the last few (``_POOL_BUFFERS``, at
most ``_POOL_BYTES`` in all) and reuses one only when nothing refers to it any more — no
decoded array, no view, no message anyone still holds — so a message a subscriber keeps
never changes under it. Reuse spares the page faults and zero-filling of fresh memory,
which otherwise cost a third of the receiving CPU at 1 MiB per message.

A stream of large frames is read a frame a read: after a large frame, the reader expects
another of the same size and, when it holds nothing, hands the event loop a buffer of
its own for that frame (length prefix included) instead of the scratch buffer. A frame
that turns out to be exactly there (whole, or its start) is taken in place: one read
and one loop iteration per 1 MiB message instead of a 64 KiB read into scratch, a copy
out of it and a second read for the rest. Whatever else arrives there (small frames,
another size) is parsed from that buffer as from scratch; a frame is never handed on
from a buffer the reader still reads into.

Over plain TCP, :class:`FramedProtocol` also has the kernel hold reads back while the
rest of a large frame is on its way (``SO_RCVLOWAT`` set to what the frame's header
announced and is still missing): the socket is reported readable once the rest is there,
so the rest comes in one read and one turn of the loop instead of one for each piece the
sender's segments leave, and the sender's kernel wakes this process once, not for every
segment. At 1 MiB a message this cut the CPU of both processes by a fifth (perf/HISTORY.md).
The mark only ever asks for bytes a header announced, at most 1 MiB at a time (a larger
rest, a 4K frame, is read in pieces of that size, their copy out of the kernel
overlapping the transfer); a connection closed or reset is readable whatever the mark;
the kernel caps it too (half of ``tcp_rmem``'s maximum) and grows the socket's receive
buffer to fit. Bytes held back this way still count as life for
heartbeats (:meth:`FramedProtocol.read_held_back`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import sys
from collections.abc import Iterator
from typing import Final, cast

import numpy as np

from ._config import RECV_POOL_BUFFERS as _POOL_BUFFERS
from ._config import RECV_POOL_BYTES as _POOL_BYTES
from ._exceptions import ProtocolError

__all__ = [
    "ACK",
    "ACK_BODY",
    "DATA",
    "DATA_HEADER",
    "DATA_PREFIX",
    "END",
    "FREE",
    "FREE_ENTRY",
    "FREE_HEADER",
    "HEARTBEAT",
    "HEARTBEAT_BODY",
    "HELLO",
    "LENGTH",
    "MODE",
    "RETIRE",
    "SHM_DATA",
    "SHM_HEADER",
    "SHM_PREFIX",
    "TRACE",
    "TRACE_BODY",
    "TRACE_PREFIX",
    "WELCOME",
    "FrameReader",
    "FramedProtocol",
]

LENGTH: Final = struct.Struct("<I")

# Data-plane frame kinds: the first byte of every data-connection frame body.
DATA: Final = 1  # publisher -> channel: DATA_HEADER + codec body
ACK: Final = 2  # channel -> publisher: ACK_BODY, cumulative release figures
HELLO: Final = 3  # channel -> publisher: kind byte + msgpack map
WELCOME: Final = 4  # publisher -> channel: kind byte + msgpack map
MODE: Final = 5  # channel -> publisher: kind byte + msgpack map (lossless flag changed)
END: Final = 6  # publisher -> channel: the publisher closed on purpose (kind byte only)
SHM_DATA: Final = 7  # publisher -> channel: SHM_HEADER + segment name (ASCII)
FREE: Final = 8  # channel -> publisher: FREE_HEADER + count x FREE_ENTRY
RETIRE: Final = 9  # publisher -> channel: kind byte + name of a segment it unlinked
HEARTBEAT: Final = 10  # either way, after the handshake: HEARTBEAT_BODY (tcp only)
TRACE: Final = 11  # publisher -> channel: TRACE_BODY; the next DATA/SHM_DATA is traced

#: kind u8, flags u8, 6 pad bytes, seq u64, publish time (time.time_ns) i64, and the
#: publisher's cumulative count of messages it dropped for this (leaky) channel u64.
#: 32 bytes, so a codec body right behind it keeps its 16-byte buffer alignment.
DATA_HEADER: Final = struct.Struct("<BB6xQqQ")
#: kind u8, 7 pad bytes, then cumulative released messages u64 and released bytes u64.
ACK_BODY: Final = struct.Struct("<B7xQQ")
#: The length prefix and DATA_HEADER in one go (what a sender writes before a body).
DATA_PREFIX: Final = struct.Struct("<IBB6xQqQ")
#: A message in shared memory: kind u8, flags u8, 6 pad bytes, seq u64, publish time
#: i64, upstream drops u64 (as in DATA_HEADER), then where the body lies: block id u64,
#: block generation u64, offset u64 and length u64 within the segment named by the rest
#: of the frame.
SHM_HEADER: Final = struct.Struct("<BB6xQqQQQQQ")
#: The length prefix and SHM_HEADER in one go.
SHM_PREFIX: Final = struct.Struct("<IBB6xQqQQQQQ")
#: kind u8, 3 pad bytes, the sender's heartbeat deadline in milliseconds u32 (0: its
#: heartbeats are off). See :mod:`ezflow._core._liveness`.
HEARTBEAT_BODY: Final = struct.Struct("<B3xI")
#: kind u8, 7 pad bytes, trace id u64, parent span id u64 (0: the trace starts here),
#: publish time i64 and send time i64 (CLOCK_MONOTONIC ns of the publisher), and the
#: publisher's clock id u64 (see ezflow._core._tracing). Sent right before the message
#: frame it applies to, on the same connection; 48 bytes.
TRACE_BODY: Final = struct.Struct("<B7xQQqqQ")
#: The length prefix and TRACE_BODY in one go.
TRACE_PREFIX: Final = struct.Struct("<IB7xQQqqQ")
#: kind u8, 3 pad bytes, count u32 of FREE_ENTRY records that follow.
FREE_HEADER: Final = struct.Struct("<B3xI")
#: block id u64, block generation u64: the channel no longer refers to that block.
FREE_ENTRY: Final = struct.Struct("<QQ")

_SCRATCH_SIZE: Final = 64 * 1024
# A frame at least this large that is not yet complete in the scratch buffer gets its own
# buffer and is read into directly; smaller ones wait in scratch. After one, the reader
# expects the next frame to be as large (see the module docstring).
_DIRECT_READ_THRESHOLD: Final = 16 * 1024
# A large frame's rest of at least this many bytes is held back by the kernel until it is
# all there (SO_RCVLOWAT, see the module docstring); a smaller rest is read as it comes
# (a loopback segment is up to 64 KiB: it would come in one read or two anyway).
_HOLD_BACK_FROM: Final = 64 * 1024
# ... and at most this much of it at a time: a larger rest (a 4K frame) is read in pieces
# of this size as they come, its copy out of the kernel overlapping its transfer. Held
# back whole, the reader waited for up to half of tcp_rmem's maximum (16 MiB on a host
# allowing 32) and copied it all after its last byte, while the sender stalled on the
# full window: a paced 24.9 MB frame's p50 5.4-5.6 ms held back this way against 6.2-10.6
# ms whole, frames back to back 202-205 against 168-176 a second; 1 MiB messages
# unchanged, 8.7-8.8k a second (perf/micro/large_cpu.py tcp, 2026-11-28).
_HOLD_BACK_AT_MOST: Final = 1024 * 1024
# Where a frame read straight into its own buffer starts in it: its length prefix here,
# so that the body (at 16) keeps the codec's 16-byte alignment.
_DIRECT_OFFSET: Final = 12


log = logging.getLogger("ezflow.framing")


#: First bytes of other protocols that reach our ports by mistake, and what to say.
_FOREIGN: Final = (
    ((b"GET ", b"POST", b"HEAD", b"PUT ", b"OPTI", b"DELE", b"PATC", b"CONN"), "an HTTP request"),
    ((b"\x16\x03",), "a TLS handshake (is TLS set on one end only? EZFLOW_TLS_* on both)"),
    ((b"SSH-",), "an SSH client"),
)


def _looks_like(header: bytes) -> str:
    """A hint for a refused header whose bytes are another protocol's, else ``""``."""
    for prefixes, what in _FOREIGN:
        if header.startswith(prefixes):
            return (
                f" (its bytes {header!r} look like {what}: this port speaks ezflow's "
                "length-prefixed frames)"
            )
    return ""


class FrameReader:
    """Incremental parser of length-prefixed frames.

    Use :meth:`get_buffer` / :meth:`buffer_updated` exactly like the methods of the same
    name on :class:`asyncio.BufferedProtocol`. Frames come back as ``bytes`` (small ones)
    or as a writable ``memoryview`` over a buffer owned by that frame alone (large ones);
    in both cases the caller may keep references into the frame for as long as it likes.

    Iterating :meth:`buffer_updated` raises :class:`ProtocolError` when a header claims
    more than ``max_frame_size`` (after yielding every complete frame before it); the
    reader is unusable afterwards (close the connection).

    ``view`` (the read buffer: the scratch buffer, or after a large frame one for the
    next frame, see the module docstring), ``front`` and ``end`` (the unconsumed bytes
    are ``view[front:end]``) and ``big`` (the buffer of a large frame being read, or
    None) are public for a consumer that takes the whole small frames at the front of a read
    itself, in one loop (every call counts on the message path). While ``big`` is None
    the bytes just read follow ``end``; such a consumer takes whole frames within
    :attr:`max_frame_size` from ``front`` on, then sets ``front`` past the last one it
    took and ``end`` past the bytes read (both to 0 when it took everything), and
    passes 0 to :meth:`buffer_updated` for the rest, if any. ``view`` is valid only
    until the next :meth:`get_buffer`. (``ChannelConnection.buffer_updated`` does this;
    tests/test_stream.py pins it to the general path.) ``large`` counts the large frames
    begun so far (read into their own buffer, in one read or several).
    """

    __slots__ = (
        "_big_filled",
        "_expect",
        "_home",
        "_pool",
        "_scratch",
        "big",
        "end",
        "front",
        "large",
        "max_frame_size",
        "view",
    )

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._scratch = bytearray(_SCRATCH_SIZE)
        self._home = self.view = memoryview(self._scratch)
        self.front = 0  # first unparsed byte in view
        self.end = 0  # one past the last byte read into view
        self.big: memoryview | None = None
        self._big_filled = 0
        self._pool: list[np.ndarray] = []
        self._expect = 0  # size of the last large frame: the next one is read in place
        self.large = 0

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next read goes (*sizehint*, from the event loop, is ignored)."""
        big = self.big
        if big is not None:
            return big[self._big_filled :]
        end = self.end
        if not end:
            expect = self._expect
            if expect and (self.view is self._home or len(self.view) != 4 + expect):
                # After a large frame: the next one straight into a buffer of its own.
                self.view = self._large_buffer(_DIRECT_OFFSET + 4 + expect)[_DIRECT_OFFSET:]
            return self.view  # the usual case: everything before was consumed
        if end == len(self.view):
            self._compact()
            end = self.end
        return self.view[end:]

    def rest(self) -> int:
        """Bytes of the large frame being read (:attr:`big`) still to come; 0 when none."""
        big = self.big
        return 0 if big is None else len(big) - self._big_filled

    def buffer_updated(self, nbytes: int) -> Iterator[bytes | memoryview]:
        """Account for *nbytes* read into the last buffer; yield each completed frame.

        Frames are yielded one at a time, so a consumer that changes
        :attr:`max_frame_size` (after a handshake, say) applies it to the very next
        frame. A header above the limit raises :class:`ProtocolError` after every frame
        before it has been yielded: nothing that arrived intact is lost.
        """
        big = self.big
        if big is not None:
            self._big_filled += nbytes
            if self._big_filled == len(big):
                self.big = None
                self._big_filled = 0
                yield big
            return
        self.end += nbytes
        view = self.view
        unpack = LENGTH.unpack_from
        while self.end - self.front >= 4:
            start, end = self.front, self.end
            (size,) = unpack(view, start)
            if size > self.max_frame_size:
                raise ProtocolError(
                    f"frame header claims {size} bytes, more than the limit of "
                    f"{self.max_frame_size} bytes on this connection"
                    + _looks_like(bytes(view[start : start + 4]))
                )
            frame_end = start + 4 + size
            if (
                size >= _DIRECT_READ_THRESHOLD
                and not start
                and view is not self._home
                and frame_end <= len(view)
            ):
                # A large frame at the start of a buffer of its own that holds it (the
                # one expected, or a smaller one): taken in place, and the reader reads
                # on elsewhere.
                self._expect = size if 4 + size > len(self._scratch) else 0
                self.large += 1
                body = view[4:frame_end]
                self._leave_direct(view, min(frame_end, end), end)
                if frame_end <= end:
                    yield body
                    view = self.view
                    continue
                self.big = body
                self._big_filled = end - 4
                break
            if frame_end <= end:
                self.front = frame_end
                yield bytes(view[start + 4 : frame_end])
                continue
            if size >= _DIRECT_READ_THRESHOLD:
                # (expected next only when scratch could never hold it: frames that fit
                # are better read several at a time)
                self._expect = size if 4 + size > len(self._scratch) else 0
                self.large += 1
                buffer = self._large_buffer(size)
                have = end - start - 4
                buffer[:have] = view[start + 4 : end]
                self.big = buffer
                self._big_filled = have
                self.front = end
            break
        if self.front == self.end:
            self.front = self.end = 0
        elif self.big is None and self.end - self.front >= 4:
            # An incomplete small frame must fit in the space left after compaction.
            (size,) = unpack(view, self.front)
            if self.front + 4 + size > len(view):
                self._compact()

    def _leave_direct(self, view: memoryview, taken: int, end: int) -> None:
        """A frame was taken in place from *view* (a buffer of its own) up to *taken* of
        the *end* bytes read: read on in scratch, with the bytes after it, if any, moved
        there (or into a buffer of their own when more than scratch holds)."""
        rest = end - taken
        if rest > len(self._scratch):
            home = self._large_buffer(_DIRECT_OFFSET + rest)[_DIRECT_OFFSET:]
        else:
            home = self._home
        if rest:
            home[:rest] = view[taken:end]
        self.view = home
        self.front, self.end = 0, rest

    def _large_buffer(self, size: int) -> memoryview:
        pool = self._pool
        for index in range(len(pool)):
            array = pool[index]
            # References: the pool, `array`, getrefcount's argument. Any more means a
            # frame, message or array view still uses this memory.
            if size <= array.size <= 2 * size and sys.getrefcount(array) <= 3:
                pool.append(pool.pop(index))
                return memoryview(array[:size])  # type: ignore[arg-type]
        # np.empty: no zero-filling, and numpy aligns the allocation.
        array = np.empty(size, dtype=np.uint8)
        pool.append(array)
        total = sum(a.size for a in pool)
        while pool and (len(pool) > _POOL_BUFFERS or total > _POOL_BYTES):
            total -= pool.pop(0).size
        return memoryview(array)  # type: ignore[arg-type]

    def _compact(self) -> None:
        start, end = self.front, self.end
        if start:
            self.view[: end - start] = self.view[start:end]
            self.front, self.end = 0, end - start


def _hold_back_socket(transport: asyncio.BaseTransport) -> socket.socket | None:
    """The socket on which reads may be held back for a large frame's rest, or None.

    Only plain TCP: under TLS the kernel counts ciphertext and the TLS layer may hold
    part of a record, so a mark could wait for bytes that never come.
    """
    if transport.get_extra_info("sslcontext") is not None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return cast(socket.socket, sock)


def frame(body: bytes) -> bytes:
    """One complete frame holding *body*."""
    return LENGTH.pack(len(body)) + body


class FramedProtocol(asyncio.BufferedProtocol):
    """An asyncio protocol that turns a byte stream into frames.

    Subclasses implement :meth:`frame_received` and may override :meth:`protocol_error`
    (default: log the reason and abort the connection) and the connection callbacks.
    A subclass raising :class:`ProtocolError` from :meth:`frame_received` gets the same
    treatment as a malformed frame: only this connection is closed.
    """

    transport: asyncio.Transport | None = None
    #: set on every read: any byte received counts as life (see
    #: :class:`~ezflow._core._liveness.Heartbeat`, which clears it)
    heard: bool = False
    #: frames written by :meth:`send_frame` (what :meth:`sent_mark` returns)
    frames_sent: int = 0
    #: the plain TCP socket whose SO_RCVLOWAT holds a large frame's rest back (see the
    #: module docstring), and the mark set on it; None: reads are never held back
    _hold_socket: socket.socket | None = None
    _held_for: int = 1

    def __init__(self, max_frame_size: int) -> None:
        self._reader = FrameReader(max_frame_size)
        self._broken = False
        # The event loop asks for a buffer before every read: hand it the reader's own
        # method, one call fewer on the way to every message.
        self.get_buffer = self._reader.get_buffer  # type: ignore[method-assign]

    @property
    def max_frame_size(self) -> int:
        return self._reader.max_frame_size

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:
        self._reader.max_frame_size = value

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self._hold_socket = _hold_back_socket(transport)

    def get_buffer(self, sizehint: int) -> memoryview:  # replaced per instance, see above
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.heard = True
        try:
            for body in self._reader.buffer_updated(nbytes):
                # frame_received may have closed the connection: ignore what follows
                if self._broken:
                    return
                self.frame_received(body)
        except ProtocolError as exc:
            if not self._broken:
                self._broken = True
                self.protocol_error(exc)
        # (two attribute reads on the small-frame path: nothing held, nothing to hold)
        if self._hold_socket is not None and (self._reader.big is not None or self._held_for != 1):
            rest = self._reader.rest()
            self._hold_reads(min(rest, _HOLD_BACK_AT_MOST) if rest >= _HOLD_BACK_FROM else 1)

    def _hold_reads(self, mark: int) -> None:
        """Have the kernel report the socket readable only once *mark* bytes are there
        (1: as soon as any are)."""
        sock = self._hold_socket
        if mark == self._held_for or sock is None:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
        except OSError as exc:
            # Closed meanwhile, or a kernel without the option: read as bytes come.
            log.debug("not holding reads back on %s: %s", self.peer_name(), exc)
            self._hold_socket = None
            return
        self._held_for = mark

    def read_held_back(self) -> None:
        """Let bytes the kernel holds back for a large frame's rest be read now (the
        heartbeat calls this when it heard nothing since its last look: a slow link
        delivering a large frame is alive). The next read holds the rest back again."""
        self._hold_reads(1)

    def frame_received(self, body: bytes | memoryview) -> None:
        raise NotImplementedError

    def protocol_error(self, exc: ProtocolError) -> None:
        log.warning("closing connection from %s: %s", self.peer_name(), exc)
        self.abort()

    def peer_name(self) -> str:
        transport = self.transport
        if transport is None:
            return "<not connected>"
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            return f"{peer[0]}:{peer[1]}"
        return str(peer)

    def send_frame(self, body: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(frame(body))
            self.frames_sent += 1

    def sent_mark(self) -> int:
        """Changes whenever this connection sends something (heartbeats: an idle
        connection sends one); by default the count of :meth:`send_frame` calls."""
        return self.frames_sent

    def abort(self) -> None:
        self._broken = True
        transport = self.transport
        if transport is not None:
            transport.abort()
