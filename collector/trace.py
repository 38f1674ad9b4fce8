"""A job's history as a trace (docs/traces.md), for `clusterwatch record` and `replay`.

One JSON line per process sample, all processes merged in time order, time in
seconds since the first line; the step is the last one the process had reported at
that time.
"""
from __future__ import annotations

import bisect
import json

from .state import ClusterState, JobState


def job_trace_lines(state: ClusterState, job: JobState) -> list[str]:
    """The job's samples held in memory, as trace lines in time order."""
    rows = []
    for series in state.job_processes(job):
        s = series.latest
        gpu = s.gpus[0].gpu_uuid if s.gpus else ""
        gs = state.gpus.get(gpu)
        index = gs.info.index if gs is not None else None
        steps = list(series.step_history)
        step_times = [t for t, _ in steps]
        for p in series.history:
            row = {"t": p.t, "node": s.node, "job_id": job.job_id, "pid": s.pid, "start_time": s.start_time,
                   "gpu": index if index is not None else gpu, "gpu_mem_bytes": p.gpu_memory_bytes,
                   "gpu_util": p.gpu_utilization, "cpu_percent": p.cpu_percent, "rss_bytes": p.rss_bytes,
                   "threads": p.threads, "open_fds": p.open_fds}
            if s.rank is not None:
                row["rank"] = s.rank
            i = bisect.bisect_right(step_times, p.t)
            if i:
                row["step"] = steps[i - 1][1]
            rows.append(row)
    rows.sort(key=lambda r: r["t"])
    if not rows:
        return []
    t0 = rows[0]["t"]
    out = []
    for r in rows:
        r["t"] = round(r["t"] - t0, 3)
        out.append(json.dumps({k: v for k, v in r.items() if v is not None}, separators=(",", ":")))
    return out
