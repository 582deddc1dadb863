"""A context's transports by name, typed, for tests that look at their internals (data
server addresses, connections, bad-peer counts)."""

from __future__ import annotations

import ezflow
from ezflow._transports._shm import ShmTransport
from ezflow._transports._tcp import TcpTransport


def tcp_of(ctx: ezflow.GraphContext) -> TcpTransport:
    assert ctx._transports is not None, "the context is not started"
    return ctx._transports.get("tcp", TcpTransport)


def shm_of(ctx: ezflow.GraphContext) -> ShmTransport:
    assert ctx._transports is not None, "the context is not started"
    return ctx._transports.get("shm", ShmTransport)
