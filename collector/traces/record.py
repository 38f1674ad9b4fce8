"""A job's history as a trace (docs/traces.md), for `clusterwatch record` and `replay`.

What the rule engine saw of the job, as far as the collector still holds it, so that a
replay with the same rules raises the same alerts:

- a process line per history point, and one for the latest sample when it is newer than
  the last point (the sample that made an alert fire is often that one);
- on every process line the sizes the live rules project "full in ~N h" from and judge a
  leak's urgency by (the GPU's memory, the node's memory, and where Slurm gives the job
  memory the room its allocation leaves the process);
- the labels rule overrides match (user, command, job name, partition), where each
  process first appears;
- where a process is held when recorded (D, T, t), its state from the hold's start (a stall names a rank
  held long enough as its likely cause);
- the allocator's figures where the process reports them (`gpu_memory_leak` judges allocated bytes then),
  as the collector held them at each line's time;
- a `job` record first: the job's start and GPUs as the collector holds them (a stall's causes are read on
  its GPUs and not before its start);
- a `gpu` record per reading of each GPU of the job (`idle_gpu`; its power, a hung collective's sign), a `node` record
  at every time the job's nodes reported (`agent_down`), and an `end` record where a
  process was found gone (its alerts end as they did in the collector);
- with the health engine, the health events of the job's GPUs (XIDs, ECC events, a lost GPU) and
  their counter readings (`health_event`, `gpu_health`), from a lead-in before the job (the look-back of
  the throttle rule, and the memory and lost findings said once), so that `replay` raises the health
  rules as the collector did.

Times are the agents' Unix times, as the engine saw them: the leak rules cut time into
buckets on a fixed grid, and a trace shifted to start at 0 would cut them elsewhere.
"""
from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from typing import Any

from clusterwatch.model import ProcessKey

from ..health.decisions import GpuUser
from ..health.mig import with_parents
from ..rules.model import GpuObservation, NodeHeartbeat, ProcessObservation
from ..state.cluster import ALLOCATOR_FRESH_S, ClusterState, JobGpu, JobState, ProcessSeries, allocator_totals
from ..state.observations import (
    allocation_room,
    gpu_figures,
    gpu_memory_total,
    gpu_record,
    heartbeat_record,
    labels_record,
    observation_record,
)

# Lines at one time in the order the collector feeds a batch to the engine: processes, the
# processes found gone, the node's GPUs, the node's heartbeat; then the batch's health records,
# events before counters (collector/health/live.py).
_JOB, _PROCESS, _END, _GPU, _NODE, _HEALTH_EVENT, _HEALTH_COUNTERS = -1, 0, 1, 2, 3, 4, 5
_SOURCES = {1: "nvml", 2: "kmsg"}
# GpuHealth's fields a gpu_health record carries (docs/traces.md), by their own names: what the health rules
# read, and the temperature (the engine keeps no more for record: collector/health/engine.py); and the map
# nvlink_errors, as an object
HEALTH_COUNTERS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
                   "ecc_uncorrected_aggregate", "remapped_rows_corrected", "remapped_rows_uncorrected",
                   "remapped_rows_pending", "remapped_rows_failure", "retired_pages_sbe", "retired_pages_dbe",
                   "retired_pages_pending", "clock_event_reasons", "temperature_c", "pcie_replays")


