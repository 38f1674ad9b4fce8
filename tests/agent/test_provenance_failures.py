"""A kind of provenance failure is a warning once, at debug level after that (a node's every rank repeats it)."""
from __future__ import annotations

import logging

from clusterwatch.agent.provenance import failures


def test_a_kind_is_warned_once_then_logged_at_debug_level(caplog) -> None:
    # the memory of kinds said starts fresh in every test (tests/support/git_repos.py, fresh_warnings)
    caplog.set_level(logging.DEBUG, logger=failures.log.name)
    failures.warn_once("proc", "pid 7 is gone")
    failures.warn_once("proc", "pid 8 is gone")
    failures.warn_once("dir", "no such directory")
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said == [
        (logging.WARNING, "provenance unknown: pid 7 is gone (further ones of this kind are logged at debug level)"),
        (logging.DEBUG, "provenance unknown: pid 8 is gone"),
        (logging.WARNING, "provenance unknown: no such directory (further ones of this kind are logged at debug "
                          "level)"),
    ]
