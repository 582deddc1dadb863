"""``ezflow zenoh router`` and ``ezflow zenoh bridge`` (needs ``ezflow-pubsub[zenoh]``).

Zenoh is imported when a command runs, so ``ezflow --help`` works without the extra.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import typer

from .._core._auth import is_loopback
from .._core._config import ZENOH_LOSSLESS_QUEUE, ZENOH_QUEUE
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

__all__ = [
    "EXPORT_GRAMMAR",
    "IMPORT_GRAMMAR",
    "ConfigOption",
    "FleetConfigOption",
    "MappingSpec",
    "app",
    "check_fleet_options",
    "fleet_query",
    "parse_mapping",
]

# Help text is plain text (the root app sets rich_markup_mode=None): "[zenoh]" shows.
app = typer.Typer(
    help="ezflow across hosts on Eclipse Zenoh (pip install 'ezflow-pubsub[zenoh]'; "
    "docs/fleets.md).",
    no_args_is_help=True,
)

DEFAULT_ROUTER_LISTEN = "tcp/127.0.0.1:7447"

ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="A Zenoh JSON5 configuration (TLS, access control; docs/security.md); "
        "the options given here override its own.",
    ),
]

#: ``--config`` of ``ezflow graph --fleet`` and ``ezflow top --fleet``.
FleetConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="With --fleet: a Zenoh JSON5 configuration, as the bridges take (TLS to the "
        "router, its certificates; docs/security.md); --connect overrides its endpoints.",
    ),
]


def _zenoh_modules() -> Any:
    try:
        from .. import zenoh as ezflow_zenoh  # noqa: PLC0415 - an optional extra
    except ImportError as exc:
        fail(str(exc), 2)
    return ezflow_zenoh


def _is_loopback(endpoint: str) -> bool:
    return is_loopback(endpoint.split("/", 1)[-1].rsplit(":", 1)[0].strip("[]"))


@app.command()
def router(
    listen: Annotated[
        list[str] | None,
        typer.Option(
            "--listen",
            help=f"Endpoint to listen on (default: --config's, else {DEFAULT_ROUTER_LISTEN}).",
        ),
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
    from .._zenoh._session import endpoints as configured  # noqa: PLC0415 - with Zenoh
    from .._zenoh._session import session_config  # noqa: PLC0415 - with Zenoh

    try:
        endpoints = tuple(listen or ())
        if not endpoints and config is not None:  # the file's, if it names any
            file_settings = zenoh_api.ZenohSettings(mode="router", config_file=config)
            endpoints = tuple(configured(session_config(file_settings), "listen", "router") or ())
        endpoints = endpoints or (DEFAULT_ROUTER_LISTEN,)
        settings = zenoh_api.ZenohSettings(
            mode="router", listen=endpoints, connect=tuple(connect or ()), config_file=config
        )
    except ConfigurationError as exc:
        fail(str(exc), 2)
    if config is None and not all(_is_loopback(e) for e in endpoints):
        errors.print(
            "warning: this router is reachable from the network without TLS or access "
            "control: anyone who reaches it can read and publish every key. Give --config "
            "with TLS and ACL settings (docs/security.md).",
            highlight=False,
            markup=False,
        )

    async def main() -> None:
        async with zenoh_api.open_session(settings) as session:
            typer.echo(f"zenoh router {session.zid()} listening on {', '.join(endpoints)}")
            await until_stopped()

    run_async(main)


#: The grammar of a mapping, as errors and help show it.
EXPORT_GRAMMAR = "TOPIC[=KEY][:lossless[=N]|:leaky[=N]][:raw]"
IMPORT_GRAMMAR = "KEY[=TOPIC][:lossless[=N]|:leaky[=N]][:raw|:json]"
_ESCAPES = ", with '::' for a ':' and '==' for a '=' inside a topic or key"


@dataclass(frozen=True)
class MappingSpec:
    """One ``--export`` or ``--import`` as written: *source* and *destination* (None
    when not given), the mode (*lossless*: None when not given), the queue (None when
    not given) and the encoding (None when not given)."""

    source: str
    destination: str | None
    lossless: bool | None
    queue: int | None
    encoding: str | None


def parse_mapping(text: str, kind: Literal["export", "import"]) -> MappingSpec:
    """Parse an ``--export`` (``TOPIC[=KEY][:OPTION]...``) or ``--import``
    (``KEY[=TOPIC][:OPTION]...``) as :data:`EXPORT_GRAMMAR` / :data:`IMPORT_GRAMMAR`.

    Read left to right: ``::`` and ``==`` stand for a ``:`` and a ``=`` in a name; the
    first single ``=`` separates the two names (in a run of ``=``, the pairs come first:
    the second name cannot start with ``=``) and the first single ``:`` starts the
    options, ``:``-separated: a mode, ``lossless`` or ``leaky``, each optionally
    ``=N`` (its queue, N >= 1), and an encoding, ``raw`` (and for imports ``json``), at
    most one of each. Zenoh key expressions and ezflow topics may both hold ``=`` and
    ``:``, hence the doubling; neither may be empty. Raises ConfigurationError naming
    the spec, what is wrong and the grammar."""
    grammar = EXPORT_GRAMMAR if kind == "export" else IMPORT_GRAMMAR
    encodings = ("raw",) if kind == "export" else ("raw", "json")

    def bad(problem: str) -> ConfigurationError:
        return ConfigurationError(
            f"--{kind} {text!r}: {problem}. The form is --{kind} {grammar}{_ESCAPES}"
        )

    names, options = [""], []
    i = 0
    while i < len(text):
        char = text[i]
        if char in "=:" and text[i + 1 : i + 2] == char:  # '==' or '::': the character
            names[-1] += char
            i += 2
            continue
        if char == ":":
            options = text[i + 1 :].split(":")
            break
        if char == "=":
            if len(names) == 2:
                raise bad("a second single '=' (only one separates the two names)")
            names.append("")
        else:
            names[-1] += char
        i += 1
    first, second = ("TOPIC", "KEY") if kind == "export" else ("KEY", "TOPIC")
    if not names[0]:
        raise bad(f"{first} is empty")
    if len(names) == 2 and not names[1]:
        raise bad(f"{second} is empty after '='")
    lossless: bool | None = None
    queue: int | None = None
    encoding: str | None = None
    for option in options:
        word, sep, value = option.partition("=")
        if word in ("lossless", "leaky"):
            if lossless is not None:
                raise bad(f"two modes (':{'lossless' if lossless else 'leaky'}', ':{word}')")
            lossless = word == "lossless"
            if sep:
                if not (value.isascii() and value.isdigit()) or int(value) < 1:
                    raise bad(f"in ':{option}', the queue N must be a whole number >= 1")
                queue = int(value)
        elif word in encodings and not sep:
            if encoding is not None:
                raise bad(f"two encodings (':{encoding}', ':{word}')")
            encoding = word
        elif word == "json":
            raise bad("':json' is an import's encoding (an export takes ':raw')")
        else:
            raise bad(f"unknown option ':{option}'" if option else "an empty option")
    return MappingSpec(names[0], names[1] if len(names) == 2 else None, lossless, queue, encoding)


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
            metavar="TOPIC[=KEY][:OPTION]...",
            help="Publish TOPIC on Zenoh KEY ({host}: this host; default ezflow/{host}/ and "
            "TOPIC escaped: /camera/raw is ezflow/{host}/%/camera/raw). OPTION: lossless, "
            "leaky, lossless=N, leaky=N, raw.",
        ),
    ] = None,
    import_: Annotated[
        list[str] | None,
        typer.Option(
            "--import",
            metavar="KEY[=TOPIC][:OPTION]...",
            help="Publish Zenoh KEY (wildcards allowed: TOPIC is then a prefix, followed by "
            "the rest of each sample's key) on TOPIC (default: /KEY). OPTION: lossless, "
            "leaky, lossless=N, leaky=N, raw, json.",
        ),
    ] = None,
    lossless: Annotated[
        bool,
        typer.Option(
            "--lossless", help="Mappings that name no mode are lossless (default: leaky)."
        ),
    ] = False,
    queue: Annotated[
        int | None,
        typer.Option(
            "--queue",
            min=1,
            help=(
                "Where a mapping names no N: samples a leaky one queues per end (default "
                f"{ZENOH_QUEUE}), messages a lossless import lets in flight (its window; "
                f"default {ZENOH_LOSSLESS_QUEUE}) (docs/limits.md)."
            ),
        ),
    ] = None,
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

    Each --export publishes a topic of the graph at --address on a Zenoh key; each
    --import publishes the samples of a Zenoh key expression (wildcards allowed) on a
    topic there. A mapping may end in options: a mode, :lossless or :leaky, either with
    =N (its queue; default --queue), and an encoding, :raw (bytes as they are) or, for
    an import, :json. A mapping that names no mode is leaky, or lossless with
    --lossless, so one bridge serves both kinds. Inside a topic or key, write :: for a
    : and == for a =. docs/fleets.md has the rules and the flow control.

    Host robot1's /camera/raw goes out as ezflow/robot1/%/camera/raw (% is the empty
    chunk before the topic's leading /). A wildcard import puts each sample on its
    TOPIC followed by the rest of the sample's key, unescaped, empty chunks left out:
    ezflow/*/%/camera/raw=/cams gives /cams/robot1/camera/raw.

    Examples:

        ezflow zenoh bridge --connect tcp/127.0.0.1:7447 --export /camera/raw

        ezflow zenoh bridge --connect tcp/127.0.0.1:7447 --import 'ezflow/*/%/camera/raw=/cams'

        ezflow zenoh bridge --connect tcp/127.0.0.1:7447 \\
            --export /events:lossless --export /odometry:leaky=2

        ezflow zenoh bridge --connect tcp/127.0.0.1:7447 --fleet lab
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    zenoh_api = _zenoh_modules()
    from .._zenoh._keys import expand_host  # noqa: PLC0415 - with Zenoh

    if not export and not import_ and fleet is None:
        fail(
            f"nothing to bridge: give --export {EXPORT_GRAMMAR}, --import {IMPORT_GRAMMAR} "
            "or --fleet DOMAIN",
            2,
        )
    this_host = host or socket.gethostname()
    exports = []
    imports = []
    try:
        for text in export or []:
            spec = parse_mapping(text, "export")
            if spec.destination is not None:
                _check_key(text, expand_host(spec.destination, this_host), "export")
            exports.append(
                zenoh_api.Export(
                    spec.source,
                    spec.destination,
                    lossless=lossless if spec.lossless is None else spec.lossless,
                    queue=queue if spec.queue is None else spec.queue,
                    encoding=spec.encoding or "ezflow",
                )
            )
        for text in import_ or []:
            spec = parse_mapping(text, "import")
            key = expand_host(spec.source, this_host)
            _check_key(text, key, "import")
            imports.append(
                zenoh_api.Import(
                    spec.source,
                    _default_topic(key) if spec.destination is None else spec.destination,
                    lossless=lossless if spec.lossless is None else spec.lossless,
                    queue=queue if spec.queue is None else spec.queue,
                    encoding=spec.encoding or "ezflow",
                )
            )
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
                typer.echo(
                    f"export {export_.topic} -> {running.export_key(export_)} "
                    f"({_describe(export_, exported=True)})"
                )
            for import__ in running.imports:
                described = _describe(import__, exported=False)
                typer.echo(f"import {import__.key} -> {import__.topic} ({described})")
            if fleet is not None:
                typer.echo(f"fleet {fleet} as {running.host}")
            await until_stopped()
            await running.drain()  # within drain_timeout; counts what it cuts
            # What each mapping carried and lost, for the log and for scripts.
            typer.echo("stats " + json.dumps(running.summary()))

    run_async(main)


def _check_key(spec: str, key: str, kind: Literal["export", "import"]) -> None:
    """Exit 2 naming *spec* when Zenoh refuses its *key* (an export's has no wildcard)."""
    from .._zenoh._keys import check_key_expr  # noqa: PLC0415 - with Zenoh

    try:
        check_key_expr(key, wildcards=kind == "import")
    except ConfigurationError as exc:
        fail(f"--{kind} {spec!r}: {exc}", 2)


def _default_topic(key: str) -> str:
    """An import's topic when its spec names none: ``/`` and *key* (its literal prefix,
    for a wildcard key; the rest of each sample's key follows), unescaped."""
    from .._zenoh._keys import imported_topic, literal_prefix  # noqa: PLC0415 - with Zenoh

    literal = literal_prefix(key)
    return imported_topic("/", key if literal is None else literal, "")


def _describe(mapping: Any, *, exported: bool) -> str:
    """A mapping's mode, queue and encoding, as the bridge prints each at its start. (A
    lossless export has no queue: its importers' windows bound what it sends.)"""
    from .._zenoh._mapping import queue_of  # noqa: PLC0415 - with Zenoh

    kind = "lossless" if mapping.lossless else "leaky"
    if not (mapping.lossless and exported):
        kind += f", queue {queue_of(mapping.lossless, mapping.queue)}"
    return kind if mapping.encoding == "ezflow" else f"{kind}, {mapping.encoding}"


def fleet_query(domain: str, what: str, connect: list[str] | None, config: str | None) -> Any:
    """Every host's reply in fleet *domain* (``ezflow graph/top --fleet``), by host,
    asked as a Zenoh client through *connect* (or the connect endpoints of *config*, a
    Zenoh configuration file: TLS, access control)."""
    zenoh_api = _zenoh_modules()
    from .._zenoh._session import session_config  # noqa: PLC0415 - with Zenoh

    if not connect and config is None:
        fail("--fleet needs --connect ROUTER (or a --config FILE that gives connect/endpoints)", 2)
    try:
        settings = zenoh_api.ZenohSettings(
            mode="client", connect=tuple(connect or ()), config_file=config
        )
        session_config(settings)  # a file Zenoh refuses, or without an endpoint: said now
    except ConfigurationError as exc:
        fail(str(exc), 2)

    async def main() -> Any:
        async with zenoh_api.open_session(settings) as session:
            return await zenoh_api.query_fleet(session, domain, what)

    return run_async(main)


def check_fleet_options(fleet: str | None, connect: list[str] | None, config: str | None) -> None:
    """Exit 2 when --connect or --config are given without --fleet (they would be
    ignored: without --fleet the command asks the graph server at --address)."""
    if fleet is None and (connect or config is not None):
        given = [o for o, v in (("--connect", connect), ("--config", config)) if v]
        verb = "go" if len(given) == 2 else "goes"
        fail(
            f"{' and '.join(given)} {verb} with --fleet DOMAIN (a graph server is reached "
            "with --address)",
            2,
        )
