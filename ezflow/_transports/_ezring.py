"""ezring v1.1: a shared-memory ring that C/C++ (or Python) producers write and ezflow reads;
its reader, and the ezring transport (a ring feeds graph channels).

The format is specified in ``docs/ezring.md`` (normative; ``c/ezflow_ring.h`` is the C
writer). In short: one file ``/dev/shm/ezflow-ring-<name>``::

    0      header (384 bytes in v1.0): magic, version, geometry, writer pid/start,
           topic; write_seq at 256, writer statistics at 320, scan_count at 336
           (v1.1: odd while the writer scans the reader table)
    384    reader table: max_readers entries of 64 bytes (state word, mode, pid,
           release cursor, wake-up address)
    page   slot table: slot_count slots of slot_stride bytes (256-byte slot header:
           seq, length, t_ns, typestr, ndim, meta_len, shape[8], meta[128]; payload)

Frame *seq* (1, 2, ...) lives in slot ``(seq - 1) % slot_count``. The writer overwrites a
slot only when every live lossless reader's release cursor has passed the frame in it;
otherwise it drops the new frame and counts it. Leaky readers are never waited for and
detect being lapped seqlock-style. Wake-ups are datagrams to each reader's abstract Unix
socket; liveness is by OFD locks (byte 0 for the writer, the first byte of each reader
entry for its reader).

Atomicity on the Python side: 8-byte fields are read and written through a
``memoryview`` cast to ``"Q"`` over the mapping, i.e. one aligned 8-byte load or store
(CPython copies the item with a fixed-size memcpy, which compilers emit as one ``mov``
on x86-64 and one ``ldr``/``str`` on aarch64; aligned 8-byte accesses are single-copy
atomic on both). The *ordering* this module relies on is x86-64's (TSO: loads are not
reordered with loads, stores not with stores; the one reordering x86-64 does - a later load
passing an earlier store to another address - matters only at a reader's registration
(state store, then ``write_seq`` and ``scan_count`` loads) and at the writer's scan
announcement (``scan_count`` store, then the entries' loads), where a system call that
takes a kernel lock (``F_OFD_GETLK``) is the full barrier). On aarch64 the Python reader
and writer are not guaranteed correct (the spec's "Atomicity and aarch64" section); the C
writer is, because it uses acquire/release atomics.

The files: :mod:`._ezring_files` holds the format's constants and header and every look
at a ring file (open, sweep, scan), :mod:`._ezring_writer` the Python writer, this module
the reader (:class:`RingReader`) and :class:`EzringTransport`: a publisher registered
for a ring (``GraphContext.attach_ring``, or the graph server's ring watcher) is reached
only through it, each subscribing process reading the ring itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._core._channel import Channel
from .._core._config import EZRING_ATTACH_TIMEOUT, EZRING_POLL_INTERVAL
from .._core._exceptions import (
    BrokenResourceError,
    ClosedResourceError,
    EndOfStream,
    EzflowTimeoutError,
    ProtocolError,
)
from .._core._outlet import Outlet
from .._core._protocol import PublisherInfo
from ._base import Inbound, Transport
from ._ezring_files import (
    _SLOT,
    ADDR_SIZE,
    FLAG_CLOSED,
    MAX_NDIM,
    META_SIZE,
    MODE_LEAKY,
    MODE_LOSSLESS,
    OFF_DROPPED,
    OFF_FLAGS,
    OFF_RECLAIMED,
    OFF_SCAN_COUNT,
    OFF_WRITE_SEQ,
    R_ADDR,
    R_CURSOR,
    R_MODE,
    R_STATE,
    READER_ENTRY_SIZE,
    S_META,
    S_SEQ,
    S_SHAPE,
    SLOT_HEADER_SIZE,
    STATE_ACTIVE,
    RingHeader,
    RingMapping,
    RingStats,
    lock_byte,
    locked_elsewhere,
    read_ring_header,
    remove_ring_if_stale,
    ring_path,
)
from ._ezring_writer import RingWriter
from ._shmfiles import RefusedShmFile

if TYPE_CHECKING:  # numpy.typing costs ~15 ms to import; annotations only
    import numpy.typing as npt

__all__ = [
    "EzringTransport",
    "RingFrame",
    "RingHeader",
    "RingInbound",
    "RingReader",
    "RingStats",
    "RingWriter",
    "open_ring_channel",
    "ring_registration",
]

log = logging.getLogger("ezflow.ezring")


@dataclass(frozen=True, slots=True)
class RingFrame:
    """One frame received from a ring.

    *array* is read-only. For a lossless reader it is a zero-copy view of the slot, and
    the slot stays held (the writer will not overwrite it) until *array* and every view
    derived from it are gone; for a leaky reader it is a private copy. *lost* counts the
    frames a leaky reader missed just before this one (lapped); always 0 when lossless.
    """

    seq: int
    t_ns: int
    array: npt.NDArray[Any]
    meta: bytes
    lost: int


class RingReader:
    """One reader of a ring: ``async with await RingReader.open(name) as reader``.

    *lossless* readers hold the writer back (it drops new frames while every slot is
    still held by some lossless reader); leaky readers never do and may be lapped
    (:attr:`RingFrame.lost`). A reader receives every frame committed after it began
    registering (so a writer that waits for ``readers_live`` loses none). Not
    thread-safe: use it from one event loop.
    """

    def __init__(self, name: str, mapping: RingMapping, header: RingHeader, lossless: bool) -> None:
        """Private: use :meth:`open`."""
        self._name = name
        self._m = mapping
        self._header = header
        self._lossless = lossless
        self._closed = False
        self._entry = -1
        self._sock: socket.socket | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._watching = False
        self._next = 0
        self._held: dict[int, int] = {}  # seq -> 1 while a lossless view is alive
        self._delivered = 0
        self._cursor = 0
        self._dtypes: dict[bytes, np.dtype[Any]] = {}
        # Views may die in another thread (a @thread unit): releases go back to this one.
        self._thread = threading.get_ident()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lost = 0  #: frames skipped because this (leaky) reader was lapped

    @classmethod
    async def open(
        cls, name: str, *, lossless: bool = True, timeout: float = EZRING_ATTACH_TIMEOUT
    ) -> RingReader:
        """Attach to ring *name* and register a reader entry.

        Waits up to *timeout* seconds for the ring to exist and be initialised (polling
        every 10 ms; an open, a read and the mmap of a tmpfs file are the only system
        calls). Raises :class:`EzflowTimeoutError` if it is not ready in time,
        :class:`ProtocolError` for a segment that is not ezring v1 (another major
        version is refused), :class:`BrokenResourceError` when every reader entry is
        taken or the ring cannot be mapped, and its subclass ``RefusedShmFile`` at once
        for an entry of that name that is not a ring file of this user (a FIFO, a
        directory, a symbolic link, another user's file; logged once).
        Cancellation-safe: nothing stays registered.
        """
        path = ring_path(name)
        deadline = time.monotonic() + timeout
        while True:
            try:
                mapping = RingMapping.open(path)
            except RefusedShmFile as error:
                raise RefusedShmFile(
                    error.path, f"cannot read ezring {name}: {error.reason}"
                ) from error
            except FileNotFoundError as error:
                if time.monotonic() > deadline:
                    raise EzflowTimeoutError(
                        f"ezring {name} ({path}) did not appear within {timeout} s; start its"
                        " writer first, or give a longer timeout"
                    ) from error
                await asyncio.sleep(0.01)
                continue
            if mapping is None:  # created but not initialised yet
                if time.monotonic() > deadline:
                    raise EzflowTimeoutError(
                        f"ezring {name} ({path}) exists but its writer did not finish creating"
                        f" it within {timeout} s"
                    )
                await asyncio.sleep(0.01)
                continue
            break
        try:
            header = RingHeader.parse(mapping.rw, mapping.size)
            reader = cls(name, mapping, header, lossless)
            reader._loop = asyncio.get_running_loop()
            before, after = reader._register()
        except BaseException:
            mapping.close()
            raise
        try:
            await reader._settle(before, after, deadline)
        except BaseException:
            reader.close()
            raise
        return reader

    def _register(self) -> tuple[int, int]:
        """Take a reader entry and announce it (docs/ezring.md, "Registration", steps
        1-4): ``(before, after)``, ``write_seq`` read before and after the announcement,
        for :meth:`_settle`."""
        h, m = self._header, self._m
        for i in range(h.max_readers):
            if lock_byte(m.fd, h.reader_table + i * READER_ENTRY_SIZE):
                self._entry = i
                break
        else:
            raise BrokenResourceError(
                f"ezring {self._name} has all {h.max_readers} reader entries in use;"
                " close a reader or create the ring with a larger max_readers"
            )
        base = self._entry_offset
        generation = ((m.load(base + R_STATE) >> 32) + 1) & 0xFFFFFFFF
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            address = f"ezr-{os.getpid()}-{secrets.token_hex(6)}"
            sock.bind("\0" + address)
            sock.setblocking(False)
        except OSError as error:
            sock.close()
            raise BrokenResourceError(f"cannot bind the ezring wake-up socket: {error}") from error
        self._sock = sock
        mode = MODE_LOSSLESS if self._lossless else MODE_LEAKY
        struct.pack_into("<II", m.rw, base + R_MODE, mode, os.getpid())
        m.rw[base + R_ADDR : base + R_ADDR + ADDR_SIZE] = address.encode().ljust(ADDR_SIZE, b"\0")
        before = m.load(OFF_WRITE_SEQ)
        m.store(base + R_CURSOR, before)
        m.store(base + R_STATE, STATE_ACTIVE | generation << 32)
        # Full barrier between the state store and the write_seq load (docs/ezring.md,
        # "Registration"): a system call taking a kernel lock. It doubles as the first
        # liveness check of the writer.
        locked_elsewhere(m.fd, 0)
        return before, m.load(OFF_WRITE_SEQ)

    async def _settle(self, before: int, after: int, deadline: float) -> None:
        """Where this reader starts (docs/ezring.md, "Registration", step 5): after
        *before* when the frames committed since are intact and held for it, else after
        *after*; its cursor stored there.

        Fewer than ``slot_count`` frames since *before*: intact (a loan that did not
        see this reader overwrote at most frame *before*). More: lapped. Exactly
        ``slot_count``: intact unless the loan of the next frame overwrote frame
        ``before + 1`` without seeing this reader - a loan whose scan began before the
        announcement. A v1.1 writer announces each scan (``scan_count`` odd); once no
        scan that began before is under way, frame ``before + 1`` still in its slot
        means that no such loan took it, and every later scan sees this reader. A
        scan under way is waited for (a few microseconds; polled every millisecond up
        to *deadline*, while the writer lives); a v1.0 writer announces nothing:
        lapped, to be safe (those frames are skipped, not counted as lost)."""
        h, m = self._header, self._m
        start = before
        if after - before > h.slot_count or (
            after - before == h.slot_count and not await self._kept(before, deadline)
        ):
            start = after
        m.store(self._entry_offset + R_CURSOR, start)
        self._next = start + 1
        self._delivered = self._cursor = start

    async def _kept(self, before: int, deadline: float) -> bool:
        """Whether frame ``before + 1`` is intact and held for this reader: no scan that
        could have missed it took its slot (see :meth:`_settle`)."""
        h, m = self._header, self._m
        if h.minor < 1:
            return False
        scans = m.load(OFF_SCAN_COUNT)
        while scans & 1 and m.load(OFF_SCAN_COUNT) == scans:
            # A scan under way: it may have begun before our announcement.
            if not self._writer_alive():
                break  # (a dead writer takes no slot any more: the slot tells)
            if time.monotonic() > deadline:
                return False  # (a writer stopped mid-scan: lapped, to be safe)
            await asyncio.sleep(0.001)
        offset = h.slot_table + (before % h.slot_count) * h.slot_stride
        return bool(m.load(offset + S_SEQ) == before + 1)

    @property
    def _entry_offset(self) -> int:
        return self._header.reader_table + self._entry * READER_ENTRY_SIZE

    @property
    def header(self) -> RingHeader:
        """The ring's self-description (geometry, writer, topic)."""
        return self._header

    @property
    def topic(self) -> str:
        """The topic the writer declared (may be empty)."""
        return self._header.topic

    def stats(self) -> RingStats:
        """A snapshot of the writer's counters as published in the segment."""
        m, h = self._m, self._header
        live = sum(
            m.load(h.reader_table + i * READER_ENTRY_SIZE) & 0xFFFFFFFF == STATE_ACTIVE
            for i in range(h.max_readers)
        )
        return RingStats(m.load(OFF_WRITE_SEQ), m.load(OFF_DROPPED), live, m.load(OFF_RECLAIMED))

    # -- receiving ------------------------------------------------------------------

    def _view_dropped(self, seq: int) -> None:
        # The finalizer of a lossless view: runs in whichever thread dropped it last.
        if threading.get_ident() == self._thread or self._loop is None:
            self._release(seq)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to tell
                self._loop.call_soon_threadsafe(self._release, seq)

    def _release(self, seq: int) -> None:
        if self._closed:
            return
        self._held.pop(seq, None)
        cursor = min(self._held) - 1 if self._held else self._delivered
        if cursor != self._cursor:
            self._cursor = cursor
            self._m.store(self._entry_offset + R_CURSOR, cursor)

    def _dtype(self, typestr: bytes) -> np.dtype[Any]:
        dtype = self._dtypes.get(typestr)
        if dtype is None:
            text = typestr.split(b"\0")[0].decode("ascii", "replace")
            try:
                dtype = np.dtype(text)
            except TypeError as error:
                raise ProtocolError(f"ezring slot has an invalid typestr {text!r}") from error
            if dtype.hasobject:
                raise ProtocolError(f"ezring slot typestr {text!r} is an object type")
            self._dtypes[typestr] = dtype
        return dtype

    def receive_nowait(self) -> RingFrame | None:
        """The next frame if one is committed, else ``None``; never waits.

        Raises :class:`ClosedResourceError` after :meth:`aclose` and
        :class:`ProtocolError` for a slot that does not describe its payload.
        """
        if self._closed:
            raise ClosedResourceError(f"this reader of ezring {self._name} is closed")
        m, h = self._m, self._header
        lost = 0
        while True:
            written = m.load(OFF_WRITE_SEQ)
            seq = self._next
            if seq > written:
                self.lost += lost
                return None
            offset = h.slot_table + ((seq - 1) % h.slot_count) * h.slot_stride
            if m.load(offset + S_SEQ) != seq:
                # Lapped: the slot already holds (or is being filled with) a later frame.
                # Resume at the oldest frame that cannot be in the writer's hands.
                resume = max(seq + 1, written - h.slot_count + 2)
                lost += resume - seq
                self._next = resume
                continue
            length, t_ns, typestr, ndim, meta_len = _SLOT.unpack_from(m.ro, offset + 8)
            if ndim > MAX_NDIM or meta_len > META_SIZE or length > h.slot_size:
                raise ProtocolError(f"ezring slot of frame {seq} has an invalid header")
            shape = struct.unpack_from(f"<{ndim}Q", m.ro, offset + S_SHAPE)
            dtype = self._dtype(typestr)
            count = 1
            for n in shape:
                count *= n
            if count * dtype.itemsize != length:
                raise ProtocolError(
                    f"ezring frame {seq}: shape {shape} of {dtype.str} is not {length} bytes"
                )
            meta = bytes(m.ro[offset + S_META : offset + S_META + meta_len]) if meta_len else b""
            data = np.frombuffer(m.ro, dtype, count, offset + SLOT_HEADER_SIZE)
            self._next = seq + 1
            if self._lossless:
                self._delivered = seq
                self._held[seq] = 1
                weakref.finalize(data, self._view_dropped, seq)
                array = data if ndim == 1 else data.reshape(shape)
            else:
                array = data.reshape(shape).copy()
                array.flags.writeable = False
                # Seqlock check: the slot still holds this frame after the copy.
                if m.load(offset + S_SEQ) != seq:
                    lost += 1
                    continue
                self._delivered = self._cursor = seq
                m.store(self._entry_offset + R_CURSOR, seq)
            self.lost += lost
            return RingFrame(seq, t_ns, array, meta, lost)

    def _writer_alive(self) -> bool:
        return locked_elsewhere(self._m.fd, 0)

    async def receive(self) -> RingFrame:
        """Wait for the next frame.

        Raises :class:`EndOfStream` once the writer closed the ring and every frame
        committed before has been received, :class:`BrokenResourceError` if the writer
        died (no close) and nothing more is committed, :class:`ClosedResourceError`
        after :meth:`aclose`. Cancellation-safe: a cancelled receive takes nothing.
        """
        while True:
            frame = self.receive_nowait()
            if frame is not None:
                return frame
            m = self._m
            if m.load(OFF_FLAGS) & FLAG_CLOSED:
                if self._next > m.load(OFF_WRITE_SEQ):
                    raise EndOfStream(f"ezring {self._name} was closed by its writer")
                continue
            if not self._writer_alive():
                if m.load(OFF_FLAGS) & FLAG_CLOSED or self._next <= m.load(OFF_WRITE_SEQ):
                    continue  # closed (or committed) just before it went
                raise BrokenResourceError(
                    f"the writer of ezring {self._name} (pid {self._header.writer_pid}) died"
                    " without closing it"
                )
            await self._wait()

    async def recv(self) -> npt.NDArray[Any]:
        """:meth:`receive`, returning only the read-only array."""
        return (await self.receive()).array

    async def _wait(self) -> None:
        # A bare future and call_later, not wait_for(Event.wait()): wait_for makes a task
        # per wait, which costs more than the rest of a frame's receive path together.
        loop = asyncio.get_running_loop()
        if not self._watching:
            assert self._sock is not None
            loop.add_reader(self._sock.fileno(), self._on_wake)
            self._watching = True
        waiter = self._waiter = loop.create_future()
        # A commit between our last look and the future's creation would have woken
        # nobody: look again now that the future is in place (the writer publishes
        # write_seq before it sends the datagram).
        if self._next <= self._m.load(OFF_WRITE_SEQ):
            self._waiter = None
            return
        timer = loop.call_later(EZRING_POLL_INTERVAL, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _on_wake(self) -> None:
        assert self._sock is not None
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                self._sock.recv(64)
        if self._waiter is not None:
            _wake(self._waiter)

    def __aiter__(self) -> RingReader:
        return self

    async def __anext__(self) -> RingFrame:
        try:
            return await self.receive()
        except EndOfStream:
            raise StopAsyncIteration from None

    # -- teardown -------------------------------------------------------------------

    async def aclose(self) -> None:
        """Unregister and unmap; idempotent. Views already handed out stay valid (the
        read-only mapping lives as long as they do), but their slots are released: the
        writer may overwrite them from now on."""
        self.close()

    def close(self) -> None:
        """Synchronous :meth:`aclose`."""
        if self._closed:
            return
        self._closed = True
        m = self._m
        if self._entry >= 0:
            base = self._entry_offset
            m.store(base + R_STATE, m.load(base + R_STATE) & ~0xFFFFFFFF)
        if self._sock is not None:
            if self._watching:
                with contextlib.suppress(RuntimeError):
                    asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
        m.close()

    async def __aenter__(self) -> RingReader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class RingInbound(Inbound):
    """A graph channel fed by a ring: one lossless :class:`RingReader` whose frames are
    delivered to a :class:`~ezflow._core._channel.Channel` as read-only numpy views.

    A slot is released when every subscriber has dropped the array (the view's
    lifetime), so slow subscribers make the ring's writer drop, never wait. The
    publish time handed to the channel is the slot's ``t_ns`` converted from
    CLOCK_MONOTONIC to ``time.time_ns()``.
    """

    transport = "ezring"

    def __init__(self, reader: RingReader, task: asyncio.Task[None]) -> None:
        """Private: use :func:`open_ring_channel`."""
        self._reader = reader
        self._task = task

    def close(self) -> None:
        """Stop feeding the channel and unregister the reader (idempotent)."""
        self._task.cancel()
        self._reader.close()


async def open_ring_channel(
    channel: Channel,
    ring: str,
    *,
    on_lost: Callable[[], None],
    created_ns: int | None = None,
) -> RingInbound:
    """Attach a reader to ring *ring* and feed *channel* from it until the writer closes
    or dies, or the inbound is closed. Raises as :meth:`RingReader.open`.

    The stream ends like any publisher's: after every frame committed before it, the
    channel ends (:meth:`Channel.end`; ``broken`` when the writer died without closing,
    or wrote a slot that does not describe its payload), one line is logged naming the
    ring and how it ended, and *on_lost* is called. A dead writer's file is removed at
    once (if its lock is free, as the sweeper would). Closing the inbound ends nothing.

    *created_ns*: the ``created_ns`` of the writer's ring the publisher stands for; a
    ring of another writer found under the name (the first one is gone, a new one took
    the name) is not read: the channel ends at once, broken, logged.
    """
    reader = await RingReader.open(ring)
    path = ring_path(ring)

    async def feed() -> None:
        frames = 0
        if created_ns is not None and reader.header.created_ns != created_ns:
            reader.close()
            log.warning(
                "ezring %s feeding topic %r: the writer it stood for is gone and pid %d"
                " made a new ring under the name: that stream ended (the new writer is"
                " another publisher)",
                ring,
                channel.topic,
                reader.header.writer_pid,
            )
            channel.end(broken=True)
            on_lost()
            return
        try:
            async for frame in reader:
                seq, array = frame.seq, frame.array
                sent_ns = frame.t_ns + time.time_ns() - time.monotonic_ns()
                del frame  # from here the subscribers hold the only references
                channel.deliver(seq, array, array.nbytes, 0, sent_ns)
                del array
                frames += 1
        except ClosedResourceError:
            return  # the inbound was closed: this process stopped listening
        except BrokenResourceError as error:
            log.warning(
                "ezring %s feeding topic %r ended after %d frames: %s",
                ring,
                channel.topic,
                frames,
                error,
            )
            channel.end(broken=True)
            # (In a thread: a sweep is file I/O, and the loop must not wait on it.)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(remove_ring_if_stale, path)
        except ProtocolError as error:
            log.error(
                "ezring %s feeding topic %r: stopped reading after %d frames: %s",
                ring,
                channel.topic,
                frames,
                error,
            )
            channel.end(broken=True)
        else:
            log.info(
                "ezring %s feeding topic %r ended after %d frames: its writer closed it",
                ring,
                channel.topic,
                frames,
            )
            channel.end()
        finally:
            reader.close()
        on_lost()

    task = asyncio.ensure_future(feed())
    return RingInbound(reader, task)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def ring_registration(name: str) -> tuple[str, dict[str, Any]]:
    """The topic in ring *name*'s header and the fields that register a publisher for
    the ring (``GraphContext.attach_ring``). Blocking file I/O; raises as
    :func:`read_ring_header`."""
    header = read_ring_header(name)
    return header.topic, {
        "transport": EzringTransport.name,  # shown by `ezflow graph`; routers read `ring`
        "ring": name,
        # This writer's ring: one that replaces it under the name is another stream.
        "ring_created": header.created_ns,
    }


class EzringTransport(Transport):
    """Channels fed by ezring rings: the one transport of a publisher that stands for a
    ring (``PublisherInfo.ring``). Each subscribing process on the host opens its own
    lossless reader (:func:`open_ring_channel`). Publishers of this process never go
    through it: a ring's writer is not an outlet."""

    name: ClassVar[str] = "ezring"
    exclusive: ClassVar[bool] = True
    unreachable: ClassVar[str] = "the publisher is not an ezring ring"

    def reaches(self, publisher: PublisherInfo, host_id: str) -> bool:
        return publisher.ring is not None

    def add_outlet(self, outlet: Outlet, options: Any = None) -> None:
        """Nothing to do: outlets are not written to rings."""

    def remove_outlet(self, outlet: Outlet) -> None:
        """Nothing to do: outlets are not written to rings."""

    async def open_channel(
        self, channel: Channel, publisher: PublisherInfo, *, on_lost: Callable[[], None]
    ) -> Inbound:
        if publisher.ring is None:
            raise BrokenResourceError(
                f"publisher {publisher.publisher_id} on topic {publisher.topic!r} is not an"
                " ezring ring"
            )
        return await open_ring_channel(
            channel, publisher.ring, created_ns=publisher.ring_created_ns, on_lost=on_lost
        )

    async def aclose(self) -> None:
        """Nothing to release: each channel's reader closes with its inbound."""
