"""ezflow: asyncio message-channel pub/sub for numpy data.

The public API is what this module exports (``__all__``); every other module is
private and may change without notice.
"""

from __future__ import annotations

from ._core._interrupts import quiet_while_importing as _quiet_while_importing

# A Ctrl-C while a script imports ezflow exits quietly (status 130), not with a traceback
# through the import machinery (see ezflow/_core/_interrupts.py).
_restore_ctrl_c = _quiet_while_importing()
try:
    from . import telemetry, units  # always available as ezflow.telemetry, ezflow.units
    from ._core._auth import TlsFiles, Token
    from ._core._channel import ChannelStats, SubscriberStats
    from ._core._codec import Codec, message, register_message
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
    )
    from ._core._loop import loop_factory, run_coroutine
    from ._core._outlet import PublisherStats
    from ._core._tracing import set_trace_rate
    from ._graph._context import GraphContext
    from ._graph._publisher import Publisher
    from ._graph._routing import ChannelInfo
    from ._graph._server import GraphServer
    from ._graph._subscriber import Subscriber
    from ._transports._ezring import RingFrame, RingHeader, RingReader, RingStats, RingWriter
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

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_GRAPH_ADDRESS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "AuthenticationError",
    "BrokenResourceError",
    "ChannelInfo",
    "ChannelStats",
    "ClosedResourceError",
    "Codec",
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
    "RingFrame",
    "RingHeader",
    "RingReader",
    "RingStats",
    "RingWriter",
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
    "__version__",
    "loop_factory",
    "main",
    "message",
    "publisher",
    "register_message",
    "run",
    "run_coroutine",
    "set_trace_rate",
    "subscriber",
    "task",
    "telemetry",
    "thread",
    "units",
]
