"""A degraded link, end to end: a real agent over the real pynvml and the C stand-in for the driver reads a GPU's
PCIe replay and NVLink error counters every second (--health-interval); a rank of a job runs on the GPU; once the
counters climb past DCGM's limits, a real collector raises gpu_link_errors naming the job and rank, and `status`
shows it in the job's Health section. A GPU whose counters stand still raises nothing."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, Collector, Proc, cli, firing_alert, metric_value, unique_job_id, wait_for

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3
JOB = unique_job_id()


def _state(rank_pid: int, replays: int, recovery: int) -> str:
    return (f"gpu GPU-ln0 total={80 * GiB} used={20 * GiB} util=90 power=300000 pci=0000:3b:00 name=NVIDIA H100\n"
            f"gpu GPU-ln1 total={80 * GiB} used=0 util=0 power=60000 pci=0000:3c:00 name=NVIDIA H100\n"
            f"proc GPU-ln0 {rank_pid} {8 * GiB}\n"
            f"sample GPU-ln0 {rank_pid} 90 age_us=100000\n"
            f"health GPU-ln0 replay={replays} nvlinks=2 nvlink_recovery={recovery}\n"
            "health GPU-ln1 replay=3 nvlinks=2 nvlink_recovery=1\n")


def _batches(collector: Collector) -> float:
    return metric_value(collector.metrics(), "clusterwatch_ingest_batches_total") or 0.0


def _link_alerts(collector: Collector) -> list[dict]:
    """gpu_link_errors alerts in any state (firing_alert reads a failed `alerts` call as "none")."""
    r = cli("alerts", "--collector", collector.address, "--json")
    assert r.returncode == 0, r.stderr
    return [e for e in json.loads(r.stdout).get("alerts", []) if e["rule"] == "gpu_link_errors"]


def test_a_degraded_link_raises_gpu_link_errors_naming_the_rank(stub_lib: Path, tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    rank = subprocess.Popen(["sleep", "300"], env={**env, "SLURM_JOB_ID": JOB, "SLURM_PROCID": "2",
                                                   "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
    write_state(state, _state(rank.pid, 10, 0))
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", JOB, time.time(), gpu_indexes="0,1"))
    collector = Collector(tmp_path, "--gpu-health-metrics", "full")  # the link counters on /metrics
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "ln-node", "--interval", "0.5",
                  "--send-interval", "0", "--health-interval", "1", "--gpu-source", "nvml", "--no-provenance",
                  "--spool-dir", str(spool), "--train-socket", str(tmp_path / "train.sock"), "--kmsg", "none"],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": "ln-node"})
    try:
        wait_for(lambda: "ln-node" in cli("status", JOB, "--collector", collector.address).stdout, timeout=60,
                 what="the job's rank seen")
        # Not a fixed sleep: once the collector has the counters, it stores 6 more polls (3 s, three more health
        # readings a second apart) with them standing still; a gpu_link_errors from those would be there now.
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_gpu_pcie_replays_total", gpu="GPU-ln0") == 10,
                 timeout=60, what="the GPU's link counters on /metrics")
        seen = _batches(collector)
        wait_for(lambda: _batches(collector) >= seen + 6, timeout=60, what="6 polls stored after the first reading")
        assert _link_alerts(collector) == []
        write_state(state, _state(rank.pid, 10, 5))   # the NVLinks retrain: 5 recovery errors on each of 2 links
        found = wait_for(lambda: firing_alert(collector, "gpu_link_errors"), timeout=60, what="gpu_link_errors")
        assert (found["job_id"], found["rank"], found["gpu"], found["severity"]) == (JOB, 2, "GPU-ln0", "warning")
        assert "10 NVLink replay and recovery errors" in found["description"], found   # summed over the links
        view = json.loads(cli("status", JOB, "--collector", collector.address, "--json").stdout)
        assert [(h["rule"], h["gpu"], h["rank"]) for h in view["health"]] == [("gpu_link_errors", "GPU-ln0", 2)]
        alerts = json.loads(cli("alerts", "--collector", collector.address, "--json").stdout)["alerts"]
        assert [a["gpu"] for a in alerts if a["rule"] == "gpu_link_errors"] == ["GPU-ln0"]
    finally:
        agent_code = agent.stop()
        collector.stop()
        rank.kill()
        rank.wait()
    assert agent_code == 0, agent.text()
