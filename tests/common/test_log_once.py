"""SaidOnce: each key said once until forgotten; a bounded memory clears when full."""
from __future__ import annotations

import logging

import pytest

from clusterwatch.log_once import SaidOnce

log = logging.getLogger("clusterwatch.test_log_once")


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == log.name]


def test_a_key_is_said_once_then_again_after_it_is_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    said = SaidOnce(log)
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert said.warning("node1", "listpids on %s: %s", "node1", "refused")
        assert not said.warning("node1", "listpids on %s: %s", "node1", "refused again")
        assert said.warning("node2", "listpids on %s: %s", "node2", "refused")
        said.forget("node1")
        assert said.warning("node1", "listpids on %s: %s", "node1", "back")
    assert _lines(caplog) == ["listpids on node1: refused", "listpids on node2: refused", "listpids on node1: back"]


def test_clear_says_every_key_anew() -> None:
    said = SaidOnce(log)
    assert said.first(("n", "clock")) and said.first("b")
    assert not said.first(("n", "clock"))
    said.clear()
    assert len(said) == 0
    assert said.first(("n", "clock")) and said.first("b")


def test_a_bounded_memory_is_cleared_when_full_so_a_flood_cannot_grow_it() -> None:
    said = SaidOnce(log, limit=3)
    assert all(said.first(k) for k in "abc")
    assert len(said) == 3
    assert said.first("d")  # full: forgotten, then "d" remembered
    assert len(said) == 1
    assert said.first("a")  # said once more after the clear
    assert not said.first("d")
