"""Generated traces of training jobs that slow down, with and without a culprit, and of look-alikes that are
not faults: what the job_slowdown tests and bench/bench_slowdown.py run the engine over.

A job of `ranks` ranks (two a node, one GPU each) steps together at a noisy rate, with a checkpoint save every
30 minutes (the steps stop for two); its processes are seen every 5 s, its GPUs' utilisation and power every
5 s, their clock-event reasons and temperature every 30 s (the health counters' cadence). A slowdown lowers
the job's rate by `drop` from `start_s` (to `end_s`), and its culprit shows where the field says it would.
Each health read also carries the GPU's cumulative counters as NVML keeps them: violation time (thermal, power)
and PCIe replays, NVLink errors, advanced every poll with what the GPU went through.

A job may count its work beside its steps (`work`: tokens or samples, what clusterwatch.train reports), every
`work_every_s`, on all its ranks or some (`work_ranks`): then a batch that doubles (`batch_doubles`: steps at
half the rate, twice the tokens a step) or a sequence that halves (`shorter`: the steps at speed, half the
tokens a step) changes the job's steps/s and tokens/s apart.
"""
from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from clusterwatch.collector.rules import Engine, RuleSet
from clusterwatch.collector.rules.causes import Cause, held_rank
from clusterwatch.collector.rules.model import AlertEvent, GpuClockObservation, GpuObservation, ProcessObservation

POLL_S = 5.0
HEALTH_S = 30.0
JOB = "slow-1"
#: What each culprit is named as in the alert's figures ("cause"), and the look-alikes.
CULPRITS = ("gpu_clocks", "gpu_power_cap", "gpu_hot", "gpu_link_errors", "odd_rank", "process_held", "none")
#: (culprit, variant): a culprit drawn another way, or a look-alike of one. thermal_cycles: the GPU held thermally
#: 18 s of every 30, always between two health reads (only NVML's violation time sees it); links_together: every
#: GPU's NVLink errors climbing alike while the job is slow (the fabric, not a GPU); link_burst_before: one GPU's
#: 50,000 PCIe replays once, an hour before the slowdown, flat since.
CULPRIT_VARIANTS = (("gpu_clocks", "thermal_cycles"), ("none", "links_together"), ("none", "link_burst_before"))
LOOKALIKES = ("eval", "checkpoint", "loader_warmup", "lr_warmup", "noise")
#: Look-alikes that change the work a step does: quiet where the job counts its work, not where it counts steps.
WORK_LOOKALIKES = ("batch_doubles",)
TOKENS_PER_STEP = 32768.0  # 8 sequences of 4096 tokens
GPU_ONLY_LOOKALIKES = ("gpus_capped_alike", "brief_throttle")


@dataclass(frozen=True)
class Scenario:
    """One generated job.

    Attributes:
        name: For tables and test ids.
        culprit: One of CULPRITS for a slowdown; "" for a look-alike.
        lookalike: One of LOOKALIKES (or GPU_ONLY_LOOKALIKES), "" for a slowdown.
        drop: The share of the rate a slowdown takes.
        start_s, end_s: When the slowdown begins and ends (None: it lasts).
        duration_s: How long the trace runs.
        ranks: Ranks (one GPU each, two a node).
        culprit_rank: The rank the culprit is on.
        steps: Whether the job reports steps (clusterwatch.train); without, only the GPU side can tell.
        seed: The noise's seed.
        variant: One of CULPRIT_VARIANTS' for its culprit, "" for the culprit's plain draw.
    """

    name: str
    culprit: str = ""
    lookalike: str = ""
    drop: float = 0.3
    start_s: float = 5400.0
    end_s: float | None = None
    duration_s: float = 9000.0
    ranks: int = 4
    culprit_rank: int = 2
    steps: bool = True
    seed: int = 0
    rate: float = 2.0  # steps per second at speed
    work: str = ""  # "tokens" or "samples": the count its ranks report beside their steps ("": none)
    work_every_s: float = POLL_S  # how often a rank reports its count (a framework's log interval)
    work_ranks: tuple[int, ...] | None = None  # the ranks that report it (None: all)
    change_s: float = 4500.0  # when `batch_doubles` or `shorter` changes the work a step does
    variant: str = ""

    @property
    def is_fault(self) -> bool:
        return bool(self.culprit)


def node_of(rank: int) -> str:
    return f"node-{rank // 2}"


def gpu_of(rank: int) -> str:
    return f"GPU-{rank:04d}"


