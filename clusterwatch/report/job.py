"""`clusterwatch status JOBID`: a JobView in, the report out. Pure: no I/O, no clock but `now`.

The layout follows what users read first: who and what (header), how the whole job is doing
(meters), then each rank and GPU with its trend, then alerts, health, requests, code and advice.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .alerts import alerts_section
from .code import code_section
from .cost import cost_section
from .health import health_section
from .notes import notes_section
from .requests import requests_section
from .text import (
    RULE,
    draw_rules,
    exit_text,
    fit_lines,
    human_bytes,
    human_duration,
    printable_message,
    report_width,
    wrap_words,
)
from .usage import gpus_section, nodes_section, overall_section, ranks_section

if TYPE_CHECKING:
    from clusterwatch.v1 import query_pb2


def unknown_user(view: query_pb2.JobView) -> str:
    """Why a job has no owner yet: the collector takes Slurm's word, or the user its processes run as (read by
    an authenticated agent, all of them the same)."""
    users = sorted({p.user for p in view.processes if p.user})
    if len(users) > 1:
        return f"? (its processes run as {', '.join(users[:3])}: no one owner)"
    if users:
        return f"? (its processes run as {users[0]}, as an agent that did not prove itself says)"
    if view.job.end_time:
        return "? (no process of it was sampled: its owner is the user its processes run as)"
    return "? (none of its processes sampled yet: its owner is the user they run as)"


def render(view: query_pb2.JobView, now: float | None = None, width: int | None = -1) -> str:
    """The full report for one job.

    `width`: the columns to fit (tables drop their least needed columns, alerts wrap); the default
    is report_width(); None: no limit. Rules span the widest line, within that width.
    """
    if width == -1:
        width = report_width()
    view = printable_message(view)
    now = now or view.now or time.time()
    job = view.job
    lines: list[str] = []
    ended = job.end_time > 0
    run_time = (job.end_time if ended else now) - job.start_time if job.start_time else 0
    name = f'  "{job.name}"' if job.name else ""
    lines.append(f"{RULE}═")
    lines.append(f" clusterwatch · job {job.job_id}{name}")
    lines.append(f"{RULE}═")
    state = job.state + (f" ({exit_text(job.exit_code)})" if job.HasField("exit_code") else "")
    ranks_seen = len({p.rank for p in view.processes if p.HasField("rank")})
    rows = [
        ("User/Account", f"{job.user or unknown_user(view)}{'/' + job.account if job.account else ''}"),
        ("State", state),
        ("Nodes", f"{len(job.nodes)}  ({', '.join(job.nodes[:6])}{' …' if len(job.nodes) > 6 else ''})"),
        ("GPUs", str(job.gpus or len(view.gpus))),
    ]
    if job.partition:
        rows.append(("Partition", job.partition))
    if job.qos:
        rows.append(("QOS", job.qos))
    if job.cluster:
        rows.append(("Cluster", job.cluster))
    if job.cpus:
        rows.append(("CPU cores", str(job.cpus)))
    if job.memory_bytes:
        rows.append(("CPU memory", human_bytes(job.memory_bytes)))
    if job.start_time:
        rows.append(("Start time", time.strftime("%a %b %d %Y %H:%M:%S %Z", time.localtime(job.start_time))))
    rows.append(("Run time", human_duration(run_time)
                 + (f" of {human_duration(job.time_limit_s)} limit" if job.time_limit_s else "")))
    expected = job.ranks_expected
    if expected or ranks_seen:
        rows.append(("Ranks", f"{ranks_seen} seen" + (f" of {expected} expected" if expected else "")))
    rows.append(("Known from", job.source))
    if job.note:
        rows.append(("Note", job.note))
    if view.tags:
        rows.append(("Tags", ", ".join(f"{k}={v}" for k, v in sorted(view.tags.items()))))
    for k, v in rows:  # a long value wraps under itself
        lines.extend(wrap_words(v, f"  {k:>13}: ", " " * 17, width or 17 + len(v)))

    lines.extend(overall_section(view, width, run_time))
    lines.extend(nodes_section(view, width))
    lines.extend(ranks_section(view, now, width))
    lines.extend(gpus_section(view, width))
    lines.extend(cost_section(view))
    lines.extend(alerts_section(view, width))
    lines.extend(health_section(view, width))
    lines.extend(requests_section(view, now))
    lines.extend(code_section(view))
    lines.extend(notes_section(view, run_time))
    return fit_lines(draw_rules("\n".join(lines) + "\n", width), width)
