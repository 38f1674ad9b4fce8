"""gpu_stall end to end on the NVML path: a real agent over the real pynvml and the C stand-in,
a real collector, the alert seen. No GPU is needed: the stand-in plays the driver library."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, Collector, Proc, cli, firing_alert, metric_value, unique_job_id, wait_for

pytestmark = pytest.mark.e2e
JOB_A = unique_job_id()
JOB_B = unique_job_id()
JOB_MIG = unique_job_id()

stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3
RULES = """
[gpu_stall]
for_s = 3
pending_after_s = 1
busy_percent = 20
"""


def test_gpu_stall_fires_through_the_real_bindings(stub_lib: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    state = tmp_path / "nvml-state.txt"
    worker = subprocess.Popen(["sleep", "300"])
    gpu = f"gpu GPU-e2e0 total={80 * GiB} used={20 * GiB} util=0 power=123000 name=NVIDIA H100 80GB HBM3\n"
    held = gpu + f"proc GPU-e2e0 {worker.pid} {8 * GiB}\n"
    # busy first: a fresh sample at every query (stamped 0.1 s before it)
    write_state(state, held + f"sample GPU-e2e0 {worker.pid} 90 age_us=100000\n")
    collector = Collector(tmp_path, "--rules", str(rules), "--history-step", "0")
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "gpu-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "nvml", "--pid", str(worker.pid), "--job-id", "stall-1",
                  "--no-provenance", "--spool-dir", str(tmp_path / "spool"),
                  "--train-socket", str(tmp_path / "train.sock")],
                 tmp_path / "agent.log", env=child_env(stub_lib, state))
    try:
        def busy_seen() -> bool:
            r = cli("status", "stall-1", "--collector", collector.address)
            # the process row: "... sleep  8.0 GiB  8.0 GiB ▁  90% ..."
            return r.returncode == 0 and any("sleep" in line and " 90%" in line for line in r.stdout.splitlines())
        wait_for(busy_seen, timeout=60, what="the worker's 90 % seen by the collector")
        time.sleep(2)
        # The worker stops using the GPU: NVML keeps listing it, with no utilisation sample.
        write_state(state, held)
        entry = wait_for(lambda: firing_alert(collector, "gpu_stall"), timeout=60, what="gpu_stall firing")
        assert entry["job_id"] == "stall-1"
        assert entry["pid"] == worker.pid and entry["node"] == "gpu-node"
        assert "idle (0 %)" in entry["description"]
    finally:
        # everything is stopped before anything is judged: a failed check must not leave the collector running
        agent_code = agent.stop()
        collector.stop()
        worker.kill()
        worker.wait()
    assert agent_code == 0, agent.text()
    assert "NVML library not found" not in agent.text()


def test_a_wedged_gpu_holds_up_neither_the_others_nor_the_stop(stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    worker = subprocess.Popen(["sleep", "300"])
    write_state(state, (
        f"gpu GPU-good total={80 * GiB} used={20 * GiB} util=40 power=200000 name=NVIDIA H100 80GB HBM3\n"
        f"gpu GPU-slow total={80 * GiB} used={GiB} util=0 power=70000 name=NVIDIA H100 80GB HBM3\n"
        f"proc GPU-good {worker.pid} {8 * GiB}\n"
        f"sample GPU-good {worker.pid} 77 age_us=100000\n"
        "delay * 3000 GPU-slow\n"))  # every call on that GPU takes 3 s
    collector = Collector(tmp_path)
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "wedge-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "nvml", "--pid", str(worker.pid), "--job-id", "wedge-1",
                  "--no-provenance", "--spool-dir", str(tmp_path / "spool"),
                  "--train-socket", str(tmp_path / "train.sock")],
                 tmp_path / "agent.log", env=child_env(stub_lib, state))
    try:
        started = time.monotonic()

        def good_gpu_seen() -> bool:
            r = cli("status", "wedge-1", "--collector", collector.address)
            return r.returncode == 0 and any("sleep" in line and " 77%" in line for line in r.stdout.splitlines())
        wait_for(good_gpu_seen, timeout=60, what="the healthy GPU's process seen")
        # Opening waited at most its deadline for the wedged GPU, not 3 s a call.
        assert time.monotonic() - started < 30
        time.sleep(2)
        stopping = time.monotonic()
        assert agent.stop(timeout=30) == 0, agent.text()
        assert time.monotonic() - stopping < 8, agent.text()  # one poll's deadline, flush, exit
        assert "GPU at NVML index 1 did not answer within 0.2 s" in agent.text()
    finally:
        agent.stop()
        collector.stop()
        worker.kill()
        worker.wait()


def test_two_jobs_on_two_mig_slices_of_one_gpu_are_two_jobs(stub_lib: Path, tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    clean = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    ranks = [subprocess.Popen(["sleep", "300"], env={**clean, "SLURM_JOB_ID": job, "SLURM_PROCID": "0",
                                                      "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
             for job in (JOB_A, JOB_B)]
    write_state(state, (
        f"gpu GPU-mig0 total={40 * GiB} mig=1 name=NVIDIA A100-SXM4-40GB\n"
        f"mig GPU-mig0 0 MIG-aaaa total={20 * GiB} used={6 * GiB} name=NVIDIA A100-SXM4-40GB MIG 3g.20gb\n"
        f"mig GPU-mig0 1 MIG-bbbb total={20 * GiB} used={3 * GiB} name=NVIDIA A100-SXM4-40GB MIG 3g.20gb\n"
        f"gpu GPU-cccc total={80 * GiB} used=0 util=0 name=NVIDIA H100 80GB HBM3\n"
        f"proc MIG-aaaa {ranks[0].pid} {5 * GiB}\n"
        f"proc MIG-bbbb {ranks[1].pid} {2 * GiB}\n"))
    spool = tmp_path / "spool"
    # What each job's prolog leaves: Slurm's device numbers of the slices (SLURM_JOB_GPUS).
    write_event(str(spool), JobEvent("start", JOB_A, time.time(), gpu_indexes="0"))
    write_event(str(spool), JobEvent("start", JOB_B, time.time(), gpu_indexes="1"))
    collector = Collector(tmp_path)
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "mig-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance", "--spool-dir", str(spool),
                  "--train-socket", str(tmp_path / "train.sock")],
                 tmp_path / "agent.log", env={**clean, "SLURMD_NODENAME": "mig-node"})
    try:
        def job_memory() -> dict[str, float] | None:
            from tests.support.helpers import metric_value

            text = collector.metrics()
            found = {job: metric_value(text, "clusterwatch_job_gpu_memory_used_bytes", job_id=job)
                     for job in (JOB_A, JOB_B)}
            return found if all(found.values()) else None
        found = wait_for(job_memory, timeout=60, what="both jobs' GPU memory in /metrics")
        assert found == {JOB_A: 5 * GiB, JOB_B: 2 * GiB}
        text = collector.metrics()
        from tests.support.helpers import metric_value

        assert metric_value(text, "clusterwatch_gpu_memory_used_bytes", gpu="MIG-aaaa", job_id=JOB_A) == 6 * GiB
        assert metric_value(text, "clusterwatch_gpu_memory_used_bytes", gpu="MIG-bbbb", job_id=JOB_B) == 3 * GiB
        for job, mem in ((JOB_A, "5.0 GiB"), (JOB_B, "2.0 GiB")):
            out = cli("status", job, "--collector", collector.address).stdout
            assert "GPUs: 1" in out, out
            assert any("sleep" in line and mem in line for line in out.splitlines()), out
    finally:
        agent.stop()
        collector.stop()
        for p in ranks:
            p.kill()
            p.wait()


def _alerts(collector: Collector, rule: str) -> list[dict]:
    r = cli("alerts", "--collector", collector.address, "--json")
    assert r.returncode == 0, r.stderr
    return [e for e in json.loads(r.stdout).get("alerts", []) if e["rule"] == rule]


def _batches(collector: Collector) -> float:
    return metric_value(collector.metrics(), "clusterwatch_ingest_batches_total") or 0.0


def test_a_lost_gpu_is_not_an_idle_gpu(stub_lib: Path, tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    rules = tmp_path / "rules.toml"
    rules.write_text("[idle_gpu]\nfor_s = 3\n")
    state = tmp_path / "nvml-state.txt"
    clean = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    rank = subprocess.Popen(["sleep", "300"], env={**clean, "SLURM_JOB_ID": JOB_MIG, "SLURM_PROCID": "0",
                                                    "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
    gpu = f"gpu GPU-lost0 total={80 * GiB} used={30 * GiB} util=85 power=400000{{lost}} name=NVIDIA H100 80GB HBM3\n"
    on_gpu = f"proc GPU-lost0 {rank.pid} {24 * GiB}\nsample GPU-lost0 {rank.pid} 85 age_us=100000\n"
    write_state(state, gpu.format(lost="") + on_gpu)
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", JOB_MIG, time.time(), gpu_indexes="0"))
    collector = Collector(tmp_path, "--rules", str(rules), "--history-step", "0")
    # the health reader tells the collector the GPU is lost: each second, not at the default 30 s
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "lost-node", "--interval", "0.5",
                  "--send-interval", "0", "--health-interval", "1", "--gpu-source", "nvml", "--no-provenance",
                  "--spool-dir", str(spool), "--train-socket", str(tmp_path / "train.sock")],
                 tmp_path / "agent.log", env={**clean, "SLURMD_NODENAME": "lost-node"})
    try:
        def busy() -> bool:
            out = cli("status", JOB_MIG, "--collector", collector.address).stdout
            return any("sleep" in line and " 85%" in line for line in out.splitlines())
        wait_for(busy, timeout=60, what="the job's process busy on its GPU")
        write_state(state, gpu.format(lost=" lost=1") + on_gpu)  # fallen off the bus
        # Not a fixed sleep: once the collector has the GPU as lost, it stores and runs its rules on 10 more
        # polls (5 s of them, past idle_gpu's 3 s), so an idle_gpu that is coming, pending or firing, is there.
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_gpu_lost", gpu="GPU-lost0") == 1,
                 timeout=60, what="the collector seeing the GPU lost")
        seen = _batches(collector)
        wait_for(lambda: _batches(collector) >= seen + 10, timeout=60, what="10 polls stored after the loss")
        assert _alerts(collector, "idle_gpu") == []
        assert "GPU-lost0 (index 0) does not answer" in agent.text()
        # The rule itself works here: back on the bus, the process gone from it, it fires.
        write_state(state, gpu.format(lost=""))
        wait_for(lambda: any(e["state"] == "firing" for e in _alerts(collector, "idle_gpu")),
                 timeout=60, what="idle_gpu once the GPU really has no process")
    finally:
        agent.stop()
        collector.stop()
        rank.kill()
        rank.wait()
