"""A GPU's health reaches the jobs on its MIG slices: two real training processes of one job report steps to a
real agent over the real pynvml and the C stand-in, rank 0 on a MIG instance of a GPU in MIG mode, rank 1 on a
whole GPU; the driver's XID names the MIG GPU's bus address (the whole GPU, as health is read); both stop
advancing; a real collector's training_stall of rank 1 names the XID on rank 0's parent GPU, and status's
health section of the job shows it."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_stall_cause_e2e import RANK, _record, _stall_of_rank
from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.helpers import CLI, Collector, Proc, cli, wait_for

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3


def test_an_xid_on_a_mig_gpu_names_the_cause_of_a_stall_of_the_job_on_its_slice(stub_lib: Path,
                                                                                  tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    sock = tmp_path / "train.sock"
    stop = tmp_path / "stop"
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    write_state(state, "")
    ranks = [Proc([sys.executable, str(script), str(stop)], tmp_path / f"rank{r}.log",
                  env={**env, "CLUSTERWATCH_TRAIN_SOCKET": str(sock), "SLURM_JOB_ID": "703", "SLURM_PROCID": str(r),
                       "SLURM_LOCALID": str(r), "SLURM_STEP_ID": "0"}) for r in (0, 1)]
    write_state(state, (
        f"gpu GPU-migp total={40 * GiB} mig=1 pci=0000:3b:00 name=NVIDIA A100-SXM4-40GB\n"
        f"mig GPU-migp 0 MIG-slice0 total={20 * GiB} used={6 * GiB} name=NVIDIA A100-SXM4-40GB MIG 3g.20gb\n"
        f"mig GPU-migp 1 MIG-slice1 total={20 * GiB} used=0 name=NVIDIA A100-SXM4-40GB MIG 3g.20gb\n"
        f"gpu GPU-whole total={80 * GiB} used={20 * GiB} util=99 power=300000 pci=0000:3c:00 name=NVIDIA H100\n"
        f"proc MIG-slice0 {ranks[0].pid} {5 * GiB}\n"
        f"proc GPU-whole {ranks[1].pid} {8 * GiB}\n"
        f"sample GPU-whole {ranks[1].pid} 99 age_us=100000\n"))
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", "703", time.time(), gpu_indexes="0,1"))
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(_record(1, "Linux version 6.8.0"))
    rules = tmp_path / "rules.toml"
    rules.write_text("[training_stall]\nfor_s = 3\npending_after_s = 1\n")
    collector = Collector(tmp_path, "--rules", str(rules))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "mig-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance", "--spool-dir", str(spool),
                  "--train-socket", str(sock), "--kmsg", str(kmsg)],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": "mig-node"})
    try:
        def both_advance() -> bool:
            r = cli("status", "703", "--collector", collector.address, "--json")
            if r.returncode != 0:
                return False
            procs = json.loads(r.stdout)["processes"]
            return len(procs) == 2 and all((p.get("step") or 0) >= 30 and p.get("rank") is not None for p in procs)

        wait_for(both_advance, timeout=90, interval=0.5, what="both ranks reporting steps")
        # the MIG GPU faults: the driver names its bus address, the whole GPU's
        with kmsg.open("a") as f:
            f.write(_record(2, "NVRM: Xid (PCI:0000:3b:00): 48, pid=-1, An uncorrectable double bit error (DBE) "
                               "has been detected on GPU in the framebuffer at partition 0, subpartition 0."))
        wait_for(lambda: "gpu_xid" in cli("alerts", "--collector", collector.address).stdout, timeout=60,
                 what="gpu_xid of the MIG GPU")
        stop.write_text("")
        stall = wait_for(lambda: (a := _stall_of_rank(collector, 1)) and "likely cause" in a["description"] and a,
                         interval=0.5, timeout=90, what="rank 1's training_stall with its cause")
        desc = stall["description"]
        assert "likely cause: XID 48 on GPU 0 (GPU-migp) of rank 0 on mig-node" in desc, desc
        assert (stall["cause"], stall["cause_xid"], stall["cause_gpu"], stall["cause_rank"]) == (
            "gpu_health", 48, "GPU-migp", 0), stall
        view = json.loads(cli("status", "703", "--collector", collector.address, "--json").stdout)
        health = [(h["rule"], h["gpu"], h["rank"]) for h in view["health"]]
        assert health == [("gpu_xid", "GPU-migp", 0)], view["health"]
    finally:
        print(cli("alerts", "--collector", collector.address, "--json").stdout)
        print(cli("status", "703", "--collector", collector.address).stdout)
        agent_code = agent.stop()
        collector.stop()
        for p in ranks:
            p.stop()
    assert agent_code == 0, agent.text()
