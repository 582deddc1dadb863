#!/usr/bin/env bash
# Instructions per message of one side of perf/micro/p2p_cpu.py (callgrind: the same
# figure whatever the load; that side runs ~50x slower, so the other one waits on it;
# a publisher under it has the paced gap lifted, see p2p_cpu.py):
#   bash perf/micro/p2p_ir.sh pub|sub [TRANSPORT=tcp]        (from the repository root)
# Compare trees with the same interpreter: PYTHONPATH=/path/to/tree bash ...
set -euo pipefail
side=$1; transport=${2:-tcp}; py=${PYTHON:-.venv/bin/python}
ir() { EZ_CALLGRIND=$side "$py" perf/micro/p2p_cpu.py "$transport" "$1" 2>&1 | grep -o "Collected : [0-9]*" | grep -o "[0-9]*"; }
a=$(ir 4000); b=$(ir 24000)
echo "$side $transport ${EZFLOW_PURE_PYTHON:+pure }$(( (b - a) / 20000 )) instructions/msg"
