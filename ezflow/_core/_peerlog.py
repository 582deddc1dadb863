"""Rate-limited logging of bad connections, per cause.

A listener (the graph server, a data server, the metrics endpoint) reports each
connection it closes for a reason of the peer's making - a failed authentication, a
protocol violation before or after the handshake, a late handshake, a connection over
the limit, a peer gone silent - to its :class:`BadPeerLog`, which logs at most
``BAD_PEER_LOG_FIRST`` lines one by one per cause and ``BAD_PEER_LOG_INTERVAL``:

* the first connection of a cause opens a period of ``BAD_PEER_LOG_INTERVAL`` seconds
  for that cause; the first ``BAD_PEER_LOG_FIRST`` of the cause in the period are logged
  one line each (the last of them says that more are only counted);
* later ones of the period are counted, and one summary line, at most one per
  ``BAD_PEER_LOG_INTERVAL`` for all causes together, gives their counts per cause;
* a connection of the cause after its period has ended opens a new period.

So a listener writes at most ``BAD_PEER_LOG_FIRST`` lines per cause per period, plus one
summary line per ``BAD_PEER_LOG_INTERVAL`` and one when it closes, each line at most
``BAD_PEER_LOG_MAX_CHARS`` long however much of a peer's text it quotes: 5,000 hostile
connections cost a handful of lines, and a slow trickle (fewer than
``BAD_PEER_LOG_FIRST`` a period) still shows every offender. The same class bounds
other peer-made faults that do not close a connection (*summary* names them).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from ._config import BAD_PEER_LOG_FIRST, BAD_PEER_LOG_INTERVAL, BAD_PEER_LOG_MAX_CHARS

__all__ = ["BadPeerLog"]


class BadPeerLog:
    """Counts bad connections of one listener, named *what* in every line, by cause.

    Call it from the event loop's thread. :attr:`counts` holds the totals per cause.
    *summary* says what the summary line counts (default: bad connections closed).
    :meth:`close` logs the summary still pending (when the listener stops).
    """

    def __init__(
        self, logger: logging.Logger, what: str, *, summary: str = "bad connections closed"
    ) -> None:
        self._log = logger
        self._what = what
        self._noun = summary
        #: bad connections so far, by cause
        self.counts: Counter[str] = Counter()
        self._unlogged: Counter[str] = Counter()
        # Per cause: when its current period began (loop time), and lines logged in it.
        self._periods: dict[str, tuple[float, int]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, cause: str, message: str, *args: object) -> None:
        """Count one bad connection of *cause*; log ``message % args`` if it is among
        the first of that cause in its period. The message must not contain secrets."""
        self.counts[cause] += 1
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - always called from a protocol
            loop = None
        now = loop.time() if loop is not None else 0.0
        start, logged = self._periods.get(cause, (now, 0))
        if now - start >= BAD_PEER_LOG_INTERVAL:
            start, logged = now, 0
        if logged < BAD_PEER_LOG_FIRST:
            self._periods[cause] = (start, logged + 1)
            suffix = (
                f" (further ones of this cause are counted and summarized, for up to "
                f"{BAD_PEER_LOG_INTERVAL:.0f} s)"
                if logged + 1 == BAD_PEER_LOG_FIRST
                else ""
            )
            text = message % args if args else message
            if len(text) > BAD_PEER_LOG_MAX_CHARS:  # (a peer's text quoted in it)
                cut = len(text) - BAD_PEER_LOG_MAX_CHARS
                text = f"{text[:BAD_PEER_LOG_MAX_CHARS]}... ({cut} more characters)"
            self._log.warning("%s: %s%s", self._what, text, suffix)
            return
        self._unlogged[cause] += 1
        if self._timer is None and loop is not None:
            self._timer = loop.call_later(BAD_PEER_LOG_INTERVAL, self._summary)

    def _summary(self) -> None:
        self._timer = None
        if not self._unlogged:
            return
        causes = ", ".join(f"{cause} {n}" for cause, n in sorted(self._unlogged.items()))
        total = sum(self._unlogged.values())
        self._unlogged.clear()
        self._log.warning(
            "%s: %d more %s (%s); totals so far: %s",
            self._what,
            total,
            self._noun,
            causes,
            ", ".join(f"{cause} {n}" for cause, n in sorted(self.counts.items())),
        )

    def close(self) -> None:
        """Log what is still unsummarized, and cancel the timer."""
        if self._timer is not None:
            self._timer.cancel()
        self._summary()
