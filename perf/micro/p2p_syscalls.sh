#!/usr/bin/env bash
# System calls of each side of perf/micro/p2p_cpu.py (the ordinary 64 B program between
# two processes), counted by `perf stat` on the kernel's syscall tracepoints:
#   bash perf/micro/p2p_syscalls.sh [TRANSPORT=tcp] [N=400000]     (root, from the repo root)
# Prints each side's CPU line, then per side the calls that were made (sendto: a write
# at once or an ACK, sendmsg: a vectored batch, recvfrom: a read, epoll_wait: a loop turn).
set -euo pipefail
transport=${1:-tcp}; n=${2:-400000}; py=${PYTHON:-.venv/bin/python}
out=$(mktemp -d)
"$py" perf/micro/p2p_cpu.py "$transport" "$n" > "$out/run.txt" 2>&1 &
sleep 1.5  # (both sides are up and connected; the blast starts 0.5 s after that)
events=syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_recvfrom
events=$events,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sched_yield
for pid in $(pgrep -f "p2p_cpu.py $transport $n .*--role"); do
  role=$(tr '\0' ' ' < "/proc/$pid/cmdline" | grep -o 'role [a-z]*' | cut -d' ' -f2)
  perf stat -e "$events" -p "$pid" -o "$out/$role.txt" &
done
wait
cat "$out/run.txt"
for role in pub sub; do
  echo "$role:"; grep syscalls "$out/$role.txt" | awk '{print "  " $1, $2}'
done
rm -rf "$out"
