"""``ezflow serve`` (a standalone graph server in the foreground) and ``ezflow shutdown``."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
from typing import Annotated

import typer

from .._core._config import Address, format_address
from .._core._exceptions import (
    BrokenResourceError,
    ClosedResourceError,
    ConfigurationError,
    EzflowTimeoutError,
)
from .._graph._server import GraphServer
from ._connection import (
    AddressOption,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    TokenFileOption,
    apply_security,
    console,
    fail,
    graph_client,
    resolve_address,
    run_async,
)

__all__ = ["serve", "shutdown"]

#: Seconds ``ezflow shutdown`` waits for the server to close the connection.
SHUTDOWN_WAIT = 5.0


def serve(  # noqa: PLR0917 - one parameter per command-line option
    address: AddressOption = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            metavar="PORT",
            help="Also serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port).",
            min=0,
            max=65535,
        ),
    ] = None,
    token_file: TokenFileOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Serve a non-loopback address without a token (a trusted network only).",
        ),
    ] = False,
    watch_rings: Annotated[
        bool | None,
        typer.Option(
            "--watch-rings/--no-watch-rings",
            help="Register this user's live ezring rings as publishers by themselves "
            "(default: EZFLOW_WATCH_RINGS, else on).",
        ),
    ] = None,
) -> None:
    """Run a standalone graph server in the foreground.

    It runs until Ctrl-C, SIGTERM or `ezflow shutdown`. Processes on any host reach it
    with --address / EZFLOW_GRAPH_ADDRESS; it keeps the latest telemetry of each and
    serves it to `ezflow top` (and to Prometheus with --metrics-port). On an address
    other than loopback it requires a token (--token-file or EZFLOW_TOKEN) of every
    client unless --insecure is given, and with --insecure it starts with a WARNING line
    (and tells `ezflow top` and `ezflow graph`, which show it); see docs/security.md.

    Its log (stderr) holds warnings only; bad connections (garbage, failed tokens,
    malformed requests, clients declared dead...) take at most 5 lines per cause a
    minute, and one summary line a minute counts the rest (docs/security.md).

    Examples:

        ezflow serve

        ezflow serve --address 0.0.0.0:25990 --token-file ~/.ezflow-token
    """
    where = resolve_address(address)
    apply_security(token_file, tls_cert, tls_key, tls_ca)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )

    async def main() -> None:
        try:
            server = GraphServer(
                where, metrics_port=metrics_port, insecure=insecure, watch_rings=watch_rings
            )
        except ConfigurationError as exc:
            fail(str(exc), 2)
        try:
            await server.start()
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                fail(_address_in_use(where, metrics_port))
            fail(f"cannot listen on {format_address(where)}: {exc}")
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        metrics = server.metrics_address
        console.print(
            f"graph server {server.server_id} listening on {format_address(server.address)}"
            + (f", metrics at http://{format_address(metrics)}/metrics" if metrics else "")
            + "; Ctrl-C stops it",
            highlight=False,
        )
        stopper = asyncio.ensure_future(stop.wait())
        serving = asyncio.ensure_future(server.serve_forever())
        try:
            await asyncio.wait({stopper, serving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            serving.cancel()
            await server.aclose()
        console.print("graph server stopped", highlight=False)

    run_async(main)


def _taken(host: str, port: int) -> bool:
    """Whether binding *host*:*port* fails because it is in use (as the server binds:
    with SO_REUSEADDR, so a closing connection's port does not count)."""
    if port == 0:
        return False
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    except OSError as exc:
        return exc.errno == errno.EADDRINUSE
    return False


def _address_in_use(where: Address, metrics_port: int | None) -> str:
    """Why ``serve`` could not start, naming the port that is in use: the graph
    server's, or the metrics port (on the same host)."""
    host, port = where
    graph = format_address(where)
    if metrics_port is not None and not _taken(host, port) and _taken(host, metrics_port):
        return (
            f"cannot serve metrics on port {metrics_port} "
            f"({format_address((host, metrics_port))}): address in use; choose another "
            "--metrics-port (0 takes a free one)"
        )
    return (
        f"cannot listen on {graph}: address in use (a graph server running there already? "
        f"`ezflow shutdown --address {graph}` stops it; --address {host}:0 takes a free port)"
    )


def shutdown(
    address: AddressOption = None,
    token_file: TokenFileOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
) -> None:
    """Stop a graph server (every client is disconnected).

    Examples:

        ezflow shutdown

        ezflow shutdown --address 10.0.0.5:25990 --token-file ~/.ezflow-token
    """
    where = resolve_address(address)
    apply_security(token_file, tls_cert, tls_key, tls_ca)

    async def main() -> None:
        lost = asyncio.Event()
        async with graph_client(where, "ezflow shutdown", lambda exc: lost.set()) as client:
            with contextlib.suppress(BrokenResourceError, ClosedResourceError):
                await client.request("shutdown")  # it may go before answering: all the same
            try:
                await asyncio.wait_for(lost.wait(), SHUTDOWN_WAIT)
            except (TimeoutError, asyncio.TimeoutError):
                raise EzflowTimeoutError(
                    f"the graph server at {format_address(where)} accepted the shutdown "
                    f"but was still connected after {SHUTDOWN_WAIT:.0f} s"
                ) from None
        console.print(f"graph server at {format_address(where)} stopped", highlight=False)

    run_async(main)
