"""Zero-copy vectored writes on the stock asyncio event loop.

Python 3.11's selector transports join the parts of ``writelines`` into one ``bytes``
object and keep unsent data in a ``bytearray`` that they shift after every partial send:
two copies of every large message, 560-800 µs of publisher CPU per 1 MiB over tcp where
uvloop (whose ``writelines`` is vectored) spends 230-300 µs. :class:`VectoredWriter`
writes a connection's outgoing parts itself instead, with ``socket.sendmsg`` (at most
``IOV_MAX`` parts per call), and keeps what the kernel did not take as memoryview slices
of the caller's buffers: nothing is copied, whatever the size.

The transport keeps reading the socket; the writer works on a ``dup()`` of its file
descriptor (the loop refuses ``add_writer`` on a descriptor a transport owns), registered
with ``add_writer`` only while data waits. The two must never both write: the owner hands
every write to the writer from the moment it creates it (see
:class:`~ezflow._transports._stream_publish.PublisherConnection`) and closes the writer in
``connection_lost``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Protocol

__all__ = ["IOV_MAX", "VectoredWriter", "WriteHalf", "vectored_writes_pay"]

log = logging.getLogger("ezflow.stream")


def _iov_max() -> int:
    try:
        value = os.sysconf("SC_IOV_MAX")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not on Linux
        value = -1
    # POSIX guarantees at least 16 (_XOPEN_IOV_MAX); -1 means "no limit reported".
    return value if value >= 16 else 16


#: Parts per ``sendmsg`` call (the kernel refuses more with EMSGSIZE).
IOV_MAX = _iov_max()


class WriteHalf(Protocol):
    """The writing half of a transport: what a publisher's link writes through. Both
    ``asyncio.Transport`` and :class:`VectoredWriter` are one."""

    def write(self, data: bytes | memoryview, /) -> None: ...

    def writelines(self, list_of_data: list[bytes | memoryview], /) -> None: ...

    def is_closing(self) -> bool: ...

    def can_write_eof(self) -> bool: ...

    def write_eof(self) -> None: ...

    def get_write_buffer_size(self) -> int: ...


def vectored_writes_pay(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether a :class:`VectoredWriter` should write for *loop*'s socket transports:
    on the stock selector loop, whose ``writelines`` copies (not on uvloop, which does
    not, nor on loops without ``add_writer``)."""
    return isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop)


