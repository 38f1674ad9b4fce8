"""Leak detection on one series (GPU memory, RSS, threads, open fds) of one process.

How it decides, in the series' own time (seconds, never sample counts, so poll
intervals of 1–60 s, jitter and missing polls do not matter):

1. Samples in the first `warmup_s` after the process appears are ignored: the
   caching allocator grows in steps while it warms up. The bucket minima of its last
   third are kept for the bend test only.
2. Each sample only lowers the minimum of its `bucket_s` bucket (one comparison: this
   is all most samples cost). The minimum ignores upward spikes (checkpoint saves).
3. Every window W is cut into about `sub_buckets` points on a fixed grid whose width is
   a whole number of buckets (so every point summarises the same number of buckets);
   a point is the median of its bucket minima. The shortest window's points are single
   buckets and it is analysed every quarter of its length; the others' points span whole
   multiples of that cadence and a window is analysed when one of its points closes, so
   most bucket closes cost two appends. Most analyses end at a cheap necessary test (the
   minimum of each third of the window must rise). The full test asks for:
   - a Theil–Sen slope at or above the window's rate floor and the rule's minimum rate;
   - growth over the window (slope * W) of at least `min_growth`;
   - a slope at least `min_t_stat` standard errors above zero for windows of 4 h or more, more
     for shorter ones (as few noise-only chances an hour: `_for_length`), where the noise of a
     point is the scale of consecutive bucket minima over all the buckets kept, scaled to a
     point, raised where a robust scale of the point-to-point differences over the last eight
     windows (trend-free: centred on their median) or of the window's own residuals, each
     taken one standard error low, says more (`_point_noise`);
   - a Mann–Kendall score of at least `min_mk_z`: rank-based, so it needs no noise
     scale and holds when the scale above came out small by chance;
   - the minimum of each third of the window above the previous third's by at least
     `rise_fraction` of the predicted rise (and half the floor's): growth that goes on;
   - not one step, nor two: two (or three) flat levels do not fit the window's bucket minima
     better than a leak does (`_one_step`), where a step is sharp and a leak's rise spread out (in the
     75 minute window, three levels fit no better by MID_TWO_STEP_MARGIN where one fits nearly as well);
   - in a window of an hour or less, where minutes after a step of a few times the noise the
     step and a young leak fit about alike: the leak fits better than one step, the median of
     each third of the bucket minima rises by two standard errors (`_thirds_rise`), and where
     one step fits nearly as well, two analyses in a row pass;
   - no bend (`_bends_over`): the growth over the last three windows, and the warm-up's
     end after its last step, does not clearly slow down (a warm-up's long tail).
   Beside the windows, at every bucket close, a leak that began within the last half hour
   (`_young_leak`): flat bucket minima, then a line from where they end, tested as the
   windows are but on the minima themselves (a fast leak shows in four or five buckets,
   where a window's thirds need most of its length).
   Short windows have high rate floors (a fast leak fires within minutes), long ones
   the rule's own (a slow leak fires within hours). When the series would be full
   within `urgent_time_to_full_s`, every window uses the rule's own minimum rate.
   The alert reports the later half's slope when that is steeper (a short window that
   fires soon after the leak began still holds flat time) and projects the time to full
   from it.
4. Staircases (staircase.py): three similar steps up at regular intervals with flat treads
   fire at the third step, where each window sees one step and a plateau.
5. A firing leak resolves when the slope over the window that fired (and every longer
   one) falls below `resolve_fraction` of the rule's minimum rate.

State per series is a handful of short lists, bounded by the windows (the steps of twice the
longest, the warm-up's last third), never by how long the process runs.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

from .config import LeakRule
from .robust import MAD_REL_SE, THEIL_SEN_SE_FACTOR, mad_sigma, mann_kendall_s, mann_kendall_z, median, theil_sen
from .staircase import STAIR_MIN_TREAD_HOLDS, STEP_HOLD, Staircase, StepTracker

#: Windows this long or longer ask `min_t_stat` and `min_mk_z` as they are; shorter ones more (`_for_length`).
#: A fixed length, not the longest window's: a longer window added for slow leaks under heavy noise (its
#: noise-only chances come round less often) leaves the shorter windows' thresholds as they were.
REFERENCE_WINDOW_S = 14400.0
#: Point-to-point differences kept per window for the noise scale, in windows.
NOISE_HISTORY_WINDOWS = 8
#: Each third's minimum must rise by at least this fraction of what the window's rate floor
#: gives over a third (besides `rise_fraction` of the fitted rise): growth at the floor rate
#: shows in the minima, and most analyses of a healthy series end at this test, unfitted.
RISE_AT_FLOOR = 0.5
#: How much better (in a bucket minimum's variances) two flat levels must fit a window than a leak does
#: for its growth to count as one step (see `_one_step`).
STEP_MARGIN = 4.0
#: Windows this short or shorter must fit a leak better than one step by SHORT_STEP_MARGIN bucket variances:
#: minutes after a step of a few times the noise, the step and a young leak fit a short window about as well,
#: and only waiting tells them apart (a short window is for a clear, fast leak; longer ones take the rest).
SHORT_WINDOW_S = 3600.0
SHORT_STEP_MARGIN = 2.0
#: ... and each third's median above the last's by this many standard errors (`_thirds_rise`).
THIRDS_Z = 2.0
#: ... and where it does by less than CONFIRM_STEP_MARGIN, fire at the second analysis in a row that passes.
CONFIRM_STEP_MARGIN = 10.0
#: The same for two steps (three flat levels): two more parameters to fit, so more margin.
TWO_STEP_MARGIN = 8.0
#: ... and only where a leak leaves this many times the bucket variance a bucket (a line misfits two steps).
LINE_MISFIT = 2.0
#: A window over an hour and up to MID_WINDOW_S (the 75 minute one) where the leak fits better than one step by less
#: than MID_STEP_ZONE bucket variances and two steps (three flat levels) fit better than the leak by MID_TWO_STEP_MARGIN
#: is two steps: a cache step of two or three times the noise, 20-30 minutes old after a chance run of high minima,
#: passes its one-step test (STEP_MARGIN) as a leak that began in its last third (the young test's guard, narrower:
#: under heavy noise three levels fit a slow leak's minima about as well as a line).
MID_WINDOW_S = 4500.0
MID_STEP_ZONE = 3.0
MID_TWO_STEP_MARGIN = 4.0
#: Two steps LONG_TREAD_B buckets or more apart on flat levels (`_flat_treads`) are two steps, however well a line
#: fits: a leak grows between the breaks a fit may find as fast as over the window, so the levels' own slope must be
#: under TREAD_RATIO of the line's by TREAD_Z standard errors. As far apart as the shortest tread of a staircase
#: (staircase.py), which fires at its third step: two steps can be two unrelated events (an allocator cache that
#: grew twice half an hour apart, which the 75 minute window took for a leak), three are a pattern.
LONG_TREAD_B = STAIR_MIN_TREAD_HOLDS * STEP_HOLD
TREAD_RATIO = 0.5
TREAD_Z = 3.0
#: The fewest buckets a leak's rise spans (a rise over fewer is as much a step, still to be seen).
STEP_MIN_RISE_B = 4
#: A leak that began within the last YOUNG_WINDOW_S (`_young_leak`), read on its bucket minima at every bucket close:
#: flat for YOUNG_FLAT_B buckets or more, then a line over STEP_MIN_RISE_B or more that meets the flat level within a
#: bucket. The windows' tests need the growth in each third of a window, so about 12 of the shortest one's 15
#: minutes; a fast leak shows in four or five buckets. Its floor is that of the shortest window at least
#: YOUNG_WINDOW_S long, its t that window's, raised for being tried at every bucket and every breakpoint; both parts
#: must fit within YOUNG_MISFIT times the noise's squared residuals (a step, a spike, a warm-up's curving tail
#: misfit them; a chi-square of a couple of dozen degrees of freedom passes twice its mean about once in a
#: thousand).
YOUNG_WINDOW_S = 1800.0
YOUNG_FLAT_B = 3
#: Where one step fits within this many bucket variances of the young leak, two steps must fit worse than it.
YOUNG_TWO_STEP_ZONE = 20.0
YOUNG_MISFIT = 2.0
#: A young leak is looked for once the buckets kept give this fraction of the young window's consecutive differences
#: for the noise (a leak that begins soon after the warm-up waited for a whole window of them, a third of the clear
#: leaks' delay where it did); from fewer than a window's, the noise is read one of its standard errors high.
YOUNG_NOISE_FRACTION = 0.5
#: A rising series' bucket minimum is read where its bucket's first sample fell, anywhere in the bucket at polls
#: as long as a bucket: on the line it adds a uniform spread of this many buckets times the slope.
YOUNG_TIMING = 0.29
#: Standard errors by which the growth must slow down (see `LeakSeries._bends_over`) to count as a
#: warm-up's tail: a leak's own wobble passes for one about one analysis in forty, which delays it a little.
BEND_Z = 2.0
#: Windows' worth of bucket minima the bend test reads (as many as are kept, at most).
BEND_SPAN = 3
#: The part of the warm-up (its end) whose bucket minima the bend test reads: a warm-up's tail that
#: outlasts the warm-up shows there as the faster growth it slows down from.
BEND_CONTEXT_FRACTION = 1.0 / 3.0
#: A rise between consecutive bucket minima of the warm-up beyond this many standard errors is one of its
#: steps: the bend test reads the warm-up only after its last one.
BEND_STEP_Z = 4.0


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


class _WindowShape(NamedTuple):
    """What a window's analysis needs that depends on the rule only (computed once, not per process)."""

    wb: int            # buckets a point
    n: int             # points in the window
    width: float       # seconds a point
    length: float      # seconds the window (n * width)
    floor: float       # the window's rate floor, per hour
    third: tuple[int, ...]  # the third (0, 1, 2) of each point slot
    a3: int            # first slot of the second third
    b3: int            # first slot of the last third
    gate: float        # the least rise of each third's minimum that firing implies
    gate_total: float  # the same with a known total (the floor may drop to the rule's rate)
    sxx: float         # sum of squared x deviations of a full window
    t_need: float      # the least t statistic of the slope (min_t_stat, for the window's length)
    z_need: float      # the least Mann–Kendall score (min_mk_z, the same way)


