"""job_slowdown: a job slower than it was, and who makes it so.

A job's throughput is the step rate its training process reports (clusterwatch.train), read from one rank:
the job's ranks step together, so one rank's rate is the job's. It is cut into buckets (`bucket_s`); the
job's steady baseline is the median bucket rate over `baseline_s` before the window judged, leaving out the
job's first `warmup_s` (data-loader and compile warm-up). The alert fires when, over the last `for_s`, the
rate fell `drop_percent` below that baseline, and at least `low_fraction` of the window's buckets did: an
evaluation phase or a checkpoint save that holds the steps for minutes leaves most buckets at speed, and a
slow drift (a learning-rate or sequence-length warm-up changing the step time) moves the baseline with it.
Steps that stop altogether are training_stall's. It resolves once the rate is back within half the drop
of the baseline it fired against.

A job without training reports is judged from its GPUs alone: one GPU whose clocks were held down (NVML's
clock-event reasons, read with the health counters) for `gpu_share` of the window while the job's other
GPUs ran free makes the whole job run at its pace.

The alert names the likely cause (slowdown_causes.py). State: a JobPace per job (the one rank it reads,
`lead`, carries it on its process record as `pace`), and a GpuPace per GPU with its clock readings.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from clusterwatch.humanize import duration

from ..health.decisions import throttle_share  # the share of a span a GPU's readings show a reason bit held
from .causes import Cause
from .config import JobSlowdownRule
from .model import FIRING, RESOLVED, AlertEvent, GpuClockObservation, Rule
from .process import ENDED_WHILE_FIRING
from .slowdown_causes import POWER_CAP, SLOWING_REASONS, GpuPaceFigures, gpu_cause

NAMES = (Rule.JOB_SLOWDOWN,)
_RULE = Rule.JOB_SLOWDOWN.value
_SLOWING = sum(SLOWING_REASONS)

#: (job id, since, t) → the slowdown's likely cause (the engine's: its GPUs, ranks and the host source).
CauseOf = Callable[[str, float, float], Cause]
#: job id → (node, GPU UUID) → the rank whose process uses that GPU (the engine's, from the job's processes).
RanksOf = Callable[[str], Mapping[tuple[str, str], "int | None"]]


class _Unset:
    """A process's `pace` before it says whether it leads its job's (b_end -inf: its next step asks)."""

    b_end = float("-inf")


class _Follows:
    """A process's `pace` when another rank of its job is read (b_end +inf: its steps cost one comparison)."""

    b_end = float("inf")


UNSET = _Unset()
FOLLOWS = _Follows()


@dataclass(slots=True)
class JobPace:
    """A job's step rate over time, read from one rank (`lead`, a process key)."""

    job_id: str
    lead: tuple[str, int, float] | None
    node: str  # the alert's subject: the first lead's node and start time (a job-level alert, pid -1)
    start_time: float
    rules: JobSlowdownRule
    on: bool  # enabled and not silenced for the lead's labels
    first_t: float
    b_end: float = float("-inf")  # where the open bucket ends: a step before it changes nothing
    last: tuple[float, int] | None = None  # (t, step) where the open bucket began
    buckets: deque = field(default_factory=deque)  # (start, end, steps per second)
    state: str | None = None  # FIRING while raised
    baseline: float = 0.0  # the steady rate it fired against
    since: float = 0.0  # when the slow buckets began


@dataclass(slots=True)
class GpuPace:
    """A GPU's clock readings (t, clock-event reason mask), bounded to what a window needs."""

    node: str
    gpu: str
    job_id: str
    index: int | None = None
    readings: deque = field(default_factory=deque)
    temperature_c: float | None = None
    state: str | None = None  # FIRING while this GPU is named from the GPU side alone
    since: float = 0.0
    rules: JobSlowdownRule | None = None  # the rule it fired under (its refreshed figures use it)


