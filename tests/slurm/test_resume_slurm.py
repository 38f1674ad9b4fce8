"""--resume on the real two-node Slurm: a node clusterwatch drained comes back by itself once its finding has
cleared; a node a person drained (their own reason over clusterwatch's) is never resumed; without the flag
nothing is.

A real collector (--slurm, a rules file with a drain step for gpu_lost, the breaker opened to both nodes), a
real agent on each node over the real pynvml and the C stand-in for the driver: each node's GPU falls off the
bus (XID 79 in the kernel log, GPU_IS_LOST), clusterwatch drains both, then the GPUs answer again (the repair).
What Slurm shows is read with `scontrol show node`; what clusterwatch did, from its audit trail in its store.
"""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import fixtures
from tests.services.slurm import SlurmCluster, slurm_cluster, slurm_hooks  # noqa: F401  (fixtures)
from tests.support.helpers import Collector, metric_value, wait_for
from tests.support.slurm_agents import NodeAgent, start_node_agent, wait_gpus_reported

pytestmark = pytest.mark.slurm
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

RULES = """\
[[actions.steps]]
action = "drain"
rules = ["gpu_lost"]
"""
PERSON = "ops: GPU swap booked"


def _show(cluster: SlurmCluster, node: str) -> str:
    return cluster.run(["scontrol", "-o", "show", "node", node]).stdout


def _drained(cluster: SlurmCluster, node: str) -> bool:
    state = _show(cluster, node).split(" State=", 1)[1].split(" ", 1)[0]
    return "DRAIN" in state.split("+")


def _audit(db: Path) -> list[tuple[str, str, str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return list(conn.execute("SELECT action, node, outcome, detail FROM action_audit ORDER BY id"))
    finally:
        conn.close()


def _lose_and_repair(cluster: SlurmCluster, stub_lib: Path, tmp_path: Path, *collector_flags: str,
                     between=None) -> tuple[Collector, list[NodeAgent]]:
    """Start a collector and both agents; every GPU falls off the bus; both nodes drained by clusterwatch;
    `between(cluster)` runs; then the GPUs answer again. Returns the collector and the agents (the caller
    stops them)."""
    (tmp_path / "rules.toml").write_text(RULES)
    collector = Collector(tmp_path, "--slurm", "--slurm-refresh", "1", "--rules", str(tmp_path / "rules.toml"),
                          "--drain-max-nodes", "2", "--drain-max-share", "1", *collector_flags)
    agents = [start_node_agent(node, stub_lib, tmp_path / node, collector.address, "--health-interval", "1")
              for node in cluster.nodes]
    wait_gpus_reported(collector, agents)
    for agent in agents:
        agent.lose_gpu()
    for node in cluster.nodes:
        wait_for(lambda node=node: _drained(cluster, node), timeout=90, what=f"{node} drained by clusterwatch")
        assert "Reason=clusterwatch: " in _show(cluster, node)
    if between is not None:
        between(cluster)
    for agent in agents:  # the repair: the GPUs answer again
        agent.repair()
    return collector, agents


def _stop(cluster: SlurmCluster, collector: Collector, agents: list[NodeAgent]) -> None:
    for agent in agents:
        agent.stop()
    collector.stop()
    for node in cluster.nodes:
        cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)


def test_a_node_clusterwatch_drained_comes_back_and_a_persons_drain_stays(
        slurm_cluster: SlurmCluster, stub_lib: Path, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    ours, theirs = cluster.nodes[0], cluster.nodes[1]

    def person_drains(c: SlurmCluster) -> None:  # an operator takes over the second node with their own reason
        c.run(["scontrol", "update", f"NodeName={theirs}", "State=DRAIN", f"Reason={PERSON}"])

    collector, agents = _lose_and_repair(cluster, stub_lib, tmp_path, "--resume", "--resume-after", "3",
                                         between=person_drains)
    try:
        wait_for(lambda: not _drained(cluster, ours), timeout=90, what=f"{ours} resumed by clusterwatch")
        assert "Reason=" not in _show(cluster, ours)
        db = tmp_path / "clusterwatch.db"
        wait_for(lambda: ("resume", theirs, "refused") in {r[:3] for r in _audit(db)}, timeout=60,
                 what=f"the resume of {theirs} refused")
        rows = _audit(db)
        assert ("resume_check", ours, "passed") in {r[:3] for r in rows}, rows
        assert ("resume", ours, "done") in {r[:3] for r in rows}, rows
        (refused,) = [r for r in rows if r[:3] == ("resume", theirs, "refused")]
        assert PERSON in refused[3] and "not the one clusterwatch set" in refused[3], refused
        assert _drained(cluster, theirs) and f"Reason={PERSON}" in _show(cluster, theirs)
        assert "resumed node" in collector.text() and f"not resuming {theirs}" in collector.text()
        assert not any(r[:3] == ("resume", theirs, "done") for r in _audit(db))
    finally:
        _stop(cluster, collector, agents)


def test_without_the_flag_nothing_is_resumed(
        slurm_cluster: SlurmCluster, stub_lib: Path, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    collector, agents = _lose_and_repair(cluster, stub_lib, tmp_path, "--resume-after", "3")
    try:
        for node in cluster.nodes:  # the finding is gone: the GPU answers again
            wait_for(lambda node=node: metric_value(collector.metrics(), "clusterwatch_gpu_lost",
                                                    gpu=f"GPU-{node}-0") == 0, timeout=30, what=f"{node}'s GPU back")
        until = time.monotonic() + 15  # a resume would come within 3 s and a 5 s check
        while time.monotonic() < until:
            assert all(_drained(cluster, n) for n in cluster.nodes), [_show(cluster, n) for n in cluster.nodes]
            time.sleep(1)
        rows = _audit(tmp_path / "clusterwatch.db")
        assert [r[:3] for r in rows if r[0] == "drain"] and not [r for r in rows if r[0].startswith("resume")], rows
    finally:
        _stop(cluster, collector, agents)
