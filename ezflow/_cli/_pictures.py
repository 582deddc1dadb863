"""Pictures of a graph as its author wrote it (``ezflow graph --mermaid | --dot | --html``).

One model, :class:`Picture`, built either from a running graph (the graph server's
snapshot, with its telemetry for the live rates: :func:`from_snapshot`) or from a
definition that is not running (:func:`from_plan`), and drawn three ways:

* units are nodes, their streams ports (inputs left, outputs right), each process a
  cluster, data flowing left to right;
* each edge says its transport (``local``, ``shm``, ``tcp``: what the channel reports,
  else what ezflow would choose) and, on a running graph, its msgs/s over the last
  telemetry interval;
* every unit's ``INPUT_SETTINGS`` is left out unless asked (``settings=True``);
* topics that are no unit's stream (a plain topic name in a connection, a program of
  the low-level API) are nodes of their own, programs of the low-level API one node
  per process, and ezring rings nodes under their own heading, ``rings``.

A running graph does not say which unit wrote which topic: a unit is a path ``P``
whose process subscribes to ``P/INPUT_SETTINGS`` (every unit does), its streams the
topics ``P/NAME`` its process publishes or subscribes. Its units are in data-flow
order (ties: the order the processes registered them); a definition's are in the order
written (:attr:`~ezflow._units._plan.Plan.units`).

Formats: :func:`mermaid` (renders on GitHub), :func:`dot` (Graphviz, HTML-like labels
with ports) and :func:`html` (one self-contained page, an inline SVG laid out here: no
script, no network resource).

Size: one model and its four drawings (Mermaid, DOT, text, and an SVG/HTML page with a
layout of its own), which read the model's nodes, ports and edges the same way; if it
grows, the drawings split from the model (``from_plan``/``from_snapshot``/``ranks``).
"""

from __future__ import annotations

import html as _html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._core._telemetry import ProcessSnapshot
from .._units._plan import MAIN_PROCESS, Plan, stream_topic

__all__ = [
    "RING_WATCHER",
    "SETTINGS_STREAM",
    "Edge",
    "Node",
    "Picture",
    "dot",
    "from_plan",
    "from_snapshot",
    "html",
    "mermaid",
    "process_label",
    "ring_name",
    "svg",
    "text",
]

#: The stream every unit has for settings updates: hidden unless asked.
SETTINGS_STREAM = "INPUT_SETTINGS"
#: The client id of the rings the graph server registers itself (its ring watcher).
RING_WATCHER = "rings"
#: The cluster key of the rings' heading.
RINGS = "\x00rings"
#: The lane of the SVG for the nodes outside any cluster (topics).
_TOPICS = "\x00topics"


@dataclass
class Node:
    """A box of the picture: a unit (ports: its streams), a topic that is no unit's
    stream, a process of the low-level API, or an ezring ring."""

    id: str
    label: str
    kind: str  # "unit" | "topic" | "client" | "ring"
    detail: str = ""  # a unit's class, a ring's name...
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    cluster: str | None = None  # a key of Picture.clusters


@dataclass
class Edge:
    """Data flowing from *src* (its output port *src_port*, None: the node itself) to
    *dst* (its input port *dst_port*), over *transport* at *rate* msgs/s (None: not
    known, e.g. a definition that is not running)."""

    src: str
    src_port: str | None
    dst: str
    dst_port: str | None
    transport: str | None = None
    rate: float | None = None

    def label(self) -> str:
        """``shm · 80 msg/s``, ``local``, ``""``..."""
        parts = [self.transport] if self.transport else []
        if self.rate is not None:
            parts.append(f"{format_rate(self.rate)} msg/s")
        return " · ".join(parts)


@dataclass
class Picture:
    """A graph to draw: its *nodes* in order (units first, in the order written or in
    data-flow order), *edges*, and *clusters* (key -> heading, in order)."""

    title: str
    nodes: list[Node]
    edges: list[Edge]
    clusters: dict[str, str]
    #: One line under the title: where it comes from (a server, a definition, a time).
    source: str = ""

    def node(self, node_id: str) -> Node:
        return next(node for node in self.nodes if node.id == node_id)


def format_rate(rate: float) -> str:
    """msgs/s as an edge shows them: ``0.5``, ``80``, ``12.3k``."""
    if rate >= 10_000:
        return f"{rate / 1000:.0f}k"
    if rate >= 1000:
        return f"{rate / 1000:.1f}k"
    if rate >= 10 or rate == 0:
        return f"{rate:.0f}"
    return f"{rate:.1f}"


# -- from a definition ------------------------------------------------------------------


def expected_transport(
    same_process: bool, same_host: bool, forced: Iterable[str | None] = ()
) -> str:
    """The transport ezflow chooses for an edge: the first forced one (an input's
    choice before its output's), else local within a process, shm within a host, tcp
    across hosts."""
    for choice in forced:
        if choice:
            return choice
    return "local" if same_process else "shm" if same_host else "tcp"


