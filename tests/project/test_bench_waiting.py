"""bench/waiting.py: the one poll loop of the tests and the benches."""
from __future__ import annotations

import itertools

import pytest

from bench.waiting import poll_until, wait_for


def test_the_first_truthy_value_comes_back():
    calls = itertools.count()
    assert wait_for(lambda: next(calls) >= 2 and "ready", timeout=5, interval=0.001) == "ready"
    assert poll_until(lambda: next(calls) >= 4 and 7, timeout=5, interval=0.001) == 7


def test_at_the_deadline_poll_until_gives_the_last_value_and_wait_for_fails_saying_what():
    assert poll_until(lambda: 0, timeout=0.05, interval=0.01) == 0
    with pytest.raises(AssertionError, match=r"^timed out after 0 s waiting for the agent's pid file$"):
        wait_for(lambda: None, timeout=0.05, interval=0.01, what="the agent's pid file")