class Slowdowns:
    """The rule over every job and GPU."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobPace] = {}
        self.gpus: dict[tuple[str, str], GpuPace] = {}

    # ---- steps ---------------------------------------------------------------------------------

    def step(self, p: Any, t: float, step: int, cause_of: CauseOf) -> list[AlertEvent]:
        """A step of a process whose `pace` asks (its bucket ended, or it has not said whether it leads)."""
        pace = p.pace
        if pace is UNSET:
            pace = self._join(p, t)
            if pace is None:
                return []
        return self._roll(pace, t, step, cause_of)

    def _join(self, p: Any, t: float) -> JobPace | None:
        if not p.job_id:
            p.pace = FOLLOWS
            return None
        pace = self.jobs.get(p.job_id)
        key = (p.node, p.pid, p.start_time)
        r = p.rules.job_slowdown
        on = r.enabled and _RULE not in p.silenced
        if pace is None:
            pace = self.jobs[p.job_id] = JobPace(p.job_id, key, p.node, p.start_time, r, on, t)
        elif pace.lead is not None and pace.lead != key:
            p.pace = FOLLOWS
            return None
        else:  # the rank it read is gone: this one goes on where it left off (the job's step is one count)
            pace.lead, pace.rules, pace.on, pace.last = key, r, on, None
        p.pace = pace
        return pace

    def lead_gone(self, job_id: str, key: tuple[str, int, float], others: list[Any]) -> None:
        """The process `key` is gone: where it led its job's pace, the job's next rank that steps takes over."""
        pace = self.jobs.get(job_id)
        if pace is None or pace.lead != key:
            return
        pace.lead = None
        for p in others:
            p.pace = UNSET

    def _roll(self, pace: JobPace, t: float, step: int, cause_of: CauseOf) -> list[AlertEvent]:
        r = pace.rules
        pace.b_end = t + max(r.bucket_s, 1.0)
        last, pace.last = pace.last, (t, step)
        if last is None or step < last[1] or t <= last[0]:
            return []  # the first reading, or the steps began again (a restart from a checkpoint)
        pace.buckets.append((last[0], t, (step - last[1]) / (t - last[0])))
        keep = t - r.for_s - r.baseline_s - 2 * r.bucket_s
        while pace.buckets and pace.buckets[0][1] < keep:
            pace.buckets.popleft()
        if not pace.on:
            return []
        if pace.state == FIRING:
            return self._maybe_resolve(pace, t, cause_of)
        return self._maybe_fire(pace, t, cause_of)

    def _maybe_fire(self, pace: JobPace, t: float, cause_of: CauseOf) -> list[AlertEvent]:
        r = pace.rules
        cut = t - r.for_s
        win = [b for b in pace.buckets if b[1] > cut]
        span = sum(b[1] - b[0] for b in win)
        if span < 0.9 * r.for_s:
            return []
        base = [b[2] for b in pace.buckets if b[1] <= cut and b[0] >= pace.first_t + r.warmup_s]
        if len(base) * r.bucket_s < r.baseline_s / 2:
            return []
        baseline = median(base)
        limit = (1.0 - r.drop_percent / 100.0) * baseline
        steps = sum((b[1] - b[0]) * b[2] for b in win)
        low = [b for b in win if b[2] <= limit]
        if baseline <= 0 or steps / span > limit or len(low) < r.low_fraction * len(win):
            return []
        if win[-1][2] <= 0 or 2 * sum(b[2] <= 0 for b in win) > len(win):
            return []  # steps that stopped (now, or for most of the window) are training_stall's: a hang, not slow
        since = low[0][0]
        for b in reversed([b for b in pace.buckets if b[1] <= low[0][0]]):  # the fall may have begun earlier
            if b[2] > limit:
                break
            since = b[0]
        pace.state, pace.baseline, pace.since = FIRING, baseline, since
        return [self._event(pace, t, FIRING, cause_of)]

    def _maybe_resolve(self, pace: JobPace, t: float, cause_of: CauseOf) -> list[AlertEvent]:
        r = pace.rules
        recent = self._recent(pace)
        if recent is None or recent < (1.0 - r.drop_percent / 200.0) * pace.baseline:
            return []
        pace.state = None
        return [self._event(pace, t, RESOLVED, cause_of)]

    def _recent(self, pace: JobPace) -> float | None:
        """The median rate of the last half window's buckets (what a recovery is judged on), None: too few."""
        k = max(2, round(pace.rules.for_s / max(pace.rules.bucket_s, 1.0) / 2))
        recent = [b[2] for b in list(pace.buckets)[-k:]]
        return median(recent) if len(recent) == k else None

    def _rate(self, pace: JobPace, t: float) -> float | None:
        """The rate over the last window as the alert says it: its buckets' median, which a checkpoint's
        pause in it does not move."""
        win = [b[2] for b in pace.buckets if b[1] > t - pace.rules.for_s]
        return median(win) if win else None

    def _event(self, pace: JobPace, t: float, state: str, cause_of: CauseOf, ended: bool = False) -> AlertEvent:
        rate = self._rate(pace, t) if state != RESOLVED or ended else self._recent(pace)
        drop = 1.0 - rate / pace.baseline if rate is not None and pace.baseline > 0 else None
        figures: dict[str, Any] = {"since": round(pace.since, 1), "slow_for_s": round(t - pace.since, 1),
                                   "rate_per_s": None if rate is None else round(rate, 4),
                                   "baseline_per_s": round(pace.baseline, 4), "unit": "steps",
                                   "drop_percent": None if drop is None else round(100 * drop, 1)}
        if state == RESOLVED and not ended:
            desc = (f"Job {pace.job_id} is back to speed: {_rate(rate)} against a steady "
                    f"{_rate(pace.baseline)}, after {duration(t - pace.since)} slower")
        else:
            desc = (f"Job {pace.job_id} runs {100 * (drop or 0):.0f} % slower than it did: {_rate(rate)} for "
                    f"{duration(t - pace.since)}, against a steady {_rate(pace.baseline)}")
            cause = cause_of(pace.job_id, pace.since, t)
            desc += f"; likely cause: {cause.text}" if cause.kind != "none" else f"; {cause.text}"
            figures.update(cause.figures)
        if ended:
            desc += f"; {ENDED_WHILE_FIRING}: job {pace.job_id} ended"
            figures["ended_while_firing"] = True
        return AlertEvent(t=t, rule=_RULE, state=state, severity=pace.rules.severity, node=pace.node,
                          job_id=pace.job_id, pid=-1, start_time=pace.start_time, description=desc, figures=figures)

    # ---- GPUs ----------------------------------------------------------------------------------

    def clocks(self, obs: GpuClockObservation, rules: tuple[JobSlowdownRule, bool] | None,
               ranks_of: RanksOf) -> list[AlertEvent]:
        """A GPU's clock-event reasons and temperature (the health counters' cadence).

        Args:
            obs: The reading.
            rules: The rule for the GPU's job and whether it is on there (enabled, not silenced); None: the
                job has no process the engine knows, or the GPU no job.
            ranks_of: The ranks using each GPU of a job.
        """
        gkey = (obs.node, obs.gpu)
        g = self.gpus.get(gkey)
        out: list[AlertEvent] = []
        if g is None or g.job_id != obs.job_id:
            if g is not None:
                out += self._gpu_resolve(g, obs.t, "allocation changed")
            g = self.gpus[gkey] = GpuPace(obs.node, obs.gpu, obs.job_id, obs.index)
        if obs.reasons is not None:
            g.readings.append((obs.t, obs.reasons))
        if obs.temperature_c is not None:
            g.temperature_c = obs.temperature_c
        if rules is None or not obs.job_id:
            return out
        r, on = rules
        while g.readings and g.readings[0][0] < obs.t - 2 * r.for_s:
            g.readings.popleft()
        if not on or obs.job_id in self.jobs:  # a job that reports steps is judged by them
            return out
        return out + self._gpu_side(obs.job_id, obs.t, r, ranks_of)

    def gpu_figures(self, job_id: str, start: float, end: float, ranks_of: RanksOf
                    ) -> list[GpuPaceFigures]:
        """The job's GPUs with their shares of [start, end] held down and capped, where read over most of it."""
        out = []
        ranks = ranks_of(job_id)
        for g in self.gpus.values():
            if g.job_id != job_id:
                continue
            slowed, covered, seen = throttle_share(g.readings, start, end, _SLOWING)
            capped = throttle_share(g.readings, start, end, POWER_CAP)[0]
            read = covered >= 0.5 * (end - start)
            out.append(GpuPaceFigures(g.node, g.gpu, g.index, ranks.get((g.node, g.gpu)), slowed if read else None,
                                      seen, capped if read else None, g.temperature_c))
        return out

    def _gpu_side(self, job_id: str, t: float, r: JobSlowdownRule, ranks_of: RanksOf
                  ) -> list[AlertEvent]:
        """A job without steps: one GPU held down for most of the window while its others ran free."""
        figs = [f for f in self.gpu_figures(job_id, t - r.for_s, t, ranks_of) if f.slowed_share is not None]
        # without steps to say the job is slower, the GPU must be held down for most of the window (twice the
        # share that names a cause), as gpu_throttle asks: a few minutes at a limit once is no slow job
        cause = gpu_cause(figs, min(1.0, 2 * r.gpu_share)) if len(figs) >= 2 else None
        named = cause.figures["cause_gpu"] if cause is not None and cause.kind == "gpu_clocks" else None
        out: list[AlertEvent] = []
        for g in [g for g in self.gpus.values() if g.job_id == job_id]:
            if g.state == FIRING and g.gpu != named:
                out += self._gpu_resolve(g, t, "its clocks run free again")
            elif g.state is None and g.gpu == named and cause is not None:
                g.state, g.since, g.rules = FIRING, t - r.for_s, r
                out.append(self._gpu_event(g, t, FIRING, r, cause))
        return out

    def _gpu_event(self, g: GpuPace, t: float, state: str, r: JobSlowdownRule, cause: Cause) -> AlertEvent:
        desc = (f"Job {g.job_id} runs at the pace of its slowest GPU: {cause.text} (no training progress "
                f"reported: judged from the GPUs alone)")
        return AlertEvent(t=t, rule=_RULE, state=state, severity=r.severity, node=g.node, job_id=g.job_id,
                          gpu=g.gpu, rank=cause.figures.get("cause_rank"), description=desc,
                          figures={"since": round(g.since, 1), "slow_for_s": round(t - g.since, 1), **cause.figures})

    def _gpu_resolve(self, g: GpuPace, t: float, why: str) -> list[AlertEvent]:
        if g.state is None:
            return []
        g.state = None
        return [AlertEvent(t=t, rule=_RULE, state=RESOLVED, severity="warning", node=g.node, job_id=g.job_id,
                           gpu=g.gpu, description=f"Job {g.job_id}: GPU {g.gpu} on {g.node}: {why}")]

    # ---- the alerts held -----------------------------------------------------------------------

    def refresh(self, cause_of: CauseOf, ranks_of: RanksOf) -> list[AlertEvent]:
        """Every alert raised, its figures as of the latest readings."""
        out = [self._event(p, p.buckets[-1][1], FIRING, cause_of) for p in self.jobs.values()
               if p.state == FIRING and p.buckets]
        for g in self.gpus.values():
            if g.state == FIRING and g.readings and g.rules is not None:
                t = g.readings[-1][0]
                figs = self.gpu_figures(g.job_id, t - g.rules.for_s, t, ranks_of)
                cause = gpu_cause([f for f in figs if f.slowed_share is not None], min(1.0, 2 * g.rules.gpu_share))
                if cause is not None and cause.figures.get("cause_gpu") == g.gpu:
                    out.append(self._gpu_event(g, t, FIRING, g.rules, cause))
        return out

    def forget_job(self, job_id: str, t: float, cause_of: CauseOf) -> list[AlertEvent]:
        """The job ended: its alerts resolve (a firing one with its last figures) and its state goes."""
        out: list[AlertEvent] = []
        pace = self.jobs.pop(job_id, None)
        if pace is not None and pace.state == FIRING:
            out.append(self._event(pace, t, RESOLVED, cause_of, ended=True))
        for gkey, g in list(self.gpus.items()):
            if g.job_id == job_id:
                out += self._gpu_resolve(g, t, f"job {job_id} ended")
                del self.gpus[gkey]
        return out


def _rate(per_s: float | None) -> str:
    if per_s is None:
        return "no steps"
    return f"{per_s:.3g} steps/s" if per_s >= 0.1 else f"{per_s * 60:.3g} steps/min"
