"""ezmsg's API on ezflow: ``import ezflow.compat.ezmsg as ez``.

A program written for ezmsg (``import ezmsg.core as ez``) runs on ezflow with only that
import line changed, and prints what it prints under ezmsg. Its imports from
``ezmsg.util`` (``DebugLog``, ``TerminateOnTimeout``, ``gen_to_unit``, ``AxisArray``...)
stay as they are: ezmsg's own units run inside these collections through ezflow's
adapter (``ezflow-pubsub[ezmsg]``); a program that imports only ``ezmsg.core`` needs no ezmsg
installed. The names are ezmsg's, with ezmsg's semantics where ezflow's differ:

- ``Unit``, ``Collection``: ezflow components that take their settings positionally, as a
  keyword ``settings=`` or as the settings' fields, and have ezmsg's ``address``.
  ``Collection.process_components()`` defaults to none (ezmsg's default, the collection
  itself, means "one process" there; here everything not listed runs in the calling
  process, and a collection listing itself runs where its parent places it). A
  subscriber of ``INPUT_SETTINGS`` named ``on_settings`` is called once per settings
  message (ezflow calls its own ``on_settings`` hook too; here that hook is the
  subscriber).
- ``InputStream(type, leaky=False, max_queue=None)``, ``OutputStream(type,
  num_buffers=32, force_tcp=None, ...)``: ``max_queue`` is the leaky queue,
  ``num_buffers`` other than 32 the messages in flight before publishing waits (32
  keeps ezflow's default), ``force_tcp`` the tcp transport. ``host``, ``port``,
  ``buf_size`` and ``allow_local`` are accepted and have no effect (ezflow picks the
  ports and sizes its rings). As in ezmsg, the declared message types are not checked
  when streams are connected. Dataclass message types named by a stream are registered
  with the codec (ezmsg pickles any object; ezflow carries
  registered dataclasses, so the processes of the graph can decode them).
- ``InputTopic``/``OutputTopic`` (and the relays): collection boundaries; ezflow joins
  the units on either side directly, so no message is copied. As in ezmsg, an output
  connected to another unit's output joins the two topics (with one warning naming the
  connection: it is usually a mistake).
- ``@main``: the graph goes on when it returns, as in ezmsg (ezflow's ``@main`` ends
  the graph); raising ``NormalTermination`` ends it.
- ``@subscriber(stream, zero_copy=...)`` (ignored: ezflow never copies a message for a
  subscriber; arrays received from another process are read-only), ``@publisher``,
  ``@task``, ``@thread``, ``@timeit`` (logs each call's duration), ``@process``
  (recorded, as in ezmsg; no effect).
- ``Complete`` ends the function that raised it; ``NormalTermination`` ends the graph.
- ``run(system)`` positional (named ``SYSTEM``, as in ezmsg), or ``run(NAME=component,
  ...)`` / ``run(components={...})``, with ``connections``, ``process_components``,
  ``graph_address`` and ``force_single_process``; a system without units runs as
  nothing (returns at once), as in ezmsg.
- ``logger``: ezmsg's format, ``INFO`` and below on stdout, warnings on stderr, level
  from ``EZMSG_LOGLEVEL``.
- ``Settings``, ``State``, ``Flag``, ``Message``, ``NetworkDefinition``, ``Component``,
  ``System`` (ezmsg's deprecated alias of ``Collection``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from .._core._codec import register_message
from .._units._component import Collection as _Collection
from .._units._component import Component
from .._units._component import Unit as _Unit
from .._units._decorators import main as _main
from .._units._decorators import publisher, role_of, task, thread
from .._units._decorators import subscriber as _subscriber
from .._units._errors import Complete, GraphDefinitionError, NormalTermination
from .._units._ezmsg_rules import output_options, register_stream_type, wait_while_running
from .._units._plan import NoUnitsError
from .._units._runner import run as _run
from .._units._settings import Settings, State
from .._units._streams import InputStream as _InputStream
from .._units._streams import OutputStream as _OutputStream
from .._units._streams import Stream

__all__ = [
    "Collection",
    "Complete",
    "Component",
    "Flag",
    "InputRelay",
    "InputStream",
    "InputTopic",
    "Message",
    "NetworkDefinition",
    "NormalTermination",
    "OutputRelay",
    "OutputStream",
    "OutputTopic",
    "Relay",
    "Settings",
    "State",
    "System",
    "Topic",
    "Unit",
    "logger",
    "main",
    "process",
    "publisher",
    "run",
    "subscriber",
    "task",
    "thread",
    "timeit",
]

_F = TypeVar("_F", bound=Callable[..., Any])

#: ``(source, destination)`` pairs of streams (or topic names), as ``network()`` returns.
NetworkDefinition = Iterable[tuple[Stream | str, Stream | str]]

# -- logging -------------------------------------------------------------------------------

_LOG_FORMAT = (
    "%(asctime)s.%(msecs)03d - pid: %(process)d - %(threadName)s "
    "- %(levelname)s - %(funcName)s: %(message)s"
)
_LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def _handler(stream: Any, below_warning: bool) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT, datefmt=_LOG_DATE_FORMAT))
    if below_warning:
        handler.addFilter(lambda record: record.levelno < logging.WARNING)
    else:
        handler.setLevel(logging.WARNING)
    return handler


#: ezmsg's ``ez.logger``: its line format, INFO and below on stdout, warnings and
#: errors on stderr, level from ``EZMSG_LOGLEVEL`` (default INFO).
logger = logging.getLogger("ezflow.compat.ezmsg")
if not logger.handlers:
    logger.addHandler(_handler(sys.stdout, True))
    logger.addHandler(_handler(sys.stderr, False))
    logger.propagate = False
logger.setLevel(os.environ.get("EZMSG_LOGLEVEL", "INFO").upper())

# -- messages ------------------------------------------------------------------------------


class Message:
    """ezmsg's deprecated message base: subclasses are frozen dataclasses, registered
    with the codec."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(unsafe_hash=True, frozen=True)(cls)
        register_message(cls)


