"""What every graph command shares: the ``--address`` option, the security options
(``--token-file``, ``--tls-cert``/``--tls-key``/``--tls-ca``), one-line errors, and
connecting to the graph server (never starting one).

The security options are the environment variables of the same meaning
(``EZFLOW_TOKEN_FILE``, ``EZFLOW_TLS_*``): :func:`apply_security` puts what was given
into this process's environment, so that every context it opens and every unit process
it starts (``ezflow run``) uses them; a token is never put on a command line.

Errors are one line on stderr and a non-zero exit, never a traceback: exit 1 when the
server is unreachable, a topic does not exist or the graph fails; exit 2 for a bad
option value (typer's own usage errors use 2 as well).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from .._core._auth import Credentials
from .._core._config import (
    ENV_GRAPH_ADDRESS,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_TOKEN_FILE,
    Address,
    format_address,
    graph_address_from_env,
    parse_address,
)
from .._core._exceptions import (
    AuthenticationError,
    BrokenResourceError,
    ClosedResourceError,
    ConfigurationError,
    EzflowError,
)
from .._core._loop import run_coroutine
from .._graph._client import GraphClient
from .._graph._context import GraphContext

__all__ = [
    "AddressOption",
    "TlsCaOption",
    "TlsCertOption",
    "TlsKeyOption",
    "TokenFileOption",
    "apply_security",
    "console",
    "errors",
    "fail",
    "graph_client",
    "graph_context",
    "import_module_or_file",
    "insecure_warning",
    "print_user_traceback",
    "resolve_address",
    "run_async",
    "unreachable",
    "until_stopped",
]

T = TypeVar("T")

#: stdout; wide when captured so that tables stay readable in files and tests.
console = Console() if sys.stdout.isatty() else Console(width=160)
#: stderr: one error, one line.
errors = Console(stderr=True, soft_wrap=True)

AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        "-a",
        metavar="HOST:PORT",
        envvar=ENV_GRAPH_ADDRESS,
        show_envvar=True,
        help="Graph server HOST:PORT (default 127.0.0.1:25990).",
        show_default=False,
    ),
]


TokenFileOption = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        metavar="FILE",
        envvar=ENV_TOKEN_FILE,
        show_envvar=True,
        help="File (mode 600) holding the graph's token; EZFLOW_TOKEN works too. "
        "See docs/security.md.",
        show_default=False,
    ),
]
TlsCertOption = Annotated[
    str | None,
    typer.Option(
        "--tls-cert",
        metavar="FILE",
        envvar=ENV_TLS_CERT,
        show_envvar=True,
        help="This process's TLS certificate (PEM); needs --tls-key and --tls-ca.",
        show_default=False,
    ),
]
TlsKeyOption = Annotated[
    str | None,
    typer.Option(
        "--tls-key",
        metavar="FILE",
        envvar=ENV_TLS_KEY,
        show_envvar=True,
        help="The private key of --tls-cert (PEM).",
        show_default=False,
    ),
]
TlsCaOption = Annotated[
    str | None,
    typer.Option(
        "--tls-ca",
        metavar="FILE",
        envvar=ENV_TLS_CA,
        show_envvar=True,
        help="The CA (PEM) that signed every certificate of the graph; peers are verified "
        "against it.",
        show_default=False,
    ),
]


def apply_security(
    token_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
) -> None:
    """Make the given security options this process's environment (inherited by the
    processes it starts), then check them: a token file that cannot be read, is not
    private or holds too short a token, or incomplete TLS settings exit with status 2."""
    for name, value in (
        (ENV_TOKEN_FILE, token_file),
        (ENV_TLS_CERT, tls_cert),
        (ENV_TLS_KEY, tls_key),
        (ENV_TLS_CA, tls_ca),
    ):
        if value:
            os.environ[name] = value
    try:
        Credentials.resolve()
    except ConfigurationError as exc:
        fail(str(exc), 2)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr and exit with *code* (no traceback)."""
    errors.print(f"[red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def resolve_address(text: str | None) -> Address:
    """``--address`` (or ``EZFLOW_GRAPH_ADDRESS``, which typer already applied), else
    the default; a malformed value exits with status 2."""
    try:
        return (
            graph_address_from_env() if text is None else parse_address(text, setting="--address")
        )
    except ConfigurationError as exc:
        fail(str(exc), 2)


def unreachable(address: Address, exc: BaseException) -> NoReturn:
    """Exit 1 saying that no graph server answers at *address*."""
    detail = "" if isinstance(exc, ConnectionRefusedError) else f" ({exc})"
    fail(
        f"no graph server answers at {format_address(address)}{detail}; start one with "
        f"`ezflow serve`, or point --address / {ENV_GRAPH_ADDRESS} at a running one"
    )


def import_module_or_file(
    where: str, option: str | None = None, *, packages: bool = False
) -> ModuleType:
    """Import *where*, a module name (``mypkg.messages``) or a file (``./msgs.py``,
    ``pkg/mod.py``), and return the module; exit with status 2 and one line naming
    *where* (and *option*, the command-line option it came from) and the reason when it
    cannot.

    A file is imported as the module named after it, its directory first on
    ``sys.path`` (so that unit processes and the file's own imports find it the same
    way) - or, with *packages*, as the module it is inside the packages around it
    (``pkg/mod.py`` next to a ``pkg/__init__.py`` is ``pkg.mod``, the directory above
    ``pkg`` first on ``sys.path``): the name its classes have where a program imports
    it. For a module name the current directory goes on ``sys.path``, as ``python -m``
    does. An error raised while importing prints its traceback (the user's frames
    only) before the one-line error.
    """
    label = where if option is None else f"{where} ({option})"
    path = None
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).resolve()
        if not path.is_file():
            fail(f"no such file: {label}", 2)
        if not path.stem.isidentifier():
            fail(f"{path.name}: the file name must be a valid module name ({label})", 2)
        root, parts = path.parent, [path.stem]
        while packages and (root / "__init__.py").is_file() and root.name.isidentifier():
            root, parts = root.parent, [root.name, *parts]
        module_name = ".".join(parts)
        sys.path.insert(0, str(root))
    else:
        module_name = where
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))  # as `python -m` does
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == module_name):
            print_user_traceback(exc)  # the error is in their code, not in the name
        fail(f"cannot import {label}: {type(exc).__name__}: {exc}", 2)
    if path is not None and Path(getattr(module, "__file__", "") or "").resolve() != path:
        fail(
            f"{label} is shadowed by another module named {module_name!r} "
            f"({getattr(module, '__file__', '?')}); rename the file",
            2,
        )
    return module


