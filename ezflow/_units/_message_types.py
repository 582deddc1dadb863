"""Message classes known in every unit process.

A unit process imports what unpickling its units needs, and nothing else: a class
registered with :func:`ezflow.register_message` in the parent's script, in a module the
units do not import, or only at run time (inside the parent's ``main()``), would be
unknown there. So the parent ships its whole registry in the bootstrap (wire name,
module, qualname of each class) and the child registers each class under the same wire
name, finding it by module and qualname (the parent's script is imported as
``__mp_main__``, as multiprocessing does):

* **required** classes - the registered classes among the declared message types of
  the process's streams and of the outputs connected to its inputs - are resolved
  before the process reports ready; one that cannot be is a start-up error naming the
  class, the process and the fix;
* classes whose module the process has already imported are registered at once (its
  units may publish them);
* any other class is resolved when a message of it first arrives (so a process does not
  import every module of the parent's registry); one that cannot be makes that message
  undecodable, with the reason (see :class:`~ezflow.UndecodableMessageError`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import sys
import typing
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from .._core._codec import (
    register_message,
    registered_class,
    registered_messages,
    registered_name,
)
from .._core._exceptions import ConfigurationError, ProtocolError
from ._plan import Plan, stream_topic

__all__ = ["MessageTypes", "UnresolvableMessageError", "shipped_message_types"]

_FIX = (
    "define the class at module level in the script or in a module that every unit "
    "process can import (and register it there, or anywhere in the parent)"
)


class UnresolvableMessageError(Exception):
    """A registered class of the parent cannot be found in this process (internal: the
    process reports it as a start-up failure or an undecodable message)."""


def _classes_in(message_type: Any) -> Iterable[type[Any]]:
    """The classes a declared message type names (``list[Reading]``, ``A | None``, ...)."""
    if isinstance(message_type, type):
        yield message_type
    origin = typing.get_origin(message_type)
    if isinstance(origin, type):
        yield origin
    for arg in typing.get_args(message_type):
        yield from _classes_in(arg)


def _required_names(plan: Plan, process: str) -> list[str]:
    """Wire names of the registered classes declared on the streams of *process*'s units
    and on the outputs connected to their inputs."""
    declared: dict[str, Any] = {}
    for path, unit in plan.units.items():
        for name, stream in type(unit).streams().items():
            declared[stream_topic(path, name)] = unit._bound_stream(stream).message_type
    own = {
        stream_topic(unit.path, name)
        for unit in plan.units_in(process)
        for name in type(unit).streams()
    }
    topics = own | {src for src, dst in plan.edges if dst in own}
    names: set[str] = set()
    for topic in topics:
        for cls in _classes_in(declared.get(topic, Any)):
            wire_name = registered_name(cls)
            if wire_name is not None:
                names.add(wire_name)
    return sorted(names)


def shipped_message_types(plan: Plan, process: str) -> dict[str, Any]:
    """What the bootstrap of unit process *process* carries about message classes."""
    return {"registered": registered_messages(), "required": _required_names(plan, process)}


class MessageTypes:
    """The child side: registers the parent's message classes in this process.

    *shipped* is :func:`shipped_message_types`'s result, *process* the process name (for
    messages), *import_main* imports the parent's main script (once) and returns it, or
    raises :class:`UnresolvableMessageError` when the parent's ``__main__`` is not
    importable here (an interactive session, ``python -c``).
    """

    def __init__(
        self, shipped: dict[str, Any], process: str, import_main: Callable[[], ModuleType]
    ) -> None:
        self._where: dict[str, tuple[str, str]] = {
            str(name): (str(module), str(qualname))
            for name, module, qualname in shipped.get("registered", ())
        }
        self._required = [str(name) for name in shipped.get("required", ())]
        self._process = process
        self._import_main = import_main
        self._failed: dict[str, str] = {}  # name -> why it could not be resolved

    def resolve_required(self) -> None:
        """Register every required class; raise :class:`UnresolvableMessageError` naming
        each one that cannot be, the process and the fix."""
        problems = []
        for name in self._required:
            try:
                self._resolve(name)
            except UnresolvableMessageError as exc:
                problems.append(str(exc))
        if problems:
            raise UnresolvableMessageError(
                f"while starting: message classes of the parent process that process "
                f"{self._process} receives or sends cannot be found there:\n"
                + "\n".join(f"  {p}" for p in problems)
                + f"\n{_FIX}"
            )

    def resolve_imported(self) -> None:
        """Register the classes whose module this process has imported already (its
        units may publish them); a failure is left for the first such message."""
        main = sys.modules.get("__mp_main__")
        for name, (module, _) in self._where.items():
            loaded = main is not None if module == "__main__" else module in sys.modules
            if loaded:
                with contextlib.suppress(UnresolvableMessageError):
                    self._resolve(name)

    def on_unknown_type(self, name: str) -> None:
        """The codec's hook (:func:`~ezflow._core._codec.set_unknown_type_hook`): find
        *name* among the parent's classes, or raise :class:`ProtocolError` saying why
        it cannot be found."""
        if name not in self._where:
            return  # not the parent's either: the codec's own error says what to do
        try:
            self._resolve(name)
        except UnresolvableMessageError as exc:
            raise ProtocolError(f"{exc}; {_FIX}") from exc

    def _resolve(self, name: str) -> None:
        if registered_class(name) is not None:
            return  # registered here too (by an import, or earlier)
        if name in self._failed:
            raise UnresolvableMessageError(self._failed[name])
        try:
            self._register(name)
        except UnresolvableMessageError as exc:
            self._failed[name] = str(exc)
            raise

    def _register(self, name: str) -> None:
        module_name, qualname = self._where[name]
        shown = f"{module_name}.{qualname}"
        what = f"message class {shown} (registered as {name!r}) in process {self._process}"
        if "<locals>" in qualname:
            raise UnresolvableMessageError(
                f"{what}: it is defined inside a function, so no other process can import it"
            )
        try:
            module = (
                self._import_main()
                if module_name == "__main__"
                else importlib.import_module(module_name)
            )
        except UnresolvableMessageError as exc:
            raise UnresolvableMessageError(f"{what}: {exc}") from exc
        except Exception as exc:
            raise UnresolvableMessageError(
                f"{what}: importing {module_name} failed: {type(exc).__name__}: {exc}"
            ) from exc
        found: Any = module
        for part in qualname.split("."):
            found = getattr(found, part, None)
            if found is None:
                raise UnresolvableMessageError(
                    f"{what}: {module_name} has no {qualname} here (is it created at run "
                    "time, or only under if __name__ == '__main__'?)"
                )
        if not isinstance(found, type) or not dataclasses.is_dataclass(found):
            raise UnresolvableMessageError(f"{what}: {module_name}.{qualname} is not a dataclass")
        try:
            register_message(found, name=name)
        except ConfigurationError as exc:
            raise UnresolvableMessageError(f"{what}: {exc}") from exc
