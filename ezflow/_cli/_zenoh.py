"""``ezflow zenoh router`` and ``ezflow zenoh bridge`` (needs ``ezflow[zenoh]``).

Zenoh is imported when a command runs, so ``ezflow --help`` works without the extra.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Annotated, Any

import typer

from .._core._config import ZENOH_QUEUE
from .._core._exceptions import ConfigurationError
from ._connection import (
    AddressOption,
    errors,
    fail,
    graph_context,
    resolve_address,
    run_async,
    until_stopped,
)

__all__ = ["app", "fleet_query"]

app = typer.Typer(
    help="ezflow across hosts on Eclipse Zenoh (pip install 'ezflow[zenoh]'; docs/fleets.md).",
    no_args_is_help=True,
)

DEFAULT_ROUTER_LISTEN = "tcp/127.0.0.1:7447"

ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="A Zenoh JSON5 configuration (TLS, access control); the options here override it.",
    ),
]


def _zenoh_modules() -> Any:
    try:
        from .. import zenoh as ezflow_zenoh  # noqa: PLC0415 - an optional extra
    except ImportError as exc:
        fail(str(exc), 2)
    return ezflow_zenoh


def _is_loopback(endpoint: str) -> bool:
    host = endpoint.split("/", 1)[-1].rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@app.command()
def router(
    listen: Annotated[
        list[str] | None,
        typer.Option("--listen", help=f"Endpoint to listen on (default {DEFAULT_ROUTER_LISTEN})."),
    ] = None,
    connect: Annotated[
        list[str] | None, typer.Option("--connect", help="Another router to connect to.")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """A Zenoh router in the foreground (zenoh-python in router mode), until Ctrl-C or
    SIGTERM.

    Bridges and fleet commands in client or peer mode connect to it. It listens on
    loopback unless told otherwise; on another address, secure it with a --config that
    enables TLS and access control (docs/security.md).

    Examples:

        ezflow zenoh router

        ezflow zenoh router --listen tcp/127.0.0.1:7448
    """
    zenoh_api = _zenoh_modules()
    endpoints = tuple(listen or [DEFAULT_ROUTER_LISTEN])
    if config is None and not all(_is_loopback(e) for e in endpoints):
        errors.print(
            "warning: this router is reachable from the network without TLS or access "
            "control: anyone who reaches it can read and publish every key. Give --config "
            "with TLS and ACL settings (docs/security.md).",
            highlight=False,
            markup=False,
        )
    try:
        settings = zenoh_api.ZenohSettings(
            mode="router", listen=endpoints, connect=tuple(connect or ()), config_file=config
        )
    except ConfigurationError as exc:
        fail(str(exc), 2)

    async def main() -> None:
        async with zenoh_api.open_session(settings) as session:
            typer.echo(f"zenoh router {session.zid()} listening on {', '.join(endpoints)}")
            await until_stopped()

    run_async(main)


def _pair(text: str, option: str) -> tuple[str, str | None]:
    left, sep, right = text.partition("=")
    if not left or (sep and not right):
        fail(f"{option} {text!r}: write SOURCE or SOURCE=DESTINATION", 2)
    return left, right or None


@app.command()
def bridge(  # noqa: PLR0917 - one parameter per command-line option
    connect: Annotated[
        list[str] | None, typer.Option("--connect", help="Zenoh endpoint (a router) to connect to.")
    ] = None,
    listen: Annotated[
        list[str] | None, typer.Option("--listen", help="Zenoh endpoint to listen on (peers).")
    ] = None,
    export: Annotated[
        list[str] | None,
        typer.Option(
            "--export",
            metavar="TOPIC[=KEY]",
            help="Publish TOPIC on Zenoh KEY ({host}: this host; default ezflow/{host}/TOPIC).",
        ),
    ] = None,
    import_: Annotated[
        list[str] | None,
        typer.Option(
            "--import",
            metavar="KEY=TOPIC",
            help="Publish Zenoh KEY (wildcards allowed: TOPIC is then a prefix) on TOPIC.",
        ),
    ] = None,
    lossless: Annotated[
        bool, typer.Option("--lossless", help="Every mapping lossless (default: leaky).")
    ] = False,
    queue: Annotated[
        int, typer.Option("--queue", min=1, help="Samples queued per end (docs/limits.md).")
    ] = ZENOH_QUEUE,
    mode: Annotated[str, typer.Option("--mode", help="peer or client.")] = "client",
    config: ConfigOption = None,
    fleet: Annotated[
        str | None,
        typer.Option(
            "--fleet",
            metavar="DOMAIN",
            help="Also announce this graph in fleet DOMAIN (ezflow graph/top --fleet).",
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option("--host", help="This host's name in keys (default: hostname).")
    ] = None,
    address: AddressOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")] = False,
) -> None:
    """Bridge topics of a running graph to and from Zenoh, until Ctrl-C or SIGTERM;
    then print one line, `stats {JSON}`: per mapping, what it carried and lost.

    Each --export publishes a topic of the graph at --address on Zenoh, each --import
    publishes a Zenoh key (wildcards allowed) on a topic there; --lossless makes every
    mapping lossless (docs/fleets.md: flow control and its limits).

    Examples:

        ezflow zenoh bridge --connect tcp/127.0.0.1:7447 --export /camera/raw

        ezflow zenoh bridge --connect tcp/127.0.0.1:7447 --import 'ezflow/*/camera/raw=/cams'

        ezflow zenoh bridge --connect tcp/127.0.0.1:7447 --fleet lab
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    zenoh_api = _zenoh_modules()
    if not export and not import_ and fleet is None:
        fail("nothing to bridge: give --export TOPIC, --import KEY=TOPIC or --fleet DOMAIN", 2)
    exports = []
    for text in export or []:
        topic, key = _pair(text, "--export")
        exports.append(zenoh_api.Export(topic, key, lossless=lossless, queue=queue))
    imports = []
    for text in import_ or []:
        source, destination = _pair(text, "--import")
        if destination is None:
            fail(f"--import {text!r}: write KEY=TOPIC", 2)
        imports.append(zenoh_api.Import(source, destination, lossless=lossless, queue=queue))
    try:
        settings = zenoh_api.ZenohSettings(
            mode=mode,
            connect=tuple(connect or ()),
            listen=tuple(listen or ()),
            config_file=config,
        )
    except ConfigurationError as exc:
        fail(str(exc), 2)
    where = resolve_address(address)

    async def main() -> None:
        async with (
            graph_context(where, "ezflow zenoh bridge", telemetry=True) as context,
            zenoh_api.ZenohBridge(
                context, settings, exports=exports, imports=imports, host=host, fleet=fleet
            ) as running,
        ):
            for export_ in running.exports:
                typer.echo(f"export {export_.topic} -> {running.export_key(export_)}")
            for import__ in running.imports:
                typer.echo(f"import {import__.key} -> {import__.topic}")
            if fleet is not None:
                typer.echo(f"fleet {fleet} as {running.host}")
            await until_stopped()
            await running.drain()  # within drain_timeout; counts what it cuts
            # What each mapping carried and lost, for the log and for scripts.
            typer.echo("stats " + json.dumps(running.summary()))

    run_async(main)


def fleet_query(domain: str, what: str, connect: list[str] | None, config: str | None) -> Any:
    """Every host's reply in fleet *domain* (``ezflow graph/top --fleet``), by host."""
    zenoh_api = _zenoh_modules()
    try:
        settings = zenoh_api.ZenohSettings(
            mode="client" if connect else "peer",
            connect=tuple(connect or ()),
            config_file=config,
        )
    except ConfigurationError as exc:
        fail(str(exc), 2)

    async def main() -> Any:
        async with zenoh_api.open_session(settings) as session:
            return await zenoh_api.query_fleet(session, domain, what)

    return run_async(main)
