"""GPU health end to end: a real agent over the real pynvml and the C stand-in, reading a kernel log
file, and a real collector. An XID 79 on a running job's GPU raises gpu_lost naming the job and
the rank; a kernel-log XID 13 read at start raises gpu_xid naming the process's job; status shows
a Health section."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, Collector, Proc, cli, firing_alert, kmsg_record, unique_job_id, wait_for

pytestmark = pytest.mark.e2e
JOB_XID = unique_job_id()
JOB_ECC = unique_job_id()

stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3


def test_xid_79_on_a_running_jobs_gpu_raises_gpu_lost_naming_job_and_rank(stub_lib: Path, tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    rank = subprocess.Popen(["sleep", "300"], env={**env, "SLURM_JOB_ID": JOB_XID, "SLURM_PROCID": "3",
                                                   "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
    other = subprocess.Popen(["sleep", "300"], env={**env, "SLURM_JOB_ID": JOB_XID, "SLURM_PROCID": "4",
                                                    "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"})
    gpus = (f"gpu GPU-e2e0 total={80 * GiB} used={20 * GiB} util=90 power=300000 pci=0000:3b:00 name=NVIDIA H100\n"
            f"gpu GPU-e2e1 total={80 * GiB} used={20 * GiB} util=90 power=300000 pci=0000:3c:00 name=NVIDIA H100\n"
            f"proc GPU-e2e0 {rank.pid} {8 * GiB}\n"
            f"proc GPU-e2e1 {other.pid} {8 * GiB}\n"
            f"sample GPU-e2e0 {rank.pid} 90 age_us=100000\n"
            f"sample GPU-e2e1 {other.pid} 90 age_us=100000\n")
    write_state(state, gpus)
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", JOB_XID, time.time(), gpu_indexes="0,1"))
    kmsg = tmp_path / "kmsg"
    # before the agent starts: an application XID on the other rank's GPU, naming its process
    kmsg.write_text(kmsg_record(1, "Linux version 6.8.0") +
                    kmsg_record(2, f"NVRM: Xid (PCI:0000:3c:00): 13, pid={other.pid}, name=sleep, "
                                   "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"))
    # idle_gpu fires after a second here, so that the other GPU going idle is an event that must come after
    # the lost GPU's own idle_gpu, were a lost GPU taken for an idle one
    rules = tmp_path / "rules.toml"
    rules.write_text("[idle_gpu]\nfor_s = 1\n")
    collector = Collector(tmp_path, "--web-listen", "127.0.0.1:0", "--rules", str(rules))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "xid-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance", "--spool-dir", str(spool),
                  "--train-socket", str(tmp_path / "train.sock"), "--kmsg", str(kmsg)],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": "xid-node"})
    try:
        xid13 = wait_for(lambda: firing_alert(collector, "gpu_xid"), timeout=60,
                         what="gpu_xid from the log read at start")
        assert xid13["job_id"] == JOB_XID and xid13["severity"] == "warning"
        assert xid13["pid"] == other.pid and xid13["rank"] == 4
        assert f"pid {other.pid}" in xid13["description"]
        # the GPU of rank 3 falls off the bus: the driver says so, and NVML answers GPU_IS_LOST
        with kmsg.open("a") as f:
            f.write(kmsg_record(3, "NVRM: GPU at PCI:0000:3b:00: GPU-e2e0"))
            f.write(kmsg_record(4, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))
        # ... and the other rank's GPU goes idle at the same poll
        write_state(state, gpus.replace("pci=0000:3b:00", "pci=0000:3b:00 lost=1")
                    .replace("util=90 power=300000 pci=0000:3c:00", "util=0 power=300000 pci=0000:3c:00"))
        lost = wait_for(lambda: firing_alert(collector, "gpu_lost"), timeout=60, what="gpu_lost firing")
        assert lost["job_id"] == JOB_XID and lost["rank"] == 3
        assert lost["gpu"] == "GPU-e2e0" and lost["node"] == "xid-node"
        assert lost["severity"] == "critical" and "fell off the bus (XID 79)" in lost["description"]
        idle = wait_for(lambda: firing_alert(collector, "idle_gpu"), timeout=60, what="idle_gpu on the idle GPU")
        assert idle["gpu"] == "GPU-e2e1", idle  # the lost GPU is not taken for an idle one
        listed = json.loads(cli("alerts", "--collector", collector.address, "--json").stdout)["alerts"]
        assert [a["gpu"] for a in listed if a["rule"] == "idle_gpu"] == ["GPU-e2e1"], listed  # pending ones too
        status = cli("status", JOB_XID, "--collector", collector.address)
        assert status.returncode == 0, status.stderr
        text = status.stdout
        assert "Health" in text and "fell off the bus" in text and "Drain the node" in text
        assert text.index("fell off the bus") < text.index("XID 13")     # worst first
        # the job's web page shows them too
        import urllib.request

        web = json.loads(collector.ports_file.read_text())["web"]
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/jobs/{JOB_XID}", timeout=10) as r:
            page = r.read().decode()
        assert 'data-health="gpu_lost"' in page and 'data-health="gpu_xid"' in page
    finally:
        # everything is stopped before anything is judged: a failed check must not leave the collector running
        agent_code = agent.stop()
        collector.stop()
        for p in (rank, other):
            p.kill()
            p.wait()
    assert agent_code == 0, agent.text()


def test_uncorrected_ecc_errors_raise_gpu_memory_errors(stub_lib: Path, tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    rank = subprocess.Popen(["sleep", "300"], env={**env, "SLURM_JOB_ID": JOB_ECC, "SLURM_PROCID": "0",
                                                   "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
    write_state(state, f"gpu GPU-ecc0 total={80 * GiB} used={20 * GiB} util=90 power=300000 name=NVIDIA H100\n"
                       f"proc GPU-ecc0 {rank.pid} {8 * GiB}\n"
                       f"sample GPU-ecc0 {rank.pid} 90 age_us=100000\n"
                       "ecc GPU-ecc0 uncorrected_volatile=2 uncorrected_aggregate=2\n")
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", JOB_ECC, time.time(), gpu_indexes="0"))
    collector = Collector(tmp_path)
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "ecc-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance", "--spool-dir", str(spool),
                  "--train-socket", str(tmp_path / "train.sock"), "--kmsg", "none"],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": "ecc-node"})
    try:
        found = wait_for(lambda: firing_alert(collector, "gpu_memory_errors"), timeout=60, what="gpu_memory_errors")
        assert found["job_id"] == JOB_ECC and found["rank"] == 0
        assert found["severity"] == "critical"
        assert "2 uncorrected ECC errors" in found["description"]
    finally:
        agent_code = agent.stop()
        collector.stop()
        rank.kill()
        rank.wait()
    assert agent_code == 0, agent.text()
    assert "kernel log" not in agent.text()     # --kmsg none: not read, nothing said
