"""Components: Unit (does the work) and Collection (groups components and wires them)."""

from __future__ import annotations

import copy
import inspect
import typing
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._core._exceptions import ClosedResourceError
from ._decorators import FunctionRole, role_of
from ._errors import GraphDefinitionError
from ._foreign import adaptable
from ._settings import Settings, State
from ._streams import BoundStream, InputStream, OutputStream, Stream

if TYPE_CHECKING:  # numpy.typing costs ~15 ms to import; annotations only
    from numpy.typing import DTypeLike

__all__ = ["Collection", "Component", "Connection", "Endpoint", "Unit"]

#: One end of a connection: a component's stream, or a topic name (for low-level
#: publishers and subscribers outside the declarative graph).
Endpoint = BoundStream[Any] | str
Connection = tuple[Endpoint, Endpoint]


def _declared_class(cls: type[Any], attribute: str, base: type[Any]) -> type[Any] | None:
    """The SETTINGS/STATE class of *cls*: ``SETTINGS = X`` or ``SETTINGS: X``."""
    for klass in cls.__mro__:
        value = klass.__dict__.get(attribute)
        if isinstance(value, type):
            return value
        if attribute in inspect.get_annotations(klass):
            try:
                hint = typing.get_type_hints(klass).get(attribute)
            except Exception as exc:
                raise TypeError(
                    f"cannot resolve the annotation {klass.__qualname__}.{attribute}: {exc}"
                ) from exc
            if isinstance(hint, type) and issubclass(hint, base):
                return hint
    return None


class Component:
    """Base of :class:`Unit` and :class:`Collection`: settings and stream declarations.

    Construct with a settings object, with the settings' fields as keywords, or with
    nothing when every field has a default::

        Sine(SineSettings(rate=500.0))   # or Sine(rate=500.0), or Sine()

    ``self.SETTINGS`` is the settings object (``None`` when the class declares no
    ``SETTINGS``). A settings object of another class raises
    :class:`~ezflow.GraphDefinitionError` naming both classes.
    """

    SETTINGS: Any
    _ezflow_streams: ClassVar[dict[str, Stream]] = {}
    #: An ezflow component (also one generated for another framework's class, whose
    #: ``__module__`` is that framework's): never handed to a graph adapter.
    _ezflow_native: ClassVar[bool] = True
    #: Connects as ezmsg does (ezflow.compat.ezmsg's and adapted ezmsg components): an
    #: output connected to another unit's output joins the topics instead of failing.
    _ezflow_ezmsg_wiring: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        streams: dict[str, Stream] = {}
        for klass in reversed(cls.__mro__):
            for name, value in klass.__dict__.items():
                if isinstance(value, Stream):
                    streams[name] = value
        cls._ezflow_streams = streams

    def __init__(self, settings: Settings | None = None, **fields: Any) -> None:
        self.path = ""
        self.name = ""
        self.SETTINGS = None
        settings_type = self.settings_type()
        if settings is not None and fields:
            raise GraphDefinitionError(
                f"{type(self).__qualname__}: pass a settings object or keyword fields, not both"
            )
        if fields:
            if settings_type is None:
                raise GraphDefinitionError(
                    f"{type(self).__qualname__} declares no SETTINGS class, so it takes no "
                    f"settings (got {', '.join(fields)})"
                )
            try:
                settings = settings_type(**fields)
            except TypeError as exc:
                raise GraphDefinitionError(f"{type(self).__qualname__}: {exc}") from exc
        if settings is None and settings_type is not None:
            try:
                settings = settings_type()
            except TypeError:
                settings = None  # required fields: settings must come later (configure)
        if settings is not None:
            self.apply_settings(settings)

    @classmethod
    def settings_type(cls) -> type[Settings] | None:
        """The class's SETTINGS class (``SETTINGS = X`` or ``SETTINGS: X``), or None."""
        found = _declared_class(cls, "SETTINGS", Settings)
        if found is not None and not issubclass(found, Settings):
            raise TypeError(
                f"{cls.__qualname__}.SETTINGS is {found.__qualname__}, which is not an "
                "ezflow.Settings subclass"
            )
        return found

    @classmethod
    def streams(cls) -> dict[str, Stream]:
        """Every stream the class declares (inherited ones included), by name."""
        return dict(cls._ezflow_streams)

    def apply_settings(self, settings: Settings) -> None:
        """Set this component's settings before the graph starts (for a running unit,
        send them to its ``INPUT_SETTINGS`` stream instead). Raises
        :class:`~ezflow.GraphDefinitionError` for settings of the wrong class."""
        expected = self.settings_type()
        if expected is None:
            raise GraphDefinitionError(
                f"{self._label()}: {type(self).__qualname__} declares no SETTINGS class, so "
                f"it takes no settings (got {type(settings).__qualname__})"
            )
        if not isinstance(settings, expected):
            raise GraphDefinitionError(
                f"{self._label()}: settings are a {type(settings).__qualname__}, but "
                f"{type(self).__qualname__} expects {expected.__qualname__} (its SETTINGS); "
                f"pass {type(self).__qualname__}({expected.__qualname__}(...))"
            )
        self.SETTINGS = settings

    def _label(self) -> str:
        return self.path or type(self).__qualname__

    def _bound_stream(self, stream: Stream) -> BoundStream[Any]:
        cache: dict[str, BoundStream[Any]] | None = self.__dict__.get("_ezflow_bound")
        if cache is None:
            cache = self.__dict__["_ezflow_bound"] = {}
        bound = cache.get(stream.name)
        if bound is None or bound.stream is not stream:
            bound = cache[stream.name] = BoundStream(self, stream)
            # Streams are non-data descriptors: from now on `self.OUTPUT` is a plain
            # instance-dict lookup (it is read on every yield of a publisher).
            self.__dict__[stream.name] = bound
        return bound

    def __repr__(self) -> str:
        where = f" {self.path}" if getattr(self, "path", "") else ""
        return f"<{type(self).__qualname__}{where}>"


