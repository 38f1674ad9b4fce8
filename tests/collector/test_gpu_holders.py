"""Which job holds GPU u: ClusterState's one answer (gpu_holders, gpu_allocations, job_gpus), which the exporter,
alerting, the trace, stall causes, health, the views and the job page all read."""
from __future__ import annotations

from clusterwatch.collector.health.mig import with_parents
from clusterwatch.collector.state.cluster import (
    ClusterState,
    GpuSeries,
    JobGpu,
    JobState,
    ProcessSeries,
    process_history,
)

from clusterwatch.model import GpuInfo, GpuUse, ProcessKey, ProcessSample

GIB = 1 << 30


def _process(state: ClusterState, job: JobState, node: str, pid: int, rank: int | None, *gpus: str,
             alive: bool = True) -> None:
    key = ProcessKey(node, pid, 100.0)
    sample = ProcessSample(200.0, node, pid, 100.0, job_id=job.job_id, rank=rank,
                           gpus=tuple(GpuUse(u, GIB, 50.0) for u in gpus))
    state.processes[key] = ProcessSeries(key, sample, process_history(720), alive=alive)
    job.processes.add(key)


def _state() -> ClusterState:
    """Job 1 holds GPU-a and GPU-b by allocation; job 2's rank runs on job 1's GPU-b and on GPU-c (unallocated)."""
    state = ClusterState()
    for i, u in enumerate(("GPU-a", "GPU-b", "GPU-c", "GPU-d")):
        state.gpus[u] = GpuSeries("n1", GpuInfo(u, i, "H100", 80 * GIB))
    one = state.jobs["1"] = JobState("1", nodes=["n1"], gpus_by_node={"n1": ["GPU-a", "GPU-b"]})
    two = state.jobs["2"] = JobState("2", nodes=["n1"])
    _process(state, one, "n1", 10, 0, "GPU-a")
    _process(state, two, "n1", 21, 1, "GPU-c")
    _process(state, two, "n1", 20, 0, "GPU-b")
    return state


def test_a_gpu_allocated_to_one_job_and_used_by_anothers_process_is_the_allocated_jobs():
    state = _state()
    assert state.gpu_holders() == {"GPU-a": "1", "GPU-b": "1", "GPU-c": "2"}
    # alerting reads the allocation alone: a GPU only used is no job's there
    assert state.gpu_allocations() == {"GPU-a": "1", "GPU-b": "1"}


def test_a_jobs_gpus_are_its_allocation_then_those_its_processes_use_by_rank():
    state = _state()
    assert state.job_gpus(state.jobs["1"]) == [JobGpu("n1", "GPU-a", True), JobGpu("n1", "GPU-b", True)]
    # rank 0 (on GPU-b) before rank 1 (on GPU-c), whatever order the processes came in
    assert state.job_gpus(state.jobs["2"]) == [JobGpu("n1", "GPU-b", False), JobGpu("n1", "GPU-c", False)]


def test_a_gone_process_holds_no_gpu_but_its_job_still_lists_what_it_used():
    state = _state()
    _process(state, state.jobs["2"], "n1", 22, 2, "GPU-d", alive=False)
    assert "GPU-d" not in state.gpu_holders()
    assert JobGpu("n1", "GPU-d", False) in state.job_gpus(state.jobs["2"])
    assert JobGpu("n1", "GPU-d", False) not in state.job_gpus(state.jobs["2"], alive_only=True)


def test_an_ended_job_holds_nothing_and_the_first_running_user_takes_its_gpu():
    state = _state()
    state.jobs["1"].state = "COMPLETED"
    assert state.gpu_allocations() == {}
    # GPU-a: only the ended job used it; GPU-b: job 2's process uses it
    assert state.gpu_holders() == {"GPU-b": "2", "GPU-c": "2"}
    # the ended job's summary still lists its GPUs
    assert [g.uuid for g in state.job_gpus(state.jobs["1"])] == ["GPU-a", "GPU-b"]


def test_a_gpu_used_by_two_running_jobs_is_the_first_known_jobs():
    state = _state()
    three = state.jobs["3"] = JobState("3", nodes=["n1"])
    _process(state, three, "n1", 30, 0, "GPU-c")
    assert state.gpu_holders()["GPU-c"] == "2"


def test_a_mig_instance_is_held_itself_and_its_whole_gpu_joins_for_health():
    state = _state()
    state.gpus["MIG-x"] = GpuSeries("n1", GpuInfo("MIG-x", 0, "H100 MIG 1g.10gb", 10 * GIB, parent_uuid="GPU-p"))
    four = state.jobs["4"] = JobState("4", nodes=["n1"])
    _process(state, four, "n1", 40, 0, "MIG-x")
    assert state.gpu_holders()["MIG-x"] == "4" and "GPU-p" not in state.gpu_holders()
    held = state.job_gpus(four)
    assert held == [JobGpu("n1", "MIG-x", False)]
    assert with_parents(state, [(g.node, g.uuid) for g in held]) == {("n1", "MIG-x"), ("n1", "GPU-p")}
