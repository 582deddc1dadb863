"""``ezflow graph`` (tree, ``--mermaid``, ``--dot``, ``--json``) and ``ezflow topics``."""

from __future__ import annotations

import json
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


def _tree(snapshot: dict[str, Any], address: str, warning: str | None = None) -> Tree:
    label = f"[bold]graph server {snapshot.get('server_id', '?')}[/] at {address}"
    if warning is not None:
        label += f"\n[bold red]{escape(warning)}[/]"
    root = Tree(label)
    by_client = {c["client_id"]: c for c in snapshot["clients"]}
    topics = root.add(f"[bold]topics[/] ({len(snapshot['topics'])})")
    for topic in snapshot["topics"]:
        node = topics.add(f"[cyan]{escape(topic)}[/]")
        for pub in snapshot["publishers"]:
            if pub["topic"] == topic:
                owner = by_client.get(pub["client_id"])
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
) -> None:
    """Show topics, publishers, subscribers, edges and processes (or a diagram).

    The tree lists every topic with its publishers, subscribers and topic -> topic
    edges, then the processes connected to the graph server.

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
        console.print(_tree(snapshot, format_address(where), warning), highlight=False)


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
