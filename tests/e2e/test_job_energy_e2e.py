"""A job's energy end to end: a real agent over the real pynvml and the C stand-in, a real collector, the job
started and ended by the hooks' spool events. The GPU's energy counter moves while the job holds it, goes back
once (a driver reload) and moves after the job ends; the job's energy in `status --json`, in its stored
summary and on /metrics is the counter's difference over the readings it held the GPU for, the reload said as
a reset and not counted, and nothing after its end."""
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


def _state(pid: int, energy_mj: int) -> str:
    return (f"gpu GPU-nrg0 total={80 * GiB} used={20 * GiB} util=90 power=650000 energy={energy_mj} "
            f"name=NVIDIA H100 80GB HBM3\n"
            f"proc GPU-nrg0 {pid} {8 * GiB}\n"
            f"sample GPU-nrg0 {pid} 90 age_us=100000\n")


def _gpu(collector: Collector) -> dict | None:
    out = cli("status", JOB, "--collector", collector.address, "--json")
    if out.returncode != 0:
        return None
    gpus = json.loads(out.stdout)["gpus"]
    return gpus[0] if gpus and gpus[0]["cost"] else None


def test_a_jobs_energy_is_the_counters_difference_through_a_real_agent_and_collector(stub_lib: Path,
                                                                                      tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    rank = subprocess.Popen(["sleep", "300"], env={**env, "SLURM_JOB_ID": JOB, "SLURM_PROCID": "0",
                                                   "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
    write_state(state, _state(rank.pid, 1_000_000))
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", JOB, time.time(), gpu_indexes="0"))
    summaries = tmp_path / "summaries"
    summaries.mkdir()
    collector = Collector(tmp_path, "--summary-dir", str(summaries))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "nrg-node", "--interval", "0.2",
                  "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance", "--spool-dir", str(spool),
                  "--train-socket", str(tmp_path / "train.sock"), "--kmsg", "none"],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": "nrg-node"})

    def energy_is(joules: float):
        def check():
            g = _gpu(collector)
            return g if g is not None and g["cost"]["energy_joules"] == pytest.approx(joules) else None
        return check

    try:
        # the job holds the GPU from its first reading at 1,000,000 mJ: the counter's moves are its energy
        wait_for(lambda: _gpu(collector), timeout=60, what="the job's GPU cost in status")
        write_state(state, _state(rank.pid, 1_600_000))
        wait_for(energy_is(600.0), timeout=30, what="600 J")
        write_state(state, _state(rank.pid, 2_250_000))
        wait_for(energy_is(1250.0), timeout=30, what="1250 J")
        # a driver reload: the counter starts again; the interval across it is unknown, not counted
        write_state(state, _state(rank.pid, 500))
        wait_for(lambda: (g := _gpu(collector)) and g["cost"]["energy_resets"] == 1, timeout=30, what="a reset")
        write_state(state, _state(rank.pid, 100_500))
        g = wait_for(energy_is(1350.0), timeout=30, what="1350 J")
        assert g["cost"]["shared"] is False and g["cost"]["utilization_seconds"][4] > 0  # 90 %: the top level
        scraped = {s.name: s.value for f in text_string_to_metric_families(collector.metrics()) for s in f.samples
                   if s.labels.get("job_id") == JOB}
        assert scraped["clusterwatch_job_gpu_energy_joules_total"] == pytest.approx(1350.0)
        # the job ends; what the GPU uses after is nobody's
        write_event(str(spool), JobEvent("end", JOB, time.time(), exit_code=0))
        summary = summaries / f"clusterwatch-{JOB}.json"
        wait_for(summary.exists, timeout=30, what="the job's summary")
        write_state(state, _state(rank.pid, 9_000_000))
        time.sleep(1.0)  # five polls after the end
        doc = json.loads(summary.read_text())
        assert doc["gpu_cost"]["energy_joules"] == pytest.approx(1350.0)
        assert doc["gpu_cost"]["energy_resets"] == 1
        (gpu,) = doc["hardware"]["gpus"]
        assert gpu["cost"]["energy_joules"] == pytest.approx(1350.0)
        stored = _gpu(collector)  # the stored view, after the counter moved on
        assert stored["cost"]["energy_joules"] == pytest.approx(1350.0)
    finally:
        agent_code = agent.stop()
        collector.stop()
        rank.kill()
        rank.wait()
    assert agent_code == 0, agent.text()