class VectoredWriter:
    """Writes byte parts to a stream socket that an asyncio transport reads.

    Contract:

    * parts are ``bytes`` or 1-D unsigned-byte memoryviews (``len`` is their size in
      bytes), written in the order given, none copied: a part's memory must not change
      until it is written (a publisher must not mutate a published message anyway);
    * the first write when nothing waits goes to the kernel at once; what it does not
      take is kept and written when the socket is writable;
    * above *high* unsent bytes, *pause* is called (once); when the backlog has drained
      to *high* // 4 bytes, *resume*. The writer itself never refuses data: the caller
      stops writing while paused (that is what bounds the backlog);
    * a send error (reset, broken pipe) closes the writer, drops what was unsent and
      calls *failed* with the error, once; nothing raises into the caller of
      :meth:`write` / :meth:`writelines`. Writes after :meth:`close`, after an error or
      after :meth:`write_eof` are ignored;
    * :meth:`write_eof` shuts down the sending side of the socket once everything
      queued before it is written;
    * :meth:`close` (idempotent) drops what is unsent and closes the duplicated
      descriptor; the owner calls it when the transport loses its connection.
    """

    __slots__ = (
        "_buffer",
        "_closed",
        "_eof",
        "_failed",
        "_high",
        "_loop",
        "_low",
        "_pause",
        "_paused",
        "_resume",
        "_size",
        "_sock",
        "_waiting",
        "partial_sends",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        *,
        high: int,
        pause: Callable[[], None],
        resume: Callable[[], None],
        failed: Callable[[OSError], None],
    ) -> None:
        """Duplicate *sock*'s descriptor (raises ``OSError`` when that fails, having
        opened nothing)."""
        fd = os.dup(sock.fileno())
        try:
            self._sock = socket.socket(sock.family, sock.type, sock.proto, fileno=fd)
            self._sock.setblocking(False)
        except BaseException:
            os.close(fd)
            raise
        self._loop = loop
        self._buffer: deque[bytes | memoryview] = deque()
        self._size = 0  # unsent bytes in _buffer
        self._waiting = False  # registered with add_writer
        self._eof = False
        self._closed = False
        self._paused = False
        self._high = high
        self._low = high // 4
        self._pause = pause
        self._resume = resume
        self._failed: Callable[[OSError], None] | None = failed
        #: writes the kernel did not take whole at once (the rest waited for writability)
        self.partial_sends = 0

    # -- the transport's writing interface ---------------------------------------------

    def write(self, data: bytes | memoryview) -> None:
        """Write one part (see the class contract)."""
        if self._closed or self._eof:
            return
        size = len(data)
        if self._size:
            self._buffer.append(data)
            self._queued(size)
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fail(exc)
            return
        if sent < size:
            self._buffer.append(memoryview(data)[sent:])
            self.partial_sends += 1
            self._queued(size - sent)

    def writelines(self, list_of_data: list[bytes | memoryview]) -> None:
        """Write the parts of *list_of_data* in order (see the class contract). The
        writer may keep the list itself: the caller must not reuse it."""
        if self._closed or self._eof:
            return
        if self._size:
            self._buffer.extend(list_of_data)
            self._queued(sum(map(len, list_of_data)))
            return
        if len(list_of_data) > IOV_MAX:
            self._buffer.extend(list_of_data)
            self._size = sum(map(len, list_of_data))
            self._drain()
            if self._size:
                self.partial_sends += 1
                self._queued(0)
            return
        try:
            sent = self._sock.sendmsg(list_of_data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fail(exc)
            return
        size = 0
        for index, part in enumerate(list_of_data):
            n = len(part)
            if sent < size + n:
                # The rest, from inside this part on, waits: sliced, not copied.
                rest = list_of_data[index + 1 :]
                self._buffer.append(memoryview(part)[sent - size :])
                self._buffer.extend(rest)
                self.partial_sends += 1
                self._queued(n - (sent - size) + sum(map(len, rest)))
                return
            size += n

    def is_closing(self) -> bool:
        """True once nothing more will be written (closed, failed or after EOF)."""
        return self._closed or self._eof

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        """Shut down the sending side once everything written before is sent."""
        if self._closed or self._eof:
            return
        self._eof = True
        if not self._size:
            self._shutdown()

    def get_write_buffer_size(self) -> int:
        """Bytes written but not yet handed to the kernel."""
        return self._size

    def close(self) -> None:
        """Drop what is unsent and close the duplicated descriptor (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._failed = None
        if self._waiting:
            self._waiting = False
            self._loop.remove_writer(self._sock.fileno())
        self._buffer.clear()
        self._size = 0
        self._sock.close()

    # -- internals -----------------------------------------------------------------------

    def _queued(self, nbytes: int) -> None:
        # Something waits for writability now (or more does).
        self._size += nbytes
        if not self._waiting:
            self._waiting = True
            self._loop.add_writer(self._sock.fileno(), self._drain)
        if not self._paused and self._size > self._high:
            self._paused = True
            self._pause()

    def _drain(self) -> None:
        # Writable (or called at once for a write of more than IOV_MAX parts): send
        # from the head of the buffer until the kernel takes less than offered.
        buffer = self._buffer
        while buffer:
            chunk = list(buffer) if len(buffer) <= IOV_MAX else list(islice(buffer, IOV_MAX))
            try:
                sent = self._sock.sendmsg(chunk)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._fail(exc)
                return
            self._size -= sent
            for part in chunk:
                n = len(part)
                if sent < n:
                    if sent:
                        buffer[0] = memoryview(part)[sent:]
                    break
                sent -= n
                buffer.popleft()
            else:
                continue  # the whole chunk went: more may follow
            break  # the kernel took less: wait for writability again
        if not buffer:
            if self._waiting:
                self._waiting = False
                self._loop.remove_writer(self._sock.fileno())
            if self._eof:
                self._shutdown()
        if self._paused and self._size <= self._low and not self._closed:
            self._paused = False
            self._resume()  # (last: it may write again, through this writer)

    def _shutdown(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        failed = self._failed
        log.debug("data connection write failed: %r", exc)
        self.close()
        if failed is not None:
            failed(exc)
