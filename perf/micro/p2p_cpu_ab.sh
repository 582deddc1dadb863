#!/usr/bin/env bash
# The compiled and the pure-Python codec paths side by side, alternating, in one run:
#   bash perf/micro/p2p_cpu_ab.sh [ROUNDS=3] [N=100000]      (from the repository root)
set -euo pipefail
rounds=${1:-3}; n=${2:-100000}; py=${PYTHON:-.venv/bin/python}
uptime
for round in $(seq "$rounds"); do
    for transport in shm tcp; do
        for path in compiled pure; do
            if [ "$path" = pure ]; then export EZFLOW_PURE_PYTHON=1; else unset EZFLOW_PURE_PYTHON; fi
            "$py" perf/micro/p2p_cpu.py "$transport" "$n" | sed "s/^/$round $transport $path /"
        done
    done
done
unset EZFLOW_PURE_PYTHON
uptime
