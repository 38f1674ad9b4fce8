"""Process samples through the columnar ProcessTable and back: nothing changes, nothing is invented."""
from __future__ import annotations

import math

import pytest
from clusterwatch.v1 import agent_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterwatch.model import GpuUse, ProcessSample
from clusterwatch.wire import ProcessColumns, processes_from_table, processes_to_table

UUIDS = ["GPU-a", "GPU-b", "GPU-c"]
maybe_int = st.none() | st.integers(min_value=0, max_value=2**40)
gpu_use = st.builds(GpuUse, st.sampled_from(UUIDS), maybe_int,
                    st.none() | st.floats(min_value=0, max_value=100, allow_nan=False, width=32))
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
    cpu_percent=st.none() | st.floats(min_value=0, max_value=6400, allow_nan=False, width=32),
    rss_bytes=maybe_int,
    threads=st.none() | st.integers(min_value=0, max_value=5000),
    open_fds=st.none() | st.integers(min_value=0, max_value=100000),
    gpus=st.lists(gpu_use, max_size=3).map(tuple),
)
polls = st.lists(st.lists(sample, max_size=6).map(lambda ss: list({s.pid: s for s in ss}.values())),
                 min_size=1, max_size=6)


def roundtrip(samples: list[ProcessSample], node: str) -> list[ProcessSample]:
    t = agent_pb2.ProcessTable()
    processes_to_table(samples, t)
    return processes_from_table(agent_pb2.ProcessTable.FromString(t.SerializeToString()), node)


@settings(max_examples=300, deadline=None)
@given(polls)
def test_samples_come_back_as_they_went(polls: list[list[ProcessSample]]) -> None:
    for samples in polls:
        for s in samples:
            s.node = "n1"  # the node is the stream's, not the table's
        assert roundtrip(samples, "n1") == samples


def test_labels_and_gpus_are_written_once_per_batch() -> None:
    samples = [ProcessSample(1.0, "n", pid, 2.0, ppid=1, user="ann", command="python", job_id="9", rank=0,
                             mapped_by="environ", gpus=(GpuUse("GPU-a", 10, 50.0),)) for pid in range(10, 20)]
    t = agent_pb2.ProcessTable()
    processes_to_table(samples, t)
    assert len(t.label_sets) == 1 and list(t.gpu_uuids) == ["GPU-a"]
    assert list(t.labels) == [0] * 10 and list(t.gpu_count) == [1] * 10


def test_unknown_readings_stay_unknown_not_zero() -> None:
    s = ProcessSample(1.0, "n", 5, 2.0, gpus=(GpuUse("GPU-a"),))
    t = agent_pb2.ProcessTable()
    processes_to_table([s], t)
    assert math.isnan(t.cpu_percent[0]) and t.rss_bytes[0] == -1 and t.open_fds[0] == -1
    [back] = processes_from_table(t, "n")
    assert (back.cpu_percent, back.rss_bytes, back.threads, back.open_fds) == (None, None, None, None)
    assert back.gpus == (GpuUse("GPU-a", None, None),) and back.rank is None


@pytest.mark.parametrize("spoil, reason", [
    (lambda t: t.time.append(3.0), "column time has 2 rows, pid has 1"),
    (lambda t: t.gpu_count.__setitem__(0, 2), "column gpu has 1 entries, gpu_count adds up to 2"),
    (lambda t: t.labels.__setitem__(0, 4), "a row points at label set 4 of 1"),
    (lambda t: t.gpu.__setitem__(0, 1), "a GPU use points at GPU 1 of 1"),
])
def test_an_inconsistent_table_is_refused_with_its_reason(spoil, reason) -> None:
    t = agent_pb2.ProcessTable()
    processes_to_table([ProcessSample(1.0, "n", 5, 2.0, gpus=(GpuUse("GPU-a", 1, 2.0),))], t)
    spoil(t)
    with pytest.raises(ValueError, match=reason):
        ProcessColumns(t)


_NAN = float("nan")


