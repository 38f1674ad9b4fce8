"""The collector's state as the rule engine's typed observations.

One place derives what the rules read beyond a raw sample: the process's GPU and that GPU's
size, the figures of a process on several GPUs, the host memory's ceiling (the node's, or
where Slurm gives the job memory, the room its allocation leaves the process), the
allocator's figures, a GPU's job and its users, a node's jobs. The live rules take these
observations (collector/alerting/live.py); `record` writes a job's down, a process line an
observation (`observation_record`, collector/traces/record.py), and `replay` reads them back.
"""
from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from ..rules.model import GpuObservation, NodeHeartbeat, ProcessObservation

if TYPE_CHECKING:  # `replay` reads records with this module and has no state: its start stays as quick
    from clusterwatch.model import ProcessSample

    from .cluster import ClusterState, NodeState, ProcessSeries


def gpu_memory_total(state: ClusterState, uuid: str) -> int | None:
    """The GPU's size as the rules take it: its latest reading's, else its inventory's; None where unknown."""
    gs = state.gpus.get(uuid)
    if gs is None:
        return None
    return (gs.latest.memory_total_bytes if gs.latest and gs.latest.memory_total_bytes
            else gs.info.memory_total_bytes) or None


def gpu_figures(s: ProcessSample) -> tuple[int | None, float | None]:
    """(GPU memory, SM utilisation) of a process as the rules read them: its one GPU's, or over its GPUs."""
    if len(s.gpus) == 1:  # the usual case, without the properties' lists
        return s.gpus[0].used_memory_bytes, s.gpus[0].sm_utilization
    return s.gpu_memory_bytes, s.gpu_utilization


def allocation_room(share: float, held: float) -> float:
    """The room a job's allocation leaves on a node: its share of the job's memory (`share`) less what the
    job's processes there hold (`held`), never below 0. A process's host memory ceiling is its own RSS plus
    this room: a leak ends with the job killed at its --mem, long before the node's RAM is full."""
    return max(0, share - held)


#: The labels rule overrides match: a trace writes them where a process first appears, not on every line.
LABELS = ("user", "command", "job_name", "partition")


def observation_record(obs: ProcessObservation, labels: bool = True) -> dict[str, Any]:
    """The observation as a trace's process line (docs/traces.md): its fields by name, those unknown (None)
    or empty left out; its labels only with `labels`."""
    skip = () if labels else LABELS
    return {k: v for k, v in zip(ProcessObservation._fields, obs, strict=True)
            if v is not None and v != "" and k not in skip}


_DEFAULTS = {f: ProcessObservation._field_defaults.get(f) for f in ProcessObservation._fields}  # t, node: None
_in_order = itemgetter(*ProcessObservation._fields)
_GPU = ProcessObservation._fields.index("gpu")
_new = tuple.__new__  # what ProcessObservation._make calls, without its length check (the fields are all there)


def process_from_record(d: Mapping[str, Any]) -> ProcessObservation:
    """A trace's process line read back (`observation_record`'s inverse): the fields it leaves out take their
    defaults. KeyError without `t`, `node` or `pid`; a GPU that is not text (an index) becomes its text."""
    d["t"], d["node"], d["pid"]  # noqa: B018 - what a process line cannot be without
    values = _in_order({**_DEFAULTS, **d})  # C-level passes (0.85 us a line): replay reads a million and more
    gpu = values[_GPU]
    if gpu.__class__ is not str:
        values = list(values)
        values[_GPU] = "" if gpu is None else str(gpu)
    return _new(ProcessObservation, values)


def labels_record(user: str, command: str, job_name: str, partition: str) -> dict[str, str]:
    """The labels of a process's first trace line, those known."""
    return {k: v for k, v in zip(LABELS, (user, command, job_name, partition), strict=True) if v}


class NodeObservations(NamedTuple):
    """What a node's batch shows the rules, in the order the collector feeds them (the processes found gone
    go between the processes and the GPUs: collector/alerting/live.py).

    Attributes:
        processes: The batch's processes due for a look (see `node_observations`).
        gpus: The node's GPUs.
        heartbeat: The node's agent reported.
    """

    processes: list[ProcessObservation]
    gpus: list[GpuObservation]
    heartbeat: NodeHeartbeat


