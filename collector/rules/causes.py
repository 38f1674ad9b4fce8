"""The likely cause of a stall: what `training_stall`, `gpu_stall` and `idle_gpu` name when they fire.

Pure, like the engine: the engine hands in what it holds (the job's ranks with their step, utilisation
and GPU power; the job's ranks whose process is gone; its nodes whose agent is silent), and what it
cannot know (health events on the job's GPUs, from collector/health) comes from a `CauseSource` the
caller gives: the live collector one over its HealthEngine, replay one over the trace's health records,
or none.

The most likely cause first: a health event on one of the job's GPUs in the minutes before (a GPU that
faults stops its rank, and the others wait for it in the next collective; a driver call it wedged can put
the rank in D too, so the event says more), a rank held where it is (in uninterruptible sleep, state D: I/O
that does not return; stopped, T: a SIGSTOP, ctrl-Z or a debugger), a rank whose process is gone,
a node whose agent is down, the odd rank out (the one whose step, power or utilisation differs from the
others'), and last the shape of a hung collective on the rank itself: its GPU busy at near-idle power
(NCCL's kernel spins at ~100 % utilisation while it waits, drawing little).

Where the job's GPUs offer NVML GPM (SM and tensor activity), those say it directly: a GPU at high utilisation
whose SMs are near idle and whose tensor cores do nothing is spinning, whatever its power; and the odd rank out
is the one whose tensor activity differs from the others' (the one still computing while they wait in the
collective, or the one idle while they compute). Without GPM, utilisation and power as above.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from clusterwatch.humanize import duration

__all__ = ["Cause", "CauseSource", "RankFigures", "CAUSE_LOOKBACK_S", "HUNG_POWER_SHARE", "HELD_MIN_S",
           "from_health", "held_rank", "held_long_enough", "gone_rank", "agent_down", "odd_rank_out",
           "hung_collective", "spinning"]

#: How far before a stall began a health event still counts as its cause ("in the minutes before").
CAUSE_LOOKBACK_S = 600.0
#: A rank held (state D, T or t) this long is a stall's cause, or, in a younger stall, for half of it at least
#: (HELD_FLOOR_S at the least): every process passes through D for a disk read, and a moment of it is no cause.
HELD_MIN_S = 60.0
HELD_FLOOR_S = 5.0
#: A GPU at or above this utilisation drawing at most this share of the highest power it drew in the job
#: is waiting, not working (a hung collective).
HUNG_UTIL_PERCENT = 50.0
HUNG_POWER_SHARE = 0.5
#: With GPM: SM activity at or under this (a collective's kernel spins on a few of the SMs) and tensor activity
#: under this (none) on a GPU at HUNG_UTIL_PERCENT or more is waiting, whatever its power.
HUNG_SM_PERCENT = 5.0
HUNG_TENSOR_PERCENT = 1.0
#: A rank's utilisation this many points from the others' median (theirs within UTIL_TOGETHER of it)
#: makes it the odd one out; its power this share from theirs (theirs within POWER_TOGETHER).
UTIL_APART = 40.0
UTIL_TOGETHER = 15.0
POWER_APART = 0.4
POWER_TOGETHER = 0.15
#: A rank's tensor activity this many points from the others' (theirs within TENSOR_TOGETHER of their median).
TENSOR_APART = 20.0
TENSOR_TOGETHER = 5.0


@dataclass(frozen=True, slots=True)
class Cause:
    """The likely cause of a stall.

    Attributes:
        kind: gpu_health, process_held, process_gone, agent_down, odd_rank, hung_collective.
        text: What the alert says after "likely cause: ".
        figures: The alert's figures for it: cause, and where known cause_node, cause_rank, cause_gpu,
            cause_xid, cause_rule (process_held: cause_pid, cause_state, cause_wchan, held_for_s).
    """

    kind: str
    text: str
    figures: dict[str, Any] = field(default_factory=dict)


#: (job id, since, now) → the causes the caller knows of in that span (health events on the job's GPUs),
#: most likely first. Called on a stall's transitions and when its figures are refreshed, never per sample.
CauseSource = Callable[[str, float, float], Sequence[Cause]]


@dataclass(frozen=True, slots=True)
class RankFigures:
    """One rank of a job as the engine last saw it."""

    rank: int | None
    node: str
    pid: int
    gpu: str = ""
    step: int | None = None
    util: float | None = None
    power_watts: float | None = None
    power_peak_watts: float | None = None
    sm_active: float | None = None  # GPM's, in percent: None where its GPU does not offer it
    tensor_active: float | None = None


def _rank(rank: int | None, node: str, pid: int | None = None) -> str:
    where = f"pid {pid} on {node}" if pid is not None else node
    return f"rank {rank} ({where})" if rank is not None else where


def from_health(t: float, rule: str, node: str, gpu: str, description: str, now: float, *,
                rank: int | None = None, xid: int | None = None, gpu_index: int | None = None) -> Cause:
    """A health finding on one of the job's GPUs as a stall's cause."""
    what = f"XID {xid}" if xid is not None else rule
    label = gpu if gpu_index is None else f"{gpu_index} ({gpu})"
    whose = f" of rank {rank}" if rank is not None else ""
    ago = max(0.0, now - t)
    text = f"{what} on GPU {label}{whose} on {node}, {duration(ago)} before: {description}"
    figures: dict[str, Any] = {"cause": "gpu_health", "cause_rule": rule, "cause_node": node, "cause_gpu": gpu}
    if rank is not None:
        figures["cause_rank"] = rank
    if xid is not None:
        figures["cause_xid"] = xid
    return Cause("gpu_health", text, figures)


def held_long_enough(held_for_s: float, stall_for_s: float) -> bool:
    """Whether a rank held this long explains a stall this old: a minute, or most of a younger stall."""
    return held_for_s >= min(HELD_MIN_S, max(HELD_FLOOR_S, 0.5 * stall_for_s))


_HELD_SAID = {
    "D": ("has been in uninterruptible sleep", "I/O that does not return, e.g. a hung file system "
          "(NFS, Lustre) or a wedged driver call; it cannot be killed until it returns"),
    "T": ("has been stopped (state T)", "a SIGSTOP or ctrl-Z holds it; SIGCONT (kill -CONT) resumes it"),
    "t": ("has been stopped by a tracer (state t)", "a debugger or tracer holds it; detach it to resume"),
}


def held_rank(state: str, rank: int | None, node: str, pid: int, held_for_s: float, wchan: str = "") -> Cause:
    """A rank of the job held where it is: in uninterruptible sleep (D), stopped (T) or by a tracer (t)."""
    said, meaning = _HELD_SAID[state]
    who = f"rank {rank} on {node} (pid {pid})" if rank is not None else f"pid {pid} on {node}"
    where = f", in {wchan}" if wchan and state == "D" else ""
    figures: dict[str, Any] = {"cause": "process_held", "cause_node": node, "cause_pid": pid, "cause_state": state,
                               "held_for_s": round(held_for_s, 1)}
    if rank is not None:
        figures["cause_rank"] = rank
    if where:
        figures["cause_wchan"] = wchan
    return Cause("process_held", f"{who} {said} for {duration(held_for_s)}{where}: {meaning}", figures)


def gone_rank(t: float, rank: int | None, node: str, pid: int, now: float) -> Cause:
    """A rank of the job whose process ended while the others run."""
    figures: dict[str, Any] = {"cause": "process_gone", "cause_node": node}
    if rank is not None:
        figures["cause_rank"] = rank
    return Cause("process_gone", f"{_rank(rank, node, pid)} is gone ({duration(max(0.0, now - t))} ago)", figures)


def agent_down(node: str, silent_s: float) -> Cause:
    """A node of the job whose agent is silent: its ranks' figures are not known."""
    return Cause("agent_down", f"the agent on {node} is down (silent for {duration(silent_s)})",
                 {"cause": "agent_down", "cause_node": node})


