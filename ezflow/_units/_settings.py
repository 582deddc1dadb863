"""Settings (frozen, checked, sent over the wire) and State (mutable, per unit)."""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import logging
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, cast

from .._core._codec import register_message
from .._core._exceptions import ConfigurationError

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # pragma: no cover - Python 3.10: mypy targets 3.11, runtime needs no marker

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda cls: cls


__all__ = [
    "Settings",
    "State",
    "accepts",
    "check_field_types",
    "describe_type",
    "field_hint",
    "message_name",
    "value_from_text",
]

_T = TypeVar("_T")

log = logging.getLogger("ezflow.units")


def message_name(cls: type[Any]) -> str:
    """The wire name of a Settings class: ``module.qualname``, where a class defined in
    the main script keeps the name ``__main__`` in the processes that import that script
    as ``__mp_main__`` (so every process agrees on it)."""
    module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
    return f"{module}.{cls.__qualname__}"


@dataclass_transform(frozen_default=True)
class Settings:
    """Base class of unit and collection settings: subclasses are frozen dataclasses.

    Write fields as annotations with defaults, no decorator needed::

        class SineSettings(ezflow.Settings):
            rate: float = 100.0
            channels: int = 1

    Every subclass is made a ``@dataclass(frozen=True)`` when it is defined and
    registered with the codec (so settings updates travel between processes). On
    construction each field whose annotation is a plain class (``int``, ``float``,
    ``str``, ``bool``, a class of yours), an ``X | None`` union or a ``Literal`` is
    checked; a value of the wrong type raises :class:`~ezflow.ConfigurationError`
    naming the field, the value and the expected type (an ``int`` is accepted for a
    ``float`` field). Change settings with ``dataclasses.replace(settings, rate=2.0)``.

    A class defined again under the same name (a notebook cell run twice) works within
    its process, but only the first definition can travel to other processes.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True)(cls)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Settings, *args: Any, **kw: Any) -> None:
            init(self, *args, **kw)
            if type(self) is cls:
                check_field_types(self)

        cls.__init__ = __init__  # type: ignore[method-assign,assignment]
        try:
            register_message(cls, name=message_name(cls))
        except ConfigurationError:
            # The same name is registered for an earlier class object: this one was
            # redefined (a notebook cell run twice, a reloaded module). It works within
            # this process (local edges never encode); the codec keeps the first.
            log.debug("settings class %s redefined; not registered again", message_name(cls))


class State:
    """Base class of unit state: mutable, one instance per unit, created in the unit's
    own process just before ``initialize()``.

    Annotated fields with a default (or ``dataclasses.field(default_factory=...)``) are
    set on creation; fields without a default are left unset for ``initialize()`` to
    assign (the ezmsg idiom for queues, files and the like)::

        class CounterState(ezflow.State):
            count: int = 0
            seen: list[int] = dataclasses.field(default_factory=list)
            log: typing.TextIO          # set in initialize()
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A dataclass for the field bookkeeping (and a readable repr), but with our
        # __init__: fields without a default must not be constructor arguments.
        dataclasses.dataclass(init=False, eq=False, repr=False)(cls)

    def __init__(self) -> None:
        if type(self) is State:
            return  # the base class itself is not a dataclass
        for f in dataclasses.fields(cast(Any, self)):
            if f.default is not dataclasses.MISSING:
                setattr(self, f.name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                setattr(self, f.name, f.default_factory())

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if hasattr(self, f.name)
        )
        return f"{type(self).__qualname__}({shown})"


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        try:
            hints = typing.get_type_hints(cls)
        except Exception:
            # Forward references that cannot be resolved here: check nothing rather
            # than refuse valid settings.
            hints = {}
        _HINTS[cls] = hints
    return hints


def field_hint(cls: type[Any], name: str) -> Any:
    """The annotation of the field *name* of the settings class *cls* (``Any`` when it
    cannot be resolved)."""
    return _hints(cls).get(name, Any)


