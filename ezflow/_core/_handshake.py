"""The accepting side of a connection's handshake, shared by every listener.

The graph server (control connections) and the tcp and shm data servers (channels) admit
a peer the same way: it must finish its handshake within a deadline, and with a token
it must answer the listener's challenge (:class:`~ezflow._core._auth.Responder`) before
it is admitted. :class:`AcceptingHandshake` holds that state and that deadline;
:func:`refuse` tells a refused peer why and closes. Sans-I/O but for the deadline's
timer: the caller reads frames, checks its own ``hello`` (protocol version, fields: the
graph and the data plane refuse those with different causes) and writes what this
returns, in its own framing::

    hello {"protocol", ..., "nonce"}  --->  receive(): the hello (no token: admitted), or a
                                            Challenge({"op": "challenge", "nonce", "proof"})
    auth {"proof"}                    --->  receive(): the hello (proof right), or raises
    error {...}                       --->  raises: the peer found that our tokens differ

A handshake not admitted (:meth:`~AcceptingHandshake.admit`) within its deadline calls the
caller's *late* with ``"handshake not done within N s"``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._auth import Responder, Token
from ._exceptions import AuthenticationError, ProtocolError

__all__ = ["AcceptingHandshake", "Challenge", "refuse"]


@dataclass(frozen=True, slots=True)
class Challenge:
    """What :meth:`AcceptingHandshake.receive` answers a ``hello`` with when a token is
    required: *message* goes to the peer, whose ``auth`` comes next."""

    message: dict[str, Any]


class AcceptingHandshake:
    """One connection's handshake, on the listening side of *plane* (``"graph"`` or
    ``"data"``, as :class:`~ezflow._core._auth.Responder` takes it). *peer* names the
    other side in errors (``"client"``, ``"channel"``).

    Use: :meth:`arm` when the connection is made; :meth:`receive` each handshake map
    (after checking the first one, the ``hello``: :attr:`started` is false until then);
    :meth:`admit` once the peer is in (the deadline no longer applies); :meth:`cancel`
    when the connection is lost.
    """

    __slots__ = ("_hello", "_peer", "_responder", "_timer", "admitted")

    def __init__(self, token: Token | None, plane: str, *, peer: str) -> None:
        self._responder = Responder(token, plane)
        self._peer = peer
        self._hello: dict[str, Any] | None = None  # received, and challenged
        self._timer: asyncio.TimerHandle | None = None
        #: whether :meth:`admit` was called
        self.admitted = False

    @property
    def started(self) -> bool:
        """Whether the ``hello`` was received (and challenged): the next map is its
        ``auth``."""
        return self._hello is not None

    def arm(self, timeout: float, late: Callable[[str], None]) -> None:
        """Call ``late(reason)`` unless :meth:`admit` (or :meth:`cancel`) comes within
        *timeout* seconds from now (on the running loop)."""
        self._timer = asyncio.get_running_loop().call_later(timeout, self._late, timeout, late)

    def _late(self, timeout: float, late: Callable[[str], None]) -> None:
        self._timer = None
        if not self.admitted:
            late(f"handshake not done within {timeout:.0f} s")

    def receive(self, message: dict[str, Any]) -> dict[str, Any] | Challenge:
        """One handshake map in; what to do next out: the ``hello`` to admit, or the
        :class:`Challenge` to send the peer. Raises :class:`AuthenticationError` (a wrong proof, a
        malformed nonce, the peer giving up on our proof) or :class:`ProtocolError`
        (anything but ``auth`` after the challenge)."""
        hello = self._hello
        if hello is None:
            challenge = self._responder.challenge(message)
            if challenge is None:
                return message  # no token here: admitted at once
            self._hello = message
            return Challenge({"op": "challenge", **challenge})
        op = message.get("op")
        if op == "error":
            # The peer checked our proof and gave up (its text is not logged: it is the
            # peer's to choose).
            raise AuthenticationError(f"the {self._peer} found that our tokens differ")
        if op != "auth":
            raise ProtocolError(f"expected 'auth' after the challenge, got {op!r}")
        self._responder.verify(message)
        return hello

    def admit(self) -> None:
        """The peer is in: the deadline no longer applies."""
        self.admitted = True
        self.cancel()

    def cancel(self) -> None:
        """Stop the deadline's timer (the connection is gone)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()


def refuse(transport: asyncio.WriteTransport | None, data: bytes) -> None:
    """Write *data* (the framed refusal that tells the peer why) and close: after the
    write, or at once when the peer leaves what we send unread (a write buffer not
    empty). Nothing when the transport is already closing. The caller stops reading
    (``FramedProtocol`` ``_broken``) first."""
    if transport is None or transport.is_closing():
        return
    transport.write(data)
    if transport.get_write_buffer_size():
        transport.abort()  # (it does not read: do not wait on it)
    else:
        transport.close()
