"""``ezflow graph`` (tree, ``--mermaid``, ``--dot``, ``--json``) and ``ezflow topics``."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from .._core._config import format_address
from ._connection import (
    AddressOption,
    console,
    errors,
    fail,
    graph_client,
    insecure_warning,
    resolve_address,
    run_async,
)
from ._zenoh import FleetConfigOption, check_fleet_options

__all__ = ["dot", "fetch_graph", "graph", "mermaid", "topics"]


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


def _process_label(client: dict[str, Any]) -> str:
    return f"{client.get('name') or client['client_id']} (pid {client.get('pid')})"


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;")


def mermaid(snapshot: dict[str, Any]) -> str:
    """A mermaid flowchart: topics as boxes, topic -> topic edges as solid arrows,
    processes as rounded nodes with dotted arrows to the topics they publish and from
    the topics they subscribe to."""
    topic_ids = {topic: f"t{i}" for i, topic in enumerate(snapshot["topics"])}
    lines = ["flowchart LR"]
    for topic, node in topic_ids.items():
        lines.append(f'    {node}["{_mermaid_text(topic)}"]')
    for client in snapshot["clients"]:
        lines.append(f'    {client["client_id"]}(["{_mermaid_text(_process_label(client))}"])')
    for src, dst in snapshot["edges"]:
        lines.append(f"    {topic_ids[src]} --> {topic_ids[dst]}")
    for client_id, topic in _memberships(snapshot, "publishers"):
        lines.append(f"    {client_id} -. publishes .-> {topic_ids[topic]}")
    for client_id, topic in _memberships(snapshot, "subscribers"):
        lines.append(f"    {topic_ids[topic]} -. subscribes .-> {client_id}")
    return "\n".join(lines) + "\n"


def _memberships(snapshot: dict[str, Any], kind: str) -> list[tuple[str, str]]:
    """(client id, topic) of every publisher or subscriber (*kind*) of a known client,
    once per pair, in the snapshot's order."""
    clients = {c["client_id"] for c in snapshot["clients"]}
    pairs = ((entry["client_id"], entry["topic"]) for entry in snapshot[kind])
    return list(dict.fromkeys(pair for pair in pairs if pair[0] in clients))


def _dot_text(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dot(snapshot: dict[str, Any]) -> str:
    """The same picture as :func:`mermaid`, in Graphviz dot."""
    lines = ["digraph ezflow {", "    rankdir=LR;", "    node [fontname=Helvetica];"]
    for topic in snapshot["topics"]:
        lines.append(f"    {_dot_text(topic)} [shape=box];")
    for client in snapshot["clients"]:
        lines.append(
            f"    {_dot_text(client['client_id'])} "
            f"[label={_dot_text(_process_label(client))}, shape=ellipse, style=dashed];"
        )
    for src, dst in snapshot["edges"]:
        lines.append(f"    {_dot_text(src)} -> {_dot_text(dst)};")
    for client_id, topic in _memberships(snapshot, "publishers"):
        lines.append(f"    {_dot_text(client_id)} -> {_dot_text(topic)} [style=dotted];")
    for client_id, topic in _memberships(snapshot, "subscribers"):
        lines.append(f"    {_dot_text(topic)} -> {_dot_text(client_id)} [style=dotted];")
    lines.append("}")
    return "\n".join(lines) + "\n"


#: The client id the graph server gives the rings it registers itself (watch_rings).
RING_WATCHER = "rings"


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


def _ring_name(pub: dict[str, Any]) -> str:
    """A ring's name: the server's ``ring`` field when it sends one, else read from the
    id of a ring it registered itself (``p-ring-<name>-<writer>``), else its id."""
    if pub.get("ring"):
        return str(pub["ring"])
    found = re.fullmatch(r"p-ring-(.+)-[0-9a-f]+", pub["id"])
    return found.group(1) if found else pub["id"]


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
                    node.add(f"[green]ezring[/] {escape(_ring_name(pub))}")
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
            node.add(escape(f"{_ring_name(pub)} -> {pub['topic']} ({how})"))
        if rings.unread and not all_rings:
            count = len(rings.unread)
            node.add(
                f"[dim]{count} more ring{'s' if count > 1 else ''} of this user that no one "
                "in this graph reads (--all-rings lists them)[/]"
            )
    return root


def graph(  # noqa: PLR0917 - one parameter per command-line option
    address: AddressOption = None,
    as_mermaid: Annotated[
        bool, typer.Option("--mermaid", help="Print a mermaid flowchart instead.")
    ] = False,
    as_dot: Annotated[bool, typer.Option("--dot", help="Print Graphviz dot instead.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the server's view as JSON.")
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
    """Show topics, publishers, subscribers, edges and processes (or a diagram).

    The tree lists every topic with its publishers, subscribers and topic -> topic
    edges, then the processes connected to the graph server, then the ezring rings of
    the graph under their own heading: those a process of the graph attached
    (GraphContext.attach_ring) and those the graph server registered by itself that a
    subscriber or an edge of the graph reads. The server registers every live ring of
    its user (docs/ezring.md): the others are one line, counted (--all-rings lists
    them).

    Examples:

        ezflow graph

        ezflow graph --mermaid > graph.mmd

        ezflow graph --dot | dot -Tsvg > graph.svg

        ezflow graph --fleet lab --connect tcp/127.0.0.1:7447
    """
    if as_mermaid + as_dot + as_json > 1:
        fail("choose one of --mermaid, --dot and --json", 2)
    check_fleet_options(fleet, connect, config)
    if fleet is not None:
        if as_mermaid or as_dot:
            fail("--fleet shows a tree per host or --json", 2)
        _fleet_graph(fleet, connect, config, as_json)
        return
    where = resolve_address(address)
    snapshot = run_async(lambda: fetch_graph(where, "ezflow graph"))
    warning = insecure_warning(where) if snapshot["insecure"] else None
    if warning is not None and (as_mermaid or as_dot or as_json):
        errors.print(warning, highlight=False, markup=False)  # (stdout is for the format)
    if as_mermaid:
        typer.echo(mermaid(snapshot), nl=False)
    elif as_dot:
        typer.echo(dot(snapshot), nl=False)
    elif as_json:
        typer.echo(json.dumps(snapshot, indent=2))
    else:
        tree = _tree(snapshot, format_address(where), warning, all_rings=all_rings)
        console.print(tree, highlight=False)


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
