"""gpu_memory_leak and host_memory_leak: a process's GPU memory or resident host memory that keeps growing.

State: a leak series for NVML's GPU memory figure (`gpu_leak`), one for the allocator's allocated bytes
(`alloc_leak`), one for RSS (`host_leak`), and whether the process reports the allocator's figures
(`alloc_seen`): from then on gpu_memory_leak judges allocated bytes, not NVML's figure (which holds the
allocator's cache: it rises in steps, never shrinks). The engine's fast path feeds `gpu_leak` and
`host_leak` itself (a sample inside its open bucket only lowers the bucket's minimum) and hands a
closed bucket's finding to `said`.
"""
from __future__ import annotations

from typing import Any

from .leak import LeakFinding, LeakSeries
from .model import FIRING, RESOLVED, AlertEvent, Rule
from .process import Proc, hours, leak_figures, mb

NAMES = (Rule.GPU_MEMORY_LEAK, Rule.HOST_MEMORY_LEAK)
SLOTS = ("gpu_leak", "alloc_leak", "host_leak", "alloc_seen", "host_tmpfs")

#: What a GPU leak judged on the allocator's figures is said to be (compared by identity).
ALLOCATED = "Allocated tensors"
GPU_MEMORY = "GPU memory"
HOST_MEMORY = "Host memory (RSS)"
#: Said of the process that carries its job's tmpfs files (/dev/shm) on the node: those are its host memory too.
HOST_MEMORY_TMPFS = "Host memory (RSS and the job's /dev/shm and tmpfs files)"


def init(p: Any) -> None:
    """The state of a process first seen."""
    p.gpu_leak = p.alloc_leak = p.host_leak = None
    p.alloc_seen = False
    p.host_tmpfs = False


def host_what(p: Any) -> str:
    """What a process's host_memory_leak judges: its RSS, and its job's tmpfs files where it carries them."""
    return HOST_MEMORY_TMPFS if p.host_tmpfs else HOST_MEMORY


def restart(p: Any) -> None:
    """New thresholds for the process: its series start afresh."""
    r = p.rules
    p.gpu_leak = LeakSeries(r.gpu_memory_leak, p.t0) if p.on(Rule.GPU_MEMORY_LEAK) else None
    p.alloc_leak = LeakSeries(r.gpu_memory_leak, p.t0) if p.on(Rule.GPU_MEMORY_LEAK) else None
    p.host_leak = LeakSeries(r.host_memory_leak, p.t0) if p.on(Rule.HOST_MEMORY_LEAK) else None


def allocator_seen(p: Any, t: float) -> list[AlertEvent] | None:
    """The process gave the allocator's figures for the first time: a GPU leak raised on NVML's figure is no
    longer watched, and resolves."""
    p.alloc_seen = True
    if p.alerts.get(Rule.GPU_MEMORY_LEAK) != FIRING:
        return None
    return [p.event(t, Rule.GPU_MEMORY_LEAK, RESOLVED, p.rules.gpu_memory_leak.severity,
                    f"GPU memory of {p.who()}: judged on the allocator's figures from now on", {"source": "allocator"})]


def observe_allocated(p: Any, t: float, allocated: Any, reserved: Any, gmem: Any, gtotal: Any
                      ) -> AlertEvent | None:
    """The allocator's allocated bytes, for gpu_memory_leak."""
    s = p.alloc_leak
    if s is None:
        return None
    # full when allocated reaches what the GPU has beside the process's CUDA context (NVML's figure
    # over the reserve) and the other processes on it are not known: the GPU's size less that
    total = gtotal
    if gtotal is not None and gmem is not None and reserved is not None:
        total = gtotal - max(0, gmem - reserved)
    f = s.add(t, allocated, total)
    return said(p, Rule.GPU_MEMORY_LEAK, f, ALLOCATED, "GPU") if f is not None else None


def said(p: Any, rule: str, f: LeakFinding, what: str, full: str) -> AlertEvent:
    """The event of a leak series' finding: firing, or resolved once it stopped growing."""
    r = getattr(p.rules, rule)
    figures = leak_figures(f)
    if what is ALLOCATED:
        figures["source"] = "allocator"
    if not f.firing:
        desc = f"{what} of {p.who()} stopped growing ({mb(f.rate_per_h)}/h now)"
        return p.event(f.t, rule, RESOLVED, r.severity, desc, figures)
    desc, severity = _text(p, what, full, f, r.severity)
    return p.event(f.t, rule, FIRING, severity, desc, figures)


def describe(ctx: Any, p: Any, rule: str, said: tuple[str, str, dict[str, Any]]
             ) -> tuple[str, str, dict[str, Any]]:
    """A firing leak's text and figures as of the process's latest observation."""
    if p.alerts.get(rule) != FIRING:
        return said
    gpu_what = ALLOCATED if p.alloc_seen else GPU_MEMORY
    series = (p.alloc_leak if p.alloc_seen else p.gpu_leak) if rule == Rule.GPU_MEMORY_LEAK else p.host_leak
    f = series.current(p.last_t) if series is not None else None
    if f is None:
        return said
    what, full = (gpu_what, "GPU") if rule == Rule.GPU_MEMORY_LEAK else (host_what(p), p.host_full)
    desc, severity = _text(p, what, full, f, getattr(p.rules, rule).severity)
    figures = leak_figures(f)
    if what is ALLOCATED:
        figures["source"] = "allocator"
    return desc, severity, figures


def _text(p: Proc, what: str, full: str, f: LeakFinding, severity: str) -> tuple[str, str]:
    """A firing leak's description and severity (critical when full within two hours)."""
    if what is ALLOCATED:
        desc = (f"GPU memory of {p.who()}: allocated tensors grow {mb(f.rate_per_h)}/h for "
                f"{hours(f.growth_for_s)} (the allocator's figure, its cache aside)")
    else:
        desc = f"{what} of {p.who()} grows {mb(f.rate_per_h)}/h for {hours(f.growth_for_s)}"
    if f.time_to_full_s is not None:
        desc += f"; {full} full in ~{hours(f.time_to_full_s)}"
        if f.time_to_full_s < 2 * 3600:
            severity = "critical"
    return desc, severity