class Unit(Component):
    """A component that does the work: receives, computes, publishes.

    Declare ``SETTINGS``, ``STATE``, streams and decorated methods in the class body.
    Lifecycle, in the unit's own process: ``STATE`` is created, ``initialize()`` runs,
    the streams are registered, every process waits at the start barrier, then
    subscribers, publishers, tasks, threads and ``@main`` run; on the way out tasks are
    cancelled, threads joined (bounded) and ``shutdown()`` runs. ``initialize``,
    ``shutdown`` and ``on_settings`` may be plain or ``async`` methods.

    Every unit has an ``INPUT_SETTINGS`` stream: a settings object arriving there
    replaces ``self.SETTINGS`` and then ``on_settings(settings)`` is called.
    """

    STATE: Any
    INPUT_SETTINGS = InputStream(Settings)
    _ezflow_functions: ClassVar[dict[str, FunctionRole]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        functions: dict[str, FunctionRole] = {}
        for klass in reversed(cls.__mro__):
            for name, value in klass.__dict__.items():
                role = role_of(value)
                if role is not None:
                    functions[name] = role
                elif name in functions:
                    del functions[name]  # overridden by an undecorated method
        for name, role in functions.items():
            _check_role(cls, name, getattr(cls, name), role)
        mains = [name for name, role in functions.items() if role.kind == "main"]
        if len(mains) > 1:
            raise TypeError(
                f"{cls.__qualname__} has several @main methods ({', '.join(mains)}); a "
                "process has one main thread, so a unit has at most one"
            )
        cls._ezflow_functions = functions
        state_type = _declared_class(cls, "STATE", State)
        if state_type is not None and not issubclass(state_type, State):
            raise TypeError(f"{cls.__qualname__}.STATE must be an ezflow.State subclass")

    def __init__(self, settings: Settings | None = None, **fields: Any) -> None:
        super().__init__(settings, **fields)
        self.STATE = None
        self._ezflow_running = False
        self._ezflow_outlets: dict[object, Any] = {}

    @classmethod
    def state_type(cls) -> type[State] | None:
        """The class's STATE class (``STATE = X`` or ``STATE: X``), or None."""
        return _declared_class(cls, "STATE", State)

    @classmethod
    def functions(cls) -> dict[str, FunctionRole]:
        """The decorated methods of the class, by name, in definition order."""
        return dict(cls._ezflow_functions)

    @property
    def running(self) -> bool:
        """True from the start barrier until the graph begins to stop (``@thread``
        loops watch it)."""
        return self._ezflow_running

    def initialize(self) -> Any:
        """Called once in the unit's process before the graph starts (override)."""

    def shutdown(self) -> Any:
        """Called once in the unit's process when the graph stops (override); runs
        even when the graph stops because of an error."""

    def on_settings(self, settings: Settings) -> Any:
        """Called after new settings arrived on ``INPUT_SETTINGS`` and replaced
        ``self.SETTINGS`` (override)."""

    async def publish(self, stream: BoundStream[OutputStream] | OutputStream, message: Any) -> None:
        """Publish *message* on one of this unit's output streams from any method
        running on the event loop (a ``@task``, ``initialize`` excluded). Same flow
        control and errors as :meth:`ezflow.Publisher.publish`; raises
        :class:`~ezflow.ClosedResourceError` when the graph is not running."""
        outlet = self._ezflow_outlets.get(stream)
        if outlet is None:
            if not self._ezflow_outlets:
                raise ClosedResourceError(
                    f"{self._label()}: publish() works only while the graph runs"
                )
            raise ValueError(f"{self._label()}: {stream!r} is not an output stream of this unit")
        await outlet.publish(message)

    async def loan(
        self,
        stream: BoundStream[OutputStream] | OutputStream,
        shape: int | tuple[int, ...],
        dtype: DTypeLike = np.uint8,
    ) -> np.ndarray[Any, Any]:
        """A writable array in the shared memory of one of this unit's outputs (see
        :meth:`ezflow.Publisher.loan`): fill it, then yield or :meth:`publish` it on
        that stream, and shm subscribers get it without any copy. Raises like
        :meth:`publish` when the graph is not running or *stream* is not an output of
        this unit."""
        outlet = self._ezflow_outlets.get(stream)
        if outlet is None:
            if not self._ezflow_outlets:
                raise ClosedResourceError(
                    f"{self._label()}: loan() works only while the graph runs"
                )
            raise ValueError(f"{self._label()}: {stream!r} is not an output stream of this unit")
        array: np.ndarray[Any, Any] = await outlet.loan(shape, dtype)
        return array


def _check_role(cls: type[Unit], name: str, fn: Any, role: FunctionRole) -> None:
    where = f"{cls.__qualname__}.{name}"
    streams = cls._ezflow_streams
    if role.subscribes is not None:
        declared = streams.get(role.subscribes.name)
        if not isinstance(declared, InputStream):
            raise TypeError(
                f"{where} subscribes to {role.subscribes!r}, which is not an input stream of "
                f"{cls.__qualname__}; declare it in the class body"
            )
        if inspect.isasyncgenfunction(fn) and not role.publishes:
            raise TypeError(
                f"{where} is an async generator but has no @ezflow.publisher(STREAM); add "
                "one for each stream it yields to, or make it a plain `async def`"
            )
    for stream in role.publishes:
        if not isinstance(streams.get(stream.name), OutputStream):
            raise TypeError(
                f"{where} publishes to {stream!r}, which is not an output stream of "
                f"{cls.__qualname__}; declare it in the class body"
            )


class Collection(Component):
    """A component that groups others and wires them.

    Declare child components as class attributes (each Collection instance gets its own
    deep copy) or assign them in ``configure()`` — ezflow's, or ezmsg's units and
    collections (with ezflow-pubsub[ezmsg]: ``DEBUG = DebugLog()`` from ``ezmsg.util``);
    declare collection-level streams to relay messages in and out (they become direct
    edges between the units, no messages are copied)::

        class Pipeline(ezflow.Collection):
            INPUT = ezflow.InputStream(np.ndarray)
            OUTPUT = ezflow.OutputStream(np.ndarray)
            FILTER = Filter()
            SCALE = Scale()

            def configure(self):
                self.FILTER.apply_settings(FilterSettings(cutoff=self.SETTINGS.cutoff))

            def network(self):
                return [(self.INPUT, self.FILTER.INPUT),
                        (self.FILTER.OUTPUT, self.SCALE.INPUT),
                        (self.SCALE.OUTPUT, self.OUTPUT)]

            def process_components(self):
                return [self.SCALE]          # SCALE gets its own process
    """

    def __init__(self, settings: Settings | None = None, **fields: Any) -> None:
        super().__init__(settings, **fields)
        memo: dict[int, Any] = {}
        for klass in reversed(type(self).__mro__):
            for name, value in klass.__dict__.items():
                if isinstance(value, Component) or adaptable(value):
                    setattr(self, name, copy.deepcopy(value, memo))

    def configure(self) -> None:
        """Called once, in the process calling ``run``, before ``network()``: pass
        settings down to children (``self.CHILD.apply_settings(...)``) or create them."""

    def network(self) -> Iterable[Connection]:
        """The connections inside this collection, as ``(source, destination)`` pairs
        of streams (``self.CHILD.OUTPUT``, ``self.INPUT``, ...) or topic names."""
        return ()

    def process_components(self) -> Iterable[Component]:
        """Children (or deeper descendants) to run in processes of their own."""
        return ()

    def components(self) -> dict[str, Component]:
        """The child components, by name, in declaration order (another framework's
        components as they are: the graph translates them)."""
        return {
            name: value
            for name, value in self.__dict__.items()
            if (isinstance(value, Component) or adaptable(value)) and not name.startswith("_")
        }
