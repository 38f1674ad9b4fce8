"""handle_leak's count series: a leak fires once it has grown on longer than a pool takes to spin up; a pool
spinning up (a bounded burst that levels off), epochs of files opened and closed, and a count's wobble do not."""
import math
import random

import pytest
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.rules.handle_leak import BURST_S, HandleSeries

RULE = load_rules().handle_leak
START = 1800.0


def _run(count, minutes: float = 240, poll: float = 10.0, seed: int = 1):
    """(fired at, resolved at), seconds, of a HandleSeries fed count(t) every `poll` s (jittered)."""
    rng = random.Random(seed)
    s = HandleSeries(RULE, 0.0)
    fired = resolved = None
    t = 0.0
    while t < minutes * 60:
        f = s.add(t, count(t, rng))
        if f is not None and f.firing and fired is None:
            fired = t
        elif f is not None and not f.firing and resolved is None:
            resolved = t
        t += poll * rng.uniform(0.7, 1.3)
    return fired, resolved


@pytest.mark.parametrize("rate", [60, 200, 600])
def test_a_leak_fires_about_when_it_has_grown_min_growth_or_a_burst_s_on(rate):
    fired, _ = _run(lambda t, rng: 40 + (int((t - START) / 3600 * rate) if t > START else 0))
    assert fired is not None
    # growth of min_growth; a burst's length and a bucket at each end (the rise before and after it)
    least = max(RULE.min_growth / rate * 3600, BURST_S + 2 * RULE.bucket_s)
    assert least <= fired - START <= least + 2.5 * RULE.bucket_s, (fired - START) / 60


def test_a_leak_that_stops_resolves():
    def count(t, rng):
        return 40 + int((min(t, 2 * 3600) - START) / 3600 * 300) if t > START else 40

    fired, resolved = _run(count)
    assert fired is not None and resolved is not None
    assert 2 * 3600 < resolved <= 2 * 3600 + 1800 + 2 * RULE.bucket_s


@pytest.mark.parametrize("size, ramp_s", [(50, 600), (200, 600), (200, 60), (120, 300)])
def test_a_pool_spinning_up_does_not_fire(size, ramp_s):
    def count(t, rng):
        ramp = min(1.0, max(0.0, (t - START) / ramp_s))
        return 40 + int(ramp * size) + rng.choice((0, 0, 0, 1))  # and a short-lived thread now and then

    assert _run(count) == (None, None)


@pytest.mark.parametrize("gap_min", [20, 25, 60])
def test_two_pools_apart_do_not_fire(gap_min):
    def count(t, rng):
        return 40 + sum(int(min(1.0, max(0.0, (t - at) / 300)) * 60) for at in (START, START + gap_min * 60))

    assert _run(count) == (None, None)


def test_epochs_of_files_opened_and_closed_do_not_fire():
    assert _run(lambda t, rng: 120 + (150 if (t % 2400) < 1800 else 0)) == (None, None)


def test_a_burst_just_longer_than_burst_s_at_a_leak_rate_is_told_as_one():
    # the boundary the rule draws: growth that goes on past BURST_S at an even rate is a leak
    fired, _ = _run(lambda t, rng: 40 + int(min(1.0, max(0.0, (t - START) / (3 * BURST_S))) * 150))
    assert fired is not None and fired - START <= 2 * BURST_S + 3 * RULE.bucket_s


@pytest.mark.parametrize("poll", [1.0, 15.0, 60.0])
def test_a_fast_leak_fires_a_few_polls_past_burst_s(poll):
    # 600 an hour grows 50 in five minutes, but a pool spins up as fast for up to BURST_S: the leak is told once
    # it has risen before, across and after BURST_S (a bucket or a poll at each end) and the last bucket closed:
    # within two and a half minutes and two polls of BURST_S
    fired, _ = _run(lambda t, rng: 40 + (int((t - START) / 3600 * 600) if t > START else 0), poll=poll)
    assert fired is not None
    assert BURST_S < fired - START <= BURST_S + 150 + 2 * poll, (fired - START) / 60


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("size, ramp_s, poll", [(60, 540, 15.0), (75, 510, 30.0), (140, 550, 20.0), (90, 560, 60.0)])
def test_a_pool_under_short_lived_threads_does_not_fire(size, ramp_s, poll, seed):
    # Up to 3 short-lived threads in a quarter of the readings: a +1..3 at a bucket's minimum must not pass
    # for the rise before or after BURST_S that tells a leak from a pool (the ends ask three times the noise).
    def count(t, rng):
        ramp = min(1.0, max(0.0, (t - START) / ramp_s))
        return 40 + int(ramp * size) + rng.choice((0, 0, 0, rng.randint(1, 3)))

    assert _run(count, poll=poll, seed=seed) == (None, None)


@pytest.mark.parametrize("poll", [45.0, 60.0])
def test_a_count_read_less_often_than_a_bucket_is_judged_at_the_reading_that_shows_the_leak(poll):
    # Readings further apart than a bucket and a half: each is its bucket's least, so the rule judges it as it
    # comes rather than a poll later. A at the leak's start, B a reading on, C BURST_S on from B, D a reading on.
    s = HandleSeries(RULE, 0.0)
    t = 0.0
    fired = None
    while fired is None and t < 4 * 3600:
        f = s.add(t, 40 + (int((t - START) / 3600 * 600) if t > START else 0))
        if f is not None and f.firing:
            fired = t
        t += poll
    assert fired == START + poll + math.ceil(BURST_S / poll) * poll + poll
