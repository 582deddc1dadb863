"""Validation and flattening: from components and connections to units, topics, edges
and processes. Pure: nothing here touches the network or starts anything.

Topics are derived from component paths: the stream ``OUTPUT`` of the unit ``FILTER``
inside the collection ``PIPE`` is the topic ``"PIPE/FILTER/OUTPUT"``. Connections
through collection-level streams are resolved into direct edges between unit streams
(``"PIPE/INPUT"`` relays are not topics anyone publishes on), so no message is ever
copied to relay it.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from .._core._codec import KNOWN_MESSAGE_MODULES, registered_name
from .._core._exceptions import ConfigurationError
from .._core._protocol import check_topic
from ._component import Collection, Component, Unit
from ._errors import GraphDefinitionError
from ._foreign import (
    ADAPTER_MODULES,
    GraphAdapter,
    adaptable,
    adaptable_class,
    adapter_for,
    foreign_package,
    register_graph_adapter,
)
from ._settings import accepts, field_hint, value_from_text
from ._streams import BoundStream, Stream, types_compatible

__all__ = [
    "ADAPTER_MODULES",
    "MAIN_PROCESS",
    "GraphAdapter",
    "NoUnitsError",
    "Plan",
    "TopicEnd",
    "adaptable",
    "adaptable_class",
    "build_plan",
    "register_graph_adapter",
    "stream_topic",
]

#: Process name of the units that run in the process calling ``run``.
MAIN_PROCESS = ""


def stream_topic(path: str, stream_name: str) -> str:
    return f"{path}/{stream_name}"


@dataclass
class _End:
    topic: str
    label: str
    relay: bool  # a collection-level stream
    direction: str | None  # effective direction at this connection: input/output/None
    message_type: Any
    ezmsg_wiring: bool = False  # its component connects as ezmsg does (see connection())
    plain: bool = False  # a topic name, not a component's stream


@dataclass(frozen=True)
class TopicEnd:
    """A connection end that is a plain topic name (not a component's stream): a likely
    place for a typo, checked against the graph server's topics at start."""

    topic: str
    role: str  # "source" (the graph reads it) or "destination" (the graph feeds it)
    where: str  # "connection 1", "PIPE connection 0"
    other: str  # the stream at the other end ("SHOW.INPUT")


@dataclass
class Plan:
    """A validated graph, ready to run."""

    units: dict[str, Unit]  # path -> unit, in depth-first declaration order
    process_of: dict[str, str]  # unit path -> process name (MAIN_PROCESS or a path)
    edges: list[tuple[str, str]]  # direct topic -> topic edges to create
    processes: dict[str, list[str]] = field(default_factory=dict)  # name -> unit paths
    #: Warnings about the graph (likely mistakes that still run), each one line: the
    #: runner logs them when the graph starts.
    notes: list[str] = field(default_factory=list)
    #: Connection ends that are topic names: the runner checks them at start.
    topic_ends: list[TopicEnd] = field(default_factory=list)
    #: Unit input topics fed only by topic names (other programs' publishers, as
    #: ``("GLOBAL_PING_TOPIC", log.INPUT)``): a stopping graph drains what they have
    #: received without waiting for an end that is not the graph's to give.
    external_inputs: set[str] = field(default_factory=set)

    def units_in(self, process: str) -> list[Unit]:
        return [self.units[path] for path in self.processes.get(process, [])]


class NoUnitsError(GraphDefinitionError):
    """The components contain no unit (ezmsg runs such a graph as nothing: compat
    returns at once)."""


def _check_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise GraphDefinitionError(f"{where}: a component name is a non-empty str, not {name!r}")
    if "/" in name or not name.isprintable() or any(c.isspace() for c in name):
        raise GraphDefinitionError(
            f"{where}: component name {name!r} may not contain '/', whitespace or "
            "unprintable characters"
        )
    return name


def _check_settings(component: Component) -> None:
    expected = component.settings_type()
    label = component.path
    settings = component.SETTINGS
    if expected is None:
        if settings is not None:
            raise GraphDefinitionError(
                f"{label}: {type(component).__qualname__} declares no SETTINGS class but has "
                f"settings {settings!r}"
            )
        return
    if settings is None:
        required = [
            f.name
            for f in dataclasses.fields(cast(Any, expected))
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        raise GraphDefinitionError(
            f"{label}: {type(component).__qualname__} has no settings, and "
            f"{expected.__qualname__} has required fields ({', '.join(required)}); pass "
            f"{type(component).__qualname__}({expected.__qualname__}(...)) or call "
            "apply_settings() in the parent collection's configure()"
        )
    if not isinstance(settings, expected):
        raise GraphDefinitionError(
            f"{label}: settings are a {type(settings).__qualname__}, but "
            f"{type(component).__qualname__} expects {expected.__qualname__} (its SETTINGS)"
        )


def _set_fields(component: Component, path: str, fields: Mapping[str, object]) -> None:
    """Give *component* (at *path*) its settings with *fields* replaced: a field given
    as text (a str for a field that takes no str) is read as :func:`value_from_text`
    reads it. :class:`GraphDefinitionError` names the path, the field and what is
    wrong."""
    first = f"{path}.{next(iter(fields))}"
    cls = component.settings_type()
    if cls is None:
        raise GraphDefinitionError(
            f"cannot set {first}: {type(component).__qualname__} declares no SETTINGS "
            "class, so it has no settings"
        )
    names = [f.name for f in dataclasses.fields(cast(Any, cls))]
    values: dict[str, object] = {}
    for name, given in fields.items():
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            raise GraphDefinitionError(
                f"cannot set {path}.{name}: {cls.__qualname__} has no field {name!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; its fields: {', '.join(names)}"
            )
        if isinstance(given, str) and not accepts(field_hint(cls, name), given):
            try:
                values[name] = value_from_text(cls, name, given)
            except ConfigurationError as exc:
                raise GraphDefinitionError(f"cannot set {path}.{name}: {exc}") from None
        else:
            values[name] = given
    try:
        settings = (
            cls(**values)
            if component.SETTINGS is None
            else dataclasses.replace(component.SETTINGS, **values)
        )
    except (TypeError, ConfigurationError) as exc:
        raise GraphDefinitionError(f"cannot set {first}: {exc}") from None
    component.apply_settings(settings)


class _Builder:
    def __init__(self, settings: Mapping[str, Mapping[str, object]] | None = None) -> None:
        #: Fields to set by component path (build_plan's *settings*), until applied.
        self.settings = {path: dict(fields) for path, fields in (settings or {}).items() if fields}
        self.paths: dict[int, str] = {}
        self.components: dict[str, Component] = {}
        self.units: dict[str, Unit] = {}
        self.collections: list[Collection] = []
        self.adapters: dict[str, GraphAdapter] = {}  # one per foreign package
        self.notes: list[str] = []  # warnings about the graph (Plan.notes)
        self.topic_ends: list[TopicEnd] = []

    def native(self, obj: object, kind: str) -> object:
        """*obj*, or the ezflow object that stands for it when it belongs to another
        framework (*kind*: ``component``, ``endpoint`` or ``placed``)."""
        package = foreign_package(obj)
        if package is None:
            return obj
        adapter = self.adapters.get(package)
        if adapter is None:
            adapter = self.adapters[package] = adapter_for(package)
        translated: object = getattr(adapter, kind)(obj)
        return translated

    def visit(self, component: object, path: str) -> None:
        component = self.native(component, "component")
        if not isinstance(component, Component):
            raise GraphDefinitionError(
                f"{path}: {component!r} is not a component; pass ezflow.Unit or "
                "ezflow.Collection instances"
            )
        seen = self.paths.get(id(component))
        if seen is not None:
            raise GraphDefinitionError(
                f"duplicate component: the same {type(component).__qualname__} instance is "
                f"both {seen} and {path}; create one instance per name"
            )
        self.paths[id(component)] = path
        self.components[path] = component
        component.path = path
        component.name = path.rsplit("/", 1)[-1]
        fields = self.settings.pop(path, None)
        if fields:
            # Before configure(): a collection's own settings reach its children, and a
            # child's are set after its parent's configure() set them.
            _set_fields(component, path, fields)
        _check_settings(component)
        if isinstance(component, Unit):
            self.units[path] = component
            for stream_name in type(component).streams():
                topic = stream_topic(path, stream_name)
                try:
                    check_topic(topic)
                except ValueError as exc:
                    raise GraphDefinitionError(f"{path}: stream topic {topic!r}: {exc}") from exc
        elif isinstance(component, Collection):
            component.configure()
            self.collections.append(component)
            for name, child in component.components().items():
                self.visit(child, f"{path}/{_check_name(name, path)}")
        else:
            raise GraphDefinitionError(
                f"{path}: {type(component).__qualname__} is neither a Unit nor a Collection"
            )

    def endpoint(self, end: object, scope: Collection | None, role: str, where: str) -> _End:
        end = self.native(end, "endpoint")
        if isinstance(end, str):
            if end in self.components:
                raise GraphDefinitionError(
                    f"{where}: {end!r} is a component, not a stream; name one of its streams "
                    f"({', '.join(type(self.components[end]).streams())})"
                )
            owner_path, _, stream_name = end.rpartition("/")
            owner = self.components.get(owner_path)
            if owner is not None:
                stream = type(owner).streams().get(stream_name)
                if stream is None:
                    raise GraphDefinitionError(
                        f"{where}: unknown stream {end!r}: {type(owner).__qualname__} "
                        f"{owner_path} has no stream {stream_name!r} (it has "
                        f"{', '.join(type(owner).streams()) or 'none'})"
                    )
                return self.endpoint(owner._bound_stream(stream), scope, role, where)
            try:
                check_topic(end)
            except ValueError as exc:
                raise GraphDefinitionError(f"{where}: {exc}") from exc
            return _End(end, repr(end), False, None, Any, plain=True)
        if isinstance(end, Stream):
            raise GraphDefinitionError(
                f"{where}: {end!r} is the stream of a class, not of a component; write "
                f"instance.{end.name} (for example sine.OUTPUT)"
            )
        if isinstance(end, Component):
            raise GraphDefinitionError(
                f"{where}: the {role} is a {type(end).__qualname__} component, not a stream; "
                f"name one of its streams ({', '.join(type(end).streams())})"
            )
        if not isinstance(end, BoundStream):
            raise GraphDefinitionError(
                f"{where}: the {role} {end!r} is not a stream; use component.STREAM or a topic name"
            )
        component = end.component
        path = self.paths.get(id(component))
        if path is None:
            raise GraphDefinitionError(
                f"{where}: unknown stream {end.name} of a {type(component).__qualname__} "
                "that is not in the graph; add that component to components= (or to a "
                "collection) or connect a component that is"
            )
        stream = end.stream
        relay = isinstance(component, Collection)
        direction = stream.direction
        if relay and component is scope:
            # Inside its own network a collection's input is where messages come from.
            direction = "output" if direction == "input" else "input"
        topic = stream_topic(path, stream.name)
        wiring = bool(getattr(component, "_ezflow_ezmsg_wiring", False))
        return _End(topic, f"{path}.{stream.name}", relay, direction, end.message_type, wiring)

    def connection(self, pair: object, scope: Collection | None, where: str) -> tuple[_End, _End]:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise GraphDefinitionError(
                f"{where}: a connection is a (source, destination) pair, not {pair!r}"
            )
        src = self.endpoint(pair[0], scope, "source", where)
        dst = self.endpoint(pair[1], scope, "destination", where)
        shown = f"{where} ({src.label} -> {dst.label})"
        if src.direction == "input" and dst.direction == "input":
            raise GraphDefinitionError(
                f"{shown} connects two inputs; a connection goes from an OutputStream to an "
                "InputStream"
            )
        if src.direction == "output" and dst.direction == "output":
            ezmsg = getattr(scope, "_ezflow_ezmsg_wiring", False) or (
                scope is None and src.ezmsg_wiring and dst.ezmsg_wiring
            )
            if ezmsg and not dst.relay and src.topic != dst.topic:
                # ezmsg joins the two topics: what src publishes reaches dst's
                # subscribers too (dst's own unit goes on publishing there).
                self.notes.append(
                    f"{shown} connects two outputs; as in ezmsg, what {src.label} publishes "
                    f"also reaches the subscribers of {dst.label} (an ezflow.Collection "
                    "refuses this: it is usually a wiring mistake; connect an OutputStream "
                    "to an InputStream)"
                )
                return src, dst
            raise GraphDefinitionError(
                f"{shown} connects two outputs; a connection goes from an OutputStream to an "
                "InputStream"
            )
        if src.direction == "input" or dst.direction == "output":
            raise GraphDefinitionError(
                f"{shown} is reversed: a connection goes from an OutputStream to an "
                "InputStream; swap source and destination"
            )
        if not types_compatible(src.message_type, dst.message_type):
            raise GraphDefinitionError(
                f"{shown}: message type mismatch: {src.label} carries "
                f"{_type_name(src.message_type)} but {dst.label} expects "
                f"{_type_name(dst.message_type)}"
            )
        if src.topic == dst.topic:
            raise GraphDefinitionError(f"{shown} connects {src.label} to itself")
        if src.plain:
            self.topic_ends.append(TopicEnd(src.topic, "source", where, dst.label))
        if dst.plain:
            self.topic_ends.append(TopicEnd(dst.topic, "destination", where, src.label))
        return src, dst


def _type_name(message_type: Any) -> str:
    return getattr(message_type, "__qualname__", None) or repr(message_type)


def build_plan(
    components: Mapping[str, Component],
    connections: Iterable[object] = (),
    process_components: Iterable[object] = (),
    *,
    force_single_process: bool = False,
    settings: Mapping[str, Mapping[str, object]] | None = None,
) -> Plan:
    """Validate the graph and flatten it. Raises :class:`GraphDefinitionError` naming
    the component, connection or entry at fault.

    *settings* sets fields of components' settings by path (``{"PIPE/FILTER":
    {"cutoff": 30.0}}``): each component's are replaced when the graph reaches it,
    before its ``configure()`` (a collection's settings reach its children) and after
    its parent's (which may have set it). A str for a field that takes no str is read as
    text (:func:`~ezflow._units._settings.value_from_text`: what ``ezflow run --set``
    passes). A path that is not a component, a field that does not exist or a value the
    field refuses raises :class:`GraphDefinitionError`."""
    if not components:
        raise GraphDefinitionError("nothing to run: pass at least one component")
    builder = _Builder(settings)
    for name, component in components.items():
        builder.visit(component, _check_name(name, "components"))
    for path, fields in builder.settings.items():
        known = list(builder.components)
        close = difflib.get_close_matches(path, known, n=1)
        raise GraphDefinitionError(
            f"cannot set {path}.{next(iter(fields))}: there is no component {path!r}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; the graph's components: {', '.join(known)}"
        )
    if not builder.units:
        raise NoUnitsError("nothing to run: the components contain no Unit")

    ends: list[tuple[_End, _End]] = []
    for index, pair in enumerate(_as_list(connections, "connections")):
        ends.append(builder.connection(pair, None, f"connection {index}"))
    for collection in builder.collections:
        pairs = _as_list(collection.network(), f"{collection.path}.network()")
        for index, pair in enumerate(pairs):
            where = f"{collection.path} connection {index}"
            ends.append(builder.connection(pair, collection, where))

    process_of = _place(builder, process_components, force_single_process)
    processes: dict[str, list[str]] = {}
    for path, process in process_of.items():
        processes.setdefault(process, []).append(path)
    for process, paths in processes.items():
        mains = [
            f"{path}.{name}"
            for path in paths
            for name, role in type(builder.units[path]).functions().items()
            if role.kind == "main"
        ]
        if len(mains) > 1:
            raise GraphDefinitionError(
                f"process {process or 'main'} has several @main methods ({', '.join(mains)}); "
                "a process has one main thread: put those units in different "
                "process_components"
            )
    edges = _direct_edges(ends)
    _check_declared_classes_travel(builder, edges, process_of)
    plain = {end.topic for end in builder.topic_ends if end.role == "source"}
    sources: dict[str, set[str]] = {}
    for src, dst in edges:
        sources.setdefault(dst, set()).add(src)
    inputs = {
        stream_topic(path, name)
        for path, unit in builder.units.items()
        for name, stream in type(unit).streams().items()
        if stream.direction == "input"
    }
    external = {topic for topic, srcs in sources.items() if topic in inputs and srcs <= plain}
    return Plan(
        builder.units,
        process_of,
        edges,
        processes,
        builder.notes,
        builder.topic_ends,
        external,
    )


def _check_declared_classes_travel(
    builder: _Builder, edges: list[tuple[str, str]], process_of: dict[str, str]
) -> None:
    """Raise :class:`GraphDefinitionError` for an output that declares a dataclass that
    is not registered and is connected to an input in another process: its messages
    could not travel there (found at start, not at the first message)."""
    owners: dict[str, tuple[str, Any, str]] = {}  # topic -> (unit path, type, label)
    for path, unit in builder.units.items():
        for name, stream in type(unit).streams().items():
            bound = unit._bound_stream(stream)
            owners[stream_topic(path, name)] = (path, bound.message_type, f"{path}.{name}")
    for src, dst in edges:
        source, sink = owners.get(src), owners.get(dst)
        if source is None or sink is None or process_of[source[0]] == process_of[sink[0]]:
            continue
        declared = source[1]
        if (
            isinstance(declared, type)
            and dataclasses.is_dataclass(declared)
            and registered_name(declared) is None
            and declared.__module__ not in KNOWN_MESSAGE_MODULES
        ):
            module = "__main__" if declared.__module__ == "__mp_main__" else declared.__module__
            raise GraphDefinitionError(
                f"{source[2]} declares {module}.{declared.__qualname__}, a dataclass that is "
                f"not registered, and is connected to {sink[2]} in another process "
                f"({process_of[sink[0]] or 'main'}): its messages cannot travel there; "
                f"decorate {declared.__qualname__} with @ezflow.message (or call "
                f"ezflow.register_message({declared.__qualname__})) at module level"
            )


def _as_list(items: Iterable[object] | None, where: str) -> list[object]:
    if items is None:
        return []
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise GraphDefinitionError(f"{where} must be a list of (source, destination) pairs")
    return list(items)


def _place(
    builder: _Builder, entries: Iterable[object], force_single_process: bool
) -> dict[str, str]:
    listed: dict[str, str] = {}  # process path -> where it was listed

    def add(entry: object, where: str, within: Collection | None) -> None:
        entry = builder.native(entry, "placed")
        if not isinstance(entry, Component):
            raise GraphDefinitionError(
                f"{where}: {entry!r} is not a component; list Unit or Collection instances"
            )
        path = builder.paths.get(id(entry))
        if path is None:
            raise GraphDefinitionError(
                f"{where}: a {type(entry).__qualname__} that is not in the graph; list a "
                "component of components= (or one of their children)"
            )
        if within is not None and not path.startswith(within.path + "/"):
            raise GraphDefinitionError(
                f"{where}: {path} is not inside {within.path}; a collection's "
                "process_components() lists its own children"
            )
        if path in listed:
            raise GraphDefinitionError(
                f"{where}: {path} is already listed ({listed[path]}); list it once"
            )
        listed[path] = where

    if isinstance(entries, (str, bytes)) or not isinstance(entries, Iterable):
        raise GraphDefinitionError("process_components must be a list of components")
    for index, entry in enumerate(entries):
        add(entry, f"process_components[{index}]", None)
    for collection in builder.collections:
        for index, entry in enumerate(collection.process_components()):
            add(entry, f"{collection.path}.process_components()[{index}]", collection)
    placement: dict[str, str] = {}
    for path in builder.units:
        process = ""
        if not force_single_process:
            for candidate in listed:
                if (path == candidate or path.startswith(candidate + "/")) and len(candidate) > len(
                    process
                ):
                    process = candidate
        placement[path] = process
    return placement


def _direct_edges(ends: list[tuple[_End, _End]]) -> list[tuple[str, str]]:
    """Resolve connections through collection streams into direct topic edges."""
    forward: dict[str, list[_End]] = {}
    relay_topics: set[str] = set()
    sources: dict[str, _End] = {}
    for src, dst in ends:
        forward.setdefault(src.topic, []).append(dst)
        if src.relay:
            relay_topics.add(src.topic)
        else:
            sources[src.topic] = src
        if dst.relay:
            relay_topics.add(dst.topic)
    edges: list[tuple[str, str]] = []
    seen_edges: set[tuple[str, str]] = set()
    for topic in sources:
        visited = {topic}
        queue = deque([topic])
        while queue:
            for dst in forward.get(queue.popleft(), ()):
                if dst.topic in visited:
                    continue
                visited.add(dst.topic)
                if dst.topic in relay_topics:
                    queue.append(dst.topic)
                elif (topic, dst.topic) not in seen_edges:
                    seen_edges.add((topic, dst.topic))
                    edges.append((topic, dst.topic))
    return edges
