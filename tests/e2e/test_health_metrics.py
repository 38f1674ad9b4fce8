"""GPU health on /metrics, end to end: a real agent over the real pynvml and the C stand-in for the driver,
reading a kernel-log file, and a real collector scraped over HTTP. Per GPU, never per process."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, Collector, Proc, kmsg_record, unique_job_id, wait_for

pytestmark = pytest.mark.e2e
JOB = unique_job_id()

stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3


def _samples(text: str) -> dict[str, list]:
    """The clusterwatch_gpu samples by sample name (a counter's with its _total)."""
    out: dict[str, list] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name.startswith("clusterwatch_gpu"):
                out.setdefault(s.name, []).append(s)
    return out


def _value(samples: dict, family: str, **labels: str) -> float | None:
    for s in samples.get(family, []):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def test_health_figures_of_each_gpu_are_on_metrics(stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    rank = subprocess.Popen(["sleep", "300"], env={**env, "SLURM_JOB_ID": JOB, "SLURM_PROCID": "0",
                                                   "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
    write_state(state,
                f"gpu GPU-hm0 total={80 * GiB} used={20 * GiB} util=90 power=300000 pci=0000:3b:00 temp=87 "
                "throttle=0x48 name=NVIDIA H100\n"
                f"gpu GPU-hm1 total={80 * GiB} used=0 util=0 power=60000 pci=0000:3c:00 events=0x800f "
                "name=NVIDIA H100\n"
                f"proc GPU-hm0 {rank.pid} {8 * GiB}\n"
                f"sample GPU-hm0 {rank.pid} 90 age_us=100000\n"
                "ecc GPU-hm0 corrected_volatile=5 uncorrected_volatile=2 uncorrected_aggregate=3\n"
                "remapped GPU-hm0 corrected=1 uncorrected=2 pending=1 failure=0\n"
                "health GPU-hm0 viol_thermal_ns=5000000000 replay=7 nvlinks=2 nvlink_crc_flit=4\n"
                "event GPU-hm1 0x8000 2\n")  # NVML asks for a node reboot
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_record(1, "Linux version 6.8.0") +
                    kmsg_record(2, f"NVRM: Xid (PCI:0000:3b:00): 13, pid={rank.pid}, name=sleep, Graphics Exception") +
                    kmsg_record(3, "NVRM: Xid (PCI:0000:3c:00): 48, An uncorrectable double bit error"))
    collector = Collector(tmp_path, "--gpu-health-metrics", "full")
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "hm-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock"),
                  "--kmsg", str(kmsg)],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": "hm-node"})
    try:
        def scraped():
            got = _samples(collector.metrics())
            ready = _value(got, "clusterwatch_gpu_temperature_celsius", gpu="GPU-hm0") is not None
            events = _value(got, "clusterwatch_gpu_events_total", kind="recovery_action")
            return got if ready and events and _value(got, "clusterwatch_gpu_xid_errors_total", xid="48") else None

        got = wait_for(scraped, timeout=60, what="health figures on /metrics")
        gpu0 = {"node": "hm-node", "gpu": "GPU-hm0", "index": "0"}
        assert _value(got, "clusterwatch_gpu_xid_errors_total", **gpu0, xid="13") == 1
        assert _value(got, "clusterwatch_gpu_xid_errors_total", gpu="GPU-hm1", index="1", xid="48") == 1
        assert _value(got, "clusterwatch_gpu_temperature_celsius", **gpu0) == 87
        assert _value(got, "clusterwatch_gpu_ecc_errors_total", **gpu0, error="uncorrected", scope="volatile") == 2
        assert _value(got, "clusterwatch_gpu_ecc_errors_total", **gpu0, error="corrected", scope="volatile") == 5
        assert _value(got, "clusterwatch_gpu_ecc_errors_total", **gpu0, error="uncorrected", scope="aggregate") == 3
        assert _value(got, "clusterwatch_gpu_remapped_rows", **gpu0, cause="uncorrectable") == 2
        assert _value(got, "clusterwatch_gpu_remapped_rows_pending", **gpu0) == 1
        assert _value(got, "clusterwatch_gpu_remapped_rows_failure", **gpu0) == 0
        # throttle=0x48: hardware slowdown and hardware thermal slowdown, nothing else
        active = {s.labels["reason"] for s in got["clusterwatch_gpu_clock_event_reason_active"]
                  if s.labels["gpu"] == "GPU-hm0" and s.value == 1}
        assert active == {"hw_slowdown", "hw_thermal_slowdown"}
        assert _value(got, "clusterwatch_gpu_clock_event_seconds_total", **gpu0, policy="thermal") == 5.0
        assert _value(got, "clusterwatch_gpu_pcie_replays_total", **gpu0) == 7
        assert _value(got, "clusterwatch_gpu_lost", **gpu0) == 0
        assert _value(got, "clusterwatch_gpu_events_total", gpu="GPU-hm1", kind="recovery_action") == 1
        assert _value(got, "clusterwatch_gpu_recovery_action", gpu="GPU-hm1", action="node_reboot") == 1
        health = [s for name, samples in got.items() for s in samples
                  if name not in ("clusterwatch_gpu_utilization_ratio", "clusterwatch_gpu_memory_used_bytes",
                                  "clusterwatch_gpu_memory_total_bytes", "clusterwatch_gpu_power_watts")]
        assert health and all(set(s.labels) <= {"node", "gpu", "index", "xid", "error", "scope", "cause", "reason",
                                                "policy", "counter", "kind", "action"} for s in health)
    finally:
        agent_code = agent.stop()
        collector.stop()
        rank.kill()
        rank.wait()
    assert agent_code == 0, agent.text()
