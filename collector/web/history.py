"""The figures a job's charts draw: per rank and per GPU, over the job's time, from the collector's history.

A live job reads the core's state under its lock (the history points hold times); an ended job has
only its stored summary's trends, evenly resampled and without times, drawn against their index.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from clusterwatch.v1 import query_pb2

Series = list[tuple[float, float]]  # (time or index, value)


@dataclass(slots=True)
class RankCharts:
    """One rank's (or process's) series."""

    label: str
    rank: int | None = None
    gpu_memory: Series = field(default_factory=list)
    gpu_utilization: Series = field(default_factory=list)
    cpu_percent: Series = field(default_factory=list)
    rss: Series = field(default_factory=list)
    steps_per_s: Series = field(default_factory=list)
    # the framework's allocator as the process reported it (clusterwatch.train); empty where it does not
    gpu_allocated: Series = field(default_factory=list)
    gpu_reserved: Series = field(default_factory=list)
    loss: Series = field(default_factory=list)
    lr: Series = field(default_factory=list)


@dataclass(slots=True)
class GpuCharts:
    """One GPU's series (an ended job's summary holds its power only as the latest reading)."""

    label: str
    utilization: Series = field(default_factory=list)
    memory_used: Series = field(default_factory=list)
    power: Series = field(default_factory=list)
    power_watts: float | None = None


def _label(rank: int | None, node: str, pid: int) -> str:
    return f"rank {rank}" if rank is not None else f"pid {pid} on {node}"


def progress_rates(points, stalled_since: float | None, latest: float, window_s: float = 5.0) -> Series:
    """Steps per second from training reports (time, step), each over at least `window_s` (one slow step
    or a late report is not drawn as a fall); a rank stalled since `stalled_since` (its step last moved
    then) drops to 0 there and stays at 0 until `latest`, its latest sample: a stall reads as a fall to
    zero, not as a line that ends."""
    pts = sorted(dict(points).items())
    rates: Series = []
    anchor = pts[0] if pts else None
    for t, step in pts[1:]:
        if stalled_since is not None and t > stalled_since:
            break
        if t - anchor[0] >= window_s:
            rates.append((t, max(0.0, (step - anchor[1]) / (t - anchor[0]))))
            anchor = (t, step)
    last = next((p for p in reversed(pts) if stalled_since is None or p[0] <= stalled_since), None)
    if last is not None and last[0] - anchor[0] >= window_s / 5:  # the latest reports, over a shorter window
        rates.append((last[0], max(0.0, (last[1] - anchor[1]) / (last[0] - anchor[0]))))
    if stalled_since is not None:
        rates = [p for p in rates if p[0] < stalled_since]
        rates.append((stalled_since, 0.0))
        if latest > stalled_since:
            rates.append((latest, 0.0))
    return rates


def live_history(core, job_id: str) -> tuple[list[RankCharts], list[GpuCharts]] | None:
    """The job's series from the core's in-memory history, or None when the core does not hold it."""
    with core.lock:
        state = core.state
        job = state.jobs.get(job_id)
        if job is None:
            return None
        procs = sorted(state.job_processes(job), key=lambda p: (
            p.latest.rank if p.latest.rank is not None else 1 << 30, p.key.node, p.key.pid))
        ranks, uuids = [], []
        for p in procs:
            rc = RankCharts(_label(p.latest.rank, p.key.node, p.key.pid), p.latest.rank)
            for pt in p.history:
                if pt.gpu_memory_bytes is not None:
                    rc.gpu_memory.append((pt.t, float(pt.gpu_memory_bytes)))
                if pt.gpu_utilization is not None:
                    rc.gpu_utilization.append((pt.t, float(pt.gpu_utilization)))
                if pt.cpu_percent is not None:
                    rc.cpu_percent.append((pt.t, float(pt.cpu_percent)))
                if pt.rss_bytes is not None:
                    rc.rss.append((pt.t, float(pt.rss_bytes)))
            progress = list(getattr(p, "progress_history", ()))
            # the dense recent reports too: the rate is current, and a rank with one report a history step
            # gets a rate at all
            steps = [(t, step) for t, step, *_ in progress] + list(p.step_history)
            rc.steps_per_s = progress_rates(steps, p.stalled_since, p.latest.time) if steps else []
            rc.loss = [(t, float(loss)) for t, _, loss, *_ in progress if loss is not None]
            rc.lr = [(t, float(lr)) for t, _, _, lr, *_ in progress if lr is not None]
            for t, allocated, reserved, *_ in getattr(p, "allocator_history", ()):
                if allocated is not None:
                    rc.gpu_allocated.append((t, float(allocated)))
                if reserved is not None:
                    rc.gpu_reserved.append((t, float(reserved)))
            ranks.append(rc)
        uuids = [g.uuid for g in state.job_gpus(job)]  # allocated to it, then those its processes use
        gpus = []
        for uuid in uuids:
            gs = state.gpus.get(uuid)
            if gs is None:
                continue
            gc = GpuCharts(f"GPU {gs.info.index} on {gs.node}")
            for t, util, mem in gs.history:
                if util is not None:
                    gc.utilization.append((t, float(util)))
                if mem is not None:
                    gc.memory_used.append((t, float(mem)))
            gc.power = [(t, float(w)) for t, w in getattr(gs, "power_history", ())]
            if gs.latest is not None and gs.latest.power_watts is not None:
                gc.power_watts = float(gs.latest.power_watts)
            gpus.append(gc)
        return ranks, gpus


def stored_history(view: query_pb2.JobView) -> tuple[list[RankCharts], list[GpuCharts]]:
    """The series an ended job's summary holds: its trends, against their index."""
    ranks = []
    for p in view.processes:
        rank = p.rank if p.HasField("rank") else None
        rc = RankCharts(_label(rank, p.node, p.pid), rank)
        rc.gpu_memory = list(enumerate(p.gpu_memory_trend))
        rc.rss = list(enumerate(p.rss_trend))
        ranks.append(rc)
    gpus = []
    for g in view.gpus:
        gc = GpuCharts(f"GPU {g.index} on {g.node}", utilization=list(enumerate(g.utilization_trend)))
        if g.HasField("power_watts"):
            gc.power_watts = g.power_watts
        gpus.append(gc)
    return ranks, gpus
