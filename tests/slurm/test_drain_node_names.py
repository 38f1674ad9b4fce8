"""Node names are names: a drain names one real node, never a Slurm keyword or node set (issue 24).

On the real two-node Slurm (n1, n2): `scontrol update NodeName=ALL State=DRAIN` drains every node, and
`n[1-2]` or `n1,n2` both; a node name comes from an agent's Hello, which its sender writes. Asked directly
(ScontrolMapper.drain_node) and end to end (a real collector with --slurm and a drain step for gpu_lost,
real agents whose Hello names a hostile node, over the real pynvml and the C stand-in whose GPU falls off
the bus), no such name drains anything, and each refusal is said in one line with why.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from clusterwatch.collector.jobmap.scontrol import ScontrolMapper

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.services.slurm import SlurmCluster, slurm_cluster, slurm_hooks  # noqa: F401  (fixtures)
from tests.support.helpers import CLI, Collector, Proc, kmsg_record, wait_for

pytestmark = pytest.mark.slurm
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

HOSTILE = ("ALL", "all", "n[1-2]", "n1,n2", "-n1", "n1 State=RESUME", "nope")
RULES = """\
[[actions.steps]]
action = "drain"
rules = ["gpu_lost"]
"""


def _drained(cluster: SlurmCluster) -> dict[str, str]:
    return {n: s for n, s in cluster.node_states().items() if "drain" in s or "drng" in s}


def _resume_all(cluster: SlurmCluster) -> None:
    for node in cluster.nodes:
        cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)


def test_a_drain_names_one_node_slurm_knows(slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    cluster = slurm_cluster
    mapper = ScontrolMapper(env=cluster.env, retries=0)
    try:
        for node in HOSTILE:
            with pytest.raises(ValueError) as refused:
                asyncio.run(mapper.drain_node(node, "clusterwatch: hostile"))
            assert f"not draining {node!r}" in str(refused.value) and "\n" not in str(refused.value)
        assert _drained(cluster) == {}, cluster.node_states()
        asyncio.run(mapper.drain_node("n1", "clusterwatch: a real one"))
        assert set(_drained(cluster)) == {"n1"}, cluster.node_states()
    finally:
        _resume_all(cluster)


def test_agents_whose_hello_names_a_node_set_drain_nothing(slurm_cluster: SlurmCluster,  # noqa: F811
                                                           stub_lib: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    collector = Collector(tmp_path, "--slurm", "--slurm-refresh", "1", "--rules", str(rules))
    agents = []
    try:
        for i, node in enumerate(("ALL", "n[1-2]", "n1,n2")):
            folder = tmp_path / f"agent{i}"
            folder.mkdir()
            gpu = (f"gpu GPU-hostile{i} total=85899345920 used=0 util=0 power=90000 pci=0000:3b:00 "
                   "name=NVIDIA H100\n")
            state = folder / "nvml-state.txt"
            write_state(state, gpu)
            kmsg = folder / "kmsg"
            kmsg.write_text(kmsg_record(1, "Linux version 6.8.0"))
            agents.append((node, state, gpu, kmsg, Proc(
                [*CLI, "agent", "--collector", collector.address, "--node", node, "--gpu-source", "nvml",
                 "--interval", "0.5", "--send-interval", "0", "--no-provenance", "--spool-dir", str(folder / "spool"),
                 "--train-socket", str(folder / "train.sock"), "--kmsg", str(kmsg)],
                folder / "agent.log", env=child_env(stub_lib, state))))
        for i in range(len(agents)):
            wait_for(lambda i=i: f'gpu="GPU-hostile{i}"' in collector.metrics(), timeout=60,
                     what=f"agent {i}'s GPU reported")
        for _, state, gpu, kmsg, _ in agents:  # each GPU falls off the bus: gpu_lost, whose step drains
            with kmsg.open("a") as f:
                f.write(kmsg_record(2, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))
            write_state(state, gpu.replace("pci=0000:3b:00", "pci=0000:3b:00 lost=1"))

        def refusals() -> list[str]:
            return [x for x in collector.text().splitlines() if "drain" in x and "not draining" in x]

        wait_for(lambda: len(refusals()) >= 3, timeout=90, what="three drains refused")
        said = refusals()
        for node in ("ALL", "n[1-2]", "n1,n2"):
            assert sum(f"not draining {node!r}" in x for x in said) == 1, said
        assert _drained(cluster) == {}, cluster.node_states()
        assert "drained node" not in collector.text()
    finally:
        for *_, agent in agents:
            agent.stop()
        collector.stop()
        _resume_all(cluster)
