"""The per-message cost of ezflow's small-message path with cold caches, next to the raw
floor's, in one process (so that no scheduler decision blurs it).

A paced publisher (one message per 1 ms) and its subscriber run their code after a
sleep, with caches that other work has emptied; there, every distinct bytecode and C
function on the path costs cache misses, and that - not the warm cost that
``timeit`` shows - is what the paced one-way latency rows of ``bench_transports.py``
measure. This benchmark reproduces that state on purpose: before each message it writes
one byte per cache line of a 16 MiB buffer and sleeps 1 ms, then times

* raw floor: ``struct.pack`` of the clock + ``transport.writelines`` on a socketpair,
  received by an ``asyncio.BufferedProtocol`` that unpacks the stamp in
  ``buffer_updated``;
* ezflow: ``await pub.publish(array)`` of a 64-byte array over a real shm edge (both
  ends in this process, talking over the Unix socket), received by an ``on_message``
  callback.

Each is split into *send* (until the call returns: the write included) and *receive*
(from there to the receiver's callback: one event-loop turn, the read, the parse). The
two are interleaved message by message and the medians reported, with the difference.
Use it to see what a change to the message path costs or saves; it is a diagnostic,
not a bar.

Usage::

    python perf/bench_coldpath.py [--count N] [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import time
from typing import Any

import numpy as np

import ezflow

_STAMP = struct.Struct("=q")
_EVICT = np.ones(16 << 20, np.uint8)  # larger than this machine's caches


async def _cold() -> None:
    """Empty the caches (one write per 64-byte line), then sleep like a paced publisher."""
    _EVICT[::64] += 1
    await asyncio.sleep(0.001)


class _RawReceiver(asyncio.BufferedProtocol):
    """The floor's receiver: a fixed-size message, its stamp unpacked on arrival."""

    def __init__(self, size: int) -> None:
        self.buffer = memoryview(bytearray(size))
        self.filled = 0
        self.arrived: asyncio.Future[int] | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == len(self.buffer):
            self.filled = 0
            now = time.perf_counter_ns()
            _STAMP.unpack_from(self.buffer)
            if self.arrived is not None and not self.arrived.done():
                self.arrived.set_result(now)


async def _measure(count: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    clock = time.perf_counter_ns
    size = 64
    ours, theirs = socket.socketpair()
    writer, _ = await loop.create_unix_connection(asyncio.Protocol, sock=ours)
    _, receiver = await loop.create_unix_connection(lambda: _RawReceiver(size), sock=theirs)
    tail = bytes(size - _STAMP.size)
    arrivals: list[int] = []
    callback_arrived: list[asyncio.Future[int]] = []

    def on_message(message: Any) -> None:
        now = clock()
        if callback_arrived and not callback_arrived[-1].done():
            callback_arrived[-1].set_result(now)

    rows = []
    async with ezflow.GraphContext(("127.0.0.1", 0)) as ctx:
        await ctx.subscriber("/coldpath", transport="shm", on_message=on_message)
        pub = await ctx.publisher("/coldpath")
        await pub.wait_for_channels(1)
        payload = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
        for _ in range(count):
            receiver.arrived = loop.create_future()
            await _cold()
            started = clock()
            writer.writelines([_STAMP.pack(clock()), tail])
            sent = clock()
            raw = (sent - started, await receiver.arrived - sent)
            message = payload.copy()
            view = memoryview(message).cast("B")  # type: ignore[arg-type]
            callback_arrived.append(loop.create_future())
            await _cold()
            started = clock()
            _STAMP.pack_into(view, 0, clock())
            await pub.publish(message)
            sent = clock()
            arrivals.append(await callback_arrived[-1])
            rows.append((*raw, sent - started, arrivals[-1] - sent))
    writer.close()
    warm = max(1, count // 10)
    raw_send, raw_recv, send, recv = np.median(np.array(rows[warm:]), axis=0) / 1e3
    return {"raw_send": raw_send, "raw_recv": raw_recv, "send": send, "recv": recv}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1500, help="messages (default 1500)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    options = parser.parse_args(argv)
    r = ezflow.run_coroutine(_measure(options.count), loop=options.loop)
    print(f"cold-cache medians over {options.count} messages (µs), 64 B, one process:")
    print(f"{'':>10} {'send':>8} {'receive':>8} {'total':>8}")
    raw_total, total = r["raw_send"] + r["raw_recv"], r["send"] + r["recv"]
    print(f"{'raw floor':>10} {r['raw_send']:8.1f} {r['raw_recv']:8.1f} {raw_total:8.1f}")
    print(f"{'ezflow':>10} {r['send']:8.1f} {r['recv']:8.1f} {total:8.1f}")
    print(
        f"{'excess':>10} {r['send'] - r['raw_send']:8.1f} {r['recv'] - r['raw_recv']:8.1f} "
        f"{total - raw_total:8.1f}   (ezflow / floor: {total / raw_total:.2f}x)"
    )


if __name__ == "__main__":
    main()
