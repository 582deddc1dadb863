"""Quickstart: a publisher and two subscribers exchanging numpy arrays.

Runs in one process with an embedded graph server: a sine generator publishes blocks
of samples on ``/sine``; a lossless subscriber checks every block arrives in order, and
a second subscriber listens through a topic -> topic edge, over TCP, to show the same
API carries messages between processes too.

    python examples/quickstart.py --blocks 200
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import ezflow


async def main(blocks: int, block_size: int, rate: float) -> None:
    # Port 0: start an embedded graph server on a free port (the default address is
    # 127.0.0.1:25990, or EZFLOW_GRAPH_ADDRESS).
    async with ezflow.GraphContext(("127.0.0.1", 0)) as ctx:
        raw = await ctx.subscriber("/sine")  # same process: the local transport
        display = await ctx.subscriber("/display", transport="tcp")
        await ctx.connect("/sine", "/display")  # topic -> topic edge
        sine = await ctx.publisher("/sine")

        async def generate() -> None:
            t = 0.0
            for _ in range(blocks):
                times = t + np.arange(block_size) / rate
                await sine.publish(np.sin(2 * np.pi * 5.0 * times))
                t += block_size / rate

        started = time.perf_counter()
        producer = asyncio.ensure_future(generate())
        energy = 0.0
        for _ in range(blocks):
            block = await raw.recv()  # read-only view of the published array
            shown = await display.recv()  # decoded once from tcp, also read-only
            assert np.array_equal(block, shown)
            energy += float(np.sum(block**2))
        await producer
        elapsed = time.perf_counter() - started

        print(f"received {blocks} blocks of {block_size} samples twice in {elapsed:.3f} s")
        print(f"mean power {energy / (blocks * block_size):.3f} (a unit sine has 0.5)")
        for channel in ctx.channels:
            print(
                f"  channel {channel.topic} via {channel.transport}: "
                f"{channel.statistics.messages} messages, {channel.statistics.decoded} decoded"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=500, help="blocks to publish")
    parser.add_argument("--block-size", type=int, default=256, help="samples per block")
    parser.add_argument("--rate", type=float, default=1000.0, help="sample rate, Hz")
    args = parser.parse_args()
    ezflow.lowlevel.run_coroutine(main(args.blocks, args.block_size, args.rate))
