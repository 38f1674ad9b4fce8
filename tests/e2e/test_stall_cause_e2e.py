"""A stalled job whose one rank's GPU had an XID says so in its training_stall (issue 15, the cause of a stall):
two real training processes report steps through clusterwatch.train to a real agent over the real pynvml and
the C stand-in, which reads the driver's XID from a kernel log file; both stop advancing once rank 1's GPU
faults; a real collector's training_stall of rank 0 names that XID, the GPU and rank 1."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import cli, wait_for
from tests.support.stalling_job import start_stalling_job

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3


def test_a_stalled_jobs_training_stall_names_the_xid_on_one_ranks_gpu(stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}

    def gpus(ranks) -> None:
        write_state(state, "".join(
            f"gpu GPU-st{r} total={80 * GiB} used={20 * GiB} util=99 power=300000 pci=0000:{0x3b + r:02x}:00 "
            f"name=NVIDIA H100\nproc GPU-st{r} {p.pid} {8 * GiB}\nsample GPU-st{r} {p.pid} 99 age_us=100000\n"
            for r, p in enumerate(ranks)))

    job = start_stalling_job(tmp_path, "st-node", env, ["--gpu-source", "nvml"], gpu_state=gpus, kmsg=True)
    try:
        job.both_advance(60)  # (the rules look at a process every 5 s: they have seen its step move)
        # rank 1's GPU faults (a double-bit ECC error): it stops, and rank 0 waits for it in the next collective
        job.kernel_says(2, "NVRM: Xid (PCI:0000:3c:00): 48, pid=-1, An uncorrectable double bit error (DBE) "
                           "has been detected on GPU in the framebuffer at partition 0, subpartition 0.")
        wait_for(lambda: "gpu_xid" in cli("alerts", "--collector", job.collector.address).stdout, timeout=60,
                 what="gpu_xid of rank 1's GPU")
        job.stall()
        stall = job.stall_with(0, "likely cause")
        desc = stall["description"]
        assert "likely cause: XID 48 on GPU 1 (GPU-st1) of rank 1 on st-node" in desc, desc
        assert "Double bit ECC error" in desc, desc
        assert (stall["cause"], stall["cause_xid"], stall["cause_rank"], stall["cause_gpu"], stall["cause_node"]) == (
            "gpu_health", 48, 1, "GPU-st1", "st-node"), stall
        status = job.status()
        assert status.returncode == 0 and "likely cause: XID 48" in status.stdout, status.stdout
    finally:
        agent_code = job.close()
    assert agent_code == 0, job.agent.text()
