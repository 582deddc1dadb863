"""``ezflow graph`` (tree, ``--mermaid``, ``--dot``, ``--json``) and ``ezflow topics``."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from .._core._config import format_address
from .._core._exceptions import GraphError, ProtocolError
from .._core._telemetry import ProcessSnapshot
from .._units._errors import GraphDefinitionError
from .._units._plan import build_plan
from . import _pictures
from ._connection import (
    AddressOption,
    console,
    errors,
    fail,
    graph_client,
    insecure_warning,
    print_user_traceback,
    resolve_address,
    run_async,
)
from ._pictures import RING_WATCHER, process_label, ring_name
from ._zenoh import FleetConfigOption, check_fleet_options

__all__ = ["fetch_graph", "fetch_picture", "graph", "topics"]


async def fetch_graph(address: tuple[str, int], name: str) -> dict[str, Any]:
    """The graph server's view, without the client asking for it, and ``insecure``:
    whether the server said in ``welcome`` that it runs insecure."""
    async with graph_client(address, name) as client:
        reply = await client.request("graph")
        own = client.client_id
        insecure = client.server_insecure
    for key in ("op", "id", "ok"):
        reply.pop(key, None)
    reply["clients"] = [c for c in reply.get("clients", []) if c.get("client_id") != own]
    reply["insecure"] = insecure
    return reply


async def fetch_picture(
    address: tuple[str, int], name: str
) -> tuple[dict[str, Any], dict[str, ProcessSnapshot]]:
    """:func:`fetch_graph` and the telemetry of its processes (the rates and transports
    the picture's edges show), over one connection. A server that refuses telemetry or
    sends a malformed reply gives a picture without rates rather than none."""
    async with graph_client(address, name) as client:
        reply = await client.request("graph")
        own = client.client_id
        insecure = client.server_insecure
        telemetry: dict[str, ProcessSnapshot] = {}
        try:
            processes = (await client.request("telemetry")).get("processes")
            if isinstance(processes, dict):
                telemetry = {
                    str(cid): ProcessSnapshot.from_wire(data) for cid, data in processes.items()
                }
        except (GraphError, ProtocolError, ValueError, TypeError, KeyError):
            telemetry = {}
    for key in ("op", "id", "ok"):
        reply.pop(key, None)
    reply["clients"] = [c for c in reply.get("clients", []) if c.get("client_id") != own]
    reply["insecure"] = insecure
    return reply, telemetry


def _process_label(client: dict[str, Any]) -> str:
    return process_label(client)


class _Rings:
    """The ezring rings among a snapshot's publishers (transport ``ezring``): those
    *attached* by a client of this graph (``GraphContext.attach_ring``), and those the
    graph server registered by itself (its ring watcher registers every live ring of its
    user) - *read* when this graph has a subscriber of their topic or an edge from it,
    else *unread*: another program's rings, not part of this graph."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        clients = {c["client_id"] for c in snapshot["clients"]}
        subscribed = {s["topic"] for s in snapshot["subscribers"] if s["client_id"] in clients}
        sources = {src for src, _ in snapshot["edges"]}
        self.attached: list[dict[str, Any]] = []
        self.read: list[dict[str, Any]] = []
        self.unread: list[dict[str, Any]] = []
        for pub in snapshot["publishers"]:
            if pub.get("transport") != "ezring":
                continue
            if pub["client_id"] != RING_WATCHER:
                self.attached.append(pub)
            elif pub["topic"] in subscribed or pub["topic"] in sources:
                self.read.append(pub)
            else:
                self.unread.append(pub)
        self.unread_ids = {pub["id"] for pub in self.unread}


def _tree(
    snapshot: dict[str, Any],
    address: str,
    warning: str | None = None,
    *,
    all_rings: bool = False,
) -> Tree:
    """The graph as a tree: topics (with their publishers, subscribers and edges), edges,
    processes, rings. The rings of this user that no one in this graph reads (the
    server registers every live one) are left out of the topics and counted under
    rings, unless *all_rings*."""
    label = f"[bold]graph server {snapshot.get('server_id', '?')}[/] at {address}"
    if warning is not None:
        label += f"\n[bold red]{escape(warning)}[/]"
    root = Tree(label)
    by_client = {c["client_id"]: c for c in snapshot["clients"]}
    rings = _Rings(snapshot)
    hidden = set() if all_rings else rings.unread_ids
    shown_topics = [
        topic
        for topic in snapshot["topics"]
        if any(p["topic"] == topic and p["id"] not in hidden for p in snapshot["publishers"])
        or any(s["topic"] == topic for s in snapshot["subscribers"])
        or any(topic in edge for edge in snapshot["edges"])
    ]
    topics = root.add(f"[bold]topics[/] ({len(shown_topics)})")
    for topic in shown_topics:
        node = topics.add(f"[cyan]{escape(topic)}[/]")
        for pub in snapshot["publishers"]:
            if pub["topic"] == topic and pub["id"] not in hidden:
                owner = by_client.get(pub["client_id"])
                if pub.get("transport") == "ezring":
                    node.add(f"[green]ezring[/] {escape(ring_name(pub))}")
                    continue
                where = _process_label(owner) if owner else pub["client_id"]
                forced = f", transport {pub['transport']}" if pub.get("transport") else ""
                node.add(f"[green]publisher[/] {pub['id']} in {escape(where)}{forced}")
        for sub in snapshot["subscribers"]:
            if sub["topic"] == topic:
                owner = by_client.get(sub["client_id"])
                where = _process_label(owner) if owner else sub["client_id"]
                kind = "leaky " if sub.get("leaky") else ""
                node.add(f"[magenta]{kind}subscriber[/] {sub['id']} in {escape(where)}")
        for src, dst in snapshot["edges"]:
            if src == topic:
                node.add(f"[yellow]edge[/] -> {escape(dst)}")
    edges = root.add(f"[bold]edges[/] ({len(snapshot['edges'])})")
    for src, dst in snapshot["edges"]:
        edges.add(escape(f"{src} -> {dst}"))
    processes = root.add(f"[bold]processes[/] ({len(snapshot['clients'])})")
    for client in snapshot["clients"]:
        pubs = sum(1 for p in snapshot["publishers"] if p["client_id"] == client["client_id"])
        subs = sum(1 for s in snapshot["subscribers"] if s["client_id"] == client["client_id"])
        processes.add(
            escape(
                f"{client['client_id']}: {_process_label(client)} on "
                f"{client.get('hostname', '?')} - {pubs} publishers, {subs} subscribers"
            )
        )
    listed = rings.attached + rings.read + (rings.unread if all_rings else [])
    if listed or rings.unread:
        node = root.add(f"[bold]rings[/] ({len(listed)})")
        for pub in listed:
            owner = by_client.get(pub["client_id"])
            how = (
                f"attached by {_process_label(owner) if owner else pub['client_id']}"
                if pub["client_id"] != RING_WATCHER
                else "registered by the graph server"
                + ("" if pub["id"] not in rings.unread_ids else ", read by no one here")
            )
            node.add(escape(f"{ring_name(pub)} -> {pub['topic']} ({how})"))
        if rings.unread and not all_rings:
            count = len(rings.unread)
            node.add(
                f"[dim]{count} more ring{'s' if count > 1 else ''} of this user that no one "
                "in this graph reads (--all-rings lists them)[/]"
            )
    return root


def graph(  # noqa: PLR0917 - one parameter per command-line option
    target: Annotated[
        str | None,
        typer.Argument(
            metavar="[MODULE_OR_FILE:OBJECT]",
            help="Draw this graph definition (what `ezflow run` takes) without running it, "
            "instead of the graph running at --address.",
        ),
    ] = None,
    address: AddressOption = None,
    as_mermaid: Annotated[
        bool, typer.Option("--mermaid", help="Print a Mermaid flowchart (renders on GitHub).")
    ] = False,
    as_dot: Annotated[bool, typer.Option("--dot", help="Print Graphviz dot.")] = False,
    html_file: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="FILE",
            help="Write a self-contained HTML page with the picture (SVG) to FILE (-: stdout).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the server's view as JSON.")
    ] = False,
    settings: Annotated[
        bool,
        typer.Option(
            "--settings", help="Draw every unit's INPUT_SETTINGS stream too (hidden by default)."
        ),
    ] = False,
    fleet: Annotated[
        str | None,
        typer.Option(
            "--fleet",
            metavar="DOMAIN",
            help="Every host's graph in Zenoh fleet DOMAIN (ezflow-pubsub[zenoh]; docs/fleets.md).",
        ),
    ] = None,
    connect: Annotated[
        list[str] | None,
        typer.Option(
            "--connect",
            metavar="ENDPOINT",
            help="With --fleet: the Zenoh router to ask through.",
        ),
    ] = None,
    config: FleetConfigOption = None,
    all_rings: Annotated[
        bool,
        typer.Option(
            "--all-rings",
            help="List every ezring ring the graph server registered, also those no one "
            "in this graph reads.",
        ),
    ] = False,
) -> None:
    """Show the graph: a tree of its topics and processes, or a picture of its units.

    The tree lists every topic with its publishers, subscribers and topic -> topic
    edges, then the processes connected to the graph server, then the ezring rings of
    the graph under their own heading: those a process of the graph attached
    (GraphContext.attach_ring) and those the graph server registered by itself that a
    subscriber or an edge of the graph reads. The server registers every live ring of
    its user (docs/ezring.md): the others are one line, counted (--all-rings lists
    them).

    The pictures (--mermaid, --dot, --html FILE) draw the graph as it was written:
    units as nodes with their streams as ports, a cluster per process, data flowing
    left to right, each edge labelled with its transport and, on a running graph, its
    msgs/s over the last telemetry interval. INPUT_SETTINGS streams are left out
    unless --settings. Given MODULE_OR_FILE:OBJECT (what `ezflow run` takes), they
    draw that definition without running it: its units in the order written, the
    transports ezflow would choose (no rates).

    Examples:

        ezflow graph

        ezflow graph --mermaid > graph.mmd

        ezflow graph --dot | dot -Tsvg > graph.svg

        ezflow graph --html graph.html

        ezflow graph examples/signal_pipeline.py:graph --mermaid

        ezflow graph --fleet lab --connect tcp/127.0.0.1:7447
    """
    as_html = html_file is not None
    if as_mermaid + as_dot + as_json + as_html > 1:
        fail("choose one of --mermaid, --dot, --html and --json", 2)
    check_fleet_options(fleet, connect, config)
    if fleet is not None:
        if as_mermaid or as_dot or as_html or target is not None:
            fail("--fleet shows a tree per host or --json", 2)
        _fleet_graph(fleet, connect, config, as_json)
        return
    if target is not None:
        if as_json:
            fail("--json prints a running graph's view; draw a definition with --mermaid, "
                 "--dot or --html", 2)  # fmt: skip
        _draw(_definition(target, settings), as_mermaid, as_dot, html_file)
        return
    where = resolve_address(address)
    if as_mermaid or as_dot or as_html:
        snapshot, telemetry = run_async(lambda: fetch_picture(where, "ezflow graph"))
    else:
        snapshot, telemetry = run_async(lambda: fetch_graph(where, "ezflow graph")), {}
    warning = insecure_warning(where) if snapshot["insecure"] else None
    if warning is not None and (as_mermaid or as_dot or as_json or as_html):
        errors.print(warning, highlight=False, markup=False)  # (stdout is for the format)
    if as_json:
        typer.echo(json.dumps(snapshot, indent=2))
    elif as_mermaid or as_dot or as_html:
        hidden = () if all_rings else _Rings(snapshot).unread_ids
        picture = _pictures.from_snapshot(
            snapshot,
            telemetry,
            title=f"graph server {snapshot.get('server_id', '?')} at {format_address(where)}",
            source=_live_source(snapshot, telemetry),
            settings=settings,
            hidden_publishers=hidden,
        )
        _draw(picture, as_mermaid, as_dot, html_file)
    else:
        tree = _tree(snapshot, format_address(where), warning, all_rings=all_rings)
        console.print(tree, highlight=False)


