"""``ezflow foxglove``: a running graph live in Foxglove (needs
``ezflow-pubsub[foxglove]``; docs/foxglove.md).

Two listeners in one process: the Foxglove WebSocket server (``--port``, the topics as
channels: ``ezflow/_foxglove/_server.py``) and a small HTTP page (``--http-port``, the
next port by default) with the graph's picture of ``ezflow graph --html``
(``_pictures.html``, refreshed every 2 s) and the link that opens the server in the
Foxglove app: the one URL the startup line prints. The SDK is imported when the command
runs, so ``ezflow --help`` works without the extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from .._core._auth import is_loopback
from .._core._config import (
    FOXGLOVE_DEFAULT_PORT,
    FOXGLOVE_GRAPH_INTERVAL,
    FOXGLOVE_NICE,
    format_address,
)
from .._core._exceptions import EzflowError
from .._graph._context import GraphContext
from . import _pictures
from ._connection import (
    AddressOption,
    errors,
    fail,
    graph_context,
    resolve_address,
    run_async,
    until_stopped,
)

__all__ = ["foxglove", "perf_foxglove", "picture_page"]

#: Bytes of an HTTP request the picture page reads at most (request line and headers).
_MAX_REQUEST = 8192
_REQUEST_TIMEOUT = 5.0


class _QuietViewers(logging.Filter):
    """Drops the SDK's error lines about a viewer that went away mid-message (a closed
    browser tab is not an error of the graph; one per message would flood stderr)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (
            text.startswith(("Error sending message to client", "Error receiving from client"))
        )


async def picture_page(context: GraphContext, address: str, app_url: str, ws_url: str) -> str:
    """The HTML page: the live picture of the graph (``ezflow graph --html``) under a
    line with the Foxglove link; it reloads itself every FOXGLOVE_GRAPH_INTERVAL s."""
    from ._inspect import _live_source, _Rings  # noqa: PLC0415 - one CLI module's helpers

    snapshot = await context.graph()
    try:
        telemetry = await context.graph_telemetry()
    except EzflowError:
        telemetry = {}
    snapshot.setdefault("clients", [])
    picture = _pictures.from_snapshot(
        snapshot,
        telemetry,
        title=f"graph server {snapshot.get('server_id', '?')} at {address}",
        source=_live_source(snapshot, telemetry),
        hidden_publishers=_Rings(snapshot).unread_ids,
    )
    page = _pictures.html(picture)
    link = (
        f'<p class="source">Live data: <a href="{html.escape(app_url)}">open {html.escape(ws_url)}'
        f" in Foxglove</a> (or in Foxglove's desktop app: Open connection, Foxglove "
        f"WebSocket, {html.escape(ws_url)}); graph picture on the topic /ezflow/graph "
        "too.</p>"
    )
    refresh = f'<meta http-equiv="refresh" content="{FOXGLOVE_GRAPH_INTERVAL:g}">'
    return page.replace("<head>", "<head>" + refresh, 1).replace("</h1>", "</h1>" + link, 1)


