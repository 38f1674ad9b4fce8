"""What one scrape exports, copied out of the collector's state under the core's lock into named rows.

`take_snapshot()` is the only part of the exporter that reads the state; what it returns holds no state
objects, so the text is written after the lock is let go.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..state.activity import current_activity
from ..state.cluster import ClusterState
from .families import JOB_INFO, tag_labels


class JobCode(NamedTuple):
    """The code a job runs (clusterwatch_job_code's labels after job_id)."""

    commit: str
    branch: str
    dirty: str  # "true", "false" or "unknown"
    remote: str
    versions: str  # how many versions its ranks run


class JobRow(NamedTuple):
    """A running job in a snapshot."""

    job_id: str
    user: str
    name: str
    partition: str
    state: str
    tags: tuple[tuple[str, str], ...]  # tag label (name, value) pairs
    code: JobCode | None  # None without provenance
    processes: int  # live
    gpu_memory_bytes: int
    rss_bytes: int
    cost: JobCostRow | None = None  # None: nothing held yet


class JobCostRow(NamedTuple):
    """A running job's GPU cost so far, summed over its GPUs (collector/state/job_cost.py)."""

    energy_joules: float | None  # None: no GPU of it has an energy counter
    throttle_seconds: tuple[tuple[str, float], ...]  # (reason, seconds), by reason
    sm_active_seconds: tuple[float, ...]  # by ACTIVITY_LEVELS
    utilization_seconds: tuple[float, ...]


# Rank and process rows are NamedTuples, not dataclasses: the writer's hottest loop (text.py _write_ranks)
# unpacks them in one step, where a dataclass's eleven fields would be read one by one, slower.
class RankRow(NamedTuple):
    """A rank in a snapshot: its labels, then one value or None per RANK_FAMILIES entry, in that order."""

    labels: tuple[str, str, str]  # job_id, node, rank (the rank's number, or "pid<pid>" when it has none)
    gpu_memory_used_bytes: int | None
    rss_bytes: int | None
    cpu_ratio: float | None
    gpu_utilization_ratio: float | None
    threads: int | None
    open_fds: int | None
    step: int | None
    steps_per_second: float | None
    loss: float | None
    learning_rate: float | None


class ProcessRow(NamedTuple):
    """A process in a snapshot: its labels, then one value or None per PROCESS_FAMILIES entry, in that order."""

    labels: tuple[str, str, str, str]  # job_id, node, pid, command
    gpu_memory_used_bytes: int | None
    rss_bytes: int | None
    cpu_ratio: float | None


class GpuRow(NamedTuple):
    """A GPU in a snapshot (None: not reported)."""

    node: str
    uuid: str
    index: str
    job_id: str  # the job it is allocated to or used by, "" for none
    utilization_ratio: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None
    activity: Any = None  # its current GpuActivity (GPM, state/activity.py); None without


class NodeRow(NamedTuple):
    """A node in a snapshot."""

    node: str
    up: float  # 1.0 or 0.0
    memory_total_bytes: int
    last_seen: float
    samples_dropped: int
    read_errors: int
    job_output: tuple[int, int, int] | None  # files followed, refused, errors; None where the agent does not read


class AlertRow(NamedTuple):
    """An active alert: clusterwatch_alert's label values, in ALERT_FAMILY's order."""

    rule: str
    severity: str
    state: str
    job_id: str
    node: str
    rank: str


class CounterRow(NamedTuple):
    """An ingest counter, exported as a counter family of its own."""

    name: str
    help: str
    value: float


class Snapshot(NamedTuple):
    """What one scrape exports, copied out of the state (no state objects).

    processes: None when per-process series are not exported; alerts and counters: None when not exported.
    """

    jobs: list[JobRow]
    ranks: list[RankRow]
    processes: list[ProcessRow] | None
    gpus: list[GpuRow]
    nodes: list[NodeRow]
    alerts: list[AlertRow] | None
    counters: list[CounterRow] | None
    extra: Any = None   # the `extra` families' own snapshot (the GPU health ones), None without them


def code_labels(records) -> JobCode:
    """commit, branch, dirty, remote and the number of versions over a job's provenance records."""
    counts: dict[str, list[dict]] = {}
    for r in records:
        counts.setdefault(r.get("code_id", "unknown"), []).append(r)
    known = {k: v for k, v in counts.items() if k != "unknown"} or counts
    main = max(known.values(), key=len)[0].get("git") or {}
    dirty = main.get("dirty")
    return JobCode(str(main.get("commit", "unknown")), str(main.get("branch", "unknown")),
                   "unknown" if dirty in (None, "unknown") else str(bool(dirty)).lower(),
                   str(main.get("remote_url", "") or ""), str(len(known)))


def take_snapshot(state: ClusterState, now: float, per_process: bool, after_intervals: float,
                  owns_node: Callable[[str], bool] | None) -> Snapshot:
    """The state's rows of a snapshot (alerts, counters and extra left None); the caller holds the core's lock.

    Args:
        state: the collector's state.
        now: the current time (Unix seconds), for whether a node is up.
        per_process: also copy per-process rows.
        after_intervals: a node is down after this many of its poll intervals without a batch.
        owns_node: whether a node's own series (its GPUs and node rows) are this collector's; None: all are.
    """
    st = state
    procs_by_key = st.processes
    pids = st.pids
    jobs, ranks = [], []
    processes = [] if per_process else None
    for job in st.jobs.values():
        if job.ended:
            continue
        job_id = job.job_id
        n = gsum = rsum = 0
        for key in job.processes:
            series = procs_by_key.get(key)
            if series is None or not series.alive:
                continue
            n += 1
            s = series.latest
            gpus = s.gpus
            gmem = s.gpu_memory_bytes if gpus else None
            rss = s.rss_bytes
            if gmem:
                gsum += gmem
            if rss:
                rsum += rss
            # Ranks are the unit users reason in; a rank's children (DataLoader workers)
            # share its rank label, so only the rank's own process (or an unranked
            # process) gets a rank series (and a process series), and children add to the
            # job totals.
            rank = s.rank
            if s.mapped_by == "tree" and rank is not None:
                parent = pids.get(s.node, {}).get(s.ppid)
                if parent is not None and parent.alive and parent.latest.rank == rank:
                    continue
            cpu = s.cpu_percent
            if per_process:
                processes.append(ProcessRow((job_id, s.node, str(s.pid), s.command), gmem, rss,
                                            cpu / 100.0 if cpu is not None else None))
            gutil = s.gpu_utilization if gpus else None
            ranks.append(RankRow(
                (job_id, s.node, str(rank) if rank is not None else f"pid{s.pid}"),
                gmem, rss, cpu / 100.0 if cpu is not None else None,
                gutil / 100.0 if gutil is not None else None, s.threads, s.open_fds,
                series.step, series.steps_per_s, series.loss, series.lr,
            ))
        code = code_labels(job.provenance.values()) if job.provenance else None
        tags = tuple(tag_labels(job.tags, JOB_INFO.labels).items())
        jobs.append(JobRow(job_id, job.user, job.name, job.partition, job.state, tags, code, n, gsum, rsum,
                           job_cost_row(job.gpu_cost.values()) if job.gpu_cost else None))
    holders = st.gpu_holders()
    gpus = []
    owns = owns_node
    for uuid, gs in st.gpus.items():
        if owns is not None and not owns(gs.node):
            continue
        r = gs.latest
        job_id = holders.get(uuid, "")
        if r is None:
            gpus.append(GpuRow(gs.node, uuid, str(gs.info.index), job_id, None, None, gs.info.memory_total_bytes,
                               None))
            continue
        util = r.utilization
        gpus.append(GpuRow(gs.node, uuid, str(gs.info.index), job_id, util / 100.0 if util is not None else None,
                           r.memory_used_bytes, r.memory_total_bytes or gs.info.memory_total_bytes, r.power_watts,
                           current_activity(gs)))
    node_up = st.node_up
    nodes = [NodeRow(ns.node, 1.0 if node_up(ns, now, after_intervals) else 0.0, ns.memory_total_bytes,
                     ns.last_seen, ns.samples_dropped, ns.read_errors, ns.job_output)
             for ns in st.nodes.values() if owns is None or owns(ns.node)]
    return Snapshot(jobs, ranks, processes, gpus, nodes, None, None)


def job_cost_row(costs) -> JobCostRow:
    """The job's GpuCosts summed into one row."""
    costs = list(costs)
    energy = [c.energy_mj for c in costs if c.has_energy]
    throttle: dict[str, float] = {}
    for c in costs:
        for reason, v in c.throttle_s.items():
            throttle[reason] = throttle.get(reason, 0.0) + v
    return JobCostRow(sum(energy) / 1000.0 if energy else None, tuple(sorted(throttle.items())),
                      tuple(map(sum, zip(*(c.sm_active_s for c in costs), strict=True))),
                      tuple(map(sum, zip(*(c.utilization_s for c in costs), strict=True))))