def reference_processes_to_table(samples: list[ProcessSample], out: agent_pb2.ProcessTable) -> None:
    """processes_to_table as first written, one sample at a time: the semantics the fast one keeps.

    Rows in sample order; label sets (wire.LABEL_FIELDS) and GPU UUIDs each once, in order of first
    appearance; an unknown reading is NaN (float columns) or -1 (integer columns).
    """
    label_index: dict[tuple, int] = {}
    uuid_index: dict[str, int] = {}
    times, pids, starts, labels, cpu, rss, threads, fds, gcount = [], [], [], [], [], [], [], [], []
    gidx, gmem, gsm = [], [], []
    for s in samples:
        key = (s.ppid, s.uid, s.user, s.command, s.job_id, s.rank, s.local_rank, s.step_id, s.mapped_by)
        li = label_index.get(key)
        if li is None:
            li = label_index[key] = len(label_index)
        times.append(s.time)
        pids.append(s.pid)
        starts.append(s.start_time)
        labels.append(li)
        v = s.cpu_percent
        cpu.append(_NAN if v is None else v)
        v = s.rss_bytes
        rss.append(-1 if v is None else v)
        v = s.threads
        threads.append(-1 if v is None else v)
        v = s.open_fds
        fds.append(-1 if v is None else v)
        gcount.append(len(s.gpus))
        for g in s.gpus:
            gi = uuid_index.get(g.gpu_uuid)
            if gi is None:
                gi = uuid_index[g.gpu_uuid] = len(uuid_index)
            gidx.append(gi)
            v = g.used_memory_bytes
            gmem.append(-1 if v is None else v)
            v = g.sm_utilization
            gsm.append(_NAN if v is None else v)
    out.time.extend(times)
    out.pid.extend(pids)
    out.start_time.extend(starts)
    out.labels.extend(labels)
    out.cpu_percent.extend(cpu)
    out.rss_bytes.extend(rss)
    out.threads.extend(threads)
    out.open_fds.extend(fds)
    out.gpu_count.extend(gcount)
    out.gpu.extend(gidx)
    out.gpu_memory_bytes.extend(gmem)
    out.gpu_sm_utilization.extend(gsm)
    out.gpu_uuids.extend(uuid_index)
    add = out.label_sets.add
    for ppid, uid, user, command, job_id, rank, local_rank, step_id, mapped_by in label_index:
        m = add(ppid=ppid, uid=uid, user=user, command=command, job_id=job_id, step_id=step_id,
                mapped_by=mapped_by)
        if rank is not None:
            m.rank = rank
        if local_rank is not None:
            m.local_rank = local_rank


def both_ways(samples: list[ProcessSample]) -> tuple[bytes, bytes]:
    """The batch bytes from processes_to_table and from the reference, each into a fresh batch."""
    fast, ref = agent_pb2.Batch(), agent_pb2.Batch()
    processes_to_table(samples, fast.processes)
    reference_processes_to_table(samples, ref.processes)
    return fast.SerializeToString(), ref.SerializeToString()


@settings(max_examples=400, deadline=None)
@given(st.lists(sample, max_size=40))
def test_the_table_is_byte_for_byte_the_reference_one(samples: list[ProcessSample]) -> None:
    fast, ref = both_ways(samples)
    assert fast == ref


def test_no_samples_still_set_the_table_as_the_reference_does() -> None:
    fast, ref = both_ways([])
    assert fast == ref == agent_pb2.Batch(processes=agent_pb2.ProcessTable()).SerializeToString()


def test_many_label_sets_and_gpus_keep_their_order() -> None:
    # more label sets than the label cache holds, and GPU UUIDs whose index needs two varint bytes
    samples = [ProcessSample(1.0, "n", pid, 2.0, ppid=pid % 7, rank=pid if pid % 3 else None, command=f"c{pid}",
                             gpus=tuple(GpuUse(f"GPU-{(pid * 7 + i) % 300}", pid, None) for i in range(pid % 3)))
               for pid in range(1, 5000)]
    fast, ref = both_ways(samples)
    assert fast == ref
    fast, ref = both_ways(samples[::-1])
    assert fast == ref


def test_rows_append_to_a_table_that_already_has_some() -> None:
    a = [ProcessSample(1.0, "n", 5, 2.0, user="ann", gpus=(GpuUse("GPU-a", 1, 2.0),))]
    b = [ProcessSample(3.0, "n", 6, 4.0, user="bob", rank=1, cpu_percent=3.5)]
    fast, ref = agent_pb2.ProcessTable(), agent_pb2.ProcessTable()
    for samples in (a, b):
        processes_to_table(samples, fast)
        reference_processes_to_table(samples, ref)
    assert fast.SerializeToString() == ref.SerializeToString()
