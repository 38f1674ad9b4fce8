"""The drain circuit breaker on the real two-node Slurm: every node's GPU falls off the bus at once, and the
collector, with its default limits (2 nodes or 5 % an hour, whichever is smaller, never under one node),
drains one node; the other is notified only, and the collector says why in its log and on /metrics.

A real collector (--slurm, a rules file with a drain step and a command step for gpu_lost), a real agent on
each node over the real pynvml and the C stand-in for the driver, whose GPUs fall off the bus (XID 79 in the
kernel log, GPU_IS_LOST). The breaker's count across a restart is tests/collector/test_drain_breaker.py's.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import fixtures
from tests.services.slurm import SlurmCluster, slurm_cluster, slurm_hooks  # noqa: F401  (fixtures)
from tests.support.helpers import Collector, metric_value, wait_for
from tests.support.slurm_agents import start_node_agent, wait_gpus_reported

pytestmark = pytest.mark.slurm
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name


def _rules(notified: Path) -> str:
    # the command step is the notification: each alert's JSON, one a line
    return f"""\
[[actions.steps]]
action = "command"
rules = ["gpu_lost"]
command = ["sh", "-c", "cat >> {notified}; echo >> {notified}"]

[[actions.steps]]
action = "drain"
rules = ["gpu_lost"]
"""


def _drained(cluster: SlurmCluster) -> set[str]:
    return {n for n, s in cluster.node_states().items() if "drain" in s or "drng" in s}


def test_every_node_failing_at_once_loses_only_what_the_breaker_allows(
        slurm_cluster: SlurmCluster, stub_lib: Path, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    notified = tmp_path / "notified.jsonl"
    rules = tmp_path / "rules.toml"
    rules.write_text(_rules(notified))
    collector = Collector(tmp_path, "--slurm", "--slurm-refresh", "1", "--rules", str(rules))
    agents = []
    try:
        assert _drained(cluster) == set(), cluster.node_states()
        for node in cluster.nodes:
            agents.append(start_node_agent(node, stub_lib, tmp_path / node, collector.address))
        wait_gpus_reported(collector, agents)
        for agent in agents:  # every GPU falls off the bus at once
            agent.lose_gpu()

        def told() -> set[str]:
            lines = notified.read_text().splitlines() if notified.exists() else []
            return {json.loads(x)["node"] for x in lines if x.strip()}

        wait_for(lambda: told() == set(cluster.nodes), timeout=90, what="both nodes' alerts notified")
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_actions_drains_held_total") == 1,
                 timeout=30, what="one drain held")
        drained = wait_for(lambda: _drained(cluster), timeout=30, what="one node drained")
        assert len(drained) == 1, cluster.node_states()
        (kept,) = set(cluster.nodes) - drained
        held = [x for x in collector.text().splitlines() if "held: circuit breaker" in x]
        assert len(held) == 1 and f"not draining {kept}, notifying only" in held[0], held
        assert collector.text().count("drained node") == 1
        assert _drained(cluster) == drained, cluster.node_states()  # and it stays one
    finally:
        for agent in agents:
            agent.stop()
        collector.stop()
        for node in cluster.nodes:
            cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
