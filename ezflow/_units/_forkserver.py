"""The fork server: unit processes forked from a process that imported ezflow (and the
program's modules) once, instead of a fresh interpreter each (docs/architecture.md,
"Starting unit processes").

Where the fork server comes from
    :meth:`ForkServer.fork_here` forks it from the program itself, in :func:`ezflow.run`
    before the event loop exists, when the program runs no other Python thread: it is a
    copy of the program as it was when ``run()`` was called (ezflow, the script as
    ``__main__``, every module it imported), so a unit process forked from it imports
    nothing. Otherwise (a :class:`~ezflow.GraphRunner` on a running event loop, other
    threads) :meth:`ForkServer.spawn` starts it as a fresh interpreter, which imports
    ezflow and then, on a ``preload``, the modules of the units' classes — once for the
    whole graph, not once per process. ``EZFLOW_START_METHOD=spawn`` starts no fork
    server (a fresh interpreter per unit process, as before it existed).

What the fork server is
    A single-threaded loop (``select.poll``) that never runs an event loop: forking a
    process that runs threads or a loop copies their state half-way (held locks, a loop's
    selector and self-pipe). Before serving it leaves the terminal's session (Ctrl-C is
    the program's to handle), ignores SIGINT, reads stdin from ``/dev/null``, and
    replaces every socket it inherited from the program with ``/dev/null`` (the program's
    connections must not stay open in unit processes; the descriptor numbers stay taken,
    so a Python object still holding one fails instead of writing into a reused number).

The protocol
    One ``SOCK_SEQPACKET`` socket pair between the program and its fork server; one
    pickle per packet (acceptable only because the pair is private to the two
    processes). The program sends ``preload`` (spawned servers only: ``sys.path``, the
    working directory, how to import ``__main__``, module names) and ``fork`` (an id, the
    process name, and the unit's end of its control socket as ``SCM_RIGHTS``); the
    server answers ``forked`` (the id, the pid, and a pidfd of the unit process, so that
    the program can signal it without racing a reused pid) or ``fork_failed``, and
    ``exited`` (pid, return code as ``asyncio`` gives it: negative for a signal) when it
    reaped one: the unit processes are the fork server's children.

Lifetime
    Each unit process still dies with the program: its control socket's other end is in
    the program only, and the unit stops when it reads EOF (see ``_process``). The fork
    server ends when the program closes the pair (after every unit process was reaped),
    or when the program dies: then it waits ``FORKSERVER_ORPHAN_TIMEOUT`` seconds for its
    unit processes to stop by themselves and kills those that did not.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import logging
import os
import pickle
import select
import signal
import socket
import stat
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterable
from typing import Any, NoReturn

from .._core._config import FORKSERVER_ORPHAN_TIMEOUT, START_TIMEOUT
from .._transports import _segment
from . import _process

__all__ = ["ForkServer", "ForkedProcess", "server_main"]

log = logging.getLogger("ezflow.units")

#: Largest packet either side sends (the ``preload``: ``sys.path`` and module names).
_MAX_PACKET = 1 << 17

_SERVER_CODE = "from ezflow._units._forkserver import server_main; server_main()"


def _send(sock: socket.socket, message: dict[str, Any], fds: Iterable[int] = ()) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > _MAX_PACKET:
        raise ValueError(f"fork server message of {len(data)} bytes exceeds {_MAX_PACKET}")
    socket.send_fds(sock, [data], list(fds))


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next packet and the descriptors it carried; ``(None, [])`` at EOF or for a
    broken packet."""
    try:
        data, fds, flags, _ = socket.recv_fds(sock, _MAX_PACKET, 4)
    except (BlockingIOError, InterruptedError):
        raise
    except OSError:
        return None, []
    if not data or flags & getattr(socket, "MSG_TRUNC", 0):
        for fd in fds:
            os.close(fd)
        return None, []
    try:
        message = pickle.loads(data)
    except Exception:
        message = None
    if not isinstance(message, dict):
        for fd in fds:
            os.close(fd)
        return None, []
    return message, fds