def from_plan(plan: Plan, title: str, *, settings: bool = False) -> Picture:
    """The picture of a validated graph that is not running: its units in the order
    written, each process a cluster, each edge with the transport ezflow would choose
    (no rates)."""
    clusters = {
        process: "main process" if process == MAIN_PROCESS else f"process {process}"
        for process in plan.processes
    }
    nodes: list[Node] = []
    ports: dict[str, tuple[str, str]] = {}  # topic -> (node id, stream)
    streams: dict[str, Any] = {}  # topic -> Stream
    for index, (path, unit) in enumerate(plan.units.items()):
        node = Node(f"n{index}", path, "unit", type(unit).__name__)
        node.cluster = plan.process_of[path]
        for name, stream in type(unit).streams().items():
            if name == SETTINGS_STREAM and not settings:
                continue
            (node.inputs if stream.direction == "input" else node.outputs).append(name)
            ports[stream_topic(path, name)] = (node.id, name)
            streams[stream_topic(path, name)] = stream
        node.inputs.sort(key=lambda name: name == SETTINGS_STREAM)  # (declared first)
        nodes.append(node)
    topics: dict[str, Node] = {}

    def end(topic: str) -> tuple[str, str | None]:
        if topic in ports:
            return ports[topic]
        if topic not in topics:
            topics[topic] = Node(f"n{len(nodes) + len(topics)}", topic, "topic")
        return topics[topic].id, None

    edges = []
    for src, dst in plan.edges:
        if src.rpartition("/")[2] == SETTINGS_STREAM and not settings:
            continue
        if dst.rpartition("/")[2] == SETTINGS_STREAM and not settings:
            continue
        (src_id, src_port), (dst_id, dst_port) = end(src), end(dst)
        transport = None
        if src in ports and dst in ports:
            same = plan.process_of[_path(src)] == plan.process_of[_path(dst)]
            forced = (streams[dst].transport, streams[src].transport)
            transport = expected_transport(same, True, forced)
        edges.append(Edge(src_id, src_port, dst_id, dst_port, transport))
    nodes.extend(topics.values())
    units = len(plan.units)
    return Picture(
        title,
        nodes,
        edges,
        clusters,
        f"the definition (not running): {units} unit{'s' if units != 1 else ''}, "
        f"{len(plan.processes)} process{'es' if len(plan.processes) != 1 else ''}; "
        "transports as ezflow would choose them on one host",
    )


def _path(topic: str) -> str:
    return topic.rpartition("/")[0]


# -- from a running graph ---------------------------------------------------------------


def process_label(client: Mapping[str, Any]) -> str:
    return f"{client.get('name') or client['client_id']} (pid {client.get('pid')})"


def ring_name(pub: Mapping[str, Any]) -> str:
    if pub.get("ring"):
        return str(pub["ring"])
    prefix = "p-ring-"
    name = str(pub["id"])
    if name.startswith(prefix) and "-" in name[len(prefix) :]:
        return name[len(prefix) :].rpartition("-")[0]
    return name


class _Live:
    """The pieces of a snapshot that a picture needs, indexed."""

    def __init__(
        self,
        snapshot: Mapping[str, Any],
        telemetry: Mapping[str, ProcessSnapshot],
        *,
        settings: bool,
        hidden_publishers: set[str],
    ) -> None:
        self.clients = {c["client_id"]: c for c in snapshot["clients"]}
        self.publishers = [
            p
            for p in snapshot["publishers"]
            if p["id"] not in hidden_publishers
            and (p["client_id"] in self.clients or p.get("transport") == "ezring")
        ]
        self.subscribers = [s for s in snapshot["subscribers"] if s["client_id"] in self.clients]
        self.edges = [(str(a), str(b)) for a, b in snapshot["edges"]]
        self.settings = settings
        # Units: P, owned by the client subscribing to P/INPUT_SETTINGS, in the order
        # the processes registered them.
        self.unit_owner: dict[str, str] = {}
        for sub in self.subscribers:
            path, _, name = sub["topic"].rpartition("/")
            if name == SETTINGS_STREAM and path and path not in self.unit_owner:
                self.unit_owner[path] = sub["client_id"]
        self.rates: dict[str, float] = {}  # publisher id -> msgs/s
        self.channels: dict[str, list[tuple[str, str, float]]] = {}  # sub id -> (pub, tr, rate)
        for client_id, snap in telemetry.items():
            for pub in snap.publishers:
                self.rates[pub.publisher_id] = pub.msgs_per_s
            if client_id not in self.clients:
                continue
            for ch in snap.channels:
                for sub in ch.subscribers:
                    self.channels.setdefault(sub.subscriber_id, []).append(
                        (ch.publisher_id, ch.transport, ch.msgs_per_s)
                    )
        self.reverse: dict[str, list[str]] = {}
        for src, dst in self.edges:
            self.reverse.setdefault(dst, []).append(src)

    def unit_port(self, topic: str, client_id: str | None = None) -> tuple[str, str] | None:
        """(unit path, stream) when *topic* is a unit's stream (and *client_id*, when
        given, is the unit's own process)."""
        path, _, name = topic.rpartition("/")
        owner = self.unit_owner.get(path)
        if owner is None or (client_id is not None and owner != client_id):
            return None
        return path, name

    def hidden(self, topic: str) -> bool:
        return not self.settings and topic.rpartition("/")[2] == SETTINGS_STREAM

    def sources(self, topic: str) -> set[str]:
        """*topic* and every topic feeding it through topic -> topic edges."""
        seen, stack = {topic}, [topic]
        while stack:
            for src in self.reverse.get(stack.pop(), ()):
                if src not in seen:
                    seen.add(src)
                    stack.append(src)
        return seen


