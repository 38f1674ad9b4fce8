"""handle_leak: a process's threads or open file descriptors that keep growing.

State: a count series (HandleSeries, below) for each (`thr_leak`, `fd_leak`) and which of them fire
(`handle_firing`); the alert fires when the first does and resolves when none does.
"""
from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from typing import Any

from .config import LeakRule
from .leak import LeakFinding
from .model import FIRING, RESOLVED, AlertEvent, Rule
from .process import Proc, hours
from .robust import mad_sigma, median

NAMES = (Rule.HANDLE_LEAK,)
SLOTS = ("thr_leak", "fd_leak", "handle_firing")


def init(p: Any) -> None:
    """The state of a process first seen."""
    p.thr_leak = p.fd_leak = None
    p.handle_firing = set()


def restart(p: Any) -> None:
    """New thresholds for the process: its series start afresh."""
    on = p.on(Rule.HANDLE_LEAK)
    p.thr_leak = HandleSeries(p.rules.handle_leak, p.t0) if on else None
    p.fd_leak = HandleSeries(p.rules.handle_leak, p.t0) if on else None


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


#: A thread pool, or a worker set, spins up within this long and levels off: a rise no longer than this is
#: a bounded burst, not a leak (the look-alike is tests/synth_traces.py's `handle_churn`: 20-200 threads
#: over 1-10 min). A leak grows on: the count must have risen before, through and after such a stretch.
BURST_S = 600.0
#: The count must rise in each of three parts of its growth (the first and last, each half of what the growth
#: is longer than BURST_S and a bucket at least, and BURST_S or more between them) at least this
#: fraction of the growth's mean rate: a pool that levelled off, whose count wobbles by one, is still flat.
STEADY_FRACTION = 0.5
#: A rise of a part must be this many times the noise of a bucket minimum (counts: usually none), and 1.
RISE_NOISE_Z = 3.0


