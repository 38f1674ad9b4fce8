"""A GPU's health reaches the jobs on its MIG slices: two real training processes of one job report steps to a
real agent over the real pynvml and the C stand-in, rank 0 on a MIG instance of a GPU in MIG mode, rank 1 on a
whole GPU; the driver's XID names the MIG GPU's bus address (the whole GPU, as health is read); both stop
advancing; a real collector's training_stall of rank 1 names the XID on rank 0's parent GPU, and status's
health section of the job shows it; the job recorded and replayed names the same cause."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import cli, wait_for
from tests.support.stalling_job import start_stalling_job

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3


def test_an_xid_on_a_mig_gpu_names_the_cause_of_a_stall_of_the_job_on_its_slice(stub_lib: Path,
                                                                                  tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}

    def gpus(ranks) -> None:
        write_state(state, (
            f"gpu GPU-migp total={40 * GiB} mig=1 pci=0000:3b:00 name=NVIDIA A100-SXM4-40GB\n"
            f"mig GPU-migp 0 MIG-slice0 total={20 * GiB} used={6 * GiB} name=NVIDIA A100-SXM4-40GB MIG 3g.20gb\n"
            f"mig GPU-migp 1 MIG-slice1 total={20 * GiB} used=0 name=NVIDIA A100-SXM4-40GB MIG 3g.20gb\n"
            f"gpu GPU-whole total={80 * GiB} used={20 * GiB} util=99 power=300000 pci=0000:3c:00 name=NVIDIA H100\n"
            f"proc MIG-slice0 {ranks[0].pid} {5 * GiB}\n"
            f"proc GPU-whole {ranks[1].pid} {8 * GiB}\n"
            f"sample GPU-whole {ranks[1].pid} 99 age_us=100000\n"))

    job = start_stalling_job(tmp_path, "mig-node", env, ["--gpu-source", "nvml"], gpu_state=gpus, kmsg=True)
    try:
        job.both_advance(30)
        # the MIG GPU faults: the driver names its bus address, the whole GPU's
        job.kernel_says(2, "NVRM: Xid (PCI:0000:3b:00): 48, pid=-1, An uncorrectable double bit error (DBE) "
                           "has been detected on GPU in the framebuffer at partition 0, subpartition 0.")
        wait_for(lambda: "gpu_xid" in cli("alerts", "--collector", job.collector.address).stdout, timeout=60,
                 what="gpu_xid of the MIG GPU")
        job.stall()
        stall = job.stall_with(1, "likely cause")
        desc = stall["description"]
        assert "likely cause: XID 48 on GPU 0 (GPU-migp) of rank 0 on mig-node" in desc, desc
        assert (stall["cause"], stall["cause_xid"], stall["cause_gpu"], stall["cause_rank"]) == (
            "gpu_health", 48, "GPU-migp", 0), stall
        view = json.loads(job.status("--json").stdout)
        health = [(h["rule"], h["gpu"], h["rank"]) for h in view["health"]]
        assert health == [("gpu_xid", "GPU-migp", 0)], view["health"]
        trace = tmp_path / "mig.jsonl"
        recorded = cli("record", job.job_id, "--collector", job.collector.address, "-o", str(trace))
        assert recorded.returncode == 0, recorded.stderr
    finally:
        agent_code = job.close()
    assert agent_code == 0, job.agent.text()
    # recorded and replayed: the trace names each instance's whole GPU, and the stall the same cause
    replayed = cli("replay", str(trace), "--format", "jsonl", "--rules", str(tmp_path / "rules.toml"))
    assert replayed.returncode == 0, replayed.stderr
    events = [json.loads(x) for x in replayed.stdout.splitlines()]
    assert {(e["rule"], e["gpu"], e["rank"]) for e in events if e["rule"] == "gpu_xid"} == {
        ("gpu_xid", "GPU-migp", 0)}, replayed.stdout
    stalls = [e for e in events if e["rule"] == "training_stall" and e["state"] == "firing" and e["rank"] == 1]
    assert stalls and (stalls[0]["cause"], stalls[0]["cause_xid"], stalls[0]["cause_gpu"], stalls[0]["cause_rank"]
                       ) == ("gpu_health", 48, "GPU-migp", 0), stalls
    assert "likely cause: XID 48 on GPU 0 (GPU-migp) of rank 0 on mig-node" in stalls[0]["description"], stalls[0]