def job_trace_lines(state: ClusterState, job: JobState, health: Any = None) -> list[str]:
    """The job's history held in memory, as trace lines in time order.

    Args:
        state: The collector's state (read under its lock by the caller).
        job: The job.
        health: The collector's HealthEngine (its per-GPU history), or None for a trace without
            health records.

    Returns:
        JSON lines without newlines, oldest first.
    """
    rows: list[tuple[float, int, dict[str, Any]]] = []
    # GPU UUID → (first, last) times of each of the job's processes on it: how many use it at a reading
    users: dict[str, list[tuple[float, float]]] = {}
    node_times: dict[str, set[float]] = {}
    ended: list[tuple[ProcessSeries, float]] = []  # processes gone, each with its last line's time
    procs = [(series, _points(series)) for series in state.job_processes(job)]
    ceilings = _allocation_ceilings(job, procs) if job.memory_bytes else {}
    for series, points in procs:
        lines = _process_rows(state, job, series, points, ceilings.get(series.key))
        rows.extend((r["t"], _PROCESS, r) for r in lines)
        times = node_times.setdefault(series.key.node, set())
        times.update(r["t"] for r in lines if "gpu_mem_bytes" in r or "rss_bytes" in r or "gpu_util" in r)
        for g in series.latest.gpus:
            users.setdefault(g.gpu_uuid, []).append((lines[0]["t"], lines[-1]["t"]))
        if not series.alive:
            ended.append((series, lines[-1]["t"]))
    # the job's GPUs a trace holds: allocated to it, and those its processes use that the collector knows
    gpus = [g for g in state.job_gpus(job) if g.allocated or g.uuid in state.gpus]
    for node in sorted(set(job.nodes) | set(node_times) | set(job.gpus_by_node)):
        times = node_times.setdefault(node, set())
        for r in _gpu_rows(state, job.job_id, node, [g for g in gpus if g.node == node], users):
            rows.append((r["t"], _GPU, r))
            times.add(r["t"])
        ns = state.nodes.get(node)
        every = ns.send_interval_s if ns is not None else 0.0
        for t in times:
            rows.append((t, _NODE, heartbeat_record(NodeHeartbeat(t, node, True, every))))
    for series, last in ended:
        # the collector forgets a process at its node's first report without it
        t = min((x for x in node_times.get(series.key.node, ()) if x > last), default=last)
        rows.append((t, _END, {"kind": "end", "t": t, "node": series.key.node, "pid": series.key.pid,
                               "start_time": series.key.start_time}))
    if health is not None:
        rows.extend(_health_rows(state, job, health, rows, {(g.node, g.uuid) for g in gpus}))
    if rows:
        rows.append(_job_row(state, job, min(r[0] for r in rows)))
    rows.sort(key=lambda r: (r[0], r[1]))
    dumps = json.dumps
    return [dumps({k: v for k, v in r.items() if v is not None}, separators=(",", ":")) for _, _, r in rows]


def _job_row(state: ClusterState, job: JobState, t: float) -> tuple[float, int, dict[str, Any]]:
    """The trace's first line: the job's start and GPUs as the collector holds them (a stall's causes are read
    from them, not before the job and on its GPUs), which its process lines alone would only suggest."""
    gpus = []
    for g in state.job_gpus(job):
        gs = state.gpus.get(g.uuid)
        gpus.append({"node": g.node, "gpu": g.uuid, "index": gs.info.index if gs is not None else None,
                     "allocated": g.allocated})
    return t, _JOB, {"kind": "job", "t": t, "job_id": job.job_id, "start_time": job.start_time or None,
                     "gpus": [{k: v for k, v in g.items() if v is not None} for g in gpus]}


def _points(series: ProcessSeries) -> list[tuple]:
    """(t, cpu, rss, gpu memory, gpu utilisation, threads, fds) of the process: its history, then its latest
    sample where newer (the sample that made an alert fire is often that one)."""
    s = series.latest
    points: list[tuple] = [tuple(p) for p in series.history]
    if not points or s.time > points[-1][0]:
        gmem, gutil = gpu_figures(s)
        points.append((s.time, s.cpu_percent, s.rss_bytes, gmem, gutil, s.threads, s.open_fds))
    return points


