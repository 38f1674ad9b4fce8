"""Who makes a job slow: what `job_slowdown` names when one of the job's GPUs or ranks stands out.

Pure, like causes.py (which names a stall's cause): the engine hands in each of the job's GPUs with what it
read of them over the slow window, and each rank with its latest figures; what the engine cannot know (a
rank's host side: its process in D, its CPU) comes as causes from the caller (`HostSource`).

Most specific first, as an operator would look:
1. a GPU whose clocks were held down (hardware slowdown, thermal, power brake: NVML's clock-event reasons)
   for a share of the window while the job's other GPUs ran free: every collective waits for it;
2. a GPU capped by software power limits while the others are not, or clearly hotter than the others;
3. a rank whose GPU works less while the others wait in the collective (or the one busy while they idle):
   its GPU's utilisation or power apart from the others' (causes.odd_rank_out's test);
4. a rank's host side: its process held in D, or its CPU saturated (the caller's causes);
5. none of these: "no rank stands out", said as such (a slowdown of the whole job: the data, the
   network, the storage, another job on the fabric).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median

from .causes import Cause, RankFigures, odd_rank_out

__all__ = ["GpuPaceFigures", "HostSource", "NO_CULPRIT", "POWER_CAP", "SLOWING_REASONS", "slowdown_cause"]

#: NVML's clock-event reasons that lower a GPU's clocks below what its work asks (nvmlClocksEventReason*):
#: hardware slowdown, software thermal, hardware thermal, hardware power brake (health/decisions.py's
#: THROTTLE_REASONS), and the software power cap apart: a GPU at its power limit runs its clocks down too.
SLOWING_REASONS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                   0x80: "hardware power brake"}
POWER_CAP = 0x4
#: A GPU held down at least this share of the window stands out when every other GPU of the job was held down
#: at most OTHERS_SHARE of it (a GPU briefly at its limit now and then is ordinary).
OTHERS_SHARE = 0.1
#: A GPU this many degrees above the median of the job's others (theirs within HOT_TOGETHER of it) is the hot one.
HOT_APART_C = 12.0
HOT_TOGETHER_C = 6.0

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
        temperature_c: Its latest temperature, None: unknown.
    """

    node: str
    gpu: str
    index: int | None = None
    rank: int | None = None
    slowed_share: float | None = None
    reasons: int = 0
    capped_share: float | None = None
    temperature_c: float | None = None

    def label(self) -> str:
        whose = f" of rank {self.rank}" if self.rank is not None else ""
        at = self.gpu if self.index is None else f"{self.index} ({self.gpu})"
        return f"GPU {at}{whose} on {self.node}"

    def figures(self, kind: str) -> dict:
        out = {"cause": kind, "cause_node": self.node, "cause_gpu": self.gpu}
        if self.rank is not None:
            out["cause_rank"] = self.rank
        return out


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
        why = ", ".join(name for bit, name in SLOWING_REASONS.items() if g.reasons & bit) or "clocks held down"
        share = g.slowed_share or 0.0
        return Cause("gpu_clocks", f"{g.label()} had its clocks held down {share:.0%} of the time ({why}), "
                     f"the job's other GPUs ran free", {**g.figures("gpu_clocks"), "cause_share": round(share, 3)})
    g = _lone(gpus, lambda g: g.capped_share, min_share)
    if g is not None:
        share = g.capped_share or 0.0
        return Cause("gpu_power_cap", f"{g.label()} sat at its power cap {share:.0%} of the time, the job's other "
                     f"GPUs below theirs", {**g.figures("gpu_power_cap"), "cause_share": round(share, 3)})
    hot = [g for g in gpus if g.temperature_c is not None]
    if len(hot) >= 3:
        m = median(g.temperature_c for g in hot)  # type: ignore[misc]
        off = [g for g in hot if abs(g.temperature_c - m) > HOT_TOGETHER_C]  # type: ignore[operator]
        if len(off) == 1 and off[0].temperature_c - m >= HOT_APART_C:  # type: ignore[operator]
            g = off[0]
            return Cause("gpu_hot", f"{g.label()} runs at {g.temperature_c:.0f} °C, the others ~{m:.0f} °C",
                         {**g.figures("gpu_hot"), "temperature_c": g.temperature_c})
    return None


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
