#!/usr/bin/env python3
"""Cardinality: the series a real collector's /metrics holds, per node, per GPU, per process and per job.

    .venv/bin/python bench/cardinality.py [--nodes-per-job 2]

A real `clusterwatch collector` (defaults, fresh store, loopback) is fed by simulated agents
(benchlib.NodeSim: 8 GPUs and 64 processes a node, 8 ranks × 7 DataLoader workers) in two steps: one job
of --nodes-per-job nodes, then a second such job. Every series of /metrics is put in one class by its
labels: rank (rank or pid: a rank's DataLoader workers fold into it, so series follow ranks, not
processes), GPU (gpu, no rank/pid), job × node (job_id and node), job (job_id only),
node (node only) and the collector's own (none of these). The difference between the steps gives the
series a node and a job add; the first step less that gives the fixed part. Then scaled to 10,000 nodes ×
8 GPUs × 64 processes in jobs of 8 nodes, per shard (10 collectors of 1,000 nodes) and in the engine
(every shard, plus Prometheus's 5 series a target).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402
from benchlib import Children, CollectorProc  # noqa: E402

CLASSES = ("rank", "gpu", "job_node", "job", "node", "collector")
PROMETHEUS_PER_TARGET = 5  # up, scrape_duration_seconds, scrape_samples_scraped, _post_metric_relabeling, _series_added


def classify(exposition: str) -> Counter:
    from prometheus_client.parser import text_string_to_metric_families

    counts: Counter = Counter()
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            labels = s.labels
            if "rank" in labels or "pid" in labels:
                counts["rank"] += 1
            elif "gpu" in labels:
                counts["gpu"] += 1
            elif "job_id" in labels and "node" in labels:
                counts["job_node"] += 1
            elif "job_id" in labels:
                counts["job"] += 1
            elif "node" in labels:
                counts["node"] += 1
            else:
                counts["collector"] += 1
    return counts


def measure(nodes_per_job: int) -> dict:
    with benchlib.tmpdir("cw-card-") as tmp, Children() as children:
        collector = CollectorProc(children, tmp, name="card-collector")
        benchlib.feed_job(collector.address, "card-1", nodes=nodes_per_job, batches=3)
        one = classify(collector.metrics())
        benchlib.feed_job(collector.address, "card-2", nodes=nodes_per_job, batches=3)
        two = classify(collector.metrics())
    per_job = {c: two[c] - one[c] for c in CLASSES}  # one more job of nodes_per_job nodes
    per_node = {c: per_job[c] / nodes_per_job for c in ("rank", "gpu", "job_node", "node")}
    return {"one_job": dict(one), "two_jobs": dict(two), "added_by_a_job": per_job, "per_node": per_node,
            "per_gpu": per_node["gpu"] / 8, "per_rank": per_node["rank"] / 8, "per_process": per_node["rank"] / 64,
            "per_job_only": per_job["job"], "fixed": one["collector"]}


def scale(m: dict, nodes: int, shards: int, nodes_per_job: int = 8) -> dict:
    node_series = m["per_node"]["rank"] + m["per_node"]["gpu"] + m["per_node"]["job_node"] + m["per_node"]["node"]
    jobs = nodes / nodes_per_job
    per_shard = round(node_series * nodes / shards + m["per_job_only"] * jobs / shards + m["fixed"])
    return {"nodes": nodes, "shards": shards, "series_per_shard": per_shard,
            "engine_series": per_shard * shards + PROMETHEUS_PER_TARGET * shards}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes-per-job", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    m = measure(args.nodes_per_job)
    m["scaled"] = [scale(m, n, s) for n, s in ((1_000, 1), (10_000, 10), (50_000, 50))]
    if args.json:
        print(json.dumps(m, indent=2))
        return
    print(f"measured: one job of {args.nodes_per_job} nodes {m['one_job']}; a second {m['two_jobs']}")
    print(f"per node {m['per_node']} (per GPU {m['per_gpu']:.1f}, per rank {m['per_rank']:.1f}, "
          f"per process {m['per_process']:.2f}); "
          f"per job (job_id only) {m['per_job_only']}; the collector's own {m['fixed']}")
    for s in m["scaled"]:
        print(f"{s['nodes']:>6} nodes on {s['shards']:>2} shards: {s['series_per_shard']:,} series per shard, "
              f"{s['engine_series']:,} in the engine")


if __name__ == "__main__":
    main()
