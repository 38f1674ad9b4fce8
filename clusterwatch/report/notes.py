"""The report's Notes: advice a user can act on, in the spirit of jobstats' notes."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from clusterwatch.humanize import duration
from clusterwatch.rule_names import Rule

from .alerts import alert_notes
from .text import MIB, human_bytes, human_duration, title, trend_word, wrap
from .usage import job_cpu

if TYPE_CHECKING:
    from clusterwatch.v1 import query_pb2


def notes_section(view: query_pb2.JobView, run_time: float) -> list[str]:
    """Advice a user can act on, in the spirit of jobstats' notes."""
    notes = job_notes(view, run_time)
    if not notes:
        return []
    out = [title("Notes")]
    for n in notes:
        out.extend(wrap(f"* {n}", "    "))
    return out


def job_notes(view: query_pb2.JobView, run_time: float) -> list[str]:
    """The notes, one sentence or a few each, in the order the report gives them."""
    notes = []
    gpus = [g for g in view.gpus if g.HasField("utilization")]
    idle = [g for g in view.gpus if g.processes == 0]
    for g in idle:
        notes.append(f"GPU {g.index} on {g.node} is allocated to this job but no process uses it. "
                     "If your code uses fewer GPUs than requested, ask for fewer (--gres=gpu:N).")
    if gpus and run_time > 600:
        avg = sum(g.utilization for g in gpus) / len(gpus)
        if avg < 25:
            notes.append(f"GPU utilisation is low ({avg:.0f}%). Check that the data loader keeps up "
                         "(more workers, pinned memory) or that the job needs a GPU at all.")
    job = view.job
    if job.memory_bytes and run_time > 600:
        peak = sum(p.rss_peak_bytes for p in view.processes)
        if peak < 0.2 * job.memory_bytes:
            notes.append(f"This job used at most {human_bytes(peak)} of the {human_bytes(job.memory_bytes)} "
                         "of host memory it requested; asking for less shortens queue times.")
    if job.time_limit_s and job.end_time and run_time < 0.2 * job.time_limit_s:
        notes.append(f"This job needed {run_time / job.time_limit_s * 100:.0f}% of its time limit "
                     f"({human_duration(job.time_limit_s)}); a shorter --time lowers queue times.")
    cpu_s, efficiency = job_cpu(view, run_time)
    if efficiency is not None and run_time > 600 and efficiency < 0.5:
        notes.append(f"CPU efficiency is {efficiency * 100:.0f}% ({duration(cpu_s)} of CPU time over "
                     f"{duration(run_time)} × {job.cpus} allocated cores). Ask for fewer cores (--cpus-per-task), "
                     "or give the cores work (more DataLoader workers).")
    stalled_alerted = {(a.node, a.pid) for a in view.alerts if a.rule == Rule.TRAINING_STALL and a.state == "firing"}
    for p in view.processes:
        if not job.end_time and p.alive and p.HasField("stalled_since") and (p.node, p.pid) not in stalled_alerted:
            who = f"rank {p.rank}" if p.HasField("rank") else f"pid {p.pid}"
            notes.append(f"The step of {who} on {p.node} has not moved since "
                         f"{time.strftime('%H:%M:%S %Z', time.localtime(p.stalled_since))} (step {p.step}). "
                         f"`py-spy dump --pid {p.pid}` on {p.node} shows where it waits.")
    # ranks only: a job's short-lived helpers (a shell, git) come and go without harm
    gone = [p for p in view.processes if not p.alive and not job.end_time and p.HasField("rank")]
    if gone and any(p.alive and p.HasField("rank") for p in view.processes):
        who = ", ".join(f"rank {p.rank} on {p.node}" for p in gone[:4]) + (" …" if len(gone) > 4 else "")
        notes.append(f"{who} {'has' if len(gone) == 1 else 'have'} exited while the job runs: the other ranks may "
                     "wait for it forever in a collective. Look at its output for the error; cancel the job "
                     "if it cannot go on without it.")
    leak_alerted = any(a.rule == Rule.GPU_MEMORY_LEAK and a.state == "firing" for a in view.alerts)
    for p in view.processes:
        word = trend_word(list(p.gpu_memory_trend))
        if word == "growing" and p.alive and not leak_alerted:  # a firing leak has its own note below
            who = f"rank {p.rank}" if p.HasField("rank") else f"pid {p.pid}"
            notes.append(f"GPU memory of {who} on {p.node} is growing; if it goes on, the gpu_memory_leak alert "
                         "says at what rate and when the GPU will be full.")
    host_alerted = {(a.node, a.pid) for a in view.alerts if a.rule == Rule.HOST_MEMORY_LEAK
                    and (a.state == "firing" or a.ended_while_firing)}
    for p in view.processes:  # host memory that climbs before (or without) an alert
        if (p.alive and (p.node, p.pid) not in host_alerted and trend_word(list(p.rss_trend)) == "growing"
                and p.rss_peak_bytes >= 256 * MIB):
            who = f"rank {p.rank}" if p.HasField("rank") else f"pid {p.pid}"
            notes.append(f"Host memory of {who} on {p.node} is growing ({human_bytes(p.rss_bytes)} now); a leak "
                         "ends with the job killed at its --mem.")
    if job.memory_bytes:
        peak = sum(p.rss_peak_bytes for p in view.processes)
        if peak >= 0.9 * job.memory_bytes:
            notes.append(f"Host memory reached {human_bytes(peak)} of the {human_bytes(job.memory_bytes)} "
                         "allocated: past it, Slurm kills the job (OUT_OF_MEMORY). Ask for more (--mem) or use less.")
    notes.extend(alert_notes(view))
    return notes