def _odd(values: Sequence[tuple[RankFigures, float]], apart: Callable[[float, float], bool],
         together: Callable[[float, float], bool]) -> tuple[RankFigures, float, float] | None:
    """The one rank whose value is apart from the median, every other's together with it; None if not one.

    Of three or more, one value apart does not move the median: one pass, however many ranks.
    """
    if len(values) < 3:
        return None
    m = median(v for _, v in values)
    off = [(r, v) for r, v in values if not together(v, m)]
    if len(off) != 1 or not apart(off[0][1], m):
        return None
    return off[0][0], off[0][1], m


def odd_rank_out(ranks: Sequence[RankFigures]) -> Cause | None:
    """The one rank whose step, tensor activity, power or utilisation differs from the others' (None when none,
    or several do).

    Steps first: in a hung job the ranks that reached the collective wait at one step and the one that did
    not is behind (of two ranks, the one behind). Then, where every rank's GPU offers GPM, its tensor activity
    alone (`_odd_tensor`): utilisation and power are the cruder readings of the same activity. Else power and
    utilisation, of three ranks or more.
    """
    stepped = [r for r in ranks if r.step is not None]
    if len(stepped) >= 2:
        steps = sorted({r.step for r in stepped})  # type: ignore[type-var]
        if len(steps) == 2:
            lone = [s for s in steps if sum(r.step == s for r in stepped) == 1]
            if len(stepped) == 2:
                lone = [steps[0]]
            if len(lone) == 1:
                odd = next(r for r in stepped if r.step == lone[0])
                rest = next(s for s in steps if s != lone[0])
                return Cause("odd_rank", f"{_rank(odd.rank, odd.node, odd.pid)} is at step {odd.step}, "
                             f"the others at step {rest}", _odd_figures(odd, "step"))
    if ranks and all(r.tensor_active is not None for r in ranks):
        return _odd_tensor(ranks)
    powered = [(r, r.power_watts) for r in ranks if r.power_watts is not None]
    hit = _odd(powered, lambda v, m: abs(v - m) >= POWER_APART * max(m, 1.0),
               lambda w, m: abs(w - m) <= POWER_TOGETHER * max(m, 1.0))
    if hit is not None:
        r, v, m = hit
        return Cause("odd_rank", f"{_rank(r.rank, r.node, r.pid)} draws {v:.0f} W, the others ~{m:.0f} W",
                     _odd_figures(r, "power"))
    used = [(r, r.util) for r in ranks if r.util is not None]
    hit = _odd(used, lambda v, m: abs(v - m) >= UTIL_APART, lambda w, m: abs(w - m) <= UTIL_TOGETHER)
    if hit is not None:
        r, v, m = hit
        return Cause("odd_rank", f"{_rank(r.rank, r.node, r.pid)} has its GPU at {v:.0f} %, the others ~{m:.0f} %",
                     _odd_figures(r, "utilization"))
    return None


