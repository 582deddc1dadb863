"""ezflow: asyncio message-channel pub/sub for numpy data.

The public API is what this module exports (``__all__``); every other module is
private and may change without notice.
"""

from __future__ import annotations

from ._core._channel import ChannelStats, SubscriberStats
from ._core._codec import Codec, message, register_message
from ._core._config import DEFAULT_GRAPH_ADDRESS, DEFAULT_MAX_MESSAGE_SIZE, ShmOptions
from ._core._exceptions import (
    BrokenResourceError,
    ClosedResourceError,
    ConfigurationError,
    EzflowError,
    EzflowTimeoutError,
    GraphError,
    MessageTooLargeError,
    ProtocolError,
    UnregisteredTypeError,
)
from ._core._loop import loop_factory, run_coroutine
from ._core._outlet import PublisherStats
from ._graph._context import ChannelInfo, GraphContext, Publisher, Subscriber
from ._graph._server import GraphServer
from ._transports._shm import ShmStats

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_GRAPH_ADDRESS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "BrokenResourceError",
    "ChannelInfo",
    "ChannelStats",
    "ClosedResourceError",
    "Codec",
    "ConfigurationError",
    "EzflowError",
    "EzflowTimeoutError",
    "GraphContext",
    "GraphError",
    "GraphServer",
    "MessageTooLargeError",
    "ProtocolError",
    "Publisher",
    "PublisherStats",
    "ShmOptions",
    "ShmStats",
    "Subscriber",
    "SubscriberStats",
    "UnregisteredTypeError",
    "__version__",
    "loop_factory",
    "message",
    "register_message",
    "run_coroutine",
]
