"""A stand-in for the event loop that ``Inbox.get_nowait(loop)`` defers a woken take's
release to: it records each ``call_soon`` and runs them when the test says."""

from __future__ import annotations

from typing import Any


class Soon:
    """Records ``call_soon(callback, *args)``; :meth:`run` runs what was recorded, in
    order (what those calls defer in turn waits for the next :meth:`run`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.calls.append((callback, args))

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for callback, args in calls:
            callback(*args)
