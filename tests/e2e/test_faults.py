"""Nothing lost: the collector SIGKILLed for 60 s under a running agent, an agent killed mid-job."""
from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from tests.support.helpers import CLI, Collector, Proc, cli, metric_value, wait_for

pytestmark = pytest.mark.e2e

# A rank with two workers; the workers leave when the rank is stopped (reparented), so no test leaves them behind.
WORKERS = """
import os, sys, time
rank = os.getpid()
for _ in range(2):
    if os.fork() == 0:
        deadline = time.time() + 600
        while os.getppid() == rank and time.time() < deadline:
            time.sleep(0.2)
        sys.exit(0)
time.sleep(600)
"""


def _agent(tmp_path, address, pid, name="agent"):
    # a batch every second (five polls): the faults below are timed in seconds
    return Proc([*CLI, "agent", "--collector", address, "--node", "fault-node", "--interval", "0.2",
                 "--send-interval", "1", "--gpu-source", "none", "--pid", str(pid), "--job-id", "fault-1",
                 "--no-provenance",
                 "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / f"{name}.sock")],
                tmp_path / f"{name}.log")


def test_collector_killed_for_60_s_every_sample_arrives_exactly_once(tmp_path):
    db = tmp_path / "cw.db"
    # a Unix socket: a TCP port let go for 60 s may be taken meanwhile by another test's process
    address = f"unix:{tmp_path}/collector.sock"
    collector = Collector(tmp_path, db=db, listen=address)
    workload = Proc([sys.executable, "-c", WORKERS], tmp_path / "workload.log")
    agent = _agent(tmp_path, address, workload.pid)
    try:
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0) > 20,
                 what="samples before the kill")
        collector.stop(signal.SIGKILL)
        time.sleep(60)  # the agent polls on, buffers, and retries with backoff
        # the same address and store, as a restarted service would have
        collector = Collector(tmp_path, db=db, name="collector2", listen=address)
        # the agent reconnects, resends what was not acknowledged, and the buffer drains
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0) > 300,
                 timeout=90, what="the buffered samples resent")
        assert agent.stop() == 0
        line = [ln for ln in agent.text().splitlines() if ln.startswith("samples_sent=")][-1]
        counters = dict(kv.split("=") for kv in line.split())
        sent = int(counters["samples_sent"])
        assert counters["samples_dropped"] == "0"
        assert int(counters["samples_acked"]) == sent
        view = json.loads(cli("status", "fault-1", "--collector", address, "--json").stdout)
        held = sum(int(p["samples_held"]) for p in view["processes"])
        assert len(view["processes"]) == 3
        # every sample the agent sent is counted once: none lost, none twice
        assert held == sent, f"collector holds {held} samples, the agent sent {sent}"
        assert sent > 3 * 60 / 0.2  # the 60 s outage was really buffered (3 processes, 5 polls/s)
    finally:
        for p in (agent, workload, collector):
            p.stop()


def test_killed_agent_raises_agent_down(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text("[agent_down]\nafter_s = 3\n")
    collector = Collector(tmp_path, "--rules", str(rules))
    workload = Proc([sys.executable, "-c", WORKERS], tmp_path / "workload.log")
    agent = _agent(tmp_path, collector.address, workload.pid)
    try:
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_node_up", node="fault-node") == 1.0,
                 what="the node up")
        agent.stop(signal.SIGKILL)
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_alert", rule="agent_down",
                                      node="fault-node", state="firing") == 1.0, timeout=30,
                 what="agent_down firing")
        # down after three send intervals without a batch
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_node_up", node="fault-node") == 0.0,
                 timeout=10, what="the node down")
        alerts = cli("alerts", "--collector", collector.address)
        assert "agent_down" in alerts.stdout and "fault-node" in alerts.stdout
        # the agent comes back: the alert resolves
        agent = _agent(tmp_path, collector.address, workload.pid, name="agent2")
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_alert", rule="agent_down",
                                      node="fault-node", state="firing") is None, timeout=30,
                 what="agent_down resolved")
    finally:
        for p in (agent, workload, collector):
            p.stop()
