"""The ``ezflow`` command's entry point.

It lives outside the ``ezflow`` package so that importing ezflow and its command line
(a few tenths of a second) happens where a Ctrl-C can be caught: interrupted there, the
command exits with status 130 and no traceback (``python -m ezflow`` imports the package
before any of its code runs, so it cannot do the same).
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from ezflow._cli._app import main as cli  # noqa: PLC0415 - the point of this module
    except KeyboardInterrupt:
        sys.exit(130)
    cli()