def from_snapshot(
    snapshot: Mapping[str, Any],
    telemetry: Mapping[str, ProcessSnapshot] | None = None,
    *,
    title: str = "graph",
    source: str = "",
    settings: bool = False,
    hidden_publishers: Iterable[str] = (),
) -> Picture:
    """The picture of a running graph: *snapshot* as the graph server's ``graph``
    request gives it (less the asking client), *telemetry* its ``telemetry`` reply
    (rates and the transports channels use; None: none known). Publishers whose id is
    in *hidden_publishers* are left out (the rings no one in this graph reads)."""
    live = _Live(
        snapshot, telemetry or {}, settings=settings, hidden_publishers=set(hidden_publishers)
    )
    clusters: dict[str, str] = {}
    nodes: dict[str, Node] = {}  # key -> node, in order of appearance
    order: list[str] = []

    def add(key: str, node: Node) -> Node:
        if key not in nodes:
            nodes[key] = node
            order.append(key)
            if node.cluster is not None and node.cluster not in clusters:
                if node.cluster == RINGS:
                    clusters[RINGS] = "rings"
                else:
                    clusters[node.cluster] = process_label(live.clients[node.cluster])
        return nodes[key]

    for path, owner in live.unit_owner.items():
        add(f"u:{path}", Node("", path, "unit", cluster=owner))

    def port(node: Node, name: str, direction: str) -> None:
        names = node.inputs if direction == "input" else node.outputs
        if name not in names:
            names.append(name)

    def endpoint(topic: str) -> tuple[str, str | None]:
        found = live.unit_port(topic)
        if found is not None:
            return f"u:{found[0]}", found[1]
        add(f"t:{topic}", Node("", topic, "topic"))
        return f"t:{topic}", None

    def client_node(client_id: str) -> str:
        # In its process's cluster when that process runs units, else on its own.
        client = live.clients[client_id]
        cluster = client_id if client_id in live.unit_owner.values() else None
        add(f"c:{client_id}", Node("", process_label(client), "client", cluster=cluster))
        return f"c:{client_id}"

    def ring_node(pub: Mapping[str, Any]) -> str:
        add(f"r:{pub['id']}", Node("", ring_name(pub), "ring", "ezring", cluster=RINGS))
        return f"r:{pub['id']}"

    # Ports, and the endpoint each publisher and subscriber draws from or to.
    pub_end: dict[str, tuple[str, str | None]] = {}
    for pub in live.publishers:
        if live.hidden(pub["topic"]):
            continue
        own = live.unit_port(pub["topic"], pub["client_id"])
        if pub.get("transport") == "ezring":
            pub_end[pub["id"]] = (ring_node(pub), None)
        elif own is not None:
            port(nodes[f"u:{own[0]}"], own[1], "output")
            pub_end[pub["id"]] = (f"u:{own[0]}", own[1])
        else:
            pub_end[pub["id"]] = (client_node(pub["client_id"]), None)
    sub_end: dict[str, tuple[str, str | None]] = {}
    for sub in live.subscribers:
        if live.hidden(sub["topic"]):
            continue
        own = live.unit_port(sub["topic"], sub["client_id"])
        if own is not None:
            port(nodes[f"u:{own[0]}"], own[1], "input")
            sub_end[sub["id"]] = (f"u:{own[0]}", own[1])
        else:
            sub_end[sub["id"]] = (client_node(sub["client_id"]), None)

    edges: dict[tuple[str, str | None, str, str | None], Edge] = {}

    def connect(
        src: tuple[str, str | None],
        dst: tuple[str, str | None],
        transport: str | None,
        rate: float | None,
    ) -> None:
        key = (*src, *dst)
        edge = edges.get(key)
        if edge is None:
            edges[key] = Edge(*src, *dst, transport, rate)
        elif rate is not None:
            edge.rate = (edge.rate or 0.0) + rate

    pubs_by_topic: dict[str, list[Mapping[str, Any]]] = {}
    for pub in live.publishers:
        pubs_by_topic.setdefault(pub["topic"], []).append(pub)

    def measured(sub: Mapping[str, Any], topics: set[str]) -> tuple[str | None, float | None]:
        """The transport and summed rate of *sub*'s channels from the publishers of
        *topics*, else the transport ezflow would choose (and no rate)."""
        feeding = {p["id"]: p for t in topics for p in pubs_by_topic.get(t, ())}
        channels = [c for c in live.channels.get(sub["id"], []) if c[0] in feeding]
        if channels:
            return channels[0][1], sum(rate for _, _, rate in channels)
        pubs = list(feeding.values())
        if not pubs:
            return None, None
        pub = pubs[0]
        if pub.get("transport") == "ezring":
            return "ezring", None
        mine, theirs = live.clients.get(sub["client_id"], {}), live.clients.get(pub["client_id"])
        if theirs is None:
            return None, None
        same_host = mine.get("host_id") == theirs.get("host_id")
        forced = (sub.get("transport"), pub.get("transport"))
        return expected_transport(sub["client_id"] == pub["client_id"], same_host, forced), None

    # Edges into subscribers. A unit's input port gets one from each topic feeding it
    # through a topic -> topic edge and from each publisher on the port's own topic; a
    # subscriber of a program gets one from the topic it subscribes to.
    for sub in live.subscribers:
        target = sub_end.get(sub["id"])
        if target is None:
            continue
        topic = sub["topic"]
        if live.unit_port(topic, sub["client_id"]) is None:
            connect(endpoint(topic), target, *measured(sub, live.sources(topic)))
            continue
        for src in live.reverse.get(topic, ()):
            if not live.hidden(src):
                connect(endpoint(src), target, *measured(sub, live.sources(src)))
        for pub in pubs_by_topic.get(topic, ()):
            src_end = pub_end.get(pub["id"])
            if src_end is not None and src_end[0] != target[0]:
                connect(src_end, target, *measured(sub, {topic}))
    # Edges out of publishers that are no unit's output (a program, a ring) into the
    # topic they publish on, unless that is a unit's input (drawn above).
    for pub in live.publishers:
        end = pub_end.get(pub["id"])
        if end is None or end[1] is not None:
            continue
        if live.unit_port(pub["topic"]) is None:
            connect(end, endpoint(pub["topic"]), None, live.rates.get(pub["id"]))
    # Topic -> topic edges between topic nodes and unit outputs (into unit inputs they
    # are drawn from each subscriber above).
    for src, dst in live.edges:
        if live.hidden(src) or live.hidden(dst) or live.unit_port(dst) is not None:
            continue
        rates = [live.rates[p["id"]] for p in pubs_by_topic.get(src, ()) if p["id"] in live.rates]
        connect(endpoint(src), endpoint(dst), None, sum(rates) if rates else None)

    for node in nodes.values():  # a unit's settings stream last, as it declares it
        node.inputs.sort(key=lambda name: name == SETTINGS_STREAM)
    ordered = _data_flow_order(order, [(e.src, e.dst) for e in edges.values()], nodes)
    ids = {key: f"n{index}" for index, key in enumerate(ordered)}
    result = []
    for key in ordered:
        node = nodes[key]
        node.id = ids[key]
        result.append(node)
    for edge in edges.values():
        edge.src, edge.dst = ids[edge.src], ids[edge.dst]
    # Edges in the nodes' order (by source, then destination).
    position = {node.id: index for index, node in enumerate(result)}
    drawn = sorted(edges.values(), key=lambda e: (position[e.src], position[e.dst]))
    return Picture(title, result, drawn, clusters, source)


