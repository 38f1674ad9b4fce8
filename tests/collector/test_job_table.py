"""JobTable: however a job enters or leaves ClusterState.jobs, node_gpu_holders' index follows (issue 25's move 3)."""
from __future__ import annotations

import pytest
from clusterwatch.collector.state.cluster import ClusterState, JobState
from clusterwatch.collector.state.job_table import JobTable


def test_a_job_put_straight_into_the_table_holds_its_gpus():
    state = ClusterState()
    state.jobs["7"] = JobState("7", nodes=["n1"], gpus_by_node={"n1": ["GPU-a", "GPU-b"]})
    assert state.node_gpu_holders("n1")[0] == {"GPU-a": "7", "GPU-b": "7"}
    assert state.node_gpu_holders("n2")[0] == {}


def test_a_job_taken_out_or_replaced_leaves_the_index():
    state = ClusterState()
    state.jobs["7"] = JobState("7", nodes=["n1", "n2"], gpus_by_node={"n1": ["GPU-a"], "n2": ["GPU-c"]})
    state.jobs["8"] = JobState("8", nodes=["n1"], gpus_by_node={"n1": ["GPU-b"]})
    del state.jobs["8"]
    assert state.node_gpu_holders("n1")[0] == {"GPU-a": "7"}
    state.jobs["7"] = JobState("7", nodes=["n2"], gpus_by_node={"n2": ["GPU-d"]})  # the same id, another job
    assert state.jobs.allocated_on == {"n2": {"7"}}
    assert state.node_gpu_holders("n2")[0] == {"GPU-d": "7"}
    assert state.jobs.pop("7") is not None and state.jobs.pop("7", None) is None
    assert state.jobs.allocated_on == {}
    with pytest.raises(KeyError):
        state.jobs.pop("7")


def test_an_allocation_of_a_held_job_is_indexed_and_of_another_only_once_held():
    state = ClusterState()
    held, later = JobState("1"), JobState("2")
    state.jobs["1"] = held
    state.set_job_gpus(held, "n1", ["GPU-a"])
    state.set_job_gpus(later, "n1", ["GPU-b"])
    assert state.node_gpu_holders("n1")[0] == {"GPU-a": "1"}
    state.jobs["2"] = later
    assert state.node_gpu_holders("n1")[0] == {"GPU-a": "1", "GPU-b": "2"}


@pytest.mark.parametrize("write", [
    lambda t: t.update({"1": JobState("1")}),
    lambda t: t.setdefault("1", JobState("1")),
    lambda t: t.clear(),
    lambda t: t.popitem(),
])
def test_the_dicts_other_writers_refuse_rather_than_pass_the_index_by(write):
    table = JobTable()
    table["0"] = JobState("0", gpus_by_node={"n1": ["GPU-a"]})
    with pytest.raises(TypeError, match="one at a time"):
        write(table)
    assert table.allocated_on == {"n1": {"0"}} and list(table) == ["0"]