@dataclasses.dataclass
class Flag:
    """A message with no contents (a signal)."""


register_message(Flag)

# -- streams -------------------------------------------------------------------------------


class InputStream(_InputStream):
    """ezmsg's input: ``leaky=True`` keeps the newest ``max_queue`` messages (default 1)."""

    def __init__(self, msg_type: Any, leaky: bool = False, max_queue: int | None = None) -> None:
        if max_queue is not None and max_queue <= 0:
            raise ValueError("max_queue must be positive")
        # ezmsg checks no message type at connection time, so neither do we.
        super().__init__(Any, leaky=leaky, queue=max_queue if leaky else None)
        self.msg_type = msg_type
        register_stream_type(msg_type)

    @property
    def max_queue(self) -> int | None:
        return self.queue


class OutputStream(_OutputStream):
    """ezmsg's output: ``num_buffers`` (other than 32) messages in flight before
    publishing waits, ``force_tcp`` for tcp; ``host``, ``port``, ``buf_size`` and
    ``allow_local`` have no effect."""

    def __init__(  # noqa: PLR0917 - ezmsg's signature, positional arguments included
        self,
        msg_type: Any,
        host: str | None = None,
        port: int | None = None,
        num_buffers: int = 32,
        buf_size: int | None = None,
        force_tcp: bool | None = None,
        allow_local: bool | None = None,
    ) -> None:
        # the same translation as for ezmsg's own units (ezflow._units._ezmsg_rules)
        super().__init__(Any, **output_options(num_buffers, force_tcp))
        self.msg_type = msg_type
        self.num_buffers = num_buffers
        self.force_tcp = force_tcp
        register_stream_type(msg_type)


class Topic(_OutputStream):
    """A collection boundary (ezmsg's graph endpoint); ezflow wires through it."""

    def __init__(self, msg_type: Any) -> None:
        super().__init__(Any)
        self.msg_type = msg_type
        register_stream_type(msg_type)


class InputTopic(_InputStream):
    """A collection's input boundary."""

    def __init__(self, msg_type: Any) -> None:
        super().__init__(Any)
        self.msg_type = msg_type
        register_stream_type(msg_type)


class OutputTopic(Topic):
    """A collection's output boundary."""