def _data_flow_order(
    keys: list[str], links: list[tuple[str, str]], nodes: Mapping[str, Node]
) -> list[str]:
    """Units first, in data-flow order (a node after everything feeding it; ties and
    cycles by order of appearance), then the other nodes in the same order."""
    rank = {key: index for index, key in enumerate(keys)}
    feeding: dict[str, set[str]] = {key: set() for key in keys}
    for src, dst in links:
        if src != dst:
            feeding[dst].add(src)
    done: list[str] = []
    left = set(keys)
    while left:
        ready = [key for key in left if not (feeding[key] & left)]
        pick = min(ready or left, key=rank.__getitem__)
        done.append(pick)
        left.remove(pick)
    units = [key for key in done if nodes[key].kind == "unit"]
    return units + [key for key in done if nodes[key].kind != "unit"]


# -- layout (the SVG) -------------------------------------------------------------------


def ranks(picture: Picture) -> dict[str, int]:
    """Each node's column, left to right: the longest path to it from a node nothing
    feeds (edges closing a cycle are ignored)."""
    order = [node.id for node in picture.nodes]
    position = {node_id: index for index, node_id in enumerate(order)}
    outgoing: dict[str, list[str]] = {node_id: [] for node_id in order}
    for edge in picture.edges:
        outgoing[edge.src].append(edge.dst)
    # Drop back edges (a depth-first search from the nodes in order).
    forward: dict[str, list[str]] = {node_id: [] for node_id in order}
    state: dict[str, int] = {}
    for start in order:
        if start in state:
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        state[start] = 1
        while stack:
            node_id, index = stack.pop()
            targets = sorted(outgoing[node_id], key=position.__getitem__)
            if index < len(targets):
                stack.append((node_id, index + 1))
                target = targets[index]
                if state.get(target) == 1:
                    continue  # a back edge: it closes a cycle
                forward[node_id].append(target)
                if target not in state:
                    state[target] = 1
                    stack.append((target, 0))
            else:
                state[node_id] = 2
    column = dict.fromkeys(order, 0)
    incoming = {node_id: 0 for node_id in order}
    for targets in forward.values():
        for target in targets:
            incoming[target] += 1
    ready = [node_id for node_id in order if incoming[node_id] == 0]
    while ready:
        node_id = ready.pop(0)
        for target in forward[node_id]:
            column[target] = max(column[target], column[node_id] + 1)
            incoming[target] -= 1
            if incoming[target] == 0:
                ready.append(target)
    return column


