#!/usr/bin/env python3
"""What ClusterState.node_gpu_holders costs a batch as the cluster's job count grows (issue 25, move 3).

    .venv/bin/python bench/bench_gpu_holders.py [--jobs 8,100,1000] [--calls 20000] [--rounds 5]

add_gpus and add_gpu_health call it once per agent batch. Each job runs on a node of its own with 8 GPUs,
allocated by its prolog (ClusterState.job_event, the real path), and a quarter of the jobs have ended but
are still in memory (waiting for the store). Per call, the median of `--rounds`, in the same run:

- walk: the allocations found by walking every job, as before the index (the oracle of
  tests/collector/test_gpu_alloc_index.py);
- index: ClusterState.node_gpu_holders, which reads the node's jobs from the node → allocated jobs index.

Both answers are checked equal before timing.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusterwatch.collector.state.cluster import ClusterState  # noqa: E402

from bench.benchlib import median, spread, table  # noqa: E402
from clusterwatch.model import JobEvent  # noqa: E402
from tests.collector.test_gpu_alloc_index import walked_node_gpu_holders  # noqa: E402

GPUS_PER_NODE = 8


def cluster(jobs: int) -> ClusterState:
    """`jobs` jobs, job i on node n<i> holding its 8 GPUs; every fourth one ended, not yet closed."""
    state = ClusterState()
    for i in range(jobs):
        node, job_id = f"n{i}", str(1000 + i)
        uuids = tuple(f"GPU-{node}-{g}" for g in range(GPUS_PER_NODE))
        state.job_event(node, JobEvent("start", job_id, 1.0, gpu_uuids=uuids))
        if i % 4 == 3:
            state.job_event(node, JobEvent("end", job_id, 2.0, exit_code=0))
    return state


def per_call(fn, state: ClusterState, node: str, calls: int) -> float:
    """CPU seconds of one call, over `calls` calls."""
    start = time.process_time()
    for _ in range(calls):
        fn(state, node)
    return (time.process_time() - start) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default="8,100,1000", help="job counts, comma-separated")
    ap.add_argument("--calls", type=int, default=20000, help="calls timed per round at 8 jobs (fewer above)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for jobs in (int(n) for n in args.jobs.split(",")):
        state = cluster(jobs)
        node = f"n{jobs // 2}"  # a node in the middle of the jobs' order
        assert ClusterState.node_gpu_holders(state, node) == walked_node_gpu_holders(state, node)
        calls = max(200, args.calls * 8 // jobs)
        walk = [per_call(walked_node_gpu_holders, state, node, calls) for _ in range(args.rounds)]
        index = [per_call(ClusterState.node_gpu_holders, state, node, calls) for _ in range(args.rounds)]
        rows.append([f"{jobs:,}", median(walk) * 1e6, median(index) * 1e6,
                     spread([w * 1e6 for w in walk]), spread([i * 1e6 for i in index])])
    print(table("node_gpu_holders per call (µs of CPU), one node's 8 allocated GPUs",
                ["jobs in memory", "walk µs", "index µs", "walk runs", "index runs"], rows,
                [f"median of {args.rounds} rounds; a quarter of the jobs ended, still in memory"]))


if __name__ == "__main__":
    main()
