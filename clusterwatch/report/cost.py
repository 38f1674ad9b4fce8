"""status's Cost section: what the job's GPUs cost while it held them (the collector's GpuView.cost): energy,
throttle time by reason, and GPU-hours at each activity level, each said with how it was measured."""
from __future__ import annotations

from clusterwatch.humanize import duration
from clusterwatch.model import ACTIVITY_LEVELS as LEVELS

from .text import title

__all__ = ["cost_section"]


def _energy(joules: float) -> str:
    kwh = joules / 3.6e6
    return f"{kwh:.2f} kWh" if kwh >= 0.1 else f"{joules / 1000:.1f} kJ"


def _hours(seconds: list[float]) -> str:
    total = sum(seconds)
    parts = [f"{name}% {s / 3600:.2f} h" for name, s in zip(LEVELS, seconds, strict=False) if s > 0]
    return f"{total / 3600:.2f} GPU-h: " + ", ".join(parts)


def cost_section(view) -> list[str]:
    """Lines for the view's GPU costs; [] when no GPU has one (an older collector, no reading yet)."""
    costs = [g.cost for g in view.gpus if g.HasField("cost")]
    if not costs:
        return []
    out = [title("Cost")]
    energy = [c.energy_joules for c in costs if c.HasField("energy_joules")]
    notes = []
    if any(c.shared for c in costs):
        notes.append("includes GPUs another job also used: their whole energy is counted here")
    resets = sum(c.energy_resets for c in costs)
    if resets:
        notes.append(f"short: the counter was reset {resets} time(s) (driver reload), those intervals not counted")
    missing = len(costs) - len(energy)
    if missing:
        notes.append(f"{missing} GPU(s) without an energy counter (MIG instances: the counter is the whole GPU's)")
    figure = _energy(sum(energy)) if energy else "not measured"
    out.append(f"  GPU energy      {figure}" + (f"  ({'; '.join(notes)})" if notes else ""))
    throttle: dict[str, float] = {}
    for c in costs:
        for reason, s in c.throttle_seconds.items():
            throttle[reason] = throttle.get(reason, 0.0) + s
    held = {k: v for k, v in throttle.items() if v >= 0.5}
    out.append("  Throttled       " + (", ".join(f"{k} {duration(v)}" for k, v in sorted(held.items(),
                                                                               key=lambda kv: -kv[1]))
                                        if held else "none"))
    for label, field in (("By SM activity ", "sm_active_seconds"), ("By utilisation", "utilization_seconds")):
        seconds = [sum(c_field[i] for c in costs if (c_field := getattr(c, field))) for i in range(len(LEVELS))]
        if any(seconds):
            out.append(f"  {label}  {_hours(seconds)}")
    return out