_FONT = 12  # px
_CHAR = 7.2  # px per character at _FONT (an estimate: SVG cannot measure text)
_PORT_ROW = 18
_HEADER = 38
_GAP_X = 150  # room for an edge's label between columns
_GAP_Y = 22
_LANE_PAD = 14
_LANE_HEAD = 20
_MARGIN = 16
#: Colours of the transports (edges and the legend).
TRANSPORT_COLORS = {
    "local": "#6b7280",
    "shm": "#15803d",
    "tcp": "#1d4ed8",
    "ezring": "#b45309",
    None: "#9ca3af",
}
_KIND_FILL = {"unit": "#ffffff", "topic": "#fef9c3", "client": "#f3e8ff", "ring": "#ffedd5"}


@dataclass
class _Box:
    x: float
    y: float
    w: float
    h: float


def _esc(value: object) -> str:
    return _html.escape(str(value), quote=True)


def _width(text: str) -> float:
    return len(text) * _CHAR


def _node_size(node: Node) -> tuple[float, float]:
    ports = max(len(node.inputs), len(node.outputs))
    longest_port = max((len(p) for p in node.inputs + node.outputs), default=0)
    inner = max(_width(node.label), _width(node.detail)) + 24
    width = max(120.0, inner, 2 * longest_port * _CHAR + 36)
    return width, _HEADER + ports * _PORT_ROW + (6 if ports else 0)


def _layout(picture: Picture) -> tuple[dict[str, _Box], dict[str, _Box], float, float]:
    """Node boxes and lane boxes (a lane per cluster, one for the nodes outside any,
    in the clusters' order), and the drawing's width and height."""
    column = ranks(picture)
    lanes = list(dict.fromkeys([*picture.clusters, *(n.cluster for n in picture.nodes)]))
    sizes = {node.id: _node_size(node) for node in picture.nodes}
    columns = max(column.values(), default=0) + 1
    col_w = [0.0] * columns
    for node in picture.nodes:
        col_w[column[node.id]] = max(col_w[column[node.id]], sizes[node.id][0])
    col_x: list[float] = []
    x: float = _MARGIN + _LANE_PAD
    for width in col_w:
        col_x.append(x)
        x += width + _GAP_X
    total_w = x - _GAP_X + _LANE_PAD + _MARGIN
    boxes: dict[str, _Box] = {}
    lane_boxes: dict[str, _Box] = {}
    y: float = _MARGIN
    for lane in lanes:
        members = [node for node in picture.nodes if node.cluster == lane]
        if not members:
            continue
        stacks: dict[int, float] = {}
        top = y + _LANE_HEAD + _LANE_PAD
        for node in members:
            col = column[node.id]
            width, height = sizes[node.id]
            at = stacks.get(col, top)
            boxes[node.id] = _Box(col_x[col] + (col_w[col] - width) / 2, at, width, height)
            stacks[col] = at + height + _GAP_Y
        bottom = max(stacks.values()) - _GAP_Y + _LANE_PAD
        key = lane if lane is not None else _TOPICS
        lane_boxes[key] = _Box(_MARGIN, y, total_w - 2 * _MARGIN, bottom - y)
        y = bottom + _GAP_Y
    return boxes, lane_boxes, total_w, y - _GAP_Y + _MARGIN


def _others_heading(picture: Picture) -> str:
    kinds = {node.kind for node in picture.nodes if node.cluster is None}
    if kinds == {"topic"}:
        return "topics"
    return "programs" if kinds == {"client"} else "topics and programs"


def _port_y(box: _Box, node: Node, port: str | None, direction: str) -> float:
    names = node.inputs if direction == "input" else node.outputs
    if port is None or port not in names:
        return box.y + box.h / 2
    return box.y + _HEADER + names.index(port) * _PORT_ROW + _PORT_ROW / 2


