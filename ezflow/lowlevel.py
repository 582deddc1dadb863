"""Low-level helpers: the codec on its own, and the event-loop plumbing.

::

    import ezflow

    async def main() -> None:
        async with ezflow.GraphContext() as ctx:
            ...

    ezflow.lowlevel.run_coroutine(main())  # asyncio.run, on uvloop when it is installed

- :class:`Codec` encodes and decodes a message as a channel does (tests, tools reading
  recorded bodies; :func:`ezflow.register_message` and ``@ezflow.message`` stay in
  ``ezflow``: every program that sends dataclasses needs them).
- :func:`run_coroutine` runs a coroutine on the loop ezflow picks (``EZFLOW_EVENT_LOOP``,
  else uvloop when installed); :func:`loop_factory` gives that loop's factory (for
  ``asyncio.Runner(loop_factory=...)``).

These names were in the top-level ``ezflow`` namespace before (``ezflow.Codec``,
``ezflow.run_coroutine``, ``ezflow.loop_factory``): those aliases are deprecated, warn,
and go in the next release.
"""

from __future__ import annotations

from ._core._codec import Codec
from ._core._loop import loop_factory, run_coroutine

__all__ = ["Codec", "loop_factory", "run_coroutine"]
