"""Sorts the late messages (over 500 us) of a `perf/micro/paced.py` run made with OUT=FILE:
the publisher wrote late (preempted between its stamp and its write), the subscriber
waited for a CPU (its run delay, /proc/thread-self/schedstat, covers most of the
lateness), a backlog read behind one of those, or other (the subscriber was busy).

    python perf/micro/paced_classify.py FILE"""
import sys, numpy as np
f = sys.argv[1]
sub = np.loadtxt(f); pub = np.loadtxt(f + ".pub")
read, recv, delay, cpu = sub.T; write, ret = pub.T
late = recv > 500
n = late.sum()
pub_late = late & (write > 0.5 * recv)            # the publisher wrote late (it was preempted before its write)
starved = late & ~pub_late & (delay > 0.5 * (recv - write))   # written on time; the subscriber waited for a CPU
backlog = late & ~pub_late & ~starved & (delay < 50)          # read in the same wake as a starved one (a backlog)
other = late & ~pub_late & ~starved & ~backlog
print(f"{f}: n={len(recv)} p50 {np.median(recv):.1f} p99 {np.percentile(recv, 99):.0f} | late>500us {n}: publisher late {pub_late.sum()}, subscriber waiting for a CPU {starved.sum()}, backlog behind one {backlog.sum()}, other {other.sum()}")
for i in np.flatnonzero(other)[:8]:
    print("  other:", sub[i], pub[i])
