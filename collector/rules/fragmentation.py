"""gpu_memory_fragmentation: the allocator's free cache (reserved minus allocated) grows while its
allocation retries rise (clusterwatch.train's figures, where a process reports them).

State: a leak series of reserved minus allocated (`frag_leak`), whether it fires (`frag_growing`: the
alert fires once the retries rise too), and the retries where they changed (`frag_retries`). A cache
that grows without retries is no fault.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from .leak import LeakFinding, LeakSeries
from .model import FIRING, RESOLVED, AlertEvent, Rule
from .process import Proc, hours, leak_figures, mb

NAMES = (Rule.GPU_MEMORY_FRAGMENTATION,)
SLOTS = ("frag_leak", "frag_growing", "frag_retries")


def init(p: Any) -> None:
    """The state of a process first seen."""
    p.frag_leak = None
    p.frag_growing = False
    p.frag_retries = deque(maxlen=256)  # (t, retries) where they changed


def restart(p: Any) -> None:
    """New thresholds for the process: its series starts afresh."""
    on = p.on(Rule.GPU_MEMORY_FRAGMENTATION)
    p.frag_leak = LeakSeries(p.rules.gpu_memory_fragmentation, p.t0) if on else None
    p.frag_growing = False


def observe(p: Any, t: float, allocated: Any, reserved: Any, retries: Any, out: list[AlertEvent] | None
            ) -> list[AlertEvent] | None:
    """The allocator's reserved and allocated bytes and its retries: an event when the alert turns."""
    s = p.frag_leak
    if s is None or reserved is None:
        return out
    if retries is not None and (not p.frag_retries or p.frag_retries[-1][1] != retries):
        p.frag_retries.append((t, retries))
        changed = True
    else:
        changed = False
    f = s.add(t, max(0, reserved - allocated), None)
    r = p.rules.gpu_memory_fragmentation
    if f is not None and not f.firing:
        p.frag_growing = False
        if Rule.GPU_MEMORY_FRAGMENTATION in p.alerts:
            ev = p.event(f.t, Rule.GPU_MEMORY_FRAGMENTATION, RESOLVED, r.severity,
                         f"GPU memory of {p.who()}: the allocator's free cache stopped growing", leak_figures(f))
            out = [ev] if out is None else [*out, ev]
        return out
    if f is not None:
        p.frag_growing = True
    if p.frag_growing and Rule.GPU_MEMORY_FRAGMENTATION not in p.alerts and (f is not None or changed):
        cur = f or s.current(t)
        said = _said(p, cur) if cur is not None else None
        if said is not None:
            ev = p.event(t, Rule.GPU_MEMORY_FRAGMENTATION, FIRING, r.severity, *said)
            out = [ev] if out is None else [*out, ev]
    return out


def describe(ctx: Any, p: Any, rule: str, said: tuple[str, str, dict[str, Any]]
             ) -> tuple[str, str, dict[str, Any]]:
    """The alert's text and figures as of the process's latest observation."""
    if p.frag_leak is None:
        return said
    f = p.frag_leak.current(p.last_t)
    now_said = _said(p, f, rose_only=False) if f is not None else None
    return (now_said[0], said[1], now_said[1]) if now_said is not None else said


def _said(p: Proc, f: LeakFinding, rose_only: bool = True) -> tuple[str, dict[str, Any]] | None:
    """The text and figures: the free cache's growth, with the retries over its span; None (with `rose_only`)
    while the retries have not risen over it."""
    hist = p.frag_retries  # type: ignore[attr-defined]
    if not hist:
        return None
    start = f.t - f.growth_for_s
    before = hist[0][1]
    for t, n in hist:
        if t > start:
            break
        before = n
    now = hist[-1][1]
    if rose_only and now <= before:
        return None
    desc = (f"GPU memory of {p.who()} fragments: reserved minus allocated grows {mb(f.rate_per_h)}/h for "
            f"{hours(f.growth_for_s)} (now {mb(f.level)}) while allocation retries rose from {before} to {now}; "
            f"try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    figures = {**leak_figures(f), "alloc_retries": now, "alloc_retries_before": before, "source": "allocator"}
    return desc, figures