def _flush_std_streams() -> None:
    """Before a fork: what Python buffered for stdout/stderr would be written twice."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()


def _fork() -> int:
    # Python 3.12+ warns about forking a process with several threads; the only ones
    # here are native pools that handle fork themselves (OpenBLAS's, started by
    # numpy): no Python thread runs (checked), and no event loop.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork")
        return os.fork()


# -- the program's side --------------------------------------------------------------


class ForkedProcess:
    """A unit process forked by the fork server: the part of ``asyncio``'s ``Process``
    that :class:`~ezflow._units._process.ChildProcess` uses (``pid``, ``returncode``,
    ``wait()``, ``kill()``). Its return code is the fork server's report (it reaped
    the process); ``kill`` signals through a pidfd, never a pid that may be reused."""

    def __init__(self, pid: int, pidfd: int, loop: asyncio.AbstractEventLoop) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self._watching = False

    async def wait(self) -> int:
        """Wait for the process to exit and return its return code (cancellation-safe)."""
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, signum: int) -> None:
        if self.returncode is None and self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def _ended(self, returncode: int) -> None:
        if self.returncode is not None:
            return
        self.returncode = returncode
        self._close_pidfd()
        if not self._exited.done():
            self._exited.set_result(returncode)

    def _close_pidfd(self) -> None:
        if self._pidfd >= 0:
            if self._watching:
                self._loop.remove_reader(self._pidfd)
                self._watching = False
            os.close(self._pidfd)
            self._pidfd = -1

    def _orphaned(self) -> None:
        """The fork server is gone before it reported this process: kill it, and count
        it ended (``-SIGKILL``) once its pidfd says it exited (its new parent reaps it)."""
        if self.returncode is not None:
            return
        if self._pidfd < 0:
            self._ended(-signal.SIGKILL)
            return
        self.kill()
        self._watching = True
        self._loop.add_reader(self._pidfd, self._ended, -signal.SIGKILL)


class ForkServer:
    """The program's handle on its fork server (see the module docstring). Create with
    :meth:`fork_here` (before an event loop runs) or :meth:`spawn`; :meth:`fork` on
    the event loop; :meth:`aclose` when every unit process was reaped (or
    :meth:`close_now` outside the loop)."""

    def __init__(self, sock: socket.socket, pid: int, how: str) -> None:
        self._sock = sock
        # Never blocks the event loop: packets are small, and the server reads them at
        # once (a full buffer fails the fork request instead).
        self._sock.setblocking(False)
        self.pid = pid  #: the fork server's pid
        self.how = how  #: "forked" (from the program) or "spawned" (a fresh interpreter)
        self._pidfd = os.pidfd_open(pid)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_id = 0
        self._pending: dict[int, tuple[str, asyncio.Future[ForkedProcess]]] = {}
        self._processes: dict[int, ForkedProcess] = {}
        self._lost = False
        self._closed = False

    # -- starting ----------------------------------------------------------------------

    @classmethod
    def fork_here(cls) -> ForkServer | None:
        """Fork the fork server from this process, now; None when that is not safe (a
        Python thread other than this one runs, this is not the main thread, or an
        event loop runs here) or fails."""
        if threading.current_thread() is not threading.main_thread():
            return None
        if threading.active_count() != 1:
            return None
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop()
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        _flush_std_streams()
        # SIGINT/SIGTERM blocked across the fork: one arriving before the fork server
        # ignores them must not run the program's handler there (pending signals are
        # not inherited; the program gets its own once unblocked).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            try:
                pid = _fork()
            except OSError as exc:
                log.debug("cannot fork the fork server (%r): unit processes spawn", exc)
                ours.close()
                theirs.close()
                return None
            if pid == 0:  # the fork server
                try:
                    ours.close()
                    _become_server(theirs, mask)
                finally:
                    os._exit(70)  # (_become_server never returns)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        theirs.close()
        return cls(ours, pid, "forked")

    @classmethod
    def spawn(cls) -> ForkServer:
        """Start the fork server as a fresh interpreter (in a session of its own, stdin
        from ``/dev/null``); it imports ezflow while the program goes on. Send it
        :meth:`preload` before the first :meth:`fork`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-c", _SERVER_CODE, "3"],
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3),
                ],
                setsid=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(ours, pid, "spawned")

    def preload(self, prep: dict[str, Any], modules: Iterable[str]) -> None:
        """Have a spawned fork server take the program's ``sys.path``, working directory
        and ``__main__`` (*prep*, from ``_process.preparation``) and import *modules*
        (``"__main__"``: the program's main script, as unit processes do)."""
        _send(self._sock, {"op": "preload", "prep": prep, "modules": sorted(set(modules))})

    # -- forking -----------------------------------------------------------------------

    def fork(self, name: str, control: socket.socket) -> asyncio.Future[ForkedProcess]:
        """Ask for unit process *name*, whose end of its control socket is *control*
        (sent, not closed: close it once this returned). The future gives the process,
        or raises ``OSError`` when the fork server could not fork or is gone."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self._sock.fileno(), self._readable)
        future: asyncio.Future[ForkedProcess] = loop.create_future()
        if self._lost or self._closed:
            future.set_exception(self._gone_error(name))
            return future
        self._next_id += 1
        self._pending[self._next_id] = (name, future)
        try:
            _send(self._sock, {"op": "fork", "id": self._next_id, "name": name}, [control.fileno()])
        except OSError as exc:
            del self._pending[self._next_id]
            future.set_exception(OSError(f"cannot ask the fork server for process {name}: {exc}"))
        return future

    def _gone_error(self, name: str) -> OSError:
        return OSError(
            f"the fork server (pid {self.pid}) is gone: process {name} cannot start "
            "(EZFLOW_START_METHOD=spawn starts unit processes without one)"
        )

    def _readable(self) -> None:
        try:
            message, fds = _receive(self._sock)
        except (BlockingIOError, InterruptedError):
            return
        if message is None:
            self._server_lost()
            return
        op = message.get("op")
        if op == "forked":
            pid = int(message["pid"])
            pidfd = fds.pop(0) if fds else -1
            assert self._loop is not None
            process = ForkedProcess(pid, pidfd, self._loop)
            self._processes[pid] = process
            _, future = self._pending.pop(int(message["id"]), ("", None))
            if future is not None and not future.done():
                future.set_result(process)
            # (else the start was cancelled: the process reads EOF on its control
            # socket, whose other end is closed, and exits; its report still comes.)
        elif op == "fork_failed":
            name, future = self._pending.pop(int(message["id"]), ("", None))
            if future is not None and not future.done():
                error = message.get("error")
                future.set_exception(OSError(f"the fork server could not fork {name}: {error}"))
        elif op == "exited":
            ended = self._processes.pop(int(message["pid"]), None)
            if ended is not None:
                ended._ended(int(message["returncode"]))
        for fd in fds:
            os.close(fd)

    def _server_lost(self) -> None:
        """The fork server is gone (or we close it): no more answers."""
        if self._loop is not None and not self._lost:
            self._loop.remove_reader(self._sock.fileno())
        self._lost = True
        pending, self._pending = self._pending, {}
        for name, future in pending.values():
            if not future.done():
                future.set_exception(self._gone_error(name))
        processes, self._processes = self._processes, {}
        for process in processes.values():
            process._orphaned()

    # -- closing -----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the fork server (after its unit processes were reaped: any still
        running is killed), and reap it; kill it if it has not exited within
        ``START_TIMEOUT`` seconds. Cancellation-safe: nothing is left running."""
        if self._closed:
            return
        self._closed = True
        self._server_lost()
        self._sock.close()
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(self._pidfd, readable)
        try:
            await asyncio.wait_for(exited, START_TIMEOUT)
        except (TimeoutError, asyncio.TimeoutError):
            log.warning("the fork server (pid %d) did not exit: killed", self.pid)
        finally:
            loop.remove_reader(self._pidfd)
            self._reap()

    def close_now(self, timeout: float = 5.0) -> None:
        """:meth:`aclose` without an event loop (what a run left behind, e.g. one
        interrupted before it started): close, wait up to *timeout*, kill, reap."""
        if self._closed:
            return
        self._closed = True
        self._lost = True
        for process in self._processes.values():
            process.kill()
        self._sock.close()
        with contextlib.suppress(OSError, InterruptedError):
            select.select([self._pidfd], [], [], timeout)
        self._reap()

    def _reap(self) -> None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)  # (exited: no effect)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            os.close(self._pidfd)


