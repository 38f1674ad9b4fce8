"""The GPU health families of /metrics (collector/health/metrics.py): the basic set and the full one, copied
under the lock and written as prometheus_client would write the same families."""
from __future__ import annotations

import time

import pytest
from clusterwatch.collector.export import ClusterCollector, same_exposition
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.metrics import HealthFamilies, health_snapshot
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.v1 import agent_pb2
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from clusterwatch.model import GpuInfo

NOW = 1_800_000_000.0
FULL_ONLY = {"clusterwatch_gpu_remapped_rows", "clusterwatch_gpu_clock_event_seconds",
             "clusterwatch_gpu_pcie_replays", "clusterwatch_gpu_nvlink_errors"}


def _collector(full: bool) -> tuple[ClusterCollector, HealthEngine]:
    state = ClusterState()
    state.hello("n1", "boot", "0", 5.0, "nvml", 1 << 30, [GpuInfo("GPU-a", 3, "H100", 80 << 30)], NOW)
    engine = HealthEngine(load_catalog())
    msg = agent_pb2.GpuHealth(time=NOW, uuid="GPU-a", ecc_corrected_volatile=3, ecc_uncorrected_volatile=1,
                              ecc_corrected_aggregate=9, ecc_uncorrected_aggregate=1, remapped_rows_corrected=0,
                              remapped_rows_uncorrected=2, remapped_rows_pending=True, remapped_rows_failure=False,
                              clock_event_reasons=0x4 | 0x40, temperature_c=71, pcie_replays=5)
    msg.violation_seconds.update({"power": 2.5, "thermal": 1.0, "sync_boost": 4.0, "low_utilization": 9.0})
    msg.nvlink_errors.update({"crc_flit": 4})
    engine.observe_counters("n1", msg, [])
    engine.observe_event("n1", agent_pb2.HealthEvent(time=NOW, uuid="GPU-a", kind="xid", xid=48, source=1), [])
    extra = HealthFamilies(lambda: health_snapshot(engine, state), full=full)
    return ClusterCollector(state, time.time, extra=extra), engine


def _samples(text: bytes) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in text_string_to_metric_families(text.decode()):
        if f.name.startswith("clusterwatch_gpu") and f.samples:  # a family with no series has its headers only
            out[f.name] = f.samples
    return out


@pytest.mark.parametrize("full", [False, True])
def test_the_text_is_what_prometheus_client_writes_for_the_same_families(full: bool) -> None:
    c, _ = _collector(full)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    for _ in range(2):  # the second from the label strings kept
        assert same_exposition(c.render(c.snapshot()), generate_latest(registry))


def test_basic_leaves_out_the_full_sets_figures_and_keeps_what_health_needs() -> None:
    basic = _samples(_collector(False)[0].render(_collector(False)[0].snapshot()))
    full = _samples(_collector(True)[0].render(_collector(True)[0].snapshot()))
    assert FULL_ONLY <= set(full) and not FULL_ONLY & set(basic)
    assert {s.labels["error"] for s in basic["clusterwatch_gpu_ecc_errors"]} == {"uncorrected"}
    assert {s.labels["error"] for s in full["clusterwatch_gpu_ecc_errors"]} == {"corrected", "uncorrected"}
    reasons = {s.labels["reason"]: s.value for s in basic["clusterwatch_gpu_clock_event_reason_active"]}
    assert reasons == {"hw_slowdown": 0, "sw_thermal_slowdown": 0, "hw_thermal_slowdown": 1,
                       "hw_power_brake_slowdown": 0}
    assert "sw_power_cap" in {s.labels["reason"] for s in full["clusterwatch_gpu_clock_event_reason_active"]}
    # NVML's time at sync boost and low utilisation says nothing of health: never exported
    assert {s.labels["policy"] for s in full["clusterwatch_gpu_clock_event_seconds"]} == {"power", "thermal"}
    for name in ("clusterwatch_gpu_xid_errors", "clusterwatch_gpu_lost", "clusterwatch_gpu_temperature_celsius",
                 "clusterwatch_gpu_remapped_rows_pending"):
        assert basic[name] and all(s.labels["index"] == "3" and s.labels["node"] == "n1" for s in basic[name])


def test_the_snapshot_holds_no_view_into_the_engine_after_the_lock() -> None:
    c, engine = _collector(False)
    snap = c.snapshot()
    engine.xid_counts.clear()
    engine.gpus.clear()
    assert b'xid="48"' in c.render(snap) and b"clusterwatch_gpu_temperature_celsius" in c.render(snap)


def test_the_snapshot_names_each_gpus_figures() -> None:
    snap = _collector(False)[0].snapshot().extra
    assert [(g.node, g.uuid, g.index, g.lost) for g in snap.gpus] == [("n1", "GPU-a", "3", False)]
    assert snap.gpus[0].counters.temperature_c == 71
    assert [(x.index, x.xid, x.events) for x in snap.xids] == [("3", 48, 1)]
