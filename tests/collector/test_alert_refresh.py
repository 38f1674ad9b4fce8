"""Alerts keep their figures current while active, and one whose process ends while it fires says so with
its last figures (issue 17, item 6): the engine's refresh, the table's refresh, Alerting's tick."""
from __future__ import annotations

import sqlite3

from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.rules import Engine, GpuObservation, NodeHeartbeat, ProcessObservation, load_rules
from clusterwatch.collector.rules.model import FIRING, RESOLVED, AlertEvent

from clusterwatch.humanize import duration, rate_per_h, size

MB = 1024 * 1024
GB = 1024 * MB


def _obs(t: float, gmem: float, step: int | None = None, util: float = 95.0) -> ProcessObservation:
    return ProcessObservation(t=t, node="gpu022", job_id="9001", pid=4242, gpu="GPU-1", rank=3, user="alice",
                              command="python train.py", gpu_mem_bytes=gmem, gpu_mem_total_bytes=80 * GB,
                              gpu_util=util, rss_bytes=6 * GB, step=step)


def _leak_until_firing(eng: Engine, rate_mb_h: float) -> tuple[float, AlertEvent]:
    t = 0.0
    while True:
        for e in eng.observe(_obs(t, 30 * GB + rate_mb_h * MB * t / 3600, step=int(t))):
            if e.state == FIRING:
                return t, e
        t += 15.0
        assert t < 4 * 3600, "never fired"


def test_a_leak_alert_refreshed_later_tells_how_long_and_how_fast_now():
    eng = Engine(load_rules())
    t_fired, fired = _leak_until_firing(eng, 2000.0)
    # the leak goes on an hour, four times faster: the text of the moment it fired is wrong by then
    level = 30 * GB + 2000.0 * MB * t_fired / 3600
    t = t_fired
    while t < t_fired + 3600:
        t += 15.0
        level += 8000.0 * MB * 15 / 3600
        assert not [e for e in eng.observe(_obs(t, level, step=int(t))) if e.state == RESOLVED]
    (now,) = [e for e in eng.refresh(t) if e.rule == "gpu_memory_leak"]
    assert now.state == FIRING and now.t == t
    assert now.figures["growth_for_s"] >= fired.figures["growth_for_s"] + 3500
    assert now.figures["rate_bytes_per_h"] > 3 * fired.figures["rate_bytes_per_h"]
    assert now.figures["time_to_full_s"] < fired.figures["time_to_full_s"] / 2
    assert f"for {duration(now.figures['growth_for_s'])}" in now.description
    assert rate_per_h(now.figures["rate_bytes_per_h"]) in now.description and "GiB/h" in now.description
    assert now.description != fired.description


def test_a_process_that_dies_while_leaking_ended_while_firing_with_its_last_figures():
    eng = Engine(load_rules())
    t, _ = _leak_until_firing(eng, 2000.0)
    for _ in range(40):
        t += 15.0
        eng.observe(_obs(t, 30 * GB + 2000.0 * MB * t / 3600, step=int(t)))
    (last,) = [e for e in eng.refresh(t) if e.rule == "gpu_memory_leak"]
    (gone,) = eng.forget_process("gpu022", 4242, 0.0, t + 30)
    assert gone.state == RESOLVED and gone.rule == "gpu_memory_leak"
    assert "ended while firing" in gone.description and "the process is gone" in gone.description
    assert gone.description.startswith(last.description)  # the rate, for how long, the time to full
    assert gone.figures["ended_while_firing"] is True
    assert gone.figures["rate_bytes_per_h"] == last.figures["rate_bytes_per_h"]


