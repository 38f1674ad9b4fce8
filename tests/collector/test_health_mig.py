"""MIG: a GPU's health is read on the whole GPU, and reaches the jobs on its instances. The inventory names an
instance's parent (GpuInfo.parent_uuid, on the wire too); the collector maps an instance to its GPU: the job's
health (status, the job page), its stall's cause, and the GPU's users (the ranks on its instances)."""
from __future__ import annotations

from clusterwatch.collector.alerting.stall_causes import HealthCauses
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.live import HealthListener, gpu_users
from clusterwatch.collector.health.mig import gpu_index, slices_of, with_parents
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuInfo, GpuUse, ProcessSample
from clusterwatch.wire import ProcessColumns, gpu_info_from_proto, gpu_info_to_proto, processes_to_table

GiB = 1024**3
INVENTORY = [GpuInfo("MIG-a", 0, "A100 MIG 3g.20gb", 20 * GiB, "GPU-p"),
             GpuInfo("MIG-b", 0, "A100 MIG 3g.20gb", 20 * GiB, "GPU-p"),
             GpuInfo("GPU-w", 1, "H100", 80 * GiB)]


def test_the_parent_of_a_mig_instance_crosses_the_wire() -> None:
    for g in INVENTORY:
        m = agent_pb2.GpuInfo()
        gpu_info_to_proto(g, m)
        assert gpu_info_from_proto(agent_pb2.GpuInfo.FromString(m.SerializeToString())) == g


def _state() -> ClusterState:
    st = ClusterState()
    st.hello("n1", "boot", "0", 1.0, "nvml", 0, INVENTORY, 100.0)
    t = agent_pb2.ProcessTable()
    processes_to_table([ProcessSample(100.0, "n1", 10, 1.0, job_id="7", rank=0, gpus=(GpuUse("MIG-a", GiB),)),
                        ProcessSample(100.0, "n1", 11, 1.0, job_id="8", rank=0, gpus=(GpuUse("MIG-b", GiB),)),
                        ProcessSample(100.0, "n1", 12, 1.0, job_id="7", rank=1, gpus=(GpuUse("GPU-w", GiB),))], t)
    st.add_processes("n1", ProcessColumns(t), 100.0)
    return st


def test_an_instance_maps_to_its_gpu_and_a_gpu_to_its_instances() -> None:
    st = _state()
    assert with_parents(st, {("n1", "MIG-a"), ("n1", "GPU-w")}) == {("n1", "MIG-a"), ("n1", "GPU-p"), ("n1", "GPU-w")}
    assert slices_of(st, "n1", "GPU-p") == {"MIG-a", "MIG-b"} and slices_of(st, "n1", "GPU-w") == frozenset()
    assert slices_of(st, "n2", "GPU-p") == frozenset()
    # the whole GPU is not in the inventory (its instances are): shown with theirs, which is its own
    assert (gpu_index(st, "n1", "GPU-p"), gpu_index(st, "n1", "GPU-w"), gpu_index(st, "n1", "GPU-x")) == (0, 1, None)
    # the users of the whole GPU: the ranks on its instances, of both jobs
    assert [(u.job_id, u.rank, u.pid) for u in gpu_users(st, "n1", "GPU-p")] == [("7", 0, 10), ("8", 0, 11)]


def test_an_xid_on_the_whole_gpu_is_the_health_and_the_stall_cause_of_the_jobs_on_its_instances() -> None:
    st = _state()
    engine = HealthEngine(load_catalog())
    listener = HealthListener(engine, st, lambda events, now: None)
    batch = agent_pb2.Batch()
    batch.health_events.add(time=150.0, uuid="GPU-p", kind="xid", xid=48, data=48)
    listener.on_health("n1", batch, 150.0)
    for job, rank in (("7", 0), ("8", 0)):
        [h] = listener.job_health(st.jobs[job])
        assert (h.rule, h.gpu, h.rank) == ("gpu_xid", "GPU-p", rank), h
    [cause] = HealthCauses(st, lambda: engine)("8", 0.0, 200.0)
    assert cause.text.startswith("XID 48 on GPU 0 (GPU-p) of rank 0 on n1"), cause.text
    assert (cause.figures["cause_gpu"], cause.figures["cause_xid"]) == ("GPU-p", 48)
