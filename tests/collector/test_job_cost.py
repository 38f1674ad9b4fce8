"""What a job cost on its GPUs (collector/state/job_cost.py): energy as the difference of NVML's counter over
the readings the job held the GPU for, a driver reload's reset counted and not guessed over, a shared GPU's
whole energy to its holder and flagged, a MIG instance without an energy figure, throttle time by reason from
the violation counters (a MIG instance's job gets its whole GPU's), time at each activity level by SM
activity where GPM is read and by utilisation where not; on /metrics as counters (test_job_cost_view.py: in the
job view, the summary and status)."""
from __future__ import annotations

import threading

import pytest
from clusterwatch.collector.export import ClusterCollector, Exposition, same_exposition
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.collector.state.job_cost import ACTIVITY_LEVELS, level_of
from clusterwatch.v1 import agent_pb2
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from clusterwatch.model import GpuActivity, GpuInfo, GpuUse, JobEvent, ProcessSample
from clusterwatch.wire import ProcessColumns, gpu_activity_to_proto, processes_to_table

T0 = 1_800_000_000.0
GiB = 1 << 30


def gpu(uuid: str, t: float, energy_mj: int | None = None, util: float = 80.0,
        activity: GpuActivity | None = None) -> agent_pb2.GpuSample:
    m = agent_pb2.GpuSample(time=t, uuid=uuid, utilization=util, memory_used_bytes=GiB)
    if energy_mj is not None:
        m.energy_mj = energy_mj
    if activity is not None:
        gpu_activity_to_proto(activity, m.activity)
    return m


def procs(st: ClusterState, t: float, *uses: tuple[str, int, str]) -> None:
    """The node's poll at t: a process of job `job_id` (pid) on each GPU named."""
    samples = [ProcessSample(t, "n1", pid, T0 - 100 - pid, user="alice", job_id=job_id,
                             gpus=(GpuUse(uuid, GiB, 50.0),)) for uuid, pid, job_id in uses]
    table = agent_pb2.ProcessTable()
    processes_to_table(samples, table)
    st.add_processes("n1", ProcessColumns(table), t)


def cluster(*gpus: GpuInfo) -> ClusterState:
    st = ClusterState()
    st.hello("n1", "boot", "1.0", 1.0, "nvml", 512 * GiB, list(gpus), T0)
    return st


def test_energy_is_the_counters_difference_and_a_reset_is_counted_not_guessed() -> None:
    st = cluster(GpuInfo("GPU-a", 0, "H100", 80 * GiB))
    st.add_gpus("n1", [gpu("GPU-a", T0 - 1, 1_000_000)])  # before the job: nobody's
    st.job_event("n1", JobEvent("start", "7", T0, 1000, "alice", ("GPU-a",)))
    for i, mj in enumerate([1_400_000, 2_000_000, 2_500_000]):
        st.add_gpus("n1", [gpu("GPU-a", T0 + i, mj)])
    cost = st.jobs["7"].gpu_cost["GPU-a"]
    assert cost.energy_mj == 2_500_000 - 1_000_000 and cost.energy_resets == 0 and not cost.shared
    st.add_gpus("n1", [gpu("GPU-a", T0 + 3, 2_500_000)])  # the same batch resent: nothing new
    st.add_gpus("n1", [gpu("GPU-a", T0 + 2, 2_600_000)])  # older than what is held: skipped
    assert cost.energy_mj == 1_500_000
    # the driver reloads: the counter starts again from 0; the interval across it is unknown, not counted
    st.add_gpus("n1", [gpu("GPU-a", T0 + 5, 300)])
    st.add_gpus("n1", [gpu("GPU-a", T0 + 6, 50_300)])
    assert cost.energy_mj == 1_500_000 + 50_000 and cost.energy_resets == 1
    # the job ends: what the GPU uses after is nobody's
    st.job_event("n1", JobEvent("end", "7", T0 + 7, exit_code=0))
    st.add_gpus("n1", [gpu("GPU-a", T0 + 8, 900_000)])
    assert cost.energy_mj == 1_550_000 and cost.has_energy


