#!/usr/bin/env bash
# Two trees side by side, alternating, in one run: per-side CPU per message and msgs/s
# of the ordinary program with a large payload (perf/micro/large_cpu.py).
#   bash perf/micro/large_ab.sh BASE_TREE [ROUNDS=3] [N=3000] [TRANSPORTS="shm tcp"] [SIZE=1048576]
# (from the repository root; BASE_TREE: a checkout with its extension built in place)
set -euo pipefail
base=$1; rounds=${2:-3}; n=${3:-3000}; transports=${4:-"shm tcp"}; size=${5:-1048576}
py=${PYTHON:-.venv/bin/python}
uptime
for round in $(seq "$rounds"); do
    for transport in $transports; do
        for tree in base new; do
            if [ "$tree" = base ]; then path=$base; else path=$PWD; fi
            EZ_TREE=$path "$py" perf/micro/large_cpu.py "$transport" "$n" "$size" | sed "s/^/$round $transport $tree /"
        done
    done
done
uptime
