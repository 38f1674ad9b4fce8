"""Who makes a job slow: what `job_slowdown` names when one of the job's GPUs or ranks stands out.

Pure, like causes.py (which names a stall's cause): the engine hands in each of the job's GPUs with what it
read of them over the slow window, and each rank with its latest figures; what the engine cannot know (a
rank's host side: its process in D, its CPU) comes as causes from the caller (`HostSource`).

Most specific first, as an operator would look:
1. a GPU whose clocks were held down (hardware slowdown, thermal, power brake) for a share of the window while
   the job's other GPUs ran free: every collective waits for it. The share is NVML's violation time where the
   GPU counts it (its rise over the window: exact, where clock-event reasons read every 30 s miss what happens
   between two reads), the reasons' sampled share otherwise;
2. a GPU capped by software power limits while the others are not, or clearly hotter than all the others
   (its temperature over the window's last minutes: one reading each is noise);
3. a GPU whose PCIe replays or NVLink errors climbed over the window while the others' stood still: a degraded
   link that every collective waits for;
4. a rank whose GPU works less while the others wait in the collective (or the one busy while they idle):
   its GPU's utilisation or power apart from the others' (causes.odd_rank_out's test);
5. a rank's host side: its process held in D, or its CPU saturated (the caller's causes);
6. none of these: "no rank stands out", said as such (a slowdown of the whole job: the data, the
   network, the storage, another job on the fabric).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median
from typing import Any, NamedTuple

from ..health.decisions import throttle_share  # the share of a span a GPU's readings show a reason bit held
from .causes import Cause, RankFigures, odd_rank_out

__all__ = ["GpuMark", "GpuPaceFigures", "HostSource", "NO_CULPRIT", "POWER_CAP", "SLOWING_REASONS", "counter_rise",
           "pace_figures", "slowdown_cause"]

#: NVML's clock-event reasons that lower a GPU's clocks below what its work asks (nvmlClocksEventReason*):
#: hardware slowdown, software thermal, hardware thermal, hardware power brake (health/decisions.py's
#: THROTTLE_REASONS), and the software power cap apart: a GPU at its power limit runs its clocks down too.
SLOWING_REASONS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                   0x80: "hardware power brake"}
POWER_CAP = 0x4
_SLOWING = sum(SLOWING_REASONS)
#: NVML's violation policies (the agent's VIOLATION_POLICIES names) whose time counts as held down, and the reason
#: bits that time covers: the thermal slowdowns. The hardware slowdown (0x8) has no policy of its own and the power
#: policy mixes the power brake (0x80) with the cap, so those two keep their sampled share beside the counted one.
HELD_POLICIES = ("thermal", "board_limit", "reliability")
HELD_COUNTED = 0x20 | 0x40
#: The policy whose time counts as sitting at the power cap.
CAP_POLICY = "power"
#: A GPU's link errors (PCIe replays and NVLink errors) stand out from this many a minute over the window (DCGM's
#: PCIe replay limit, as gpu_link_errors has it) while each other GPU of the job rose at most LINK_OTHERS of its count:
#: errors climbing on every GPU together are the fabric's, not one GPU's.
LINK_ERRORS_PER_MIN = 8.0
LINK_OTHERS = 0.1
#: A GPU held down at least this share of the window stands out when every other GPU of the job was held down
#: at most OTHERS_SHARE of it (a GPU briefly at its limit now and then is ordinary).
OTHERS_SHARE = 0.1
#: A GPU this many degrees above every other GPU of the job is the hot one: GPUs of a node run some degrees apart by
#: their place in the airflow, a GPU this far above all of them does not. Each GPU's temperature is the median of
#: its reads over the window's last HOT_RECENT_S (ten at the health counters' 30 s): one read each is noise enough
#: to hide it, and the whole window's mean, where the slowdown began within it, dilutes the heat with the time before.
HOT_APART_C = 12.0
HOT_RECENT_S = 300.0

#: (job id, t) → the host-side causes the caller knows of on the job's ranks (held in D, CPU saturated).
HostSource = Callable[[str, float], Sequence[Cause]]

NO_CULPRIT = Cause("none", "no rank stands out (every GPU and rank alike: the whole job is slower; its data, "
                   "network or storage?)", {"cause": "none"})


@dataclass(frozen=True, slots=True)
class GpuPaceFigures:
    """One GPU of a slow job as the engine read it over the window.

    Attributes:
        node, gpu, index: The GPU (UUID; index for display).
        rank: The rank whose process uses it, where known.
        slowed_share: Share of the window its clocks were held down (SLOWING_REASONS), None: never read.
        reasons: The SLOWING_REASONS bits seen in the window.
        capped_share: Share of the window it sat at its software power cap, None: never read.
        temperature_c: Its recent temperature (HOT_RECENT_S's median; else its latest), None: unknown.
        counted: Whether the shares came from NVML's violation time rather than the sampled reasons.
        pcie_replays, nvlink_errors: How much those counters rose over the window (NVLink's summed over its
            counters and links), None: not read over it.
        link_s: The seconds the link counters' rise was read over.
    """

    node: str
    gpu: str
    index: int | None = None
    rank: int | None = None
    slowed_share: float | None = None
    reasons: int = 0
    capped_share: float | None = None
    temperature_c: float | None = None
    counted: bool = False
    pcie_replays: int | None = None
    nvlink_errors: int | None = None
    link_s: float = 0.0

    def label(self) -> str:
        whose = f" of rank {self.rank}" if self.rank is not None else ""
        at = self.gpu if self.index is None else f"{self.index} ({self.gpu})"
        return f"GPU {at}{whose} on {self.node}"

    def figures(self, kind: str) -> dict:
        out = {"cause": kind, "cause_node": self.node, "cause_gpu": self.gpu}
        if self.rank is not None:
            out["cause_rank"] = self.rank
        return out


class GpuMark(NamedTuple):
    """A GPU's temperature and cumulative counters at one health read: what job_slowdown keeps of it per read.

    Attributes:
        t: When read.
        temperature_c: Its temperature, None: not read.
        held_s: HELD_POLICIES' violation time summed (seconds since the driver loaded), None: not read.
        capped_s: CAP_POLICY's violation time, None: not read.
        pcie_replays: Its PCIe replay counter, None: not read.
        nvlink_errors: Its NVLink error counters summed over counters and links, None: none read.
    """

    t: float
    temperature_c: float | None = None
    held_s: float | None = None
    capped_s: float | None = None
    pcie_replays: int | None = None
    nvlink_errors: int | None = None

    @classmethod
    def of(cls, t: float, temperature_c: float | None, violation_s: Mapping[str, float] | None,
           pcie_replays: int | None, nvlink_errors: int | None) -> GpuMark:
        """A read's figures, a value that is no count (NaN, infinite, negative) taken as not read.

        Args:
            t: When read.
            temperature_c: The GPU's temperature.
            violation_s: NVML's violation time by policy (the agent's names), None or {}: not read.
            pcie_replays, nvlink_errors: The link error counters (NVLink's summed).
        """
        held = [violation_s[p] for p in HELD_POLICIES if violation_s and p in violation_s]
        return cls(t, _finite(temperature_c), _finite(sum(held)) if held else None,
                   _finite((violation_s or {}).get(CAP_POLICY)), _count(pcie_replays), _count(nvlink_errors))


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 else None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and v >= 0 else None


def counter_rise(points: Sequence[tuple[float, Any]], start: float, end: float,
                 per_s_max: float | None = None) -> tuple[Any, float] | None:
    """How much a cumulative counter rose over [start, end], and the seconds that rise was read over.

    From the last reading at or before `start` (else the first after it) to the last at or before `end`. A step
    down adds nothing and the count goes on from the new value: a GPU reset or a driver reload zeroes NVML's
    counters, and what rose between the two reads is unknown.

    Args:
        points: (time, value) readings, those without a value left out.
        start, end: The window.
        per_s_max: The most a step may add per second between its two reads (violation time cannot pass the
            time elapsed): a larger step is cut to it. None: no bound.

    Returns:
        (rise, seconds read over), or None with fewer than two readings to compare.
    """
    pts = sorted(p for p in points if p[0] <= end)
    first = max((i for i, p in enumerate(pts) if p[0] <= start), default=0)
    pts = pts[first:]
    if len(pts) < 2:
        return None
    rise: Any = 0
    for (t0, v0), (t1, v1) in pairwise(pts):
        step = v1 - v0
        if step > 0:
            rise += step if per_s_max is None else min(step, per_s_max * (t1 - t0))
    return rise, pts[-1][0] - pts[0][0]


def pace_figures(node: str, gpu: str, index: int | None, rank: int | None, reasons: Sequence[tuple[float, int]],
                 marks: Sequence[GpuMark], start: float, end: float,
                 latest_temperature_c: float | None = None) -> GpuPaceFigures:
    """A GPU's figures over the window [start, end], from what the engine kept of it.

    Each figure counts only where read over at least half the window. The held-down share is NVML's violation
    time where the GPU counts it (HELD_POLICIES' rise over the seconds read), or the reasons' sampled share of the
    bits no policy counts (hardware slowdown, power brake) where that is more; the reasons' sampled share where
    the GPU has no such counter. Likewise the capped share, from CAP_POLICY.

    Args:
        node, gpu, index, rank: The GPU and the rank using it.
        reasons: Its (time, clock-event reason mask) readings.
        marks: Its GpuMarks.
        start, end: The window.
        latest_temperature_c: Its temperature where no mark in the window has one.
    """
    enough = 0.5 * (end - start)

    def rise(name: str, per_s_max: float | None = None) -> tuple[Any, float] | None:
        got = counter_rise([(m.t, v) for m in marks if (v := getattr(m, name)) is not None], start, end, per_s_max)
        return got if got is not None and got[1] >= enough and got[1] > 0 else None

    slowed, covered, seen = throttle_share(reasons, start, end, _SLOWING)
    sampled = covered >= enough
    held, cap = rise("held_s", 1.0), rise("capped_s", 1.0)
    if held is not None:
        apart = throttle_share(reasons, start, end, _SLOWING & ~HELD_COUNTED)[0] if sampled else 0.0
        slowed_share: float | None = max(held[0] / held[1], apart)
        counted = held[0] / held[1] >= apart
    else:
        counted = False
        slowed_share = slowed if sampled else None
    if cap is not None:
        capped_share: float | None = cap[0] / cap[1]
    else:
        capped_share = throttle_share(reasons, start, end, POWER_CAP)[0] if sampled else None
    recent = max(start, end - HOT_RECENT_S)
    temps = [m.temperature_c for m in marks if recent <= m.t <= end and m.temperature_c is not None]
    pcie, nvlink = rise("pcie_replays"), rise("nvlink_errors")
    link_s = max((r[1] for r in (pcie, nvlink) if r is not None), default=0.0)
    return GpuPaceFigures(node, gpu, index, rank, slowed_share, seen, capped_share,
                          median(temps) if temps else _finite(latest_temperature_c), counted,
                          pcie[0] if pcie is not None else None, nvlink[0] if nvlink is not None else None, link_s)


def _lone(gpus: Sequence[GpuPaceFigures], share: Callable[[GpuPaceFigures], float | None],
          at_least: float) -> GpuPaceFigures | None:
    """The one GPU whose share is at least `at_least` while every other read is at most OTHERS_SHARE; a job of
    one GPU has no others, and its GPU held down is the job's cause all the same."""
    read = [(g, s) for g in gpus if (s := share(g)) is not None]
    high = [(g, s) for g, s in read if s >= at_least]
    if len(high) != 1:
        return None
    if any(s > OTHERS_SHARE for g, s in read if g is not high[0][0]):
        return None
    return high[0][0]


def gpu_cause(gpus: Sequence[GpuPaceFigures], min_share: float) -> Cause | None:
    """A GPU of the job that stands out by its clocks, its power cap or its temperature; None when none does."""
    g = _lone(gpus, lambda g: g.slowed_share, min_share)
    if g is not None:
        why = ", ".join(name for bit, name in SLOWING_REASONS.items() if g.reasons & bit)
        why = (f"{why or 'thermal'}, by NVML's violation time" if g.counted else why) or "clocks held down"
        share = g.slowed_share or 0.0
        return Cause("gpu_clocks", f"{g.label()} had its clocks held down {share:.0%} of the time ({why}), "
                     f"the job's other GPUs ran free", {**g.figures("gpu_clocks"), "cause_share": round(share, 3)})
    g = _lone(gpus, lambda g: g.capped_share, min_share)
    if g is not None:
        share = g.capped_share or 0.0
        return Cause("gpu_power_cap", f"{g.label()} sat at its power cap {share:.0%} of the time, the job's other "
                     f"GPUs below theirs", {**g.figures("gpu_power_cap"), "cause_share": round(share, 3)})
    hot = sorted(((g.temperature_c, g) for g in gpus if g.temperature_c is not None), key=lambda h: -h[0])
    if len(hot) >= 3 and hot[0][0] - hot[1][0] >= HOT_APART_C:
        (c, g), m = hot[0], median(h[0] for h in hot[1:])
        return Cause("gpu_hot", f"{g.label()} runs at {c:.0f} °C, the others ~{m:.0f} °C",
                     {**g.figures("gpu_hot"), "temperature_c": round(c, 1)})
    return _link_cause(gpus)


def _link_cause(gpus: Sequence[GpuPaceFigures]) -> Cause | None:
    """The one GPU whose link errors climbed over the window (LINK_ERRORS_PER_MIN) while the others' stood still
    (each at most LINK_OTHERS of its count); None when none, or several, did."""
    read = [(g, (g.pcie_replays or 0) + (g.nvlink_errors or 0)) for g in gpus
            if g.pcie_replays is not None or g.nvlink_errors is not None]
    if not read:
        return None
    g, n = max(read, key=lambda r: r[1])
    others = [m for h, m in read if h is not g]
    if n <= 0 or n < LINK_ERRORS_PER_MIN * g.link_s / 60.0 or any(m > LINK_OTHERS * n for m in others):
        return None
    what = " and ".join(f"{v:,} {name}" for v, name in ((g.pcie_replays, "PCIe replays"),
                                                          (g.nvlink_errors, "NVLink errors")) if v)
    most = max(others, default=None)
    rest = "the job's only GPU read" if most is None else "the others none" if most == 0 else \
        f"the others at most {most:,}"
    figures = {**g.figures("gpu_link_errors"), **{k: v for k, v in (("cause_pcie_replays", g.pcie_replays),
                                                                    ("cause_nvlink_errors", g.nvlink_errors)) if v}}
    return Cause("gpu_link_errors", f"{g.label()}: {what} in the slow window, {rest}", figures)


def slowdown_cause(gpus: Sequence[GpuPaceFigures], ranks: Sequence[RankFigures], host: Sequence[Cause],
                   min_share: float) -> Cause:
    """The likely cause of a job's slowdown, most specific first (the module's list); NO_CULPRIT when none.

    Args:
        gpus: The job's GPUs with their window's figures.
        ranks: The job's ranks as the engine last saw them (utilisation and power of their GPU).
        host: The host-side causes the caller knows of on the job's ranks.
        min_share: The least share of the window a GPU held down (or capped) must show to stand out.
    """
    found = gpu_cause(gpus, min_share)
    if found is not None:
        return found
    odd = odd_rank_out([_no_step(r) for r in ranks])
    if odd is not None:
        rank = odd.figures.get("cause_rank")
        also = next((c for c in host if rank is not None and c.figures.get("cause_rank") == rank), None)
        if also is not None:
            return Cause(odd.kind, f"{odd.text}; {also.text}", {**also.figures, **odd.figures})
        return odd
    if host:
        return host[0]
    return NO_CULPRIT


def _no_step(r: RankFigures) -> RankFigures:
    """The rank without its step: a slow job's ranks move together, so their steps say nothing of who is slow
    (odd_rank_out would name whichever rank's latest report lagged by one)."""
    return RankFigures(r.rank, r.node, r.pid, r.gpu, None, r.util, r.power_watts, r.power_peak_watts)