# -- the fork server's side ----------------------------------------------------------


def server_main() -> NoReturn:
    """Entry point of a spawned fork server (``argv[1]``: its socket's descriptor)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the program handles Ctrl-C
    sock = socket.socket(fileno=int(sys.argv[1]))
    _serve(sock)


def _become_server(sock: socket.socket, mask: Iterable[int]) -> NoReturn:
    """In the process just forked from the program: leave its session and its signal
    handling, drop the sockets it held, then serve."""
    os.setsid()  # out of the terminal's process group (and its Ctrl-C)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    _null_inherited(keep={sock.fileno()})
    # The program's script is __main__ here already: unit processes need not import it
    # again as __mp_main__ (as a spawned one must) to find the classes defined there.
    _process.main_is_imported()
    _serve(sock)


def _null_inherited(keep: set[int]) -> None:
    """stdin from ``/dev/null``, and every inherited socket but *keep* replaced by
    ``/dev/null`` (the number stays taken: see the module docstring)."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.dup2(null, 0)
        try:
            entries = os.listdir("/proc/self/fd")
        except OSError:
            return
        for entry in entries:
            fd = int(entry)
            if fd <= 2 or fd == null or fd in keep:
                continue
            try:
                is_socket = stat.S_ISSOCK(os.fstat(fd).st_mode)
            except OSError:
                continue  # (the listing's own descriptor, closed by now)
            if is_socket:
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _serve(sock: socket.socket) -> NoReturn:
    """Fork unit processes on request and report their exits, until the program closes
    the socket (or dies); then wait for the unit processes left, bounded, and exit."""
    sock.settimeout(5.0)  # sends only; a program that stops reading is treated as gone
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    children: dict[int, int] = {}  # pidfd -> pid
    program = True
    while program:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for fd, _ in events:
            if fd in children:
                _reap_child(sock, poller, children, fd, program)
            elif fd == sock.fileno():
                program = _handle(sock, poller, children)
    deadline = time.monotonic() + FORKSERVER_ORPHAN_TIMEOUT
    while children and time.monotonic() < deadline:
        with contextlib.suppress(InterruptedError):
            for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                if fd in children:
                    _reap_child(sock, poller, children, fd, False)
    for pidfd in list(children):
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        _reap_child(sock, poller, children, pidfd, False)
    os._exit(0)