def _multiplier(sc: Scenario, t: float) -> float:
    """The job's rate at `t` as a share of its speed."""
    m = 1.0
    if (t % 1800.0) >= 1680.0:  # a checkpoint save every 30 min: the steps stop for 2 min
        return 0.0
    if sc.lookalike == "eval" and (t % 2700.0) >= 2400.0:  # a 5-minute evaluation every 45 min
        return 0.0
    if sc.lookalike == "checkpoint" and (t % 3600.0) >= 3360.0:  # a long save (4 min) on the hour as well
        return 0.0
    if sc.lookalike == "loader_warmup" and t < 1200.0:  # the data loader fills its workers for 20 min
        m *= 0.3 + 0.7 * t / 1200.0
    if sc.lookalike == "lr_warmup":  # step time grows 25 % over 40 minutes as the warm-up ends (then steady)
        m *= 1.0 - 0.2 * min(1.0, max(0.0, t - 600.0) / 2400.0)
    if sc.lookalike == "batch_doubles" and t >= sc.change_s:
        m *= 0.5
    if sc.culprit and t >= sc.start_s and (sc.end_s is None or t < sc.end_s):
        m *= 1.0 - sc.drop
    return m


def _work_per_step(sc: Scenario, t: float) -> float:
    """The tokens (or samples: 8 a step at first) a step trains on at `t`."""
    per_step = TOKENS_PER_STEP if sc.work == "tokens" else 8.0
    if t >= sc.change_s and sc.lookalike == "batch_doubles":
        return 2 * per_step
    if t >= sc.change_s and sc.lookalike == "shorter":
        return per_step / 2
    return per_step


def _slow(sc: Scenario, t: float) -> bool:
    return bool(sc.culprit) and t >= sc.start_s and (sc.end_s is None or t < sc.end_s)


@dataclass
class Trace:
    """A generated trace: observations in time order, and the host side a live collector would read."""

    scenario: Scenario
    observations: list[Any] = field(default_factory=list)

    def host(self, job_id: str, t: float) -> list[Cause]:
        """The host source of the live collector, as this job's ranks would show it."""
        sc = self.scenario
        if sc.culprit == "process_held" and _slow(sc, t) and t - sc.start_s >= 60.0:
            r = sc.culprit_rank
            return [held_rank("D", r, node_of(r), 1000 + r, t - sc.start_s, "nfs_wait")]
        return []

    def run(self, rules: RuleSet) -> list[AlertEvent]:
        """Every alert event of a fresh engine over the trace."""
        eng = Engine(rules, host=self.host)
        out: list[AlertEvent] = []
        for o in self.observations:
            if isinstance(o, ProcessObservation):
                out += eng.observe(o)
            elif isinstance(o, GpuObservation):
                out += eng.observe_gpu(o)
            else:
                out += eng.observe_gpu_clocks(o)
        out += eng.forget_job(JOB, self.observations[-1].t + 1.0)
        return out


def generate(sc: Scenario) -> Trace:
    """The scenario's trace."""
    rnd = random.Random(sc.seed)
    crnd = random.Random(sc.seed + 7919)  # the counters' own draws: the other draws stay what they were without
    counters = [[0.0, 0.0, 0, 0] for _ in range(sc.ranks)]  # per rank: thermal s, power s, PCIe, NVLink errors
    obs: list[Any] = []
    progress = work = 0.0
    held: float | None = None  # the count as last reported
    t = 0.0
    while t <= sc.duration_s:
        slow = _slow(sc, t)
        steps = sc.rate * _multiplier(sc, t) * POLL_S * max(0.0, rnd.gauss(1.0, 0.08))
        progress += steps
        work += steps * _work_per_step(sc, t)
        if sc.work and t % sc.work_every_s < POLL_S:
            held = round(work)
        health = t % HEALTH_S == 0.0
        for r in range(sc.ranks):
            count = held if sc.work_ranks is None or r in sc.work_ranks else None
            util, power = rnd.gauss(95, 2), rnd.gauss(600, 15)
            if slow and sc.culprit == "odd_rank":
                util, power = (rnd.gauss(45, 3), rnd.gauss(350, 10)) if r == sc.culprit_rank \
                    else (rnd.gauss(98, 1), rnd.gauss(420, 10))
            obs.append(ProcessObservation(t=t, node=node_of(r), job_id=JOB, pid=1000 + r, start_time=1.0,
                                          gpu=gpu_of(r), rank=r, user="ana", command="python train.py",
                                          job_name="llm", gpu_util=min(100.0, util),
                                          cpu_percent=rnd.gauss(110, 5),
                                          step=int(progress) if sc.steps else None,
                                          tokens=count if sc.work == "tokens" else None,
                                          samples=count if sc.work == "samples" else None))
            obs.append(GpuObservation(t, node_of(r), gpu_of(r), JOB, min(100.0, util), 1, r, power))
            c = counters[r]
            _advance(sc, crnd, t, r, c)
            if health:
                obs.append(GpuClockObservation(t, node_of(r), gpu_of(r), JOB, _reasons(sc, rnd, t, r),
                                               _temperature(sc, rnd, t, r), r, {"thermal": c[0], "power": c[1]},
                                               c[2], c[3]))
        t += POLL_S
    return Trace(sc, obs)


