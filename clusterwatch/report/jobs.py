"""`clusterwatch jobs`: one line a job."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .text import fit, human_duration, printable, printable_message

if TYPE_CHECKING:
    from clusterwatch.v1 import query_pb2


def render_jobs(jobs: list[query_pb2.JobInfo], firing: dict[str, int], now: float, include_ended: bool = False) -> str:
    """One line a job; ALERTS counts those firing, and those it ended with (as its web page's badge)."""
    from clusterwatch.json_view import job_gpus

    if not jobs:
        if include_ended:
            return "no jobs known to the collector\n"
        return "no running jobs known to the collector; `clusterwatch jobs --all` lists those that ended too\n"
    jobs = [printable_message(j) for j in jobs]
    firing = {printable(k): v for k, v in firing.items()}
    out = [f"{'JOB':<14} {'USER':<10} {'STATE':<10} {'NODES':>5} {'GPUS':>4} {'RUN TIME':>11} {'ALERTS':>6}  NAME"]
    for j in jobs:
        run = ((j.end_time or now) - j.start_time) if j.start_time else 0
        alerts = str(firing.get(j.job_id, 0))
        gpus = job_gpus(j)
        out.append(f"{fit(j.job_id, 14):<14} {fit(j.user or '?', 10):<10} {fit(j.state, 10):<10} {len(j.nodes):>5} "
                   f"{'-' if gpus is None else gpus:>4} {human_duration(run):>11} {alerts:>6}  {j.name}")
    return "\n".join(out) + "\n"