def test_a_stall_refreshed_counts_on_and_a_pending_one_ending_is_no_firing():
    eng = Engine(load_rules())
    for i in range(60):
        eng.observe(ProcessObservation(t=i * 20.0, node="n", pid=1, gpu_util=100.0, step=min(i, 20)))
    (stall,) = eng.refresh(60 * 20.0)
    assert stall.rule == "training_stall" and stall.state == FIRING
    assert stall.figures["stalled_for_s"] == 59 * 20.0 - 20 * 20.0
    assert f"stuck at step 20 for {duration(780)}" in stall.description
    # a GPU idle for a little while only (pending) that goes with its process just resolves
    eng2 = Engine(load_rules())
    for i in range(40):
        eng2.observe(ProcessObservation(t=i * 10.0, node="n", pid=2, gpu_util=90.0 if i < 10 else 0.0))
    assert [e.state for e in eng2.refresh(400.0)] == ["pending"]
    (gone,) = eng2.forget_process("n", 2, 0.0, 410.0)
    assert "ended while firing" not in gone.description and not gone.figures


def test_idle_gpu_and_agent_down_refresh_and_idle_gpu_ends_with_its_job():
    eng = Engine(load_rules())
    for i in range(40):
        eng.observe_gpu(GpuObservation(t=i * 60.0, node="g1", gpu="GPU-x", job_id="42", utilization=0.0,
                                       processes=0, index=2))
    eng.heartbeat(NodeHeartbeat(t=0.0, node="g2"))
    eng.tick(61.0)
    events = {e.rule: e for e in eng.refresh(3661.0)}
    assert events["idle_gpu"].figures["idle_for_s"] == 39 * 60.0 and "for 39 min" in events["idle_gpu"].description
    assert events["agent_down"].figures["silent_for_s"] == 3661.0
    assert "silent for 1 h 1 min" in events["agent_down"].description
    (ended,) = eng.forget_job("42", 2500.0)
    assert ended.state == RESOLVED and "ended while firing: job 42 ended" in ended.description
    assert ended.figures["ended_while_firing"] is True


def test_the_table_refreshes_only_an_active_alert_in_the_same_state():
    store = AlertStore(sqlite3.connect(":memory:"))
    ev = AlertEvent(t=1.0, rule="training_stall", state=FIRING, severity="warning", node="n", job_id="1", pid=5,
                    description="stuck for 1 min", figures={"stalled_for_s": 60})
    assert store.apply(ev) is not None
    newer = AlertEvent(t=2.0, rule="training_stall", state=FIRING, severity="warning", node="n", job_id="1", pid=5,
                       description="stuck for 6 min", figures={"stalled_for_s": 360})
    assert store.refresh(newer) is True
    assert store.refresh(newer) is False  # unchanged: not written again
    (a,) = store.active()
    assert a.description == "stuck for 6 min" and a.figures == {"stalled_for_s": 360} and a.started_at == 1.0
    # a refresh never raises an alert the table does not hold
    other = AlertEvent(t=3.0, rule="gpu_stall", state=FIRING, severity="warning", node="n", job_id="1", pid=5,
                       description="idle", figures={})
    assert store.refresh(other) is False
    assert [x.rule for x in store.active()] == ["training_stall"]


def test_units_are_iec_and_durations_one_format():
    assert rate_per_h(50 * MB) == "50 MiB/h" and rate_per_h(1.25 * GB) == "1.2 GiB/h"
    assert size(3 * 1024**4) == "3.0 TiB"
    assert [duration(s) for s in (5, 360, 5040, 3600, 26 * 3600 + 300, 3 * 86400 + 7200)] == [
        "5 s", "6 min", "1 h 24 min", "1 h", "26 h 5 min", "3 d 2 h"]


def test_agent_down_names_the_jobs_that_run_there_and_belongs_to_the_job():
    eng = Engine(load_rules())
    eng.heartbeat(NodeHeartbeat(t=0.0, node="g3", job_ids=("42",)))
    (down,) = eng.tick(120.0)
    assert down.job_id == "42" and "while job 42 runs there" in down.description
    assert down.figures["job_ids"] == ["42"]
    (back,) = eng.heartbeat(NodeHeartbeat(t=130.0, node="g3", job_ids=("42",)))
    assert back.state == RESOLVED and back.job_id == "42"
    eng.heartbeat(NodeHeartbeat(t=0.0, node="g4", job_ids=("7", "8")))
    (down,) = eng.tick(240.0)[-1:]
    assert "while jobs 7, 8 run there" in down.description
