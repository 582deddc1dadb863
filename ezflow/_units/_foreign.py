"""Components of other frameworks (ezmsg's), and the adapters that translate them.

A graph may hold another framework's units and collections anywhere a component goes:
at the top of ``ezflow.run``, as children of an ezflow :class:`~ezflow.Collection`
(class attributes or ``configure()``), in ``process_components``, and their streams in
connections. :func:`~ezflow._units._plan.build_plan` asks the framework's
:class:`GraphAdapter` for the ezflow object each one stands for. The adapter module is
imported only when a graph holds such an object, so ezflow never imports the other
framework unless it is given one of its objects.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._errors import GraphDefinitionError

if TYPE_CHECKING:  # (a Protocol class costs ~0.5 ms to create at import)
    from typing import Protocol
else:
    Protocol = object

__all__ = [
    "ADAPTER_MODULES",
    "GraphAdapter",
    "adaptable",
    "adaptable_class",
    "adapter_for",
    "foreign_package",
    "register_graph_adapter",
]


class GraphAdapter(Protocol):
    """Translates another framework's objects for one graph: the same object always
    gives the same ezflow one (one adapter per graph and framework)."""

    def component(self, obj: object) -> object:
        """The ezflow component that runs the unit or collection *obj*."""

    def endpoint(self, end: object) -> object:
        """The ezflow end (a bound stream, or a topic name) for the stream *end* of a
        component already translated; :class:`GraphDefinitionError` for a stream of a
        component that is not in the graph."""

    def placed(self, entry: object) -> object:
        """The ezflow component a ``process_components`` entry stands for."""


#: ``package -> factory`` of the registered adapters (one new adapter per graph).
_factories: dict[str, Callable[[], GraphAdapter]] = {}

#: The module that adapts the components of a package (the key: the top-level package of
#: a class in the object's class hierarchy). It is imported only when a graph contains
#: such an object, and registers itself with :func:`register_graph_adapter`.
ADAPTER_MODULES: dict[str, str] = {"ezmsg": "ezflow._units._ezmsg_adapter"}

#: ``package -> qualified name`` of the base class of that package's components (units
#: and collections, not streams), known without importing the package.
COMPONENT_BASES: dict[str, str] = {"ezmsg": "ezmsg.core.component.Component"}


def register_graph_adapter(
    package: str, factory: Callable[[], GraphAdapter], *, component_base: str
) -> None:
    """Let graphs hold the objects of *package* (a top-level package name, e.g.
    ``"ezmsg"``), translated by an adapter *factory* returns (called once per graph);
    *component_base* is the qualified name of the base class of its components
    (``"ezmsg.core.component.Component"``). Registering again replaces."""
    _factories[package] = factory
    COMPONENT_BASES[package] = component_base


def _package_of(cls: type) -> str | None:
    for klass in cls.__mro__:
        package = klass.__module__.partition(".")[0]
        if package in _factories or package in ADAPTER_MODULES:
            return package
    return None


def foreign_package(obj: object) -> str | None:
    """The package whose adapter translates *obj* (a component or a stream of another
    framework), or None for anything else; nothing is imported to tell."""
    if getattr(type(obj), "_ezflow_native", False):
        return None  # an ezflow component (also one generated for a foreign class)
    return _package_of(type(obj))


def adaptable(obj: object) -> bool:
    """Whether *obj* is another framework's component (unit or collection) that a graph
    can hold; nothing is imported to tell."""
    return adaptable_class(type(obj))


def adaptable_class(cls: type) -> bool:
    """Whether instances of *cls* are other frameworks' components a graph can hold."""
    if getattr(cls, "_ezflow_native", False):
        return False
    package = _package_of(cls)
    base = COMPONENT_BASES.get(package or "")
    return base is not None and any(
        f"{klass.__module__}.{klass.__qualname__}" == base for klass in cls.__mro__
    )


def adapter_for(package: str) -> GraphAdapter:
    """A new adapter for *package*, importing its module on first use. Raises
    :class:`GraphDefinitionError` naming the extra to install when it cannot."""
    if package not in _factories:
        module = ADAPTER_MODULES[package]
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise GraphDefinitionError(
                f"the graph has {package} components, but {module} cannot be imported "
                f"({exc}); pip install 'ezflow-pubsub[{package}]'"
            ) from exc
    return _factories[package]()