def _reap_child(
    sock: socket.socket, poller: select.poll, children: dict[int, int], pidfd: int, tell: bool
) -> None:
    pid = children.pop(pidfd)
    poller.unregister(pidfd)
    os.close(pidfd)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return
    if tell:
        with contextlib.suppress(OSError):
            _send(
                sock, {"op": "exited", "pid": pid, "returncode": os.waitstatus_to_exitcode(status)}
            )


def _handle(sock: socket.socket, poller: select.poll, children: dict[int, int]) -> bool:
    """Handle one packet of the program; False once the program is gone."""
    try:
        message, fds = _receive(sock)
    except (BlockingIOError, InterruptedError):
        return True
    if message is None:
        return False
    try:
        op = message.get("op")
        if op == "preload":
            _preload(message)
        elif op == "fork" and fds:
            name = str(message.get("name"))
            try:
                _flush_std_streams()
                pid = _fork()
            except OSError as exc:
                _send(sock, {"op": "fork_failed", "id": message.get("id"), "error": repr(exc)})
                return True
            if pid == 0:
                _unit_process(sock, children, fds, name)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = pid
            poller.register(pidfd, select.POLLIN)
            _send(sock, {"op": "forked", "id": message.get("id"), "pid": pid}, [pidfd])
    except OSError:
        return False  # the program stopped reading: it is gone
    finally:
        for fd in fds:
            os.close(fd)
    return True


def _preload(message: dict[str, Any]) -> None:
    """Import what the unit processes will import (a spawned server): failures are
    left for the unit process, which reports them as it would without a fork server."""
    prep = message.get("prep") or {}
    if "sys_path" in prep:
        sys.path[:] = prep["sys_path"]
    with contextlib.suppress(OSError, KeyError):
        os.chdir(prep["dir"])
    for module in message.get("modules", ()):
        try:
            if module == "__main__":
                _process.import_main(prep)
            else:
                importlib.import_module(module)
        except BaseException as exc:  # (the unit process reports it properly)
            log.debug("fork server: preloading %s failed: %r", module, exc)


def _unit_process(
    sock: socket.socket, children: dict[int, int], fds: list[int], name: str
) -> NoReturn:
    """In a unit process just forked from the fork server: a session of its own, none
    of the server's descriptors, ``atexit`` handlers of its own (those registered before
    the fork belong to the program), then the unit process proper."""
    code = 1
    try:
        os.setsid()
        sock.close()
        for other in [*children, *fds[1:]]:
            os.close(other)
        atexit._clear()
        atexit.register(logging.shutdown)
        atexit.register(_segment._unlink_owned_at_exit)
        code = _process.unit_process_main(fds[0], name)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        _flush_std_streams()
        os._exit(code)
