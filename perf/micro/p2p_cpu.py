"""The ordinary 64 B program between two processes, for profiling: per-side user and
system CPU per message (getrusage) and msgs/s; with a third argument (pub or sub),
cProfile of that side.

    python perf/micro/p2p_cpu.py TRANSPORT N [pub|sub]      (SIZE=64 bytes by default)

EZ_CALLGRIND=pub (or sub) runs that side under callgrind: instructions per message
from two runs, as perf/micro/p2p_ir.sh does.

MIXED=1 interleaves two topics as the perf `mixed` cell does (tuple on /p2p, the perf
worker's registered MixedSample dataclass on /p2p/mixed, one task alternating recv);
MIXED=dc sends the dataclass alone on one topic; MIXED=2 is the perf `pair` cell (the
two topics of MIXED=1, the tuple on both).

Compare the codec paths in one run: EZFLOW_PURE_PYTHON=1 python ... forces the pure one
(perf/micro/p2p_cpu_ab.sh alternates them)."""
import asyncio, os, sys, time, resource
import numpy as np
import ezflow

TRANSPORT = sys.argv[1]; N = int(sys.argv[2]); PROF = sys.argv[3] if len(sys.argv) > 3 else ""
SIZE = int(os.environ.get("SIZE", "64"))
MIXED = os.environ.get("MIXED", "")
if os.environ.get("EZ_CALLGRIND") == "pub" and "--role" in sys.argv:
    # A publisher under callgrind runs ~50x slower: every publish would come PACED_GAP_NS
    # after the previous write and take the paced path (a write and a CPU handoff each).
    # Lift the gap, as for a publisher at full speed, and build the compiled path again.
    import ezflow._transports._stream_publish as _sp, ezflow._transports._shm as _shm
    import ezflow._graph._publisher as _gp
    _sp._PACED_GAP_NS = _shm._PACED_GAP_NS = 10**15
    _gp._publish_small = _sp.compiled_publish_small()
if MIXED:
    from ezflow import register_message
    from ezflow._perf._worker import MixedSample
    register_message(MixedSample, name="ezflow.perf.MixedSample")

def cpu2():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime, r.ru_stime
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime

async def pub_main(addr):
    async with ezflow.GraphContext(addr, auto_start=False) as ctx:
        pub = await ctx.publisher("/p2p", transport=TRANSPORT)
        body = np.zeros(SIZE // 4, np.float32)
        await pub.wait_for_channels(1)  # (a side under callgrind starts slowly)
        if MIXED in ("1", "2"):
            pub2 = await ctx.publisher("/p2p/mixed", transport=TRANSPORT)
            await pub2.wait_for_channels(1)
        await asyncio.sleep(0.5)
        c0 = cpu(); u0=cpu2(); t0 = time.perf_counter()
        if MIXED == "1":
            p1, p2 = pub.publish, pub2.publish
            for seq in range(N):
                m = (0, seq, time.perf_counter_ns(), body)
                await (p2(MixedSample(*m)) if seq & 1 else p1(m))
            await (p2(MixedSample(1, -1, 0, body)) if N & 1 else p1((1, -1, 0, body)))
        elif MIXED == "2":
            p1, p2 = pub.publish, pub2.publish
            for seq in range(N):
                m = (0, seq, time.perf_counter_ns(), body)
                await (p2(m) if seq & 1 else p1(m))
            await (p2 if N & 1 else p1)((1, -1, 0, body))
        elif MIXED == "dc":
            for seq in range(N):
                await pub.publish(MixedSample(0, seq, time.perf_counter_ns(), body))
            await pub.publish(MixedSample(1, -1, 0, body))
        else:
            for seq in range(N):
                await pub.publish((0, seq, time.perf_counter_ns(), body))
            await pub.publish((1, -1, 0, body))
        u1=cpu2(); print(f"pub user {1e6*(u1[0]-u0[0])/N:.2f} sys {1e6*(u1[1]-u0[1])/N:.2f} cpu/msg {1e6*(cpu()-c0)/N:.2f} us wall {N/(time.perf_counter()-t0):,.0f}/s", flush=True)
        await asyncio.sleep(0.3)

async def sub_main(addr):
    async with ezflow.GraphContext(addr, auto_start=False) as ctx:
        sub = await ctx.subscriber("/p2p", transport=TRANSPORT)
        recv = sub.recv
        inbox = sub._inbox  # (how often recv waits: the wake-ups, about one per read)
        if MIXED in ("1", "2"):
            sub2 = await ctx.subscriber("/p2p/mixed", transport=TRANSPORT)
            recvs = (sub.recv, sub2.recv)
            m = await recv(); c0 = cpu(); u0=cpu2(); t0 = time.perf_counter(); n = 1; waits = 0
            while True:
                m = await recvs[n & 1]()
                if (m.phase if n & 1 and MIXED == "1" else m[0]) == 1: break
                n += 1
        elif MIXED == "dc":
            m = await recv(); c0 = cpu(); u0=cpu2(); t0 = time.perf_counter(); n = 1; waits = 0
            while True:
                if not inbox._items:
                    waits += 1
                m = await recv()
                if m.phase == 1: break
                n += 1
        else:  # (the loop every earlier figure of this script was measured with)
            m = await recv(); c0 = cpu(); u0=cpu2(); t0 = time.perf_counter(); n = 1; waits = 0
            while True:
                if not inbox._items:
                    waits += 1
                m = await recv()
                if m[0] == 1: break
                n += 1
        dt = time.perf_counter() - t0
        u1=cpu2(); print(f"sub user {1e6*(u1[0]-u0[0])/n:.2f} sys {1e6*(u1[1]-u0[1])/n:.2f} cpu/msg {1e6*(cpu()-c0)/n:.2f} us rate {n/dt:,.0f}/s n={n} msgs/wake {n/max(waits,1):.1f}", flush=True)

def run(role, addr):
    coro = pub_main(addr) if role == "pub" else sub_main(addr)
    if PROF == role:
        import cProfile, pstats
        pr = cProfile.Profile(); pr.enable(); asyncio.run(coro); pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    else:
        asyncio.run(coro)

async def main():
    async with ezflow.GraphServer(("127.0.0.1", 0)) as server:
        addr = "%s:%d" % server.address
        # EZ_CALLGRIND=pub|sub: that side runs under callgrind, which prints the
        # instructions it ran ("Collected"); the difference of two runs over the
        # difference of their N is instructions per message, whatever the load.
        grind = os.environ.get("EZ_CALLGRIND", "")
        # (EZ_CALLGRIND_OUT=FILE keeps the profile, for callgrind_annotate)
        valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + os.environ.get("EZ_CALLGRIND_OUT", "/dev/null")]
        procs = [await asyncio.create_subprocess_exec(*(valgrind if r == grind else []), sys.executable, __file__, TRANSPORT, str(N), PROF, "--role", r, addr) for r in ("sub", "pub")]
        for p in procs: await p.wait()

if "--role" in sys.argv:
    i = sys.argv.index("--role"); run(sys.argv[i+1], sys.argv[i+2])
else:
    asyncio.run(main())
