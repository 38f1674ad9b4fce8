"""Robust statistics for the leak rules: pure functions over a few points.

The leak rules reduce a window to a dozen or so points, so the exact Theil–Sen
estimator (median of pairwise slopes) costs about a hundred divisions. The
Mann–Kendall trend test runs on the window's bucket minima (up to a few hundred).
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

#: 1 / Phi^-1(3/4): turns a median absolute deviation into a standard deviation (normal noise).
MAD_TO_SIGMA = 1.4826
#: The relative standard error of a MAD scale over n values is about this over sqrt(n) (normal noise).
MAD_REL_SE = 1.17
#: Theil–Sen's slope varies more than least squares' (asymptotic efficiency ~0.91 on normal
#: noise, less on a dozen points): its standard error is this factor times the OLS one.
THEIL_SEN_SE_FACTOR = 1.15


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def mad_sigma(values: Sequence[float]) -> float:
    """Robust standard deviation of `values`: 1.4826 * median |v - median(v)|.

    Centring on the median (rather than on zero) makes the scale of first differences
    blind to a linear trend: a leak's steady increments do not inflate its own noise.
    """
    m = median(values)
    return MAD_TO_SIGMA * median([abs(v - m) for v in values])


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Theil–Sen line through the points.

    Args:
        xs: Abscissas in increasing order.
        ys: Ordinates, same length as `xs`.

    Returns:
        (slope, intercept): slope is the median of pairwise slopes, intercept the median
        of y - slope * x. (0.0, median(ys)) when no pair has distinct x.
    """
    n = len(xs)
    slopes = []
    for i in range(n - 1):
        xi, yi = xs[i], ys[i]
        for j in range(i + 1, n):
            dx = xs[j] - xi
            if dx > 0.0:
                slopes.append((ys[j] - yi) / dx)
    if not slopes:
        return 0.0, median(ys)
    slope = median(slopes)
    return slope, median([y - slope * x for x, y in zip(xs, ys, strict=True)])


def mann_kendall_s(ys: Sequence[float]) -> int:
    """Mann–Kendall statistic: the sum of sign(y_j - y_i) over pairs i < j, in time order.

    Counted with a sorted prefix and bisection, so a few hundred points cost a few
    hundred C-level insertions rather than tens of thousands of Python comparisons.
    """
    seen: list[float] = []
    s = 0
    for j, y in enumerate(ys):
        lo = bisect_left(seen, y)
        s += lo - (j - bisect_right(seen, y, lo))
        seen.insert(lo, y)
    return s


def mann_kendall_z(s: int, n: int) -> float:
    """Normal score of a Mann–Kendall statistic S over n points (no ties, continuity-corrected).

    Distribution-free for independent points: it needs no noise scale at all.
    """
    if n < 3:
        return 0.0
    sd = math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    if s > 0:
        return (s - 1) / sd
    if s < 0:
        return (s + 1) / sd
    return 0.0
