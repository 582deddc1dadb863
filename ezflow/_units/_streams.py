"""Stream declarations: InputStream, OutputStream, and a stream bound to a component."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from .._core._config import (
    DEFAULT_LEAKY_QUEUE,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_IN_FLIGHT_BYTES,
    ShmOptions,
    check_positive,
    check_stall_timeout,
    check_transport,
)
from .._core._exceptions import ConfigurationError
from ._settings import accepts, describe_type

if TYPE_CHECKING:
    from ._component import Component

__all__ = [
    "BoundStream",
    "InputStream",
    "OutputStream",
    "Stream",
    "message_check",
    "type_name",
    "types_compatible",
]

_S = TypeVar("_S", bound="Stream")


class Stream:
    """A stream declared in a Unit or Collection class body (see the subclasses).

    *message_type* is the class of the messages (``np.ndarray``, a dataclass, ``int``,
    ...) or ``typing.Any``/``object`` for anything. When both ends of a connection
    declare a class, the output's must be the input's class or a subclass of it.
    """

    direction = ""

    def __init__(self, message_type: Any = Any, *, transport: str | None = None) -> None:
        self.message_type = message_type
        self.transport = check_transport(transport, setting="transport")
        self.name = ""  # set by __set_name__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        if self.name and self.name != name:
            raise TypeError(
                f"the stream {self.name} is also assigned to {owner.__qualname__}.{name}; "
                "declare a new stream object for each name"
            )
        self.name = name

    @overload
    def __get__(self: _S, obj: None, owner: type[Any] | None = None) -> _S: ...

    @overload
    def __get__(self, obj: Component, owner: type[Any] | None = None) -> BoundStream[Any]: ...

    def __get__(self, obj: Component | None, owner: type[Any] | None = None) -> Any:
        if obj is None:
            return self
        return obj._bound_stream(self)

    def __repr__(self) -> str:
        kind = type(self).__name__
        type_name = getattr(self.message_type, "__qualname__", repr(self.message_type))
        return f"<{kind} {self.name or '?'}: {type_name}>"


class InputStream(Stream):
    """A stream a component receives on.

    ``leaky=True`` keeps only the newest *queue* messages (default 1), counting drops,
    and never slows publishers; lossless (default) input makes publishers wait when it
    falls ``max_in_flight`` messages behind. *transport* forces ``"local"``, ``"shm"``
    or ``"tcp"`` for this input's edges (default: automatic).
    """

    direction = "input"

    def __init__(
        self,
        message_type: Any = Any,
        *,
        leaky: bool = False,
        queue: int | None = None,
        transport: str | None = None,
    ) -> None:
        super().__init__(message_type, transport=transport)
        if queue is not None and not leaky:
            raise ConfigurationError(
                "InputStream(queue=...) only applies to leaky inputs (leaky=True); a "
                "lossless input is bounded by each publisher's max_in_flight"
            )
        self.leaky = bool(leaky)
        self.queue: int | None = None
        if leaky:
            self.queue = check_positive(
                DEFAULT_LEAKY_QUEUE if queue is None else queue, setting="queue"
            )


class OutputStream(Stream):
    """A stream a component publishes on.

    *max_in_flight* / *max_in_flight_bytes* bound what each lossless subscribing
    process may hold unreleased before publishing waits; *transport* forces a
    transport for this output's edges (an input's own choice wins); *shm* sizes its
    shared-memory ring (:class:`~ezflow.ShmOptions`); *stall_timeout* (seconds, default
    ``None``: off, lossless stays lossless) cuts a lossless subscribing process that
    released nothing for that long while publishing waited on it.
    """

    direction = "output"

    def __init__(
        self,
        message_type: Any = Any,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES,
        transport: str | None = None,
        shm: ShmOptions | None = None,
        stall_timeout: float | None = None,
    ) -> None:
        super().__init__(message_type, transport=transport)
        self.stall_timeout = check_stall_timeout(stall_timeout)
        self.max_in_flight = check_positive(max_in_flight, setting="max_in_flight")
        self.max_in_flight_bytes = check_positive(
            max_in_flight_bytes, setting="max_in_flight_bytes"
        )
        if shm is not None and not isinstance(shm, ShmOptions):
            raise ConfigurationError(f"shm={shm!r} must be an ezflow.ShmOptions")
        self.shm = shm


class BoundStream(Generic[_S]):
    """A stream of one component instance: what ``unit.OUTPUT`` returns, what
    connections are made of, and what publisher functions yield with each message."""

    __slots__ = ("component", "stream")

    def __init__(self, component: Component, stream: _S) -> None:
        self.component = component
        self.stream = stream

    @property
    def name(self) -> str:
        return self.stream.name

    @property
    def message_type(self) -> Any:
        if self.stream.name == "INPUT_SETTINGS":
            settings_type = self.component.settings_type()
            if settings_type is not None:
                return settings_type
        return self.stream.message_type

    def __repr__(self) -> str:
        path = self.component.path or type(self.component).__qualname__
        return f"{path}.{self.stream.name}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebind, (self.component, self.stream.name))


def _rebind(component: Component, name: str) -> BoundStream[Stream]:
    return component._bound_stream(type(component).streams()[name])


def _class_of(message_type: Any) -> type[Any] | None:
    if message_type is Any or message_type is object:
        return None
    origin = typing.get_origin(message_type)
    if origin is not None and isinstance(origin, type):
        return origin
    return message_type if isinstance(message_type, type) else None


def types_compatible(output_type: Any, input_type: Any) -> bool:
    """Whether an output declaring *output_type* may feed an input declaring
    *input_type*: true when either is undeclared (``Any``/``object``/not a class) or the
    output's class is the input's class or a subclass of it."""
    produced, accepted = _class_of(output_type), _class_of(input_type)
    if produced is None or accepted is None:
        return True
    try:
        return issubclass(produced, accepted)
    except TypeError:  # pragma: no cover - classes that refuse issubclass
        return True


def message_check(message_type: Any) -> Callable[[object], bool] | None:
    """A function telling whether a message matches the declared *message_type*, or None
    when every message does (``Any``, ``object``, a ``TypeVar``).

    A class is an ``isinstance`` check (``np.ndarray`` accepts every array); a generic
    alias checks its outer class (``list[int]``: a list; ``npt.NDArray[np.float32]``: an
    ndarray); unions accept any member, ``Literal`` its values, ``float`` an ``int`` too,
    as settings fields are checked (:func:`~ezflow._units._settings.accepts`); what
    cannot be checked at run time (strings, protocols) accepts everything.
    """
    if message_type is Any or message_type is object or isinstance(message_type, TypeVar):
        return None
    if message_type is float or message_type is complex:
        numbers = (float, int) if message_type is float else (complex, float, int)

        def is_number(message: object) -> bool:
            return isinstance(message, numbers) and type(message) is not bool

        return is_number
    classes = _plain_classes(message_type)
    if classes is not None:
        # One isinstance call (worked out once: the check is on the message path).

        def is_instance(message: object) -> bool:
            return isinstance(message, classes)

        return is_instance

    def matches(message: object) -> bool:
        return accepts(message_type, message)

    return matches


def _plain_classes(message_type: Any) -> tuple[type[Any], ...] | None:
    """The classes a message of *message_type* may be an instance of, when an
    ``isinstance`` check says all (not for ``float``, ``Literal``, strings, ...)."""
    if message_type is None or message_type is type(None):
        return (type(None),)
    if isinstance(message_type, type) and typing.get_origin(message_type) is None:
        return None if message_type in (float, complex) else (message_type,)
    origin = typing.get_origin(message_type)
    if origin is typing.Union or origin is types.UnionType:
        found: tuple[type[Any], ...] = ()
        for arg in typing.get_args(message_type):
            classes = _plain_classes(arg)
            if classes is None:
                return None
            found += classes
        return found
    if isinstance(origin, type):
        return (origin,)
    return None


def type_name(tp: Any) -> str:
    """``numpy.ndarray``, ``str``, ``list[int]``: a type as messages about it show it."""
    if isinstance(tp, type) and typing.get_origin(tp) is None:
        module = tp.__module__
        if module in ("builtins", "__main__", "__mp_main__"):
            return tp.__qualname__
        return f"{module}.{tp.__qualname__}"
    return describe_type(tp)
