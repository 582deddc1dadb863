"""ezring benchmark: a C writer publishing 1.1 MB frames into Python reader processes.

    python c/examples/bench_reader.py --readers 1 --frames 3000 --runs 3
    python c/examples/bench_reader.py --readers 4 --frames 3000 --runs 3

Compiles c/examples/camera_writer.c with cc into a temporary directory, then per run starts
the writer (16 slots, waiting for every reader to register; --rate 0: saturating - a full
ring makes it retry after 20 us, so dropped_full counts those retries; --rate R: a camera at
R frames/s that drops when full) and
N reader processes. Each reader is a lossless ``ezflow.ezring.RingReader`` that checksums every
frame - ``np.add.reduce`` over the frame viewed as uint64 (wrapping sum, ~memory-bandwidth
bound; zlib.crc32 is 5-10x slower) - and measures the latency from the slot's t_ns (writer's
CLOCK_MONOTONIC at commit) to receipt. Prints per run: frames/s and Gbit/s per reader (first
to last frame), p50/p99 latency, and the writer's drops; then the medians over runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import ezflow

HERE = Path(__file__).resolve().parent


async def child(name: str) -> None:
    latencies: list[int] = []
    total = 0
    checksum = np.uint64(0)
    first = last = 0
    async with await ezflow.ezring.RingReader.open(name, timeout=10) as reader:
        print("registered", flush=True)
        async for frame in reader:
            now = time.monotonic_ns()
            latencies.append(now - frame.t_ns)
            checksum ^= np.add.reduce(frame.array.view(np.uint64))
            total += frame.array.nbytes
            del frame
            last = time.monotonic_ns()
            if not first:
                first = last
    latencies.sort()
    n = len(latencies)
    seconds = max(last - first, 1) / 1e9
    print(
        json.dumps(
            {
                "frames": n,
                "fps": (n - 1) / seconds if n > 1 else 0.0,
                "gbit_s": (n - 1) * (total / max(n, 1)) * 8 / seconds / 1e9,
                "p50_us": latencies[n // 2] / 1e3 if n else 0.0,
                "p99_us": latencies[min(n - 1, n * 99 // 100)] / 1e3 if n else 0.0,
                "checksum": int(checksum),
            }
        ),
        flush=True,
    )


def run_once(writer: Path, args: argparse.Namespace) -> dict[str, float]:
    readers, frames, size, slots, rate = args.readers, args.frames, args.size, args.slots, args.rate
    name = f"bench-{time.monotonic_ns()}"
    w = subprocess.Popen(
        [str(writer), "--name", name, "--frame-size", str(size), "--slots", str(slots)]
        + ["--count", str(frames), "--rate", str(rate), "--wait-readers", str(readers)]
        + (["--on-full", "retry"] if rate == 0 else []),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert w.stdout is not None
    w.stdout.readline()  # ready
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", name], stdout=subprocess.PIPE, text=True
        )
        for _ in range(readers)
    ]
    stats = json.loads(w.stdout.readline())
    w.wait()
    results = []
    for p in procs:
        assert p.stdout is not None
        lines = p.stdout.read().splitlines()
        p.wait()
        results.append(json.loads(lines[-1]))
    return {
        "fps_per_reader": statistics.median(r["fps"] for r in results),
        "gbit_s_per_reader": statistics.median(r["gbit_s"] for r in results),
        "gbit_s_total": sum(r["gbit_s"] for r in results),
        "p50_us": statistics.median(r["p50_us"] for r in results),
        "p99_us": max(r["p99_us"] for r in results),
        "published": stats["published"],
        "dropped_full": stats["dropped_full"],
        "received_min": min(r["frames"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--readers", type=int, default=1)
    parser.add_argument("--frames", type=int, default=3000)
    parser.add_argument("--size", type=int, default=1_100_000)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=0, help="frames/s; 0: saturate")
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child))
        return
    cc = shutil.which("cc")
    if cc is None:
        sys.exit("no C compiler (cc)")
    with tempfile.TemporaryDirectory() as tmp:
        writer = Path(tmp) / "camera_writer"
        subprocess.run(
            [
                cc,
                "-O2",
                "-std=c11",
                f"-I{HERE.parent}",
                "-o",
                str(writer),
                HERE / "camera_writer.c",
            ],
            check=True,
        )
        runs = []
        for _ in range(args.runs):
            result = run_once(writer, args)
            print(json.dumps({k: round(v, 1) for k, v in result.items()}), flush=True)
            runs.append(result)
    medians = {k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]}
    print("median", json.dumps(medians))


if __name__ == "__main__":
    main()
