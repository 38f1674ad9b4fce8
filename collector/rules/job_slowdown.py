"""job_slowdown: a job slower than it was, and who makes it so.

A job's throughput is the step rate its training process reports (clusterwatch.train), read from one rank:
the job's ranks step together, so one rank's rate is the job's. Where that rank also counts its work (tokens or
samples trained on, collector/state/work_counts.py), the job is judged in that unit instead: a job that doubles
its batch halves its steps/s and keeps its tokens/s, and one that halves its sequences keeps its steps/s and
loses tokens/s. A count arrives when the process reports it (often every few hundred steps, with the
framework's logs): the work a step does is measured between the polls that first show two counts, and each
bucket's steps/s times the work a step did then is its rate in that unit, judged up to the latest count (so
an evaluation phase or a checkpoint save between two counts stays where its steps stopped).

The rate, in either unit, is cut into buckets (`bucket_s`); the job's steady baseline is the median bucket
rate over `baseline_s` before the window judged, leaving out the job's first `warmup_s` (data-loader and
compile warm-up). The alert fires when, over the last `for_s`, the rate fell `drop_percent` below that
baseline, and at least `low_fraction` of the window's buckets did: an evaluation phase or a checkpoint save
that holds the steps for minutes leaves most buckets at speed, and a slow drift (a learning-rate or
sequence-length warm-up changing the step time) moves the baseline with it. Steps that stop altogether are
training_stall's. It resolves once the rate is back within half the drop of the baseline it fired against.

A job without training reports is judged from its GPUs alone: one GPU whose clocks were held down (NVML's
clock-event reasons, read with the health counters) for `gpu_share` of the window while the job's other
GPUs ran free makes the whole job run at its pace.

The alert names the likely cause (slowdown_causes.py). State: a JobPace per job (the one rank it reads,
`lead`, carries it on its process record as `pace`; a rank that counts its work takes the lead from one that
does not), and a GpuPace per GPU with its clock readings.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from clusterwatch.humanize import duration

from .causes import Cause
from .config import JobSlowdownRule
from .model import FIRING, RESOLVED, AlertEvent, GpuClockObservation, Rule
from .process import ENDED_WHILE_FIRING
from .slowdown_causes import GpuMark, GpuPaceFigures, gpu_cause, pace_figures

NAMES = (Rule.JOB_SLOWDOWN,)
_RULE = Rule.JOB_SLOWDOWN.value
#: The units a job's throughput is judged in: its steps, else the work its lead counts (work_counts.py).
STEPS, TOKENS, SAMPLES = "steps", "tokens", "samples"
#: Past any real run (the largest train on ~1e14 tokens): a count beyond it is a unit mix-up, not work done.
MAX_COUNT = 1e18

#: (job id, since, t) → the slowdown's likely cause (the engine's: its GPUs, ranks and the host source).
CauseOf = Callable[[str, float, float], Cause]
#: job id → (node, GPU UUID) → the rank whose process uses that GPU (the engine's, from the job's processes).
RanksOf = Callable[[str], Mapping[tuple[str, str], "int | None"]]


class _Unset:
    """A process's `pace` before it says whether it leads its job's (b_end -inf: its next step asks)."""

    b_end = float("-inf")
    work = None


class _Follows:
    """A process's `pace` when another rank of its job is read (b_end +inf: its steps cost one comparison; a
    count of work it reports asks, to take the lead from a rank that counts none)."""

    b_end = float("inf")
    work = None


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
    judged: str = STEPS  # the unit it fired in
    work: float | None = None  # the lead's count as last seen (tokens, else samples): the engine asks when it moves
    unit: str = ""  # the unit of `units`: "tokens" or "samples" once the lead counts its work
    seen: float | None = None  # the lead's count where it last changed
    # (t, count, step, fresh) where a count was first seen, at least a bucket apart; fresh: it begins a new run
    # (a restart that counts from 0 again, another rank's count), so the span before it measures nothing
    counts: deque = field(default_factory=deque)


@dataclass(slots=True)
class GpuPace:
    """A GPU's clock readings (t, clock-event reason mask) and its GpuMarks (temperature, violation time, link
    counters), bounded to what a window needs."""

    node: str
    gpu: str
    job_id: str
    index: int | None = None
    readings: deque = field(default_factory=deque)
    marks: deque = field(default_factory=deque)
    temperature_c: float | None = None
    state: str | None = None  # FIRING while this GPU is named from the GPU side alone
    since: float = 0.0
    rules: JobSlowdownRule | None = None  # the rule it fired under (its refreshed figures use it)


class Slowdowns:
    """The rule over every job and GPU."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobPace] = {}
        self.gpus: dict[tuple[str, str], GpuPace] = {}
        self.gpu_judged: dict[str, float] = {}  # job id → when its GPUs were last judged alone (_gpu_side)

    # ---- steps and work -----------------------------------------------------------------------

    def step(self, p: Any, t: float, step: int, tokens: float | None, samples: float | None,
             cause_of: CauseOf) -> list[AlertEvent]:
        """A step of a process whose `pace` asks: its bucket ended, its count of work moved, or it has not said
        whether it leads its job's."""
        pace = p.pace
        if pace is UNSET or pace is FOLLOWS:
            pace = self._join(p, t, _counted(tokens, samples)[0])
            if pace is None:
                return []
        elif pace.lead != (p.node, p.pid, p.start_time):
            p.pace = FOLLOWS  # a rank that counts its work took the lead from this one
            return []
        self._count(pace, t, step, tokens, samples)
        if t < pace.b_end:
            return []
        return self._roll(pace, t, step, cause_of)

    def _join(self, p: Any, t: float, unit: str) -> JobPace | None:
        if not p.job_id:
            p.pace = FOLLOWS
            return None
        pace = self.jobs.get(p.job_id)
        key = (p.node, p.pid, p.start_time)
        r = p.rules.job_slowdown
        on = r.enabled and _RULE not in p.silenced
        if pace is None:
            pace = self.jobs[p.job_id] = JobPace(p.job_id, key, p.node, p.start_time, r, on, t)
        elif pace.lead is not None and pace.lead != key and not (unit and not pace.unit):
            p.pace = FOLLOWS
            return None
        else:  # the rank it read is gone, or counts no work where this one does: this one goes on where it left
            # off (the job's step is one count; its work is counted afresh from this rank's count)
            pace.lead, pace.rules, pace.on, pace.last, pace.seen = key, r, on, None, None
            pace.b_end = float("-inf")
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

    def _count(self, pace: JobPace, t: float, step: int, tokens: float | None, samples: float | None) -> None:
        """The lead's count of work, kept where it was first seen (a bucket apart at least: a count reported
        every step gives one a bucket, one reported every few hundred steps one each report)."""
        pace.work = tokens if tokens is not None else samples
        unit, count = _counted(tokens, samples)
        if not unit or (unit == SAMPLES and pace.unit == TOKENS) or count == pace.seen:
            return  # none, not the unit it judges (a lead that counts tokens judges them), or not new
        if unit != pace.unit:  # it begins to count (tokens where samples were): judged afresh in that unit
            if pace.state == FIRING and pace.judged == pace.unit:
                return  # not while an alert judged in the unit it counted stands
            pace.unit, pace.counts = unit, deque()
        fresh = pace.seen is None or count < pace.seen  # a run begins: the lead's first, a restart, another rank
        pace.seen = count
        c = pace.counts
        if not fresh and c and t - c[-1][0] < pace.rules.bucket_s:
            return
        c.append((t, count, step, fresh))
        keep = _kept_from(t, pace.rules)
        while c and c[0][0] < keep:
            c.popleft()

    def _roll(self, pace: JobPace, t: float, step: int, cause_of: CauseOf) -> list[AlertEvent]:
        r = pace.rules
        pace.b_end = t + max(r.bucket_s, 1.0)
        last, pace.last = pace.last, (t, step)
        if last is None or step < last[1] or t <= last[0]:
            return []  # the first reading, or the steps began again (a restart from a checkpoint)
        pace.buckets.append((last[0], t, (step - last[1]) / (t - last[0])))
        keep = _kept_from(t, r)
        while pace.buckets and pace.buckets[0][1] < keep:
            pace.buckets.popleft()
        if not pace.on:
            return []
        if pace.state == FIRING:
            return self._maybe_resolve(pace, t, cause_of)
        return self._maybe_fire(pace, t, cause_of)

    def _series(self, pace: JobPace, unit: str) -> tuple[Sequence[tuple[float, float, float]], float | None]:
        """The buckets of `unit` and where they end (None: none yet): the steps', or in the unit the lead counts,
        each step bucket's rate times the work a step did over the span between two counts it lies in."""
        if unit == STEPS:
            return pace.buckets, pace.buckets[-1][1] if pace.buckets else None
        c = pace.counts
        if unit != pace.unit or len(c) < 2:
            return (), None
        out = []
        j, n = 0, len(c)
        for b0, b1, rate in pace.buckets:
            mid = (b0 + b1) / 2
            while j + 1 < n and c[j + 1][0] < mid:
                j += 1
            if j + 1 == n:
                break  # past the latest count: the work its steps did is not known yet
            (t0, c0, s0, _), (_, c1, s1, fresh) = c[j], c[j + 1]
            if mid >= t0 and not fresh and s1 > s0:
                out.append((b0, b1, rate * (c1 - c0) / (s1 - s0)))
        return out, c[-1][0]

    def _maybe_fire(self, pace: JobPace, t: float, cause_of: CauseOf) -> list[AlertEvent]:
        r = pace.rules
        unit = pace.unit or STEPS
        buckets, end = self._series(pace, unit)
        if end is not None and t - end > 2 * r.for_s:
            unit, buckets = STEPS, pace.buckets  # its count stopped while its steps go on: judged in steps again
        found = _fall(buckets, t if unit == STEPS else end, r, pace.first_t)
        if found is None:
            return []
        win = [b for b in pace.buckets if b[1] > t - r.for_s]  # the steps, whichever the unit judged
        if not win or win[-1][2] <= 0 or 2 * sum(b[2] <= 0 for b in win) > len(win):
            return []  # steps that stopped (now, or for most of the window) are training_stall's: a hang, not slow
        pace.state, (pace.baseline, pace.since), pace.judged = FIRING, found, unit
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
        recent = [b[2] for b in list(self._series(pace, pace.judged)[0])[-k:]]
        return median(recent) if len(recent) == k else None

    def _rate(self, pace: JobPace, t: float) -> float | None:
        """The rate over the last window as the alert says it: its buckets' median, which a checkpoint's
        pause in it does not move."""
        buckets, end = self._series(pace, pace.judged)
        cut = (t if pace.judged == STEPS else end or t) - pace.rules.for_s
        win = [b[2] for b in buckets if b[1] > cut]
        return median(win) if win else None

    def _event(self, pace: JobPace, t: float, state: str, cause_of: CauseOf, ended: bool = False) -> AlertEvent:
        rate = self._rate(pace, t) if state != RESOLVED or ended else self._recent(pace)
        drop = 1.0 - rate / pace.baseline if rate is not None and pace.baseline > 0 else None
        unit = pace.judged
        figures: dict[str, Any] = {"since": round(pace.since, 1), "slow_for_s": round(t - pace.since, 1),
                                   "rate_per_s": None if rate is None else round(rate, 4),
                                   "baseline_per_s": round(pace.baseline, 4), "unit": unit,
                                   "drop_percent": None if drop is None else round(100 * drop, 1)}
        judged = "" if unit == STEPS else f" in {unit}/s"
        if state == RESOLVED and not ended:
            desc = (f"Job {pace.job_id} is back to speed{judged}: {_rate(rate, unit)} against a steady "
                    f"{_rate(pace.baseline, unit)}, after {duration(t - pace.since)} slower")
        else:
            desc = (f"Job {pace.job_id} runs {100 * (drop or 0):.0f} % slower than it did{judged}: "
                    f"{_rate(rate, unit)} for {duration(t - pace.since)}, against a steady "
                    f"{_rate(pace.baseline, unit)}")
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
        g.marks.append(GpuMark.of(obs.t, obs.temperature_c, obs.violation_s, obs.pcie_replays, obs.nvlink_errors))
        if rules is None or not obs.job_id:
            return out
        r, on = rules
        while g.readings and g.readings[0][0] < obs.t - 2 * r.for_s:
            g.readings.popleft()
        while g.marks and g.marks[0].t < obs.t - 2 * r.for_s:
            g.marks.popleft()
        if not on or obs.job_id in self.jobs:  # a job that reports steps is judged by them
            return out
        # a job's GPUs are read at about the same time: judging all of them at each one's read costs the square of
        # their number; once per twentieth of the window (30 s of the default 10 min) delays an alert by that at most
        if obs.t - self.gpu_judged.get(obs.job_id, float("-inf")) < r.for_s / 20:
            return out
        self.gpu_judged[obs.job_id] = obs.t
        return out + self._gpu_side(obs.job_id, obs.t, r, ranks_of)

    def gpu_figures(self, job_id: str, start: float, end: float, ranks_of: RanksOf
                    ) -> list[GpuPaceFigures]:
        """The job's GPUs with their figures over [start, end] (slowdown_causes.pace_figures)."""
        ranks = ranks_of(job_id)
        return [pace_figures(g.node, g.gpu, g.index, ranks.get((g.node, g.gpu)), g.readings, g.marks, start, end,
                             g.temperature_c) for g in self.gpus.values() if g.job_id == job_id]

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
        self.gpu_judged.pop(job_id, None)
        pace = self.jobs.pop(job_id, None)
        if pace is not None and pace.state == FIRING:
            out.append(self._event(pace, t, RESOLVED, cause_of, ended=True))
        for gkey, g in list(self.gpus.items()):
            if g.job_id == job_id:
                out += self._gpu_resolve(g, t, f"job {job_id} ended")
                del self.gpus[gkey]
        return out


