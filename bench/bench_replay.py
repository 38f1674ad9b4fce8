"""Replay throughput: `clusterwatch replay` over a generated trace of >= 1M samples.

    python bench/bench_replay.py [--samples 1000000]

Prints samples/s of the whole command (reading the file included; by default the
series are shared by one process per idle core) and its peak memory, the same in
one and in two processes (--jobs), and on a trace of 2,048 series, beside two baselines measured
in the same run on the same file: bare JSON parsing of the lines in one process
(orjson, the single-core floor), and the naive per-sample least-squares over a
full one-hour window (what a straightforward implementation does; measured on a
slice and scaled, it is far too slow to run on all of it).
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict, deque
from pathlib import Path

import orjson

MB = 1024 * 1024


def generate(path: Path, n: int, series: int = 64, seed: int = 1) -> None:
    """Write a trace of `n` samples: `series` processes polled every 10-30 s, one in 16 leaking."""
    rng = random.Random(seed)
    procs = [(f"gpu{i // 8:03d}", 40000 + i) for i in range(series)]
    due = [(rng.uniform(0, 20), i) for i in range(series)]
    heapq.heapify(due)
    with open(path, "wb") as f:
        for _ in range(n):
            t, i = due[0]
            node, pid = procs[i]
            mem = 30e9 + (300 * MB * t / 3600 if i % 16 == 0 else 0) + rng.gauss(0, 20 * MB)
            f.write(orjson.dumps({"t": round(t, 3), "node": node, "job_id": str(9000 + i // 8), "pid": pid,
                                  "gpu": i % 8, "gpu_mem_bytes": int(mem), "gpu_util": round(rng.uniform(88, 99), 1),
                                  "cpu_percent": 100.0, "rss_bytes": int(6e9 + rng.gauss(0, 10 * MB)),
                                  "step": int(t)}) + b"\n")
            heapq.heapreplace(due, (t + rng.uniform(10, 30), i))


def bench_parse(path: Path) -> float:
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb") as f:
        for line in f:
            orjson.loads(line)
            n += 1
    return n / (time.perf_counter() - t0)


def bench_naive(path: Path, limit: int = 20000) -> float:
    """Per-sample ordinary least squares over the last hour of each series."""
    win: dict = defaultdict(deque)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        for k, line in enumerate(f):
            if k >= limit:
                break
            d = orjson.loads(line)
            w = win[(d["node"], d["pid"])]
            w.append((d["t"], d["gpu_mem_bytes"]))
            while w[0][0] < d["t"] - 3600:
                w.popleft()
            n = len(w)
            mx = sum(x for x, _ in w) / n
            my = sum(y for _, y in w) / n
            sxx = sum((x - mx) ** 2 for x, _ in w)
            _ = sum((x - mx) * (y - my) for x, y in w) / sxx if sxx else 0.0
    return limit / (time.perf_counter() - t0)


def bench_replay(path: Path, n: int, *extra: str) -> tuple[float, float]:
    """Samples/s of the whole `clusterwatch replay` command, and its peak memory (MiB, largest process)."""
    exe = Path(sys.executable).with_name("clusterwatch")
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(exe), "replay", str(path), "--format", "jsonl", *extra], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    rate = n / (time.perf_counter() - t0)
    if status != 0:
        raise SystemExit(f"clusterwatch replay exited with status {status}")
    return rate, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--many", type=int, default=2048, help="series in the many-series trace")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        many = Path(tmp) / "many.jsonl"
        generate(path, a.samples)
        generate(many, a.samples, series=a.many)
        rows = [
            ("clusterwatch replay (whole command)", *bench_replay(path, a.samples)),
            ("clusterwatch replay --jobs 1", *bench_replay(path, a.samples, "--jobs", "1")),
            ("clusterwatch replay --jobs 2", *bench_replay(path, a.samples, "--jobs", "2")),
            (f"clusterwatch replay, {a.many:,} series", *bench_replay(many, a.samples)),
            ("baseline: orjson parse only", bench_parse(path), None),
            ("baseline: naive per-sample 1 h least squares", bench_naive(path), None),
        ]
    print(f"{'what':48s} {'samples/s':>12s} {'peak MiB':>9s}")
    for name, rate, mem in rows:
        print(f"{name:48s} {rate:12,.0f} {'' if mem is None else f'{mem:9.0f}'}")
    print(json.dumps({"samples": a.samples, "cores": len(os.sched_getaffinity(0)),
                      "load_average_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
