"""``@main`` support: the event loop in a worker thread, a unit method in the main thread."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .._core._loop import run_coroutine
from ._errors import Complete, NormalTermination

__all__ = ["MainThreadGate", "run_beside_main"]

T = TypeVar("T")


class MainThreadGate:
    """Hand-over between the event loop thread and the main thread.

    The loop side calls :meth:`open` once the graph has started (or :meth:`close` when
    it will not start) and registers *request_stop*; the main thread runs the method
    and reports its end through *on_main_return*.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.run_main = False
        self.on_signal: Callable[[], object] | None = None

    def open(self) -> None:
        self.run_main = True
        self._event.set()

    def close(self) -> None:
        self._event.set()

    def wait(self) -> None:
        self._event.wait()


def run_beside_main(
    coro: Coroutine[Any, Any, T],
    *,
    loop: str | None,
    gate: MainThreadGate,
    main: Callable[[], Any],
    on_main_return: Callable[[BaseException | None], None],
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
) -> T:
    """Run *coro* on a new event loop in a worker thread and, once *gate* opens, call
    *main* in this (the main) thread; report how it ended with *on_main_return* (a
    :class:`Complete` or :class:`NormalTermination` counts as a normal return). SIGINT
    and SIGTERM call ``gate.on_signal`` while this runs. Returns what *coro* returned,
    or raises what it raised."""
    outcome: dict[str, Any] = {}

    def loop_thread() -> None:
        try:
            outcome["value"] = run_coroutine(coro, loop=loop)
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            gate.close()

    def on_signal(signum: int, frame: object) -> None:
        if gate.on_signal is not None:
            gate.on_signal()

    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    thread = threading.Thread(target=loop_thread, name="ezflow event loop")
    try:
        thread.start()
        gate.wait()
        if gate.run_main and thread.is_alive():
            try:
                main()
            except (Complete, NormalTermination):
                on_main_return(None)
            except BaseException as exc:
                on_main_return(exc)
            else:
                on_main_return(None)
        thread.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]
