"""A quiet Ctrl-C while a program imports ezflow.

Importing ezflow (numpy, msgpack, uvloop, ezflow's own modules) takes a few tenths of a
second; a Ctrl-C in that window would print a ``KeyboardInterrupt`` traceback through
the import machinery. While ``ezflow`` imports, :func:`quiet_while_importing` makes a
Ctrl-C exit the program with status 130 and no traceback — only in a program's main
thread, only when SIGINT has Python's default handler (the program set none of its
own), and never in an interactive session (where Ctrl-C must not end the session). The
previous handler is back once ezflow is imported; ``ezflow.run`` handles Ctrl-C itself
while it runs.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

__all__ = ["quiet_while_importing"]


def _interrupted(signum: int, frame: object) -> None:
    raise SystemExit(130)  # interrupted (as a shell says), no traceback


def quiet_while_importing() -> Callable[[], None]:
    """Install the quiet handler if it applies (see the module docstring); returns the
    function that puts the previous one back."""
    if sys.flags.interactive or hasattr(sys, "ps1"):
        return lambda: None
    try:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return lambda: None
        signal.signal(signal.SIGINT, _interrupted)
    except ValueError:  # not the main thread: signals are not ours to handle
        return lambda: None

    def restore() -> None:
        if signal.getsignal(signal.SIGINT) is _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    return restore
