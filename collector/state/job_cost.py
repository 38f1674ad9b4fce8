"""What a job cost on each GPU it held: energy, clock throttle time by reason, and time at each activity level.

Every figure comes from the readings the agents send, credited to the job that holds the GPU as of the
node's latest poll (ClusterState.node_gpu_holders: the one rule of who holds a GPU, read for one node):

- energy: NVML's total-energy counter (millijoules since the driver loaded, per whole GPU). The increase
  between two readings of a GPU goes to the job that holds it at the later one, so a job's energy is the
  counter's difference over the readings it held the GPU for. A counter that goes back (a driver reload, the
  only thing that resets it) counts nothing for that interval and is counted as a reset: the energy then is
  unknown, and the job's figure says it is short. A MIG instance has no counter of its own (the agent sends
  none): its job has no energy figure rather than the whole GPU's.
- shared: a GPU held by one job while another job's process uses it too. Its energy and throttle time are
  the whole GPU's and go to the holder alone, flagged shared; nothing is split by a guess.
- throttle: NVML's violation counters (seconds the clocks were held down, by policy: power, thermal, ...),
  from the agents' health readings of the whole GPU. The increase goes to the job holding the GPU, or under
  MIG to each job holding one of its instances: a throttled GPU slows every instance on it. A counter that
  goes back counts nothing for that interval.
- activity: the time between two readings a job held the GPU, binned by the GPU's SM activity (GPM) where
  it has a current reading, else by its utilisation, and said which; a reading with neither counts nowhere.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from clusterwatch.model import ACTIVITY_EDGES, ACTIVITY_LEVELS

__all__ = ["ACTIVITY_EDGES", "ACTIVITY_LEVELS", "GpuCost", "CostMeter", "level_of", "gpu_cost_to_proto"]


# The longest gap between two readings that counts whole toward activity time (as cluster.MAX_GAP_S): past it
# an agent was away, and only this much counts. Energy is a counter and needs no such bound.
MAX_GAP_S = 60.0


def level_of(percent: float) -> int:
    """The activity level (an index into ACTIVITY_LEVELS) of a percentage."""
    return bisect_right(ACTIVITY_EDGES, percent)


@dataclass(slots=True)
class GpuCost:
    """One GPU's cost to one job, while the job held it."""

    energy_mj: int = 0
    has_energy: bool = False       # an interval of the counter was credited (a MIG instance's job never has one)
    energy_resets: int = 0         # readings whose counter went back: those intervals are not counted
    shared: bool = False           # another job's process used the GPU while this job held it
    throttle_s: dict[str, float] = field(default_factory=dict)
    sm_active_s: list[float] = field(default_factory=lambda: [0.0] * len(ACTIVITY_LEVELS))
    utilization_s: list[float] = field(default_factory=lambda: [0.0] * len(ACTIVITY_LEVELS))


class CostMeter:
    """Each GPU's last counter readings, so that what a job is credited is a difference of two readings."""

    def __init__(self) -> None:
        self._energy: dict[str, int] = {}                  # GPU UUID → the counter's last reading (mJ)
        self._time: dict[str, float] = {}                  # GPU UUID → its last reading's time
        self._violation: dict[str, dict[str, float]] = {}  # whole GPU UUID → policy → seconds, last read

    def reading(self, job: Any, uuid: str, t: float, energy_mj: int | None, sm_active: float | None,
                utilization: float | None, shared: bool) -> None:
        """A GPU's reading at `t`; `job` (a JobState, None when no running job holds the GPU) is credited with
        the interval since the GPU's reading before: its energy, and its time at the reading's activity level."""
        last_t = self._time.get(uuid)
        if last_t is not None and t <= last_t:
            return  # a reading already seen (a resent batch) or older: nothing new happened
        self._time[uuid] = t
        last_mj = self._energy.get(uuid)
        if energy_mj is not None:
            self._energy[uuid] = energy_mj
        if job is None:
            return
        cost = _cost_of(job, uuid)
        cost.shared = cost.shared or shared
        if energy_mj is not None and last_mj is not None:
            if energy_mj >= last_mj:
                cost.energy_mj += energy_mj - last_mj
                cost.has_energy = True
            else:
                cost.energy_resets += 1
        if last_t is not None:
            dt = min(t - last_t, MAX_GAP_S)
            if sm_active is not None:
                cost.sm_active_s[level_of(sm_active)] += dt
            elif utilization is not None:
                cost.utilization_s[level_of(utilization)] += dt

    def violations(self, holders: list[tuple[Any, str]], whole_uuid: str, seconds: dict[str, float]) -> None:
        """A whole GPU's violation counters (policy → seconds): the increase since its last read goes to each
        (job, GPU UUID the job holds) in `holders` (the GPU's holder, or its MIG instances' holders)."""
        last = self._violation.get(whole_uuid)
        self._violation[whole_uuid] = dict(seconds)
        if last is None:
            return
        for policy, s in seconds.items():
            before = last.get(policy)
            if before is None or s <= before:
                continue  # first seen, unchanged, or back (a driver reload): nothing known to credit
            for job, uuid in holders:
                cost = _cost_of(job, uuid)
                cost.throttle_s[policy] = cost.throttle_s.get(policy, 0.0) + (s - before)


def _cost_of(job: Any, uuid: str) -> GpuCost:
    costs = job.gpu_cost  # a JobState's
    cost = costs.get(uuid)
    if cost is None:
        cost = costs[uuid] = GpuCost()
    return cost


def gpu_cost_to_proto(cost: GpuCost, out: Any) -> None:
    """A GPU's cost to a job into a query GpuCost message."""
    if cost.has_energy:
        out.energy_joules = cost.energy_mj / 1000.0
    out.shared = cost.shared
    out.energy_resets = cost.energy_resets
    out.throttle_seconds.update(cost.throttle_s)
    out.sm_active_seconds.extend(cost.sm_active_s)
    out.utilization_seconds.extend(cost.utilization_s)
