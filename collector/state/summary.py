"""The JSON summary of an ended job (--summary-dir): what ran, on what, how it went.

Written once when the job closes, for checkpoints, model cards and experiment logs:
provenance, hardware, command, per-rank peaks, GPU averages and the alerts raised.
"""
from __future__ import annotations

import json
import os

from clusterwatch.v1 import query_pb2

from clusterwatch.json_view import message_to_json

# 2: the job and its alerts as the --json documents have them (docs/json.md: numbers as numbers, null for
# unknown); 1 had protobuf's mapping (64-bit integers as strings, 0 for unset times)
SUMMARY_VERSION = 2


def summary_of(view: query_pb2.JobView) -> dict:
    """A compact, stable summary of a job's final view."""
    job = view.job
    provenance = json.loads(view.provenance_json) if view.provenance_json else []
    ranks = []
    for p in view.processes:
        ranks.append({
            "node": p.node, "pid": p.pid, "rank": p.rank if p.HasField("rank") else None, "command": p.command,
            "gpu_memory_peak_bytes": p.gpu_memory_peak_bytes, "rss_peak_bytes": p.rss_peak_bytes,
            "last_step": p.step if p.HasField("step") else None, "samples": p.samples_held,
            "steps_per_s": round(p.steps_per_s, 3) if p.HasField("steps_per_s") else None,
            "cpu_seconds": round(p.cpu_seconds, 1),
            "stalled_since": p.stalled_since if p.HasField("stalled_since") else None,
        })
    gpus = []
    for g in view.gpus:
        trend = list(g.utilization_trend)
        # over the whole job where it was accumulated (while its processes were on the GPU), else the trend
        mean = (g.busy_seconds / g.covered_seconds * 100 if g.covered_seconds
                else sum(trend) / len(trend) if trend else None)
        gpus.append({
            "node": g.node, "uuid": g.uuid, "index": g.index, "name": g.name,
            "memory_total_bytes": g.memory_total_bytes, "memory_peak_bytes": g.memory_peak_bytes,
            "utilization_mean_percent": round(mean, 1) if mean is not None else None,
            "busy_seconds": round(g.busy_seconds, 1), "covered_seconds": round(g.covered_seconds, 1),
            "processes": g.processes,
        })
    run_time = (job.end_time or view.now) - job.start_time if job.start_time else 0.0
    cpu_s = sum(p.cpu_seconds for p in view.processes)
    command = provenance[0].get("cmdline") if provenance else None
    return {
        "version": SUMMARY_VERSION,
        "job": message_to_json(job),
        "command": command,
        "hardware": {"nodes": list(job.nodes), "gpus": gpus},
        # whole-job figures, as jobstats gives them: CPU efficiency = CPU time / (run time × allocated cores)
        "totals": {
            "run_time_s": round(run_time, 1), "cpu_seconds": round(cpu_s, 1),
            "cpu_efficiency": round(cpu_s / (run_time * job.cpus), 4) if job.cpus and run_time > 0 else None,
            "rss_peak_bytes": sum(p.rss_peak_bytes for p in view.processes),
        },
        "ranks": ranks,
        "provenance": provenance,
        "tags": dict(view.tags),
        "alerts": [message_to_json(a) for a in view.alerts],
    }


def write_summary(directory: str, view: query_pb2.JobView) -> str:
    """Write `<directory>/clusterwatch-<job id>.json`; never follows a symlink planted there.

    Mode 0600, an older file rewritten too: a summary holds the job's owner, command line and provenance,
    which other users of the host must not read.
    """
    safe_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in view.job.job_id)
    path = os.path.join(directory, f"clusterwatch-{safe_id}.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    with os.fdopen(fd, "w") as f:
        json.dump(summary_of(view), f, indent=2, sort_keys=True)
    return path
