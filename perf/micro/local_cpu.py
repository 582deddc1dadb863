"""The ordinary program with publisher and subscriber in one process (a local edge):
msgs/s and CPU a message (getrusage), optionally under cProfile.

    python perf/micro/local_cpu.py [N] [recv|encoded|on_message]

``recv`` (default): a tuple published, ``await sub.recv()`` in another task; ``encoded``:
the subscriber is ``encoded=True`` (as the Zenoh export in the publisher's process) and
drains what is queued after each ``recv()``; ``on_message``: a callback subscriber.
``PROF=FILE`` writes cProfile statistics of the run. Every message is checked to
arrive once, in order.
"""

import asyncio
import os
import resource
import sys
import time

import numpy as np

import ezflow

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
MODE = sys.argv[2] if len(sys.argv) > 2 else "recv"


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def main() -> None:
    async with ezflow.GraphContext("127.0.0.1:0") as ctx:
        pub = await ctx.publisher("/local", transport="local")
        got = [0]
        done = asyncio.get_running_loop().create_future()

        def on_message(message: tuple) -> None:
            if message[0] == 1:
                done.set_result(None)
                return
            assert message[1] == got[0]
            got[0] += 1

        if MODE == "on_message":
            sub = await ctx.subscriber("/local", on_message=on_message)
        else:
            sub = await ctx.subscriber("/local", encoded=MODE == "encoded")
        await pub.wait_for_channels(1)
        body = np.zeros(16, np.float32)

        async def produce() -> None:
            for seq in range(N):
                await pub.publish((0, seq, time.perf_counter_ns(), body))
            await pub.publish((1, -1, 0, body))

        profile = None
        if os.environ.get("PROF"):
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        started, used = time.perf_counter(), cpu()
        task = asyncio.create_task(produce())
        if MODE == "on_message":
            await done
        elif MODE == "encoded":
            while got[0] <= N:
                batch = [await sub.recv()]
                for _ in range(sub.queued):
                    batch.append(sub.recv_nowait())
                got[0] += len(batch)
            got[0] -= 1
        else:
            while True:
                message = await sub.recv()
                if message[0] == 1:
                    break
                assert message[1] == got[0]
                got[0] += 1
        await task
        elapsed, used = time.perf_counter() - started, cpu() - used
        if profile is not None:
            profile.disable()
            profile.dump_stats(os.environ["PROF"])
        assert got[0] == N, got
        print(f"{MODE}: {N / elapsed:,.0f} msgs/s, CPU {used / N * 1e6:.2f} µs a message")


asyncio.run(main())
