"""A stalled job whose one rank's GPU had an XID says so in its training_stall (issue 15, the cause of a stall):
two real training processes report steps through clusterwatch.train to a real agent over the real pynvml and
the C stand-in, which reads the driver's XID from a kernel log file; both stop advancing once rank 1's GPU
faults; a real collector's training_stall of rank 0 names that XID, the GPU and rank 1."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.helpers import CLI, Collector, Proc, cli, wait_for

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3

# steps until the stop file exists (its GPU faulted, or its peer's did: a collective never returns), then stuck
RANK = """
import os, sys, time
from clusterwatch import train
stop = sys.argv[1]
step = 0
while not os.path.exists(stop):
    step += 1
    train.report(step=step, loss=1.0 / step)
    time.sleep(0.2)
time.sleep(300)
"""


def _record(seq: int, message: str) -> str:
    return f"3,{seq},{int(time.monotonic() * 1e6)},-;{message}\n"


def _stall_of_rank(collector: Collector, rank: int) -> dict | None:
    r = cli("alerts", "--collector", collector.address, "--json")
    if r.returncode != 0:
        return None
    for entry in json.loads(r.stdout).get("alerts", []):
        if entry["rule"] == "training_stall" and entry["state"] == "firing" and entry["rank"] == rank:
            return entry
    return None


def test_a_stalled_jobs_training_stall_names_the_xid_on_one_ranks_gpu(stub_lib: Path, tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    sock = tmp_path / "train.sock"
    stop = tmp_path / "stop"
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    write_state(state, "")  # the agent's NVML finds no process until the ranks are in the stand-in's state
    ranks = [Proc([sys.executable, str(script), str(stop)], tmp_path / f"rank{r}.log",
                  env={**env, "CLUSTERWATCH_TRAIN_SOCKET": str(sock), "SLURM_JOB_ID": "701", "SLURM_PROCID": str(r),
                       "SLURM_LOCALID": str(r), "SLURM_STEP_ID": "0"}) for r in (0, 1)]
    gpus = "".join(f"gpu GPU-st{r} total={80 * GiB} used={20 * GiB} util=99 power=300000 pci=0000:{0x3b + r:02x}:00 "
                   f"name=NVIDIA H100\nproc GPU-st{r} {p.pid} {8 * GiB}\nsample GPU-st{r} {p.pid} 99 age_us=100000\n"
                   for r, p in enumerate(ranks))
    write_state(state, gpus)
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", "701", time.time(), gpu_indexes="0,1"))
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(_record(1, "Linux version 6.8.0"))
    rules = tmp_path / "rules.toml"
    rules.write_text("[training_stall]\nfor_s = 3\npending_after_s = 1\n")
    collector = Collector(tmp_path, "--rules", str(rules))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "st-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance", "--spool-dir", str(spool),
                  "--train-socket", str(sock), "--kmsg", str(kmsg)],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": "st-node"})
    try:
        def both_advance() -> bool:
            r = cli("status", "701", "--collector", collector.address, "--json")
            if r.returncode != 0:
                return False
            procs = json.loads(r.stdout)["processes"]
            return len(procs) == 2 and all((p.get("step") or 0) >= 60 and p.get("rank") is not None for p in procs)

        wait_for(both_advance, timeout=90, interval=0.5, what="both ranks reporting steps")
        # (the rules look at a process every 5 s: they have seen its step move)
        # rank 1's GPU faults (a double-bit ECC error): it stops, and rank 0 waits for it in the next collective
        with kmsg.open("a") as f:
            f.write(_record(2, "NVRM: Xid (PCI:0000:3c:00): 48, pid=-1, An uncorrectable double bit error (DBE) "
                               "has been detected on GPU in the framebuffer at partition 0, subpartition 0."))
        wait_for(lambda: "gpu_xid" in cli("alerts", "--collector", collector.address).stdout, timeout=60,
                 what="gpu_xid of rank 1's GPU")
        stop.write_text("")
        # the cause is worked out per job every few seconds and kept current: a first read may precede it
        stall = wait_for(lambda: (a := _stall_of_rank(collector, 0)) and "likely cause" in a["description"] and a,
                         interval=0.5, timeout=90, what="rank 0's training_stall with its cause")
        desc = stall["description"]
        assert "likely cause: XID 48 on GPU 1 (GPU-st1) of rank 1 on st-node" in desc, desc
        assert "Double bit ECC error" in desc, desc
        assert (stall["cause"], stall["cause_xid"], stall["cause_rank"], stall["cause_gpu"], stall["cause_node"]) == (
            "gpu_health", 48, 1, "GPU-st1", "st-node"), stall
        status = cli("status", "701", "--collector", collector.address)
        assert status.returncode == 0 and "likely cause: XID 48" in status.stdout, status.stdout
    finally:
        # what the collector held, shown when the test fails
        print(cli("alerts", "--collector", collector.address, "--json").stdout)
        print(cli("status", "701", "--collector", collector.address).stdout)
        agent_code = agent.stop()
        collector.stop()
        for p in ranks:
            p.stop()
    assert agent_code == 0, agent.text()
