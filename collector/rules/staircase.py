"""Staircase detection on a leak series' bucket minima: similar steps up, at regular intervals, flat between.

A leak that allocates in chunks (a cache that gains an entry every epoch, a list of tensors appended
every N steps) grows in steps with flat treads between. The slope windows of `leak.py` see it late
when the treads are long: a window that holds one step and a tread looks like one step, which is no
leak. A reader of the chart calls it at the third step, not the second: two steps can be two
unrelated events (a larger batch, later a larger evaluation set), three similar ones, evenly spaced,
with flat treads, are a pattern. This is that reading:

1. Every bucket boundary i is scored once, when the STEP_HOLD buckets after it have closed:
   J = median(the STEP_HOLD bucket minima from i) - median(the STEP_HOLD before). A median of
   STEP_HOLD ignores a spike of a bucket or two (a checkpoint), and on bucket minima a step is
   sharp (the bucket it falls in keeps the lower level).
2. |J| above STEP_Z standard errors of J (from the noise of consecutive bucket minima, the same
   trend-free scale the slope test uses) and above a third of the rule's `min_growth` is a step, up
   or down; scores within STEP_HOLD buckets of each other are one step (the largest).
3. A staircase: the last STAIR_STEPS steps are all up, their sizes within STAIR_SIZE_RATIO of each
   other, the treads between them within STAIR_TREAD_RATIO of each other and each at least
   STAIR_MIN_TREAD_HOLDS * STEP_HOLD buckets, each tread flat (the level after a step and the level
   before the next differ by under STAIR_FLAT of the mean step), and the rate (mean step over mean
   tread) and growth at least the rule's. An evaluation phase (up, then down), a single step, two
   steps, a ramp (steps at every boundary, no tread) or a warm-up's tail (treads that are not flat)
   are not.

State: the scan position and the steps seen in the last `keep_b` buckets (steps are at least
STEP_HOLD buckets apart, so at most keep_b / STEP_HOLD of them), never more however long the run.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from typing import NamedTuple

from .robust import mad_sigma

#: Buckets on each side of a boundary whose medians score it.
STEP_HOLD = 5
#: Standard errors of the difference of two medians of STEP_HOLD bucket minima a step must exceed.
STEP_Z = 5.0
STAIR_STEPS = 3
STAIR_SIZE_RATIO = 2.0
#: Treads within this factor of each other: a step is found within a bucket or two, so a leak's even treads
#: stay well inside it, where an allocator cache that steps ever more rarely (each gap 1.6x or more the
#: last) falls outside it (at 1.5, treads of 67 and 96 min passed for a staircase).
STAIR_TREAD_RATIO = 1.35
STAIR_MIN_TREAD_HOLDS = 3
STAIR_FLAT = 0.25
#: Buckets a noise scale is reused for.
SIGMA_REUSE_B = 15


class Step(NamedTuple):
    b: int          # first bucket at the new level
    size: float     # the score J (negative: a step down)
    before: float   # median of the STEP_HOLD bucket minima before
    after: float    # median of the STEP_HOLD bucket minima from b


class Staircase(NamedTuple):
    first_b: int        # the first step's bucket
    rate_per_b: float   # mean step over mean tread, series units a bucket
    level: float        # the level after the last step
    growth: float       # the steps' sum


def _median(vals: list[float]) -> float:
    vals.sort()
    h = len(vals) // 2
    return vals[h] if len(vals) % 2 else 0.5 * (vals[h - 1] + vals[h])


class StepTracker:
    """Steps of one series' bucket minima, found as the buckets close; see the module's docstring."""

    __slots__ = ("next_i", "steps", "keep_b", "sigma_j", "sigma_at")

    def __init__(self, keep_b: int) -> None:
        self.next_i = -1         # the next boundary to score (-1: from the first bucket kept)
        self.steps: list[Step] = []
        self.keep_b = keep_b     # steps older than this many buckets are dropped
        # The noise scale, reused for SIGMA_REUSE_B buckets: a noisy series passes the cheap size
        # test at most boundaries, and the scale of a few hundred differences changes slowly.
        self.sigma_j = math.inf
        self.sigma_at = -(1 << 62)

    def scan(self, bb: list[int], bv: list[float], min_step: float) -> bool:
        """Score every boundary whose STEP_HOLD buckets after it have closed; True when a step up was added."""
        if not bb:
            return False
        h = STEP_HOLD
        last = bb[-1]
        i = max(self.next_i, bb[0] + h)
        added = False
        n = len(bb)
        while i + h - 1 <= last:
            mid = n - 1 - (last - i)  # where bucket i sits when none is missing since
            if mid - h >= 0 and bb[mid] == i and bb[mid - h] == i - h:
                lo, hi = mid - h, min(n, mid + h)
            else:
                lo = bisect_left(bb, i - h)
                mid = bisect_left(bb, i, lo)
                hi = bisect_left(bb, i + h, mid)
            if mid - lo >= h - 1 and hi - mid >= h - 1:
                before = _median(bv[lo:mid])
                after = _median(bv[mid:hi])
                j = after - before
                if abs(j) >= min_step:
                    if last - self.sigma_at >= SIGMA_REUSE_B:
                        self.sigma_j = self._sigma_j(bb, bv)
                        self.sigma_at = last
                    if abs(j) >= STEP_Z * self.sigma_j:
                        added |= self._add(Step(i, j, before, after))
            i += 1
        self.next_i = i
        cut = last - self.keep_b
        if self.steps and self.steps[0].b < cut:
            self.steps = [s for s in self.steps if s.b >= cut]
        return added

    @staticmethod
    def _sigma_j(bb: list[int], bv: list[float]) -> float:
        """Standard error of J under noise only: sqrt(2 * pi / (2 * STEP_HOLD)) bucket-minimum scales."""
        diffs = [bv[k] - bv[k - 1] for k in range(1, len(bb)) if bb[k] == bb[k - 1] + 1]
        if len(diffs) < 2 * STEP_HOLD:
            return math.inf  # too young to tell a step from the noise
        sigma = mad_sigma(diffs) / math.sqrt(2.0)
        return sigma * math.sqrt(math.pi / STEP_HOLD)

    def _add(self, step: Step) -> bool:
        """Record a step; one within STEP_HOLD buckets of the last, same direction, is the same step."""
        steps = self.steps
        if steps:
            prev = steps[-1]
            if step.b - prev.b < STEP_HOLD and (prev.size > 0) == (step.size > 0):
                if abs(step.size) > abs(prev.size):
                    steps[-1] = step
                    return step.size > 0
                return False
        steps.append(step)
        return step.size > 0

    def staircase(self, min_rate_per_b: float, min_growth: float) -> Staircase | None:
        """The staircase the last STAIR_STEPS steps make, or None."""
        if len(self.steps) < STAIR_STEPS:
            return None
        last = self.steps[-STAIR_STEPS:]
        sizes = [s.size for s in last]
        if min(sizes) <= 0 or max(sizes) > STAIR_SIZE_RATIO * min(sizes):
            return None
        treads = [b.b - a.b for a, b in zip(last, last[1:], strict=False)]
        if min(treads) < STAIR_MIN_TREAD_HOLDS * STEP_HOLD or max(treads) > STAIR_TREAD_RATIO * min(treads):
            return None
        mean_step = sum(sizes) / len(sizes)
        if any(abs(b.before - a.after) > STAIR_FLAT * mean_step for a, b in zip(last, last[1:], strict=False)):
            return None
        growth = last[-1].after - last[0].before
        rate = mean_step / (sum(treads) / len(treads))
        if rate < min_rate_per_b or growth < min_growth:
            return None
        return Staircase(last[0].b, rate, last[-1].after, growth)