def test_a_shared_gpu_goes_whole_to_its_holder_flagged_and_the_other_job_gets_none() -> None:
    st = cluster(GpuInfo("GPU-a", 0, "H100", 80 * GiB), GpuInfo("GPU-b", 1, "H100", 80 * GiB))
    st.job_event("n1", JobEvent("start", "7", T0, 1000, "alice", ("GPU-a",)))
    st.job_event("n1", JobEvent("start", "8", T0, 1000, "alice", ("GPU-b",)))
    procs(st, T0, ("GPU-a", 11, "7"), ("GPU-a", 12, "8"), ("GPU-b", 13, "8"))  # job 8's rank strays onto GPU-a
    holders, shared = st.node_gpu_holders("n1")
    assert holders == {u: j for u, j in st.gpu_holders().items()} == {"GPU-a": "7", "GPU-b": "8"}
    assert shared == {"GPU-a"}
    st.add_gpus("n1", [gpu("GPU-a", T0, 0), gpu("GPU-b", T0, 0)])
    st.add_gpus("n1", [gpu("GPU-a", T0 + 1, 700_000), gpu("GPU-b", T0 + 1, 200_000)])
    a, b = st.jobs["7"].gpu_cost["GPU-a"], st.jobs["8"].gpu_cost["GPU-b"]
    assert (a.energy_mj, a.shared) == (700_000, True) and (b.energy_mj, b.shared) == (200_000, False)
    assert "GPU-a" not in st.jobs["8"].gpu_cost


def test_without_an_allocation_the_first_known_job_of_its_processes_holds_it() -> None:
    st = cluster(GpuInfo("GPU-a", 0, "H100", 80 * GiB))
    procs(st, T0, ("GPU-a", 11, "first"))
    procs(st, T0 + 1, ("GPU-a", 12, "second"), ("GPU-a", 11, "first"))
    holders, shared = st.node_gpu_holders("n1")
    assert holders == st.gpu_holders() == {"GPU-a": "first"} and shared == {"GPU-a"}


def test_a_mig_instance_has_no_energy_but_its_whole_gpus_throttle_time() -> None:
    st = cluster(GpuInfo("MIG-1", 0, "H100 MIG 3g", 40 * GiB, "GPU-p"), GpuInfo("MIG-2", 0, "H100 MIG 3g", 40 * GiB,
                                                                                   "GPU-p"))
    st.job_event("n1", JobEvent("start", "7", T0, 1000, "alice", ("MIG-1",)))
    st.job_event("n1", JobEvent("start", "8", T0, 1000, "alice", ("MIG-2",)))
    for i in range(3):  # the agent sends no energy for an instance, and no utilisation either
        st.add_gpus("n1", [agent_pb2.GpuSample(time=T0 + i, uuid=u) for u in ("MIG-1", "MIG-2")])
    for t, power in ((T0, 10.0), (T0 + 2, 14.5)):
        h = agent_pb2.GpuHealth(time=t, uuid="GPU-p")
        h.violation_seconds.update({"power": power, "thermal": 3.0})
        st.add_gpu_health("n1", [h])
    mig = st.jobs["7"].gpu_cost["MIG-1"]
    assert not mig.has_energy and mig.energy_mj == 0  # not the whole GPU's energy, nor a guess at a share
    assert mig.throttle_s == {"power": 4.5}  # thermal did not move
    assert st.jobs["8"].gpu_cost["MIG-2"].throttle_s == {"power": 4.5}


