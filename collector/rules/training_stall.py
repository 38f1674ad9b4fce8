"""training_stall: a process's training step frozen for minutes, once it has moved.

State: whether the step ever moved (`step_moved`); the step itself and since when (`step`, `step_t`)
are the process's base fields, since a stall's cause reads them too. Its fast-path guards are
`step_quiet` (a new step only moves the step) and `step_wait` (a repeated step changes nothing
until it has held that long).
"""
from __future__ import annotations

import math
from typing import Any

from .model import RESOLVED, AlertEvent, Rule
from .process import Causes, Proc, hours, stall_turn

NAMES = (Rule.TRAINING_STALL,)
SLOTS = ("step_moved",)


def init(p: Any) -> None:
    """The state of a process first seen."""
    p.step_moved = False


def restart(p: Any) -> None:
    """New thresholds for the process: nothing to start afresh (its steps are facts)."""


def guard(p: Any) -> None:
    """`step_quiet` while the step moves with no alert; `step_wait`: -inf while an alert stands (every
    repeat counts), +inf while the rule is off, else the least time a frozen step must hold to matter."""
    ts = p.rules.training_stall
    p.step_quiet = p.step_moved and Rule.TRAINING_STALL not in p.alerts
    if Rule.TRAINING_STALL in p.alerts:
        p.step_wait = -math.inf
    elif not ts.enabled or Rule.TRAINING_STALL in p.silenced:
        p.step_wait = math.inf
    else:
        p.step_wait = min(ts.pending_after_s, ts.for_s)


def observe(ctx: Causes, p: Any, t: float, step: int, util: Any, out: list[AlertEvent] | None
            ) -> list[AlertEvent] | None:
    """A step the fast path cannot settle: the slow path, where the rule's state changes."""
    r = p.rules.training_stall
    if step != p.step:
        if p.step is not None and not p.step_moved:
            p.step_moved = True
            p.guard()
        p.step = step
        p.step_t = t
        if Rule.TRAINING_STALL in p.alerts:
            ev = p.event(t, Rule.TRAINING_STALL, RESOLVED, r.severity,
                         f"Training of {p.who()} advances again (step {step})", {"step": step})
            return [ev] if out is None else [*out, ev]
        return out
    if not p.step_moved or not r.enabled or Rule.TRAINING_STALL in p.silenced:
        return out
    frozen = t - p.step_t
    new = stall_turn(p, Rule.TRAINING_STALL, frozen, r.for_s, r.pending_after_s)
    if new is None:
        return out
    desc, figures = _said(ctx, p, step, frozen, util, t)
    ev = p.event(t, Rule.TRAINING_STALL, new, r.severity, desc, figures)
    return [ev] if out is None else [*out, ev]


def describe(ctx: Causes, p: Any, rule: str, said: tuple[str, str, dict[str, Any]]
             ) -> tuple[str, str, dict[str, Any]]:
    """The alert's text and figures as of the process's latest observation."""
    if p.step is None:
        return said
    desc, figures = _said(ctx, p, p.step, p.last_t - p.step_t, p.last_util, p.last_t)
    return desc, said[1], figures


def _said(ctx: Causes, p: Proc, step: int, frozen: float, util: Any, t: float) -> tuple[str, dict[str, Any]]:
    figures = {"step": step, "stalled_for_s": round(frozen, 1), "util_percent": util}
    busy = f", GPU at {util:.0f} % (hung collective?)" if util is not None and util >= 50 else ""
    text = f"Training of {p.who()} stuck at step {step} for {hours(frozen)}{busy}"
    return ctx.with_cause(p, p.step_t, t, text, figures)
