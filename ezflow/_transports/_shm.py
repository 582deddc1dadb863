"""The shared-memory transport: same-host edges between processes.

Each publishing process listens on one Unix-domain stream socket in Linux's abstract
namespace (``@ezflow-<pid>-<16 hex>``: no file to clean up, gone when the process is).
A channel in another process connects to it exactly as it would over tcp (the frames
of :mod:`._stream`); what differs is where message bytes travel:

* an encoded message of at most ``ShmOptions.inline_limit`` bytes goes *inline*, in a
  ``DATA`` frame on the socket: copying a small message is cheaper than leasing a block;
* a larger one is written once into a block of the publisher's :class:`ShmRing` (a ring
  slot, or an out-of-line segment above the slot size), and every channel it goes to
  gets a ``SHM_DATA`` notification: sequence number, timestamp, drops, and where the
  block lies. The channel maps the segment read-only (mappings are cached), decodes the
  message *in place* - arrays are read-only views into shared memory - and delivers it.
  Notifications are batched like any frame, so a burst of messages costs one write and
  one wake-up, not one per message.

Leases and releases
    A block stays leased to a channel while anything in that process still refers to the
    message: the :class:`ShmRingReader` learns from a weak reference when the last view is
    gone, and the channel sends ``FREE`` (block, generation) records back, batched per
    event-loop iteration. A subscriber that keeps a message therefore sees it unchanged
    for as long as it keeps it. This is separate from flow control: the ``max_in_flight``
    window (``ACK``) counts messages not yet *taken* by every subscriber, and is what
    makes a lossless ``publish`` wait. When no block is free because subscribers keep
    old messages alive, a message travels inline instead - kept messages never block a
    publisher, and never make it drop anything.

Loans
    :meth:`ShmTransport.loan` hands out a writable array that sits in a block with
    ``SHM_LOAN_ROOM`` bytes free on each side of its data (64-byte aligned in the
    segment). A message holding that array - the array itself, or a tuple, list, dict
    or dataclass with it at any depth - is laid out *around* it at publish time: the
    encoded parts before the array's data are written into the room just before it, the
    parts after it just after, and the ``SHM_DATA`` notification names that span of the
    block. The array's bytes are never copied or moved. The codec places every buffer at
    a body offset that is a multiple of 16, so the body starts 16-byte aligned too and
    every array a channel decodes from it is an aligned view. When the other parts do
    not fit the room (large buffers beside the array), the message is copied into a
    block of its own as any message (``ShmStats.loans_copied``). The loan holds its own
    lease until the array (and every view of it) is gone, so the publisher's copy never
    changes either; once published - whatever it went to - the array is made read-only.

Crashes and cleanup
    A channel whose publisher dies sees its socket close without ``END``: it ends like a
    clean close (``on_lost``), its subscribers keep the messages they hold (the mappings
    outlive the segments' names), and the dead publisher's segments are swept from
    ``/dev/shm`` (see :class:`SegmentSweeper`). A channel that dies drops its socket;
    the publisher then drops all its leases at once, so it is never blocked for long.
    A publisher closes its ring (unlinking every segment, in a worker thread:
    :class:`SegmentUnlinker`) once every channel it fed has read up to ``END``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import mmap
import os
import re
import secrets
import socket
import sys
import threading
from collections.abc import Callable
from time import time_ns as _time_ns
from typing import Any, ClassVar

import numpy as np

from .._core._auth import Credentials
from .._core._channel import Channel
from .._core._codec import Codec, EncodedMessage
from .._core._config import PACED_GAP_NS as _PACED_GAP_NS
from .._core._config import SHM_FREE_PER_FRAME as _FREE_PER_FRAME
from .._core._config import SHM_SWEEP_DELAYS as _SWEEP_DELAYS
from .._core._config import ShmOptions
from .._core._exceptions import BrokenResourceError, ProtocolError
from .._core._framing import (
    FREE,
    FREE_ENTRY,
    FREE_HEADER,
    RETIRE,
    SHM_DATA,
    SHM_HEADER,
    SHM_PREFIX,
    frame,
)
from .._core._outlet import _RUSAGE_THREAD, Outlet, _voluntary_switches
from .._core._protocol import PublisherInfo, field
from ._base import Loans, Transport, TransportSettings
from ._ezring_files import sweep_stale_rings
from ._segment import ShmSegment, shm_available, sweep_stale_segments
from ._shm_outlet import ShmStats, _OutletShm
from ._shmring import Descriptor, ShmRingReader
from ._stream import StreamTransport
from ._stream_channel import ChannelConnection
from ._stream_publish import PublisherConnection, StreamLink

__all__ = ["SegmentSweeper", "ShmTransport", "sweep_shm_dir", "valid_socket_name"]

log = logging.getLogger("ezflow.shm")

_SOCKET_NAME = re.compile(r"ezflow-[0-9]{1,10}-[0-9a-f]{16}")


def valid_socket_name(name: str) -> bool:
    """Whether *name* looks like a shm data socket this library creates."""
    return _SOCKET_NAME.fullmatch(name) is not None


class _LoopCall:
    """Schedules a callback on the loop's thread from anywhere - weak-reference callbacks
    included, which may run on another thread or in the middle of unrelated code."""

    __slots__ = ("_loop", "_thread")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.get_ident()

    def __call__(self, callback: Callable[..., object], *args: Any) -> None:
        try:
            if threading.get_ident() == self._thread:
                self._loop.call_soon(callback, *args)
            else:
                self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop is closed: nobody is left to tell


def sweep_shm_dir(*, report: bool = False) -> list[str]:
    """Remove every stale file of the shm directory - segments of dead processes and
    ezring rings of dead writers - and return their names. Never raises (an entry that
    cannot be read is skipped; a foreign one is logged, as a WARNING once with *report*).
    Blocking file I/O: call it from a worker thread."""
    return sweep_stale_segments(report=report) + sweep_stale_rings(report=report)


class SegmentSweeper:
    """Removes segments of dead processes from ``/dev/shm``: now, and again a few times
    shortly after :meth:`sweep_soon` (a crashed owner's lock goes a little after it).

    Every sweep (a directory listing, ``/proc`` reads, opens and unlinks) runs in a
    worker thread, never on the event loop. Owned by a graph server or a shm transport;
    :meth:`aclose` cancels what is pending.
    """

    def __init__(self, *, report: bool = False) -> None:
        """*report*: log foreign entries of the shm directory as WARNINGs, once each (the
        graph server's sweeper; see ``_shmfiles.refuse_entry``)."""
        self._report = report
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._closed = False

    async def sweep(self) -> list[str]:
        """One sweep, now (in a worker thread); the names removed. Never raises (but
        ``CancelledError``); cancelling the caller does not stop a sweep under way."""
        return await asyncio.to_thread(sweep_shm_dir, report=self._report)

    def sweep_soon(self) -> None:
        """Sweep at ``_SWEEP_DELAYS`` from now (restarting the delays if one is pending);
        after :meth:`aclose`, once at once."""
        if self._closed:
            sweep_shm_dir(report=self._report)
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.ensure_future(self._sweep_later())

    async def _sweep_later(self) -> None:
        while True:
            self._again = False
            for delay in _SWEEP_DELAYS:
                await asyncio.sleep(delay)
                await self.sweep()
            if not self._again:
                return

    async def aclose(self) -> None:
        """Cancel the pending sweeps and, if one was pending, sweep once more now."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.sweep()


class SegmentUnlinker:
    """Removes the names of segments this process owns and gave up, in a worker thread:
    an unlink frees the segment's pages, which is no work for the event loop.

    :meth:`unlink` takes a segment that its owner will not touch again (closed, or to be
    closed by nobody else), so the worker thread is the only one using it from then on -
    :class:`ShmSegment` asks for one thread at a time. The segment stays owned (its
    name, and the lock that keeps sweepers off it) until the worker has unlinked it;
    at a normal interpreter exit whatever is left is unlinked by ``ShmSegment``'s own
    ``atexit`` hook, and after a crash the sweeper removes it. :meth:`unlink` only
    queues, so a cancelled caller cannot stop an unlink half-way; :meth:`wait` waits
    until the queue is empty (a transport's ``aclose``).
    """

    def __init__(self) -> None:
        self._pending: collections.deque[ShmSegment] = collections.deque()
        self._job: asyncio.Future[None] | None = None

    def unlink(self, segment: ShmSegment) -> None:
        """Have *segment* unlinked (owner only): soon, in a worker thread; at once when
        no event loop runs here (nothing to keep free)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            segment.unlink()
            return
        self._pending.append(segment)
        if self._job is None:
            self._start(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            job = loop.run_in_executor(None, self._drain)
        except RuntimeError:  # the executor is shut down: the loop is ending
            self._drain()
            return
        self._job = job
        job.add_done_callback(self._drained)

    def _drain(self) -> None:
        # In the worker thread: deque.popleft is atomic, the loop only appends.
        pending = self._pending
        while pending:
            segment = pending.popleft()
            try:
                segment.unlink()
            except Exception:  # (logged; the others still go)
                log.exception("cannot remove shared-memory segment %s", segment.name)

    def _drained(self, job: asyncio.Future[None]) -> None:
        # On the loop: a segment queued after the worker found the queue empty (and
        # before this callback) starts another round.
        self._job = None
        if self._pending:
            self._start(asyncio.get_running_loop())

    async def wait(self) -> None:
        """Return once every segment queued so far is unlinked. Cancelling the caller
        does not stop the unlinks."""
        while (job := self._job) is not None:
            # (asyncio.wait yields even for a done job, so that its done-callback, which
            # may start the next round, runs first; it never cancels the job)
            await asyncio.wait({job})


# -- publisher side ------------------------------------------------------------------------


class _ShmLink(StreamLink):
    transport = "shm"

    def __init__(
        self, connection: PublisherConnection, *, lossless: bool, max_size: int, shm: _OutletShm
    ) -> None:
        super().__init__(connection, lossless=lossless, max_size=max_size)
        self.shm = shm
        self.out_of_line_above = shm.options.inline_limit
        self.handoff = shm.options.handoff  # (the outlet's, for every same-host link)
        self._placed_ns = 0  # time_ns when the last message placed in shm was
        self._slept = -1  # _voluntary_switches() when _back_to_back last asked
        # The block window (ShmOptions): a lossless channel's messages in blocks that it
        # has not taken yet, each as the link's sent_count once it was sent; beyond
        # what the ring holds, messages of their size would travel inline (copied
        # through the socket, several times slower than the window's wait).
        self._unreleased_blocks: collections.deque[int] = collections.deque()
        self._block_window = 2 * shm.options.slot_count
        self._backlogged = False

    def set_backlogged(self, backlogged: bool) -> None:
        self._backlogged = backlogged
        self.stalled = backlogged or len(self._unreleased_blocks) >= self._block_window

    def released(self, count: int, nbytes: int) -> None:
        blocks = self._unreleased_blocks
        if blocks and blocks[0] <= count:
            while blocks and blocks[0] <= count:
                blocks.popleft()
            # (before the base class looks at has_room and wakes a waiting publish)
            self.stalled = self._backlogged or len(blocks) >= self._block_window
        super().released(count, nbytes)

    def set_lossless(self, lossless: bool) -> None:
        # A leaky channel is never waited for; one that turns lossless starts afresh
        # (the base class forgives what was in flight).
        if lossless != self.lossless:
            self._unreleased_blocks.clear()
            self.stalled = self._backlogged
        super().set_lossless(lossless)

    def send_out_of_line(
        self, seq: int, time_ns: int, message: Any, encoded: EncodedMessage
    ) -> bool:
        placed = self.shm.place(seq, message, encoded, self)
        if placed is None:
            self.shm.stats.no_block += 1
            return False
        d, name = placed
        self.shm.stats.zero_copy += 1
        if self.lossless:
            blocks = self._unreleased_blocks
            blocks.append(self.sent_count)
            if len(blocks) >= self._block_window:
                self.stalled = True
        if not self._flush_scheduled and self._back_to_back(time_ns):
            # The notification goes at the end of the loop iteration with the others of
            # the burst: one write and one wake-up of the subscriber for several large
            # messages, not one each. A paced message's goes out at once (queue_frame).
            self._flush_scheduled = True
            self._loop.call_soon(self._end_of_iteration)
        self.queue_frame(
            SHM_PREFIX.pack(
                SHM_HEADER.size + len(name),
                SHM_DATA,
                0,
                seq,
                time_ns,
                self.drops,
                d.block,
                d.generation,
                d.offset,
                d.length,
            )
            + name
        )
        self._placed_ns = _time_ns()
        return True

    def _back_to_back(self, started: int) -> bool:
        """Whether the message published at *started* (``time_ns``) follows the last one
        placed back to back: within ``PACED_GAP_NS``, or later without this thread
        sleeping since we last looked (a yield to its event loop, preemption) - the
        outlet's test of a paced publish (``Outlet._hand_off``), which reads the
        context switches (a system call) only when the gap is long."""
        if started - self._placed_ns < _PACED_GAP_NS:
            return True
        if _RUSAGE_THREAD is None:  # pragma: no cover - not on Linux
            return False
        slept, self._slept = self._slept, _voluntary_switches()
        return slept == self._slept


# -- subscriber side -----------------------------------------------------------------------


class _ShmChannelConnection(ChannelConnection):
    # (its ACKs open the block window too: no delay, see ChannelConnection._on_release)
    large_ack_delay = 0.0

    def __init__(
        self,
        channel: Channel,
        publisher: PublisherInfo,
        max_size: int,
        on_lost: Callable[[], None],
        transport: ShmTransport,
    ) -> None:
        super().__init__(channel, publisher, max_size, on_lost)
        self._shm = transport
        self._call = transport.call
        self.reader = ShmRingReader(on_release=self._block_released)
        self._free_scheduled = False
        self._closed_here = False

    def welcomed(self, reply: dict[str, Any]) -> None:
        # Mapping the publisher process's probe segment now proves that /dev/shm is
        # shared with it (a container may have its own); if not, the caller falls back
        # to tcp.
        probe = field(reply, "segment", str)
        try:
            self.reader.attach(probe)
        except (BrokenResourceError, ValueError) as exc:
            raise BrokenResourceError(
                f"cannot map the shared memory of publisher {self.publisher.publisher_id}: {exc}"
            ) from exc

    def publisher_frame(self, kind: int, body: bytes | memoryview) -> None:
        if kind == SHM_DATA:
            if len(body) <= SHM_HEADER.size:
                raise ProtocolError(f"SHM_DATA frame of {len(body)} bytes")
            _, _, seq, sent_ns, drops, block, generation, offset, length = SHM_HEADER.unpack_from(
                body
            )
            try:
                name = bytes(body[SHM_HEADER.size :]).decode("ascii")
                view = self.reader.view(Descriptor(name, offset, length, block, generation))
            except (UnicodeDecodeError, ValueError, BrokenResourceError) as exc:
                raise ProtocolError(f"unusable shared-memory notification: {exc}") from exc
            self.large_reads += 1
            self.channel.deliver_body(seq, view, drops, sent_ns)
        elif kind == RETIRE:
            try:
                self.reader.forget(bytes(body[1:]).decode("ascii"))
            except UnicodeDecodeError as exc:
                raise ProtocolError("RETIRE frame with a name that is not ASCII") from exc
        else:
            super().publisher_frame(kind, body)

    def _block_released(self, descriptor: Descriptor) -> None:
        # From a weak-reference callback (any thread, any moment): only schedule the send.
        if not self._free_scheduled:
            self._free_scheduled = True
            self._call(self._send_free)

    def _send_free(self) -> None:
        # Reset before taking: a release racing in from another thread either is taken
        # now or schedules another call.
        self._free_scheduled = False
        released = self.reader.take_released()
        transport = self.transport
        if not released or transport is None or transport.is_closing():
            return
        pack = FREE_ENTRY.pack
        frames = []
        for start in range(0, len(released), _FREE_PER_FRAME):
            chunk = released[start : start + _FREE_PER_FRAME]
            frames.append(
                frame(
                    FREE_HEADER.pack(FREE, len(chunk))
                    + b"".join([pack(d.block, d.generation) for d in chunk])
                )
            )
        transport.writelines(frames)

    def close(self) -> None:
        self._closed_here = True
        super().close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        # Views handed out stay valid (they keep their mappings); only the cache goes.
        self.reader.close()
        if not (self.ended or self._closed_here):
            # The publisher went away without END: it may have crashed and left its
            # segments behind.
            self._shm.sweeper.sweep_soon()


# -- the transport -------------------------------------------------------------------------


class _ShmLoans:
    """One publisher's handle on its shared memory (:meth:`ShmTransport.loans`)."""

    __slots__ = ("_outlet", "_transport")

    def __init__(self, transport: ShmTransport, outlet: Outlet) -> None:
        self._transport = transport
        self._outlet = outlet

    def loan(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any] | None:
        return self._transport.loan(self._outlet, shape, dtype)

    def spend(self, message: Any) -> None:
        self._transport.spend(self._outlet, message)

    def stats(self) -> ShmStats | None:
        return self._transport.stats(self._outlet)


class ShmTransport(StreamTransport[str]):
    """Shared-memory data server for this process's publishers, and connector for its
    channels. Linux only; :meth:`available` says whether it can work here."""

    name: ClassVar[str] = "shm"
    unreachable: ClassVar[str] = (
        "shared memory cannot be used between these processes"
        " (another host, no /dev/shm, or it failed before)"
    )
    fallback: ClassVar[str | None] = "tcp"
    label: ClassVar[str] = "shared memory"

    def __init__(
        self, *, max_message_size: int, codec: Codec, credentials: Credentials | None = None
    ) -> None:
        super().__init__(max_message_size=max_message_size, credentials=credentials)
        self._codec = codec
        self._shm: dict[str, _OutletShm] = {}
        self._call: _LoopCall | None = None
        self._probe: ShmSegment | None = None
        self._probe_error: str | None = None
        self.sweeper = SegmentSweeper()
        #: removes the names of the segments our publishers give up, off the loop
        self.unlinker = SegmentUnlinker()

    @classmethod
    def available(cls) -> bool:
        """Whether shared memory and abstract Unix sockets work in this process (the
        first call probes /dev/shm: it creates and unlinks a file)."""
        return sys.platform.startswith("linux") and shm_available()

    @classmethod
    def from_settings(cls, settings: TransportSettings) -> Transport:
        return cls(
            max_message_size=settings.max_message_size,
            codec=settings.codec,
            credentials=settings.credentials,
        )

    def reaches(self, publisher: PublisherInfo, host_id: str) -> bool:
        """A publisher on this host whose process serves shared memory."""
        return publisher.shm_address is not None and publisher.host_id == host_id

    async def advertise(self, *, optional: bool = True) -> dict[str, Any]:
        """``{"shm": <socket name>}``: the data socket's name (optional)."""
        return {"shm": await self.start()} if optional else {}

    @property
    def call(self) -> _LoopCall:
        if self._call is None:
            self._call = _LoopCall(asyncio.get_running_loop())
        return self._call

    async def listen(
        self, factory: Callable[[], PublisherConnection]
    ) -> tuple[asyncio.AbstractServer, str]:
        # Segments of processes that died before us go first.
        await self.sweeper.sweep()
        name = f"ezflow-{os.getpid()}-{secrets.token_hex(8)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind("\0" + name)
            sock.listen(256)
            sock.setblocking(False)
            server = await asyncio.get_running_loop().create_unix_server(factory, sock=sock)
        except BaseException:
            sock.close()
            raise
        return server, name

    async def connect(
        self, factory: Callable[[], ChannelConnection], publisher: PublisherInfo
    ) -> ChannelConnection:
        name = publisher.shm_address
        if name is None or not valid_socket_name(name):
            raise OSError(f"publisher advertises no usable shm socket ({name!r})")
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, "\0" + name)
            _, connection = await loop.create_unix_connection(factory, sock=sock)
        except BaseException:
            sock.close()
            raise
        return connection

    def where(self, publisher: PublisherInfo) -> str:
        return f"unix socket @{publisher.shm_address}"

    def new_channel_connection(
        self, channel: Channel, publisher: PublisherInfo, on_lost: Callable[[], None]
    ) -> ChannelConnection:
        return _ShmChannelConnection(channel, publisher, self.max_message_size, on_lost, self)

    # -- publishers ---------------------------------------------------------------

    def add_outlet(self, outlet: Outlet, options: ShmOptions | None = None) -> None:
        super().add_outlet(outlet)
        self._shm[outlet.publisher_id] = _OutletShm(
            outlet, options or ShmOptions(), self._codec, self.call, self.unlinker.unlink
        )

    def remove_outlet(self, outlet: Outlet) -> None:
        super().remove_outlet(outlet)
        shm = self._shm.pop(outlet.publisher_id, None)
        if shm is not None:
            shm.close()

    def make_link(
        self, connection: PublisherConnection, outlet: Outlet, hello: dict[str, Any]
    ) -> tuple[StreamLink, dict[str, Any]]:
        shm = self._shm[outlet.publisher_id]
        probe = self._probe_segment()
        if not shm.usable:
            raise BrokenResourceError("shared memory failed for this publisher earlier")
        link = _ShmLink(
            connection,
            lossless=bool(hello.get("lossless")),
            max_size=field(hello, "max_message_size", int),
            shm=shm,
        )
        shm.links.add(link)
        return link, {"segment": probe.name}

    def _probe_segment(self) -> ShmSegment:
        """One page of this process that every channel maps at its handshake, to prove
        it shares /dev/shm with us; created with the first shm channel. (Rings are
        created at their first large message, so a publisher of small messages costs
        nothing more.) Raises :class:`BrokenResourceError` when shared memory cannot be
        created here, logged once."""
        if self._probe is None:
            if self._probe_error is not None:
                raise BrokenResourceError(self._probe_error)
            try:
                self._probe = ShmSegment.create(mmap.PAGESIZE, tag="probe")
            except BrokenResourceError as exc:
                self._probe_error = f"the publisher's process cannot create shared memory: {exc}"
                log.warning(
                    "cannot create shared memory (%s); channels to this process's "
                    "publishers use tcp",
                    exc,
                )
                raise BrokenResourceError(self._probe_error) from exc
        return self._probe

    def channel_frame(
        self, connection: PublisherConnection, link: StreamLink, kind: int, body: bytes | memoryview
    ) -> None:
        if kind != FREE or not isinstance(link, _ShmLink):
            super().channel_frame(connection, link, kind, body)
            return
        link.shm.free(link, body)

    def link_lost(self, connection: PublisherConnection, outlet: Outlet, link: StreamLink) -> None:
        if isinstance(link, _ShmLink):
            link.shm.link_lost(link)

    def loan(
        self, outlet: Outlet, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> np.ndarray[Any, Any] | None:
        """A writable array of *shape* and *dtype* in *outlet*'s shared memory, laid out
        so that publishing it - alone or inside a message - copies nothing (see the
        module docstring, Loans); ``None`` when no block can be had (use a private array
        then). Raises like :meth:`Codec._array_prefix`."""
        shm = self._shm.get(outlet.publisher_id)
        if shm is None:
            return None
        return shm.loan(shape, dtype)

    def spend(self, outlet: Outlet, message: Any) -> None:
        """*message* was published by *outlet*: every loaned array in it, at any depth,
        is read-only and spent now. Costs nothing while *outlet* has no loan
        outstanding."""
        shm = self._shm.get(outlet.publisher_id)
        if shm is not None and shm.loans:
            shm.spend(message)

    def stats(self, outlet: Outlet) -> ShmStats | None:
        """A snapshot of *outlet*'s counters; ``None`` when it is not (or no longer) here."""
        shm = self._shm.get(outlet.publisher_id)
        return None if shm is None else shm.snapshot()

    def loans(self, outlet: Outlet) -> Loans[ShmStats]:
        """*outlet*'s loans (``Publisher.loan``) and counters (``Publisher.shm_stats``)."""
        return _ShmLoans(self, outlet)

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            for shm in list(self._shm.values()):
                shm.links.clear()
                shm.close()
            self._shm.clear()
            probe, self._probe = self._probe, None
            if probe is not None:
                owned = probe.owner  # (not in a forked child)
                probe.close()
                if owned:
                    self.unlinker.unlink(probe)
            try:
                await self.unlinker.wait()  # every segment we gave up is gone from here on
            finally:
                await self.sweeper.aclose()
