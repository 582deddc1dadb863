"""Rate-limited logging of bad connections, per cause.

A listener (the graph server, a data server) reports each connection it closes for a
reason of the peer's making - a failed authentication, a protocol violation, a late
handshake, a connection over the limit - to its :class:`BadPeerLog`. The first
``BAD_PEER_LOG_FIRST`` of each cause are logged one line each; later ones are counted,
and one summary line per ``BAD_PEER_LOG_INTERVAL`` seconds gives the counts per cause.
So 5,000 hostile connections cost a handful of lines, and a slow trickle still shows
each offender.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from ._config import BAD_PEER_LOG_FIRST, BAD_PEER_LOG_INTERVAL

__all__ = ["BadPeerLog"]


class BadPeerLog:
    """Counts bad connections of one listener, named *what* in every line, by cause.

    Call it from the event loop's thread. :attr:`counts` holds the totals per cause.
    :meth:`close` logs the summary still pending (when the listener stops).
    """

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._log = logger
        self._what = what
        #: bad connections so far, by cause
        self.counts: Counter[str] = Counter()
        self._unlogged: Counter[str] = Counter()
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, cause: str, message: str, *args: object) -> None:
        """Count one bad connection of *cause*; log ``message % args`` if it is among
        the first of that cause. The message must not contain secrets."""
        self.counts[cause] += 1
        count = self.counts[cause]
        if count <= BAD_PEER_LOG_FIRST:
            suffix = (
                f" (more of this cause are counted and summarized every "
                f"{BAD_PEER_LOG_INTERVAL:.0f} s)"
                if count == BAD_PEER_LOG_FIRST
                else ""
            )
            self._log.warning(f"{self._what}: {message}{suffix}", *args)
            return
        self._unlogged[cause] += 1
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # pragma: no cover - always called from a protocol
                return
            self._timer = loop.call_later(BAD_PEER_LOG_INTERVAL, self._summary)

    def _summary(self) -> None:
        self._timer = None
        if not self._unlogged:
            return
        causes = ", ".join(f"{cause} {n}" for cause, n in sorted(self._unlogged.items()))
        total = sum(self._unlogged.values())
        self._unlogged.clear()
        self._log.warning(
            "%s: %d more bad connections closed (%s); totals so far: %s",
            self._what,
            total,
            causes,
            ", ".join(f"{cause} {n}" for cause, n in sorted(self.counts.items())),
        )

    def close(self) -> None:
        """Log what is still unsummarized, and cancel the timer."""
        if self._timer is not None:
            self._timer.cancel()
        self._summary()
