"""The JSON summary of an ended job (--summary-dir): what ran, on what, how it went.

Written once when the job closes, for checkpoints, model cards and experiment logs:
provenance, hardware, command, per-rank peaks, GPU averages and the alerts raised.
"""
from __future__ import annotations

import json
import os

from clusterwatch.v1 import query_pb2

from clusterwatch.json_view import message_to_json

from .job_cost import ACTIVITY_LEVELS

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
            "processes": g.processes, "cost": _gpu_cost(g.cost) if g.HasField("cost") else None,
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
        # what the job's GPUs cost while it held them; each GPU's in hardware.gpus[].cost
        "gpu_cost": _cost_totals([g.cost for g in view.gpus if g.HasField("cost")]),
        "ranks": ranks,
        "provenance": provenance,
        "tags": dict(view.tags),
        "alerts": [message_to_json(a) for a in view.alerts],
    }


def _levels(seconds) -> dict[str, float]:
    """Seconds by activity level ({} when none were counted: a GPU never read with that basis)."""
    return {name: round(s, 1) for name, s in zip(ACTIVITY_LEVELS, seconds, strict=True)} if seconds else {}


def _gpu_cost(c: query_pb2.GpuCost) -> dict:
    """One GPU's cost to the job (collector/state/job_cost.py says how each figure is taken)."""
    return {
        "energy_joules": round(c.energy_joules, 3) if c.HasField("energy_joules") else None,
        "shared": c.shared, "energy_resets": c.energy_resets,
        "throttle_seconds": {k: round(v, 3) for k, v in sorted(c.throttle_seconds.items())},
        "activity_seconds": {"sm_active": _levels(c.sm_active_seconds),
                             "utilization": _levels(c.utilization_seconds)},
    }


def _cost_totals(costs: list[query_pb2.GpuCost]) -> dict:
    """The job's GPU cost over its GPUs: energy (None where no GPU had a counter), throttle time by reason, and
    GPU-hours at each activity level, by SM activity (GPM) where read, else by utilisation."""
    energy = [c.energy_joules for c in costs if c.HasField("energy_joules")]
    throttle: dict[str, float] = {}
    for c in costs:
        for reason, s in c.throttle_seconds.items():
            throttle[reason] = throttle.get(reason, 0.0) + s

    def hours(field: str) -> dict[str, float]:
        return {name: round(sum(getattr(c, field)[i] for c in costs if getattr(c, field)) / 3600, 4)
                for i, name in enumerate(ACTIVITY_LEVELS)}

    return {
        "energy_joules": round(sum(energy), 3) if energy else None,
        "energy_shared": any(c.shared for c in costs),
        "energy_resets": sum(c.energy_resets for c in costs),
        "throttle_seconds": {k: round(v, 3) for k, v in sorted(throttle.items())},
        "gpu_hours_by_activity": {"sm_active": hours("sm_active_seconds"), "utilization": hours("utilization_seconds")},
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
