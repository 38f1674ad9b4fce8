"""`clusterwatch jobs`: one line a job."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .text import fit, human_duration, printable, printable_message

if TYPE_CHECKING:
    from clusterwatch.v1 import query_pb2


def render_jobs(jobs: list[query_pb2.JobInfo], firing: dict[str, int], now: float) -> str:
    if not jobs:
        return "no jobs known to the collector\n"
    jobs = [printable_message(j) for j in jobs]
    firing = {printable(k): v for k, v in firing.items()}
    out = [f"{'JOB':<14} {'USER':<10} {'STATE':<10} {'NODES':>5} {'GPUS':>4} {'RUN TIME':>11} {'ALERTS':>6}  NAME"]
    for j in jobs:
        run = ((j.end_time or now) - j.start_time) if j.start_time else 0
        alerts = str(firing.get(j.job_id, 0))
        out.append(f"{fit(j.job_id, 14):<14} {fit(j.user, 10):<10} {fit(j.state, 10):<10} {len(j.nodes):>5} "
                   f"{j.gpus:>4} {human_duration(run):>11} {alerts:>6}  {j.name}")
    return "\n".join(out) + "\n"
