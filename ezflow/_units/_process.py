"""Unit processes: the parent's handle on a child, and the child's entry point.

A child is forked by the fork server (``_forkserver``: a process that imported ezflow
and the program's modules once) or, with ``EZFLOW_START_METHOD=spawn``, started as
``python -c "...child_main()"``; either way it gets one end of a socket pair and nothing
else of the parent's. Over that private socket the parent sends a bootstrap (where the
graph server is, the pickled units, how to import the main script) and then
``start``/``stop`` (with the drain timeout) and ``hurry`` (stop draining now: a second
Ctrl-C); the child answers
``ready``, ``failed``, ``complete`` (a unit raised NormalTermination), ``units_done``
(every unit is done: the parent ends an ``end_when_done`` graph once every process
said so), ``cut`` (what the drain timeout cut) and ``done``. Frames are a 4-byte
length and a pickle — acceptable only because the socket is private to parent and
child (never a network socket).

Cleanup on every path: the child stops (every ``shutdown()`` runs) when told to, on
SIGTERM, and when the socket reaches EOF because the parent died. It starts in a session
of its own, so Ctrl-C in a terminal (SIGINT to the terminal's foreground process group)
never reaches it — not even while its interpreter is still importing — and is handled
once, by the parent, in order; it also ignores a SIGINT sent to it directly. The parent
kills a child that does not exit in time after ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import pickle
import signal
import socket
import struct
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .._core._codec import set_unknown_type_hook
from .._core._config import Address
from .._core._loop import run_coroutine
from .._graph._context import GraphContext
from ._component import Unit
from ._host import DrainCut, UnitHost
from ._mainthread import MainThreadGate, run_beside_main
from ._message_types import MessageTypes, UnresolvableMessageError
from ._tracebacks import describe

if TYPE_CHECKING:
    from ._forkserver import ForkedProcess, ForkServer

__all__ = [
    "ChildProcess",
    "child_main",
    "import_main",
    "importing_main",
    "main_is_imported",
    "preparation",
    "unit_process_main",
]

log = logging.getLogger("ezflow.units")

_HEADER = struct.Struct("!I")
#: Largest control frame (the bootstrap carries the pickled units and their settings).
MAX_CONTROL_FRAME = 256 * 1024 * 1024

_CHILD_CODE = "from ezflow._units._process import child_main; child_main()"

#: True while this (unit) process imports the parent's main script to find the classes
#: defined there: a graph started by that script's top-level code must not start here.
importing_main = False


def _failed(component: str, heading: str, exc: BaseException) -> dict[str, Any]:
    """The ``failed`` report of *exc*: *heading*, then the user's frames (``details``)
    or every frame (``full``)."""
    described = describe(exc)
    return {
        "op": "failed",
        "component": component,
        "details": f"{heading}\n{described.short}",
        "full": f"{heading}\n{described.full}",
    }


def _frame(message: dict[str, Any]) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_CONTROL_FRAME:
        raise ValueError(f"control message of {len(data)} bytes exceeds {MAX_CONTROL_FRAME}")
    return _HEADER.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next control message, or None at EOF (or on a broken frame)."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        if size > MAX_CONTROL_FRAME:
            return None
        message = pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        return None
    return message if isinstance(message, dict) else None


def preparation() -> dict[str, Any]:
    """What a child needs to import the classes the parent pickled: ``sys.path``, the
    working directory, and how the main module was started (for classes defined in a
    script, which are pickled as ``__main__.X``). It asks the file system
    (``os.getcwd``, ``os.path.abspath``): call it off the event loop
    (``asyncio.to_thread``)."""
    cwd = os.getcwd()
    data: dict[str, Any] = {"sys_path": [cwd if p == "" else p for p in sys.path], "dir": cwd}
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    main_file = getattr(main, "__file__", None)
    if spec_name:
        data["init_main_from_name"] = spec_name
    elif main_file:
        data["init_main_from_path"] = os.path.abspath(main_file)
    return data


class ChildProcess:
    """The parent's handle on one unit process."""

    def __init__(
        self,
        name: str,
        process: asyncio.subprocess.Process | ForkedProcess,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.name = name
        self.process = process
        self._reader = reader
        self._writer = writer
        self.ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.stop_requested = False
        self.killed_by_user = False  #: killed by a third Ctrl-C: no failure to report
        self.done = False
        self.units_done = False  #: every unit of the child is done
        self.cut = DrainCut()  #: what its drain timeout cut, as it reported
        self._listener: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    async def start(cls, name: str, bootstrap: dict[str, Any] | None = None) -> ChildProcess:
        """Start the child, and send it *bootstrap* if given (else :meth:`send` it
        later: the child starts its interpreter and imports ezflow meanwhile)."""
        parent_end, child_end = socket.socketpair()
        try:
            try:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    _CHILD_CODE,
                    str(child_end.fileno()),
                    name,
                    pass_fds=(child_end.fileno(),),
                    stdin=asyncio.subprocess.DEVNULL,
                    # Out of the terminal's process group: Ctrl-C is the parent's to
                    # handle, also while this interpreter starts (no traceback of an
                    # interrupted import). The parent's death reaches the child through
                    # its control socket, not through the terminal.
                    start_new_session=True,
                )
            finally:
                child_end.close()
            reader, writer = await asyncio.open_connection(sock=parent_end)
        except BaseException:
            parent_end.close()
            raise
        child = cls(name, process, reader, writer)
        if bootstrap is not None:
            child.send(bootstrap)
        return child

    @classmethod
    def fork(
        cls, name: str, server: ForkServer
    ) -> tuple[asyncio.Future[ForkedProcess], socket.socket]:
        """Ask *server* for the child: the future of its process, and the parent's end of
        its control socket (give both to :meth:`adopt`; close the socket if not)."""
        parent_end, child_end = socket.socketpair()
        try:
            forked = server.fork(name, child_end)
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        return forked, parent_end

    @classmethod
    async def adopt(
        cls, name: str, process: ForkedProcess, parent_end: socket.socket
    ) -> ChildProcess:
        """The handle on a child the fork server forked (see :meth:`fork`)."""
        try:
            reader, writer = await asyncio.open_connection(sock=parent_end)
        except BaseException:
            parent_end.close()
            raise
        return cls(name, process, reader, writer)

    def listen(
        self,
        on_failed: Callable[[ChildProcess, str, str, str], None],
        on_complete: Callable[[ChildProcess, str], None],
        on_units_done: Callable[[ChildProcess], None] | None = None,
    ) -> None:
        """Dispatch the child's reports until EOF."""

        async def listen() -> None:
            while True:
                message = await _read_frame(self._reader)
                if message is None:
                    break
                op = message.get("op")
                if op == "ready" and not self.ready.done():
                    self.ready.set_result(True)
                elif op == "failed":
                    details = str(message.get("details"))
                    full = str(message.get("full", details))
                    on_failed(self, str(message.get("component")), details, full)
                elif op == "complete":
                    on_complete(self, str(message.get("component")))
                elif op == "units_done":
                    self.units_done = True
                    if on_units_done is not None:
                        on_units_done(self)
                elif op == "cut":
                    self.cut = DrainCut(
                        int(message.get("queued", 0)), int(message.get("inputs", 0))
                    )
                elif op == "done":
                    self.done = True
            if not self.ready.done():
                self.ready.set_result(False)  # gone before it was ready

        self._listener = asyncio.ensure_future(listen())

    def send(self, message: dict[str, Any]) -> None:
        if not self._writer.is_closing():
            self._writer.write(_frame(message))

    def request_stop(self, drain_timeout: float = 0.0) -> None:
        """Tell the child to stop, draining for up to *drain_timeout* seconds."""
        self.stop_requested = True
        with contextlib.suppress(ConnectionError, OSError):
            self.send({"op": "stop", "drain": drain_timeout})

    def hurry(self) -> None:
        """Tell the stopping child to stop draining now (its ``shutdown()`` still runs)."""
        with contextlib.suppress(ConnectionError, OSError):
            self.send({"op": "hurry"})

    def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    async def wait_exit(self, timeout: float) -> bool:
        """Wait for the child to exit; kill it after *timeout*. Returns whether it
        exited by itself."""
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
            return True
        except (TimeoutError, asyncio.TimeoutError):
            self.kill()
            await self.process.wait()
            return False

    async def aclose(self) -> None:
        """Kill (if still running) and reap; close the socket. Cancellation-safe: the
        child is killed before any await."""
        self.kill()
        self._writer.close()
        if self._listener is not None:
            self._listener.cancel()
        await self.process.wait()
        if self._listener is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener


