"""A GPU's loss is said once, also when a counters reading from just before it comes in the same batch."""
from __future__ import annotations

from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.v1 import agent_pb2


def test_a_reading_from_before_the_loss_does_not_clear_it() -> None:
    engine = HealthEngine(load_catalog())
    xid79 = agent_pb2.HealthEvent(time=20.0, uuid="GPU-l", kind="xid", xid=79, data=79,
                                  source=agent_pb2.HealthEvent.NVML)
    # one batch: its events are taken before its counters, so the reading of 19.5 comes after XID 79
    assert [a.rule for a in engine.observe_event("n1", xid79, [])] == ["gpu_lost"]
    engine.observe_counters("n1", agent_pb2.GpuHealth(time=19.5, uuid="GPU-l", temperature_c=40), [])
    failed_reads = agent_pb2.HealthEvent(time=25.0, uuid="GPU-l", kind="gpu_lost", source=agent_pb2.HealthEvent.NVML)
    assert engine.observe_event("n1", failed_reads, []) == []
    assert [f.rule for _, f in engine.findings([("n1", "GPU-l")])] == ["gpu_lost"]
    # a reading after the loss: it answers again, and a new loss is said
    engine.observe_counters("n1", agent_pb2.GpuHealth(time=30.0, uuid="GPU-l", temperature_c=40), [])
    again = agent_pb2.HealthEvent(time=40.0, uuid="GPU-l", kind="gpu_lost", source=agent_pb2.HealthEvent.NVML)
    assert [a.rule for a in engine.observe_event("n1", again, [])] == ["gpu_lost"]
