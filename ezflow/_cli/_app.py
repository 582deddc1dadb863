"""The root ``ezflow`` command and its entry point.

Each command group lives in its own module and is registered here with one
``app.add_typer(...)`` (or ``app.command()(...)``) line, so adding ``serve``, ``graph``,
``topics`` ... means one new module and one line below.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from typing import Annotated

import typer

from .._core._compiled import active_path
from .._core._config import DISTRIBUTION
from .._core._exceptions import EzflowError
from . import _echo, _foxglove, _inspect, _otel, _perf, _record, _run, _serve, _top, _trace, _zenoh
from ._connection import TlsCaOption, TlsCertOption, TlsKeyOption, TokenFileOption, apply_security
from ._style import RootGroup, plain

__all__ = ["app", "main"]

app = typer.Typer(
    name="ezflow",
    help="ezflow: asyncio message-channel pub/sub. Run a command with --help for details.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help and errors (ezflow/_cli/_style.py): no boxes, no markup, one style.
    rich_markup_mode=None,
    cls=RootGroup,
)


def _print_version(value: bool) -> None:
    if value:
        try:
            text = distribution_version(DISTRIBUTION)
        except PackageNotFoundError:  # run from a source tree that was never installed
            text = "unknown (not installed)"
        typer.echo(f"ezflow {text}")
        # (which codec path runs: the optional C extension, or pure Python)
        typer.echo(f"codec: {active_path()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print ezflow's version and exit.",
        ),
    ] = False,
    token_file: TokenFileOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
) -> None:
    """ezflow: asyncio message-channel pub/sub for numpy data.

    The security options apply to every command that connects (`ezflow --token-file F
    graph`); see docs/security.md.
    """
    apply_security(token_file, tls_cert, tls_key, tls_ca)


_perf.app.command("foxglove")(_foxglove.perf_foxglove)
app.add_typer(_perf.app, name="perf")
app.add_typer(_zenoh.app, name="zenoh")
app.command()(_serve.serve)
app.command()(_serve.shutdown)
app.command()(_run.run)
app.command()(_inspect.graph)
app.command()(_inspect.topics)
app.command()(_echo.echo)
app.command()(_echo.hz)
app.command()(_top.top)
app.command()(_trace.trace)
app.command()(_otel.otel)
app.command()(_foxglove.foxglove)
app.command()(_record.record)
app.command()(_record.replay)
plain(app)


def main() -> None:
    """Console-script entry point (``ezflow``, ``python -m ezflow``): clear one-line
    errors for what ezflow refuses, no traceback."""
    try:
        app()
    except EzflowError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
