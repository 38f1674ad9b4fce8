"""A history point read straight from a batch's columns (the per-poll path writes every point so)
holds what the row's whole sample would: GPU memory summed over the GPUs that report it, the highest SM
utilisation, unknown readings None."""
from __future__ import annotations

from clusterwatch.collector.state.cluster import ClusterState, Point, _raw_point, process_history
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, ProcessKey, ProcessSample
from clusterwatch.wire import ProcessColumns, processes_to_table

GPUS = [
    (),  # on no GPU
    (GpuUse("GPU-a", 1 << 30, 40.0),),
    (GpuUse("GPU-a", 1 << 30, 40.0), GpuUse("GPU-b", 3 << 30, 75.5)),
    (GpuUse("GPU-a", None, None), GpuUse("GPU-b", 2 << 30, None)),  # readings unknown
    (GpuUse("GPU-a", None, 10.0), GpuUse("GPU-b", None, 10.0)),
]


def _samples(t: float) -> list[ProcessSample]:
    out = []
    for pid, gpus in enumerate(GPUS, start=100):
        unknown = pid % 2 == 0
        out.append(ProcessSample(t, "n1", pid, 1.0, job_id="7", rank=pid - 100,
                                 cpu_percent=None if unknown else 12.5 + t, rss_bytes=None if unknown else 1 << 20,
                                 threads=None if unknown else 9, open_fds=None if unknown else 33, gpus=gpus))
    return out


def test_a_point_from_the_columns_is_the_row_samples() -> None:
    t = agent_pb2.ProcessTable()
    processes_to_table(_samples(10.0) + _samples(11.0), t)
    cols = ProcessColumns(t)
    g = 0
    ring = process_history(4)
    for i in range(cols.rows):
        s = cols.sample(i, "", g)
        ring.append_raw(*_raw_point(cols, i, g))
        assert ring[-1] == Point(s.time, s.cpu_percent, s.rss_bytes, s.gpu_memory_bytes, s.gpu_utilization,
                                 s.threads, s.open_fds)
        g += cols.gpu_count[i]


def test_a_step_on_a_batch_first_poll_is_written_from_it() -> None:
    st = ClusterState(history_step_s=5.0)
    for first in (10.0, 15.5):  # the second batch's first poll is the first a step after the point at 11.0
        t = agent_pb2.ProcessTable()
        processes_to_table(_samples(first) + _samples(first + 1.0), t)
        st.add_processes("n1", ProcessColumns(t), first + 1.0)
    hist = list(st.processes[ProcessKey("n1", 102, 1.0)].history)
    assert [p.t for p in hist] == [10.0, 15.5]
    assert hist[1] == Point(15.5, None, None, 4 << 30, 75.5, None, None)
    hist = list(st.processes[ProcessKey("n1", 103, 1.0)].history)
    assert hist[1] == Point(15.5, 28.0, 1 << 20, 2 << 30, None, 9, 33)