# -- the child side ------------------------------------------------------------------


_main_imported = False


def main_is_imported() -> None:
    """In a process forked from the program (the fork server): its ``__main__`` is the
    parent's main script already, so nothing imports it again (as ``__mp_main__``)."""
    global _main_imported
    _main_imported = True
    main = sys.modules.get("__main__")
    if main is not None:
        sys.modules.setdefault("__mp_main__", main)


def import_main(prep: dict[str, Any]) -> ModuleType:
    """:func:`_import_main`, for the fork server's preload: when it fails, a unit
    process tries again itself (and reports what fails, as without a fork server)."""
    global _main_imported
    try:
        return _import_main(prep)
    except BaseException:
        _main_imported = False
        raise


def _import_main(prep: dict[str, Any]) -> ModuleType:
    """Import the parent's main script as ``__mp_main__`` (like multiprocessing does;
    once) and return it. Raises :class:`UnresolvableMessageError` when the parent's
    ``__main__`` is neither a file nor an importable module."""
    global _main_imported, importing_main
    how = {k: v for k, v in prep.items() if k.startswith("init_main_from_")}
    if not _main_imported:
        _main_imported = True
        from multiprocessing import spawn  # noqa: PLC0415 - only for scripts

        importing_main = True
        try:
            spawn.prepare(how)
        finally:
            importing_main = False
    main = sys.modules.get("__mp_main__")
    if main is None:
        raise UnresolvableMessageError(
            "the parent's __main__ cannot be imported here (an interactive session, "
            "python -c, or a package's __main__)"
        )
    return main


