"""The drain circuit breaker: many nodes failing at once lose only a few to drains; the count outlives a restart.

The Dispatcher with a drain callback that records what it was asked (the real scontrol runs in
tests/slurm/test_drain_breaker.py), over a store in a file, reopened as a restarted collector would.
"""
from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
from clusterwatch.collector.alerting.actions import Dispatcher
from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.breaker import BreakerLimits, DrainBreaker
from clusterwatch.collector.rules.config import ActionsConfig, ActionStep
from clusterwatch.collector.rules.model import FIRING, AlertEvent

DRAIN = ActionsConfig(steps=(ActionStep("drain", rules=("gpu_lost",)),))


@pytest.mark.parametrize(("limits", "nodes", "allowed"), [
    (BreakerLimits(), 2, 1),          # 5 % of 2 nodes is none: one still may go
    (BreakerLimits(), 30, 1),
    (BreakerLimits(), 40, 2),         # 5 % is 2
    (BreakerLimits(), 1000, 2),       # 5 % is 50: the 2 nodes hold
    (BreakerLimits(max_nodes=10, max_share=0.1), 50, 5),
    (BreakerLimits(max_nodes=0), 1000, 0),
])
def test_the_smaller_of_the_count_and_the_share(limits: BreakerLimits, nodes: int, allowed: int) -> None:
    assert limits.allowed(nodes) == allowed


def _lost(node: str, t: float) -> AlertEvent:
    return AlertEvent(t=t, rule="gpu_lost", state=FIRING, severity="critical", node=node,
                      gpu=f"GPU-{node}", description=f"GPU on {node} fell off the bus (XID 79)")


class _Collector:
    """The parts of a collector a drain goes through, over the store at `db`."""

    def __init__(self, db: Path, cluster_nodes: int) -> None:
        self.conn = sqlite3.connect(db, check_same_thread=False)
        self.drained: list[str] = []
        self.breaker = DrainBreaker(self.conn, BreakerLimits(), lambda: cluster_nodes)
        self.dispatcher = Dispatcher(AlertStore(self.conn), DRAIN, breaker=self.breaker,
                                     drain_node=lambda node, reason: self.drained.append(node))

    def fire(self, nodes: list[str], t: float) -> None:
        self.dispatcher.process([_lost(n, t) for n in nodes], t)
        assert self.dispatcher.drain(5.0)

    def close(self) -> None:
        self.dispatcher.close()
        self.conn.close()


def test_many_bad_nodes_at_once_drain_two_and_the_rest_are_held(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, "clusterwatch.alerts")
    cw = _Collector(tmp_path / "cw.db", cluster_nodes=1000)
    bad = [f"gpu{i:03d}" for i in range(12)]
    cw.fire(bad, 1000.0)
    assert cw.drained == bad[:2]
    assert cw.breaker.held == 10
    held = [r.getMessage() for r in caplog.records if "held" in r.getMessage()]
    assert len(held) == 10 and all("circuit breaker: 2 node(s) drained in the last 1 h" in m for m in held)
    assert "not draining gpu011, notifying only" in held[-1]
    cw.close()


def test_a_restarted_collector_counts_the_drains_before_it(tmp_path: Path) -> None:
    db = tmp_path / "cw.db"
    first = _Collector(db, cluster_nodes=1000)
    first.fire(["gpu001", "gpu002"], 1000.0)
    assert first.drained == ["gpu001", "gpu002"]
    first.close()
    # a crash loop must not drain two more each start
    second = _Collector(db, cluster_nodes=1000)
    second.fire(["gpu003"], 1500.0)
    assert second.drained == [] and second.breaker.held == 1
    # the window moves on: the first drains are an hour old, and a new bad node goes
    second.fire(["gpu004"], 1000.0 + 3600 + 1)
    assert second.drained == ["gpu004"]
    second.close()


def test_a_node_drained_in_the_window_costs_nothing_more(tmp_path: Path) -> None:
    cw = _Collector(tmp_path / "cw.db", cluster_nodes=2)  # one node an hour on two nodes
    cw.fire(["n1"], 10.0)
    cw.dispatcher.process([AlertEvent(t=20.0, rule="gpu_lost", state=FIRING, severity="critical", node="n1",
                                      gpu="GPU-other", description="another GPU of n1 lost")], 20.0)
    assert cw.dispatcher.drain(5.0)
    cw.fire(["n2"], 30.0)
    assert cw.drained == ["n1", "n1"] and cw.breaker.held == 1
    cw.close()
