"""Ctrl-C that is never lost while a program starts.

Importing ezflow (numpy, msgpack, uvloop, ezflow's own modules) takes a few tenths of a
second; a Ctrl-C in that window would print a ``KeyboardInterrupt`` traceback through
the import machinery. While ``ezflow`` imports, :func:`quiet_while_importing` makes a
Ctrl-C exit the program with status 130 and no traceback — only in a program's main
thread, only when SIGINT has Python's default handler (the program set none of its
own), and never in an interactive session (where Ctrl-C must not end the session). The
previous handler is back once ezflow is imported; ``ezflow.run`` handles Ctrl-C itself
while it runs.

Python can lose a Ctrl-C: the exception a SIGINT handler raises is raised in whatever
Python code the main thread runs at that moment, and when that is a weakref callback or
a finalizer (importlib's module locks have one, so any import can be there), the
interpreter prints it as "Exception ignored" and goes on as if no Ctrl-C came. An
:class:`InterruptLatch` is a SIGINT handler that remembers: it raises as Python's own
handler does, and if that exception was swallowed, :meth:`InterruptLatch.restore`
raises it again, and the handler installed after it (``ezflow.run``'s) can take the
interrupt over (:func:`take_interrupt`). The swallowed exception prints nothing.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["InterruptLatch", "quiet_while_importing", "take_interrupt"]


class InterruptLatch:
    """A SIGINT handler that raises ``make()`` in the main thread and records that it
    did (see the module docstring). Install with :meth:`install` (or :meth:`installed`),
    put the previous handler back with :meth:`restore`."""

    def __init__(self, make: Callable[[], BaseException]) -> None:
        self._make = make
        #: A Ctrl-C came and nobody took it over yet (:meth:`take`).
        self.interrupted = False
        # The exceptions this latch raised, to recognise them when Python reports one it
        # swallowed (bounded: one per Ctrl-C, and a third Ctrl-C ends any program).
        self._raised: list[BaseException] = []
        self._previous: Any = None
        self._previous_hook: Callable[[Any], object] | None = None
        self._installed = False

    def __call__(self, signum: int, frame: object) -> None:
        self.interrupted = True
        exception = self._make()
        if len(self._raised) < 8:
            self._raised.append(exception)
        raise exception

    def _unraisable(self, unraisable: Any) -> None:
        if any(unraisable.exc_value is raised for raised in self._raised):
            return  # a Ctrl-C some finalizer swallowed: restore() raises it again
        hook = self._previous_hook or sys.__unraisablehook__
        hook(unraisable)

    def install(self) -> bool:
        """Become the SIGINT handler if it applies: in the main thread, when SIGINT has
        Python's default handler, outside an interactive session. Returns whether it
        did (when not, :meth:`restore` does nothing)."""
        if sys.flags.interactive or hasattr(sys, "ps1"):
            return False
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                return False
            self._previous = signal.signal(signal.SIGINT, self)
        except ValueError:  # signals are not this interpreter's to handle
            return False
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        self._installed = True
        return True

    def take(self) -> bool:
        """Whether a Ctrl-C came that nobody took over yet; it is now the caller's."""
        interrupted, self.interrupted = self.interrupted, False
        return interrupted

    def restore(self) -> None:
        """Put the previous handler back (if this one is still installed). Raises
        ``make()`` when a Ctrl-C came that nobody took over: it was swallowed, or the
        caller caught it and left the rest to this method."""
        if not self._installed:
            return
        self._installed = False
        previous = self._previous
        with contextlib.suppress(ValueError):
            if signal.getsignal(signal.SIGINT) is self:
                signal.signal(signal.SIGINT, previous)
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._previous_hook or sys.__unraisablehook__
        if self.take():
            raise self._make()

    @contextlib.contextmanager
    def installed(self) -> Iterator[InterruptLatch]:
        """Installed while the block runs; leaving it restores (and raises a Ctrl-C
        that nobody took over)."""
        self.install()
        try:
            yield self
        finally:
            self.restore()


def take_interrupt(handler: object) -> bool:
    """Whether *handler* (a SIGINT handler being replaced) is an :class:`InterruptLatch`
    holding a Ctrl-C nobody took over; the caller takes it over."""
    return isinstance(handler, InterruptLatch) and handler.take()


def quiet_while_importing() -> Callable[[], None]:
    """Install a latch that ends the program with status 130 and no traceback, if it
    applies (see the module docstring); returns the function that puts the previous
    handler back (and exits 130 if a Ctrl-C came and was swallowed)."""
    latch = InterruptLatch(lambda: SystemExit(130))  # interrupted, as a shell says
    return latch.restore if latch.install() else (lambda: None)