def _odd_tensor(ranks: Sequence[RankFigures]) -> Cause | None:
    """The one rank whose tensor activity differs from the others': of three or more, apart from their median;
    of two, the one at work while the other's tensor cores do nothing (it never reached the collective)."""
    values = [(r, r.tensor_active) for r in ranks]
    hit = _odd(values, lambda v, m: abs(v - m) >= TENSOR_APART, lambda w, m: abs(w - m) <= TENSOR_TOGETHER)
    if hit is None and len(values) == 2:
        (a, va), (b, vb) = sorted(values, key=lambda x: x[1])  # type: ignore[arg-type,return-value]
        if va < HUNG_TENSOR_PERCENT and vb >= TENSOR_APART:
            hit = b, vb, va
    if hit is None:
        return None
    r, v, m = hit
    others = "the other" if len(values) == 2 else "the others"
    return Cause("odd_rank", f"{_rank(r.rank, r.node, r.pid)} has tensor activity {v:.0f} %, {others} "
                 f"~{m:.0f} %", _odd_figures(r, "tensor_activity"))


def _odd_figures(r: RankFigures, by: str) -> dict[str, Any]:
    figures: dict[str, Any] = {"cause": "odd_rank", "cause_by": by, "cause_node": r.node}
    if r.rank is not None:
        figures["cause_rank"] = r.rank
    if r.gpu:
        figures["cause_gpu"] = r.gpu
    return figures


def spinning(util: float | None, sm_active: float | None, tensor_active: float | None) -> bool:
    """Whether GPM says a GPU spins: busy by utilisation, its SMs near idle, its tensor cores doing nothing."""
    return (util is not None and sm_active is not None and tensor_active is not None
            and util >= HUNG_UTIL_PERCENT and sm_active <= HUNG_SM_PERCENT and tensor_active < HUNG_TENSOR_PERCENT)


def hung_collective(r: RankFigures) -> Cause | None:
    """The rank's own GPU busy while it does nothing: a collective waiting for a peer that never comes. By GPM
    where the GPU offers it (it then decides alone), else by its power against the highest it drew."""
    if r.sm_active is not None and r.tensor_active is not None:
        return _spinning_cause(r) if spinning(r.util, r.sm_active, r.tensor_active) else None
    if r.util is None or r.power_watts is None or not r.power_peak_watts or r.util < HUNG_UTIL_PERCENT:
        return None
    if r.power_watts > HUNG_POWER_SHARE * r.power_peak_watts:
        return None
    figures: dict[str, Any] = {"cause": "hung_collective", "cause_node": r.node,
                               "power_watts": round(r.power_watts, 1), "power_peak_watts": round(r.power_peak_watts, 1)}
    if r.gpu:
        figures["cause_gpu"] = r.gpu
    return Cause("hung_collective", f"a hung collective: its GPU reads {r.util:.0f} % at {r.power_watts:.0f} W, "
                 f"{r.power_watts / r.power_peak_watts:.0%} of the {r.power_peak_watts:.0f} W it drew at work",
                 figures)


def _spinning_cause(r: RankFigures) -> Cause:
    assert r.util is not None and r.sm_active is not None and r.tensor_active is not None
    figures: dict[str, Any] = {"cause": "hung_collective", "cause_node": r.node,
                               "sm_active_percent": round(r.sm_active, 1),
                               "tensor_active_percent": round(r.tensor_active, 1)}
    if r.gpu:
        figures["cause_gpu"] = r.gpu
    return Cause("hung_collective", f"a hung collective: its GPU reads {r.util:.0f} % utilisation with "
                 f"{r.sm_active:.0f} % SM activity and no tensor activity", figures)
