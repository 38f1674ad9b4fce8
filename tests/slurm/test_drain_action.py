"""The drain action on the real two-node Slurm: a GPU lost on a node drains it with clusterwatch's reason,
and a node the operator resumed is not drained again for the same alert, even by a restarted collector.

A real collector (--slurm, a rules file with a drain step for gpu_lost), a real agent over the real pynvml
and the C stand-in for the driver, whose GPU falls off the bus (XID 79 in its kernel log, GPU_IS_LOST).
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.services.slurm import SlurmCluster, slurm_cluster, slurm_hooks  # noqa: F401  (fixtures)
from tests.support.helpers import CLI, Collector, Proc, kmsg_record, metric_value, wait_for

pytestmark = pytest.mark.slurm
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

RULES = """\
[[actions.steps]]
action = "drain"
rules = ["gpu_lost"]
"""


def _node(cluster: SlurmCluster, node: str) -> dict[str, str]:
    out = cluster.run(["scontrol", "show", "node", node]).stdout
    fields = {}
    for token in out.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    reason = out.split("Reason=", 1)
    if len(reason) == 2:  # the reason holds spaces: the rest of its line
        fields["Reason"] = reason[1].splitlines()[0].strip()
    return fields


def test_a_lost_gpu_drains_its_node_once(slurm_cluster: SlurmCluster, stub_lib: Path, tmp_path: Path,  # noqa: F811
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = slurm_cluster
    node = cluster.nodes[0]
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    state = tmp_path / "nvml-state.txt"
    gpu = ("gpu GPU-drain0 total=85899345920 used=0 util=0 power=90000 pci=0000:3b:00 name=NVIDIA H100\n"
           "gpu GPU-drain1 total=85899345920 used=0 util=0 power=90000 pci=0000:3c:00 name=NVIDIA H100\n")
    write_state(state, gpu)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_record(1, "Linux version 6.8.0"))
    db = tmp_path / "cw.db"
    collector = Collector(tmp_path, "--slurm", "--slurm-refresh", "1", "--rules", str(rules), db=db)

    def start_agent() -> Proc:
        return Proc([*CLI, "agent", "--collector", collector.address, "--node", node, "--gpu-source", "nvml",
                     "--interval", "0.5", "--send-interval", "0", "--no-provenance",
                     "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock"),
                     "--kmsg", str(kmsg)],
                    tmp_path / "agent.log", env={**child_env(stub_lib, state), "SLURMD_NODENAME": node})

    agent = start_agent()
    try:
        assert "DRAIN" not in _node(cluster, node)["State"]
        wait_for(lambda: 'gpu="GPU-drain0"' in collector.metrics(), timeout=60, what="the agent's GPU reported")
        with kmsg.open("a") as f:
            f.write(kmsg_record(2, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))
        write_state(state, gpu.replace("pci=0000:3b:00", "pci=0000:3b:00 lost=1"))
        drained = wait_for(lambda: (f := _node(cluster, node)) and "DRAIN" in f["State"] and f,
                           timeout=60, what=f"{node} drained")
        assert drained["Reason"].startswith("clusterwatch: ") and "fell off the bus (XID 79)" in drained["Reason"]
        assert "drained node" in collector.text()
        # The operator resumes the node; the GPU is still lost, the alert still firing. Both restart: the new
        # agent reads the XID 79 from the kernel log again and the new collector, which has no memory of the
        # record, raises gpu_lost again; it is the same alert, stored with its drain done, so no second drain.
        cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        wait_for(lambda: "DRAIN" not in _node(cluster, node)["State"], timeout=30, what=f"{node} resumed")
        agent.stop()
        collector.stop()
        collector = Collector(tmp_path, "--slurm", "--slurm-refresh", "1", "--rules", str(rules), db=db)
        agent = start_agent()
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_health_records_repeated_total"),
                 timeout=60, what="the new collector dropping the XID 79 read again")
        time.sleep(2)  # the alert's actions run off the ingest thread
        assert "DRAIN" not in _node(cluster, node)["State"], collector.text()
        assert collector.text().count("drained node") == 1
    finally:
        agent.stop()
        collector.stop()
        if "DRAIN" in _node(cluster, node).get("State", ""):
            cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