def node_observations(state: ClusterState, node: str, touched: list[ProcessSeries], owners: dict[str, str],
                      t: float, min_interval_s: float) -> NodeObservations:
    """The observations of a node's batch.

    Args:
        state: The collector's state (read under its lock by the caller).
        node: The node whose batch this is.
        touched: The processes the batch brought samples of.
        owners: GPU UUID → the running job it is allocated to (ClusterState.gpu_allocations: the GPU observation
            names the job that allocation gives it, not one whose processes merely use it).
        t: The batch's time.
        min_interval_s: A process is observed at most this often: each process the batch touched and the
            rules have not looked at for that long, as of its latest sample (it is marked looked at).

    Returns:
        The processes due, in the order of `touched`; every GPU of the node, with its job and how many of the
        batch's live processes use it; the node's heartbeat, with the jobs of the batch's processes.
    """
    ns = state.nodes.get(node)
    job_ids: set[str] = set()
    # what each job's live processes on this node hold (their allocation's room is shared), and each GPU's users
    job_rss: dict[str, int] = {}
    users: dict[str, int] = {}
    oldest: dict[str, ProcessSeries] = {}  # each job's oldest live process here: it carries the job's tmpfs bytes
    for series in touched:
        s = series.latest
        if s.job_id:
            job_ids.add(s.job_id)
        if series.alive:
            if s.job_id:
                if s.rss_bytes:
                    job_rss[s.job_id] = job_rss.get(s.job_id, 0) + s.rss_bytes
                o = oldest.get(s.job_id)
                if o is None or (s.start_time, s.pid) < (o.latest.start_time, o.latest.pid):
                    oldest[s.job_id] = series
            for g in s.gpus:
                users[g.gpu_uuid] = users.get(g.gpu_uuid, 0) + 1
    carriers: dict[int, int] = {}  # id(series) → its job's tmpfs bytes on this node (collector/state/tmpfs.py)
    if ns is not None and ns.tmpfs_at:
        from .tmpfs import job_tmpfs

        for job_id, series in oldest.items():
            held = job_tmpfs(ns, state.jobs.get(job_id))
            if held is not None:
                carriers[id(series)] = held
                job_rss[job_id] = job_rss.get(job_id, 0) + held  # the allocation's room: tmpfs is charged to it
    processes = _processes(state, ns, node, touched, job_rss, min_interval_s, carriers)
    gpus = []
    if ns is not None:
        from .activity import current_activity  # here, not at the top: replay imports this module without state

        for uuid in ns.gpus:
            gs = state.gpus.get(uuid)
            reading = gs.latest if gs is not None else None
            act = current_activity(gs) if gs is not None else None  # GPM: None on a GPU without it
            # positional, in GpuObservation's order: t, node, gpu, job_id, utilization, processes, index, power,
            # SM activity, tensor activity
            gpus.append(GpuObservation(t, node, uuid, owners.get(uuid, ""), reading.utilization if reading else None,
                                       users.get(uuid, 0), gs.info.index if gs is not None else None,
                                       reading.power_watts if reading else None,
                                       act.sm_active if act is not None else None,
                                       act.tensor_active if act is not None else None))
    heartbeat = NodeHeartbeat(t, node, bool(job_ids), ns.send_interval_s if ns is not None else 0.0,
                              tuple(sorted(job_ids)))
    return NodeObservations(processes, gpus, heartbeat)


#: How far back a batch's looks between reach: an agent's longest send interval, with room. A process's first look
#: (or its first after a restart) does not replay the hour of history it may hold to the rules.
BETWEEN_LOOKS_S = 120.0


