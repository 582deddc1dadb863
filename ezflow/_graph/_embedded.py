"""The embedded graph server: a :class:`~._server.GraphServer` in a daemon thread of the
process whose ``GraphContext`` found no server at its address (docs/architecture.md).

The thread runs its own event loop (:func:`~ezflow._core._loop.loop_factory`), so the
starting process's loop may block without holding up other clients. Starting fails as
binding does (``OSError``) and leaves no thread behind; stopping waits for the thread
at most ``EMBEDDED_SERVER_STOP_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading

from .._core._auth import TlsFiles, Token
from .._core._config import EMBEDDED_SERVER_STOP_TIMEOUT, Address
from .._core._loop import loop_factory
from ._server import GraphServer

__all__ = ["EmbeddedGraphServer"]

log = logging.getLogger("ezflow.server")


class EmbeddedGraphServer:
    """A :class:`GraphServer` in its own daemon thread, on its own event loop: what a
    ``GraphContext`` starts when no server answers at its address.

    Running apart from the starting process's loop means a blocking call there (a
    ``time.sleep``, a long computation holding no lock) does not hold up other clients'
    connects and requests. The thread is a daemon: when the process exits without
    :meth:`aclose`, the kernel closes the socket and other clients take over (see
    docs/architecture.md).
    """

    def __init__(
        self, address: Address, *, token: Token | None = None, tls: TlsFiles | None = None
    ) -> None:
        self._requested_address = address
        self._token = token
        self._tls = tls
        self._server: GraphServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._finished: concurrent.futures.Future[None] = concurrent.futures.Future()

    @property
    def server(self) -> GraphServer:
        """The graph server (it lives in another thread: read, do not call into it)."""
        if self._server is None:
            raise RuntimeError("the embedded graph server is not started")
        return self._server

    @property
    def address(self) -> Address:
        return self.server.address

    async def start(self) -> None:
        """Start the thread and bind. Raises ``OSError`` as :meth:`GraphServer.start`
        does (``EADDRINUSE`` when another process serves there already). When it
        fails or is cancelled, it returns only once the thread has ended (at most
        ``EMBEDDED_SERVER_STOP_TIMEOUT``), so no thread or socket is left behind."""
        if self._thread is not None:
            raise RuntimeError("an EmbeddedGraphServer can be started once")
        started: concurrent.futures.Future[GraphServer] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="ezflow-graph-server", daemon=True
        )
        self._thread.start()
        try:
            self._server = await asyncio.wrap_future(started)
        except BaseException:
            # Failed, or cancelled (then the thread sees the cancelled future once it
            # has bound, and closes): either way, wait for the thread to end.
            await self._join()
            raise

    async def _join(self) -> None:
        """Wait (at most ``EMBEDDED_SERVER_STOP_TIMEOUT``) until the thread has ended:
        not only its loop (``_finished``) but the thread itself, so that nothing of it
        is left running when this returns."""
        thread = self._thread
        try:
            if not self._finished.done():
                await asyncio.wait_for(
                    asyncio.shield(asyncio.wrap_future(self._finished)),
                    EMBEDDED_SERVER_STOP_TIMEOUT,
                )
            if thread is not None and thread.is_alive():
                # It set _finished as its very last statement: ending takes microseconds,
                # but joining blocks, so not on this loop.
                await asyncio.to_thread(thread.join, EMBEDDED_SERVER_STOP_TIMEOUT)
        except (TimeoutError, asyncio.TimeoutError):
            pass
        if not self._finished.done() or (thread is not None and thread.is_alive()):
            log.error(
                "the embedded graph server thread did not stop within %.0f s",
                EMBEDDED_SERVER_STOP_TIMEOUT,
            )

    def _run(self, started: concurrent.futures.Future[GraphServer]) -> None:
        try:
            loop = loop_factory()()
            try:
                loop.run_until_complete(self._serve(loop, started))
            finally:
                # As asyncio.run does: connection workers and sweeps still pending end
                # here, not as "Task was destroyed but it is pending" at exit.
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()
        except BaseException as exc:  # the loop could not even be made
            if not started.done() and not started.cancelled():
                started.set_exception(exc)
        finally:
            self._finished.set_result(None)

    async def _serve(
        self, loop: asyncio.AbstractEventLoop, started: concurrent.futures.Future[GraphServer]
    ) -> None:
        server = GraphServer(self._requested_address, token=self._token, tls=self._tls)
        server.embedded = True
        try:
            await server.start()
        except BaseException as exc:
            await server.aclose()
            if not started.cancelled():
                started.set_exception(exc)
            return
        self._loop = loop
        if not started.set_running_or_notify_cancel():
            await server.aclose()  # the starter was cancelled meanwhile
            return
        started.set_result(server)
        try:
            await server.serve_forever()  # until aclose() or a `shutdown` request
        finally:
            await server.aclose()

    def _request_stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return
        # RuntimeError: the loop is closed already, the thread has ended.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(server._closed.set)

    async def aclose(self) -> None:
        """Stop the server (every client is disconnected) and wait up to
        ``EMBEDDED_SERVER_STOP_TIMEOUT`` for its thread to end (logged if it does not).
        Idempotent; the stop is requested before the first await, so a cancelled
        ``aclose`` still stops the server."""
        self._request_stop()
        if self._thread is not None:
            await self._join()
