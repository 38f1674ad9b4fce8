"""A GPU's NVML violation time for `record`, kept compact: job_slowdown's culprit reads it (the share of a window a
GPU was held down or capped), so a replay needs it at each counter reading the collector kept.

A GPU at its power cap, as most are under training, moves its power time at every reading: kept as serialized
messages beside each reading it cost 23 KiB a GPU (bench/bench_health_history.py), so it is kept here as rows of
floats in two arrays, a new row only when a value moved (5 doubles a row), and only the policies the rule reads.
"""
from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Mapping

__all__ = ["KEPT_POLICIES", "ViolationHistory"]

#: The policies job_slowdown reads (collector/rules/slowdown_causes.py: HELD_POLICIES and CAP_POLICY), by the
#: agent's names (agent/health/counters.py's VIOLATION_POLICIES).
KEPT_POLICIES = ("power", "thermal", "board_limit", "reliability")
_WIDTH = len(KEPT_POLICIES)


class ViolationHistory:
    """The violation time at each change, at most `rows` rows (+ a slack the trim takes in one go)."""

    __slots__ = ("rows", "times", "values")

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.times = array("d")
        self.values = array("d")  # _WIDTH a row; NaN: that policy not read

    def add(self, t: float, seconds: Mapping[str, float]) -> None:
        """A reading's violation time (its map, by policy): a row when it differs from the last one."""
        row = [float(seconds[p]) if p in seconds else math.nan for p in KEPT_POLICIES]
        if self.times and _same(self.values[-_WIDTH:], row) or not self.times and all(map(math.isnan, row)):
            return
        self.times.append(t)
        self.values.extend(row)
        # A row stands for the readings after it until the next one, and rows are at most one a reading, so the
        # last `rows` of them cover the last `rows` readings; trimmed a few at a time (an array has no popleft).
        extra = len(self.times) - self.rows
        if extra > max(8, self.rows // 8):
            del self.times[:extra]
            del self.values[:extra * _WIDTH]

    def at(self, t: float) -> dict[str, float]:
        """The violation time as of time `t` (the last row at or before it), by policy; {} when none."""
        i = bisect.bisect_right(self.times, t)
        if not i:
            return {}
        row = self.values[(i - 1) * _WIDTH:i * _WIDTH]
        return {p: v for p, v in zip(KEPT_POLICIES, row, strict=True) if not math.isnan(v)}


def _same(a: array, b: list[float]) -> bool:
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))
