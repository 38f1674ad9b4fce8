"""The live collector's host side of a slow job (rules/slowdown_causes.py's HostSource): its ranks held in D,
stopped or traced, then the one rank whose CPU runs far above the others', then a fabric fault on one of its
nodes (an InfiniBand / RoCE port that flaps, degrades or climbs in errors, an NVSwitch SXID).

The rule engine sees GPUs and steps; the processes' states and CPU are the collector's state's. A rank that
waits on I/O in D, or whose own CPU work (data loading, a Python-side bottleneck) saturates, makes every other
rank wait for it at the next collective. A port below its rate or an NVSwitch that faults slows every
collective through it while the steps still move. The caller holds the core's lock (the engine asks while it
handles a batch or a tick).
"""
from __future__ import annotations

from collections.abc import Callable
from statistics import median
from typing import Any

from clusterwatch.collector.health.fabric import fabric_cause
from clusterwatch.collector.health.live import job_nodes
from clusterwatch.collector.rules.causes import CAUSE_LOOKBACK_S, HELD_MIN_S, Cause, held_rank

__all__ = ["HostSide"]

#: A rank whose process uses at least CPU_BUSY % of a core, CPU_APART points above the median of the job's
#: others (theirs within CPU_TOGETHER of it), is the one held back by its host side.
CPU_BUSY = 90.0
CPU_APART = 50.0
CPU_TOGETHER = 25.0


class HostSide:
    """A HostSource over the collector's state.

    Args:
        state: the collector's ClusterState.
        health: the health engine, whose fabric findings name a node's port (None: no fabric causes).
    """

    def __init__(self, state: Any, health: Callable[[], Any] | None = None) -> None:
        self.state = state
        self.health = health

    def __call__(self, job_id: str, now: float) -> list[Cause]:
        job = self.state.jobs.get(job_id)
        if job is None:
            return []
        ranks = []
        for key in job.processes:
            series = self.state.processes.get(key)
            if series is not None and series.alive and series.latest.rank is not None:
                ranks.append(series)
        out = [held_rank(s.state, s.latest.rank, s.latest.node, s.latest.pid, now - s.state_since, s.latest.wchan)
               for s in sorted(ranks, key=lambda s: s.state_since) if s.state and now - s.state_since >= HELD_MIN_S]
        cpu = [(s, s.latest.cpu_percent) for s in ranks if s.latest.cpu_percent is not None]
        if len(cpu) >= 3:
            m = median(v for _, v in cpu)
            off = [(s, v) for s, v in cpu if abs(v - m) > CPU_TOGETHER]
            if len(off) == 1 and off[0][1] >= max(CPU_BUSY, m + CPU_APART):
                s, v = off[0]
                r = s.latest
                out.append(Cause("rank_cpu", f"rank {r.rank} (pid {r.pid} on {r.node}) uses {v:.0f} % CPU, the "
                                 f"others ~{m:.0f} %: its host side (data loading, CPU work) holds it back",
                                 {"cause": "rank_cpu", "cause_node": r.node, "cause_rank": r.rank}))
        if self.health is not None:  # a fault on the job's fabric within the look-back, or one that still holds
            found = self.health().fabric.node_findings(job_nodes(self.state, job), since=now - CAUSE_LOOKBACK_S,
                                                       standing=True)
            out += [fabric_cause(t, f, now) for t, f in found if t <= now + 1.0]
        return out
