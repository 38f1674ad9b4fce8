"""The audit trail: every automatic action, why, on what evidence and what came of it, kept in the store
(bounded, across a restart) and counted on /metrics by action and outcome.

The Dispatcher with the breaker and a real failing command; its drain callback records what it was asked
(the real scontrol is tests/slurm/test_drain_breaker.py's).
"""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from clusterwatch.collector.alerting.actions import Dispatcher
from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.audit import ActionAudit
from clusterwatch.collector.alerting.breaker import BreakerLimits, DrainBreaker
from clusterwatch.collector.export import ClusterCollector, same_exposition
from clusterwatch.collector.export.action_families import ActionFamilies, Chained
from clusterwatch.collector.rules.config import ActionsConfig, ActionStep
from clusterwatch.collector.rules.model import FIRING, AlertEvent
from clusterwatch.collector.state.cluster import ClusterState
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

STEPS = ActionsConfig(steps=(ActionStep("command", command=("false",), rules=("gpu_lost",)),
                             ActionStep("drain", rules=("gpu_lost",))))


def _lost(node: str, t: float) -> AlertEvent:
    return AlertEvent(t=t, rule="gpu_lost", state=FIRING, severity="critical", node=node, job_id="4242",
                      gpu=f"GPU-{node}", description=f"GPU on {node} fell off the bus (XID 79)",
                      figures={"xid": 79})


def _dispatcher(conn: sqlite3.Connection, drained: list[str], max_rows: int = 20_000) -> Dispatcher:
    return Dispatcher(AlertStore(conn), STEPS, drain_node=lambda node, reason: drained.append(node),
                      breaker=DrainBreaker(conn, BreakerLimits(max_nodes=1), lambda: 100),
                      audit=ActionAudit(conn, max_rows=max_rows))


def test_each_action_is_a_row_with_why_evidence_and_outcome(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "cw.db", check_same_thread=False)
    drained: list[str] = []
    d = _dispatcher(conn, drained)
    d.process([_lost("n1", 100.0), _lost("n2", 100.0)], 100.0)
    assert d.drain(10.0)
    rows = {(r.action, r.node): r for r in d.audit.rows()}
    assert set(rows) == {("command", "n1"), ("drain", "n1"), ("command", "n2"), ("drain", "n2")}
    assert drained == ["n1"]
    done, held = rows[("drain", "n1")], rows[("drain", "n2")]
    assert (done.outcome, held.outcome) == ("done", "held")
    assert held.detail.startswith("circuit breaker: 1 node(s) drained in the last 1 h (n1)")
    assert done.why == "gpu_lost: GPU on n1 fell off the bus (XID 79)" and done.job_id == "4242"
    assert done.evidence["figures"] == {"xid": 79} and done.evidence["gpu"] == "GPU-n1" and done.at == 100.0
    assert done.alert_id is not None and done.rule == "gpu_lost"
    failed = rows[("command", "n1")]
    assert failed.outcome == "failed" and "returned non-zero exit status 1" in failed.detail
    assert d.audit.count_rows() == {("drain", "done"): 1, ("drain", "held"): 1, ("command", "failed"): 2}
    d.close()
    # a restarted collector reads the same trail
    again = ActionAudit(sqlite3.connect(tmp_path / "cw.db"))
    assert [(r.action, r.node, r.outcome) for r in again.rows(node="n2")] == [("drain", "n2", "held"),
                                                                              ("command", "n2", "failed")]


def test_the_trail_keeps_the_newest_rows(tmp_path: Path) -> None:
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    d = _dispatcher(conn, [], max_rows=5)
    d.process([_lost(f"n{i}", 100.0) for i in range(10)], 100.0)
    assert d.drain(10.0)
    rows = d.audit.rows(limit=100)
    assert len(rows) == 5 and rows[0].node == "n9" and rows[-1].node == "n7"
    d.close()


def test_the_counts_are_on_metrics_by_action_and_outcome(tmp_path: Path) -> None:
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    d = _dispatcher(conn, [])
    d.process([_lost("n1", 100.0), _lost("n2", 100.0), _lost("n3", 100.0)], 100.0)
    assert d.drain(10.0)
    collector = ClusterCollector(ClusterState(), time.time, extra=Chained(None, ActionFamilies(d.audit.count_rows)))
    text = collector.render(collector.snapshot())
    got = {(s.labels["action"], s.labels["outcome"]): s.value for f in text_string_to_metric_families(text.decode())
           for s in f.samples if s.name == "clusterwatch_actions_total"}
    assert got == {("drain", "done"): 1, ("drain", "held"): 2, ("command", "failed"): 3}
    registry = CollectorRegistry()
    registry.register(collector)
    assert same_exposition(collector.render(collector.snapshot()), generate_latest(registry))
    d.close()
