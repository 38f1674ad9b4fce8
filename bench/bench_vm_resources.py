#!/usr/bin/env python3
"""What a real VictoriaMetrics (Debian's `victoria-metrics`) costs for clusterwatch's series: memory, CPU, disk.

    .venv/bin/python bench/bench_vm_resources.py [--series 20000,100000] [--minutes 3,5] [--interval 15]

One single-node victoria-metrics on loopback with its default flags (caches on, as deployed), fed the way
Prometheus's remote_write feeds it: every `--interval` seconds (the shipped prometheus.yml scrapes every
15 s) one sample of each series, timestamped now, through its import API. The series have clusterwatch's
shape (bench/cardinality.py's families at the default settings, a node's 84.5 series: GPU, node, rank and
job series with their labels) and values that move as a real cluster's do: totals constant, memory and
steps stepping, utilisation and power noisy. Phase by phase the active series grow (`--series`, each phase
`--minutes` long); at the end of each: the process's resident memory and CPU over the phase (its own
/metrics); at the very end, after a flush and a merge, the storage folder's bytes, split into the samples'
part and the index's. Derived and printed:

- memory a million active series: the slope of resident memory between the phases (the first phase's
  level holds the process's fixed part);
- CPU a million samples a second: CPU seconds over the phases / samples ingested;
- disk a series a day: the samples' bytes / samples stored × samples a day at the interval, plus the
  index's bytes a series (VictoriaMetrics indexes each series once a day).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import table  # noqa: E402

from tests.services.procs import free_port, wait_http_ready  # noqa: E402

MiB = 1024 * 1024

# (family, kind) a GPU, a node, a rank: kind c constant, s stepping, n noisy. 8 GPUs and 8 ranks a node:
# 8 × 7 + 14 + 8 × 1.8 ≈ 84.5 series a node, as bench/cardinality.py counts at the default settings.
GPU_FAMILIES = [("clusterwatch_gpu_memory_total_bytes", "c"), ("clusterwatch_gpu_memory_used_bytes", "s"),
                ("clusterwatch_gpu_utilization_ratio", "n"), ("clusterwatch_gpu_power_watts", "n"),
                ("clusterwatch_gpu_temperature_celsius", "s"), ("clusterwatch_gpu_health_ok", "c"),
                ("clusterwatch_gpu_info", "c")]
NODE_FAMILIES = [("clusterwatch_node_up", "c"), ("clusterwatch_node_memory_total_bytes", "c"),
                 ("clusterwatch_node_memory_available_bytes", "s"), ("clusterwatch_node_processes", "s")] + \
    [(f"clusterwatch_node_figure_{i}", "s") for i in range(10)]
RANK_FAMILIES = [("clusterwatch_rank_rss_bytes", "s"), ("clusterwatch_rank_gpu_memory_used_bytes", "s"),
                 ("clusterwatch_rank_cpu_ratio", "n"), ("clusterwatch_rank_step", "s"),
                 ("clusterwatch_rank_steps_per_second", "n")]


def series_of(count: int) -> list[tuple[str, str]]:
    """`count` series names with labels, node by node, and each one's kind."""
    out: list[tuple[str, str]] = []
    n = 0
    while len(out) < count:
        node, job = f"node{n:05d}", str(100000 + n // 8)
        for g in range(8):
            for fam, kind in GPU_FAMILIES:
                out.append((f'{fam}{{node="{node}",gpu="{g}",uuid="GPU-{n:05d}-{g}"}}', kind))
        for fam, kind in NODE_FAMILIES:
            out.append((f'{fam}{{node="{node}"}}', kind))
        for r in range(8):
            for fam, kind in RANK_FAMILIES[:4 if r % 5 else 5]:  # 1.8 a rank on average over the families
                if fam.endswith(("step", "steps_per_second")) and r % 2:
                    continue
                out.append((f'{fam}{{node="{node}",job_id="{job}",rank="{8 * (n % 8) + r}"}}', kind))
        n += 1
    return out[:count]


class Values:
    """Each series' value, moving as its kind does."""

    def __init__(self, kinds: list[str]) -> None:
        self.rng = random.Random(1)
        self.v = [float(self.rng.randrange(1, 80) * 2**30) for _ in kinds]
        self.kinds = kinds

    def next(self) -> list[str]:
        out = []
        for i, k in enumerate(self.kinds):
            if k == "s" and self.rng.random() < 0.2:
                self.v[i] += self.rng.randrange(-4, 5) * 2**20
            elif k == "n":
                out.append(f"{self.rng.random():.4f}")
                continue
            out.append(f"{self.v[i]:.0f}")
        return out


def vm_metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def push(url: str, names: list[tuple[str, str]], values: list[str], ts_ms: int) -> None:
    body = "".join(f"{n} {v} {ts_ms}\n" for (n, _), v in zip(names, values, strict=True)).encode()
    req = urllib.request.Request(f"{url}/api/v1/import/prometheus", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()


def folder_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def phase_args(description: str, interval_help: str, quick_minutes: float) -> tuple[list[tuple[int, float]], float]:
    """The command line of a storage engine's bench (this one's and bench_prometheus_resources'): its phases
    as (active series, minutes), growing, and the seconds between two samples of a series."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--series", default="20000,100000", help="active series a phase, comma-separated, growing")
    ap.add_argument("--minutes", default="3,5", help="each phase's length")
    ap.add_argument("--interval", type=float, default=15.0, help=interval_help)
    ap.add_argument("--quick", action="store_true", help="a few seconds: 500 then 1,000 series, a sample a second")
    args = ap.parse_args()
    if args.quick:
        args.series, args.minutes, args.interval = "500,1000", f"{quick_minutes},{quick_minutes}", 1.0
    phases = list(zip([int(s) for s in args.series.split(",")], [float(m) for m in args.minutes.split(",")],
                      strict=True))
    return phases, args.interval


def main() -> None:
    phases, interval = phase_args(__doc__.splitlines()[0], "seconds between two samples of a series", 0.05)
    binary = shutil.which("victoria-metrics")
    if not binary:
        sys.exit("victoria-metrics is not installed: apt-get install victoria-metrics")
    # the binary's -version prints nothing in Debian's build: the package's version says which it is
    done = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "victoria-metrics"], capture_output=True,
                          text=True)
    version = done.stdout.strip() or "(version unknown)"
    tmp = tempfile.mkdtemp(prefix="cw-vm-")
    data = os.path.join(tmp, "data")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(os.path.join(tmp, "vm.log"), "ab")
    vm = subprocess.Popen([binary, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}"],
                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_http_ready(vm, f"{url}/health", "victoria-metrics", lambda: "", 30)
        names = series_of(max(s for s, _ in phases))
        values = Values([k for _, k in names])
        rows, samples, cpu_total, wall_total = [], 0, 0.0, 0.0
        rss0 = vm_metric(url, "process_resident_memory_bytes")
        for count, minutes in phases:
            cpu0, t0 = vm_metric(url, "process_cpu_seconds_total"), time.monotonic()
            pushes = 0
            until = t0 + minutes * 60
            next_at = t0
            while next_at < until:
                now = time.time()
                push(url, names[:count], values.next()[:count], int(now * 1000))
                pushes += 1
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))
            wall = time.monotonic() - t0
            cpu = vm_metric(url, "process_cpu_seconds_total") - cpu0
            rss = vm_metric(url, "process_resident_memory_bytes")
            samples += pushes * count
            cpu_total, wall_total = cpu_total + cpu, wall_total + wall
            rows.append((count, minutes, pushes, rss, cpu / wall, cpu / (pushes * count)))
            print(f"phase: {count} series, {pushes} pushes in {wall:.0f} s: RSS {rss / MiB:.0f} MiB, "
                  f"{cpu / wall:.3f} cores, {cpu / (pushes * count) * 1e6:.2f} µs CPU a sample", flush=True)
        urllib.request.urlopen(f"{url}/internal/force_flush", timeout=120).read()
        urllib.request.urlopen(f"{url}/internal/force_merge", timeout=600).read()
        time.sleep(10)
        small = folder_bytes(os.path.join(data, "data"))
        index = folder_bytes(os.path.join(data, "indexdb"))
        per_sample = small / samples
        per_day = 86400 / interval
        top = rows[-1][0]
        slope = (rows[-1][3] - rows[0][3]) / (rows[-1][0] - rows[0][0]) if len(rows) > 1 else rows[0][3] / top
        table_rows = [[f"{c:,}", f"{m:g}", str(p), f"{r / MiB:.0f}", f"{cores:.3f}", f"{per * 1e6:.2f}"]
                      for c, m, p, r, cores, per in rows]
        notes = [
            f"victoria-metrics {version}, default flags; a sample of each series every {interval:g} s; "
            f"RSS with no series {rss0 / MiB:.0f} MiB",
            f"memory: {slope:.0f} B an active series (the RSS slope from {rows[0][0]:,} to {top:,} series)",
            f"CPU: {cpu_total / samples * 1e6:.2f} µs a sample over all phases, {cpu_total / wall_total:.3f} cores "
            "on average",
            f"disk after flush and merge: samples {small / MiB:.1f} MiB for {samples:,} samples "
            f"({per_sample:.2f} B a sample), index {index / MiB:.1f} MiB ({index / top:.0f} B a series)",
            f"disk a series a day: {per_sample * per_day:,.0f} B of samples ({per_day:,.0f} samples) + "
            f"{index / top:.0f} B of index",
        ]
        print(table("VictoriaMetrics: memory, CPU and disk for clusterwatch's series",
                    ["active series", "minutes", "pushes", "RSS MiB", "cores", "µs CPU a sample"], table_rows,
                    notes), flush=True)
    finally:
        vm.terminate()
        vm.wait(30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
