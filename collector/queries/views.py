"""Build the query service's answers (clusterwatch.v1 JobView, JobInfo) from the collector's state.

Pure functions of the state and a time: the query servicer calls them, and the same
view, serialised, is the summary stored when a job ends.
"""
from __future__ import annotations

import json

from clusterwatch.v1 import query_pb2

from clusterwatch.wire import gpu_activity_to_proto, gpu_reading_from_proto

from ..state.activity import current_activity
from ..state.cluster import ClusterState, JobState, ProcessSeries, allocator_totals
from ..state.job_cost import gpu_cost_to_proto
from ..state.tmpfs import job_tmpfs, sharing_jobs

DEFAULT_TREND_POINTS = 40


def resample(values: list[float], points: int) -> list[float]:
    """Evenly pick at most `points` values (the last one always kept), for sparklines."""
    if len(values) <= points:
        return values
    step = (len(values) - 1) / (points - 1)
    return [values[round(i * step)] for i in range(points)]


def job_info(job: JobState, state: ClusterState | None = None) -> query_pb2.JobInfo:
    """A job's header; with `state`, a job that Slurm or the prolog gave no GPU count counts the GPUs its
    processes use (as `status` counts them), so that `jobs` and `status` say the same."""
    info = query_pb2.JobInfo(
        job_id=job.job_id, name=job.name, user=job.user, account=job.account, partition=job.partition,
        state=job.state, submit_time=job.submit_time, start_time=job.start_time, end_time=job.end_time,
        time_limit_s=job.time_limit_s, nodes=job.nodes, cpus=job.cpus, memory_bytes=job.memory_bytes,
        gpus=job.gpus, source=job.source, ranks_expected=job.ranks_expected, note=job.note, qos=job.qos,
        cluster=job.cluster,
    )
    if job.exit_code is not None:
        info.exit_code = job.exit_code
    if not info.gpus and state is not None:  # as job_view lists them: its live processes', or all of an ended one's
        info.gpus = len({g.gpu_uuid for series in state.job_processes(job) if series.alive or job.ended
                         for g in series.latest.gpus})
    return info


def counts_as_firing(alert: query_pb2.AlertView) -> bool:
    """Firing, or resolved only because its process or job ended while it fired (status's "ended": it never
    cleared, the job took it along): what a job's alert count counts, live or ended."""
    return alert.state == "firing" or (alert.state == "resolved" and alert.ended_while_firing)


def process_view(series: ProcessSeries, trend_points: int) -> query_pb2.ProcessView:
    s = series.latest
    pv = query_pb2.ProcessView(
        node=s.node, pid=s.pid, start_time=s.start_time, user=s.user, command=s.command,
        mapped_by=s.mapped_by, last_seen=s.time, rss_peak_bytes=series.rss_peak,
        gpu_memory_peak_bytes=series.gpu_memory_peak, gpu_uuids=[g.gpu_uuid for g in s.gpus],
        samples_held=series.samples, alive=series.alive, first_seen=series.first_time,
        cpu_seconds=series.cpu_seconds,
    )
    for name, value in (
        ("rank", s.rank), ("cpu_percent", s.cpu_percent), ("rss_bytes", s.rss_bytes),
        ("gpu_memory_bytes", s.gpu_memory_bytes), ("gpu_utilization", s.gpu_utilization),
        ("threads", s.threads), ("open_fds", s.open_fds), ("step", series.step),
        ("steps_per_s", series.steps_per_s), ("loss", series.loss), ("lr", series.lr),
        ("stalled_since", series.stalled_since),
    ):
        if value is not None:
            setattr(pv, name, value)
    if series.state and series.alive:  # held where it is (D, T, t): a stall's likely cause
        pv.state, pv.wchan, pv.state_since = series.state, s.wchan, series.state_since
    if series.allocator:
        allocated, reserved, retries = allocator_totals(series, s.time)
        for name, value in (("gpu_allocated_bytes", allocated), ("gpu_reserved_bytes", reserved),
                            ("gpu_alloc_retries", retries)):
            if value is not None:
                setattr(pv, name, value)
    hist = series.history
    pv.gpu_memory_trend.extend(resample([float(p.gpu_memory_bytes or 0) for p in hist], trend_points))
    pv.rss_trend.extend(resample([float(p.rss_bytes or 0) for p in hist], trend_points))
    return pv


