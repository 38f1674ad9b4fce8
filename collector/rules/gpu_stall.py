"""gpu_stall: a process's GPU idle for minutes while the process runs (once it has been busy).

State: since when its GPU idles (`idle_since`), whether it was ever busy (`seen_busy`), the
utilisation while idle (`idle_util`, the alert's text). Its fast-path guard is `util_quiet`: a
utilisation at or above it changes nothing.
"""
from __future__ import annotations

import math
from typing import Any

from .model import RESOLVED, AlertEvent, Rule
from .process import Causes, Proc, hours, stall_turn

NAMES = (Rule.GPU_STALL,)
SLOTS = ("idle_since", "seen_busy", "idle_util")


def init(p: Any) -> None:
    """The state of a process first seen."""
    p.idle_since = None
    p.seen_busy = False
    p.idle_util = None


def restart(p: Any) -> None:
    """New thresholds for the process: nothing to start afresh (its GPU's idleness is a fact)."""


def guard(p: Any) -> None:
    """`util_quiet`: -inf while the rule is off (no utilisation matters), its threshold while nothing
    is pending (a busy GPU changes nothing), +inf otherwise (every reading counts)."""
    gs = p.rules.gpu_stall
    if not gs.enabled or Rule.GPU_STALL in p.silenced:
        p.util_quiet = -math.inf
    elif p.idle_since is None and Rule.GPU_STALL not in p.alerts and (p.seen_busy or not gs.require_busy_first):
        p.util_quiet = gs.util_below_percent
    else:
        p.util_quiet = math.inf


def observe(ctx: Causes, p: Any, t: float, util: float, out: list[AlertEvent] | None) -> list[AlertEvent] | None:
    """A utilisation below `util_quiet`: the slow path, where the rule's state changes."""
    r = p.rules.gpu_stall
    if not r.enabled or Rule.GPU_STALL in p.silenced:
        return out
    if util >= r.util_below_percent:
        if util >= r.busy_percent:
            p.seen_busy = True
        p.idle_since = None
        p.guard()
        if Rule.GPU_STALL in p.alerts:
            ev = p.event(t, Rule.GPU_STALL, RESOLVED, r.severity,
                         f"GPU of {p.who()} is busy again ({util:.0f} %)", {"util_percent": util})
            return [ev] if out is None else [*out, ev]
        return out
    p.idle_util = util
    if p.idle_since is None:
        p.idle_since = t
        p.util_quiet = math.inf
    if r.require_busy_first and not p.seen_busy:
        return out
    idle = t - p.idle_since
    new = stall_turn(p, Rule.GPU_STALL, idle, r.for_s, r.pending_after_s)
    if new is None:
        return out
    desc, figures = ctx.with_cause(p, p.idle_since, t, _text(p, util, idle),
                                   {"idle_for_s": round(idle, 1), "util_percent": util})
    ev = p.event(t, Rule.GPU_STALL, new, r.severity, desc, figures)
    return [ev] if out is None else [*out, ev]


def describe(ctx: Causes, p: Any, rule: str, said: tuple[str, str, dict[str, Any]]
             ) -> tuple[str, str, dict[str, Any]]:
    """The alert's text and figures as of the process's latest observation."""
    if p.idle_since is None or p.idle_util is None:
        return said
    idle = p.last_t - p.idle_since
    desc, figures = ctx.with_cause(p, p.idle_since, p.last_t, _text(p, p.idle_util, idle),
                                   {"idle_for_s": round(idle, 1), "util_percent": p.idle_util})
    return desc, said[1], figures


def _text(p: Proc, util: float, idle: float) -> str:
    return f"GPU of {p.who()} idle ({util:.0f} %) for {hours(idle)} while the process runs"
