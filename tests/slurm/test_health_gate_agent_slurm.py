"""Issue 28's health gate end to end on the real two-node Slurm: a real agent on each node, over the real pynvml
and the C stand-in for the driver, writes its health file; the first node's GPU is lost; the next job, through
`clusterwatch prolog --gate` as slurmd runs it, is refused there (slurmd drains the node, Slurm requeues the
job) and runs on the other node, whose agent's file says its GPU is fine.

tests/slurm/test_health_gate_slurm.py covers the gate on a file the test writes (gate off, a stale file); this
one drives it from what an agent saw. The cluster and its Prolog are that module's.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from clusterwatch.agent.ensure import PID_FILE, read_pid

from clusterwatch.slurm.health_gate import read_health_file
from tests.fakes.nvml_stub import fixtures
from tests.slurm.test_health_gate_slurm import (  # noqa: F401  (gated, node_spool: fixtures)
    _prolog_log,
    _settings,
    gated,
    node_spool,
    refused_then_runs_elsewhere,
)
from tests.support.helpers import Collector, wait_for
from tests.support.slurm_agents import NodeAgent, start_node_agent, wait_gpus_reported

pytestmark = pytest.mark.slurm
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name


def _findings(agent: NodeAgent) -> tuple[str, ...] | None:
    """The finding kinds in the agent's health file once it holds a health reading; None before."""
    try:
        health = read_health_file(str(agent.spool))
    except (OSError, ValueError):
        return None
    if health.counters_read_at is None and not health.findings:
        return None
    assert health.agent_pid == agent.proc.pid, health
    return tuple(f.kind for f in health.findings)


def test_a_gpu_the_agent_saw_lost_refuses_the_next_job_which_runs_elsewhere(
        node_spool, stub_lib: Path, tmp_path: Path) -> None:  # noqa: F811
    cluster, root, env_file = node_spool
    bad, good = cluster.nodes
    _settings(env_file, root, gate="1")
    collector = Collector(tmp_path)
    agents: list[NodeAgent] = []
    try:
        with env_file.open("a") as f:  # as deployed: the prolog knows the collector, and finds the agent running
            f.write(f"CLUSTERWATCH_COLLECTOR={collector.address}\n")
        # each agent's spool is the one the prolog reads (CLUSTERWATCH_SPOOL={root}/spool/{node})
        for node in cluster.nodes:
            agents.append(start_node_agent(node, stub_lib, tmp_path / node, collector.address,
                                           "--health-interval", "1", spool=root / "spool" / node))
        wait_gpus_reported(collector, agents)
        for agent in agents:
            wait_for(lambda agent=agent: _findings(agent) == (), timeout=60,
                     what=f"{agent.node}'s agent writing a healthy health file")
        lost = agents[0]
        lost.lose_gpu(xid=False)  # NVML's GPU_IS_LOST alone: the finding is the lost GPU, not an XID
        wait_for(lambda: _findings(lost) == ("gpu_lost",), timeout=60,
                 what=f"{bad}'s agent writing its GPU lost")

        refused_then_runs_elsewhere(cluster, root, f"clusterwatch gate: {lost.gpu}: lost")
        # The good node's prolog read its agent's fresh, healthy file and found that agent running: not a word.
        assert _prolog_log(root, good) == "", _prolog_log(root, good)
        assert read_pid(str(root / "spool" / good / PID_FILE)) == agents[1].proc.pid
    finally:
        for agent in agents:
            agent.stop()
        collector.stop()
