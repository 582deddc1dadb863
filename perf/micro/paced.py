"""The ordinary 64 B program between two processes, paced: the latency of each message
(the publisher's perf_counter_ns stamp -> the subscriber's recv returning), as the p2p
cell's latency phase measures it. Prints p50/p90/p99/max and the late messages' runs.

    python perf/micro/paced.py TRANSPORT N [PERIOD_S]   (SESSIONS=1: each side in its own
    session, as the perf runner starts its workers; OUT=file: per message, the read
    callback's start and recv's return (from the stamp), the subscriber's run delay and
    CPU since the previous recv; OUT.pub: the write (where the handoff starts) and
    publish's return (from the stamp). OUT wraps Outlet._hand_off, so the compiled
    publish calls it instead of handing off itself: leave OUT out for the p50.)
NOHANDOFF=1: the publisher's sched_yield is a no-op.

Compare two trees with the same interpreter: PYTHONPATH=/path/to/tree python ..."""
import asyncio, os, sys, time
import numpy as np
import ezflow

TRANSPORT = sys.argv[1]; N = int(sys.argv[2]); PERIOD = float(sys.argv[3]) if len(sys.argv) > 3 and not sys.argv[3].startswith("--") else 0.001
WARM = 200

async def pub_main(addr):
    if os.environ.get("NOHANDOFF"):
        import ezflow._core._outlet as _o
        _o._sched_yield = lambda: None
    async with ezflow.GraphContext(addr, auto_start=False) as ctx:
        pub = await ctx.publisher("/paced", transport=TRANSPORT)
        body = np.zeros(16, np.float32)
        await pub.wait_for_channels(1)
        await asyncio.sleep(0.3)
        clock = time.perf_counter_ns
        due = time.monotonic()
        done = []
        handed = [0]
        if os.environ.get("OUT"):  # (the write's time: taken where the handoff starts)
            import ezflow._core._outlet as _o
            orig = _o.Outlet._hand_off
            def ho(self, started, orig=orig):
                handed[0] = clock()
                return orig(self, started)
            _o.Outlet._hand_off = ho  # (the compiled publish then calls it: not its own)
        for seq in range(N + WARM):
            t = clock()
            await pub.publish((0, seq, t, body))
            done.append((handed[0] - t, clock() - t))
            due += PERIOD
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        await pub.publish((1, -1, 0, body))
        await asyncio.sleep(0.3)
        if os.environ.get("OUT"):
            np.savetxt(os.environ["OUT"] + ".pub", np.asarray(done[WARM:]) / 1e3, fmt="%.1f")

def _delay():
    with open("/proc/thread-self/schedstat", "rb") as f:
        return int(f.read().split()[1])

async def sub_main(addr):
    async with ezflow.GraphContext(addr, auto_start=False) as ctx:
        sub = await ctx.subscriber("/paced", transport=TRANSPORT)
        lat = []
        clock = time.perf_counter_ns
        reads = []
        if os.environ.get("OUT"):
            from ezflow._transports._stream_channel import ChannelConnection
            orig = ChannelConnection.buffer_updated
            def bu(self, n, orig=orig):
                reads.append(clock())
                return orig(self, n)
            ChannelConnection.buffer_updated = bu
        recvd = []
        while True:
            m = await sub.recv()
            now = clock()
            if m[0] == 1:
                break
            lat.append(now - m[2])
            recvd.append((m[2], now, _delay(), time.thread_time_ns()))
        a = np.asarray(lat[WARM:], dtype=np.float64) / 1e3
        p = np.percentile(a, [50, 90, 99])
        print(f"n={a.size} p50 {p[0]:.1f} p90 {p[1]:.1f} p99 {p[2]:.1f} max {a.max():.0f} us; "
              f">500us: {(a > 500).sum()}", flush=True)
        late = np.flatnonzero(a > 500)
        runs = []
        for i in late:
            if runs and i == runs[-1][1] + 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        for s, e in runs[:12]:
            print(f"  late run {s}-{e}: " + " ".join(f"{v:.0f}" for v in a[s:e + 1][:12]), flush=True)
        if os.environ.get("OUT"):
            # per message: stamp, last read callback start at or before recv, recv
            r = np.asarray(reads)
            rows = []
            prev = recvd[WARM - 1]
            for stamp, now, delay, cpu in recvd[WARM:]:
                k = np.searchsorted(r, now, side="right") - 1
                rows.append(((r[k] - stamp) / 1e3 if k >= 0 else -1, (now - stamp) / 1e3,
                             (delay - prev[2]) / 1e3, (cpu - prev[3]) / 1e3))
                prev = (stamp, now, delay, cpu)
            np.savetxt(os.environ["OUT"], np.asarray(rows), fmt="%.1f")

def run(role, addr):
    asyncio.run(pub_main(addr) if role == "pub" else sub_main(addr))

async def main():
    async with ezflow.GraphServer(("127.0.0.1", 0)) as server:
        addr = "%s:%d" % server.address
        sessions = bool(os.environ.get("SESSIONS"))
        procs = [await asyncio.create_subprocess_exec(sys.executable, __file__, *sys.argv[1:], "--role", r, addr, start_new_session=sessions) for r in ("sub", "pub")]
        for p in procs: await p.wait()

if "--role" in sys.argv:
    i = sys.argv.index("--role"); run(sys.argv[i+1], sys.argv[i+2])
else:
    asyncio.run(main())