def svg(picture: Picture) -> str:
    """The picture as one ``<svg>`` element: lanes for the clusters (their heading top
    left), nodes in columns by data flow, ports as dots on the nodes' sides, edges as
    curves coloured by transport with their label, and a legend."""
    boxes, lanes, width, height = _layout(picture)
    legend_h = 28
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="ezflow-graph" width="{width:.0f}" '
        f'height="{height + legend_h:.0f}" viewBox="0 0 {width:.0f} {height + legend_h:.0f}" '
        f'role="img" aria-label="{_esc(picture.title)}" font-family="Helvetica, Arial, '
        f'sans-serif" font-size="{_FONT}">',
        "<defs>",
        *(
            f'<marker id="arrow-{name or "none"}" viewBox="0 0 10 10" refX="9" refY="5" '
            f'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            f'<path d="M 0 0 L 10 5 L 0 10 z" fill="{color}"/></marker>'
            for name, color in TRANSPORT_COLORS.items()
        ),
        "</defs>",
    ]
    for key, box in lanes.items():
        heading = picture.clusters.get(key) or _others_heading(picture)
        out.append(
            f'<g class="cluster"><rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" '
            f'height="{box.h:.1f}" rx="8" fill="#f8fafc" stroke="#94a3b8" '
            f'stroke-dasharray="4 3"/><text x="{box.x + 10:.1f}" y="{box.y + 16:.1f}" '
            f'font-weight="bold" fill="#334155">{_esc(heading)}</text></g>'
        )
    by_id = {node.id: node for node in picture.nodes}
    for edge in picture.edges:
        src, dst = boxes[edge.src], boxes[edge.dst]
        x1, y1 = src.x + src.w, _port_y(src, by_id[edge.src], edge.src_port, "output")
        x2, y2 = dst.x - 4, _port_y(dst, by_id[edge.dst], edge.dst_port, "input")
        bend = max(60.0, abs(x2 - x1) / 2)
        color = TRANSPORT_COLORS.get(edge.transport, TRANSPORT_COLORS[None])
        marker = f"arrow-{edge.transport or 'none'}"
        if edge.transport not in TRANSPORT_COLORS:
            marker = "arrow-none"
        path = (
            f"M {x1:.1f} {y1:.1f} C {x1 + bend:.1f} {y1:.1f} "
            f"{x2 - bend:.1f} {y2:.1f} {x2:.1f} {y2:.1f}"
        )
        label = edge.label()
        out.append(
            f'<g class="edge"><title>{_esc(_edge_title(picture, edge))}</title>'
            f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2" '
            f'marker-end="url(#{marker})"/>'
        )
        if label:
            # The label sits on the curve's midpoint, on a white ground.
            mx, my = (x1 + x2) / 2, (y1 + y2) / 2
            w = _width(label) + 8
            out.append(
                f'<rect x="{mx - w / 2:.1f}" y="{my - 9:.1f}" width="{w:.1f}" height="16" '
                f'rx="3" fill="#ffffff" fill-opacity="0.9"/>'
                f'<text x="{mx:.1f}" y="{my + 3:.1f}" text-anchor="middle" '
                f'fill="{color}">{_esc(label)}</text>'
            )
        out.append("</g>")
    for node in picture.nodes:
        out.append(_svg_node(node, boxes[node.id]))
    out.append(_svg_legend(picture, height, width))
    out.append("</svg>")
    return "\n".join(out)


def _edge_title(picture: Picture, edge: Edge) -> str:
    def end(node_id: str, port: str | None) -> str:
        label = picture.node(node_id).label
        return f"{label}.{port}" if port else label

    label = edge.label()
    return f"{end(edge.src, edge.src_port)} -> {end(edge.dst, edge.dst_port)}" + (
        f" ({label})" if label else ""
    )


def _svg_node(node: Node, box: _Box) -> str:
    rx = {"unit": 6, "topic": 2, "client": 16, "ring": 12}[node.kind]
    parts = [
        f'<g class="node {node.kind}" id="{node.id}"><title>{_esc(node.label)}</title>'
        f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" '
        f'rx="{rx}" fill="{_KIND_FILL[node.kind]}" stroke="#334155" stroke-width="1.2"/>',
        f'<text x="{box.x + box.w / 2:.1f}" y="{box.y + 17:.1f}" text-anchor="middle" '
        f'font-weight="bold">{_esc(node.label)}</text>',
    ]
    if node.detail:
        parts.append(
            f'<text x="{box.x + box.w / 2:.1f}" y="{box.y + 31:.1f}" text-anchor="middle" '
            f'font-size="{_FONT - 1}" fill="#64748b">{_esc(node.detail)}</text>'
        )
    if node.inputs or node.outputs:
        line_y = box.y + _HEADER - 3
        parts.append(
            f'<line x1="{box.x:.1f}" x2="{box.x + box.w:.1f}" y1="{line_y:.1f}" '
            f'y2="{line_y:.1f}" stroke="#cbd5e1"/>'
        )
    for direction, names in (("input", node.inputs), ("output", node.outputs)):
        for name in names:
            y = _port_y(box, node, name, direction)
            x = box.x if direction == "input" else box.x + box.w
            tx, anchor = (x + 8, "start") if direction == "input" else (x - 8, "end")
            parts.append(
                f'<circle class="port {direction}" cx="{x:.1f}" cy="{y:.1f}" r="4" '
                f'fill="#334155"/><text x="{tx:.1f}" y="{y + 4:.1f}" text-anchor="{anchor}" '
                f'font-size="{_FONT - 1}">{_esc(name)}</text>'
            )
    parts.append("</g>")
    return "".join(parts)


