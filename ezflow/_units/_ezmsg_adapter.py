"""ezmsg components on ezflow: ezmsg ``Unit`` and ``Collection`` instances run as they are.

Private: needs the optional extra (``pip install 'ezflow-pubsub[ezmsg]'``); ezflow imports this
module by itself (``ADAPTER_MODULES`` in ``_foreign.py``) the first time
:func:`ezflow.run` / :class:`ezflow.GraphRunner` meets an object whose class comes from
the ``ezmsg`` package, so user code does not import it (the module ezmsg users import is
:mod:`ezflow.compat.ezmsg`; ``ezflow.ezmsg``, its former name, is a deprecated alias)::

    from ezmsg.sigproc.butterworthfilter import ButterworthFilter, ButterworthFilterSettings
    filt = ButterworthFilter(ButterworthFilterSettings(order=4, cutoff=30.0))
    ezflow.run(SRC=source, FILTER=filt, connections=[(source.OUTPUT, filt.INPUT_SIGNAL)],
               process_components=[filt])

Each ezmsg unit becomes an ezflow unit of a class generated once per ezmsg class
(:class:`EzmsgUnit`): the same stream names (so topics are ``"FILTER/INPUT_SIGNAL"``),
``@subscriber``/``@publisher``/``@task``/``@thread``/``@main`` functions calling the ezmsg
unit's own methods, ``setup()`` (state, settings check, ``initialize``) in the unit's
process and ``shutdown()`` on the way out. ezmsg's :class:`~ezmsg.core.Complete` and
:class:`~ezmsg.core.NormalTermination` become ezflow's. An ezmsg collection becomes an
ezflow collection (:class:`EzmsgCollection`) calling its ``configure()``, ``network()``
and ``process_components()``. Stream types that are not plain classes (a ``TypeVar``, a
union) are taken as ``Any``, and, as in ezmsg, declared types are not checked
when streams are connected; dataclass message types a stream names are registered with
the codec. The rules shared with :mod:`ezflow.compat.ezmsg` are in
:mod:`ezflow._units._ezmsg_rules`. What differs from ezmsg is in docs/ezmsg.md.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, ClassVar, cast

import ezmsg.core as ez
from ezmsg.core.stream import Stream as EzmsgStream

from ._component import Collection, Component, Connection, Unit
from ._decorators import main, publisher, subscriber, task, thread
from ._errors import Complete, GraphDefinitionError, NormalTermination
from ._ezmsg_rules import (
    EZMSG_DEFAULT_NUM_BUFFERS,
    output_options,
    register_stream_type,
    wait_while_running,
)
from ._foreign import register_graph_adapter
from ._settings import Settings
from ._streams import BoundStream, InputStream, OutputStream, Stream

__all__ = ["EzmsgCollection", "EzmsgUnit", "adapt"]


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """ezmsg's end signals raised by an ezmsg function, as ezflow's."""
    try:
        yield
    except ez.Complete as exc:
        raise Complete(*exc.args) from exc
    except ez.NormalTermination as exc:
        raise NormalTermination(*exc.args) from exc


def _ezflow_stream(stream: Any) -> Stream:
    # ezmsg checks no message type when streams are connected (a TypeVar, a union, or a
    # class another unit does not match), so the ezflow stream declares none.
    message_type = Any
    register_stream_type(getattr(stream, "msg_type", None))
    if isinstance(stream, ez.InputStream):
        leaky = bool(stream.leaky)
        return InputStream(message_type, leaky=leaky, queue=stream.max_queue if leaky else None)
    if isinstance(stream, ez.OutputStream):
        options = output_options(
            getattr(stream, "num_buffers", EZMSG_DEFAULT_NUM_BUFFERS),
            getattr(stream, "force_tcp", None),
        )
        return OutputStream(message_type, **options)
    # A collection boundary (InputTopic / OutputTopic / relays, or a plain Topic).
    if type(stream).__name__.startswith("Input"):
        return InputStream(message_type)
    return OutputStream(message_type)


def _address(component: Any, path: str) -> None:
    """Give the ezmsg component (and its streams) the address ezmsg would: its path."""
    parts = path.split("/")
    component._name = parts[-1]
    component._location = parts[:-1]
    for stream in component.streams.values():
        stream._location = parts


class _Adapted:
    """What the generated classes share: the ezmsg component, its settings, its path."""

    _ezmsg: Any
    _ezmsg_class: ClassVar[type[Any]]
    _ezflow_ezmsg_wiring = True

    def _adapted_init(self, component: Any) -> None:
        self._ezmsg = component
        self._ezflow_path = ""
        self.name = ""

    @property
    def path(self) -> str:
        return self._ezflow_path

    @path.setter
    def path(self, value: str) -> None:
        self._ezflow_path = value
        if value:
            _address(self._ezmsg, value)

    @property
    def SETTINGS(self) -> Any:
        return self._ezmsg.SETTINGS

    @SETTINGS.setter
    def SETTINGS(self, settings: Any) -> None:
        if settings is not None:
            self._ezmsg.apply_settings(settings)

    @classmethod
    def settings_type(cls) -> type[Settings] | None:
        # ezmsg settings classes are frozen dataclasses too, not ezflow.Settings.
        return cast("type[Settings] | None", getattr(cls._ezmsg_class, "__settings_type__", None))

    def apply_settings(self, settings: Any) -> None:
        self._ezmsg.apply_settings(settings)

    @property
    def ezmsg_component(self) -> Any:
        """The ezmsg unit or collection this component runs."""
        return self._ezmsg

    def __repr__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return f"<ezmsg {type(self).__qualname__}{where}>"


class EzmsgUnit(_Adapted, Unit):
    """Base of the ezflow unit classes generated for ezmsg unit classes (one per class).

    ``initialize()`` calls the ezmsg unit's ``setup()`` (a fresh ``STATE``, the check that
    settings were applied, its ``initialize()``); ``shutdown()`` calls its
    ``shutdown()``; settings arriving on an ``INPUT_SETTINGS`` stream the ezmsg class
    declares are applied (``apply_settings``) before its own subscriber sees them.
    """

    _ezmsg_outputs: ClassVar[dict[str, Stream]] = {}

    def __init__(self, component: Any) -> None:  # no Unit.__init__: ezmsg built it
        self._adapted_init(component)
        self.STATE = None
        self._ezflow_running = False
        self._ezflow_outlets = {}

    @classmethod
    def state_type(cls) -> None:
        return None  # ezmsg's setup() creates the ezmsg unit's STATE

    async def initialize(self) -> None:
        self._ezmsg.STATE = None  # setup() creates it (again, when a graph runs twice)
        await self._ezmsg.setup()

    async def shutdown(self) -> None:
        result = self._ezmsg.shutdown()
        if inspect.isawaitable(result):
            await result

    def on_settings(self, settings: Settings) -> None:
        """Nothing: an ezmsg unit reacts to settings in its own ``INPUT_SETTINGS``
        subscriber, if it declares one."""

    def _output(self, stream: Any) -> Any:
        # ezmsg functions yield their instance's streams; ezflow wants its own.
        name = getattr(stream, "_name", None)
        return type(self)._ezmsg_outputs.get(name, stream) if isinstance(name, str) else stream

    def __reduce__(self) -> tuple[Any, ...]:
        return (_new_unit, (type(self._ezmsg),), dict(self.__dict__))


def _new_unit(ezmsg_class: type[Any]) -> EzmsgUnit:
    cls = _unit_class(ezmsg_class)
    return cls.__new__(cls)


class EzmsgCollection(_Adapted, Collection):
    """Base of the ezflow collection classes generated for ezmsg collection classes:
    ``configure()``, ``network()`` and ``process_components()`` call the ezmsg
    collection's. A collection that lists itself in ``process_components()`` (ezmsg's
    default) runs where its parent places it."""

    def __init__(self, component: Any, adapter: _Adapter) -> None:
        self._adapted_init(component)
        self._adapter = adapter

    def configure(self) -> None:
        self._ezmsg.configure()

    def components(self) -> dict[str, Component]:
        return {
            name: self._adapter.component(child) for name, child in self._ezmsg.components.items()
        }

    def network(self) -> list[Connection]:
        return [self._adapter.connection(pair) for pair in self._ezmsg.network()]

    def process_components(self) -> list[Component]:
        entries = [self._adapter.placed(entry) for entry in self._ezmsg.process_components()]
        return [entry for entry in entries if entry is not self]


# -- generated classes -------------------------------------------------------------------

_UNIT_CLASSES: dict[type[Any], type[EzmsgUnit]] = {}
_COLLECTION_CLASSES: dict[type[Any], type[EzmsgCollection]] = {}


def _collection_class(ezmsg_class: type[Any]) -> type[EzmsgCollection]:
    cls = _COLLECTION_CLASSES.get(ezmsg_class)
    if cls is None:
        namespace: dict[str, Any] = {
            "__module__": ezmsg_class.__module__,
            "__qualname__": ezmsg_class.__qualname__,
            "_ezmsg_class": ezmsg_class,
        }
        for name, stream in ezmsg_class.__streams__.items():
            namespace[name] = _ezflow_stream(stream)
        cls = _COLLECTION_CLASSES[ezmsg_class] = cast(
            "type[EzmsgCollection]",
            type(ezmsg_class.__name__, (EzmsgCollection,), namespace),
        )
    return cls


def _unit_class(ezmsg_class: type[Any]) -> type[EzmsgUnit]:
    cls = _UNIT_CLASSES.get(ezmsg_class)
    if cls is None:
        cls = _UNIT_CLASSES[ezmsg_class] = _build_unit_class(ezmsg_class)
    return cls


def _method_name(name: str) -> str:
    # An ezmsg method named like an ezflow Unit attribute (on_settings, publish, ...)
    # must not replace it: the host calls those itself.
    return f"ezmsg_{name}" if hasattr(EzmsgUnit, name) else name


def _build_unit_class(ezmsg_class: type[Any]) -> type[EzmsgUnit]:
    namespace: dict[str, Any] = {
        "__module__": ezmsg_class.__module__,
        "__qualname__": ezmsg_class.__qualname__,
        "_ezmsg_class": ezmsg_class,
    }
    streams: dict[str, Stream] = {}
    for name, stream in ezmsg_class.__streams__.items():
        streams[name] = namespace[name] = _ezflow_stream(stream)
    outputs: dict[str, Stream] = {
        name: s for name, s in streams.items() if isinstance(s, OutputStream)
    }
    namespace["_ezmsg_outputs"] = outputs
    for name, fn in ezmsg_class.__tasks__.items():
        namespace[_method_name(name)] = _task_method(ezmsg_class, name, fn, streams, outputs)
    for name, fn in ezmsg_class.__threads__.items():
        namespace[_method_name(name)] = thread(_blocking_method(fn))
    main_fn = ezmsg_class.__main__
    if main_fn is not None:
        method = _blocking_method(main_fn, wait_for_stop=True)
        namespace[_method_name(main_fn.__name__)] = main(method)
    return cast("type[EzmsgUnit]", type(ezmsg_class.__name__, (EzmsgUnit,), namespace))


def _blocking_method(
    fn: Callable[..., Any], *, wait_for_stop: bool = False
) -> Callable[[EzmsgUnit], None]:
    def method(self: EzmsgUnit) -> None:
        with _translated():
            fn(self._ezmsg)
        if wait_for_stop:  # ezmsg's @main returning does not end the graph
            wait_while_running(self)

    method.__name__ = method.__qualname__ = fn.__name__
    return method


def _task_method(
    ezmsg_class: type[Any],
    name: str,
    fn: Callable[..., Any],
    streams: dict[str, Stream],
    outputs: dict[str, Stream],
) -> Callable[..., Any]:
    subscribes = getattr(fn, "__ez_subscribes__", None)
    publishes = [outputs[s.name] for s in getattr(fn, "__ez_publishes__", ()) if s.name in outputs]
    takes_message = len(inspect.signature(fn).parameters) >= 2
    method: Callable[..., Any]
    if inspect.isasyncgenfunction(fn):

        async def generate(self: EzmsgUnit, msg: Any = None) -> AsyncIterator[Any]:
            with _translated():
                produced = fn(self._ezmsg, msg) if takes_message else fn(self._ezmsg)
                async for stream, message in produced:
                    yield self._output(stream), message

        method = generate
        # An ezmsg generator may yield to any output of its unit.
        for stream in publishes or list(outputs.values()):
            method = publisher(cast(OutputStream, stream))(method)
    elif subscribes is not None and not inspect.iscoroutinefunction(fn):

        def call(self: EzmsgUnit, msg: Any) -> None:
            with _translated():
                fn(self._ezmsg, msg)

        method = call
    else:

        async def run(self: EzmsgUnit, msg: Any = None) -> None:
            with _translated():
                result = fn(self._ezmsg, msg) if takes_message else fn(self._ezmsg)
                if inspect.isawaitable(result):
                    await result

        method = run
        if subscribes is None:
            method = task(method)
    method.__name__ = method.__qualname__ = name
    if subscribes is not None:
        declared = streams.get(getattr(subscribes, "_name", None) or "")
        if not isinstance(declared, InputStream):
            raise GraphDefinitionError(
                f"{ezmsg_class.__qualname__}.{name} subscribes to {subscribes!r}, which is "
                f"not an input stream of {ezmsg_class.__qualname__}"
            )
        method = subscriber(declared)(method)
    return method


# -- the graph adapter -------------------------------------------------------------------


class _Adapter:
    """Translates one graph: the same ezmsg object always gives the same ezflow one."""

    def __init__(self) -> None:
        self._components: dict[int, Component] = {}
        self._streams: dict[int, tuple[Component, str]] = {}

    def component(self, obj: Any) -> Any:
        known = self._components.get(id(obj))
        if known is not None:
            return known
        adapted: Component
        if isinstance(obj, ez.Unit):
            adapted = _unit_class(type(obj))(obj)
        elif isinstance(obj, ez.Collection):
            adapted = _collection_class(type(obj))(obj, self)
        else:
            return obj  # an ezflow component, or something the plan will refuse
        self._components[id(obj)] = adapted
        for name, stream in obj.streams.items():
            self._streams[id(stream)] = (adapted, name)
        return adapted

    def endpoint(self, end: Any) -> Any:
        if isinstance(end, (BoundStream, str)):
            return end
        owner = self._streams.get(id(end))
        if owner is not None:
            component, name = owner
            return component._bound_stream(type(component).streams()[name])
        if isinstance(end, ez.Component):
            return self.component(end)  # the plan says it is a component, not a stream
        if isinstance(end, EzmsgStream):
            raise GraphDefinitionError(
                f"{end!r} is a stream of an ezmsg component that is not in the graph (or of "
                "its class); add that component to the graph and connect its instance's "
                "stream"
            )
        return end

    def connection(self, pair: Any) -> Any:
        if isinstance(pair, (tuple, list)) and len(pair) == 2:
            return (self.endpoint(pair[0]), self.endpoint(pair[1]))
        return pair

    def placed(self, entry: Any) -> Any:
        if isinstance(entry, ez.Component):
            return self.component(entry)  # the plan says whether it is in the graph
        return entry


def adapt(component: Any) -> Component:
    """The ezflow component that runs the ezmsg unit or collection *component* (for a
    graph built by hand; :func:`ezflow.run` adapts ezmsg components by itself). Raises
    :class:`TypeError` for anything else."""
    if not isinstance(component, ez.Component):
        raise TypeError(f"{component!r} is not an ezmsg Unit or Collection")
    return cast(Component, _Adapter().component(component))


register_graph_adapter("ezmsg", _Adapter, component_base="ezmsg.core.component.Component")