def _reasons(sc: Scenario, rnd: random.Random, t: float, r: int) -> int:
    """The GPU's clock-event reasons: now and then any GPU touches its power cap for a moment."""
    mask = 0x4 if rnd.random() < 0.02 else 0
    if r == sc.culprit_rank and _slow(sc, t):
        if sc.culprit == "gpu_clocks" and sc.variant != "thermal_cycles" and rnd.random() < 0.8:
            mask |= 0x8
        if sc.culprit == "gpu_power_cap" and rnd.random() < 0.8:
            mask |= 0x4
    if r == sc.culprit_rank and sc.lookalike == "brief_throttle" and 3000.0 <= t < 3180.0:
        mask |= 0x8  # three minutes held down, once: not a slow job
    if sc.lookalike == "gpus_capped_alike" and (t % 600.0) < 300.0:
        mask |= 0x4  # every GPU at its power cap together: the job's work, not one GPU's fault
    return mask


def _advance(sc: Scenario, rnd: random.Random, t: float, r: int, c: list) -> None:
    """The GPU's counters over the poll before `t`: [thermal violation s, power violation s, PCIe replays, NVLink
    errors]. Any GPU now and then touches its power cap (as _reasons draws it) and corrects a replay."""
    culprit = r == sc.culprit_rank and _slow(sc, t)
    capped = 0.02
    if culprit and sc.culprit == "gpu_power_cap":
        capped = 0.8
    if sc.lookalike == "gpus_capped_alike" and (t % 600.0) < 300.0:
        capped = 1.0
    c[1] += capped * POLL_S
    if culprit and sc.variant == "thermal_cycles":
        c[0] += 0.6 * POLL_S
    c[2] += int(rnd.random() < 0.01)
    if culprit and sc.culprit == "gpu_link_errors":  # a degraded link: PCIe on even seeds, NVLink on odd
        c[2 + sc.seed % 2] += rnd.randint(20, 80)
    if sc.variant == "links_together" and _slow(sc, t):
        c[3] += rnd.randint(20, 80)
    if sc.variant == "link_burst_before" and r == sc.culprit_rank and t == sc.start_s - 3600.0:
        c[2] += 50_000


def _temperature(sc: Scenario, rnd: random.Random, t: float, r: int) -> float:
    hot = sc.culprit == "gpu_hot" and r == sc.culprit_rank and _slow(sc, t)
    return round(rnd.gauss(88 if hot else 66, 1.5), 1)


def scenarios(seeds: int = 3) -> Iterator[Scenario]:
    """The bench's grid: every culprit at three drops, the look-alikes, the GPU side alone; `seeds` each."""
    for seed in range(seeds):
        for culprit in CULPRITS:
            for drop in (0.25, 0.35, 0.5):
                yield Scenario(f"{culprit}-{int(drop * 100)}-s{seed}", culprit=culprit, drop=drop, seed=seed,
                               culprit_rank=seed % 4)
        for culprit, variant in CULPRIT_VARIANTS:
            yield Scenario(f"{culprit}-{variant}-s{seed}", culprit=culprit, variant=variant, drop=0.35, seed=seed,
                           culprit_rank=(seed + 2) % 4)
        yield Scenario(f"recovers-s{seed}", culprit="gpu_clocks", drop=0.35, end_s=7800.0, seed=seed)
        for look in LOOKALIKES:
            yield Scenario(f"{look}-s{seed}", lookalike=look, seed=seed)
        yield Scenario(f"gpu-only-clocks-s{seed}", culprit="gpu_clocks", drop=0.35, steps=False, seed=seed,
                       culprit_rank=(seed + 1) % 4)
        for look in GPU_ONLY_LOOKALIKES:
            yield Scenario(f"gpu-only-{look}-s{seed}", lookalike=look, steps=False, seed=seed)
