"""A stand-in peer framework for the perf tests: ezflow under another name, with tcp
refused the way a transport that is not available is (so the "unavailable" path runs).

Run as ``python tests/_perfpeer.py graph | units SPEC | info``, like a real peer.

It crashes on purpose when ``EZFLOW_PERFPEER_CRASH`` says so, to exercise the runner's
retries and crash counting: ``TRANSPORT:MODE`` pairs, comma-separated, where MODE is

* ``once`` — the first units worker of a cell over TRANSPORT (of the whole run: the
  claim is a file in the directory ``EZFLOW_PERFPEER_MARKS``) exits with status 1 when
  it creates its publisher; the retry works;
* ``always`` — every units worker over TRANSPORT exits so;
* ``after`` — every publishing worker over TRANSPORT sends its figures, then exits
  with status 1.

With ``EZFLOW_PERFPEER_LEAVE=PREFIX`` it behaves like Zenoh's shm: each publishing
worker leaves a file ``/dev/shm/PREFIX-PID`` behind, and the framework names
``PREFIX-*`` as its ``leftovers`` for the runner to remove.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from ezflow import ConfigurationError
from ezflow._perf._worker import EzflowFramework, main

T = TypeVar("T")

CRASH = "EZFLOW_PERFPEER_CRASH"
MARKS = "EZFLOW_PERFPEER_MARKS"
LEAVE = "EZFLOW_PERFPEER_LEAVE"
#: The exit status of a crash on purpose.
CRASHED = 1


def _modes() -> dict[str, str]:
    pairs = (item.split(":", 1) for item in os.environ.get(CRASH, "").split(",") if item)
    return {transport: mode for transport, mode in pairs}


def _claim(transport: str) -> bool:
    """True for the first caller over *transport* in the whole run."""
    marker = Path(os.environ[MARKS]) / f"crashed-{transport}"
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


def _leave_file(prefix: str) -> None:
    """What a Zenoh process with shm on leaves behind: a file in /dev/shm."""
    Path(f"/dev/shm/{prefix}-{os.getpid()}").write_bytes(b"left" * 1024)


class StandIn(EzflowFramework):
    name = "standin"

    def __init__(self) -> None:
        super().__init__()
        self._crash_at_exit = False
        self._leave = os.environ.get(LEAVE, "")
        self.leftovers = (f"{self._leave}-*",) if self._leave else ()

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        if transport == "tcp":
            raise ConfigurationError("the stand-in peer has no tcp")
        mode = _modes().get(transport)
        if mode == "always" or (mode == "once" and _claim(transport)):
            sys.stderr.write(f"standin: crashing on purpose over {transport}\n")
            sys.stderr.flush()
            os._exit(CRASHED)  # no clean-up at all, as a real crash
        self._crash_at_exit = mode == "after"
        if self._leave:
            _leave_file(self._leave)
        return await super().publisher(ctx, topic, transport)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        result = super().run(main)
        if self._crash_at_exit:
            sys.exit("standin: crashing on purpose after the figures")
        return result


if __name__ == "__main__":
    main(StandIn())