class _Plan(NamedTuple):
    """What every series of one rule shares."""

    shapes: list[_WindowShape]
    direct: int | None  # index of the window of one-bucket points, if any
    every: int          # the direct window's analysis cadence, in buckets
    span_b: int         # buckets kept
    young_b: int        # buckets a young leak is looked for in (`_young_leak`; 0: never)
    young_floor: float  # its rate floor, per hour
    young_t: float      # the least t of its slope


# rule → its plan; keyed by identity (hashing a rule costs more than the lookup saves), the rule
# held in the value so that its id is not reused while the entry lives
_PLANS: dict[int, tuple[LeakRule, float, _Plan]] = {}


def _plan(rule: LeakRule, bs: float) -> _Plan:
    """A rule's plan: computed once per rule, not once per process."""
    got = _PLANS.get(id(rule))
    if got is not None and got[0] is rule and got[1] == bs:
        return got[2]
    target = max(6, int(rule.sub_buckets))
    # Buckets per point: about `sub_buckets` points per window. A window of one-bucket points
    # (the shortest, at most one) reads the bucket lists straight and is analysed every quarter
    # of its length (analysing it at every bucket would cost more than all the samples); the
    # others when one of their points closes, and their points span whole multiples of that
    # cadence, so that all analyses fall on the same few buckets.
    wbs = [max(1, round(w.window_s / (target * bs))) for w in rule.windows]
    every = max(1, round(round(rule.windows[wbs.index(1)].window_s / bs) / 4)) if 1 in wbs else 1
    wbs = [1 if (wb == 1 and i == wbs.index(1)) else max(every, round(wb / every) * every)
           for i, wb in enumerate(wbs)]
    shapes = [_window_shape(w.window_s, max(w.min_rate_per_h, rule.min_rate_per_h), bs, wb, rule)
              for w, wb in zip(rule.windows, wbs, strict=True)]
    direct = next((i for i, shape in enumerate(shapes) if shape.wb == 1), None)
    # Buckets kept: the longest window's, and the direct window's noise history.
    span_b = max(max(shape.wb * shape.n for shape in shapes),
                 NOISE_HISTORY_WINDOWS * shapes[direct].n + 1 if direct is not None else 0)
    young_b, young_floor, young_t = 0, 0.0, 0.0
    if direct is not None:
        # the floor and t of the shortest window that is as long, its t raised for as many more chances: tried at
        # every bucket (the windows every `every`) and at each breakpoint
        young_b = max(shapes[direct].n, round(YOUNG_WINDOW_S / bs))
        like = min((sh for sh in shapes if sh.length >= young_b * bs), key=lambda sh: sh.length, default=shapes[-1])
        young_floor = like.floor
        young_t = _for_length(like.t_need, 1.0, every * max(1, young_b - YOUNG_FLAT_B - STEP_MIN_RISE_B + 1))
    plan = _Plan(shapes, direct, every, span_b, young_b, young_floor, young_t)
    if len(_PLANS) > 256:  # rules files reloaded many times: start afresh
        _PLANS.clear()
    _PLANS[id(rule)] = (rule, bs, plan)
    return plan