def listed_process_views(job: JobState, reported: set[tuple[str, int]]) -> list[query_pb2.ProcessView]:
    """Processes only `scontrol listpids` knows (their node has no agent reporting): pid and rank, no figures.

    Args:
        job: the job, with the pids the registry listed per node.
        reported: (node, pid) of live processes an agent reports; those are not repeated.

    Returns:
        One view per listed process, by node, then rank, then pid.
    """
    out = []
    for node in sorted(job.listed_pids):
        listed = job.listed_pids[node]
        for pid in sorted(listed, key=lambda p: (listed[p] if listed[p] is not None else 1 << 30, p)):
            if (node, pid) in reported:
                continue
            pv = query_pb2.ProcessView(node=node, pid=pid, user=job.user, mapped_by="listpids", alive=not job.ended)
            if listed[pid] is not None:
                pv.rank = listed[pid]
            out.append(pv)
    return out


def job_view(state: ClusterState, job: JobState, now: float, trend_points: int = DEFAULT_TREND_POINTS,
             after_intervals: float = 3.0) -> query_pb2.JobView:
    """The whole job: info, its nodes, processes (by rank), GPUs."""
    view = query_pb2.JobView(job=job_info(job), now=now)
    view.tags.update(job.tags)
    if job.provenance:
        records = [dict(r, node=k.node) for k, r in sorted(job.provenance.items(), key=lambda kv: kv[0].pid)]
        view.provenance_json = json.dumps(records, sort_keys=True)
    procs = sorted(
        state.job_processes(job),
        key=lambda p: (p.latest.rank if p.latest.rank is not None else 1 << 30, p.key.node, p.key.pid),
    )
    for series in procs:
        view.processes.append(process_view(series, trend_points))
    view.processes.extend(listed_process_views(job, {(p.key.node, p.key.pid) for p in procs if p.alive}))
    for node in job.nodes:
        ns = state.nodes.get(node)
        nv = view.nodes.add(node=node)
        if ns is not None:
            nv.last_seen = ns.last_seen
            nv.agent_up = state.node_up(ns, now, after_intervals)
            nv.memory_total_bytes = ns.memory_total_bytes
            held = None if job.ended else job_tmpfs(ns, job)  # its user's files in /dev/shm... (state/tmpfs.py)
            if held is not None:
                nv.tmpfs_bytes = held
                nv.tmpfs_truncated = ns.tmpfs_truncated
                if held:
                    nv.tmpfs_shared_with.extend(sharing_jobs(state, node, job))
    # GPUs: those allocated to it (prolog / Slurm), and those its live processes use (an ended job's summary
    # lists those its processes used), with how many of those processes use each
    used: dict[str, int] = {}
    for series in procs:
        if series.alive or job.ended:
            for g in series.latest.gpus:
                used[g.gpu_uuid] = used.get(g.gpu_uuid, 0) + 1
    for uuid in [g.uuid for g in state.job_gpus(job, alive_only=not job.ended)]:
        gs = state.gpus.get(uuid)
        gv = view.gpus.add(uuid=uuid, processes=used.get(uuid, 0))
        if gs is None:
            continue
        gv.node, gv.index, gv.name = gs.node, gs.info.index, gs.info.name
        gv.memory_total_bytes = gs.info.memory_total_bytes
        gv.memory_peak_bytes = gs.memory_peak
        r = gs.latest
        tot = job.gpu_totals.get(uuid)
        if tot is not None:  # the job's own figures of the GPU, not those of whoever held it before or after
            gv.busy_seconds, gv.covered_seconds = tot.busy_seconds, tot.covered_seconds
            gv.memory_peak_bytes = tot.memory_peak
            if job.ended and tot.last is not None:  # frozen at its last reading while the job was on it
                r = gpu_reading_from_proto(tot.last)
        if r is not None:
            for name in ("utilization", "memory_used_bytes", "power_watts"):
                v = getattr(r, name)
                if v is not None:
                    setattr(gv, name, v)
            if r.memory_total_bytes:
                gv.memory_total_bytes = r.memory_total_bytes
        gv.utilization_trend.extend(resample([float(u or 0) for _, u, _ in gs.history], trend_points))
        activity = current_activity(gs) if not job.ended else None  # an ended job's GPU may be another's now
        if activity is not None:
            gpu_activity_to_proto(activity, gv.activity)
    listed = {g.uuid for g in view.gpus}
    for uuid in job.gpu_cost:
        if uuid not in listed:  # one it held earlier: still part of what the job cost
            gs = state.gpus.get(uuid)
            gv = view.gpus.add(uuid=uuid)
            if gs is not None:
                gv.node, gv.index, gv.name, gv.memory_total_bytes = (gs.node, gs.info.index, gs.info.name,
                                                                     gs.info.memory_total_bytes)
    for gv in view.gpus:
        cost = job.gpu_cost.get(gv.uuid)
        if cost is not None:
            gpu_cost_to_proto(cost, gv.cost)
    return view
