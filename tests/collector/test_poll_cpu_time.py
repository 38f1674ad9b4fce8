"""A process's CPU time from a batch of polls (the per-poll path, a poll's column at a time) is what the same
polls sent one a batch give: each poll's percent over the time since the poll before, an unknown percent
counting none, a gap past MAX_GAP_S counting MAX_GAP_S."""
from __future__ import annotations

import math

import pytest
from clusterwatch.collector.state.cluster import MAX_GAP_S, ClusterState
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import ProcessKey, ProcessSample
from clusterwatch.wire import ProcessColumns, processes_to_table

T0 = 1_800_000_000.0
# (time, CPU percent of pid 100, of pid 101) a poll: unknown percents in the first and a middle poll, a gap an
# agent was away for, and polls a fraction of a second apart
POLLS = [(T0 + 1.0, None, 80.0), (T0 + 2.0, 150.0, None), (T0 + 2.0 + 3 * MAX_GAP_S, 100.0, 90.0),
         (T0 + 3.5 + 3 * MAX_GAP_S, 40.0, 10.0), (T0 + 3.75 + 3 * MAX_GAP_S, 200.0, math.nan)]


def _table(polls) -> ProcessColumns:
    samples = [ProcessSample(t, "n1", pid, 1.0, job_id="7", cpu_percent=None if cpu is None or cpu != cpu else cpu,
                             rss_bytes=1 << 20)
               for t, *cpus in polls for pid, cpu in zip((100, 101), cpus, strict=True)]
    t = agent_pb2.ProcessTable()
    processes_to_table(samples, t)
    return ProcessColumns(t)


def _expected(pid_index: int) -> float:
    busy, prev = 0.0, T0  # the first batch's one poll at T0
    for t, *cpus in POLLS:
        cpu = cpus[pid_index]
        if cpu is not None and cpu == cpu:
            busy += cpu / 100.0 * min(t - prev, MAX_GAP_S)
        prev = t
    return busy


@pytest.mark.parametrize("pid_index", [0, 1])
def test_cpu_time_of_a_batch_of_polls_is_that_of_its_polls_one_by_one(pid_index: int) -> None:
    together, apart = ClusterState(), ClusterState()
    for st in (together, apart):
        st.add_processes("n1", _table([(T0, 50.0, 50.0)]), T0)
    cols = _table(POLLS)
    assert cols.poll_width() == 2  # the per-poll path
    together.add_processes("n1", cols, POLLS[-1][0])
    for poll in POLLS:
        apart.add_processes("n1", _table([poll]), poll[0])
    key = ProcessKey("n1", 100 + pid_index, 1.0)
    assert together.processes[key].cpu_seconds == pytest.approx(apart.processes[key].cpu_seconds, rel=1e-12)
    assert together.processes[key].cpu_seconds == pytest.approx(_expected(pid_index), rel=1e-12)