def _allocation_ceilings(job: JobState, procs: list[tuple[ProcessSeries, list[tuple]]]
                         ) -> dict[ProcessKey, list[int | None]]:
    """Each process's host memory ceiling at each of its points, where Slurm gives the job memory, as the
    live rules take it (collector/state/observations.py): its RSS plus the room the job's share of the node has
    left, less what all the job's processes on the node hold then (each as of its latest point); None at a
    point without an RSS."""
    share = job.memory_bytes / max(1, len(job.nodes))
    on_node: dict[str, list[tuple[list[float], list[Any]]]] = {}
    for series, points in procs:
        on_node.setdefault(series.key.node, []).append(([p[0] for p in points], [p[2] for p in points]))
    out: dict[ProcessKey, list[int | None]] = {}
    for series, points in procs:
        ceilings: list[int | None] = []
        for t, _cpu, rss, *_ in points:
            if rss is None:
                ceilings.append(None)
                continue
            held = 0
            for times, values in on_node[series.key.node]:
                if times[0] <= t <= times[-1]:
                    held += values[bisect.bisect_right(times, t) - 1] or 0
            ceilings.append(int(allocation_room(share, held)) + rss)
        out[series.key] = ceilings
    return out


def _process_rows(state: ClusterState, job: JobState, series: ProcessSeries, points: list[tuple],
                  ceilings: list[int | None] | None) -> list[dict[str, Any]]:
    """The process's lines: its observation at each point, written down (collector/state/observations.py), with its
    GPU's index for people and its hold (D, T, t) where it is held; its labels on its first line."""
    s = series.latest
    uuid = s.gpus[0].gpu_uuid if s.gpus else ""
    gs = state.gpus.get(uuid) if uuid else None
    ns = state.nodes.get(s.node)
    gtotal = gpu_memory_total(state, uuid) if uuid else None
    node_mem = (ns.memory_total_bytes or None) if ns is not None else None
    gpu_index = gs.info.index if gs is not None else None
    steps = _steps(series)
    step_times = [t for t, _ in steps]
    counts = [(t, tokens, samples) for t, _, _, _, tokens, samples in series.progress_history]
    count_times = [t for t, _, _ in counts]
    alloc = list(series.allocator_history)
    alloc_times = [a[0] for a in alloc]
    out = []
    for i, (t, cpu, rss, gmem, gutil, threads, fds) in enumerate(points):
        j = bisect.bisect_right(step_times, t)
        figures = _allocator_figures(series, alloc, alloc_times, t, t == s.time) if alloc else (None, None, None)
        if t == s.time:  # the latest sample's: the counts the live rules read then
            tokens, samples = series.tokens_counted, series.samples_counted
        else:
            k = bisect.bisect_right(count_times, t)
            tokens, samples = counts[k - 1][1:] if k else (None, None)
        obs = ProcessObservation(t, s.node, job.job_id, s.pid, s.start_time, uuid, s.rank, s.user, s.command,
                                 job.name, job.partition, gmem, gtotal, gutil, cpu, rss, node_mem,
                                 ceilings[i] if ceilings else None, threads, fds, steps[j - 1][1] if j else None,
                                 *figures, tokens=tokens, samples=samples)
        row = observation_record(obs, labels=False)
        row["gpu_index"] = gpu_index
        if series.state and t >= series.state_since:
            # held (D, T, t) since then: a stall's likely cause (rules/causes.py); the collector keeps the
            # current state alone, so an earlier hold is not in the trace
            row["state"], row["state_since"] = series.state, series.state_since
            if s.wchan:
                row["wchan"] = s.wchan
        out.append(row)
    if len(series.history) == series.history.maxlen and s.start_time < out[0]["t"]:
        # The collector dropped this process's oldest points: its warm-up began before the
        # first one kept. A line without readings at its start tells the engine so (a replay
        # would otherwise ignore the first warm-up's worth of the trace again).
        opening = ProcessObservation(s.start_time, s.node, job.job_id, s.pid, s.start_time, uuid, s.rank)
        out.insert(0, {**observation_record(opening, labels=False), "gpu_index": gpu_index})
    out[0].update(labels_record(s.user, s.command, job.name, job.partition))
    return out