class _Unpickler(pickle.Unpickler):
    """Imports the parent's main script only when a pickled class lives in ``__main__``."""

    def __init__(self, data: bytes, prep: dict[str, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._prep = prep

    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__" and not _main_imported:
            with contextlib.suppress(UnresolvableMessageError):
                _import_main(self._prep)
        return super().find_class(module, name)


def _read_blocking(sock: socket.socket) -> dict[str, Any]:
    def exactly(size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = sock.recv(min(size - len(chunks), 1 << 20))
            if not chunk:
                raise EOFError("the parent closed the control socket")
            chunks += chunk
        return bytes(chunks)

    (size,) = _HEADER.unpack(exactly(_HEADER.size))
    if size > MAX_CONTROL_FRAME:
        raise EOFError("oversized bootstrap")
    message = pickle.loads(exactly(size))
    if not isinstance(message, dict):
        raise EOFError("malformed bootstrap")
    return message


def child_main() -> None:
    """Entry point of a spawned unit process (``argv``: control socket fd, process name)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C, in order
    sys.exit(unit_process_main(int(sys.argv[1]), sys.argv[2]))


def unit_process_main(fd: int, name: str) -> int:
    """The unit process proper, on control socket *fd*: read the bootstrap, load the
    units, run them until told to stop (or the parent is gone); returns the exit code.
    SIGINT is ignored already (see the module docstring)."""
    sock = socket.socket(fileno=fd)
    try:
        boot = _read_blocking(sock)
    except (EOFError, OSError):
        return 1  # the parent is gone before we started: nothing to clean up
    if boot.get("op") == "stop":
        return 0  # the graph stopped before it sent us anything (it failed to start)
    prep = boot["prep"]
    sys.path[:] = prep["sys_path"]
    os.chdir(prep["dir"])
    try:
        units: list[Unit] = _Unpickler(boot["units"], prep).load()
    except BaseException as exc:
        heading = (
            f"while loading in process {name}: {exc!r}\n"
            "units placed in another process must be importable there: define their "
            "classes in a module, or in a script run as a file (python script.py)"
        )
        sock.sendall(_frame(_failed(name, heading, exc)))
        return 1
    # Before any unit runs: the parent's message classes, known here too.
    types = MessageTypes(boot.get("messages", {}), name, lambda: _import_main(prep))
    try:
        types.resolve_required()
    except UnresolvableMessageError as exc:
        sock.sendall(_frame({"op": "failed", "component": name, "details": str(exc)}))
        return 1
    types.resolve_imported()
    set_unknown_type_hook(types.on_unknown_type)
    main = _main_of(units)
    if main is None:
        return run_coroutine(_serve(sock, boot, units, None), loop=boot.get("loop"))
    gate = MainThreadGate()
    reporter: dict[str, Callable[[BaseException | None], None]] = {}
    return run_beside_main(
        _serve(sock, boot, units, (gate, reporter)),
        loop=boot.get("loop"),
        gate=gate,
        main=main,
        on_main_return=lambda exc: reporter["main_returned"](exc),  # noqa: PLW0108 - set later
        signals=(signal.SIGTERM,),
    )


def _main_of(units: list[Unit]) -> Callable[[], Any] | None:
    for unit in units:
        for fname, role in type(unit).functions().items():
            if role.kind == "main":
                method: Callable[[], Any] = getattr(unit, fname)
                return method
    return None


async def _serve(
    sock: socket.socket,
    boot: dict[str, Any],
    units: list[Unit],
    main: tuple[MainThreadGate, dict[str, Callable[[BaseException | None], None]]] | None,
) -> int:
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(sock=sock)
    started = asyncio.Event()
    stop = asyncio.Event()
    hurry = asyncio.Event()  # stop draining now (the parent's "hurry", or it is gone)
    # Drain timeout of the stop: the parent's, given with "stop"; for SIGTERM the one of
    # the bootstrap; none when the parent is gone.
    drain = {"timeout": float(boot.get("drain", 0.0))}
    hosts: list[UnitHost] = []

    def send(message: dict[str, Any]) -> None:
        if not writer.is_closing():
            writer.write(_frame(message))

    async def listen() -> None:
        while True:
            message = await _read_frame(reader)
            if message is None:
                drain["timeout"] = 0.0
                hurry.set()  # the parent is gone: stop now
                break
            if message.get("op") == "start":
                started.set()
            elif message.get("op") == "stop" and not stop.is_set():
                drain["timeout"] = float(message.get("drain", 0.0))
            elif message.get("op") == "hurry":  # a second Ctrl-C: stop draining
                hurry.set()
            if message.get("op") in ("stop", "hurry"):
                stop.set()
        stop.set()

    listener = asyncio.ensure_future(listen())
    if main is None:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    else:
        gate, reporter = main
        gate.on_signal = lambda: loop.call_soon_threadsafe(stop.set)
        main_path = next(
            u.path for u in units for r in type(u).functions().values() if r.kind == "main"
        )

        def main_returned(exc: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):
                for host in hosts:
                    loop.call_soon_threadsafe(host.main_finished)
            if exc is None:
                message = {"op": "complete", "component": main_path}
            else:
                message = _failed(main_path, "in @main:", exc)
            # A closed loop: the graph already stopped while @main was finishing.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(send, message)

        reporter["main_returned"] = main_returned
    code = 0
    address: Address = (str(boot["address"][0]), int(boot["address"][1]))
    try:
        async with GraphContext(address, auto_start=False, name=f"ezflow:{boot['name']}") as ctx:
            host = UnitHost(
                units,
                ctx,
                on_failure=lambda path, details, full: send(
                    {"op": "failed", "component": path, "details": details, "full": full}
                ),
                on_complete=lambda path: send({"op": "complete", "component": path}),
                check_types=bool(boot.get("check_types", False)),
                on_done=lambda: send({"op": "units_done"}),
                end_when_done=bool(boot.get("end_when_done", False)),
                external_inputs=frozenset(boot.get("external_inputs", ())),
            )
            hosts.append(host)
            try:
                await host.setup()
            except Exception:
                code = 1
            else:
                send({"op": "ready"})
                waiter = asyncio.ensure_future(started.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait((waiter, stopper), return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                # Started, even when the stop came right behind the start: what the
                # other processes published in between (a burst that ended the graph
                # at once) is the drain's to deliver, which only started input loops do.
                if started.is_set():
                    host.start()
                    if main is not None and not stop.is_set():
                        main[0].open()
                await stopper
            finally:
                cut = await host.stop(drain["timeout"] if started.is_set() else 0.0, hurry)
                if cut:
                    send({"op": "cut", "queued": cut.queued, "inputs": cut.inputs})
    except Exception as exc:
        send(_failed(boot["name"], f"in process {boot['name']}:", exc))
        code = 1
    finally:
        if main is not None:
            main[0].close()
        send({"op": "done"})
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()
        writer.close()
        listener.cancel()
    return code
