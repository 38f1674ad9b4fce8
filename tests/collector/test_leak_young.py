"""A leak that began minutes ago (`_young_leak`, read at every bucket close): a fast leak fires within a few buckets
of its start; one step, a warm-up's curving tail and noise alone are not a young leak."""
import math
import random

import pytest
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.rules.leak import CONFIRM_STEP_MARGIN, STEP_MIN_RISE_B, LeakSeries, _one_step, _young_leak

MB = 1024 * 1024
RULE = load_rules().gpu_memory_leak
SIGMA = 10 * MB
FLOOR_B = 70 * MB / 60  # the 30 min window's floor, a bucket


def _minima(f, n: int = 30, seed: int = 1) -> tuple[list[int], list[float]]:
    rng = random.Random(seed)
    return list(range(n)), [f(x) + rng.gauss(0, SIGMA) for x in range(n)]


def test_a_fast_leak_five_buckets_old_is_a_young_leak_from_where_it_began():
    xs, ys = _minima(lambda x: 60 * MB * max(0.0, x - 24.4))  # 3.5 GiB/h from bucket 24.4
    fit = _young_leak(xs, ys, SIGMA, FLOOR_B, RULE.min_growth, 5.3)
    assert fit is not None
    slope, start, _, _ = fit
    assert 50 * MB < slope < 70 * MB
    assert 23.5 <= start <= 25.5


@pytest.mark.parametrize("seed", range(20))
def test_one_step_noise_alone_or_a_warm_up_tail_is_no_young_leak(seed):
    step = _minima(lambda x: 60 * MB * (x >= 25), seed=seed)  # six times the noise, five buckets old
    noise = _minima(lambda x: 0.0, seed=seed)
    tail = _minima(lambda x: 1500 * MB * (1 - math.exp(-(x + 10) / 12)), seed=seed)  # bends over throughout
    for xs, ys in (noise, tail):
        assert _young_leak(xs, ys, SIGMA, FLOOR_B, RULE.min_growth, 5.3) is None
    # a step may pass for a line that began a few buckets before it, but one step fits it nearly as well: `_young`
    # waits for a second analysis (the series-level test below)
    xs, ys = step
    assert (_young_leak(xs, ys, SIGMA, FLOOR_B, RULE.min_growth, 5.3) is None
            or _one_step(xs, ys, STEP_MIN_RISE_B, 1, SIGMA, -CONFIRM_STEP_MARGIN))


def _fired(value, minutes: float, poll: float, seed: int = 3) -> float | None:
    """When a LeakSeries fed value(t, rng) every `poll` s (jittered, from t = 0) first fires, seconds; None if never."""
    rng = random.Random(seed)
    s = LeakSeries(RULE, 0.0)
    t = 0.0
    while t < minutes * 60:
        f = s.add(t, value(t, rng))
        if f is not None and f.firing:
            return t
        t += poll * rng.uniform(0.7, 1.3)
    return None


@pytest.mark.parametrize("poll", [1, 15, 60])
def test_a_fast_leak_fires_within_minutes_of_its_start(poll):
    start = 3600.0
    fired = _fired(lambda t, rng: 20e9 + rng.gauss(0, 20 * MB) + 3000 * MB * max(0.0, t - start) / 3600,
                   minutes=100, poll=poll)
    assert fired is not None and fired > start
    assert (fired - start) / 60 <= 9  # the windows' own tests waited 12 to 15 minutes


@pytest.mark.parametrize("poll", [1, 15, 60])
def test_a_cache_step_of_a_few_times_the_noise_does_not_fire(poll):
    assert _fired(lambda t, rng: 20e9 + rng.gauss(0, 20 * MB) + 100 * MB * (t >= 5400), minutes=240, poll=poll) is None


@pytest.mark.parametrize("poll", [1, 5, 15])
def test_a_leak_that_begins_soon_after_the_warm_up_fires_within_minutes(poll):
    # from 10 minutes after the warm-up: the noise is read from the 15 or so buckets there are, one standard error
    # high, where a young leak waited for a whole young window of them (the 15 minute window fired first, at 12)
    start = RULE.warmup_s + 600.0
    fired = _fired(lambda t, rng: 20e9 + rng.gauss(0, 20 * MB) + 3000 * MB * max(0.0, t - start) / 3600,
                   minutes=100, poll=poll)
    assert fired is not None and fired > start
    assert (fired - start) / 60 <= 9


@pytest.mark.parametrize("poll", [1, 15, 60])
@pytest.mark.parametrize("seed", range(3))
def test_a_cache_step_soon_after_the_warm_up_does_not_fire(poll, seed):
    step_at = RULE.warmup_s + 840.0
    assert _fired(lambda t, rng: 20e9 + rng.gauss(0, 20 * MB) + 100 * MB * (t >= step_at), minutes=240, poll=poll,
                  seed=seed) is None