def _processes(state: ClusterState, ns: NodeState | None, node: str, touched: list[ProcessSeries],
               job_rss: dict[str, int], min_interval_s: float, carriers: dict[int, int] | None = None
               ) -> list[ProcessObservation]:
    from .cluster import allocator_totals

    node_mem = ns.memory_total_bytes if ns is not None and ns.memory_total_bytes else None
    jobs = state.jobs
    job_id, job = None, None  # the job of the previous process: a node's processes mostly share one
    gpu_totals: dict[str, int | None] = {}
    make = ProcessObservation._make
    two_looks = 2 * min_interval_s
    out = []
    for series in touched:
        s = series.latest
        looked = series.rules_t
        if s.time - looked < min_interval_s:
            continue
        series.rules_t = s.time
        # a batch longer than two looks (an agent sending every 10 s, or one back from an outage): the rules
        # look at the history points between as well, so that they see a process every min_interval_s
        between = _points_between(series, max(looked, s.time - BETWEEN_LOOKS_S), s.time, min_interval_s) \
            if s.time - looked >= two_looks else ()
        if s.job_id != job_id:
            job_id = s.job_id
            job = jobs.get(job_id) if job_id else None
        gpu_uuid, gtotal, gmem, gutil = "", None, None, None
        if s.gpus:
            gpu_uuid = s.gpus[0].gpu_uuid
            gtotal = gpu_totals.get(gpu_uuid, -1)
            if gtotal == -1:  # not looked up yet in this batch (None: looked up, size unknown)
                gtotal = gpu_totals[gpu_uuid] = gpu_memory_total(state, gpu_uuid)
            gmem, gutil = gpu_figures(s)
        tmpfs = carriers.get(id(series)) if carriers else None
        ceiling = None
        if job is not None and job.memory_bytes and s.rss_bytes is not None:
            ceiling = allocation_room(job.memory_bytes / max(1, len(job.nodes)), job_rss.get(s.job_id, 0)) \
                + s.rss_bytes + (tmpfs or 0)
        allocated = reserved = retries = None
        if series.allocator:  # the framework's allocator, where the process reports it (clusterwatch.train)
            allocated, reserved, retries = allocator_totals(series, s.time)
        job_name, partition = (job.name, job.partition) if job else ("", "")
        for t, cpu, rss, pgmem, pgutil, threads, fds in between:
            # the latest's labels and job, the point's figures (its ceiling by its own RSS); no step or work
            # count: those are the latest report's, and a step shown earlier than it came would read as speed
            out.append(make((t, node, s.job_id, s.pid, s.start_time, gpu_uuid, s.rank, s.user, s.command, job_name,
                             partition, pgmem, gtotal, pgutil, cpu, rss, node_mem,
                             None if ceiling is None or rss is None else ceiling - s.rss_bytes + rss, threads, fds,
                             None, allocated, reserved, retries, tmpfs, None, None)))
        out.append(make((s.time, node, s.job_id, s.pid, s.start_time, gpu_uuid, s.rank, s.user, s.command, job_name,
                         partition, gmem, gtotal, gutil, s.cpu_percent, s.rss_bytes, node_mem, ceiling, s.threads,
                         s.open_fds, series.step, allocated, reserved, retries, tmpfs, series.tokens_counted,
                         series.samples_counted)))
    return out


def _points_between(series: ProcessSeries, looked: float, latest: float, every_s: float) -> list:
    """The process's history points the rules are due to look at before its latest sample: after `looked` (its
    last look), each at least `every_s` after the one before, the last at least `every_s` before `latest`;
    oldest first. Points are kept every history step, so the looks are no closer than that."""
    history = series.history
    times = history.times_after(looked)
    due, last, n = [], looked, len(times)
    for i, t in enumerate(times):
        if t - last >= every_s and latest - t >= every_s:
            due.append(history[i - n])  # a point built only where it is due
            last = t
    return due


def gpu_record(obs: GpuObservation, parent: str = "") -> dict[str, Any]:
    """The GPU observation as a trace's `gpu` record (docs/traces.md); `parent`, a MIG instance's whole GPU."""
    rec: dict[str, Any] = {"kind": "gpu", "node": obs.node, "gpu": obs.gpu, "index": obs.index,
                           "job_id": obs.job_id, "t": obs.t, "utilization": obs.utilization,
                           "power_watts": obs.power_watts, "processes": obs.processes,
                           "sm_active": obs.sm_active, "tensor_active": obs.tensor_active}
    if parent:
        rec["parent"] = parent
    return {k: v for k, v in rec.items() if v is not None}


def gpu_from_record(d: Mapping[str, Any]) -> GpuObservation:
    """A trace's `gpu` record read back (KeyError, TypeError or ValueError where it is malformed); one without
    GPM's activity (an older trace's, a GPU without it) reads as a GPU without GPM."""
    g = d.get
    return GpuObservation(float(d["t"]), str(d["node"]), str(d["gpu"]), str(g("job_id", "")), g("utilization"),
                          g("processes"), g("index"), g("power_watts"), g("sm_active"), g("tensor_active"))


def heartbeat_record(hb: NodeHeartbeat) -> dict[str, Any]:
    """The heartbeat as a trace's `node` record: its send interval where known. Its jobs are not written:
    a trace is one job's, and replay's `agent_down` names none (docs/traces.md)."""
    rec: dict[str, Any] = {"kind": "node", "t": hb.t, "node": hb.node, "has_jobs": hb.has_jobs}
    if hb.every_s:
        rec["every_s"] = hb.every_s
    return rec


def heartbeat_from_record(d: Mapping[str, Any]) -> NodeHeartbeat:
    """A trace's `node` record read back (KeyError, TypeError or ValueError where it is malformed)."""
    return NodeHeartbeat(float(d["t"]), str(d["node"]), bool(d.get("has_jobs", True)), float(d.get("every_s") or 0.0))
