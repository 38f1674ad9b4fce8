"""`_flat_treads`: steps on flat levels against a leak that grows between any breaks a fit may choose."""
import random

from clusterwatch.collector.rules.leak import LONG_TREAD_B, _flat_treads, _leak_sse, _one_step, _two_steps_sse

MB = 1024 * 1024


def _noisy(values: list[float], sigma: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [v + rng.gauss(0, sigma) for v in values]


def _centred(ys: list[float]) -> list[float]:
    m = sum(ys) / len(ys)
    return [y - m for y in ys]


def test_two_cache_steps_a_long_flat_apart_have_flat_treads_and_count_as_steps():
    xs = list(range(120))  # a 2 h window of minute buckets: steps of 170 and 120 MiB at 20 and 100 min
    ys = _noisy([170 * MB * (x >= 20) + 120 * MB * (x >= 100) for x in xs], 30 * MB, 1)
    assert _flat_treads(xs, _centred(ys), (20, 100), 30 * MB)
    assert _one_step(xs, ys, 4, 8, 30 * MB, 4.0, long_b=75)


def test_a_slow_leak_under_the_same_noise_grows_between_the_same_breaks_and_is_no_step():
    xs = list(range(120))  # 145 MiB an hour: about the same rise over the window
    for seed in range(20):
        ys = _noisy([145 * MB * x / 60 for x in xs], 30 * MB, seed)
        assert not _flat_treads(xs, _centred(ys), (20, 100), 30 * MB), seed
        assert not _one_step(xs, ys, 4, 8, 30 * MB, 4.0, long_b=75), seed


def test_a_leak_under_the_same_noise_is_no_two_steps_half_an_hour_apart():
    # a 75 min window: two steps as far apart as a staircase's shortest tread count as steps on flat levels (see
    # test_leak_lookalikes.py); a leak of 280 MiB an hour under 30 MiB of noise grows between any such breaks
    xs = list(range(75))
    for seed in range(20):
        ys = _noisy([280 * MB * x / 60 for x in xs], 30 * MB, seed)
        assert not _one_step(xs, ys, 4, 4, 30 * MB, 4.0, long_b=LONG_TREAD_B), seed


def test_a_leak_that_began_in_a_window_fits_as_a_leak_and_two_steps_as_steps():
    # the fits the 75 min window's two-step guard compares: a leak from bucket 50 (flat, then a line) and two steps
    xs = list(range(75))
    leak = [0.0 if x <= 50 else 3.0 * MB * (x - 50) for x in xs]
    steps = [60 * MB * (x >= 30) + 40 * MB * (x >= 60) for x in xs]
    assert _leak_sse(xs, leak, 4, 1) < 1.0
    assert _two_steps_sse(steps) < 1.0
    assert _two_steps_sse(leak) > 100 * MB * MB and _leak_sse(xs, steps, 4, 1) > 100 * MB * MB
