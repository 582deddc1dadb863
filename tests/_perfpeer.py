"""A stand-in peer framework for the perf tests: ezflow under another name, with tcp
refused the way a transport that is not available is (so the "unavailable" path runs).

Run as ``python tests/_perfpeer.py graph | units SPEC | info``, like perf/peers/.
"""

from __future__ import annotations

from typing import Any

from ezflow import ConfigurationError
from ezflow._perf._worker import EzflowFramework, main


class StandIn(EzflowFramework):
    name = "standin"

    async def publisher(self, ctx: Any, topic: str, transport: str) -> Any:
        if transport == "tcp":
            raise ConfigurationError("the stand-in peer has no tcp")
        return await super().publisher(ctx, topic, transport)


if __name__ == "__main__":
    main(StandIn())
