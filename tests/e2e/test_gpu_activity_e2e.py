"""The GPUs' true activity (NVML GPM) end to end: a real agent over the real pynvml and the C stand-in, a real
collector, /metrics scraped over HTTP and `clusterwatch status --json`. A Hopper GPU whose collective spins
reads 100 % utilisation and near-zero SM and tensor activity; a GPU without GPM has no activity series, and
the agent says so once."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, Collector, Proc, cli, unique_job_id, wait_for

pytestmark = pytest.mark.e2e
JOB = unique_job_id()

stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3
MiB = 1024**2
ACTIVITY = ("clusterwatch_gpu_sm_activity_ratio", "clusterwatch_gpu_sm_occupancy_ratio",
            "clusterwatch_gpu_tensor_activity_ratio", "clusterwatch_gpu_dram_activity_ratio",
            "clusterwatch_gpu_pcie_bytes_per_second", "clusterwatch_gpu_nvlink_bytes_per_second")


def _samples(text: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def _value(samples: list, name: str, **labels: str) -> float | None:
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def _agent(collector: Collector, node: str, spool: Path, tmp_path: Path, env: dict[str, str]) -> Proc:
    """A real agent over the real pynvml and the stand-in, polling every half second and sending each poll."""
    return Proc([*CLI, "agent", "--collector", collector.address, "--node", node, "--interval", "0.5",
                 "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance", "--spool-dir", str(spool),
                 "--train-socket", str(tmp_path / "train.sock"), "--kmsg", "none"],
                tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": node})


def test_gpm_activity_reaches_metrics_and_status_and_a_gpu_without_it_has_none(stub_lib: Path,
                                                                               tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    rank = subprocess.Popen(["sleep", "300"], env={**env, "SLURM_JOB_ID": JOB, "SLURM_PROCID": "0",
                                                   "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
    write_state(state,
                f"gpu GPU-act0 total={80 * GiB} used={20 * GiB} util=100 power=120000 name=NVIDIA H100 80GB HBM3\n"
                f"gpu GPU-act1 total={80 * GiB} used=0 util=0 power=60000 name=NVIDIA A100-SXM4-80GB\n"
                f"proc GPU-act0 {rank.pid} {8 * GiB}\n"
                f"sample GPU-act0 {rank.pid} 100 age_us=100000\n"
                # a collective spinning: busy by utilisation, idle by its SMs and tensor cores
                "gpm GPU-act0 sm=2 occupancy=1 tensor=0 dram=1 pcie_tx=4 pcie_rx=8 nvlink_tx=512 nvlink_rx=256\n")
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", JOB, time.time(), gpu_indexes="0,1"))
    collector = Collector(tmp_path)
    agent = _agent(collector, "act-node", spool, tmp_path, env)
    try:
        def scraped():
            got = _samples(collector.metrics())
            return got if _value(got, "clusterwatch_gpu_sm_activity_ratio", gpu="GPU-act0") is not None else None

        # the agent reads GPM every 10 s: the first reading comes with its second sample
        got = wait_for(scraped, timeout=90, what="GPM activity on /metrics")
        gpu0 = {"node": "act-node", "gpu": "GPU-act0", "index": "0", "job_id": JOB}
        assert _value(got, "clusterwatch_gpu_utilization_ratio", **gpu0) == 1.0
        assert _value(got, "clusterwatch_gpu_sm_activity_ratio", **gpu0) == pytest.approx(0.02)
        assert _value(got, "clusterwatch_gpu_sm_occupancy_ratio", **gpu0) == pytest.approx(0.01)
        assert _value(got, "clusterwatch_gpu_tensor_activity_ratio", **gpu0) == 0.0
        assert _value(got, "clusterwatch_gpu_dram_activity_ratio", **gpu0) == pytest.approx(0.01)
        assert _value(got, "clusterwatch_gpu_pcie_bytes_per_second", **gpu0, direction="tx") == 4 * MiB
        assert _value(got, "clusterwatch_gpu_pcie_bytes_per_second", **gpu0, direction="rx") == 8 * MiB
        assert _value(got, "clusterwatch_gpu_nvlink_bytes_per_second", **gpu0, direction="tx") == 512 * MiB
        assert _value(got, "clusterwatch_gpu_nvlink_bytes_per_second", **gpu0, direction="rx") == 256 * MiB
        # the GPU without GPM keeps its readings and has no activity series
        assert _value(got, "clusterwatch_gpu_utilization_ratio", gpu="GPU-act1") == 0.0
        assert not [s for s in got if s.name in ACTIVITY and s.labels["gpu"] == "GPU-act1"]

        status = cli("status", JOB, "--collector", collector.address, "--json")
        assert status.returncode == 0, status.stderr
        gpus = {g["uuid"]: g for g in json.loads(status.stdout)["gpus"]}
        act = gpus["GPU-act0"]["activity"]
        assert (act["sm_active"], act["tensor_active"], act["dram_active"]) == (2.0, 0.0, 1.0)
        assert act["nvlink_tx_bytes_per_s"] == 512 * MiB and act["window_s"] > 0
        assert gpus["GPU-act0"]["utilization"] == 100.0
        assert gpus["GPU-act1"]["activity"] is None
    finally:
        agent_code = agent.stop()
        collector.stop()
        rank.kill()
        rank.wait()
    assert agent_code == 0, agent.text()
    said = [line for line in agent.text().splitlines() if "GPM" in line]
    assert len(said) == 1 and "GPU-act1" in said[0] and "GPU-act0" not in said[0], said


def _alerts(collector: Collector, rule: str) -> list[dict]:
    r = cli("alerts", "--collector", collector.address, "--json")
    assert r.returncode == 0, r.stderr
    return [e for e in json.loads(r.stdout).get("alerts", []) if e["rule"] == rule]


def test_a_gpu_busy_by_utilisation_but_idle_by_its_sms_raises_idle_gpu(stub_lib: Path, tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    job = unique_job_id()
    rules = tmp_path / "rules.toml"
    rules.write_text("[idle_gpu]\nfor_s = 3\n")
    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    ranks = [subprocess.Popen(["sleep", "300"], env={**env, "SLURM_JOB_ID": job, "SLURM_PROCID": str(i),
                                                     "SLURM_LOCALID": str(i), "SLURM_STEP_ID": "0"})
             for i in range(2)]
    write_state(state,
                f"gpu GPU-spin0 total={80 * GiB} used={20 * GiB} util=100 power=300000 name=NVIDIA H100 80GB HBM3\n"
                f"gpu GPU-busy1 total={80 * GiB} used={20 * GiB} util=100 power=300000 name=NVIDIA A100-SXM4-80GB\n"
                f"proc GPU-spin0 {ranks[0].pid} {8 * GiB}\nsample GPU-spin0 {ranks[0].pid} 100 age_us=100000\n"
                f"proc GPU-busy1 {ranks[1].pid} {8 * GiB}\nsample GPU-busy1 {ranks[1].pid} 100 age_us=100000\n"
                # GPU 0 spins: 100 % by utilisation, 2 % by its SMs; GPU 1 has no GPM and reads 100 % too
                "gpm GPU-spin0 sm=2 occupancy=1 tensor=0 dram=1\n")
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", job, time.time(), gpu_indexes="0,1"))
    collector = Collector(tmp_path, "--rules", str(rules), "--history-step", "0")
    agent = _agent(collector, "spin-node", spool, tmp_path, env)
    try:
        def firing() -> list[dict]:
            return [e for e in _alerts(collector, "idle_gpu") if e["state"] == "firing"]

        # GPM's first reading comes with the GPU's second sample (10 s), then 3 s of it fire
        [alert] = wait_for(firing, timeout=90, what="idle_gpu on the GPU whose SMs idle")
        assert alert["gpu"] == "GPU-spin0" and alert["job_id"] == job, alert
        assert "is idle (2 % SM activity at 100 % utilisation)" in alert["description"], alert
        # the GPU without GPM, busy by its utilisation the whole while, is not idle (today's rule)
        assert [e["gpu"] for e in _alerts(collector, "idle_gpu")] == ["GPU-spin0"]
        # `status` shows SM activity beside utilisation: 2 % on the GPU that has it, "-" on the other
        status = cli("status", job, "--collector", collector.address, env={"COLUMNS": "80"})
        gpus = status.stdout.split("\nGPUs\n", 1)[1].split("\n\n", 1)[0]
        rows = [line.split() for line in gpus.splitlines() if line.startswith("  spin-node")]
        assert sorted(r[r.index("100%") + 1] for r in rows) == ["-", "2%"], status.stdout
    finally:
        agent.stop()
        collector.stop()
        for r in ranks:
            r.kill()
            r.wait()