def _svg_legend(picture: Picture, top: float, width: float) -> str:
    used = list(dict.fromkeys(edge.transport for edge in picture.edges))
    x: float = _MARGIN
    parts = ['<g class="legend">']
    for transport in used:
        color = TRANSPORT_COLORS.get(transport, TRANSPORT_COLORS[None])
        name = transport or "not known"
        parts.append(
            f'<line x1="{x:.1f}" x2="{x + 24:.1f}" y1="{top + 10:.1f}" y2="{top + 10:.1f}" '
            f'stroke="{color}" stroke-width="2"/><text x="{x + 30:.1f}" y="{top + 14:.1f}">'
            f"{_esc(name)}</text>"
        )
        x += 40 + _width(name)
    if any(edge.rate is not None for edge in picture.edges) and x < width:
        parts.append(
            f'<text x="{x + 10:.1f}" y="{top + 14:.1f}" fill="#64748b">msg/s: over the last '
            "telemetry interval</text>"
        )
    parts.append("</g>")
    return "".join(parts)


_PAGE_STYLE = """
body{font-family:Helvetica,Arial,sans-serif;margin:1.5em;color:#1e293b}
h1{font-size:1.3em;margin:0 0 .2em}p.source{color:#475569;margin:0 0 1em}
table{border-collapse:collapse;font-size:13px;margin-top:1.2em}
td,th{border:1px solid #cbd5e1;padding:3px 8px;text-align:left}td.n{text-align:right}
.picture{overflow-x:auto}
"""


