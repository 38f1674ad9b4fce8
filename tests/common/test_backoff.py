"""Backoff: the wait grows by its factor up to the cap, jittered within its bounds; reset starts afresh."""
from __future__ import annotations

import random

import pytest

from clusterwatch.backoff import Backoff


def test_without_jitter_the_waits_double_up_to_the_cap() -> None:
    backoff = Backoff(0.5, 5.0)
    assert [backoff.next_wait() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_the_agent_stream_s_waits_are_the_old_formula_drawn_alike() -> None:
    # The sender's own loop before the move: delay * uniform(0.8, 1.2), then min(delay * 1.6, max).
    random.seed(7)
    old, delay = [], 0.5
    for _ in range(12):
        old.append(delay * random.uniform(0.8, 1.2))
        delay = min(delay * 1.6, 30.0)
    random.seed(7)
    backoff = Backoff(0.5, 30.0, factor=1.6, jitter=(0.8, 1.2))
    assert [backoff.next_wait() for _ in range(12)] == old


def test_the_scontrol_waits_are_the_old_formula_drawn_alike() -> None:
    # scontrol's retries before the move: min(delay, max) * (1 + 0.5 * random()), then delay * 2.
    random.seed(11)
    old, delay = [], 0.5
    for _ in range(8):
        old.append(min(delay, 5.0) * (1 + 0.5 * random.random()))
        delay *= 2
    random.seed(11)
    backoff = Backoff(0.5, 5.0, jitter=(1.0, 1.5))
    assert [backoff.next_wait() for _ in range(8)] == old


def test_reset_starts_from_the_initial_wait_or_the_one_given() -> None:
    backoff = Backoff(2.0, 30.0, factor=1.6)
    backoff.next_wait(), backoff.next_wait()
    backoff.reset()
    assert backoff.next_wait() == 2.0
    backoff.reset(0.5)
    assert [backoff.next_wait() for _ in range(2)] == [0.5, 0.8]


@pytest.mark.parametrize(("failures", "wait"), [(0, 5.0), (1, 10.0), (3, 40.0), (4, 60.0), (5_000, 60.0)])
def test_the_wait_after_failures_is_capped_even_after_a_days_long_outage(failures: int, wait: float) -> None:
    assert Backoff(5.0, 60.0).after(failures) == wait