def _fall(buckets: Sequence[tuple[float, float, float]], t: float | None, r: JobSlowdownRule, first_t: float
          ) -> tuple[float, float] | None:
    """(baseline, since) where the buckets up to `t` fell `drop_percent` below their steady baseline over the
    last `for_s`, in at least `low_fraction` of them; None where they did not, or cannot yet tell."""
    if t is None:
        return None
    cut = t - r.for_s
    win = [b for b in buckets if b[1] > cut]
    span = sum(b[1] - b[0] for b in win)
    if span < 0.9 * r.for_s:
        return None
    base = [b[2] for b in buckets if b[1] <= cut and b[0] >= first_t + r.warmup_s]
    if len(base) * r.bucket_s < r.baseline_s / 2:
        return None
    baseline = median(base)
    limit = (1.0 - r.drop_percent / 100.0) * baseline
    done = sum((b[1] - b[0]) * b[2] for b in win)
    low = [b for b in win if b[2] <= limit]
    if baseline <= 0 or done / span > limit or len(low) < r.low_fraction * len(win):
        return None
    since = low[0][0]
    for b in reversed([b for b in buckets if b[1] <= low[0][0]]):  # the fall may have begun earlier
        if b[2] > limit:
            break
        since = b[0]
    return baseline, since


def _kept_from(t: float, r: JobSlowdownRule) -> float:
    """Where what a window and its baseline need begins: older buckets and counts go."""
    return t - r.for_s - r.baseline_s - 2 * r.bucket_s


def _counted(tokens: float | None, samples: float | None) -> tuple[str, float]:
    """The unit a lead's counts are judged in and its count: tokens, else samples, where valid (a count is a
    finite number from 0 to MAX_COUNT; a trace may hold anything); ("", 0.0): none."""
    for unit, count in ((TOKENS, tokens), (SAMPLES, samples)):
        if count.__class__ in (int, float) and 0 <= count <= MAX_COUNT:  # NaN fails both comparisons
            return unit, float(count)
    return "", 0.0


def _rate(per_s: float | None, unit: str = STEPS) -> str:
    if per_s is None:
        return f"no {unit}"
    if unit != STEPS:
        return f"{_compact(per_s)} {unit}/s"
    return f"{per_s:.3g} steps/s" if per_s >= 0.1 else f"{per_s * 60:.3g} steps/min"


def _compact(x: float) -> str:
    """Three figures with a k, M or G: 41.2k, 1.35M."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"
