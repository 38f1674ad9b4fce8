"""ClusterState's node → allocated jobs index (issue 25): node_gpu_holders reads it at every batch instead of
walking every job, so it must give what that walk gave after any sequence of prolog starts, Slurm allocations
(the registry's path), processes using GPUs, epilogs, closes and a restart from the store."""
from __future__ import annotations

import asyncio
from dataclasses import replace

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.jobmap.fake import FakeJobMapper
from clusterwatch.collector.jobmap.registry import JobRegistry
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterwatch.model import GpuInfo, GpuUse, JobEvent, ProcessSample
from clusterwatch.slurm.scontrol import JobRecord
from clusterwatch.wire import ProcessColumns, processes_to_table

T0 = 1_800_000_000.0
NODES = ("n1", "n2")
GPUS_PER_NODE = 3
JOB_IDS = (1, 2, 3, 4)


def walked_node_gpu_holders(state: ClusterState, node: str) -> tuple[dict[str, str], set[str]]:
    """The oracle: node_gpu_holders as it was before the index, walking every job for the allocations (the
    processes' part, which the index did not change, is the state's own)."""
    holders, shared = state._node_gpu_users(node)
    for job in state.jobs.values():
        if not job.ended and (uuids := job.gpus_by_node.get(node)):
            for u in uuids:
                user = holders.get(u)
                if user is not None and user != job.job_id:
                    shared.add(u)
                holders[u] = job.job_id
    return holders, shared


def _uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


class Cluster:
    """A collector core with its registry over a fake Slurm, and the processes each node's agent last polled."""

    def __init__(self) -> None:
        self.now = T0
        self.store = Store(open_db(":memory:"))
        self.mapper = FakeJobMapper()
        self.polls: dict[str, dict[int, ProcessSample]] = {node: {} for node in NODES}
        self.restart()

    def clock(self) -> float:
        return self.now

    def restart(self) -> None:
        """A new collector on the same store (jobs restored from it), its agents connecting again."""
        self.core = CollectorCore(CollectorConfig(), self.store, clock=self.clock)
        self.registry = JobRegistry(self.core, self.mapper, close_grace_s=20.0, clock=self.clock)
        for node in NODES:
            gpus = [GpuInfo(_uuid(node, i), i, "sim", 80 << 30) for i in range(GPUS_PER_NODE)]
            self.core.state.hello(node, "boot", "0", 1.0, "sim", 1 << 30, gpus, self.now)

    def step(self, op: tuple) -> None:
        self.now += 10.0
        state = self.core.state
        kind, job_id = op[0], str(op[1])
        if kind == "prolog":
            _, _, node, indexes = op
            state.job_event(node, JobEvent("start", job_id, self.now, gpu_uuids=tuple(_uuid(node, i)
                                                                                        for i in indexes)))
        elif kind == "epilog":
            state.job_event(op[2], JobEvent("end", job_id, self.now, exit_code=0))
        elif kind == "slurm":
            _, _, slurm_state, by_node = op
            self.mapper.jobs[op[1]] = JobRecord(
                job_id=op[1], name="train", user="alice", uid=1000, account="ml", partition="gpu",
                state=slurm_state, submit_time=int(T0), start_time=int(T0), end_time=int(self.now),
                time_limit_s=3600, nodes=tuple(by_node), cpus=8, memory_bytes=1 << 30, gpus_by_node=by_node,
                gpu_count_by_node={n: len(i) for n, i in by_node.items()}, num_tasks=1)
            asyncio.run(self.registry.refresh())
        elif kind == "use":  # a poll of the node: job's process on a GPU (or gone, with no GPU)
            _, _, node, pid, index = op
            poll = self.polls[node]
            if index is None:
                poll.pop(pid, None)
            else:
                poll[pid] = ProcessSample(self.now, node, pid, 1.0, job_id=job_id,
                                          gpus=(GpuUse(_uuid(node, index), 1 << 30, 50.0),))
            samples = [replace(s, time=self.now) for s in poll.values()] or [ProcessSample(self.now, node, 1, 1.0)]
            table = agent_pb2.ProcessTable()
            processes_to_table(samples, table)
            state.add_processes(node, ProcessColumns(table), self.now)
        elif kind == "close":
            job = state.jobs.get(job_id)
            if job is not None:
                self.core.close_job(job)
        elif kind == "restart":
            self.core.flush()
            self.restart()


_job = st.sampled_from(JOB_IDS)
_node = st.sampled_from(NODES)
_indexes = st.lists(st.integers(0, GPUS_PER_NODE - 1), min_size=1, max_size=2, unique=True).map(tuple)
OPS = st.one_of(
    st.tuples(st.just("prolog"), _job, _node, _indexes),
    st.tuples(st.just("epilog"), _job, _node),
    st.tuples(st.just("slurm"), _job, st.sampled_from(("RUNNING", "COMPLETED")),
              st.dictionaries(_node, _indexes, min_size=1)),
    st.tuples(st.just("use"), _job, _node, st.integers(100, 103), st.none() | st.integers(0, GPUS_PER_NODE - 1)),
    st.tuples(st.just("close"), _job),
    st.tuples(st.just("restart"), st.just(0)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=1, max_size=25))
def test_the_index_gives_what_walking_every_job_gave(ops):
    cluster = Cluster()
    for op in ops:
        cluster.step(op)
        state = cluster.core.state
        for node in (*NODES, "n-unknown"):
            assert state.node_gpu_holders(node) == walked_node_gpu_holders(state, node), (op, node)


def test_a_gpu_allocated_to_two_running_jobs_is_the_last_knowns_and_shared():
    state = ClusterState()
    for job_id in ("1", "2"):
        state.job_event("n1", JobEvent("start", job_id, T0))
    # job 2 is known first but named its GPU last: the holder is still the later known job, as gpu_allocations says
    state.job_event("n1", JobEvent("start", "2", T0, gpu_uuids=("GPU-a",)))
    state.job_event("n1", JobEvent("start", "1", T0, gpu_uuids=("GPU-a", "GPU-b")))
    assert state.node_gpu_holders("n1") == ({"GPU-a": "2", "GPU-b": "1"}, {"GPU-a"})
    assert state.gpu_allocations() == {"GPU-a": "2", "GPU-b": "1"}


def test_a_forgotten_job_leaves_the_index():
    state = ClusterState()
    state.job_event("n1", JobEvent("start", "1", T0, gpu_uuids=("GPU-a",)))
    state.forget_job("1")
    assert state.node_gpu_holders("n1") == ({}, set())
    assert state.jobs.allocated_on == {}
