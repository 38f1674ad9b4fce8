"""The collector's health listener: who uses a GPU, events handed on, a job's Health views."""
from __future__ import annotations

from types import SimpleNamespace

from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.live import HealthListener, gpu_users
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, ProcessKey, ProcessSample


def series(pid: int, rank: int, gpu: str, job: str = "55", alive: bool = True) -> SimpleNamespace:
    s = ProcessSample(time=10.0, node="n1", pid=pid, start_time=float(pid), command="python", job_id=job,
                      rank=rank, gpus=(GpuUse(gpu, 1 << 30, 50.0),))
    return SimpleNamespace(key=ProcessKey("n1", pid, float(pid)), latest=s, alive=alive)


def state() -> SimpleNamespace:
    procs = {100: series(100, 0, "GPU-a"), 101: series(101, 1, "GPU-b"), 102: series(102, 2, "GPU-a", alive=False),
             103: series(103, 0, "GPU-a", job="")}
    # nodes, gpus: the inventory (none in MIG mode here: a GPU's users are the ranks on it alone)
    st = SimpleNamespace(pids={"n1": procs}, nodes={}, gpus={},
                         processes={ProcessKey("n1", p, float(p)): s for p, s in procs.items()})
    # which GPUs a job holds: the state's own answer, over these processes
    st.job_processes = lambda job: ClusterState.job_processes(st, job)
    st.job_gpus = lambda job, alive_only=False: ClusterState.job_gpus(st, job, alive_only)
    return st


def test_the_users_of_a_gpu_are_the_live_ranks_on_it_and_the_named_process() -> None:
    st = state()
    assert [(u.job_id, u.rank, u.pid) for u in gpu_users(st, "n1", "GPU-a")] == [("55", 0, 100)]
    assert [u.pid for u in gpu_users(st, "n1", "GPU-a", pid=101)] == [100, 101]
    assert gpu_users(st, "n2", "GPU-a") == []


def test_an_event_from_before_a_process_started_did_not_hit_it() -> None:
    st = state()   # the processes started at their pid's number of seconds
    assert [u.pid for u in gpu_users(st, "n1", "GPU-a", hit_at=50.0)] == []
    assert [u.pid for u in gpu_users(st, "n1", "GPU-a", hit_at=100.0)] == [100]


def test_health_records_become_alerts_and_the_jobs_health_views() -> None:
    st = state()
    handled = []
    listener = HealthListener(HealthEngine(load_catalog()), st, lambda events, now: handled.extend(events))
    batch = agent_pb2.Batch()
    batch.health_events.add(time=200.0, uuid="GPU-a", kind="xid", xid=79, data=79,
                            source=agent_pb2.HealthEvent.KMSG, kernel_boot_id="b", kmsg_seq=1)
    listener.on_health("n1", batch, 201.0)
    [ev] = handled
    assert (ev.rule, ev.job_id, ev.rank, ev.node, ev.gpu) == ("gpu_lost", "55", 0, "n1", "GPU-a")
    job = SimpleNamespace(gpus_by_node={"n1": ["GPU-a"]}, processes=set(st.processes), start_time=5.0)
    [view] = listener.job_health(job)
    assert (view.rule, view.severity, view.rank, view.gpu, view.action) == ("gpu_lost", "critical", 0, "GPU-a",
                                                                            "drain")
    assert "fell off the bus" in view.description and view.advice
    later = SimpleNamespace(gpus_by_node={"n1": ["GPU-a"]}, processes=set(), start_time=300.0)
    [still] = listener.job_health(later)         # lost before the job started, and not back since: its GPU
    assert (still.rule, still.time) == ("gpu_lost", 200.0)
    answers = agent_pb2.Batch()
    answers.gpu_health.add(time=250.0, uuid="GPU-a", ecc_uncorrected_volatile=0)
    listener.on_health("n1", answers, 251.0)
    assert listener.job_health(later) == []      # it answered again before the job: not the job's health


def test_a_job_that_starts_on_a_gpu_with_standing_memory_errors_is_told_an_old_xid_not() -> None:
    st = state()
    listener = HealthListener(HealthEngine(load_catalog()), st, lambda events, now: None)
    batch = agent_pb2.Batch()
    batch.health_events.add(time=90.0, uuid="GPU-a", kind="xid", xid=13, source=agent_pb2.HealthEvent.KMSG,
                            kernel_boot_id="b", kmsg_seq=1)
    batch.gpu_health.add(time=100.0, uuid="GPU-a", ecc_uncorrected_volatile=2, ecc_uncorrected_aggregate=2)
    listener.on_health("n1", batch, 101.0)
    job = SimpleNamespace(gpus_by_node={"n1": ["GPU-a"]}, processes=set(), start_time=300.0)
    [view] = listener.job_health(job)
    assert (view.rule, view.time, view.gpu) == ("gpu_memory_errors", 100.0, "GPU-a")
    assert "2 uncorrected ECC errors" in view.description
    again = agent_pb2.Batch()   # the same counts read again: still the one finding
    again.gpu_health.add(time=130.0, uuid="GPU-a", ecc_uncorrected_volatile=2, ecc_uncorrected_aggregate=2)
    listener.on_health("n1", again, 131.0)
    assert [v.rule for v in listener.job_health(job)] == ["gpu_memory_errors"]
    reset = agent_pb2.Batch()   # the GPU reset: its volatile count back to 0, the aggregate under threshold
    reset.gpu_health.add(time=200.0, uuid="GPU-a", ecc_uncorrected_volatile=0, ecc_uncorrected_aggregate=0)
    listener.on_health("n1", reset, 201.0)
    assert listener.job_health(job) == []