class Relay(Topic):
    """ezmsg's republishing boundary: here a boundary like :class:`Topic` (ezflow joins
    the units directly; the transport options have no effect)."""

    def __init__(self, msg_type: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(msg_type)


class InputRelay(InputTopic):
    """ezmsg's input relay: here an :class:`InputTopic`."""

    def __init__(self, msg_type: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(msg_type)


class OutputRelay(Relay):
    """ezmsg's output relay: here an :class:`OutputTopic`."""


# -- decorators ----------------------------------------------------------------------------


def subscriber(stream: _InputStream, zero_copy: Any = None) -> Callable[[_F], _F]:
    """ezmsg's ``@subscriber``; *zero_copy* is ignored (messages are never copied)."""
    return _subscriber(stream)


def main(fn: _F) -> _F:
    """ezmsg's ``@main``: *fn* runs in the main thread of its unit's process; as in ezmsg,
    the graph goes on when it returns (raise :class:`NormalTermination` to end it)."""

    @functools.wraps(fn)
    def run_then_wait(self: Unit) -> None:
        fn(self)
        wait_while_running(self)  # the graph stops this thread by clearing `running`

    return _main(run_then_wait)  # type: ignore[return-value]


def _log_duration(self: Any, fn: Callable[..., Any], start: float) -> None:
    duration = (time.perf_counter() - start) * 1e3
    logger.info(
        "%s:%s task duration = %0.4fms", getattr(self, "address", "?"), fn.__name__, duration
    )


def timeit(fn: _F) -> _F:
    """Log how long each call of *fn* takes (at INFO, in milliseconds): the whole call,
    awaited, for an ``async def`` (ezmsg times only the call that creates the coroutine),
    the whole iteration for an async generator. Put it under the other decorators."""
    timed: Callable[..., Any]
    if inspect.isasyncgenfunction(fn):

        async def timed_generator(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            async for item in fn(self, *args, **kwargs):
                yield item
            _log_duration(self, fn, start)

        timed = timed_generator
    elif inspect.iscoroutinefunction(fn):

        async def timed_coroutine(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = await fn(self, *args, **kwargs)
            _log_duration(self, fn, start)
            return result

        timed = timed_coroutine
    else:

        def timed_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = fn(self, *args, **kwargs)
            _log_duration(self, fn, start)
            return result

        timed = timed_call
    return cast(_F, functools.wraps(fn)(timed))


def process(fn: _F) -> _F:
    """Recorded as in ezmsg (``__ez_process__``); it has no effect there either."""
    fn.__ez_process__ = True  # type: ignore[attr-defined]
    return fn


# -- components ----------------------------------------------------------------------------


def _settings(
    cls: type[Component], args: tuple[Any, ...], settings: Any, fields: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """ezmsg's constructor forms: ``X(settings)``, ``X(settings=...)``, ``X(field, ...)``,
    ``X(field=...)``."""
    if settings is not None or not args:
        return settings, fields
    settings_type = cls.settings_type()
    if settings_type is not None and isinstance(args[0], settings_type) and len(args) == 1:
        return args[0], fields
    if settings_type is None:
        raise TypeError(f"{cls.__qualname__} declares no SETTINGS class, so it takes no settings")
    return settings_type(*args, **fields), {}


class Unit(_Unit):
    """ezmsg's ``Unit`` on ezflow (see the module docstring)."""

    _ezflow_ezmsg_wiring = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A subscriber named on_settings would be called twice per settings message: by
        # ezflow's hook of that name and as a subscriber. Keep it a subscriber only.
        own = cls.__dict__.get("on_settings")
        if own is not None and role_of(own) is not None:
            cls.ezmsg_on_settings = own  # type: ignore[attr-defined]
            cls.on_settings = _Unit.on_settings  # type: ignore[method-assign]
        super().__init_subclass__(**kwargs)

    def __init__(self, *args: Any, settings: Settings | None = None, **fields: Any) -> None:
        settings, fields = _settings(type(self), args, settings, fields)
        super().__init__(settings, **fields)

    @property
    def address(self) -> str:
        """Where the unit is in the graph (``"SYSTEM/COUNT"``), as ezmsg names it."""
        return self.path


class Collection(_Collection):
    """ezmsg's ``Collection`` on ezflow (see the module docstring)."""

    _ezflow_ezmsg_wiring = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("process_components")
        if own is not None:
            # ezmsg's idiom `return (self,)`: the collection runs where its parent puts it.
            @functools.wraps(own)
            def placed(self: Collection) -> list[Component]:
                return [entry for entry in own(self) if entry is not self]

            cls.process_components = placed  # type: ignore[method-assign,assignment]

    def __init__(self, *args: Any, settings: Settings | None = None, **fields: Any) -> None:
        settings, fields = _settings(type(self), args, settings, fields)
        super().__init__(settings, **fields)

    @property
    def address(self) -> str:
        """Where the collection is in the graph, as ezmsg names it."""
        return self.path


#: ezmsg's deprecated name of :class:`Collection`.
System = Collection


def run(
    components: Component | Mapping[str, Component] | None = None,
    *,
    connections: Iterable[object] | None = None,
    process_components: Iterable[Component] | None = None,
    graph_address: Any = None,
    force_single_process: bool = False,
    **components_kwargs: Component,
) -> None:
    """ezmsg's ``run``: ``run(system)`` runs one component under the name ``SYSTEM``;
    otherwise as :func:`ezflow.run` (which documents what it raises). Returns when a
    unit raised :class:`NormalTermination`, a ``@main`` returned, or on Ctrl-C."""
    if components is not None and not isinstance(components, Mapping):
        components = {"SYSTEM": components}  # one component (ezmsg's own, too)
    if isinstance(graph_address, tuple):
        graph_address = f"{graph_address[0]}:{graph_address[1]}"
    graph: dict[str, Component] = dict(components or {})
    for name, component in components_kwargs.items():
        if name in graph:
            raise GraphDefinitionError(
                f"duplicate component name {name!r}: given in components and as a keyword"
            )
        graph[name] = component
    try:
        _run(
            graph,
            connections=connections or (),
            process_components=process_components or (),
            graph_address=graph_address,
            force_single_process=force_single_process,
        )
    except NoUnitsError:
        return  # as in ezmsg: a system without units runs as nothing