def _steps(series: ProcessSeries) -> list[tuple[float, int]]:
    """(t, step) of the process's reports as far back as the collector holds them: every one of the last few
    (step_history), and before those one a history step (progress_history). With the last few alone, a line
    older than them would carry no step, and a replay would judge job_slowdown's baseline on nothing."""
    recent = list(series.step_history)
    first = recent[0][0] if recent else float("inf")
    return [(t, step) for t, step, *_ in series.progress_history if t < first] + recent


def _allocator_figures(series: ProcessSeries, alloc: list[tuple], alloc_times: list[float], t: float,
                       latest: bool) -> tuple[Any, Any, Any]:
    """The allocator's figures (allocated, reserved, retries) as the live rules took them at `t`
    (`allocator_totals` at the sample's time, None where absent or stale): the latest sample's from the
    process's current figures, a history point's from the report held for it (state.allocator_history)."""
    if latest:
        return allocator_totals(series, t)
    i = bisect.bisect_right(alloc_times, t)
    if not i or t - alloc[i - 1][0] > ALLOCATOR_FRESH_S:
        return None, None, None
    _, allocated, reserved, retries = alloc[i - 1]
    return allocated, reserved, retries


def _gpu_rows(state: ClusterState, job_id: str, node: str, gpus: list[JobGpu],
              users: dict[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    """The readings of the job's GPUs on `node` (`gpus`, ClusterState.job_gpus): each names the job where it is
    allocated to it, as the live GPU observations do (collector/state/observations.py)."""
    out = []
    for job_gpu in sorted(gpus, key=lambda g: g.uuid):
        uuid = job_gpu.uuid
        gs = state.gpus.get(uuid)
        if gs is None:
            continue
        spans = users.get(uuid, [])
        holder = job_id if job_gpu.allocated else ""
        power = dict(gs.power_history)  # appended beside history, at the same reading's time (state.py)
        for t, util, _mem in gs.history:
            obs = GpuObservation(t, node, uuid, holder, util, sum(1 for a, b in spans if a <= t <= b),
                                 gs.info.index, power.get(t))
            out.append(gpu_record(obs, gs.info.parent_uuid))
    return out


def _health_rows(state: ClusterState, job: JobState, health: Any, rows: list[tuple[float, int, dict[str, Any]]],
                 gpus: set[tuple[str, str]]) -> list[tuple[float, int, dict[str, Any]]]:
    """The health records of the job's GPUs (those allocated to it and those its processes use), and the
    events naming one of its processes, from the lead-in before the job to the end of what the engine holds.

    The collector took a node's first health records with its first samples (the agent sends both in one
    batch), and names who they hit among the processes known then. So an event older than its node's first
    process line (a kernel-log line the agent read at its start) goes at that line, with its own time as
    `event_t`; and so does a counter reading from the job's start on taken before it (the health thread
    read the GPU before the first poll's time), the last such reading of each GPU: read before, it would
    name no job, where live it named the job's ranks on the GPU.
    """
    from clusterwatch.v1 import agent_pb2

    first: dict[str, float] = {}       # node → its first process line's time, else its first line's
    first_proc: dict[str, float] = {}  # node → its first process line's time
    pids: dict[str, set[int]] = {}
    starts = []
    for t, _, r in rows:
        node = r["node"]
        first[node] = min(t, first.get(node, t))
        if "kind" not in r:
            first_proc[node] = min(t, first_proc.get(node, t))
            pids.setdefault(node, set()).add(r["pid"])
            starts.append(r["start_time"])
    first.update(first_proc)
    begin = job.start_time or min(starts, default=0.0)
    since = begin - 2 * health.throttle.window_s
    gpus = with_parents(state, gpus)   # a MIG instance's health is read on its whole GPU
    nodes = set(job.nodes) | set(first) | {n for n, _ in gpus}
    out: list[tuple[float, int, dict[str, Any]]] = []
    for (node, uuid), view in health.gpus.items():
        if node not in nodes:
            continue
        ours = (node, uuid) in gpus
        node_pids = pids.get(node, set())
        for t, data, users in view.events:
            if t < since:
                continue
            msg = agent_pb2.HealthEvent.FromString(data)
            if not ours and not (msg.HasField("pid") and msg.pid in node_pids):
                continue
            rec = health_event_record(node, msg, max(t, first.get(node, t)), users)
            out.append((rec["t"], _HEALTH_EVENT, rec))
        if not ours:
            continue
        named = dict(view.named)  # a reading's users by its own time, also where it is placed at the first line
        readings = [(t, data, t) for t, data in view.history_readings() if t >= since]
        start_line = first_proc.get(node)
        early = [i for i, (t, _, _) in enumerate(readings) if start_line is not None and begin <= t < start_line]
        if early:
            last = early[-1]
            readings = [(start_line if i == last else t, data, own) for i, (t, data, own) in enumerate(readings)
                        if i == last or i not in early]
        for t, data, own in readings:
            msg = agent_pb2.GpuHealth.FromString(data)
            msg.time, msg.uuid = t, uuid
            out.append((t, _HEALTH_COUNTERS, gpu_health_record(node, msg, named.get(own))))
    return out


def health_event_record(node: str, msg: Any, t: float, users: Sequence[GpuUser] | None = None) -> dict[str, Any]:
    """A HealthEvent as a `health_event` record placed at `t` (docs/traces.md), with the GPU users the collector
    named for it where given (`users_record`).

    The pid it names is `hit_pid`, never `pid`: a replay in several processes shares lines out by the
    text after `"pid":`, and a health record must reach the one that holds the GPU's users.
    """
    rec: dict[str, Any] = {"kind": "health_event", "t": t, "node": node, "gpu": msg.uuid, "event": msg.kind}
    if msg.time != t:
        rec["event_t"] = msg.time
    if msg.HasField("xid"):
        rec["xid"] = msg.xid
    if msg.data:
        rec["data"] = msg.data
    if msg.HasField("pid"):
        rec["hit_pid"] = msg.pid
    if msg.process:
        rec["process"] = msg.process
    if msg.pci:
        rec["pci"] = msg.pci
    if msg.source in _SOURCES:
        rec["source"] = _SOURCES[msg.source]
    if msg.text:
        rec["text"] = msg.text
    if users is not None:
        rec["users"] = users_record(users)
    return rec


def users_record(users: Sequence[GpuUser]) -> list[dict[str, Any]]:
    """The GPU users the collector named for a health record, as its `users` (docs/traces.md): a replay names
    them, not those it would make out from the trace's process lines. Each user's pid is `process_id`, never
    `pid` (see health_event_record)."""
    return [{k: v for k, v in (("job_id", u.job_id), ("rank", u.rank), ("process_id", u.pid),
                               ("process", u.process), ("start_time", u.start_time)) if v is not None}
            for u in users]


def gpu_health_record(node: str, msg: Any, users: Sequence[GpuUser] | None = None) -> dict[str, Any]:
    """A GpuHealth reading as a `gpu_health` record: the counters the GPU gave, by their own names; and where
    it raised a finding naming users (throttling, memory errors, a link), those users (`users_record`)."""
    rec: dict[str, Any] = {"kind": "gpu_health", "t": msg.time, "node": node, "gpu": msg.uuid}
    for name in HEALTH_COUNTERS:
        if msg.HasField(name):
            rec[name] = getattr(msg, name)
    if msg.nvlink_errors:
        rec["nvlink_errors"] = dict(sorted(msg.nvlink_errors.items()))
    if msg.violation_seconds:
        rec["violation_seconds"] = dict(sorted(msg.violation_seconds.items()))
    if users is not None:
        rec["users"] = users_record(users)
    return rec