def html(picture: Picture) -> str:
    """One self-contained HTML page: the title, where the picture comes from, the SVG
    (:func:`svg`) and a table of its edges. No script, no network resource."""
    rows = "".join(
        "<tr>"
        f"<td>{_esc(_end(picture, edge.src, edge.src_port))}</td>"
        f"<td>{_esc(_end(picture, edge.dst, edge.dst_port))}</td>"
        f"<td>{_esc(edge.transport or '—')}</td>"
        f"<td class=n>{'—' if edge.rate is None else _esc(format_rate(edge.rate))}</td></tr>"
        for edge in picture.edges
    )
    table = (
        f"<table><tr><th>from</th><th>to</th><th>transport</th><th>msg/s</th></tr>{rows}</table>"
        if rows
        else "<p>No edges.</p>"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ezflow graph: {_esc(picture.title)}</title>
<style>{_PAGE_STYLE}</style></head><body>
<h1>ezflow graph: {_esc(picture.title)}</h1>
<p class="source">{_esc(picture.source)}</p>
<div class="picture">
{svg(picture)}
</div>
{table}
</body></html>
"""


def _end(picture: Picture, node_id: str, port: str | None) -> str:
    label = picture.node(node_id).label
    return f"{label}.{port}" if port else label


# -- Mermaid ----------------------------------------------------------------------------


def _mm(text: str) -> str:
    """Text inside a Mermaid ``"..."`` label (``#quot;`` and friends are its escapes)."""
    return (
        text.replace("&", "#amp;").replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
    )


def _mm_node(node: Node) -> str:
    label = _mm(node.label) + (f"<br/><small>{_mm(node.detail)}</small>" if node.detail else "")
    shape = {
        "unit": ('["', '"]'),
        "topic": ('[/"', '"/]'),
        "client": ('(["', '"])'),
        "ring": ('[("', '")]'),
    }[node.kind]
    return f"{node.id}{shape[0]}{label}{shape[1]}"


def mermaid(picture: Picture) -> str:
    """A Mermaid flowchart (left to right; renders on GitHub in a ```mermaid block):
    the nodes in the picture's order, then each cluster as a subgraph listing its
    nodes, then the edges labelled with the streams, the transport and the rate."""
    lines = ["flowchart LR"]
    lines.extend(f"    {_mm_node(node)}" for node in picture.nodes)
    for index, (key, heading) in enumerate(picture.clusters.items()):
        members = [node.id for node in picture.nodes if node.cluster == key]
        if members:
            lines.append(f'    subgraph g{index}["{_mm(heading)}"]')
            lines.extend(f"        {member}" for member in members)
            lines.append("    end")
    for edge in picture.edges:
        streams = " → ".join(p for p in (edge.src_port, edge.dst_port) if p)
        text = "<br/>".join(_mm(part) for part in (streams, edge.label()) if part)
        arrow = f'-->|"{text}"|' if text else "-->"
        lines.append(f"    {edge.src} {arrow} {edge.dst}")
    styles = {"topic": "fill:#fef9c3", "client": "fill:#f3e8ff", "ring": "fill:#ffedd5"}
    for kind, style in styles.items():
        members = [node.id for node in picture.nodes if node.kind == kind]
        if members:
            lines.append(f"    style {','.join(members)} {style}")
    for index, edge in enumerate(picture.edges):
        if edge.transport in TRANSPORT_COLORS:
            lines.append(
                f"    linkStyle {index} stroke:{TRANSPORT_COLORS[edge.transport]},stroke-width:2px"
            )
    return "\n".join(lines) + "\n"


# -- Graphviz dot -----------------------------------------------------------------------


def _dot_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot_node(node: Node) -> str:
    if node.kind != "unit":
        shape = {"topic": "parallelogram", "client": "box", "ring": "cylinder"}[node.kind]
        style = ', style="rounded,filled"' if node.kind == "client" else ", style=filled"
        label = node.label + (f"\n{node.detail}" if node.detail else "")
        fill = _KIND_FILL[node.kind]
        return (
            f"    {node.id} [shape={shape}{style}, fillcolor={_dot_string(fill)}, "
            f"label={_dot_string(label)}];"
        )

    def ports(names: list[str], prefix: str) -> str:
        if not names:
            return ""
        rows = "".join(f'<tr><td port="{prefix}{_esc(n)}">{_esc(n)}</td></tr>' for n in names)
        return f'<td><table border="0" cellborder="1" cellspacing="0">{rows}</table></td>'

    detail = f'<br/><font point-size="10" color="#64748b">{_esc(node.detail)}</font>'
    title = f"<td><b>{_esc(node.label)}</b>{detail if node.detail else ''}</td>"
    return (
        f"    {node.id} [shape=plain, label=<"
        '<table border="1" cellborder="0" cellspacing="2" cellpadding="4" style="rounded">'
        f"<tr>{ports(node.inputs, 'i_')}{title}{ports(node.outputs, 'o_')}</tr></table>>];"
    )


def dot(picture: Picture) -> str:
    """Graphviz dot (``rankdir=LR``): units as tables with a cell per port, clusters
    for the processes (and the rings' heading), edges from port to port labelled with
    the transport and the rate, coloured by transport."""
    lines = [
        "digraph ezflow {",
        "    rankdir=LR; newrank=true;",
        "    node [fontname=Helvetica, fontsize=11];",
        "    edge [fontname=Helvetica, fontsize=10];",
        f"    label={_dot_string(picture.title)}; labelloc=t;",
    ]
    lines.extend(_dot_node(node) for node in picture.nodes)
    for index, (key, heading) in enumerate(picture.clusters.items()):
        members = [node.id for node in picture.nodes if node.cluster == key]
        if members:
            lines.append(f"    subgraph cluster_{index} {{")
            lines.append(f'        label={_dot_string(heading)}; style="rounded,dashed";')
            lines.append(f"        {'; '.join(members)};")
            lines.append("    }")
    for edge in picture.edges:
        src = f"{edge.src}:o_{edge.src_port}:e" if edge.src_port else edge.src
        dst = f"{edge.dst}:i_{edge.dst_port}:w" if edge.dst_port else edge.dst
        color = TRANSPORT_COLORS.get(edge.transport, TRANSPORT_COLORS[None])
        label = edge.label()
        attrs = [f"color={_dot_string(color)}", f"fontcolor={_dot_string(color)}"]
        if label:
            attrs.insert(0, f"label={_dot_string(label)}")
        lines.append(f"    {src} -> {dst} [{', '.join(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- text (a definition without a format) -----------------------------------------------


def text(picture: Picture) -> str:
    """The picture as lines: the source, each cluster with its nodes, each edge."""
    lines = [f"{picture.title}: {picture.source}"]
    for key, heading in picture.clusters.items():
        members = [node.label for node in picture.nodes if node.cluster == key]
        if members:
            lines.append(f"{heading}: {', '.join(members)}")
    others = [node.label for node in picture.nodes if node.cluster is None]
    if others:
        lines.append(f"{_others_heading(picture)}: {', '.join(others)}")
    for edge in picture.edges:
        label = edge.label()
        lines.append(
            f"  {_end(picture, edge.src, edge.src_port)} -> "
            f"{_end(picture, edge.dst, edge.dst_port)}" + (f"  ({label})" if label else "")
        )
    return "\n".join(lines) + "\n"
