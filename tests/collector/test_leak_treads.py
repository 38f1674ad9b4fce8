"""`_flat_treads`: steps on flat levels against a leak that grows between any breaks a fit may choose."""
import random

from clusterwatch.collector.rules.leak import _flat_treads, _one_step

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
