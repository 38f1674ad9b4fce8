"""handle_leak: a process's threads or open file descriptors that keep growing.

State: a leak series for each (`thr_leak`, `fd_leak`) and which of them fire (`handle_firing`); the
alert fires when the first does and resolves when none does.
"""
from __future__ import annotations

from typing import Any

from .leak import LeakFinding, LeakSeries
from .model import FIRING, RESOLVED, AlertEvent, Rule
from .process import Proc, hours

NAMES = (Rule.HANDLE_LEAK,)
SLOTS = ("thr_leak", "fd_leak", "handle_firing")


def init(p: Any) -> None:
    """The state of a process first seen."""
    p.thr_leak = p.fd_leak = None
    p.handle_firing = set()


def restart(p: Any) -> None:
    """New thresholds for the process: its series start afresh."""
    on = p.on(Rule.HANDLE_LEAK)
    p.thr_leak = LeakSeries(p.rules.handle_leak, p.t0) if on else None
    p.fd_leak = LeakSeries(p.rules.handle_leak, p.t0) if on else None


def observe(p: Any, series: str, f: LeakFinding, out: list[AlertEvent] | None) -> list[AlertEvent] | None:
    """A finding of the `series` ("threads" or "open_fds") series: an event when the alert turns."""
    r = p.rules.handle_leak
    was = bool(p.handle_firing)
    if f.firing:
        p.handle_firing.add(series)
    else:
        p.handle_firing.discard(series)
    now = bool(p.handle_firing)
    if was == now:
        return out
    if now:
        ev = p.event(f.t, Rule.HANDLE_LEAK, FIRING, r.severity, _text(p, series, f), _figures(series, f))
    else:
        noun = "threads" if series == "threads" else "open file descriptors"
        ev = p.event(f.t, Rule.HANDLE_LEAK, RESOLVED, r.severity,
                     f"{noun.capitalize()} of {p.who()} stopped growing", _figures(series, f))
    return [ev] if out is None else [*out, ev]


def describe(ctx: Any, p: Any, rule: str, said: tuple[str, str, dict[str, Any]]
             ) -> tuple[str, str, dict[str, Any]]:
    """A firing alert's text and figures as of the process's latest observation (the first series that fires)."""
    if p.alerts.get(rule) != FIRING:
        return said
    for name, series in (("threads", p.thr_leak), ("open_fds", p.fd_leak)):
        f = series.current(p.last_t) if series is not None and name in p.handle_firing else None
        if f is not None:
            return _text(p, name, f), said[1], _figures(name, f)
    return said


def _figures(series: str, f: LeakFinding) -> dict[str, Any]:
    return {"series": series, "rate_per_h": round(f.rate_per_h, 1), "growth_for_s": round(f.growth_for_s, 1),
            "level": round(f.level), "window_s": f.window_s}


def _text(p: Proc, series: str, f: LeakFinding) -> str:
    noun = "Threads" if series == "threads" else "Open file descriptors"
    return f"{noun} of {p.who()} grow {f.rate_per_h:.0f}/h for {hours(f.growth_for_s)} (now {f.level:.0f})"
