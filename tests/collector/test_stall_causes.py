"""A stall names its likely cause (issue 15): a health event on one of the job's GPUs, a rank gone, a node's
agent down, the odd rank out, a hung collective (busy at near-idle power); and a health alert that names
no job resolves once its GPU has answered healthy."""
from __future__ import annotations

import sqlite3
from types import SimpleNamespace

from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.live import HEALTH_CLEAR_S, Alerting
from clusterwatch.collector.alerting.stall_causes import HealthCauses
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.collector.rules import Engine, GpuObservation, NodeHeartbeat, ProcessObservation, load_rules
from clusterwatch.collector.rules.causes import Cause, RankFigures, from_health, odd_rank_out
from clusterwatch.collector.state.cluster import ClusterState, JobState
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, ProcessKey, ProcessSample


def _stall(eng: Engine, ranks: dict[int, tuple[str, int]], steps: dict[int, int], until: float = 900.0,
           gpu_power: dict[int, float] | None = None, util: float = 100.0, beats: set[str] | None = None) -> list:
    """Ranks (rank → (node, pid)) advance for 100 s, then freeze at `steps` (rank → last step) until `until`."""
    evs = []
    t = 0.0
    while t <= until:
        for rank, (node, pid) in ranks.items():
            step = min(int(t // 10), steps[rank]) if t < 100 else steps[rank]
            if gpu_power is not None:
                power = 300.0 if t < 100 else gpu_power[rank]
                evs += eng.observe_gpu(GpuObservation(t, node, f"GPU-{rank}", "9", util, 1, rank, power))
            evs += eng.observe(ProcessObservation(t=t, node=node, job_id="9", pid=pid, gpu=f"GPU-{rank}", rank=rank,
                                                  gpu_util=util, step=step))
        for node in beats if beats is not None else {n for n, _ in ranks.values()}:
            evs += eng.tick(t)
            evs += eng.heartbeat(NodeHeartbeat(t, node, True, 5.0, ("9",)))
        t += 15.0
    return evs


def _fired(evs: list, rule: str = "training_stall") -> list:
    return [e for e in evs if e.rule == rule and e.state == "firing"]


def test_a_health_event_on_a_ranks_gpu_is_named_with_gpu_rank_and_xid():
    asked = []

    def health(job_id: str, since: float, now: float) -> list[Cause]:
        asked.append((job_id, since, now))
        return [from_health(95.0, "gpu_xid", "n1", "GPU-1", "XID 119 (GSP RPC timeout) on GPU GPU-1 of n1", now,
                            rank=1, xid=119, gpu_index=1)]

    evs = _stall(Engine(load_rules(), causes=health), {0: ("n1", 10), 1: ("n1", 11)}, {0: 9, 1: 9})
    fired = _fired(evs)
    assert len(fired) == 2
    for ev in fired:
        assert "likely cause: XID 119 on GPU 1 (GPU-1) of rank 1 on n1" in ev.description, ev.description
        assert (ev.figures["cause"], ev.figures["cause_rank"], ev.figures["cause_gpu"], ev.figures["cause_xid"]) == (
            "gpu_health", 1, "GPU-1", 119)
    # asked for the minutes before the step froze, for this job
    assert all(j == "9" and since <= 90.0 - 300 for j, since, _ in asked)


def test_a_rank_whose_process_is_gone_is_named():
    eng = Engine(load_rules())
    _stall(eng, {0: ("n1", 10), 1: ("n2", 11)}, {0: 9, 1: 9}, until=90.0)
    eng.forget_process("n2", 11, 0.0, 100.0)
    evs = []
    for i in range(60):
        evs += eng.observe(ProcessObservation(t=105.0 + 15 * i, node="n1", job_id="9", pid=10, rank=0, step=9))
    [ev] = _fired(evs)
    assert "likely cause: rank 1 (pid 11 on n2) is gone" in ev.description, ev.description
    assert ev.figures["cause"] == "process_gone" and ev.figures["cause_rank"] == 1


def test_a_node_whose_agent_is_down_is_named():
    eng = Engine(load_rules())
    _stall(eng, {0: ("n1", 10), 1: ("n2", 11)}, {0: 9, 1: 9}, until=90.0)
    evs = []
    for i in range(60):  # n2 says nothing more
        t = 105.0 + 15 * i
        evs += eng.tick(t)
        evs += eng.heartbeat(NodeHeartbeat(t, "n1", True, 5.0, ("9",)))
        evs += eng.observe(ProcessObservation(t=t, node="n1", job_id="9", pid=10, rank=0, step=9))
    assert _fired(evs, "agent_down")
    [ev] = _fired(evs)
    assert "likely cause: the agent on n2 is down" in ev.description, ev.description
    assert (ev.figures["cause"], ev.figures["cause_node"]) == ("agent_down", "n2")


def test_the_rank_behind_the_others_is_the_odd_one_out():
    ranks = {r: ("n1", 10 + r) for r in range(4)}
    evs = _stall(Engine(load_rules()), ranks, {0: 9, 1: 9, 2: 8, 3: 9})
    fired = _fired(evs)
    assert len(fired) == 4
    for ev in fired:
        assert "likely cause: rank 2 (pid 12 on n1) is at step 8, the others at step 9" in ev.description
        assert (ev.figures["cause"], ev.figures["cause_by"], ev.figures["cause_rank"]) == ("odd_rank", "step", 2)


def test_the_rank_drawing_other_power_is_the_odd_one_out():
    ranks = {r: ("n1", 10 + r) for r in range(4)}
    evs = _stall(Engine(load_rules()), ranks, {r: 9 for r in ranks}, gpu_power={0: 290.0, 1: 300.0, 2: 120.0,
                                                                                 3: 295.0})
    [ev, *_] = _fired(evs)
    assert "rank 2 (pid 12 on n1) draws 120 W, the others ~" in ev.description, ev.description
    assert ev.figures["cause_by"] == "power" and ev.figures["cause_gpu"] == "GPU-2"


def test_odd_rank_out_by_utilisation_and_none_when_several_differ():
    def r(rank, util):
        return RankFigures(rank, "n", 100 + rank, util=util)

    found = odd_rank_out([r(0, 99.0), r(1, 100.0), r(2, 3.0), r(3, 98.0)])
    assert found is not None and found.figures["cause_rank"] == 2 and "at 3 %" in found.text
    assert odd_rank_out([r(0, 99.0), r(1, 2.0), r(2, 3.0), r(3, 98.0)]) is None
    assert odd_rank_out([r(0, 99.0), r(1, 100.0), r(2, 98.0)]) is None
    assert odd_rank_out([r(0, 99.0), r(1, 3.0)]) is None     # of two, neither is odd by utilisation


def test_a_busy_gpu_at_near_idle_power_is_a_hung_collective():
    evs = _stall(Engine(load_rules()), {0: ("n1", 10)}, {0: 9}, gpu_power={0: 70.0})
    [ev] = _fired(evs)
    assert "likely cause: a hung collective: its GPU reads 100 % at 70 W, 23% of the 300 W" in ev.description
    assert "(hung collective?)" not in ev.description
    assert (ev.figures["cause"], ev.figures["power_watts"], ev.figures["power_peak_watts"]) == (
        "hung_collective", 70.0, 300.0)


def test_without_a_cause_the_stall_says_what_it_said():
    evs = _stall(Engine(load_rules()), {0: ("n1", 10)}, {0: 9}, gpu_power={0: 290.0})
    [ev] = _fired(evs)
    assert "likely cause" not in ev.description and "cause" not in ev.figures
    assert ev.description.endswith("GPU at 100 % (hung collective?)")


def test_gpu_stall_and_idle_gpu_name_the_cause_too():
    def health(job_id, since, now):
        return [from_health(50.0, "gpu_lost", "n1", "GPU-0", "GPU GPU-0 of n1 fell off the bus (XID 79)", now,
                            rank=0, xid=79)]

    eng = Engine(load_rules(), causes=health)
    evs = []
    for i in range(200):
        t = i * 15.0
        util = 95.0 if t < 60 else 0.0
        evs += eng.observe(ProcessObservation(t=t, node="n1", job_id="9", pid=10, rank=0, gpu="GPU-0", gpu_util=util))
        evs += eng.observe_gpu(GpuObservation(t, "n1", "GPU-0", "9", util, 1 if t < 60 else 0, 0))
    for rule in ("gpu_stall", "idle_gpu"):
        [ev] = _fired(evs, rule)
        assert "likely cause: XID 79 on GPU GPU-0 of rank 0 on n1" in ev.description, ev.description
        assert ev.figures["cause_xid"] == 79


def _batch_state() -> tuple[ClusterState, agent_pb2.Batch]:
    st = ClusterState()
    key = ProcessKey("n1", 10, 1.0)
    st.processes[key] = SimpleNamespace(key=key, alive=True, state="", state_since=0.0, latest=ProcessSample(
        time=100.0, node="n1", pid=10, start_time=1.0, job_id="9", rank=3, gpus=(GpuUse("GPU-b", 1 << 30, 99.0),)))
    st.pids["n1"] = {10: st.processes[key]}
    st.jobs["9"] = JobState("9", nodes=["n1"], gpus_by_node={"n1": ["GPU-b"]}, processes={key})
    batch = agent_pb2.Batch()
    batch.health_events.add(time=80.0, uuid="GPU-b", kind="xid", xid=79, data=79)
    return st, batch


def test_the_live_source_names_health_findings_on_the_jobs_gpus_in_the_span():
    st, batch = _batch_state()
    health = HealthEngine(load_catalog())
    health.observe_event("n1", batch.health_events[0], [])
    causes = HealthCauses(st, lambda: health)
    [cause] = causes("9", 0.0, 200.0)
    assert cause.figures == {"cause": "gpu_health", "cause_rule": "gpu_lost", "cause_node": "n1",
                             "cause_gpu": "GPU-b", "cause_xid": 79}
    assert cause.text.startswith("XID 79 on GPU GPU-b on n1, 2 min before: GPU GPU-b of n1 fell off the bus")
    assert causes("9", 90.0, 200.0) == []     # before the span asked for
    assert causes("8", 0.0, 200.0) == []      # another job's GPUs
    st.jobs["9"].start_time = 85.0
    assert causes("9", 0.0, 200.0) == []      # before the job started: another job's trouble


def _alerting() -> tuple[Alerting, AlertStore]:
    store = AlertStore(sqlite3.connect(":memory:"))
    return Alerting(load_rules(), ClusterState(), store), store


def _counters(t: float, uuid: str = "GPU-z", **fields) -> agent_pb2.Batch:
    batch = agent_pb2.Batch()
    batch.gpu_health.add(time=t, uuid=uuid, ecc_uncorrected_volatile=0, **fields)
    return batch


def test_a_jobless_hardware_xid_resolves_once_its_gpu_has_answered_healthy():
    alerting, store = _alerting()
    batch = agent_pb2.Batch()
    batch.health_events.add(time=1000.0, uuid="GPU-z", kind="xid", xid=48, data=48)
    alerting.on_health("n1", batch, 1000.0)
    [alert] = store.active()
    assert (alert.rule, alert.severity, alert.job_id) == ("gpu_xid", "critical", "")
    alerting.on_health("n1", _counters(1000.0 + HEALTH_CLEAR_S - 30), 1600.0)
    alerting.refresh(1600.0)
    assert [a.rule for a in store.active()] == ["gpu_xid"]      # not yet long enough
    alerting.on_health("n1", _counters(1000.0 + HEALTH_CLEAR_S + 30), 1700.0)
    alerting.refresh(1700.0)
    assert store.active() == []
    [done] = [a for a in store.history(limit=5) if a.rule == "gpu_xid"]
    assert "resolved: GPU GPU-z on n1 has answered healthy for 10 min" in done.description


def test_a_jobless_lost_gpu_or_one_with_memory_errors_stays():
    alerting, store = _alerting()
    batch = agent_pb2.Batch()
    batch.health_events.add(time=1000.0, uuid="GPU-z", kind="xid", xid=79, data=79)
    batch.health_events.add(time=1000.0, uuid="GPU-y", kind="xid", xid=48, data=48)
    alerting.on_health("n1", batch, 1000.0)
    # GPU-y's counters say 3 uncorrected errors: gpu_memory_errors fires, and its XID stays with it
    bad = agent_pb2.Batch()
    bad.gpu_health.add(time=1000.0 + 2 * HEALTH_CLEAR_S, uuid="GPU-y", ecc_uncorrected_volatile=3)
    alerting.on_health("n1", bad, 2510.0)
    alerting.refresh(2600.0)
    assert sorted(a.rule for a in store.active()) == ["gpu_lost", "gpu_memory_errors", "gpu_xid"]
    # a GPU never heard of since (no counters, still lost): gpu_lost stays however long
    alerting.refresh(1000.0 + 10 * 3600)
    assert "gpu_lost" in [a.rule for a in store.active()]
