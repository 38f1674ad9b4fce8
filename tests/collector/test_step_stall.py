"""When a rank's step counts as stalled (issue 17, item 5): from how often its step moves, never between
the reports of a rank that reports every hundred steps."""
from __future__ import annotations

from collections import deque

from clusterwatch.collector.state.cluster import DEFAULT_STEP_STALE_S, stale_after


def test_a_rank_reporting_every_step_is_stale_after_three_of_its_gaps_or_three_polls():
    reports = deque(((i * 0.05, i) for i in range(32)), maxlen=32)
    assert stale_after(reports, 0.3) == 3 * 0.3
    assert abs(stale_after(reports, 0.01) - 3 * 0.05) < 1e-9


def test_a_rank_reporting_every_hundred_steps_is_not_stalled_between_reports():
    reports = deque(((i * 20.0, i * 100) for i in range(5)), maxlen=32)
    assert stale_after(reports, 5.0) == 60.0


def test_repeated_steps_do_not_shorten_the_gap_and_one_move_is_not_enough_to_tell():
    reports = deque([(0.0, 1), (1.0, 1), (2.0, 1), (10.0, 2), (11.0, 2), (20.0, 3)], maxlen=32)
    assert stale_after(reports, 1.0) == 3 * 10.0
    assert stale_after(deque([(0.0, 1), (1.0, 2)]), 1.0) == DEFAULT_STEP_STALE_S
