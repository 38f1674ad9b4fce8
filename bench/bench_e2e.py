#!/usr/bin/env python3
"""The small end-to-end benchmark of issue 2: agent CPU per poll, collector CPU per 1,000 samples, `status` time.

    .venv/bin/python bench/bench_e2e.py [--quick]

One table, from the other scripts' measurements (each with its baseline from the same run):

- agent CPU per poll for 64 watched processes on 8 simulated GPUs (bench_agent: the real Agent
  in process, and a real `clusterwatch agent` process), beside the seed-style monitor;
- collector CPU per 1,000 ingested samples (bench_ingest: a real collector over gRPC, server
  CPU from /proc), beside the ack-only gRPC server and CollectorCore.batch alone;
- `clusterwatch status JOBID` wall time for a job of 8 nodes × 8 ranks (bench_cli), beside
  `python -c "import grpc"`.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_agent  # noqa: E402
import bench_cli  # noqa: E402
import bench_ingest  # noqa: E402
from benchlib import table  # noqa: E402


def run(quick: bool = False, show: bool = True) -> dict:
    if quick:
        agent = bench_agent.run(quick=True, show=False)
        ingest = bench_ingest.run(quick=True, show=False)
        cli = bench_cli.run(quick=True, show=False)
    else:
        agent = bench_agent.run(rounds=3, polls=15, seconds=8.0, show=False)
        ingest = bench_ingest.run(rounds=3, streams=8, batches=150, show=False)
        cli = bench_cli.run(repeat=7, show=False)
    rows = [
        ["agent CPU per poll, 64 procs, 8 sim GPUs (Agent.poll + serialise)", f"{agent['agent_ms']:.2f} ms",
         f"seed-style (psutil + sh stand-in): {agent['seed_sh_ms']:.2f} ms ({agent['ratio']:.1f}×)"],
        ["agent CPU per poll, real `clusterwatch agent` process", f"{agent['real_agent_ms']:.2f} ms",
         f"RSS {agent['rss_mib']:.1f} MiB"],
        ["collector CPU per 1,000 ingested samples (gRPC + CollectorCore)", f"{1e6 / ingest['real']:.1f} ms",
         f"ack-only gRPC server: {1e6 / ingest['trivial']:.1f} ms"],
        ["CollectorCore.batch alone per 1,000 samples", f"{1e6 / ingest['inproc']:.1f} ms", ingest["rules"]],
        ["`clusterwatch status JOBID` wall, 8 nodes × 8 ranks", f"{cli['status_ms']:.0f} ms",
         "python -c 'import grpc' in the CLI table"],
    ]
    out = table("End to end (issue 2): the small benchmark", ["figure", "value", "beside"], rows)
    if show:
        print(out, flush=True)
        for part in (agent, ingest, cli):
            print(part["table"], flush=True)
    return {"table": out, "agent": agent, "ingest": ingest, "cli": cli}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds: each part in its quick mode")
    args = ap.parse_args()
    run(args.quick)


if __name__ == "__main__":
    main()
