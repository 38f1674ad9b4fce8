"""A job's GPU cost as users read it: in the job view (status --json), the stored summary and status's Cost
section, each figure said with how it was measured (collector/state/job_cost.py takes them)."""
from __future__ import annotations

from clusterwatch.collector.queries.views import job_view
from clusterwatch.collector.state.summary import summary_of
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuActivity, GpuInfo, JobEvent
from tests.collector.test_job_cost import T0, GiB, cluster, gpu, procs


def test_the_view_and_the_summary_carry_energy_resets_mig_and_activity_hours() -> None:
    st = cluster(GpuInfo("GPU-a", 0, "H100", 80 * GiB), GpuInfo("MIG-1", 1, "H100 MIG", 40 * GiB, "GPU-p"))
    st.job_event("n1", JobEvent("start", "7", T0, 1000, "alice", ("GPU-a", "MIG-1")))
    st.add_gpus("n1", [gpu("GPU-a", T0, 1_000_000, activity=GpuActivity(10.0, sm_active=2.0)),
                       agent_pb2.GpuSample(time=T0, uuid="MIG-1")])
    for i, mj in enumerate([1_400_000, 300, 50_300], start=1):  # the driver reloads after the first
        st.add_gpus("n1", [gpu("GPU-a", T0 + i, mj), agent_pb2.GpuSample(time=T0 + i, uuid="MIG-1")])
    view = job_view(st, st.jobs["7"], T0 + 4)
    gpus = {g.uuid: g for g in view.gpus}
    a, mig = gpus["GPU-a"].cost, gpus["MIG-1"].cost
    assert a.energy_joules == 450.0 and a.energy_resets == 1 and not a.shared
    assert list(a.sm_active_seconds) == [3.0, 0.0, 0.0, 0.0, 0.0]
    assert not mig.HasField("energy_joules")
    doc = summary_of(view)
    assert doc["gpu_cost"]["energy_joules"] == 450.0 and doc["gpu_cost"]["energy_resets"] == 1
    assert doc["gpu_cost"]["gpu_hours_by_activity"]["sm_active"]["0-5"] == round(3 / 3600, 4)
    by_uuid = {g["uuid"]: g for g in doc["hardware"]["gpus"]}
    assert by_uuid["MIG-1"]["cost"]["energy_joules"] is None and by_uuid["GPU-a"]["cost"]["energy_joules"] == 450.0


def test_status_says_the_cost_and_how_each_figure_was_measured() -> None:
    from clusterwatch.report import render

    st = cluster(GpuInfo("GPU-a", 0, "H100", 80 * GiB), GpuInfo("MIG-1", 1, "H100 MIG", 40 * GiB, "GPU-p"))
    st.job_event("n1", JobEvent("start", "7", T0, 1000, "alice", ("GPU-a", "MIG-1")))
    procs(st, T0, ("GPU-a", 11, "7"), ("GPU-a", 12, "8"))  # job 8's process on job 7's GPU
    st.add_gpus("n1", [gpu("GPU-a", T0, 0), agent_pb2.GpuSample(time=T0, uuid="MIG-1")])
    st.add_gpus("n1", [gpu("GPU-a", T0 + 3600, 2_000_000_000), agent_pb2.GpuSample(time=T0 + 3600, uuid="MIG-1")])
    text = render(job_view(st, st.jobs["7"], T0 + 3600), now=T0 + 3600, width=None)
    section = text.split("\nCost\n", 1)[1]
    energy = next(x for x in section.splitlines() if "GPU energy" in x)
    assert "0.56 kWh" in energy and "another job also used" in energy and "1 GPU(s) without an energy counter" in energy
    assert "Throttled       none" in section
    assert "By utilisation  0.02 GPU-h: 75-100% 0.02 h" in section  # 60 s: the gap bound, not the hour
