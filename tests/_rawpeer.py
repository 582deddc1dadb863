"""Raw-socket peers for the hostile-input tests."""

from __future__ import annotations

import asyncio


async def closed_by_peer(reader: asyncio.StreamReader, timeout: float = 2) -> bool:
    """Read until the other end closes: True if it did within *timeout*, False if it
    kept the connection open (or reset it)."""
    try:
        while await asyncio.wait_for(reader.read(65536), timeout):
            pass
    except (ConnectionError, asyncio.TimeoutError):
        return False
    return True
