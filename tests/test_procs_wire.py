"""The agent's process messages from per-process templates are byte for byte those of process_to_proto."""
from __future__ import annotations

from clusterwatch.v1 import agent_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterwatch.model import GpuUse, ProcessSample
from clusterwatch.wire import ProcessFiller, process_to_proto

UUIDS = ["GPU-a", "GPU-b", "GPU-c"]
maybe_int = st.none() | st.integers(min_value=0, max_value=2**40)
gpu_use = st.builds(GpuUse, st.sampled_from(UUIDS), maybe_int,
                    st.none() | st.floats(min_value=0, max_value=100, allow_nan=False))
sample = st.builds(
    ProcessSample,
    time=st.floats(min_value=0, max_value=2e9, allow_nan=False),
    node=st.sampled_from(["n1", "n2"]),
    pid=st.integers(min_value=1, max_value=6),  # few pids: templates are reused, and changed, across polls
    start_time=st.sampled_from([0.0, 1700000000.25, 1700000100.5]),
    ppid=st.integers(min_value=0, max_value=3),
    uid=st.sampled_from([0, 1000]),
    user=st.sampled_from(["", "root", "ann"]),
    command=st.sampled_from(["", "python", "a) b (c", "ü"]),
    job_id=st.sampled_from(["", "4242", "local-7"]),
    rank=st.none() | st.integers(min_value=-2, max_value=64),
    local_rank=st.none() | st.integers(min_value=0, max_value=8),
    step_id=st.sampled_from(["", "0", "batch"]),
    mapped_by=st.sampled_from(["", "cgroup", "environ", "tree", "pid"]),
    cpu_percent=st.none() | st.floats(min_value=0, max_value=6400, allow_nan=False),
    rss_bytes=maybe_int,
    threads=st.none() | st.integers(min_value=0, max_value=5000),
    open_fds=st.none() | st.integers(min_value=0, max_value=100000),
    gpus=st.lists(gpu_use, max_size=3).map(tuple),
)
polls = st.lists(st.lists(sample, max_size=6).map(lambda ss: list({s.pid: s for s in ss}.values())),
                 min_size=1, max_size=6)


def reference(samples: list[ProcessSample]) -> bytes:
    batch = agent_pb2.Batch(sent_at=1.5)
    for s in samples:
        process_to_proto(s, batch.processes.add())
    return batch.SerializeToString()


@settings(max_examples=300, deadline=None)
@given(polls)
def test_the_filler_writes_what_process_to_proto_writes(polls: list[list[ProcessSample]]) -> None:
    filler = ProcessFiller()
    for samples in polls:
        batch = agent_pb2.Batch(sent_at=1.5)
        filler.fill(samples, batch.processes)
        assert batch.SerializeToString() == reference(samples)


def test_a_changed_label_or_gpu_rebuilds_the_template() -> None:
    filler = ProcessFiller()
    s = ProcessSample(time=1.0, node="n1", pid=5, start_time=2.0, command="python", cpu_percent=1.5,
                      gpus=(GpuUse("GPU-a", 10, 50.0),))
    for change in ({}, {"job_id": "9", "rank": 3, "mapped_by": "environ"}, {"gpus": (GpuUse("GPU-b", 11, None),)},
                   {"cpu_percent": None, "rank": None}, {"command": "renamed", "ppid": 9}):
        for k, v in change.items():
            setattr(s, k, v)
        batch = agent_pb2.Batch(sent_at=1.5)
        filler.fill([s], batch.processes)
        assert batch.SerializeToString() == reference([s])
        [m] = batch.processes
        assert (m.job_id, m.HasField("rank"), [g.gpu_uuid for g in m.gpus]) == (
            s.job_id, s.rank is not None, [g.gpu_uuid for g in s.gpus])
