"""The ordinary program with a large payload between two processes: per-side user and
system CPU per message (getrusage), msgs/s, and wake-ups of the subscriber.

    python perf/micro/large_cpu.py TRANSPORT N [SIZE|frame] [pub|sub]

SIZE in bytes (default 1 MiB: a random float32 array, as ``ezflow perf peers`` sends);
``frame`` is the 2160x3840x3 uint8 frame. A fourth argument profiles that side with
cProfile. PACE=seconds paces the publisher and prints the subscriber's p50 latency
instead of a back-to-back rate. Compare two trees in one run with
``EZ_TREE=TREE python perf/micro/large_cpu.py ...`` (perf/micro/large_ab.sh)."""
import asyncio, os, sys, time, resource
if os.environ.get("EZ_TREE"):  # run that checkout's ezflow, not the editable install's
    sys.path.insert(0, os.environ["EZ_TREE"])
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "") and "editable" not in type(f).__name__.lower() and "__editable__" not in repr(f)]
import numpy as np
import ezflow

TRANSPORT = sys.argv[1]; N = int(sys.argv[2])
SIZE_ARG = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "--role" else str(1 << 20)
PROF = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "--role" else ""
PACE = float(os.environ.get("PACE", "0"))

def payload():
    rng = np.random.default_rng(1)
    if SIZE_ARG == "frame":
        return rng.integers(1, 256, (2160, 3840, 3), dtype=np.uint8)
    return (rng.random(int(SIZE_ARG) // 4, dtype=np.float32) + np.float32(1.0)).astype(np.float32)

def cpu2():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime, r.ru_stime

async def pub_main(addr):
    async with ezflow.GraphContext(addr, auto_start=False) as ctx:
        pub = await ctx.publisher("/large", transport=TRANSPORT)
        body = payload()
        await pub.wait_for_channels(1)
        for seq in range(20):  # warm-up: segments made and mapped
            await pub.publish((2, seq, time.perf_counter_ns(), body))
        await asyncio.sleep(0.3)
        u0 = cpu2(); t0 = time.perf_counter()
        for seq in range(N):
            if PACE:
                await asyncio.sleep(PACE)
            await pub.publish((0, seq, time.perf_counter_ns(), body))
        await pub.publish((1, -1, 0, body))
        u1 = cpu2()
        print(f"pub user {1e6*(u1[0]-u0[0])/N:.1f} sys {1e6*(u1[1]-u0[1])/N:.1f} us/msg wall {N/(time.perf_counter()-t0):,.0f}/s waits {pub.statistics().waits}", flush=True)
        await asyncio.sleep(0.3)

async def sub_main(addr):
    async with ezflow.GraphContext(addr, auto_start=False) as ctx:
        sub = await ctx.subscriber("/large", transport=TRANSPORT)
        recv = sub.recv
        inbox = sub._inbox
        while True:
            m = await recv()
            if m[0] == 0:
                break
        u0 = cpu2(); t0 = time.perf_counter(); n = 1; waits = 0; lat = []
        while True:
            if not inbox._items:
                waits += 1
            m = await recv()
            if m[0] == 1: break
            if PACE:
                lat.append(time.perf_counter_ns() - m[2])
            n += 1
        dt = time.perf_counter() - t0
        u1 = cpu2()
        extra = f" p50 {np.percentile(lat, 50)/1e3:.0f} us" if lat else ""
        print(f"sub user {1e6*(u1[0]-u0[0])/n:.1f} sys {1e6*(u1[1]-u0[1])/n:.1f} us/msg rate {n/dt:,.0f}/s n={n} msgs/wake {n/max(waits,1):.2f}{extra}", flush=True)

def run(role, addr):
    coro = pub_main(addr) if role == "pub" else sub_main(addr)
    if PROF == role:
        import cProfile, pstats
        pr = cProfile.Profile(); pr.enable(); asyncio.run(coro); pr.disable()
        pstats.Stats(pr).sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("TOP", "25")))
    else:
        asyncio.run(coro)

async def main():
    async with ezflow.GraphServer(("127.0.0.1", 0)) as server:
        addr = "%s:%d" % server.address
        wrap = {r: os.environ.get("WRAP_" + r.upper(), "").split() for r in ("sub", "pub")}
        procs = [await asyncio.create_subprocess_exec(*wrap[r], sys.executable, os.environ.get("EZ_SCRIPT", __file__), TRANSPORT, str(N), SIZE_ARG, PROF or "-", "--role", r, addr) for r in ("sub", "pub")]
        for p in procs: await p.wait()

if "--role" in sys.argv:
    i = sys.argv.index("--role"); run(sys.argv[i+1], sys.argv[i+2])
else:
    asyncio.run(main())
