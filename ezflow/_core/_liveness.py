"""Heartbeats: how a connection tells a silent peer from a quiet one.

Graph-server connections and tcp data connections run a :class:`Heartbeat` once their
handshake is done. The rule, on each side and independently:

* any byte received counts as life (the protocol sets ``heard`` on every read: one
  attribute store on the receive path, nothing else; a look that heard nothing has the
  connection read what the kernel holds back for a large frame's rest, so a slow link
  busy with one is heard at the next look);
* every ``interval`` the heartbeat looks: when the connection sent nothing since the last
  look, it sends a heartbeat frame (a few bytes carrying the sender's own deadline);
  when nothing was heard for ``deadline`` seconds, the peer is declared dead
  (``peer_silent``): the owner logs one line naming it and aborts the connection.

``interval`` is ``min(own deadline, peer's deadline) / HEARTBEATS_PER_DEADLINE``: each
side learns the peer's deadline from its heartbeats, so two processes configured with
different deadlines both keep the shorter one satisfied (once the first heartbeat
arrived: until then a side sends at its own pace, so deadlines that differ by more than
``HEARTBEATS_PER_DEADLINE`` times may see one early false alarm on an idle connection).
A peer that announces 0 has heartbeats off: this side then never declares it dead (it
would be silent whenever idle).

Heartbeats are sent and read by the event loop, never by a subscriber's handler, so a
handler that awaits for minutes does not make its process look dead. A blocked event loop
does: a peer whose loop is blocked for more than about ``deadline - interval`` is
declared dead. When *this* side's loop was blocked (a look comes more than two
intervals late), the silence it measured is its own deafness, not the peer's: the look
counts as having heard the peer.

Also :func:`tune_keepalive`: TCP keepalive with short intervals, so that the kernel
gives up on an unreachable peer too (it keeps probing after the process is gone).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Final, Protocol

from ._config import HEARTBEATS_PER_DEADLINE, MIN_HEARTBEAT_DEADLINE, TCP_KEEPALIVE_PROBES

__all__ = ["Heartbeat", "HeartbeatOwner", "tune_keepalive"]

# A look that comes this many intervals late means our own loop was blocked.
_LATE_LOOK: Final = 2.0


class HeartbeatOwner(Protocol):
    """What a :class:`Heartbeat` needs from its connection."""

    #: True when bytes arrived since the heartbeat last looked (it clears it)
    heard: bool

    def sent_mark(self) -> int:
        """A number that changes whenever the connection sends something (a count of
        frames or messages); equal between two looks means the connection was idle."""
        ...

    def send_heartbeat(self, deadline: float) -> None:
        """Send one heartbeat frame announcing *deadline*."""
        ...

    def peer_silent(self, silence: float, deadline: float) -> None:
        """Nothing was heard for *silence* >= *deadline* seconds: log once and close."""
        ...

    def read_held_back(self) -> None:
        """Nothing was heard since the last look: read now whatever the kernel holds
        back (bytes of a large frame's rest, see :class:`~ezflow._core._framing.FramedProtocol`),
        so that a slow peer still sending one is heard at the next look."""
        ...


class Heartbeat:
    """The heartbeat of one connection (see the module docstring).

    Created once the handshake is done; it looks every :attr:`interval` on the running
    loop until :meth:`cancel` (call it from ``connection_lost``) or until it declares
    the peer dead. Nothing is sent at creation, so a handshake is followed by the
    usual exchange; the first heartbeat goes out after an idle interval. With
    *deadline* 0 (heartbeats off) it announces that once, at creation, and never looks.
    """

    __slots__ = (
        "_handle",
        "_last_heard",
        "_last_look",
        "_loop",
        "_mark",
        "_owner",
        "deadline",
        "peer_deadline",
    )

    def __init__(self, owner: HeartbeatOwner, deadline: float) -> None:
        self._owner = owner
        self.deadline = deadline
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        self._last_heard = now
        self._last_look = now
        self._handle: asyncio.TimerHandle | None = None
        #: the peer's deadline, once it announced one (until then our own)
        self.peer_deadline = deadline
        owner.heard = False
        if deadline > 0:
            self._mark = owner.sent_mark()
            self._handle = self._loop.call_later(self.interval, self._look)
        else:
            # Off: say so once, so that the peer never takes our idle silence for death.
            owner.send_heartbeat(deadline)
            self._mark = owner.sent_mark()

    @property
    def interval(self) -> float:
        """Seconds between two looks (and at most between two frames sent)."""
        return min(self.deadline, self.peer_deadline) / HEARTBEATS_PER_DEADLINE

    def peer_announced(self, deadline: float) -> None:
        """The peer's heartbeat said its deadline is *deadline* (0: it has heartbeats
        off, so its silence means nothing). Values below ``MIN_HEARTBEAT_DEADLINE``
        other than 0 are raised to it: a peer cannot make us send without pause."""
        if deadline <= 0:
            self.cancel()
            return
        deadline = max(deadline, MIN_HEARTBEAT_DEADLINE)
        if self._handle is not None and deadline < self.peer_deadline:
            self.peer_deadline = deadline
            self._handle.cancel()
            self._handle = self._loop.call_later(self.interval, self._look)
        else:
            self.peer_deadline = deadline

    def cancel(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()

    def _look(self) -> None:
        owner = self._owner
        now = self._loop.time()
        if owner.heard or now - self._last_look > _LATE_LOOK * self.interval:
            self._last_heard = now
        else:
            owner.read_held_back()
        owner.heard = False
        self._last_look = now
        silence = now - self._last_heard
        if silence >= self.deadline:
            self._handle = None
            owner.peer_silent(silence, self.deadline)
            return
        if owner.sent_mark() == self._mark:
            owner.send_heartbeat(self.deadline)
        self._mark = owner.sent_mark()
        self._handle = self._loop.call_later(self.interval, self._look)


def tune_keepalive(sock: socket.socket, deadline: float) -> None:
    """Turn TCP keepalive on for *sock*: first probe after ``deadline / 2`` idle seconds,
    then ``TCP_KEEPALIVE_PROBES`` probes over the other half, where the platform has
    the options (``TCP_KEEPIDLE``, ``TCP_KEEPINTVL``, ``TCP_KEEPCNT``); with *deadline*
    0 (heartbeats off) the system's keepalive timing. Errors are ignored: keepalive only
    backs up the heartbeats."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if deadline <= 0:
            return
        idle = max(1, round(deadline / 2))
        interval = max(1, round(deadline / 2 / TCP_KEEPALIVE_PROBES))
        for name, value in (
            ("TCP_KEEPIDLE", idle),
            ("TCP_KEEPINTVL", interval),
            ("TCP_KEEPCNT", TCP_KEEPALIVE_PROBES),
        ):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError:
        pass