class HandleSeries:
    """A count (threads, open file descriptors) that grows on: `add` it in time order, as a LeakSeries.

    A count has no noise to wait out, so a leak can be told once it has grown `min_growth` (50): but a pool
    spinning up grows as fast for a few minutes and levels off. Bucket minima (`bucket_s`: a short-lived
    thread or file is no growth) after `warmup_s`, a reading alone in its bucket closing it as it comes (readings
    a bucket and a half apart or more); at every bucket close, the latest minimum D is compared
    with the minimum A of each earlier bucket within the longest window, nearest first: the alert fires
    where D is at least `min_growth` above A at `min_rate_per_h` or more, and the rise goes on through the
    whole stretch: from A to B, from B to C, BURST_S or more later, and from C to D (the ends each half of
    what the stretch is longer than BURST_S, a bucket at least), each at STEADY_FRACTION of the mean rate or
    more, the ends by three times the noise of a bucket minimum and one at least, and so over every half BURST_S
    from A on (`_even`). A burst no longer than BURST_S cannot rise both before B and after C; two bursts some
    way apart leave a flat stretch between them. It resolves when the count has grown less than
    `resolve_fraction` of `min_rate_per_h` over the last half hour (the longest window, if shorter).
    """

    __slots__ = ("rule", "warm_end", "bucket_s", "cur_b", "cur_min", "cur_t", "bt", "bv", "span_s", "firing",
                 "since", "base", "rate_h", "b_end")

    def __init__(self, rule: LeakRule, t0: float) -> None:
        self.rule = rule
        self.warm_end = t0 + rule.warmup_s
        self.bucket_s = rule.bucket_s if rule.bucket_s > 0 else 60.0
        self.span_s = max(w.window_s for w in rule.windows) if rule.windows else 4 * 3600.0
        self.cur_b = -1
        self.cur_min = math.inf
        self.cur_t = 0.0
        self.b_end = self.warm_end
        # Closed buckets: the time of each one's least reading, and that reading (time order).
        self.bt = array("d")
        self.bv = array("d")
        self.firing = False
        self.since = 0.0  # while firing: when the growth began, and the count then
        self.base = 0.0
        self.rate_h = 0.0

    def add(self, t: float, value: float, total: float | None = None) -> LeakFinding | None:
        """Take one reading; a finding when the leak starts firing or resolves."""
        if t < self.b_end:
            if t >= self.warm_end and value < self.cur_min:
                self.cur_min, self.cur_t = value, t
            return None
        b = int(t // self.bucket_s)
        found = None
        # Readings further apart than a bucket and a half (the last bucket's least reading that far back) come one
        # a bucket: this reading's bucket closes at it, not a poll later (no work added to a reading in a bucket).
        alone = self.cur_b >= 0 and t - self.cur_t >= 1.5 * self.bucket_s and t >= self.warm_end
        if self.cur_b >= 0 and self.cur_min < math.inf:
            found = self._close(t)
        self.cur_b = b
        self.cur_min, self.cur_t = value, t
        self.b_end = (b + 1) * self.bucket_s
        if alone:
            found = self._close(t) or found
            self.cur_min = math.inf
        return found

    def _close(self, now: float) -> LeakFinding | None:
        """Keep the open bucket's least reading; a finding when the leak starts firing or resolves."""
        self.bt.append(self.cur_t)
        self.bv.append(self.cur_min)
        cut = self.cur_t - self.span_s
        if self.bt[0] < cut:
            k = bisect_left(self.bt, cut)
            del self.bt[:k]
            del self.bv[:k]
        return self._resolve(now) if self.firing else self._onset(now)

    def _noise(self) -> float:
        """The noise of a bucket minimum, from its last 30 steps less their median rate (a steady leak's
        steps, read at jittered times, are no noise)."""
        bt, bv = self.bt, self.bv
        n = len(bv)
        if n < 10:
            return 0.0
        lo = max(1, n - 30)
        rates = [(bv[j] - bv[j - 1]) / (bt[j] - bt[j - 1]) for j in range(lo, n) if bt[j] > bt[j - 1]]
        if not rates:
            return 0.0
        r = median(rates)
        return mad_sigma([bv[j] - bv[j - 1] - r * (bt[j] - bt[j - 1]) for j in range(lo, n)]) / math.sqrt(2.0)

    def _onset(self, now: float) -> LeakFinding | None:
        rule, bt, bv = self.rule, self.bt, self.bv
        n = len(bv)
        if n < 4:
            return None
        td, vd = bt[-1], bv[-1]
        # Cheap gates first: a rise over the last edge, then growth over the kept buckets.
        if vd - bv[-2] < 0 or vd - bv[bisect_right(bt, td - BURST_S / 2) - 1] < 1.0:
            return None  # not rising now
        if vd - min(bv) < rule.min_growth:
            return None
        least = max(1.0, RISE_NOISE_Z * self._noise())
        rate_min = rule.min_rate_per_h / 3600.0
        # A, nearest first: the first that passes is the growth's most recent clear start.
        for ia in range(bisect_right(bt, td - BURST_S) - 1, -1, -1):
            ta, va = bt[ia], bv[ia]
            grown = vd - va
            if grown < rule.min_growth:
                continue
            rate = grown / (td - ta)
            if rate < rate_min:
                break  # farther back only slower
            # the ends as long as the burst's length leaves them: B the last bucket by A's time + edge, C the
            # first from D's - edge, each a bucket in from its end at least, and BURST_S apart or more
            edge = 0.5 * (td - ta - BURST_S)
            ib = max(ia + 1, bisect_right(bt, ta + edge, ia) - 1)
            ic = min(n - 2, bisect_left(bt, td - edge, ib))
            if ic <= ib or bt[ic] - bt[ib] < BURST_S:
                continue
            tb, vb, tc, vc = bt[ib], bv[ib], bt[ic], bv[ic]
            need = STEADY_FRACTION * rate
            if (vb - va >= least and vd - vc >= least and (vb - va) / (tb - ta) >= need
                    and (vc - vb) / (tc - tb) >= need and (vd - vc) / (td - tc) >= need
                    and self._even(ia, need)):
                self.firing, self.since, self.base, self.rate_h = True, ta, va, rate * 3600.0
                return LeakFinding(True, now, self.rate_h, td - ta, vd, None, td - ta)
        return None

    def _even(self, ia: int, need: float) -> bool:
        """Whether the count rose at `need` a second or more over every half BURST_S from bucket `ia` on (the
        last slice to the latest bucket): two bursts some way apart leave a flat stretch between them."""
        bt, bv = self.bt, self.bv
        last = len(bt) - 1
        j = ia
        while j < last:
            k = bisect_left(bt, bt[j] + 0.5 * BURST_S, j + 1)
            if k >= last or bt[last] - bt[k] < 0.25 * BURST_S:
                k = last
            if (bv[k] - bv[j]) / (bt[k] - bt[j]) < need:
                return False
            j = k
        return True

    def _resolve(self, now: float) -> LeakFinding | None:
        rule, bt, bv = self.rule, self.bt, self.bv
        td, vd = bt[-1], bv[-1]
        back = min(1800.0, self.span_s)
        i = bisect_left(bt, td - back)
        if td - bt[i] < 0.9 * back:
            return None
        rate_h = (vd - bv[i]) / (td - bt[i]) * 3600.0
        if rate_h >= rule.resolve_fraction * rule.min_rate_per_h:
            return None
        self.firing = False
        return LeakFinding(False, now, rate_h, td - self.since, vd, None, back)

    def current(self, now: float) -> LeakFinding | None:
        """While firing: its figures as of `now` (the rate since the growth began, the count now)."""
        if not self.firing or not self.bv:
            return None
        td = self.bt[-1]
        rate_h = (self.bv[-1] - self.base) / (td - self.since) * 3600.0 if td > self.since else self.rate_h
        return LeakFinding(True, now, rate_h, max(0.0, now - self.since), self.bv[-1], None,
                           max(0.0, td - self.since))
