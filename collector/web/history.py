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
    gpu_memory: Series = field(default_factory=list)
    gpu_utilization: Series = field(default_factory=list)
    cpu_percent: Series = field(default_factory=list)
    rss: Series = field(default_factory=list)
    steps_per_s: Series = field(default_factory=list)
    # the framework's allocator as the process reported it (clusterwatch.train); empty where it does not
    gpu_allocated: Series = field(default_factory=list)
    gpu_reserved: Series = field(default_factory=list)


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


def _rates(points) -> Series:
    """Steps per second between consecutive training reports (time, step)."""
    pts = list(points)
    return [(t1, max(0.0, (s1 - s0) / (t1 - t0))) for (t0, s0), (t1, s1) in zip(pts, pts[1:], strict=False) if t1 > t0]


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
            rc = RankCharts(_label(p.latest.rank, p.key.node, p.key.pid))
            for pt in p.history:
                if pt.gpu_memory_bytes is not None:
                    rc.gpu_memory.append((pt.t, float(pt.gpu_memory_bytes)))
                if pt.gpu_utilization is not None:
                    rc.gpu_utilization.append((pt.t, float(pt.gpu_utilization)))
                if pt.cpu_percent is not None:
                    rc.cpu_percent.append((pt.t, float(pt.cpu_percent)))
                if pt.rss_bytes is not None:
                    rc.rss.append((pt.t, float(pt.rss_bytes)))
            rc.steps_per_s = _rates(p.step_history)
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
        rc = RankCharts(_label(p.rank if p.HasField("rank") else None, p.node, p.pid))
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
