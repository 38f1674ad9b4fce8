"""A GPU's true activity (GPM) in the collector: kept from the sample that carried it, current for three windows,
exported as ratios and throughputs by direction (the text writer and prometheus_client alike), refused when
absurd, and shown in the job view."""
from __future__ import annotations

import math
import threading

from clusterwatch.collector.export import ClusterCollector, Exposition, same_exposition
from clusterwatch.collector.ingest.checks import check_batch
from clusterwatch.collector.queries.views import job_view
from clusterwatch.collector.state.activity import current_activity
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.v1 import agent_pb2
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from clusterwatch.model import GpuActivity, GpuInfo, GpuReading, JobEvent
from clusterwatch.wire import ProcessColumns, gpu_activity_to_proto, gpu_reading_to_proto

T0 = 1_800_000_000.0
GiB = 1 << 30
MiB = 1 << 20
SPINNING = GpuActivity(10.0, sm_active=2.0, sm_occupancy=1.0, tensor_active=0.0, dram_active=1.5,
                       pcie_tx_bytes_per_s=4 * MiB, pcie_rx_bytes_per_s=8 * MiB)  # a PCIe card: no NVLink


def sample(uuid: str, t: float, activity: GpuActivity | None = None) -> agent_pb2.GpuSample:
    m = agent_pb2.GpuSample()
    gpu_reading_to_proto(GpuReading(uuid, 100.0, 20 * GiB, 80 * GiB, 120.0), t, m)
    if activity is not None:
        gpu_activity_to_proto(activity, m.activity)
    return m


def state() -> ClusterState:
    st = ClusterState()
    gpus = [GpuInfo("GPU-gpm", 0, "H100", 80 * GiB), GpuInfo("GPU-old", 1, "A100", 80 * GiB)]
    st.hello("n1", "boot", "1.0", 1.0, "nvml", 512 * GiB, gpus, T0)
    st.job_event("n1", JobEvent("start", "77", T0 - 60, 1000, "alice", ("GPU-gpm", "GPU-old")))
    # the reading comes with one sample; the next ones carry none
    st.add_gpus("n1", [sample("GPU-gpm", T0, SPINNING), sample("GPU-old", T0)])
    st.add_gpus("n1", [sample("GPU-gpm", T0 + 1), sample("GPU-old", T0 + 1)])
    return st


def test_the_latest_reading_stands_for_three_windows_then_goes() -> None:
    st = state()
    gs = st.gpus["GPU-gpm"]
    assert current_activity(gs) == SPINNING
    assert current_activity(st.gpus["GPU-old"]) is None
    st.add_gpus("n1", [sample("GPU-gpm", T0 + 30)])
    assert current_activity(gs) == SPINNING  # three windows of 10 s: still current
    st.add_gpus("n1", [sample("GPU-gpm", T0 + 31)])
    assert current_activity(gs) is None  # GPM stopped coming: no activity rather than an old one
    st.add_gpus("n1", [sample("GPU-gpm", T0 + 40, SPINNING._replace(sm_active=70.0))])
    assert current_activity(gs).sm_active == 70.0


def scrape(st: ClusterState) -> tuple[str, bytes]:
    c = ClusterCollector(st, lambda: T0 + 2, False)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    return Exposition(c, threading.Lock()).scrape(False).decode(), generate_latest(registry)


def test_metrics_carry_ratios_and_throughputs_by_direction_and_nothing_for_a_gpu_without_gpm() -> None:
    text, theirs = scrape(state())
    assert same_exposition(text.encode(), theirs)  # the text writer and prometheus_client say the same
    got = {(s.name, s.labels["gpu"], s.labels.get("direction", "")): s.value
           for f in text_string_to_metric_families(text) for s in f.samples if "gpu" in s.labels}
    assert got[("clusterwatch_gpu_sm_activity_ratio", "GPU-gpm", "")] == 0.02
    assert got[("clusterwatch_gpu_sm_occupancy_ratio", "GPU-gpm", "")] == 0.01
    assert got[("clusterwatch_gpu_tensor_activity_ratio", "GPU-gpm", "")] == 0.0
    assert got[("clusterwatch_gpu_dram_activity_ratio", "GPU-gpm", "")] == 0.015
    assert got[("clusterwatch_gpu_pcie_bytes_per_second", "GPU-gpm", "tx")] == 4 * MiB
    assert got[("clusterwatch_gpu_pcie_bytes_per_second", "GPU-gpm", "rx")] == 8 * MiB
    activity = {k for k in got if "activity" in k[0] or "occupancy" in k[0] or "bytes_per_second" in k[0]}
    assert {gpu for _, gpu, _ in activity} == {"GPU-gpm"}
    assert not [k for k in activity if "nvlink" in k[0]]  # not offered: absent, not 0


def test_the_job_view_shows_the_activity_of_its_gpus() -> None:
    st = state()
    view = job_view(st, st.jobs["77"], T0 + 2)
    gpus = {g.uuid: g for g in view.gpus}
    assert gpus["GPU-gpm"].HasField("activity") and not gpus["GPU-old"].HasField("activity")
    a = gpus["GPU-gpm"].activity
    assert (a.sm_active, a.tensor_active, a.window_s) == (2.0, 0.0, 10.0)
    assert not a.HasField("nvlink_tx_bytes_per_s")


def test_an_absurd_reading_is_refused() -> None:
    def refusal(**figures: float):
        batch = agent_pb2.Batch(sent_at=T0)
        m = batch.gpus.add()
        m.CopyFrom(sample("GPU-gpm", T0, SPINNING._replace(**figures)))
        return check_batch(batch, ProcessColumns(batch.processes), T0)

    assert refusal() is None
    for figures in ({"sm_active": math.nan}, {"tensor_active": 101.0}, {"nvlink_rx_bytes_per_s": -1.0},
                    {"pcie_tx_bytes_per_s": math.inf}, {"window_s": -1.0}):
        got = refusal(**figures)
        assert got is not None and got.reason == "bad_value", figures
