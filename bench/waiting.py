"""Waiting for a condition with a deadline: the one poll loop of the tests and the benches.

It lives in bench/ and needs only the standard library, so that a bench, a script run outside pytest,
does not depend on tests/ for it: benches import it as `waiting` (their own folder is on their path),
tests as `bench.waiting` (the checkout's root is on theirs; tests/support/helpers.py re-exports wait_for).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T:
    """Call `predicate` every `interval` seconds until it returns a truthy value or `timeout` seconds pass.

    Returns its first truthy value, or its last (falsy) one at the deadline: the caller says what a
    timeout means (a log to show, a process to kill).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_for(predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.1,
             what: str = "condition") -> T:
    """Like poll_until, but a timeout is a failure: AssertionError "timed out after N s waiting for `what`".

    Returns predicate()'s first truthy value.
    """
    value = poll_until(predicate, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
    return value
