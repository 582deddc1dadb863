"""ezflow: asyncio message-channel pub/sub for numpy data.

The public API is what this module exports (``__all__``), with its public submodules
(``ezflow.compat.ezmsg``, ``ezflow.ezring``, ``ezflow.lowlevel``, ``ezflow.otel``,
``ezflow.telemetry``, ``ezflow.units``, ``ezflow.zenoh``); every other module is private
and may change without notice. Names that moved keep a deprecated alias here for one
release (:data:`_MOVED`): using one warns (``DeprecationWarning``) naming its new home.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from ._core._deprecation import warn_deprecated as _warn_deprecated
from ._core._interrupts import quiet_while_importing as _quiet_while_importing

# A Ctrl-C while a script imports ezflow exits quietly (status 130), not with a traceback
# through the import machinery (see ezflow/_core/_interrupts.py).
_restore_ctrl_c = _quiet_while_importing()
try:
    # always available as ezflow.ezring, ezflow.lowlevel, ezflow.telemetry, ezflow.units
    from . import ezring, lowlevel, telemetry, units
    from ._core._auth import TlsFiles, Token
    from ._core._channel import ChannelStats, SubscriberStats
    from ._core._codec import message, register_message
    from ._core._config import DEFAULT_GRAPH_ADDRESS, DEFAULT_MAX_MESSAGE_SIZE, ShmOptions
    from ._core._exceptions import (
        AuthenticationError,
        BrokenResourceError,
        ClosedResourceError,
        ConfigurationError,
        EndOfStream,
        EzflowError,
        EzflowTimeoutError,
        GraphError,
        MessageTooLargeError,
        ProtocolError,
        UndecodableMessageError,
        UnregisteredTypeError,
        WouldBlock,
    )
    from ._core._outlet import PublisherStats
    from ._core._tracing import set_trace_rate
    from ._graph._context import GraphContext
    from ._graph._publisher import Publisher
    from ._graph._routing import ChannelInfo
    from ._graph._server import GraphServer
    from ._graph._subscriber import Subscriber
    from ._transports._shm import ShmStats
    from ._units._component import Collection, Component, Unit
    from ._units._decorators import main, publisher, subscriber, task, thread
    from ._units._errors import (
        Complete,
        GraphDefinitionError,
        MessageTypeError,
        NormalTermination,
        ProcessDiedError,
        UnitError,
    )
    from ._units._runner import GraphRunner, run
    from ._units._settings import Settings, State
    from ._units._streams import InputStream, OutputStream
finally:
    _restore_ctrl_c()
    del _restore_ctrl_c, _quiet_while_importing

if _typing.TYPE_CHECKING:  # the deprecated aliases, typed for type checkers (see __getattr__)
    from ._core._codec import Codec as Codec
    from ._core._loop import loop_factory as loop_factory
    from ._core._loop import run_coroutine as run_coroutine
    from ._transports._ezring import RingFrame as RingFrame
    from ._transports._ezring import RingHeader as RingHeader
    from ._transports._ezring import RingReader as RingReader
    from ._transports._ezring import RingStats as RingStats
    from ._transports._ezring import RingWriter as RingWriter

__version__ = "0.1.0"

#: ``name -> the public module that holds it now``: the deprecated top-level aliases
#: (removed in the next release).
_MOVED = {
    "Codec": "ezflow.lowlevel",
    "loop_factory": "ezflow.lowlevel",
    "run_coroutine": "ezflow.lowlevel",
    "RingFrame": "ezflow.ezring",
    "RingHeader": "ezflow.ezring",
    "RingReader": "ezflow.ezring",
    "RingStats": "ezflow.ezring",
    "RingWriter": "ezflow.ezring",
}


if not _typing.TYPE_CHECKING:  # (hidden from type checkers: a typo stays an error)

    def __getattr__(name: str) -> _typing.Any:
        """The deprecated aliases: ``ezflow.Codec`` warns, gives ``ezflow.lowlevel.Codec``."""
        home = _MOVED.get(name)
        if home is None:
            raise AttributeError(f"module 'ezflow' has no attribute {name!r}")
        _warn_deprecated(f"ezflow.{name}", f"{home}.{name}", stacklevel=3)
        return getattr(_importlib.import_module(home), name)


__all__ = [
    "DEFAULT_GRAPH_ADDRESS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "AuthenticationError",
    "BrokenResourceError",
    "ChannelInfo",
    "ChannelStats",
    "ClosedResourceError",
    "Collection",
    "Complete",
    "Component",
    "ConfigurationError",
    "EndOfStream",
    "EzflowError",
    "EzflowTimeoutError",
    "GraphContext",
    "GraphDefinitionError",
    "GraphError",
    "GraphRunner",
    "GraphServer",
    "InputStream",
    "MessageTooLargeError",
    "MessageTypeError",
    "NormalTermination",
    "OutputStream",
    "ProcessDiedError",
    "ProtocolError",
    "Publisher",
    "PublisherStats",
    "Settings",
    "ShmOptions",
    "ShmStats",
    "State",
    "Subscriber",
    "SubscriberStats",
    "TlsFiles",
    "Token",
    "UndecodableMessageError",
    "Unit",
    "UnitError",
    "UnregisteredTypeError",
    "WouldBlock",
    "__version__",
    "ezring",
    "lowlevel",
    "main",
    "message",
    "publisher",
    "register_message",
    "run",
    "set_trace_rate",
    "subscriber",
    "task",
    "telemetry",
    "thread",
    "units",
]
