"""Leak detection on one series (GPU memory, RSS, threads, open fds) of one process.

How it decides, in the series' own time (seconds, never sample counts, so poll
intervals of 1–60 s, jitter and missing polls do not matter):

1. Samples in the first `warmup_s` after the process appears are ignored: the
   caching allocator grows in steps while it warms up.
2. Each sample only lowers the minimum of its `bucket_s` bucket (one comparison: this
   is all most samples cost). The minimum ignores upward spikes (checkpoint saves).
3. Every window W is cut into about `sub_buckets` points on a fixed grid whose width is
   a whole number of buckets (so every point summarises the same number of buckets);
   a point is the median of its bucket minima. Only when a point closes is the window
   analysed, and most analyses end at a cheap necessary test (the minimum of each third
   of the window must rise). The full test asks for:
   - a Theil–Sen slope at or above the window's rate floor and the rule's minimum rate;
   - growth over the window (slope * W) of at least `min_growth`;
   - a slope at least `min_t_stat` standard errors above zero, where the noise of a
     point is the larger of a robust scale of the point-to-point differences over the
     last eight windows (trend-free: centred on their median) and the robust scale of
     the window's own residuals;
   - a Mann–Kendall score of at least `min_mk_z`: rank-based, so it needs no noise
     scale and holds when the scale above came out small by chance;
   - the minimum of each third of the window above the previous third's by at least
     `rise_fraction` of the predicted rise, and no two consecutive increments carrying
     more than `max_jump_fraction` of the growth: growth that goes on, where one step
     followed by a plateau, or an evaluation phase that comes and goes, does not.
   Short windows have high rate floors (a fast leak fires within minutes), long ones
   the rule's own (a slow leak fires within hours). When the series would be full
   within `urgent_time_to_full_s`, every window uses the rule's own minimum rate.
4. A firing leak resolves when the slope over the window that fired (and every longer
   one) falls below `resolve_fraction` of the rule's minimum rate.

State per series is a handful of short lists, bounded by the windows, never by how
long the process runs.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

from .config import LeakRule
from .robust import THEIL_SEN_SE_FACTOR, mad_sigma, mann_kendall_s, mann_kendall_z, median, theil_sen

#: Point-to-point differences kept per window for the noise scale, in windows.
NOISE_HISTORY_WINDOWS = 8


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
    __slots__ = ("n", "wb", "width", "length", "floor", "third", "sxx", "pt_end", "ks", "ys", "diffs", "slope_h",
                 "gate")

    def __init__(self, length: float, floor: float, bucket_s: float, target: int, gate: float) -> None:
        # A point spans a whole number of buckets: points that summarise different numbers
        # of buckets would have different noise, and the noise test assumes one.
        self.wb = max(1, round(length / (target * bucket_s)))
        self.n = max(6, round(length / (self.wb * bucket_s)))
        self.width = self.wb * bucket_s
        self.length = self.n * self.width
        self.floor = floor
        self.gate = gate
        self.third = tuple(i * 3 // self.n for i in range(self.n))
        xs = [(k + 0.5) * self.width for k in range(self.n)]
        mx = sum(xs) / self.n
        self.sxx = sum((x - mx) ** 2 for x in xs)  # of a full window; a gap or two changes it little
        self.pt_end = 0  # first bucket index after the open point
        self.ks: list[int] = []  # point indexes on this window's grid, oldest first
        self.ys: list[float] = []  # point values (median of the point's bucket minima)
        self.diffs: list[float] = []  # differences of consecutive points, for the noise scale
        self.slope_h = 0.0


class LeakSeries:
    """Incremental leak state for one series; feed it with `add` in time order.

    The engine inlines the common case of `add` (a sample inside the open bucket only
    lowers `cur_min`) and calls `roll` otherwise; both paths are the same code here.

    Args:
        rule: The leak rule's parameters.
        t0: Time the process was first seen (warm-up counts from here).
    """

    __slots__ = ("rule", "warm_end", "bucket_s", "b_end", "cur_b", "cur_min", "bb", "bv", "next_b", "windows",
                 "firing", "since", "fired_window", "span_b")

    def __init__(self, rule: LeakRule, t0: float) -> None:
        self.rule = rule
        self.warm_end = t0 + rule.warmup_s
        self.bucket_s = rule.bucket_s if rule.bucket_s > 0 else 60.0
        # Until the warm-up ends, samples only lower `cur_min`, which the first `roll` discards.
        self.b_end = self.warm_end
        self.cur_b = -1
        self.cur_min = math.inf
        # Closed buckets over the longest window (the rank test reads them), and any still
        # needed by a window's open point: indexes, in order, and their minima.
        self.bb: list[int] = []
        self.bv: list[float] = []
        target = max(6, int(rule.sub_buckets))
        gate = rule.rise_fraction * rule.min_growth / 3.0
        self.windows = [_Window(w.window_s, max(w.min_rate_per_h, rule.min_rate_per_h), self.bucket_s, target, gate)
                        for w in rule.windows]
        self.span_b = max(w.n * w.wb for w in self.windows)
        self.next_b = 0
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
        if t < self.b_end:
            if value < self.cur_min:
                self.cur_min = value
            return None
        return self.roll(t, value, total)

    def roll(self, t: float, value: float, total: float | None) -> LeakFinding | None:
        """A reading at or after the end of the open bucket: close it and open the reading's."""
        bs = self.bucket_s
        b = int(t // bs)
        if b <= self.cur_b:  # float rounding at a bucket edge: still the open bucket
            if value < self.cur_min:
                self.cur_min = value
            self.b_end = (self.cur_b + 1) * bs
            return None
        found = None
        if self.cur_b >= 0:
            found = self._close_bucket(self.cur_b, self.cur_min, t, total)
        self.cur_b = b
        self.cur_min = value
        self.b_end = (b + 1) * bs
        return found

    def _close_bucket(self, b: int, low: float, now: float, total: float | None) -> LeakFinding | None:
        bb, bv = self.bb, self.bv
        bb.append(b)
        bv.append(low)
        if b + 1 < self.next_b:
            return None  # no window's point is complete yet
        found = None
        for w in self.windows:
            if b + 1 < w.pt_end:
                continue
            wb = w.wb
            if b >= w.pt_end:
                # A gap: `b` opens a later point. Close the earlier one if it had buckets.
                lo, hi = w.pt_end - wb, w.pt_end
                vals = bv[bisect_left(bb, lo):bisect_left(bb, hi)]
                if vals:
                    f = self._point(w, hi // wb - 1, vals, now, total)
                    if f is not None:
                        found = f
                w.pt_end = (b // wb + 1) * wb
            if b + 1 == w.pt_end:
                lo = w.pt_end - wb
                vals = bv[bisect_left(bb, lo):] if wb > 1 else [low]
                f = self._point(w, b // wb, vals, now, total)
                if f is not None:
                    found = f
                w.pt_end += wb
        # Keep the longest window's buckets, and any a window's open point still needs.
        keep = min(b + 1 - self.span_b, *(w.pt_end - w.wb for w in self.windows))
        if bb[0] < keep:
            del bb[:bisect_left(bb, keep)]
            del bv[:len(bv) - len(bb)]
        self.next_b = min(w.pt_end for w in self.windows)
        return found

    def _point(self, w: _Window, k: int, vals: list[float], now: float, total: float | None
               ) -> LeakFinding | None:
        n = len(vals)
        if n == 1:
            y = vals[0]
        else:
            vals.sort()
            y = vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
        ks, ys = w.ks, w.ys
        if ks and ks[-1] == k - 1:
            d = w.diffs
            d.append(y - ys[-1])
            if len(d) > NOISE_HISTORY_WINDOWS * w.n:
                del d[0]
        ks.append(k)
        ys.append(y)
        first_k = k - w.n + 1
        while ks[0] < first_k:
            del ks[0]
            del ys[0]
        if len(ks) < w.n - 2:
            return None
        return self._evaluate(w, k, now, total)

    def _evaluate(self, w: _Window, last_k: int, now: float, total: float | None) -> LeakFinding | None:
        rule = self.rule
        if self.firing and w.length < self.fired_window.length:  # type: ignore[union-attr]
            return None
        n = w.n
        first_k = last_k - n + 1
        ks, ys = w.ks, w.ys
        third = w.third
        if len(ks) == n:
            a, b = third.index(1), third.index(2)
            l0, l1, l2 = min(ys[:a]), min(ys[a:b]), min(ys[b:])
        else:
            lows = [math.inf, math.inf, math.inf]
            for k, y in zip(ks, ys, strict=True):
                i = third[k - first_k]
                if y < lows[i]:
                    lows[i] = y
            l0, l1, l2 = lows
            if l2 == math.inf or l1 == math.inf or l0 == math.inf:
                return None
        if not self.firing and (l1 - l0 < w.gate or l2 - l1 < w.gate):
            # Necessary for firing (each third rises by rise_fraction of slope * W / 3, at least
            # rise_fraction * min_growth / 3): most windows of a healthy process end here, unfitted.
            return None
        if len(w.diffs) < n - 1:
            return None
        width = w.width
        xs = [(k + 0.5) * width for k in ks]
        slope, icpt = theil_sen(xs, ys)
        end = (last_k + 1) * width
        level = icpt + slope * end
        rate_h = slope * 3600.0
        w.slope_h = rate_h
        ttf = None
        if total is not None and total > 0 and slope > 0:
            ttf = max(0.0, (total - level) / slope)
        if self.firing:
            fw = self.fired_window
            assert fw is not None
            limit = rule.resolve_fraction * rule.min_rate_per_h
            if rate_h < limit and all(x.slope_h < limit for x in self.windows
                                      if x.length >= fw.length and len(x.ks) >= x.n - 2):
                self.firing = False
                self.fired_window = None
                return LeakFinding(False, now, rate_h, now - self.since, level, ttf, w.length)
            return None
        floor = w.floor
        if ttf is not None and ttf <= rule.urgent_time_to_full_s:
            floor = rule.min_rate_per_h
        if rate_h < floor or slope * w.length < rule.min_growth:
            return None
        expected = slope * w.length / 3.0
        if l1 - l0 < rule.rise_fraction * expected or l2 - l1 < rule.rise_fraction * expected:
            return None
        # Noise of one point: the larger of the long-run scale of point-to-point differences
        # (a difference of two points has sqrt(2) times a point's noise) and the scale of this
        # window's residuals. Either alone comes out small by chance too often.
        sigma_d = mad_sigma(w.diffs) / math.sqrt(2.0)
        sigma_r = 1.4826 * median([abs(y - icpt - slope * x) for x, y in zip(xs, ys, strict=True)])
        sigma = max(sigma_d, sigma_r)
        se = THEIL_SEN_SE_FACTOR * sigma / math.sqrt(w.sxx)
        if se > 0 and slope < rule.min_t_stat * se:
            return None
        # One step spreads over at most two consecutive increments (a point that straddles it
        # sits between the levels); a leak spreads over all of them.
        total_rise = median(ys[-3:]) - median(ys[:3])
        jump = max(ys[i + 2] - ys[i] for i in range(len(ys) - 2))
        # The slack is the differences' noise scale: the residuals' would grow with the step itself.
        if jump > rule.max_jump_fraction * total_rise + 2.0 * sigma_d:
            return None
        # Last, as the dearest: the Mann–Kendall test over the window's bucket minima. Rank-based,
        # so it needs no noise scale and holds where the scales above came out small by chance;
        # on bucket minima (not points) it keeps the power that the reduction to points loses.
        lo_b = (last_k + 1) * w.wb - w.n * w.wb
        ranked = self.bv[bisect_left(self.bb, lo_b):]
        if mann_kendall_z(mann_kendall_s(ranked), len(ranked)) < rule.min_mk_z:
            return None
        begin = end - w.length
        self.firing = True
        self.fired_window = w
        self.since = begin
        return LeakFinding(True, now, rate_h, now - begin, level, ttf, w.length)
