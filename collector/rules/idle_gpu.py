"""idle_gpu: a GPU allocated to a job that has no process, or idles, for long.

Idle is its SM activity under the rule's threshold where the GPU offers NVML GPM, whatever its utilisation
says (a collective spinning on a few SMs reads 100 %); else its utilisation under the rule's threshold.

State, per GPU: the job it is allocated to, since when it idles, the alert's state, its latest idle
observation (the alert's refreshed text), its power draw with the highest in this allocation, and its latest
SM and tensor activity (a stall's cause reads them).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .causes import CAUSE_LOOKBACK_S, Cause, RankFigures, hung_collective
from .config import IdleGpuRule
from .model import FIRING, PENDING, RESOLVED, AlertEvent, GpuObservation, Rule
from .process import ENDED_WHILE_FIRING, hours

NAMES = (Rule.IDLE_GPU,)

#: The job's likely stall cause: (job id, since, t) → Cause or None (the engine's).
JobCause = Callable[[str, float, float], "Cause | None"]


@dataclass(slots=True)
class GpuState:
    """What `idle_gpu` remembers about one GPU."""

    job_id: str
    idle_since: float | None = None
    state: str | None = None  # PENDING | FIRING, None while nothing is raised
    last: GpuObservation | None = None  # the latest observation while idle (the alert's refreshed text)
    power: float | None = None  # the latest power draw, and the highest in this allocation (a stall's cause)
    power_peak: float = 0.0
    sm_active: float | None = None  # GPM's latest, None without it (a stall's cause)
    tensor_active: float | None = None


class IdleGpus:
    """The rule over every GPU: (node, gpu) → its state."""

    def __init__(self) -> None:
        self.gpus: dict[tuple[str, str], GpuState] = {}

    def observe(self, r: IdleGpuRule, obs: GpuObservation, job_cause: JobCause) -> list[AlertEvent]:
        """One GPU observation: its power (always), and the rule where it is on."""
        gkey = (obs.node, obs.gpu)
        st = self.gpus.get(gkey)
        if st is None:
            st = self.gpus[gkey] = GpuState(obs.job_id)
        out: list[AlertEvent] = []
        if st.job_id != obs.job_id:
            out += _resolve(r, gkey, st, obs.t, "allocation changed")
            st.job_id, st.idle_since, st.power_peak = obs.job_id, None, 0.0
        st.power, st.sm_active, st.tensor_active = obs.power_watts, obs.sm_active, obs.tensor_active
        if obs.power_watts is not None and obs.power_watts > st.power_peak:
            st.power_peak = obs.power_watts
        if not r.enabled:
            return out
        if not obs.job_id:
            return out
        if obs.processes == 0:
            idle = True
        elif obs.sm_active is not None:  # GPM says how much of the GPU is used; utilisation only that a kernel ran
            idle = obs.sm_active < r.sm_active_below_percent
        else:
            idle = obs.utilization is not None and obs.utilization < r.util_below_percent
        if not idle:
            out += _resolve(r, gkey, st, obs.t, "in use again")
            st.idle_since = None
            return out
        if st.idle_since is None:
            st.idle_since = obs.t
        st.last = obs
        dur = obs.t - st.idle_since
        new = FIRING if dur >= r.for_s else PENDING if dur >= r.for_s / 2 else None
        if new is not None and new != st.state:
            st.state = new
            out.append(_event(r, st, obs.t, new, job_cause))
        return out

    def refresh(self, r: IdleGpuRule, job_cause: JobCause) -> list[AlertEvent]:
        """Every alert raised, its text and figures as of the GPU's latest idle observation."""
        return [_event(r, st, st.last.t, st.state, job_cause)
                for st in self.gpus.values() if st.state is not None and st.last is not None]

    def forget_job(self, r: IdleGpuRule, job_id: str, t: float, job_cause: JobCause) -> list[AlertEvent]:
        """The job ended: its GPUs' alerts resolve (a firing one with its last figures) and their state goes."""
        out: list[AlertEvent] = []
        for gkey, st in list(self.gpus.items()):
            if st.job_id == job_id:
                if st.state == FIRING and st.last is not None:
                    st.state = None
                    out.append(_event(r, st, t, RESOLVED, job_cause, ended=True))
                else:
                    out += _resolve(r, gkey, st, t, f"job {job_id} ended")
                del self.gpus[gkey]
        return out


def _event(r: IdleGpuRule, st: GpuState, t: float, state: str, job_cause: JobCause,
           ended: bool = False) -> AlertEvent:
    """The event for the GPU's latest idle observation, its figures as of then."""
    obs = st.last
    assert obs is not None and st.idle_since is not None
    dur = obs.t - st.idle_since
    label = obs.gpu if obs.index is None else f"{obs.index} ({obs.gpu})"
    desc = f"GPU {label} on {obs.node}, allocated to job {obs.job_id}, {_why(obs)} for {hours(dur)}"
    figures: dict[str, Any] = {"idle_for_s": round(dur, 1), "processes": obs.processes,
                               "util_percent": obs.utilization}
    if obs.sm_active is not None:
        figures["sm_active_percent"] = obs.sm_active
    if state != RESOLVED:
        cause = job_cause(obs.job_id, st.idle_since - CAUSE_LOOKBACK_S, t)
        if cause is None:  # no cause the job shows: the GPU's own, a collective spinning (GPM's, or its power)
            cause = hung_collective(RankFigures(None, obs.node, 0, obs.gpu, None, obs.utilization, obs.power_watts,
                                                st.power_peak, obs.sm_active, obs.tensor_active))
        if cause is not None:
            desc += f"; likely cause: {cause.text}"
            figures.update(cause.figures)
    if ended:
        desc += f"; {ENDED_WHILE_FIRING}: job {obs.job_id} ended"
        figures["ended_while_firing"] = True
    return AlertEvent(t=t, rule=Rule.IDLE_GPU.value, state=state, severity=r.severity, node=obs.node,
                      job_id=obs.job_id, gpu=obs.gpu, description=desc, figures=figures)


def _why(obs: GpuObservation) -> str:
    if obs.processes == 0:
        return "has no process"
    if obs.sm_active is not None:
        util = f" at {obs.utilization:.0f} % utilisation" if obs.utilization is not None else ""
        return f"is idle ({obs.sm_active:.0f} % SM activity{util})"
    return f"is idle ({obs.utilization:.0f} %)"


def _resolve(r: IdleGpuRule, gkey: tuple[str, str], st: GpuState, t: float, why: str) -> list[AlertEvent]:
    if st.state is None:
        return []
    st.state = None
    return [AlertEvent(t=t, rule=Rule.IDLE_GPU.value, state=RESOLVED, severity=r.severity, node=gkey[0],
                       job_id=st.job_id, gpu=gkey[1], description=f"GPU {gkey[1]} on {gkey[0]}: {why}")]