def _live_source(snapshot: dict[str, Any], telemetry: dict[str, ProcessSnapshot]) -> str:
    processes = len(snapshot["clients"])
    when = max((snap.time for snap in telemetry.values()), default=None)
    rates = (
        "msg/s over the last telemetry interval, reported at "
        + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
        if when is not None
        else "no telemetry reported yet: transports as ezflow would choose them, no rates"
    )
    return f"running: {processes} process{'es' if processes != 1 else ''}; {rates}"


def _definition(target: str, settings: bool) -> _pictures.Picture:
    """The picture of the graph definition *target* (``MODULE_OR_FILE:OBJECT``), built
    and validated as ``ezflow run`` would, not run; exits 2 with one line when it
    cannot be loaded or is not a valid graph."""
    from ._run import load_graph, load_object  # noqa: PLC0415 - only for a definition

    name, obj = load_object(target)
    try:
        arguments = load_graph(name, obj)
        components = arguments["components"]
        if not isinstance(components, Mapping):
            raise GraphDefinitionError(
                f"{name}: components must be a mapping of names to components"
            )
        plan = build_plan(
            components,
            arguments.get("connections") or (),
            arguments.get("process_components") or (),
        )
    except GraphDefinitionError as exc:
        fail(str(exc), 2)
    except Exception as exc:  # raised by the graph's own code: configure(), network()...
        print_user_traceback(exc)
        fail(f"the graph could not be built: {type(exc).__name__}: {exc}", 2)
    return _pictures.from_plan(plan, target, settings=settings)