def _window_shape(length: float, floor: float, bucket_s: float, wb: int, rule: LeakRule) -> _WindowShape:
    """A window's shape for points of `wb` buckets, about `length` seconds long."""
    # A point spans a whole number of buckets: points that summarise different numbers
    # of buckets would have different noise, and the noise test assumes one.
    n = max(6, round(length / (wb * bucket_s)))
    width = wb * bucket_s
    length = n * width
    third = tuple(i * 3 // n for i in range(n))
    # Firing needs slope >= floor, slope * W >= min_growth, and each third's minimum above the
    # previous one's by rise_fraction * slope * W / 3: so by at least `gate`. With a known
    # total the floor may drop to the rule's own rate (urgent), hence `gate_total`.
    gate = max(rule.rise_fraction * rule.min_growth, RISE_AT_FLOOR * floor * length / 3600.0) / 3.0
    gate_total = max(rule.rise_fraction * rule.min_growth, RISE_AT_FLOOR * rule.min_rate_per_h * length / 3600.0) / 3.0
    xs = [(k + 0.5) * width for k in range(n)]
    mx = sum(xs) / n
    sxx = sum((x - mx) ** 2 for x in xs)  # of a full window; a gap or two changes it little
    longest = min(REFERENCE_WINDOW_S, max(w.window_s for w in rule.windows))
    return _WindowShape(wb, n, width, length, floor, third, third.index(1), third.index(2), gate, gate_total, sxx,
                        _for_length(rule.min_t_stat, length, longest), _for_length(rule.min_mk_z, length, longest))


def _for_length(z: float, length: float, longest: float) -> float:
    """The score a window of `length` must reach for as few false alarms an hour as a window of `longest` at `z`.

    A window's noise-only tests come round about once a window length: a window ten times shorter gets
    ten times the chances in an hour, so each must be ten times as unlikely (a normal tail).
    """
    if length >= longest or z <= 0:
        return z
    nd = NormalDist()
    return nd.inv_cdf(1.0 - nd.cdf(-z) * length / longest)


class _Window:
    __slots__ = ("n", "wb", "width", "length", "floor", "third", "sxx", "pt_end", "ks", "ys", "diffs",
                 "gate", "gate_total", "a3", "b3", "t_need", "z_need", "passed_k")

    def __init__(self, shape: _WindowShape) -> None:
        # copied into slots: the analyses read them on every bucket close, an attribute each
        self.wb, self.n, self.width, self.length, self.floor = shape.wb, shape.n, shape.width, shape.length, shape.floor
        self.third, self.a3, self.b3, self.sxx = shape.third, shape.a3, shape.b3, shape.sxx
        self.gate, self.gate_total = shape.gate, shape.gate_total
        self.t_need, self.z_need = shape.t_need, shape.z_need
        self.pt_end = 0  # first bucket index after the open point
        self.passed_k = -1  # the last analysis (its last point's index) that passed every test
        # Points (index on this window's grid, value = median of the point's bucket minima),
        # oldest first. A window of one-bucket points reads the series' bucket lists instead.
        self.ks: list[int] = []
        self.ys: list[float] = []
        self.diffs: list[float] = []  # differences of consecutive points, for the noise scale


class LeakSeries:
    """Incremental leak state for one series; feed it with `add` in time order.

    The engine inlines the common case of `add` (a sample inside the open bucket only
    lowers `cur_min`) and calls `roll` otherwise; both paths are the same code here.

    Args:
        rule: The leak rule's parameters.
        t0: Time the process was first seen (warm-up counts from here).
    """

    __slots__ = ("rule", "warm_end", "bucket_s", "b_end", "cur_b", "cur_min", "bb", "bv", "next_b", "windows",
                 "direct", "every", "due", "grouped", "next_g", "firing", "since", "fired_window", "span_b",
                 "total", "stairs", "in_warmup", "pre_b", "pre_v", "young", "young_k")

    def __init__(self, rule: LeakRule, t0: float) -> None:
        self.rule = rule
        self.warm_end = t0 + rule.warmup_s
        self.bucket_s = rule.bucket_s if rule.bucket_s > 0 else 60.0
        # Until the warm-up's last BEND_CONTEXT_FRACTION, samples only lower `cur_min`, which the first
        # `roll` discards. From then until the warm-up ends, bucket minima go to `pre_b`/`pre_v`, read by
        # the bend test only (a warm-up's tail shows there as the growth it slows down from).
        self.in_warmup = rule.warmup_s > 0
        self.b_end = self.warm_end - BEND_CONTEXT_FRACTION * rule.warmup_s if self.in_warmup else self.warm_end
        self.pre_b: list[int] = []
        self.pre_v: list[float] = []
        self.cur_b = -1
        self.cur_min = math.inf
        # Closed buckets over the longest window (the rank test and one-bucket points read
        # them), and any a window's open point still needs: indexes, in order, and minima.
        self.bb: list[int] = []
        self.bv: list[float] = []
        plan = _plan(rule, self.bucket_s)
        self.span_b = plan.span_b
        self.windows = [_Window(shape) for shape in plan.shapes]
        self.direct = self.windows[plan.direct] if plan.direct is not None else None
        self.every = plan.every if self.direct else 1 << 62
        self.young = (plan.young_b, plan.young_floor * self.bucket_s / 3600.0, plan.young_t)  # buckets, floor, t
        self.young_k = -2  # the last bucket at which a young leak that one step fits nearly as well passed
        self.grouped = [w for w in self.windows if w is not self.direct]
        # Work is due when a bucket at or past these closes: the direct window's analysis, a
        # grouped window's point, either.
        self.due = 0 if self.direct is not None else 1 << 62
        self.next_g = 0
        self.next_b = 0
        self.firing = False
        self.since = 0.0
        self.fired_window: _Window | None = None
        self.total: float | None = None  # the capacity last given, for `current`
        # Steps seen over twice the longest window: a staircase of treads as long as half of it fits.
        self.stairs = StepTracker(2 * self.span_b)

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
        cb = self.cur_b
        if self.in_warmup:
            if t < self.warm_end and b <= cb:  # float rounding at a bucket edge: still the open bucket
                if value < self.cur_min:
                    self.cur_min = value
                self.b_end = min((cb + 1) * bs, self.warm_end)
                return None
            if cb >= 0:
                self.pre_b.append(cb)
                self.pre_v.append(self.cur_min)
            if t < self.warm_end:
                self.cur_b = b
                self.cur_min = value
                self.b_end = min((b + 1) * bs, self.warm_end)
                return None
            self.in_warmup = False
            self.cur_b = cb = -1  # the first bucket after the warm-up opens below
        if b <= cb:  # float rounding at a bucket edge: still the open bucket
            if value < self.cur_min:
                self.cur_min = value
            self.b_end = (cb + 1) * bs
            return None
        low = self.cur_min
        self.total = total
        self.cur_b = b
        self.cur_min = value
        self.b_end = (b + 1) * bs
        if cb < 0:
            return None  # the first bucket after the warm-up opens
        bb = self.bb
        bb.append(cb)
        self.bv.append(low)
        if cb + 1 < self.next_b:
            # No window is due: the usual bucket close ends here.
            if bb[0] <= cb - self.span_b:
                del bb[0]
                del self.bv[0]
            return None
        return self._points(cb, now=t, total=total)

    def current(self, now: float) -> LeakFinding | None:
        """While firing: the leak's figures as of `now` (rate, level, time to full, how long it grows), fitted
        over the window that fired as it stands; None when not firing or the window holds too few points.

        The alert's text is refreshed from this while it fires: the figures of the moment it fired go stale
        (a rate that doubled, an hour to full that is ten minutes now). The same estimate as at firing: the
        later half's slope when that is steeper.
        """
        w = self.fired_window
        if not self.firing or w is None:
            return None
        if w is self.direct:
            if not self.bb:
                return None
            last_k = self.bb[-1]
            i = bisect_left(self.bb, last_k - w.n + 1)
            ks, ys = self.bb[i:], self.bv[i:]
        else:
            ks, ys = w.ks, w.ys
            if not ks:
                return None
            last_k = ks[-1]
        if len(ks) < 3:
            return None
        xs = [(k + 0.5) * w.width for k in ks]
        slope, icpt = theil_sen(xs, ys)
        end = (last_k + 1) * w.width
        half = len(xs) // 2
        recent, icpt2 = theil_sen(xs[half:], ys[half:])
        if recent > slope:
            slope, icpt = recent, icpt2
        level = icpt + slope * end
        ttf = _time_to_full(self.total, level, slope)
        return LeakFinding(True, now, slope * 3600.0, max(0.0, now - self.since), level, ttf, w.length)

    def _points(self, b: int, now: float, total: float | None) -> LeakFinding | None:
        """Bucket `b` closed, and some window is due: the direct one, or a grouped one's point is complete."""
        found = None
        if b + 1 >= self.due and self.direct is not None:
            found = self._direct(self.direct, b, now, total)
            self.due = ((b + 1) // self.every + 1) * self.every
        if found is None and self.direct is not None and not self.firing:
            found = self._young(self.direct, b, now, total)
        bb, bv = self.bb, self.bv
        if b + 1 >= self.next_g:
            next_g = 1 << 62
            for w in self.grouped:
                wb = w.wb
                if b + 1 >= w.pt_end:
                    if b >= w.pt_end:
                        # A gap: `b` opens a later point. Close the earlier one if it had buckets.
                        lo, hi = w.pt_end - wb, w.pt_end
                        vals = bv[bisect_left(bb, lo):bisect_left(bb, hi)]
                        if vals:
                            f = self._push(w, hi // wb - 1, median(vals), now, total)
                            if f is not None:
                                found = f
                        w.pt_end = (b // wb + 1) * wb
                    if b + 1 == w.pt_end:
                        # The point's buckets end the lists; all of them unless some were missing.
                        vals = bv[-wb:] if len(bb) >= wb and bb[-wb] == b + 1 - wb else bv[bisect_left(bb, b + 1 - wb):]
                        vals.sort()
                        h = len(vals) // 2
                        f = self._push(w, b // wb, vals[h] if len(vals) % 2 else 0.5 * (vals[h - 1] + vals[h]),
                                       now, total)
                        if f is not None:
                            found = f
                        w.pt_end += wb
                if w.pt_end < next_g:
                    next_g = w.pt_end
            self.next_g = next_g
        # a young leak is looked for at every bucket (`_young`), the windows when due
        self.next_b = b + 1 if self.direct is not None and not self.firing else min(self.due, self.next_g)
        rule = self.rule
        if self.stairs.scan(bb, bv, rule.min_growth / 3.0) and found is None and not self.firing:
            sc = self.stairs.staircase(rule.min_rate_per_h * self.bucket_s / 3600.0, rule.min_growth)
            if sc is not None:
                found = self._fire_staircase(sc, now, total)
        # Keep the buckets the windows still read (every open point starts within them).
        keep = b + 1 - self.span_b
        if bb[0] < keep:
            del bb[:bisect_left(bb, keep)]
            del bv[:len(bv) - len(bb)]
        return found

    def _direct(self, w: _Window, b: int, now: float, total: float | None) -> LeakFinding | None:
        """Analyse the window of one-bucket points that ends with bucket `b`."""
        bb, bv = self.bb, self.bv
        n = w.n
        m = len(bb)
        if m >= n and bb[-n] == b - n + 1 and not self.firing:
            # Full and contiguous: the thirds' minima must each rise by `gate`, which firing
            # implies (see _Window). Most analyses of a healthy process end here.
            g = w.gate if total is None else w.gate_total
            l1 = min(bv[w.a3 - n:w.b3 - n])
            if min(bv[w.b3 - n:]) - l1 < g or l1 - min(bv[-n:w.a3 - n]) < g:
                return None
            return self._evaluate(w, b, bb[-n:], bv[-n:], now, total)
        i = bisect_left(bb, b - n + 1)
        if m - i < n - 2:
            return None
        return self._evaluate(w, b, bb[i:], bv[i:], now, total)

    def _young(self, w: _Window, b: int, now: float, total: float | None) -> LeakFinding | None:
        """A leak that began within the last YOUNG_WINDOW_S, which ends with bucket `b` (see `_young_leak`); `w`
        is the direct window, which watches it once it fires.

        Looked for at every bucket close, over as many buckets as the direct window needs at least; most end at
        a cheap gate (the last two buckets above the earlier ones' median by half the least growth that fires).
        """
        bb, bv = self.bb, self.bv
        young_b, floor_b, t_need = self.young
        lo = bisect_left(bb, b - young_b + 1)
        n = len(bb) - lo
        if n < w.n - 2:
            return None
        xs, ys = bb[lo:], bv[lo:]
        rule = self.rule
        least = max(rule.min_growth, floor_b * STEP_MIN_RISE_B)
        if ys[-1] + ys[-2] - 2.0 * median(ys[:n - STEP_MIN_RISE_B]) < least:
            return None
        bdiffs = [bv[j] - bv[j - 1] for j in range(1, len(bb)) if bb[j] == bb[j - 1] + 1]
        if len(bdiffs) < YOUNG_NOISE_FRACTION * young_b:
            return None  # too young to know the noise
        sigma = mad_sigma(bdiffs) / math.sqrt(2.0)
        if len(bdiffs) < young_b:
            sigma *= 1.0 + MAD_REL_SE / math.sqrt(len(bdiffs))
        fit = _young_leak(xs, ys, sigma, floor_b, rule.min_growth, t_need)
        if fit is None:
            return None
        slope_b, start_b, level, sse = fit
        if _one_step(xs, ys, STEP_MIN_RISE_B, 1, sigma, -SHORT_STEP_MARGIN):
            return None
        if rule.bend_ratio > 0 and self._bends_over(w, b, sigma, rule.bend_ratio):
            return None
        if _one_step(xs, ys, STEP_MIN_RISE_B, 1, sigma, -YOUNG_TWO_STEP_ZONE) and _two_steps_sse(ys) < sse:
            # a step that fits not much worse, and two fit better: a cache step of a few times the noise just after
            # a chance run of high minima (or a late minimum at sparse polls) is a ramp of two
            return None
        if _one_step(xs, ys, STEP_MIN_RISE_B, 1, sigma, -CONFIRM_STEP_MARGIN):
            # one step fits nearly as well (a cache step minutes old): it fires at the second bucket in a row that
            # passes, as the short windows do (the step's flat is longer by then)
            prev, self.young_k = self.young_k, b
            if prev != b - 1:
                return None
        rate = slope_b / self.bucket_s
        self.firing = True
        self.fired_window = w
        self.since = start_b * self.bucket_s
        return LeakFinding(True, now, rate * 3600.0, max(0.0, now - self.since), level,
                           _time_to_full(total, level, rate), w.length)

    def _push(self, w: _Window, k: int, y: float, now: float, total: float | None) -> LeakFinding | None:
        """Append point (k, y) to a grouped window and analyse the window when it may fire (or resolve)."""
        ks, ys = w.ks, w.ys
        if ks and ks[-1] == k - 1:
            d = w.diffs
            d.append(y - ys[-1])
            if len(d) > NOISE_HISTORY_WINDOWS * w.n:
                del d[0]
        ks.append(k)
        ys.append(y)
        n = w.n
        first_k = k - n + 1
        if ks[0] < first_k:
            while ks[0] < first_k:
                del ks[0]
                del ys[0]
        m = len(ks)
        if m < n - 2:
            return None
        if m == n and not self.firing:
            # Full window (n distinct indexes in n slots: contiguous); the same gate as above.
            a3, b3 = w.a3, w.b3
            g = w.gate if total is None else w.gate_total
            l1 = min(ys[a3:b3])
            if min(ys[b3:]) - l1 < g or l1 - min(ys[:a3]) < g:
                return None
        return self._evaluate(w, k, ks, ys, now, total)

    def _rate_h(self, w: _Window) -> float:
        """Theil–Sen slope per hour of a grouped window's points now (-inf with too few of them)."""
        if len(w.ks) < w.n - 2:
            return -math.inf
        return theil_sen([(k + 0.5) * w.width for k in w.ks], w.ys)[0] * 3600.0

    def _evaluate(self, w: _Window, last_k: int, ks: list[int], ys: list[float], now: float, total: float | None
                  ) -> LeakFinding | None:
        """The full test of one window whose points are (ks, ys), the last at index `last_k`."""
        rule = self.rule
        if self.firing and w is not self.fired_window:
            return None  # while firing only the window that fired is watched; longer ones at resolution
        first_k = last_k - w.n + 1
        lows = _third_minima(w, first_k, ks, ys)
        if lows is None:
            return None
        l0, l1, l2 = lows
        if self.firing:
            # Still clearly growing (each third's minimum above the last by what the resolve rate
            # would give over a third): no fit needed. A leak that stops flattens the thirds first.
            rise = rule.resolve_fraction * rule.min_rate_per_h * w.length / 3600.0 / 3.0
            if l1 - l0 >= rise and l2 - l1 >= rise:
                return None
        elif l1 - l0 < w.gate_total or l2 - l1 < w.gate_total:
            return None
        diffs = self._point_diffs(w, last_k)
        if len(diffs) < w.n - 1:
            return None
        xs = [(k + 0.5) * w.width for k in ks]
        slope, icpt = theil_sen(xs, ys)
        end = (last_k + 1) * w.width
        level = icpt + slope * end
        ttf = _time_to_full(total, level, slope)
        if self.firing:
            return self._resolution(w, now, slope * 3600.0, level, ttf)
        floor = w.floor
        if ttf is not None and ttf <= rule.urgent_time_to_full_s:
            floor = rule.min_rate_per_h
        if slope * 3600.0 < floor or slope * w.length < rule.min_growth:
            return None
        need = max(rule.rise_fraction * slope * w.length / 3.0, RISE_AT_FLOOR * floor * w.length / 3600.0 / 3.0)
        if l1 - l0 < need or l2 - l1 < need:
            return None
        sigma, sigma_d, sigma_free, sigma_bucket = self._point_noise(w, diffs, xs, ys, slope, icpt)
        se = THEIL_SEN_SE_FACTOR * sigma / math.sqrt(w.sxx)
        if se > 0 and slope < w.t_need * se:
            return None
        lo = bisect_left(self.bb, first_k * w.wb)
        hi = bisect_left(self.bb, (last_k + 1) * w.wb, lo)
        if w.length <= SHORT_WINDOW_S and not _thirds_rise(self.bb[lo:hi], self.bv[lo:hi], first_k * w.wb,
                                                            w.n * w.wb, need, sigma_bucket):
            return None
        like_step = False
        if _step_candidate(ys, rule.max_jump_fraction, sigma_d):
            short = w.length <= SHORT_WINDOW_S
            margin = -SHORT_STEP_MARGIN if short else STEP_MARGIN
            long_b = LONG_TREAD_B
            if _one_step(self.bb[lo:hi], self.bv[lo:hi], STEP_MIN_RISE_B, w.wb, sigma_bucket, margin, long_b):
                return None
            if (not short and w.length <= MID_WINDOW_S
                    and _one_step(self.bb[lo:hi], self.bv[lo:hi], STEP_MIN_RISE_B, w.wb, sigma_bucket, -MID_STEP_ZONE)
                    and _two_steps_sse(self.bv[lo:hi]) + MID_TWO_STEP_MARGIN * sigma_bucket ** 2
                    < _leak_sse(self.bb[lo:hi], self.bv[lo:hi], STEP_MIN_RISE_B, w.wb)):
                return None
            like_step = short and _one_step(self.bb[lo:hi], self.bv[lo:hi], STEP_MIN_RISE_B, w.wb, sigma_bucket,
                                            -CONFIRM_STEP_MARGIN, long_b)
        if rule.bend_ratio > 0 and self._bends_over(w, last_k, sigma_bucket, rule.bend_ratio):
            return None
        # Last, as the dearest: the Mann–Kendall test over the window's bucket minima. Rank-based,
        # so it needs no noise scale and holds where the scales above came out small by chance;
        # on bucket minima (not points) it keeps the power that the reduction to points loses.
        ranked = self.bv[bisect_left(self.bb, first_k * w.wb):]
        if mann_kendall_z(mann_kendall_s(ranked), len(ranked)) < rule.min_mk_z:
            return None
        if like_step:
            # A short window that one step fits nearly as well as a leak fires at its second analysis in a row
            # that passes: minutes after a step of a few times the noise, one analysis can take it for a young
            # leak, two in a row seldom do (the step is older, its flat longer); a leak passes again at the next.
            prev, w.passed_k = w.passed_k, last_k
            if prev != last_k - (self.every if w is self.direct else 1):
                return None
        return self._fire(w, now, xs, ys, slope, level, end, total, ttf)

    def _point_diffs(self, w: _Window, last_k: int) -> list[float]:
        """Differences of consecutive points over the last NOISE_HISTORY_WINDOWS windows."""
        if w is not self.direct:
            return w.diffs
        # The direct window's points are the buckets: its differences come from the bucket lists.
        bb, bv = self.bb, self.bv
        i = bisect_left(bb, last_k - NOISE_HISTORY_WINDOWS * w.n)
        return [bv[j] - bv[j - 1] for j in range(i + 1, len(bb)) if bb[j] == bb[j - 1] + 1]

    def _point_noise(self, w: _Window, diffs: list[float], xs: list[float], ys: list[float], slope: float,
                     icpt: float) -> tuple[float, float, float, float]:
        """(noise of one point, the part of it from point-to-point differences, the trend-free part, the
        trend-free noise of one bucket minimum).

        The base is the scale of consecutive bucket minima over every bucket kept, scaled to a median
        of `wb` of them (var ~ pi / (2 wb + 1) for normal noise, a little above the exact value): the
        most precise of the three, from hundreds of differences. Two guards, each read one of its own
        standard errors low (`_surely`), raise it where the noise is not what the buckets say (slow
        wander, correlated noise): the long-run scale of point-to-point differences (a difference of
        two points has sqrt(2) times a point's noise) and the scale of this window's residuals. Taken
        at face value, the larger of three estimates is above the noise whenever one comes out high by
        chance, and from a dozen or two values that is often: a slow leak under heavy noise never
        cleared its t threshold. While the process is too young for the bucket scale, the larger of the
        two guards as they are.
        """
        sigma_d = mad_sigma(diffs) / math.sqrt(2.0)
        sigma_r = 1.4826 * median([abs(y - icpt - slope * x) for x, y in zip(xs, ys, strict=True)])
        bb, bv = self.bb, self.bv
        bdiffs = [bv[j] - bv[j - 1] for j in range(1, len(bb)) if bb[j] == bb[j - 1] + 1]
        sigma_bucket = mad_sigma(bdiffs) / math.sqrt(2.0) if len(bdiffs) >= w.n else 0.0
        sigma_b = sigma_bucket * math.sqrt(math.pi / (2 * w.wb + 1)) if w.wb > 1 else sigma_bucket
        if sigma_b > 0:
            sigma = max(sigma_b, _surely(sigma_d, len(diffs)), _surely(sigma_r, len(ys)))
        else:
            sigma = max(sigma_d, sigma_r)
        # For tests of the trend's shape, the bucket scale alone: the residuals from a line, and the
        # spread of point-to-point differences, grow with the very curvature `_bends_over` looks for.
        return (sigma, sigma_d, sigma_b if sigma_b > 0 else sigma_d,
                sigma_bucket if sigma_bucket > 0 else sigma_d)

    def _bends_over(self, w: _Window, last_k: int, sigma: float, ratio: float) -> bool:
        """Whether the growth up to the window's end slows down clearly: over the bucket minima of the
        last BEND_SPAN windows (as many as are kept, and the warm-up's last part), the slope at the end, from a
        quadratic fit, is under `ratio` times the slope at the start, by more than BEND_Z standard errors.

        A warm-up's tail (the reserve creeping on ever slower, an exponential approach) bends over; a
        leak grows as fast at the end as at the start or, over a span that holds its start (flat, then
        rising), faster. Over more than the window: a tail's last half hour may look straight, the
        hour before it does not. Least squares on orthogonal polynomials of the buckets' times (centred
        x, and x^2 less its mean), so that the curvature's estimate does not lean on the slope's; its
        standard error from `sigma`, the trend-free noise of a bucket minimum.
        """
        end_b = (last_k + 1) * w.wb
        begin_b = end_b - BEND_SPAN * w.n * w.wb
        bb, bv = self.bb, self.bv
        i = bisect_left(bb, begin_b)
        j = bisect_left(bb, end_b)
        xs = bb[i:j]
        ys = bv[i:j]
        if (self.pre_b and self.pre_b[-1] >= begin_b
                and end_b - w.n * w.wb - self.pre_b[-1] <= self.rule.warmup_s / self.bucket_s):
            # The warm-up's end, for a window that begins within a warm-up's length of it (the time
            # an allocator takes to settle; an older window's slowdown is its own), from after its
            # last step (the allocator's steps would pass for a slowdown; a tail is smooth), and only
            # where the noise is known.
            pb, pv = self.pre_b, self.pre_v
            k = bisect_left(pb, begin_b)
            jump = BEND_STEP_Z * math.sqrt(2.0) * sigma
            rises = [pv[q] - pv[q - 1] for q in range(k + 1, len(pv))]
            if rises:
                # a step stands out from the other rises; a tail's rises come in a row
                jump = max(jump, 3.0 * abs(median(rises)))
                for m in range(len(pv) - 1, k, -1):
                    if pv[m] - pv[m - 1] > jump:
                        k = m
                        break
            if sigma > 0:
                xs = pb[k:] + xs
                ys = pv[k:] + ys
        n = len(xs)
        if n < 6:
            return False
        mx = sum(xs) / n
        us = [x - mx for x in xs]
        mu2 = sum(u * u for u in us) / n
        suu = sum(u * u for u in us)
        if suu <= 0:
            return False
        # x^2 less its mean is orthogonal to x only where the buckets lie symmetric about their mean; with
        # buckets missing, or the warm-up's end before the window, take x's part out of it (Gram-Schmidt),
        # else the curvature leans on the slope and a tail's clear bend reads as none.
        k = sum(u * (u * u - mu2) for u in us) / suu
        qs = [u * u - mu2 - k * u for u in us]
        sqq = sum(q * q for q in qs)
        if sqq <= 0:
            return False
        c = sum(q * y for q, y in zip(qs, ys, strict=True)) / sqq
        b = sum(u * y for u, y in zip(us, ys, strict=True)) / suu - c * k  # the slope at the mean
        lo, hi = us[0], us[-1]
        start, end = b + 2.0 * c * lo, b + 2.0 * c * hi
        if start <= 0:
            return False
        se_gap = (ratio * -lo + hi) * 2.0 * sigma / math.sqrt(sqq)  # of ratio * start - end, through c
        return ratio * start - end > BEND_Z * se_gap

    def _resolution(self, w: _Window, now: float, rate_h: float, level: float, ttf: float | None
                    ) -> LeakFinding | None:
        """While firing: resolved once this window's slope, and every longer one's, is below the resolve rate."""
        rule = self.rule
        limit = rule.resolve_fraction * rule.min_rate_per_h
        if rate_h < limit and all(self._rate_h(x) < limit for x in self.grouped if x.length > w.length):
            self.firing = False
            self.fired_window = None
            return LeakFinding(False, now, rate_h, now - self.since, level, ttf, w.length)
        return None

    def _fire_staircase(self, sc: Staircase, now: float, total: float | None) -> LeakFinding:
        """Similar steps up at regular intervals with flat treads (see staircase.py): the leak fires.

        Watched from here on (for its resolution and its figures) by the longest window, which spans
        several treads; the rate is a step a tread.
        """
        w = max(self.windows, key=lambda x: x.length)
        self.firing = True
        self.fired_window = w
        self.since = sc.first_b * self.bucket_s
        rate = sc.rate_per_b / self.bucket_s
        return LeakFinding(True, now, rate * 3600.0, max(0.0, now - self.since), sc.level,
                           _time_to_full(total, sc.level, rate), max(0.0, now - self.since))

    def _fire(self, w: _Window, now: float, xs: list[float], ys: list[float], slope: float, level: float,
              end: float, total: float | None, ttf: float | None) -> LeakFinding:
        """The window passed every test: the leak fires.

        A short window often fires while it still holds some flat time before the leak began, so
        its slope understates the rate. The alert reports the later half's slope when that is
        steeper (and projects the time to full from it): an underestimated rate would promise
        hours that are not there.
        """
        begin = end - w.length
        self.firing = True
        self.fired_window = w
        self.since = begin
        rate_h = slope * 3600.0
        half = len(xs) // 2
        recent, icpt2 = theil_sen(xs[half:], ys[half:])
        if recent > slope:
            rate_h = recent * 3600.0
            level = icpt2 + recent * end
            if total is not None and total > 0:
                ttf = max(0.0, (total - level) / recent)
        return LeakFinding(True, now, rate_h, now - begin, level, ttf, w.length)


def _thirds_rise(xs: list[int], ys: list[float], begin: int, span: int, need: float, sigma: float) -> bool:
    """Whether the median of each third of a window's bucket minima (xs, ys; the window's `span` buckets from
    `begin`) is above the previous third's by `need`, and by THIRDS_Z standard errors of the difference
    (`sigma`: a bucket minimum's noise).

    A leak's rise goes on through the window; one step's falls in one third, and the median of the third it
    falls in sits at one of the two levels, beside a neighbour's, so one of the two rises is noise. (The
    minima of the thirds, which the cheap gate reads, and the slope of a window's half-dozen points let a
    step of two or three times the noise through a short window every few hundred process-days.)
    """
    parts: list[list[float]] = [[], [], []]
    for x, y in zip(xs, ys, strict=True):
        parts[min(2, (x - begin) * 3 // span)].append(y)
    if not all(parts):
        return False
    m0, m1, m2 = (median(v) for v in parts)
    # a median of m bucket minima varies as sigma^2 pi / (2 m + 1) (normal noise, a little above the exact)
    se = sigma * math.sqrt(2.0 * math.pi / (2 * min(len(v) for v in parts) + 1))
    least = max(need, THIRDS_Z * se)
    return m1 - m0 >= least and m2 - m1 >= least


def _young_leak(xs: list[int], ys: list[float], sigma: float, floor_b: float, min_growth: float, t_need: float
                ) -> tuple[float, float, float, float] | None:
    """A leak that began inside a window of bucket minima (xs, ys; `sigma` a bucket minimum's noise): (slope a
    bucket, the bucket it began in, the level at the window's end, the fit's squared residuals), or None.

    For each breakpoint, a flat level over the first YOUNG_FLAT_B buckets or more and a least-squares line over
    the rest (STEP_MIN_RISE_B buckets or more); the best fit must be a line that meets the flat level within a
    bucket before its first (a leak starts somewhere in the bucket whose minimum is still flat), at `floor_b`
    or more a bucket, `min_growth` over its span, `t_need` standard errors above zero (the noise: `sigma`, or
    the fit's own residuals one standard error low where they say more), with squared residuals within
    YOUNG_MISFIT times what the noise gives.
    """
    n = len(ys)
    my = sum(ys) / n
    ds = [y - my for y in ys]  # centred once: the values are large, the spread small
    var = sigma * sigma
    best = None
    for j in range(YOUNG_FLAT_B, n - STEP_MIN_RISE_B + 1):
        flat = ds[:j]
        a = sum(flat) / j
        seg_x, seg_d = xs[j:], ds[j:]
        m = n - j
        mx = sum(seg_x) / m
        md = sum(seg_d) / m
        sxx = sum((x - mx) ** 2 for x in seg_x)
        b = sum((x - mx) * (d - md) for x, d in zip(seg_x, seg_d, strict=True)) / sxx
        if b <= 0:
            continue
        c = md - b * mx
        # where the line meets the flat level: within a bucket before its first, by the noise of both fits
        start = (a - c) / b
        se_meet = sigma * math.sqrt(1.0 / j + 1.0 / m + (seg_x[0] - mx) ** 2 / sxx) / b
        if not seg_x[0] - 1.5 - 3.0 * se_meet <= start <= seg_x[0] + 0.5 + 3.0 * se_meet:
            continue
        # then one line that bends there (flat, then rising): the flat buckets fix the level it rises from,
        # so its slope is surer than the segment's alone
        start = min(max(start, seg_x[0] - 1.0), float(seg_x[0]))
        hs = [x - start if x > start else 0.0 for x in xs]
        mh = sum(hs) / n
        shh = sum((h - mh) ** 2 for h in hs)
        b = sum((h - mh) * d for h, d in zip(hs, ds, strict=True)) / shh
        c = -b * mh  # the flat level (ds are centred)
        sse = sum((d - c - b * h) ** 2 for h, d in zip(hs, ds, strict=True))
        if best is None or sse < best[0]:
            best = (sse, j, b, c, shh, start, hs)
    if best is None:
        return None
    sse, j, b, c, shh, start, hs = best
    m = n - j
    if b < floor_b or b * hs[-1] < min_growth:
        return None
    if sse > YOUNG_MISFIT * ((j - 1) * var + (m - 1) * (var + (YOUNG_TIMING * b) ** 2)):
        return None
    noise = max(sigma, _surely(1.4826 * median([abs(d - c - b * h) for h, d in zip(hs, ds, strict=True)]), n))
    if noise <= 0 or b * math.sqrt(shh) < t_need * noise:
        return None
    return b, start, my + c + b * (hs[-1] + 1.0), sse


def _two_steps_sse(ys: list[float]) -> float:
    """The least squared residuals of `ys` as three flat levels (two steps up or down, anywhere)."""
    n = len(ys)
    my = sum(ys) / n
    s1, s2 = [0.0], [0.0]
    for y in ys:
        s1.append(s1[-1] + (y - my))
        s2.append(s2[-1] + (y - my) ** 2)

    def sse(a: int, b: int) -> float:
        m = s1[b] - s1[a]
        return s2[b] - s2[a] - m * m / (b - a)

    return min((sse(0, i) + sse(i, j) + sse(j, n) for i in range(1, n - 1) for j in range(i + 1, n)),
               default=math.inf)


def _leak_sse(xs: list[int], ys: list[float], min_rise_b: int, stride: int) -> float:
    """The least squared residuals of bucket minima (xs, ys) as a leak: a line, or flat and then a line over the last
    `min_rise_b` buckets or more (breakpoints every `stride` buckets)."""
    n = len(ys)
    my = sum(ys) / n
    ds = [y - my for y in ys]  # centred: the values are large, the spread small
    base = sum(d * d for d in ds)
    best = math.inf
    for b in range(xs[0], xs[-1] - min_rise_b + 1, max(1, stride)):
        hs = [x - b if x > b else 0 for x in xs]
        mh = sum(hs) / n
        shh = sum((h - mh) ** 2 for h in hs)
        if shh <= 0:
            continue
        shy = sum((h - mh) * d for h, d in zip(hs, ds, strict=True))
        best = min(best, base - shy * shy / shh)
    return best


def _third_minima(w: _Window, first_k: int, ks: list[int], ys: list[float]) -> tuple[float, float, float] | None:
    """The minimum of each third of a window's points; None when a third has no point."""
    if len(ks) == w.n:
        a, b = w.a3, w.b3
        return min(ys[:a]), min(ys[a:b]), min(ys[b:])
    third = w.third
    lows = [math.inf, math.inf, math.inf]
    for k, y in zip(ks, ys, strict=True):
        i = third[k - first_k]
        if y < lows[i]:
            lows[i] = y
    if math.inf in lows:
        return None
    return lows[0], lows[1], lows[2]


def _surely(scale: float, n: int) -> float:
    """A robust scale from `n` values, one of its standard errors low (a MAD's is about MAD_REL_SE / sqrt(n))."""
    return scale * max(0.0, 1.0 - MAD_REL_SE / math.sqrt(n)) if n > 0 else 0.0


def _time_to_full(total: float | None, level: float, slope: float) -> float | None:
    """Seconds until `level` growing at `slope` a second reaches `total`; None without a total or growth."""
    if total is not None and total > 0 and slope > 0:
        return max(0.0, (total - level) / slope)
    return None


def _step_candidate(ys: list[float], max_jump_fraction: float, sigma_d: float) -> bool:
    """Whether two consecutive point increments carry more than `max_jump_fraction` of the window's growth.

    One step spreads over at most two (a point that straddles it sits between the levels); a leak over
    all of them. So does a leak that began inside a short window of few points, and noise: the
    candidate is judged by `_one_step`, on the window's bucket minima.
    """
    total_rise = median(ys[-3:]) - median(ys[:3])
    jump = max(ys[i + 2] - ys[i] for i in range(len(ys) - 2))
    return jump > max_jump_fraction * total_rise


def _flat_treads(xs: list[int], ds: list[float], cuts: tuple[int, ...], sigma: float) -> bool:
    """Whether the levels between steps cut at `cuts` (indexes into xs) are flat: their common slope (each level
    about its own mean) is under TREAD_RATIO of the line's over the whole window by TREAD_Z standard errors
    (`sigma`: a bucket minimum's noise).

    A leak grows between any two breaks a fit may choose, as fast as over the window; a cache that grows in
    steps, ever more rarely, is flat between them, however the line, or three levels, fit the window as a whole.
    """
    x0 = xs[0]

    def centred(a: int, b: int) -> tuple[float, float]:
        """(sum of squared x deviations, sum of x deviations times ds) over [a, b)."""
        m = b - a
        if m < 2:
            return 0.0, 0.0
        sx = sum(x - x0 for x in xs[a:b]) / m
        sd = sum(ds[a:b]) / m
        sxx = sum((x - x0 - sx) ** 2 for x in xs[a:b])
        return sxx, sum((x - x0 - sx) * (d - sd) for x, d in zip(xs[a:b], ds[a:b], strict=True))

    all_xx, all_xd = centred(0, len(xs))
    bounds = (0, *cuts, len(xs))
    parts = [centred(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    w_xx = sum(p[0] for p in parts)
    if all_xx <= 0 or w_xx <= 0 or sigma <= 0:
        return False
    line = all_xd / all_xx
    return line > 0 and sum(p[1] for p in parts) / w_xx + TREAD_Z * sigma / math.sqrt(w_xx) < TREAD_RATIO * line


def _one_step(xs: list[int], ys: list[float], min_rise_b: int, stride: int, sigma: float, margin: float,
              long_b: int = 1 << 30) -> bool:
    """Whether one step, or two, fit a window's bucket minima (xs, ys) better than a leak does: two flat
    levels by more than `margin` bucket variances (`sigma`: a bucket minimum's noise; a negative margin
    asks the leak to fit better than one step by as much), three by more than TWO_STEP_MARGIN.

    A leak: a line, or flat and then a line over the last `min_rise_b` buckets or more (breakpoints
    every `stride` buckets). On bucket minima a step is sharp (the bucket it falls in keeps the lower
    level), where a point straddling it is not; a leak's rise is spread out. Two steps: a long window
    (hours) can hold two unrelated ones (a larger batch, later a larger evaluation set), which a line
    fits better than one step; three similar ones are a staircase (staircase.py). The second step is
    sought on either side of the best single one (the best pair, where the steps stand apart). Two steps
    `long_b` buckets or more apart count wherever their levels are flat (`_flat_treads`), the line's misfit
    aside: a cache that grew twice, half an hour apart, under noise of a fifth of its steps.
    """
    n = len(ys)
    if n < 4:
        return False
    tot = sum(ys)
    my = tot / n
    ds = [y - my for y in ys]  # centred once: the values are large, the spread small
    s1 = [0.0]
    s2 = [0.0]
    for d in ds:
        s1.append(s1[-1] + d)
        s2.append(s2[-1] + d * d)

    def sse(a: int, b: int) -> float:
        """Squared deviations of ds[a:b] from their mean."""
        m = s1[b] - s1[a]
        return s2[b] - s2[a] - m * m / (b - a)

    def best_split(a: int, b: int) -> tuple[float, int]:
        """The least squared deviations of ds[a:b] as two flat levels, and where the second begins."""
        return min(((sse(a, m) + sse(m, b), m) for m in range(a + 1, b)), default=(math.inf, a))

    best_step, m1 = best_split(0, n)
    left, ml = best_split(0, m1)
    right, mr = best_split(m1, n)
    best_two, cuts = min((left + sse(m1, n), (ml, m1)), (sse(0, m1) + right, (m1, mr)))
    best_leak = _leak_sse(xs, ds, min_rise_b, stride)
    var = sigma * sigma
    if best_step + margin * var < best_leak:
        return True
    if (best_two + TWO_STEP_MARGIN * var < best_leak and xs[cuts[1]] - xs[cuts[0]] >= long_b
            and _flat_treads(xs, ds, cuts, sigma)):
        return True
    # Two steps only where the leak fits clearly worse than the noise allows: under heavy noise a slow leak's
    # minima are fitted by three levels about as well as by a line, and the search for two breaks wins by chance.
    return best_leak > LINE_MISFIT * n * var and best_two + TWO_STEP_MARGIN * var < best_leak
