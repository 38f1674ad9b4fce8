"""A rank held where it is (uninterruptible sleep D, stopped T, traced t) for long enough is a stall's likely
cause: the collector's state keeps since when each process has been held (both ingest paths), the live cause
source names it after any health event on the job's GPUs, and a moment in D (every disk read) is none."""
from __future__ import annotations

from clusterwatch.collector.alerting.stall_causes import HealthCauses
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.collector.rules import Engine, ProcessObservation, load_rules
from clusterwatch.collector.rules.causes import HELD_MIN_S, held_long_enough, held_rank
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, ProcessKey, ProcessSample
from clusterwatch.wire import ProcessColumns, processes_to_table

RANKS = {0: ("n1", 10), 1: ("n2", 11)}


def _send(st: ClusterState, node: str, polls: list[list[ProcessSample]]) -> None:
    t = agent_pb2.ProcessTable()
    processes_to_table([s for poll in polls for s in poll], t)
    st.add_processes(node, ProcessColumns(t), polls[-1][0].time)


def _sample(t: float, rank: int, state: str = "", wchan: str = "") -> ProcessSample:
    node, pid = RANKS[rank]
    return ProcessSample(t, node, pid, 1.0, job_id="9", rank=rank, gpus=(GpuUse(f"GPU-{rank}", 1 << 30, 99.0),),
                         state=state, wchan=wchan)


def test_the_state_keeps_since_when_a_process_has_been_held() -> None:
    st = ClusterState()
    key = ProcessKey("n2", 11, 1.0)
    _send(st, "n2", [[_sample(10.0, 1, "D", "nfs_wait_bit_killable")]])  # first seen held: the row path
    series = st.processes[key]
    assert (series.state, series.state_since, series.latest.wchan) == ("D", 10.0, "nfs_wait_bit_killable")
    held = ("D", "nfs_wait_bit_killable")
    _send(st, "n2", [[_sample(15.0, 1, *held)], [_sample(16.0, 1, *held)]])
    assert (series.state, series.state_since) == ("D", 10.0)  # the per-poll path: held on, since the same
    _send(st, "n2", [[_sample(20.0, 1)], [_sample(21.0, 1)]])
    assert (series.state, series.latest.state, series.latest.wchan) == ("", "", "")
    _send(st, "n2", [[_sample(25.0, 1)], [_sample(26.0, 1, "T")]])
    assert (series.state, series.state_since, series.latest.wchan) == ("T", 26.0, "")


def _stall(st: ClusterState, eng: Engine, held: dict[float, tuple[str, str]], until: float = 600.0) -> list:
    """Both ranks advance for 100 s, then freeze; rank 1's state from each time in `held` on (t → state, wchan)."""
    evs = []
    t, state = 0.0, ("", "")
    while t <= until:
        state = held.get(t, state)
        for rank, (node, pid) in RANKS.items():
            _send(st, node, [[_sample(t, rank, *(state if rank == 1 else ("", "")))]])
            step = int(t // 10) if t < 100 else 9
            evs += eng.observe(ProcessObservation(t=t, node=node, job_id="9", pid=pid, start_time=1.0,
                                                  gpu=f"GPU-{rank}", rank=rank, gpu_util=99.0, step=step))
        t += 5.0
    return evs


def _stalls_of_rank_0(evs: list) -> list:
    return [e for e in evs if e.rule == "training_stall" and e.rank == 0 and e.state in ("pending", "firing")]


def test_a_rank_in_uninterruptible_sleep_is_the_likely_cause() -> None:
    st = ClusterState()
    eng = Engine(load_rules(), causes=HealthCauses(st, lambda: None))
    evs = _stall(st, eng, {100.0: ("D", "nfs_wait_bit_killable")})
    fired = [e for e in _stalls_of_rank_0(evs) if e.state == "firing"]
    assert fired, evs
    desc = fired[-1].description
    assert ("likely cause: rank 1 on n2 (pid 11) has been in uninterruptible sleep for " in desc
            and ", in nfs_wait_bit_killable: I/O that does not return, e.g. a hung file system" in desc), desc
    f = fired[-1].figures
    assert (f["cause"], f["cause_rank"], f["cause_node"], f["cause_pid"], f["cause_state"], f["cause_wchan"]) == (
        "process_held", 1, "n2", 11, "D", "nfs_wait_bit_killable")
    assert f["held_for_s"] >= HELD_MIN_S


def test_a_moment_in_d_is_no_cause() -> None:
    st = ClusterState()
    eng = Engine(load_rules(), causes=HealthCauses(st, lambda: None))
    evs = _stall(st, eng, {100.0: ("D", "folio_wait_bit"), 105.0: ("", "")})
    assert _stalls_of_rank_0(evs)
    assert not any("uninterruptible" in e.description for e in evs)


def test_held_long_enough_is_a_minute_or_most_of_a_younger_stall() -> None:
    assert held_long_enough(60.0, 3600.0) and not held_long_enough(59.0, 3600.0)
    assert held_long_enough(20.0, 30.0) and not held_long_enough(10.0, 30.0)
    assert not held_long_enough(4.0, 4.0)  # a floor: two polls of D are no stall's cause


def test_stopped_and_traced_ranks_say_what_holds_them() -> None:
    t = held_rank("T", 3, "gpu007", 4242, 370.0)
    assert t.text == ("rank 3 on gpu007 (pid 4242) has been stopped (state T) for 6 min: a SIGSTOP or ctrl-Z "
                      "holds it; SIGCONT (kill -CONT) resumes it")
    assert "cause_wchan" not in t.figures and t.figures["cause_state"] == "T"
    traced = held_rank("t", None, "gpu007", 4242, 90.0)
    assert traced.text.startswith("pid 4242 on gpu007 has been stopped by a tracer (state t) for 1 min")


def test_a_health_event_on_the_jobs_gpus_comes_before_a_held_rank() -> None:
    st = ClusterState()
    _send(st, "n1", [[_sample(10.0, 0)]])
    _send(st, "n2", [[_sample(10.0, 1, "D", "uvm_wait")]])
    st.jobs["9"].gpus_by_node = {"n2": ["GPU-1"]}
    health = HealthEngine(load_catalog())
    batch = agent_pb2.Batch()
    batch.health_events.add(time=9.0, uuid="GPU-1", kind="xid", xid=79, data=79)
    health.observe_event("n2", batch.health_events[0], [])
    _send(st, "n2", [[_sample(200.0, 1, "D", "uvm_wait")]])
    causes = HealthCauses(st, lambda: health)("9", 0.0, 200.0)
    assert [c.kind for c in causes] == ["gpu_health", "process_held"], causes
    assert "in uvm_wait" in causes[1].text
    # a held process that is gone is no cause
    _send(st, "n2", [[ProcessSample(210.0, "n2", 99, 2.0)]])
    assert [c.kind for c in HealthCauses(st, lambda: None)("9", 0.0, 210.0)] == []