def _draw(picture: _pictures.Picture, as_mermaid: bool, as_dot: bool, html: Path | None) -> None:
    if as_mermaid:
        typer.echo(_pictures.mermaid(picture), nl=False)
    elif as_dot:
        typer.echo(_pictures.dot(picture), nl=False)
    elif html is not None:
        page = _pictures.html(picture)
        if str(html) == "-":
            typer.echo(page, nl=False)
            return
        try:
            html.write_text(page, encoding="utf-8")
        except OSError as exc:
            fail(f"cannot write {html}: {exc.strerror or exc}", 1)
        errors.print(f"wrote {html}", highlight=False, markup=False)
    else:
        typer.echo(_pictures.text(picture), nl=False)


def _fleet_graph(domain: str, connect: list[str] | None, config: str | None, as_json: bool) -> None:
    from .. import zenoh as ezflow_zenoh  # noqa: PLC0415 - Zenoh only when asked for
    from ._top import _print_silent  # noqa: PLC0415
    from ._zenoh import fleet_query  # noqa: PLC0415

    replies = fleet_query(domain, "graph", connect, config)
    graphs = {host: reply["graph"] for host, reply in sorted(replies.items())}
    if as_json:
        typer.echo(json.dumps(graphs, indent=2))
    elif not graphs:
        fail(f"no host of fleet {domain!r} answered (are its bridges started with --fleet?)")
    else:
        for host, snapshot in graphs.items():
            console.print(_tree(snapshot, f"host {host}"), highlight=False)
    _print_silent(ezflow_zenoh.silent_hosts(replies))  # (on stderr)


def topics(
    address: AddressOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """List the topics with their publishers, subscribers and edges.

    Examples:

        ezflow topics

        ezflow topics --json | jq '.[].topic'
    """
    where = resolve_address(address)
    snapshot = run_async(lambda: fetch_graph(where, "ezflow topics"))
    rows = [
        {
            "topic": topic,
            "publishers": sum(1 for p in snapshot["publishers"] if p["topic"] == topic),
            "subscribers": sum(1 for s in snapshot["subscribers"] if s["topic"] == topic),
            "to": [dst for src, dst in snapshot["edges"] if src == topic],
            "from": [src for src, dst in snapshot["edges"] if dst == topic],
        }
        for topic in snapshot["topics"]
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print(f"no topics on the graph server at {format_address(where)}")
        return
    table = Table("topic", "publishers", "subscribers", "edges to", "edges from")
    for row in rows:
        table.add_row(
            escape(row["topic"]),
            str(row["publishers"]),
            str(row["subscribers"]),
            escape(", ".join(row["to"])),
            escape(", ".join(row["from"])),
        )
    console.print(table)
