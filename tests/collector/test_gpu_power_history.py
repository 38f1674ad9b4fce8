"""A GPU's power over time, kept in its series beside the (t, util, mem) history (the job page's power chart)."""
from __future__ import annotations

from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.v1 import agent_pb2


def _sample(t: float, watts: float | None) -> agent_pb2.GpuSample:
    m = agent_pb2.GpuSample(time=t, uuid="GPU-a", utilization=50.0, memory_used_bytes=1 << 30)
    if watts is not None:
        m.power_watts = watts
    return m


def test_power_readings_are_kept_in_time_with_their_times_and_bounded():
    st = ClusterState(history_points=3)
    st.add_gpus("n1", [_sample(100.0, 200.5), _sample(101.0, None), _sample(102.0, 250.0)])
    st.add_gpus("n1", [_sample(101.5, 999.0)])  # older than the latest: dropped, as the history does
    st.add_gpus("n1", [_sample(103.0, 260.0), _sample(104.0, 270.0)])
    gs = st.gpus["GPU-a"]
    assert list(gs.power_history) == [(102.0, 250.0), (103.0, 260.0), (104.0, 270.0)]
    assert [p[0] for p in gs.history] == [102.0, 103.0, 104.0]  # the utilisation history as it was
