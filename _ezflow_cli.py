"""The ``ezflow`` command's entry point.

It lives outside the ``ezflow`` package so that importing ezflow and its command line
(a few tenths of a second) happens where a Ctrl-C can be caught: interrupted there, or
anywhere no command handles it, the command exits with status 130 and no traceback
(``python -m ezflow`` imports the package before any of its code runs: there, importing
ezflow itself is quiet, see ezflow/_core/_interrupts.py).
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        # Importing ezflow here is quiet on its own (ezflow/__init__.py); the command
        # line's own modules import next, under a latch that loses no Ctrl-C.
        from ezflow._core._interrupts import InterruptLatch  # noqa: PLC0415 - the point

        with InterruptLatch(KeyboardInterrupt).installed():
            from ezflow._cli._app import main as cli  # noqa: PLC0415 - the point

        cli()
    except KeyboardInterrupt:  # a Ctrl-C no command handled (while starting): quietly
        sys.exit(130)