def accepts(hint: Any, value: object) -> bool:
    """Whether *value* matches the annotation *hint* as settings fields are checked (see
    :class:`Settings`): outer classes only, ``int`` for ``float``, unions, ``Literal``,
    and anything for what cannot be checked (strings, protocols, ``Any``)."""
    if hint is Any or isinstance(hint, TypeVar):
        return True
    if hint is float:
        return isinstance(value, (float, int)) and not isinstance(value, bool)
    if hint is complex:
        return isinstance(value, (complex, float, int)) and not isinstance(value, bool)
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin is typing.Union or (sys.version_info >= (3, 10) and origin is types.UnionType):
        return any(accepts(arg, value) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin is not None:
        hint = origin  # list[int] -> list, tuple[float, ...] -> tuple: the outer type only
    if isinstance(hint, type):
        try:
            return isinstance(value, hint)
        except TypeError:  # pragma: no cover - exotic classes refusing isinstance
            return True
    return True  # strings, protocols, ... : not checked


def describe_type(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def check_field_types(settings: Settings) -> None:
    """Raise :class:`ConfigurationError` for the first field of *settings* whose value
    does not match its annotation (see :class:`Settings`)."""
    cls = type(settings)
    hints = _hints(cls)
    for f in dataclasses.fields(settings):  # type: ignore[arg-type]
        hint = hints.get(f.name)
        if hint is None:
            continue
        value = getattr(settings, f.name)
        if not accepts(hint, value):
            raise ConfigurationError(
                f"{cls.__qualname__}.{f.name}={value!r} is a {type(value).__name__}, but the "
                f"field is declared as {describe_type(hint)}; pass a {describe_type(hint)}"
            )


_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})
_NONE = frozenset({"none", "null"})
_NOT_PARSED = object()


def _parse(hint: Any, text: str) -> Any:
    """*text* as a value of the annotation *hint*, or ``_NOT_PARSED``."""
    if hint is None or hint is type(None):
        return None if text.lower() in _NONE else _NOT_PARSED
    origin = typing.get_origin(hint)
    if origin is typing.Union or (sys.version_info >= (3, 10) and origin is types.UnionType):
        # str last: "none" in an `int | str | None` field is None, "5" is 5.
        for member in sorted(typing.get_args(hint), key=lambda m: m is str):
            value = _parse(member, text)
            if value is not _NOT_PARSED:
                return value
        return _NOT_PARSED
    if origin is typing.Literal:
        for choice in typing.get_args(hint):
            value = _parse(type(choice), text)
            if value is not _NOT_PARSED and value == choice:
                return choice
        return _NOT_PARSED
    if hint is str or hint is Any or isinstance(hint, TypeVar):
        return text
    if hint is bool:
        lowered = text.lower()
        return True if lowered in _TRUE else False if lowered in _FALSE else _NOT_PARSED
    if hint in (int, float, complex):
        try:
            return hint(text)
        except ValueError:
            return _NOT_PARSED
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if text in hint.__members__:
            return hint.__members__[text]
        for member in hint:
            if str(member.value) == text:
                return member
        return _NOT_PARSED
    try:  # a tuple, list, dict... written as a Python literal
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOT_PARSED
    return value if accepts(hint, value) else _NOT_PARSED


def _what(hint: Any) -> str:
    """What a field of annotation *hint* takes, said for text."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(hint))
    if hint is bool:
        return "a bool (true/false, yes/no, on/off, 1/0)"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(hint.__members__)
    if origin is typing.Union or (sys.version_info >= (3, 10) and origin is types.UnionType):
        return " or ".join("none" if m is type(None) else _what(m) for m in typing.get_args(hint))
    name = describe_type(hint)
    if hint in (int, float, complex, str):
        return f"a{'n' if name[0] in 'aeiou' else ''} {name}"
    return f"a {name} written as a Python literal"


def value_from_text(cls: type[Settings], name: str, text: str) -> Any:
    """The value of the field *name* of the settings class *cls*, written as *text* (as
    on a command line: ``ezflow run --set UNIT.FIELD=VALUE``), read by the field's
    annotation: a ``str`` as written; a ``bool`` from true/false, yes/no, on/off, 1/0;
    an ``int``, ``float`` or ``complex`` as Python reads them; ``None`` from none or
    null (an optional field); a ``Literal`` or an ``Enum`` as one of its values (an
    enum also by member name); anything else as a Python literal (``(1, 2)``,
    ``[0.5, 1.0]``, ``{'a': 1}``) of the declared type. An unannotated field takes the
    text. Raises :class:`ConfigurationError` naming the field, the text and what the
    field takes."""
    hint = field_hint(cls, name)
    value = _parse(hint, text)
    if value is _NOT_PARSED:
        raise ConfigurationError(
            f"{cls.__qualname__}.{name} is declared as {describe_type(hint)}: {text!r} is "
            f"not {_what(hint)}"
        )
    return value
