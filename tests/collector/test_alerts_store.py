"""The SQLite alert table: lifecycle, restart without loss or repeat."""
import sqlite3

from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.rules import AlertEvent


def _ev(state, t, rule="gpu_stall"):
    return AlertEvent(t=t, rule=rule, state=state, severity="critical", node="n1", job_id="9", pid=7,
                      start_time=1.5, gpu="GPU-a", rank=0, description=f"{state} at {t}", figures={"idle_for_s": t})


def test_lifecycle(tmp_path):
    s = AlertStore(sqlite3.connect(tmp_path / "a.db"))
    a = s.apply(_ev("pending", 10))
    assert a.state == "pending" and a.fired_at is None
    assert s.apply(_ev("pending", 20)) is None  # repeat: no transition
    a = s.apply(_ev("firing", 30))
    assert a.state == "firing" and a.fired_at == 30 and a.started_at == 10
    assert s.apply(_ev("firing", 40)) is None
    assert s.active()[0].figures == {"idle_for_s": 40}
    a = s.apply(_ev("resolved", 50))
    assert a.state == "resolved" and a.resolved_at == 50
    assert s.active() == [] and s.apply(_ev("resolved", 60)) is None
    s.apply(_ev("firing", 70))  # a new occurrence of the same subject
    assert [x.started_at for x in s.history()] == [70, 10]


def test_restart_keeps_alerts_and_steps(tmp_path):
    db = tmp_path / "a.db"
    s = AlertStore(sqlite3.connect(db))
    a = s.apply(_ev("firing", 5))
    s.mark_step_done(a.id, 0)
    s.conn.close()
    s2 = AlertStore(sqlite3.connect(db))
    act = s2.active()
    assert len(act) == 1 and act[0].steps_done == {0} and act[0].state == "firing"
    assert s2.apply(_ev("firing", 9)) is None  # the restarted engine re-raises it: not a new alert
    gone = s2.resolve_missing(set(), 100.0)
    assert [g.state for g in gone] == ["resolved"]
