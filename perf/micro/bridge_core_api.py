"""What two core APIs would save the Zenoh bridge per 64 B message (CPU, one process).

    .venv/bin/python perf/micro/bridge_core_api.py [COUNT] [ROUNDS]

The bridge's separate processes spend most of their loop in core calls made once per
message (perf/micro/bridge_cli_cpu.py, py-spy):

* the exporter's subscriber decoded every message and the export encoded it again
  (the body it needs is the one that arrived): **decode + encode** below is what a
  subscriber handing over received bodies saves (``encoded=True``, built);
* the importer publishes each body of a sample with ``await
  Publisher.publish_encoded``, one coroutine (and the outlet's) per message: **publish
  one by one** against **send in runs** (the outlet's own ``send_now`` for each body of a
  run, one room check and wait per run: what a batch ``publish_encoded`` would cost)
  measures that API's gain, on a real link to a subscriber in another process, and
  **publish_encoded_many of 32** the API built for it (``Publisher.publish_encoded_many``,
  which also keeps every lossless window: the runs of 64 above do not).

Alternates the variants ROUNDS times and prints µs of CPU per message (process time of
the publishing process, which has no other work).
"""

# ruff: noqa: PLC0415, ASYNC220 - a measurement of core internals, in processes of its own
from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
import timeit

import numpy as np

MESSAGE = (0, 1, time.monotonic_ns(), np.random.default_rng(1).integers(0, 255, 64, np.uint8))


def codec_costs(count: int) -> tuple[float, float]:
    from ezflow._core._codec import Codec

    codec = Codec()
    body = codec.encode(MESSAGE).to_bytes()
    decode = min(timeit.repeat(lambda: codec.decode(body), number=count, repeat=5)) / count
    encode = min(timeit.repeat(lambda: codec.encode(MESSAGE), number=count, repeat=5)) / count
    return decode * 1e6, encode * 1e6


async def publish_costs(count: int, rounds: int) -> dict[str, list[float]]:
    import ezflow
    from ezflow._core._codec import Codec
    from ezflow._core._codec._format import EncodedMessage

    body = Codec().encode(MESSAGE).to_bytes()
    found: dict[str, list[float]] = {
        "one by one": [],
        "in runs of 64": [],
        "publish_encoded_many of 32": [],
    }
    async with ezflow.GraphContext("127.0.0.1:0") as ctx:
        address = "{}:{}".format(*ctx.address)
        pub = await ctx.publisher("/api")
        child = subprocess.Popen(
            [sys.executable, __file__, "--subscriber", address, str(count * rounds * 2)],
            stdout=subprocess.PIPE,
        )
        try:
            await pub.wait_for_channels(1)
            outlet = pub._outlet
            for _ in range(rounds):
                for name, costs in found.items():
                    await asyncio.sleep(0.2)  # (the subscriber catches up)
                    start = time.process_time()
                    if name == "one by one":
                        for _ in range(count):
                            await pub.publish_encoded(MESSAGE, body)
                    elif name.startswith("publish_encoded_many"):
                        messages, bodies = [MESSAGE] * 32, [body] * 32
                        for _ in range(count // 32):
                            await pub.publish_encoded_many(messages, bodies)
                    else:
                        left = count
                        while left:
                            await outlet.wait_for_room()
                            run = min(64, left)
                            for _ in range(run):
                                outlet.send_now(MESSAGE, None, EncodedMessage([body], len(body)))
                            left -= run
                            await asyncio.sleep(0)
                    costs.append((time.process_time() - start) / count * 1e6)
        finally:
            await pub.aclose()
            child.wait(60)
    return found


async def subscriber(address: str, count: int) -> None:
    import ezflow

    async with ezflow.GraphContext(address, auto_start=False) as ctx:
        sub = await ctx.subscriber("/api")
        for _ in range(count):
            await sub.recv()


def main() -> None:
    import ezflow

    if sys.argv[1:2] == ["--subscriber"]:
        ezflow.lowlevel.run_coroutine(subscriber(sys.argv[2], int(sys.argv[3])))
        return
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    decode, encode = codec_costs(count)
    print(f"64 B message: decode {decode:.2f} µs + encode {encode:.2f} µs")
    found = ezflow.lowlevel.run_coroutine(publish_costs(count, rounds))
    for name, costs in found.items():
        print(
            f"publish_encoded {name}: {statistics.median(costs):.2f} µs/msg "
            f"({min(costs):.2f}-{max(costs):.2f}, {rounds} rounds)"
        )


if __name__ == "__main__":
    main()
