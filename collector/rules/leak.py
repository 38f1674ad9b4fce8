"""Leak detection on one series (GPU memory, RSS, threads, open fds) of one process.

How it decides, in the series' own time (seconds, never sample counts, so poll
intervals of 1–60 s, jitter and missing polls do not matter):

1. Samples in the first `warmup_s` after the process appears are ignored: the
   caching allocator grows in steps while it warms up.
2. Each sample only lowers the minimum of its `bucket_s` bucket. The minimum
   ignores upward spikes (checkpoint saves, evaluation phases shorter than a bucket).
3. For every window W, closed buckets fold into 12 sub-buckets of W/12 on a fixed
   grid; when a sub-bucket closes, the last 12 are analysed (see `fit_window`):
   - Theil–Sen slope at or above the window's rate floor and the rule's minimum rate;
   - growth over the window (slope * W) at least `min_growth`;
   - slope at least `min_t_stat` robust standard errors (noise is not growth);
   - the minimum of each third of the window above the previous third's by at least
     `rise_fraction` of the predicted rise: growth that goes on, where one step
     followed by a plateau, or an evaluation phase that comes and goes, does not.
   Short windows have high rate floors (a fast leak fires within minutes), long ones
   the rule's own (a slow leak fires within hours). When the series would be full
   within `urgent_time_to_full_s`, every window uses the rule's own minimum rate.
4. A firing leak resolves when the slope over the window that fired falls below
   `resolve_fraction` of that window's floor.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .config import LeakRule
from .robust import fit_window, median

N_SUB = 12
_THIRD = tuple(i * 3 // N_SUB for i in range(N_SUB))


@dataclass(frozen=True, slots=True)
class LeakFinding:
    """A leak's state changed.

    Attributes:
        firing: True when the leak starts firing, False when it resolves.
        t: Time of the change.
        rate_per_h: Growth rate (series units per hour).
        growth_for_s: How long the series has grown (the longest window that agrees).
        level: Current fitted level of the series.
        time_to_full_s: Projected time until `total`, None when no total is known.
        window_s: The longest window that agrees.
    """

    firing: bool
    t: float
    rate_per_h: float
    growth_for_s: float
    level: float
    time_to_full_s: float | None
    window_s: float


class _Window:
    __slots__ = ("n", "third", "length", "width", "floor", "sub_k", "sub_end", "sub_vals", "subs", "diffs", "firing",
                 "slope_h")

    def __init__(self, length: float, floor: float, n: int) -> None:
        self.n = n
        self.third = tuple(i * 3 // n for i in range(n))
        self.length = length
        self.width = length / n
        self.floor = floor
        self.sub_k = 0  # index of the open sub-bucket on the grid of `width`
        self.sub_end = -math.inf
        self.sub_vals: list[float] = []
        self.subs: deque[tuple[int, float]] = deque(maxlen=n)  # (sub-bucket index, median)
        # |differences| of consecutive sub-bucket medians over 4 windows: the noise scale.
        self.diffs: deque[float] = deque(maxlen=4 * n)
        self.firing = False
        self.slope_h = 0.0


class LeakSeries:
    """Incremental leak state for one series; feed it with `add` in time order.

    Args:
        rule: The leak rule's parameters.
        t0: Time the process was first seen (warm-up counts from here).
    """

    __slots__ = ("rule", "warm_end", "bucket_s", "cur_b", "cur_min", "windows", "firing", "since",
                 "fired_window")

    def __init__(self, rule: LeakRule, t0: float) -> None:
        self.rule = rule
        self.warm_end = t0 + rule.warmup_s
        self.bucket_s = rule.bucket_s if rule.bucket_s > 0 else 60.0
        self.cur_b = -1
        self.cur_min = math.inf
        n = max(6, int(rule.sub_buckets))
        self.windows = [_Window(w.window_s, max(w.min_rate_per_h, rule.min_rate_per_h), n) for w in rule.windows]
        self.firing = False
        self.since = 0.0
        self.fired_window: _Window | None = None

    def add(self, t: float, value: float, total: float | None = None) -> LeakFinding | None:
        """Take one reading.

        Args:
            t: Time of the reading (non-decreasing).
            value: The reading.
            total: Capacity the series grows towards (GPU or node memory), or None.

        Returns:
            A finding when the leak starts firing or resolves, else None.
        """
        if t < self.warm_end:
            return None
        b = int(t // self.bucket_s)
        if b == self.cur_b:
            if value < self.cur_min:
                self.cur_min = value
            return None
        found = None
        if self.cur_b >= 0:
            found = self._close_bucket(self.cur_b * self.bucket_s, self.cur_min, t, total)
        self.cur_b = b
        self.cur_min = value
        return found

    def _close_bucket(self, start: float, low: float, now: float, total: float | None) -> LeakFinding | None:
        found = None
        for w in self.windows:
            if start >= w.sub_end:
                if w.sub_vals:
                    vals = w.sub_vals
                    vals.sort()
                    n = len(vals)
                    med = vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
                    if w.subs:
                        w.diffs.append(abs(med - w.subs[-1][1]))
                    w.subs.append((w.sub_k, med))
                    if len(w.subs) >= w.n - 2:
                        f = self._evaluate(w, w.sub_k, now, total)
                        if f is not None:
                            found = f
                w.sub_k = int(start // w.width)
                w.sub_end = (w.sub_k + 1) * w.width
                w.sub_vals = [low]
            else:
                w.sub_vals.append(low)
        return found

    def _evaluate(self, w: _Window, last_k: int, now: float, total: float | None) -> LeakFinding | None:
        rule = self.rule
        if self.firing and w.length < self.fired_window.length:  # type: ignore[union-attr]
            return None
        n = w.n
        first_k = last_k - n + 1
        end = (last_k + 1) * w.width
        begin = end - w.length
        subs = w.subs
        if len(subs) == n and subs[0][0] == first_k:
            # The usual case, a full contiguous window: a cheap necessary test first, since
            # most windows of a healthy process end here.
            ys = [y for _, y in subs]
            if not self.firing:
                a, b = n // 3, 2 * n // 3
                l0, l1, l2 = min(ys[0:a]), min(ys[a:b]), min(ys[b:])
                if l2 - l0 < rule.min_growth * 0.5 or l1 <= l0 or l2 <= l1:
                    return None
            xs = [(k + 0.5) * w.width for k, _ in subs]
            thirds = w.third
        else:
            xs, ys, thirds = [], [], []  # type: ignore[assignment]
            for k, y in subs:
                if k >= first_k:
                    xs.append((k + 0.5) * w.width)
                    ys.append(y)
                    thirds.append(w.third[k - first_k])  # type: ignore[attr-defined]
            if len(xs) < n - 2 or len(set(thirds)) < 3:
                return None
        # Noise: consecutive sub-bucket medians differ by sqrt(2)*sigma*0.6745 in median.
        nd = len(w.diffs)
        if nd < n - 1:
            return None
        noise = 1.0483 * median(w.diffs)
        # A noise scale from few differences is itself uncertain: demand more while it is young.
        t_min = rule.min_t_stat
        fit = fit_window(xs, ys, thirds, end, noise)
        rate_h = fit.slope_per_s * 3600.0
        w.slope_h = rate_h
        ttf = None
        if total is not None and total > 0 and fit.slope_per_s > 0:
            ttf = max(0.0, (total - fit.level_end) / fit.slope_per_s)
        if self.firing:
            fw = self.fired_window
            assert fw is not None
            if w.length >= fw.length and rate_h < rule.resolve_fraction * rule.min_rate_per_h and all(
                    x.slope_h < rule.resolve_fraction * rule.min_rate_per_h
                    for x in self.windows if x.length >= fw.length and len(x.subs) >= x.n - 2):
                self.firing = False
                self.fired_window = None
                return LeakFinding(False, now, rate_h, now - self.since, fit.level_end, ttf, w.length)
            return None
        floor = w.floor
        if ttf is not None and ttf <= rule.urgent_time_to_full_s:
            floor = rule.min_rate_per_h
        expected = fit.slope_per_s * w.length / 3.0
        # One step spreads over at most two sub-bucket increments (the median of the
        # sub-bucket it falls in sits between the levels); a leak spreads over all of them.
        total_rise = median(ys[-3:]) - median(ys[:3])
        jump = max(ys[i + 2] - ys[i] for i in range(len(ys) - 2))
        slack = 2.0 * (noise or 0.0)
        ok = (jump <= rule.max_jump_fraction * total_rise + slack and rate_h >= floor
              and fit.slope_per_s * w.length >= rule.min_growth
              and fit.t_stat >= t_min
              and fit.rises[0] >= rule.rise_fraction * expected
              and fit.rises[1] >= rule.rise_fraction * expected)
        if not ok:
            return None
        self.firing = True
        self.fired_window = w
        self.since = begin
        return LeakFinding(True, now, rate_h, now - begin, fit.level_end, ttf, w.length)