def test_throttle_time_by_reason_and_a_counter_that_goes_back_counts_nothing() -> None:
    st = cluster(GpuInfo("GPU-a", 0, "H100", 80 * GiB))
    st.job_event("n1", JobEvent("start", "7", T0, 1000, "alice", ("GPU-a",)))
    for t, power, thermal in ((T0, 1.0, 0.0), (T0 + 5, 3.0, 0.5), (T0 + 10, 0.2, 0.5), (T0 + 15, 1.2, 2.5)):
        h = agent_pb2.GpuHealth(time=t, uuid="GPU-a")
        h.violation_seconds.update({"power": power, "thermal": thermal})
        st.add_gpu_health("n1", [h])
    assert st.jobs["7"].gpu_cost["GPU-a"].throttle_s == {"power": 2.0 + 1.0, "thermal": 0.5 + 2.0}


def test_time_at_each_activity_level_by_sm_activity_where_read_else_by_utilisation() -> None:
    st = cluster(GpuInfo("GPU-a", 0, "H100", 80 * GiB))
    st.job_event("n1", JobEvent("start", "7", T0, 1000, "alice", ("GPU-a",)))
    spin = GpuActivity(10.0, sm_active=2.0)
    st.add_gpus("n1", [gpu("GPU-a", T0, util=100.0, activity=spin)])
    for i in range(1, 11):  # utilisation reads 100 % while its SMs idle: binned by SM activity, 0-5 %
        st.add_gpus("n1", [gpu("GPU-a", T0 + i, util=100.0)])
    for i in range(41, 46):  # the GPM reading is stale by now: by utilisation
        st.add_gpus("n1", [gpu("GPU-a", T0 + i, util=60.0)])
    cost = st.jobs["7"].gpu_cost["GPU-a"]
    assert cost.sm_active_s == [10.0, 0.0, 0.0, 0.0, 0.0]
    assert cost.utilization_s == [0.0, 0.0, 0.0, 31.0 + 4.0, 0.0]  # a 31 s gap, then 4 polls
    assert [level_of(p) for p in (0.0, 4.99, 5.0, 50.0, 75.0, 100.0)] == [0, 0, 1, 3, 4, 4]
    assert len(ACTIVITY_LEVELS) == 5


def test_metrics_are_counters_per_job_and_both_exposition_paths_agree() -> None:
    st = cluster(GpuInfo("GPU-a", 0, "H100", 80 * GiB), GpuInfo("GPU-b", 1, "H100", 80 * GiB))
    st.job_event("n1", JobEvent("start", "7", T0, 1000, "alice", ("GPU-a", "GPU-b")))
    st.add_gpus("n1", [gpu("GPU-a", T0, 0, util=90.0), gpu("GPU-b", T0, 5_000, util=10.0)])
    st.add_gpus("n1", [gpu("GPU-a", T0 + 1, 600_000, util=90.0), gpu("GPU-b", T0 + 1, 105_000, util=10.0)])
    h = agent_pb2.GpuHealth(time=T0, uuid="GPU-a")
    h.violation_seconds["thermal"] = 1.0
    st.add_gpu_health("n1", [h])
    h.time, h.violation_seconds["thermal"] = T0 + 1, 1.25
    st.add_gpu_health("n1", [h])
    c = ClusterCollector(st, lambda: T0 + 2, False)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    text = Exposition(c, threading.Lock()).scrape(False).decode()
    assert same_exposition(text.encode(), generate_latest(registry))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["clusterwatch_job_gpu_energy_joules"].type == "counter"
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples
           if s.name.startswith("clusterwatch_job_gpu_") and s.name.endswith("_total")}
    assert got[("clusterwatch_job_gpu_energy_joules_total", (("job_id", "7"),))] == pytest.approx(700.0)
    assert got[("clusterwatch_job_gpu_throttle_seconds_total", (("job_id", "7"), ("reason", "thermal")))] == 0.25
    levels = {dict(k[1])["level"]: v for k, v in got.items() if k[0] == "clusterwatch_job_gpu_activity_seconds_total"}
    assert levels == {"0-5": 0.0, "5-25": 1.0, "25-50": 0.0, "50-75": 0.0, "75-100": 1.0}