async def _serve_page(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    page: Any,
) -> None:
    status, body, kind = "404 Not Found", b"not found\n", "text/plain"
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _REQUEST_TIMEOUT)
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) == 3 and parts[0] in (b"GET", b"HEAD") and parts[1] in (b"/", b"/index.html"):
            status, body, kind = "200 OK", (await page()).encode(), "text/html; charset=utf-8"
        elif len(parts) != 3:
            status, body = "400 Bad Request", b"bad request\n"
        if parts and parts[0] == b"HEAD":
            body = b""
    except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, TimeoutError):
        status, body = "400 Bad Request", b"bad request\n"
    except EzflowError as exc:
        status, body = "503 Service Unavailable", f"the graph: {exc}\n".encode()
    with contextlib.suppress(OSError):
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def foxglove(
    *,
    address: AddressOption = None,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Interface the Foxglove server and the picture page listen on; loopback by "
            "default: viewers are not authenticated (docs/security.md).",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="The Foxglove WebSocket port (0: any)."),
    ] = FOXGLOVE_DEFAULT_PORT,
    http_port: Annotated[
        int | None,
        typer.Option(
            "--http-port",
            min=0,
            max=65535,
            help="The picture page's port (default: the next one after --port; 0: any).",
        ),
    ] = None,
    topics: Annotated[
        list[str] | None,
        typer.Option("--topic", help="Show only this topic (repeat for more; default: all)."),
    ] = None,
    cert: Annotated[
        Path | None,
        typer.Option("--cert", help="PEM certificate: serve wss:// only (with --key)."),
    ] = None,
    key: Annotated[Path | None, typer.Option("--key", help="PEM key of --cert.")] = None,
    nice: Annotated[
        int,
        typer.Option(
            "--nice",
            min=0,
            max=19,
            help="Lower this process's CPU priority by this much: on a busy host the graph "
            "gets the CPU first and the viewers get fewer messages (dropped, counted).",
        ),
    ] = FOXGLOVE_NICE,
    idle: Annotated[
        bool,
        typer.Option(
            "--idle/--no-idle",
            help="Run at the idle CPU priority (Linux SCHED_IDLE): the graph's processes get "
            "a core whenever they want one, the viewers get what is left. --no-idle (or a "
            "platform without it): --nice only.",
        ),
    ] = True,
) -> None:
    """Show a running graph live in Foxglove, until Ctrl-C.

    Every topic with a publisher becomes a Foxglove channel: image-shaped arrays as
    foxglove.RawImage (the Image panel), other numeric arrays and registered dataclasses,
    tuples and dicts as JSON (the Plot and Raw Messages panels); docs/foxglove.md has the
    table. A topic costs the graph nothing until a viewer subscribes to it; then one leaky
    subscriber feeds every viewer, so a slow viewer never slows the graph.

    The startup line prints one URL: a page with the graph's live picture and the link
    that opens this server in the Foxglove app.

    Examples:

        ezflow foxglove

        ezflow foxglove --port 9000 --topic /camera/raw --topic /imu
    """
    if (cert is None) != (key is None):
        fail("--cert and --key go together", 2)
    where = resolve_address(address)
    try:
        from .._foxglove._server import FoxgloveServer  # noqa: PLC0415
    except ImportError as exc:
        fail(f"ezflow foxglove needs the Foxglove SDK: pip install 'ezflow-pubsub[foxglove]' "
             f"({exc})", 2)  # fmt: skip
    try:
        tls = (cert.read_bytes(), key.read_bytes()) if cert is not None and key else (None, None)
    except OSError as exc:
        fail(f"cannot read the certificate or key: {exc}", 2)
    # The SDK logs through Python's logging (``foxglove.*`` loggers): the filter goes on
    # the handlers its records end in.
    for handler in (*logging.getLogger().handlers, logging.lastResort):
        if handler is not None:
            handler.addFilter(_QuietViewers())
    # Before the SDK starts its threads: they inherit both.
    if nice:
        with contextlib.suppress(OSError):  # (a platform without nice: same priority)
            os.nice(nice)
    if idle and hasattr(os, "SCHED_IDLE"):
        # A viewer is best-effort: a graph process that wakes takes the core at once,
        # where nice alone still gives this process a share and delays the wake-up.
        # Threads to come inherit it; those started at import (numpy's BLAS pool) are
        # set one by one.
        try:
            threads = [int(tid) for tid in os.listdir("/proc/self/task")]
        except OSError:
            threads = [0]
        for thread in threads:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
    if not is_loopback(host):
        errors.print(
            f"warning: serving on {host}: Foxglove viewers are not authenticated; anyone who "
            "reaches this port sees every topic (docs/security.md)",
            highlight=False,
            markup=False,
        )

    async def main() -> None:
        async with (
            graph_context(where, "ezflow foxglove") as context,
            FoxgloveServer(
                context, host=host, port=port, topics=topics, tls_cert=tls[0], tls_key=tls[1]
            ) as server,
        ):
            ws_url, app_url = server.url, server.app_url()
            graph = format_address(where)

            def page() -> Any:
                return picture_page(context, graph, app_url, ws_url)

            wanted = server.port + 1 if http_port is None else http_port
            try:
                page_server = await asyncio.start_server(
                    lambda r, w: _serve_page(r, w, page), host, min(wanted, 65535)
                )
            except OSError as exc:
                fail(f"cannot serve the picture page on {host}:{wanted}: {exc.strerror or exc} "
                     "(choose another with --http-port)", 1)  # fmt: skip
            bound = page_server.sockets[0].getsockname()[1]
            page_host = f"[{host}]" if ":" in host else host
            async with page_server:
                typer.echo(
                    f"Foxglove server {ws_url} for the graph at {graph}: open "
                    f"http://{page_host}:{bound}/ (the graph's picture, and the link that "
                    "opens it in Foxglove); Ctrl-C stops",
                )
                await until_stopped()
            shown = [s for s in server.statistics() if not s.skipped]
            skipped = [s for s in server.statistics() if s.skipped]
            for stats in shown:
                typer.echo(
                    f"{stats.topic}: {stats.schema}, {stats.sent} sent, {stats.dropped} "
                    f"dropped, {stats.held} held for busy viewers, {stats.mismatched} not "
                    "fitting its schema"
                )
            for stats in skipped:
                typer.echo(f"{stats.topic}: not shown ({stats.skipped})")

    run_async(main)


def perf_foxglove(
    *,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds of every cell.")] = 3,
    seconds: Annotated[
        float, typer.Option(min=0.5, help="Seconds of each phase (alone, watched).")
    ] = 4.0,
    mcap_messages: Annotated[
        int, typer.Option("--mcap-messages", min=16, help="1 MiB messages per MCAP write.")
    ] = 512,
    directory: Annotated[
        str, typer.Option("--dir", help="Where the MCAP files are written (a disk, not tmpfs).")
    ] = ".",
    viewer: Annotated[
        bool, typer.Option("--viewer/--no-viewer", help="Measure the viewer's cost.")
    ] = True,
    mcap: Annotated[bool, typer.Option("--mcap/--no-mcap", help="Measure MCAP writes.")] = True,
) -> None:
    """A Foxglove viewer's cost to the graph, and MCAP write speed (needs the foxglove
    extra).

    Viewer: CAMERA (3840x2160 RGB at 30 fps) and SIGNAL (1 kHz) in their own processes,
    SINK measuring msgs/s and p50 latency of both, `ezflow foxglove` next to them; each
    round measures SINK with no viewer and with a viewer reading both topics, in
    alternating order: medians of the rounds with their spread, and watched/alone.

    MCAP: 1 MiB frames written with no compression, lz4 and zstd, next to the disk's own
    write() floor and the mapping alone, in GB/s, each ending with fsync (docs/foxglove.md).
    """
    try:
        from .._foxglove import _mcap  # noqa: F401, PLC0415 - the extra, checked here
        from .._perf import _foxglove as bench  # noqa: PLC0415 - only this command
    except ImportError as exc:
        fail(f"perf foxglove needs the foxglove extra ({exc}): pip install "
              "'ezflow-pubsub[foxglove]'", 2)  # fmt: skip
    try:
        if viewer:
            bench.run(rounds, seconds)
        if mcap:
            bench.mcap_speed(rounds, mcap_messages, directory)
    except (bench.FoxgloveBenchError, OSError) as exc:
        fail(str(exc), 1)
