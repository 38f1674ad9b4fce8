#!/usr/bin/env python3
"""A collector's memory once its history is full: what a node costs, and what --history bounds.

    .venv/bin/python bench/bench_history_memory.py [--nodes 50] [--histories 720,360,10] [--duration 200]

A real collector per --history value, fed by load.py's simulated nodes (64 processes, 8 GPUs, one job a
node), until every process's history is full and past it. An hour of history at the default step (720
points, one every 5 s) would take an hour to fill; the points are the same objects whatever the time
between them, so here the nodes poll every 0.2 s (five polls a batch, a batch a second, as load.py sends)
and the collector keeps a point every poll (--history-step 0.15): 720 points fill in 144 s. The resident
memory (VmRSS) is read every 10 s; once it levels off the history is full, and

    bytes a node at H points = (RSS at H − RSS at 10 points) / nodes, and a process point (its share of the
    GPUs' points and of the allocator's slack included) that over 64 × (H − 10)

which the figures for the default step (--history-step 5, H × 5 s of history) carry over to, since the
step changes when a point is kept, not what it holds. Printed: the RSS curve of each run and that table.

Before them, the two layouts of a process's history side by side, in this process (tracemalloc, 64
processes × the first --history): the deque of named tuples the collector kept until issue 19 (a tuple
and a float or int object a field; built here as ingest built them, fresh objects a point) and the ring
of columns it keeps now (collector/state/point_ring.py), bytes a point each.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
import tracemalloc
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402
from benchlib import PYTHON, Children, CollectorProc, table  # noqa: E402

LOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "load.py")
POLL_S = 0.2
STEP_S = 0.15  # below the poll interval: every poll a point, whatever the floats' rounding


def layouts(points: int, processes: int = 64) -> list[list[str]]:
    """Bytes a point of `processes` histories of `points` each, as a deque of Points and as a ring."""
    from clusterwatch.collector.state.cluster import Point, process_history

    rng = random.Random(7)
    rows = []
    for name, make, row in (("deque of named tuples (until issue 19)", lambda: deque(maxlen=points), Point),
                            ("ring of array columns (collector/state/point_ring.py)", lambda: process_history(points),
                             lambda *v: v)):
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        held = [make() for _ in range(processes)]
        for k in range(points):
            for h in held:
                # values as a poll brings them: a fresh float or int object a field (threads and descriptors
                # below 257 are ints Python shares)
                h.append(row(1.8e9 + k + rng.random(), rng.uniform(0, 800), (3 << 30) + rng.randrange(1 << 20),
                             (20 << 30) + rng.randrange(1 << 20), rng.uniform(0, 100), rng.randrange(20, 120),
                             rng.randrange(50, 300)))
        grown = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        rows.append([name, f"{grown / (processes * points):.0f}", f"{grown / processes / 1024:.1f}",
                     f"{grown / processes * 64 / benchlib.MiB:.2f}"])
        del held
    return rows


def one(nodes: int, history: int, duration: float, clients: int) -> dict:
    with benchlib.tmpdir("cw-histmem-") as tmp, Children() as children:
        c = CollectorProc(children, tmp, "--history", str(history), "--history-step", str(STEP_S),
                          "--web-listen", "none", name=f"hist{history}")
        start_at = time.time() + 3.0 + nodes * 5 / 250
        per = [nodes // clients + (1 if i < nodes % clients else 0) for i in range(clients)]
        procs, first = [], 0
        for i, n in enumerate(per):
            out = open(os.path.join(tmp, f"client{i}.out"), "wb")
            procs.append((children.start([PYTHON, LOAD, "--client", c.address, "--first", str(first), "--count",
                                          str(n), "--duration", str(duration), "--interval", str(POLL_S),
                                          "--polls", "5", "--start-at", repr(start_at)],
                                         stdout=out, stderr=out), out))
            first += n
        time.sleep(max(0.0, start_at - time.time()))
        curve = []
        t0 = time.monotonic()
        c0 = benchlib.proc_cpu_s(c.pid)
        while any(p.poll() is None for p, _ in procs):
            time.sleep(10)
            curve.append((time.monotonic() - t0, benchlib.proc_rss_bytes(c.pid)))
        cores = (benchlib.proc_cpu_s(c.pid) - c0) / (time.monotonic() - t0)
        for p, out in procs:
            out.close()
            if p.returncode != 0:
                raise RuntimeError(f"load client failed (rc {p.returncode}), see {out.name}")
        stored = benchlib.metric_value(c.metrics(), "clusterwatch_ingest_samples_total")
        c.stop()
    # the level once full: the median of the readings after the history has filled (history × poll + 20 s)
    full = sorted(r for t, r in curve if t > history * POLL_S + 20) or [curve[-1][1]]
    return {"history": history, "curve": curve, "rss_full": full[len(full) // 2], "cores": cores, "stored": stored}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--histories", default="720,360,10", help="--history values, comma-separated; the last the base")
    ap.add_argument("--duration", type=float, default=200.0, help="seconds of sending a run (past 720 × 0.2 s)")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="half a minute: 5 nodes, --history 110 and 10")
    args = ap.parse_args()
    if args.quick:
        # 100 points more: 2 MiB of history in all, well over a collector's RSS wobble (tenths of a MiB)
        args.nodes, args.histories, args.duration = 5, "110,10", 25.0
    first = int(args.histories.split(",")[0])
    print(table(f"A process's history, the two layouts: 64 processes × {first} points, in process",
                ["layout", "B a point", "KiB a process", "MiB a node of 64"], layouts(first),
                ["tracemalloc: the Python objects only (no allocator slack), fields as ingest fills them"]),
          flush=True)
    runs = [one(args.nodes, int(h), args.duration, args.clients) for h in args.histories.split(",")]
    for r in runs:
        print(f"--history {r['history']}: RSS MiB every 10 s: "
              + " ".join(f"{rss / benchlib.MiB:.0f}" for _, rss in r["curve"])
              + f"; {r['cores']:.2f} cores; ingest_samples_total {r['stored']:.0f}", flush=True)
    base = runs[-1]
    rows = []
    for r in runs:
        per_node = (r["rss_full"] - base["rss_full"]) / args.nodes
        rows.append([str(r["history"]), f"{r['rss_full'] / benchlib.MiB:.0f}",
                     f"{per_node / benchlib.MiB:.2f}" if r is not base else "(base)",
                     f"{per_node / (64 * (r['history'] - base['history'])):.0f}" if r is not base else "-"])
    print(table(f"Collector memory with the history full: {args.nodes} nodes × 64 processes, 8 GPUs",
                ["--history", "RSS MiB, full", "MiB a node over the base", "B a process point (all in)"], rows,
                [f"a point every poll ({POLL_S} s polls, --history-step {STEP_S}); the base run keeps "
                 f"{base['history']} points; RSS the median of the readings once full"]), flush=True)


if __name__ == "__main__":
    main()
