"""Replay throughput: `clusterwatch replay` over a generated trace of >= 1M samples.

    python bench/bench_replay.py [--samples 1000000]

Prints samples/s of the whole command (reading the file included) beside two
baselines measured in the same run on the same file: bare JSON parsing of the
lines (orjson, the floor), and the naive per-sample least-squares over a full
one-hour window (what a straightforward implementation does; measured on a
slice and scaled, it is far too slow to run on all of it).
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict, deque
from pathlib import Path

import orjson

MB = 1024 * 1024


def generate(path: Path, n: int, seed: int = 1) -> None:
    """Write a trace of `n` samples: 64 processes polled every 10-30 s, a few leaking."""
    rng = random.Random(seed)
    procs = [(f"gpu{i // 8:03d}", 40000 + i) for i in range(64)]
    nxt = [rng.uniform(0, 20) for _ in procs]
    with open(path, "wb") as f:
        for _ in range(n):
            i = min(range(len(procs)), key=nxt.__getitem__) if len(procs) < 8 else _argmin(nxt)
            t = nxt[i]
            node, pid = procs[i]
            mem = 30e9 + (300 * MB * t / 3600 if i % 16 == 0 else 0) + rng.gauss(0, 20 * MB)
            f.write(orjson.dumps({"t": round(t, 3), "node": node, "job_id": str(9000 + i // 8), "pid": pid,
                                  "gpu": i % 8, "gpu_mem_bytes": int(mem), "gpu_util": round(rng.uniform(88, 99), 1),
                                  "cpu_percent": 100.0, "rss_bytes": int(6e9 + rng.gauss(0, 10 * MB)),
                                  "step": int(t)}) + b"\n")
            nxt[i] = t + rng.uniform(10, 30)


def _argmin(xs: list[float]) -> int:
    best, bi = xs[0], 0
    for k in range(1, len(xs)):
        if xs[k] < best:
            best, bi = xs[k], k
    return bi


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


def bench_replay(path: Path, n: int) -> float:
    exe = Path(sys.executable).with_name("clusterwatch")
    t0 = time.perf_counter()
    subprocess.run([str(exe), "replay", str(path), "--format", "jsonl"], check=True, stdout=subprocess.DEVNULL)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        generate(path, a.samples)
        rows = [
            ("clusterwatch replay (whole command)", bench_replay(path, a.samples)),
            ("baseline: orjson parse only", bench_parse(path)),
            ("baseline: naive per-sample 1 h least squares", bench_naive(path)),
        ]
    print(f"{'what':48s} {'samples/s':>12s}")
    for name, rate in rows:
        print(f"{name:48s} {rate:12,.0f}")
    print(json.dumps({"samples": a.samples}))


if __name__ == "__main__":
    main()
