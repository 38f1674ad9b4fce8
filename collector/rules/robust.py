"""Robust statistics for the leak rules: pure functions over a few points.

The leak rules reduce a window to at most a dozen points (the minimum per
sub-bucket), so the exact Theil–Sen estimator (median of pairwise slopes) costs
a few dozen divisions and tolerates up to ~29 % outlying points.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Theil–Sen line through the points.

    Args:
        xs: Abscissas (need not be sorted; equal ones are skipped in pairs).
        ys: Ordinates, same length as `xs`.

    Returns:
        (slope, intercept): slope is the median of pairwise slopes, intercept the
        median of y - slope * x. (0.0, median(ys)) when no pair has distinct x.
    """
    n = len(xs)
    slopes = []
    for i in range(n):
        xi, yi = xs[i], ys[i]
        for j in range(i + 1, n):
            dx = xs[j] - xi
            if dx != 0.0:
                slopes.append((ys[j] - yi) / dx)
    if not slopes:
        return 0.0, median(ys)
    slope = median(slopes)
    return slope, median([y - slope * x for x, y in zip(xs, ys, strict=True)])


@dataclass(frozen=True, slots=True)
class WindowFit:
    """What one window says about growth.

    Attributes:
        slope_per_s: Theil–Sen slope (series units per second).
        t_stat: slope divided by its robust standard error (inf when noise-free).
        rises: Rise of the second third over the first and of the last over the second
            (each third's minimum), series units.
        level_end: Fitted level at the end of the window.
    """

    slope_per_s: float
    t_stat: float
    rises: tuple[float, float]
    level_end: float


def fit_window(xs: Sequence[float], ys: Sequence[float], thirds: Sequence[int], end: float,
               noise: float | None = None) -> WindowFit:
    """Fit a window reduced to points, one per sub-bucket.

    Args:
        xs: Sub-bucket centre times.
        ys: Sub-bucket minima.
        thirds: For each point, which third of the window it is in (0, 1, 2).
        end: End time of the window, where `level_end` is taken.
        noise: Standard deviation of one point, estimated from a longer history; when
            None (or smaller), 1.4826 * MAD of the residuals is used. A dozen residuals
            alone underestimate the noise too often.

    Returns:
        The fit.
    """
    slope, icpt = theil_sen(xs, ys)
    resid = [abs(y - (icpt + slope * x)) for x, y in zip(xs, ys, strict=True)]
    sigma = 1.4826 * median(resid)
    if noise is not None and noise > sigma:
        sigma = noise
    mx = sum(xs) / len(xs)
    sxx = sum((x - mx) ** 2 for x in xs)
    se = sigma / math.sqrt(sxx) if sxx > 0 else math.inf
    t_stat = slope / se if se > 0 else (math.inf if slope > 0 else 0.0)
    lows = [math.inf, math.inf, math.inf]
    for k, y in zip(thirds, ys, strict=True):
        if y < lows[k]:
            lows[k] = y
    return WindowFit(slope, t_stat, (lows[1] - lows[0], lows[2] - lows[1]), icpt + slope * end)