def print_user_traceback(exc: BaseException) -> None:
    """Print *exc*'s traceback on stderr with only the frames of the user's code: not
    ezflow's, not importlib's (a SyntaxError shows its file, line and caret)."""
    machinery = (str(Path(__file__).resolve().parents[1]), str(Path(importlib.__file__).parent))
    trace = traceback.TracebackException.from_exception(exc)

    def mine(frame: traceback.FrameSummary) -> bool:
        name = frame.filename
        return not (name.startswith(machinery) or name.startswith("<frozen importlib"))

    trace.stack = traceback.StackSummary.from_list([f for f in trace.stack if mine(f)])
    sys.stderr.write("".join(trace.format()))


def insecure_warning(address: Address) -> str:
    """The line ``ezflow top`` and ``ezflow graph`` show for a server that says in
    ``welcome`` that it runs insecure (``ezflow serve --insecure`` on a routable address)."""
    return (
        f"WARNING: the graph server at {format_address(address)} runs insecure (no token, "
        "on an address other than loopback): anyone who can reach it can read, inject and "
        "stop the graph (docs/security.md)"
    )


@contextlib.asynccontextmanager
async def graph_client(
    address: Address, name: str, on_lost: Callable[[BaseException | None], None] | None = None
) -> AsyncIterator[GraphClient]:
    """A bare graph-protocol client (no transports): for commands that only inspect.
    *on_lost* is called if the server closes the connection."""
    try:
        client = await GraphClient.connect(
            address,
            name=name,
            on_routes=lambda version, routes: None,
            on_lost=on_lost or (lambda exc: None),
        )
    except (AuthenticationError, ConfigurationError) as exc:
        fail(str(exc))
    except (OSError, EzflowError) as exc:
        unreachable(address, exc)
    try:
        yield client
    finally:
        client.close()


@contextlib.asynccontextmanager
async def graph_context(
    address: Address, name: str, *, telemetry: bool = False
) -> AsyncIterator[GraphContext]:
    """A GraphContext on a running server (never an embedded one), reporting no
    telemetry of its own unless *telemetry* (a command that moves data, like a bridge,
    is part of the graph: ``ezflow top`` shows its channels)."""
    context = GraphContext(
        address, auto_start=False, name=name, telemetry_interval=None if telemetry else 0
    )
    try:
        await context.start()
    except AuthenticationError as exc:
        fail(str(exc))
    except (OSError, BrokenResourceError, ClosedResourceError) as exc:
        unreachable(address, exc.__cause__ or exc)
    try:
        yield context
    finally:
        await context.aclose()


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a command's coroutine: Ctrl-C ends it quietly (exit 0), an ezflow error is
    one line and exit 1."""
    try:
        return run_coroutine(main())
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except (EzflowError, OSError) as exc:
        fail(str(exc))
    except asyncio.CancelledError:
        raise typer.Exit(0) from None


async def until_stopped() -> None:
    """Wait for Ctrl-C or SIGTERM (either ends the command cleanly, exit 0)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
