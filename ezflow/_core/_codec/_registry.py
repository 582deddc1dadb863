"""The message type registry: which dataclasses travel, under which wire names.

Dataclasses registered with :func:`register_message` / :func:`message` are encoded as
``EXT_DATACLASS`` ``[name, {init field: value}]`` and rebuilt in the receiving process
from the class registered there under the same name, by calling it with its ``init``
fields as keyword arguments (``init=False`` fields are recomputed by the constructor).
The registry is process-global. A name this process does not know is looked up in
:data:`KNOWN_MESSAGE_MODULES`, then offered to the hook of :func:`set_unknown_type_hook`
(see :func:`_entry_for_name`).
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

import msgpack

from .._exceptions import ConfigurationError

_T = TypeVar("_T")


def _qualname(tp: type) -> str:
    if tp.__module__ == "builtins":
        return tp.__qualname__
    # A script is __main__ where it runs and __mp_main__ in a unit process: the user
    # knows it as __main__ (as the wire name does, see _default_name).
    module = "__main__" if tp.__module__ == "__mp_main__" else tp.__module__
    return f"{module}.{tp.__qualname__}"


@dataclasses.dataclass(frozen=True, slots=True)
class _MessageType:
    cls: type[Any]
    name: str
    fields: tuple[str, ...]
    # msgpack ``fixarray(2)`` header + packed name: the payload is this + packed fields.
    prefix: bytes


_TYPES_BY_NAME: dict[str, _MessageType] = {}
_TYPES_BY_CLASS: dict[type[Any], _MessageType] = {}
_REGISTRY_LOCK = threading.Lock()


def _default_name(cls: type) -> str:
    module = cls.__module__
    # A script is ``__main__`` where it runs and ``__mp_main__`` where a process started
    # from it (multiprocessing's spawn, ezflow's unit processes) imports it: one script,
    # one name on the wire.
    if module == "__mp_main__":
        module = "__main__"
    return f"{module}.{cls.__qualname__}"


def register_message(cls: type[_T], *, name: str | None = None) -> type[_T]:
    """Make the dataclass *cls* encodable, under *name* on the wire, and return *cls*.

    *name* defaults to ``f"{cls.__module__}.{cls.__qualname__}"`` (a script's module
    counting as ``__main__`` also where a child process imports it as ``__mp_main__``);
    sender and receiver must register the class under the same name. The registry is
    process-global.
    Registering a class again under the same name (or with no name) is a no-op.

    Raises :class:`TypeError` if *cls* is not a dataclass or *name* is not a str, and
    :class:`ConfigurationError` if *name* is empty, if *name* is taken by another class
    (the message names both), or if *cls* is already registered under another name.
    """
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        what = _qualname(cls) if isinstance(cls, type) else f"{cls!r} (not a class)"
        raise TypeError(
            f"register_message() needs a dataclass, and {what} is not one; decorate it "
            "with @dataclasses.dataclass first"
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"message name must be a str, not {type(name).__name__}")
    if name == "":
        raise ConfigurationError(f"message name for {_qualname(cls)} must not be empty")
    with _REGISTRY_LOCK:
        existing = _TYPES_BY_CLASS.get(cls)
        if existing is not None:
            if name is None or name == existing.name:
                return cls
            raise ConfigurationError(
                f"{_qualname(cls)} is already registered as message type "
                f"{existing.name!r}; it cannot also be registered as {name!r}"
            )
        wire_name = name if name is not None else _default_name(cls)
        other = _TYPES_BY_NAME.get(wire_name)
        if other is not None:
            hint = (
                " (a different class object with the same name, e.g. from a reloaded module)"
                if _qualname(other.cls) == _qualname(cls)
                else ""
            )
            raise ConfigurationError(
                f"message type name {wire_name!r} is already taken by "
                f"{_qualname(other.cls)}; cannot register {_qualname(cls)}{hint} under it: "
                "pass another name=..."
            )
        entry = _MessageType(
            cls=cls,
            name=wire_name,
            fields=tuple(f.name for f in dataclasses.fields(cls) if f.init),
            prefix=b"\x92" + msgpack.packb(wire_name),
        )
        _TYPES_BY_NAME[wire_name] = entry
        _TYPES_BY_CLASS[cls] = entry
    return cls


def registered_messages() -> list[tuple[str, str, str]]:
    """``(wire name, module, qualname)`` of every registered class, for another process
    to find and register the same classes (a script's module is ``"__main__"``, as in
    :func:`register_message`'s default names)."""
    with _REGISTRY_LOCK:
        entries = list(_TYPES_BY_NAME.values())
    return [
        (
            entry.name,
            "__main__" if entry.cls.__module__ == "__mp_main__" else entry.cls.__module__,
            entry.cls.__qualname__,
        )
        for entry in entries
    ]


def registered_name(cls: type) -> str | None:
    """The wire name *cls* is registered under, or None."""
    entry = _TYPES_BY_CLASS.get(cls)
    return None if entry is None else entry.name


def registered_class(name: str) -> type | None:
    """The class registered under the wire name *name*, or None."""
    entry = _TYPES_BY_NAME.get(name)
    return None if entry is None else entry.cls


#: Called with the name of a message type this process has not registered, before
#: decoding gives up on it: it may register the class (the unit processes find the
#: classes their parent registered this way), or raise :class:`ProtocolError` saying why
#: it cannot. See :func:`set_unknown_type_hook`.
_unknown_type_hook: Callable[[str], None] | None = None


def set_unknown_type_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or, with None, remove) the process-wide hook that decoding calls once per
    message with a type name that is not registered, before it raises. Only the
    decoding of such a message pays for it."""
    global _unknown_type_hook
    _unknown_type_hook = hook


#: Modules whose dataclasses every process carries without registration, when the module
#: is importable: ezmsg's AxisArray and its axis classes, the message types of the whole
#: ezmsg ecosystem. A class of one of these modules is registered under its default name
#: the first time it is encoded, and the receiving process imports the module (by name:
#: ezflow does not depend on it) the first time it decodes that name.
KNOWN_MESSAGE_MODULES = ("ezmsg.util.messages.axisarray",)


def _known_module_entry(tp: type) -> _MessageType | None:
    """Register *tp* if it is a dataclass of a :data:`KNOWN_MESSAGE_MODULES` module."""
    if tp.__module__ not in KNOWN_MESSAGE_MODULES or not dataclasses.is_dataclass(tp):
        return None
    register_message(tp)
    return _TYPES_BY_CLASS.get(tp)


def _known_name_entry(name: str) -> _MessageType | None:
    """Import and register the class named *name* if it lives in a known module."""
    for module_name in KNOWN_MESSAGE_MODULES:
        if not name.startswith(module_name + "."):
            continue
        try:
            found: object = importlib.import_module(module_name)
        except ImportError:
            return None  # not installed here: the caller reports the unknown name
        for part in name[len(module_name) + 1 :].split("."):
            found = getattr(found, part, None)
        if isinstance(found, type):
            return _known_module_entry(found)
    return None


def _entry_for_name(name: str) -> _MessageType | None:
    """The registry entry of the wire name *name*: registered, else from a known module,
    else after the unknown-type hook had its say (which may raise); None if unknown."""
    entry = _TYPES_BY_NAME.get(name)
    if entry is None:
        entry = _known_name_entry(name)
    if entry is None and _unknown_type_hook is not None:
        _unknown_type_hook(name)
        entry = _TYPES_BY_NAME.get(name)
    return entry


def message_fields(cls: type) -> tuple[str, ...] | None:
    """The fields the codec sends for an instance of *cls* (its ``init`` fields, in
    order), or None if *cls* is not a registered message class."""
    entry = _TYPES_BY_CLASS.get(cls)
    return None if entry is None else entry.fields


@overload
def message(cls: type[_T]) -> type[_T]: ...


@overload
def message(cls: None = None, *, name: str | None = None) -> Callable[[type[_T]], type[_T]]: ...


def message(
    cls: type[_T] | None = None, *, name: str | None = None
) -> type[_T] | Callable[[type[_T]], type[_T]]:
    """Class decorator form of :func:`register_message`: ``@message`` or
    ``@message(name="...")`` above (outside) ``@dataclass``. Same errors."""
    if cls is None:

        def decorate(inner: type[_T]) -> type[_T]:
            return register_message(inner, name=name)

        return decorate
    return register_message(cls, name=name)
