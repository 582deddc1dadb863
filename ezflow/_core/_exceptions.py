"""Every exception ezflow raises on purpose, named by cause.

The split follows trio/anyio: *you* closed it (:class:`ClosedResourceError`), a *peer*
broke it (:class:`BrokenResourceError`; a failed handshake authentication is its
subclass :class:`AuthenticationError`), bytes that do not follow the protocol
(:class:`ProtocolError`), a stream that has ended (:class:`EndOfStream`), a limit was
exceeded (:class:`MessageTooLargeError`), nobody
answered in time (:class:`EzflowTimeoutError`), the graph server refused a request
(:class:`GraphError`), and a setting is wrong (:class:`ConfigurationError`).

OS and codec errors are translated into these at the boundary where they happen, with
the original kept as ``__cause__``. A ``*_nowait`` call that would have to wait raises
:class:`WouldBlock` (as trio's and anyio's do).
"""

from __future__ import annotations

import asyncio

__all__ = [
    "AuthenticationError",
    "BrokenResourceError",
    "ClosedResourceError",
    "ConfigurationError",
    "EndOfStream",
    "EzflowError",
    "EzflowTimeoutError",
    "GraphError",
    "MessageTooLargeError",
    "ProtocolError",
    "UndecodableMessageError",
    "UnregisteredTypeError",
    "WouldBlock",
]


class EzflowError(Exception):
    """Base class of every error ezflow raises on purpose."""


class ClosedResourceError(EzflowError):
    """The object was closed by *this* process (``close()`` or leaving its context) and
    cannot be used any more."""


class EndOfStream(EzflowError):  # a signal, like trio's EndOfChannel / anyio's EndOfStream
    """Every publisher that fed this subscriber has ended and none that may still
    publish is routed to it; every message was received.

    Raised by ``Subscriber.recv()`` and ``recv_nowait()`` (``async for`` just ends),
    once per end: called again, ``recv()`` waits for a publisher routed later. A
    publisher ends when it is closed (``aclose()``, leaving its context; in units when
    nothing may publish to the stream any more), and also when its process dies or its
    connection breaks: the subscriber cannot tell more will come, so it ends too
    (``Subscriber.statistics().publishers_broken`` counts those, and a line is logged). A
    subscriber that never had a publisher keeps waiting: one may still come.

    ``RingReader.recv()`` raises it too, once the writer of an ezring ring closed it
    and every frame was received (docs/ezring.md).
    """


class BrokenResourceError(EzflowError):
    """A peer went away or broke the connection (graph server, publisher, channel).

    Raised instead of ``ConnectionError``/``OSError``; the OS error is ``__cause__``.
    """


class AuthenticationError(BrokenResourceError):
    """A handshake failed authentication: the peer has another token, has none while we
    have one (or the reverse), or its TLS certificate is not signed by our CA.

    The connection is closed; retrying with the same settings fails the same way. Give
    both ends the same token (``EZFLOW_TOKEN``, ``--token-file``,
    ``GraphContext(token=...)``; see docs/security.md). The message never contains a
    token.
    """


class ProtocolError(EzflowError):
    """Bytes that do not follow the ezflow wire protocol: garbage, a truncated frame, a
    header that claims more than the configured limit, an unknown command, a malformed
    or unknown encoded message, or a protocol version this build does not speak."""


class UndecodableMessageError(ProtocolError):
    """A message that arrived for a lossless subscriber could not be decoded (garbage,
    or a message class that is not registered in this process).

    ``recv()`` raises it in the message's place, in order; the messages before and after
    it are delivered as usual. ``topic``, ``publisher_id`` and ``reason`` (the codec's
    explanation) say which message; the codec's :class:`ProtocolError` is ``__cause__``.
    """

    def __init__(self, topic: str, publisher_id: str, reason: str) -> None:
        super().__init__(
            f"a message on topic {topic!r} from publisher {publisher_id} cannot be decoded: "
            f"{reason}"
        )
        self.topic = topic
        self.publisher_id = publisher_id
        self.reason = reason


class MessageTooLargeError(EzflowError, ValueError):
    """A message (or frame) is larger than the configured ``max_message_size``.

    Raised by ``publish`` before anything is sent, so no subscriber sees a partial
    message. Raise the limit with the ``max_message_size`` option or the
    ``EZFLOW_MAX_MESSAGE_SIZE`` environment variable on *both* ends.
    """


class EzflowTimeoutError(EzflowError, TimeoutError):
    """A peer did not answer within the documented time limit."""


class GraphError(EzflowError):
    """The graph server refused a request (an invalid topic name, an edge that does not
    exist, a registration that is not ours, ...). The message says which and why."""


class ConfigurationError(EzflowError, ValueError):
    """A setting (argument or environment variable) has a wrong value; the message names
    the setting, the bad value and what is accepted."""


class UnregisteredTypeError(EzflowError, TypeError):
    """A message contains an object of a type the codec cannot encode.

    Register user dataclasses with :func:`ezflow.register_message` (or the
    :func:`ezflow.message` decorator) in every process that sends or receives them.
    """


class WouldBlock(EzflowError, asyncio.QueueEmpty):
    """A ``*_nowait`` call found nothing to do without waiting: ``Subscriber.recv_nowait``
    with no message queued. Await the waiting form (``recv()``) instead, or try again
    later. It is also an ``asyncio.QueueEmpty``, which ``recv_nowait`` raised before."""
