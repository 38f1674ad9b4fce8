"""`record` then `replay` of GPU health, for real: a real collector (with a site's XID catalog) and a real agent
over the real pynvml and the C stand-in for the driver, reading a kernel-log file; a running job whose rank 4's
process gets an XID 13 (read at the agent's start), whose rank 3's GPU counts uncorrected ECC errors and then
falls off the bus (XID 79). Once the collector raises gpu_xid, gpu_memory_errors and gpu_lost, the job is
recorded and the trace replayed with the same catalog: the same health alerts (rule, job, node, rank, process,
GPU, severity)."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, Collector, Proc, cli, kmsg_record, unique_job_id, wait_for

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3
HEALTH_RULES = ("gpu_xid", "gpu_lost", "gpu_memory_errors", "gpu_throttle")
JOB = unique_job_id()


def _key(a: dict) -> tuple:
    pid = a.get("pid")
    return (a["rule"], a.get("job_id") or "", a.get("node") or "", a.get("rank"), pid if pid and pid > 0 else None,
            a.get("gpu") or "", a.get("severity"))


def _live_health(collector: Collector) -> set[tuple]:
    r = cli("alerts", "--collector", collector.address, "--json")
    if r.returncode != 0:
        return set()
    return {_key(a) for a in json.loads(r.stdout).get("alerts", [])
            if a["rule"] in HEALTH_RULES and a["state"] == "firing"}


def test_recorded_gpu_health_replays_to_the_same_health_alerts(stub_lib: Path, tmp_path: Path) -> None:
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    ranks = {r: subprocess.Popen(["sleep", "300"], env={**env, "SLURM_JOB_ID": JOB, "SLURM_PROCID": str(r),
                                                        "SLURM_LOCALID": str(r - 3), "SLURM_STEP_ID": "0"})
             for r in (3, 4)}
    gpus = (f"gpu GPU-rh0 total={80 * GiB} used={20 * GiB} util=90 power=300000 pci=0000:3b:00 name=NVIDIA H100\n"
            f"gpu GPU-rh1 total={80 * GiB} used={20 * GiB} util=90 power=300000 pci=0000:3c:00 name=NVIDIA H100\n"
            f"proc GPU-rh0 {ranks[3].pid} {8 * GiB}\n"
            f"proc GPU-rh1 {ranks[4].pid} {8 * GiB}\n"
            f"sample GPU-rh0 {ranks[3].pid} 90 age_us=100000\n"
            f"sample GPU-rh1 {ranks[4].pid} 90 age_us=100000\n"
            "ecc GPU-rh0 uncorrected_volatile=2 uncorrected_aggregate=2\n")
    write_state(state, gpus)
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", JOB, time.time(), gpu_indexes="0,1"))
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_record(1, "Linux version 6.8.0") +
                    kmsg_record(2, f"NVRM: Xid (PCI:0000:3c:00): 13, pid={ranks[4].pid}, name=sleep, "
                               "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"))
    # the site's catalog: XID 13 is critical here; replay must take the same file to say so
    site = tmp_path / "xids.toml"
    site.write_text('[xid.13]\nseverity = "critical"\n')
    collector = Collector(tmp_path, "--xid-catalog", str(site))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "rh-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance", "--spool-dir", str(spool),
                  "--train-socket", str(tmp_path / "train.sock"), "--kmsg", str(kmsg)],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": "rh-node"})
    trace = tmp_path / "health.jsonl"
    try:
        wait_for(lambda: {k[0] for k in _live_health(collector)} >= {"gpu_xid", "gpu_memory_errors"}, timeout=60,
                 what="gpu_xid and gpu_memory_errors firing")
        with kmsg.open("a") as f:   # rank 3's GPU falls off the bus while the job runs
            f.write(kmsg_record(3, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))
        live = wait_for(lambda: (got := _live_health(collector)) and "gpu_lost" in {k[0] for k in got} and got,
                        timeout=60, what="gpu_lost firing")
        recorded = cli("record", JOB, "--collector", collector.address, "-o", str(trace))
        assert recorded.returncode == 0, recorded.stderr
    finally:
        agent_code = agent.stop()
        collector.stop()
        for p in ranks.values():
            p.kill()
            p.wait()
    assert agent_code == 0, agent.text()
    assert live == {
        ("gpu_xid", JOB, "rh-node", 4, ranks[4].pid, "GPU-rh1", "critical"),
        ("gpu_memory_errors", JOB, "rh-node", 3, None, "GPU-rh0", "critical"),
        ("gpu_lost", JOB, "rh-node", 3, None, "GPU-rh0", "critical"),
    }, live

    replayed = cli("replay", str(trace), "--format", "jsonl", "--xid-catalog", str(site))
    assert replayed.returncode == 0, replayed.stderr
    events = [json.loads(x) for x in replayed.stdout.splitlines()]
    assert {_key(e) for e in events if e["rule"] in HEALTH_RULES and e["state"] == "firing"} == live, replayed.stdout
    # without the site's catalog, the XID 13 is the shipped one's warning
    shipped = cli("replay", str(trace), "--format", "jsonl")
    assert {(e["rule"], e["severity"]) for e in map(json.loads, shipped.stdout.splitlines())
            if e["rule"] == "gpu_xid"} == {("gpu_xid", "warning")}
    kinds = [json.loads(x).get("kind") for x in trace.read_text().splitlines()]
    assert kinds.count("health_event") == 2 and "gpu_health" in kinds
