"""The live collector's source of stall causes (rules/causes.py's CauseSource): health findings on a job's GPUs,
then its ranks held where they are.

The rule engine knows the job's ranks, the ranks gone and the agents down; what it cannot know are the
health events the HealthEngine took from the agents' health records, and the processes' states the
collector's state keeps. This gives the health findings for the job's GPUs (those Slurm allocated it and
those its processes use, and the whole GPU of a MIG instance among them: collector/health/mig.py), from
`since` to `now`, worst first; then the job's live processes whose latest sample finds them in
uninterruptible sleep (D), stopped (T) or stopped by a tracer (t), held long enough
for the stall (causes.held_long_enough), longest first. A health event comes first: a GPU that faults can
wedge the driver call its rank makes, and then the rank is in D because of it.
The caller holds the core's lock (the engine asks while it handles a batch or a tick).
"""
from __future__ import annotations

from typing import Any

from clusterwatch.collector.health.fabric import fabric_cause
from clusterwatch.collector.health.live import job_nodes
from clusterwatch.collector.health.mig import gpu_index, with_parents
from clusterwatch.collector.rules.causes import CAUSE_LOOKBACK_S, Cause, from_health, held_long_enough, held_rank

__all__ = ["HealthCauses", "finding_cause"]


class HealthCauses:
    """A CauseSource over the collector's state and its HealthEngine.

    Args:
        state: the collector's ClusterState.
        health: a callable returning the HealthEngine (Alerting builds it after the rule engine).
    """

    def __init__(self, state: Any, health: Any) -> None:
        self.state = state
        self.health = health

    def __call__(self, job_id: str, since: float, now: float) -> list[Cause]:
        job = self.state.jobs.get(job_id)
        if job is None:
            return []
        engine = self.health()
        # the engine asks from CAUSE_LOOKBACK_S before the stall began
        stall_for = max(0.0, now - since - CAUSE_LOOKBACK_S)
        gpus = {(g.node, g.uuid) for g in self.state.job_gpus(job)}
        held = []
        for key in job.processes:
            series = self.state.processes.get(key)
            if series is not None:
                if series.state and series.alive and held_long_enough(now - series.state_since, stall_for):
                    held.append(series)
        out = self._health(job, gpus, since, now, engine) if engine is not None else []
        held.sort(key=lambda series: (series.state_since, series.key))
        for series in held:
            s = series.latest
            out.append(held_rank(series.state, s.rank, s.node, s.pid, now - series.state_since, s.wchan))
        return out

    def _health(self, job: Any, gpus: set, since: float, now: float, engine: Any) -> list[Cause]:
        out = []
        # not before the job: an earlier job's fault on the GPU is not what stalls this one
        since = max(since, job.start_time or 0.0)
        # a MIG instance's health is read on its whole GPU
        for t, f in engine.findings(sorted(with_parents(self.state, gpus)), since=since):
            if t > now + 1.0:
                continue
            out.append(finding_cause(t, f, now, gpu_index(self.state, f.node, f.uuid)))
        # the fabric of its nodes (collector/health/fabric.py): a port that flaps, an NVSwitch that faults
        out += [fabric_cause(t, f, now) for t, f in engine.fabric.node_findings(job_nodes(self.state, job), since=since)
                if t <= now + 1.0]
        return out


def finding_cause(t: float, f: Any, now: float, index: int | None) -> Cause:
    """A health finding as a stall's cause: its rank where it names one, its XID (gpu_lost says it in its text
    only). Live and replay both turn findings into causes through this."""
    rank = f.labels.get("rank", "")
    xid = f.labels.get("xid") or (_xid_of(f.description) if f.rule == "gpu_lost" else None)
    return from_health(t, f.rule, f.node, f.uuid, f.description.split(" (in use by")[0], now,
                       rank=int(rank) if rank and "," not in rank else None,
                       xid=int(xid) if xid else None, gpu_index=index)


def _xid_of(description: str) -> str | None:
    """gpu_lost names its XID in its text only ("fell off the bus (XID 79)")."""
    mark = "(XID "
    at = description.find(mark)
    if at < 0:
        return None
    digits = description[at + len(mark):].split(")")[0]
    return digits if digits.isdigit() else None
