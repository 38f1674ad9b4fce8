"""agent_down names the job that runs on the silent node and shows in that job's `status` (issue 17, item 15's
alert text; item 6's Notes): a real agent reporting a job's process, then killed, under a real collector."""
from __future__ import annotations

import signal
import sys

import pytest

from tests.support.helpers import CLI, Collector, Proc, cli, wait_for

pytestmark = pytest.mark.e2e


def test_a_silent_agent_is_an_alert_of_the_job_on_its_node(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text("[agent_down]\nafter_s = 3\n")
    collector = Collector(tmp_path, "--rules", str(rules))
    rank = Proc([sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "rank.log")
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "ad-node", "--interval", "0.3",
                  "--send-interval", "0", "--gpu-source", "none", "--no-provenance", "--pid", str(rank.pid),
                  "--job-id", "ad-1", "--spool-dir", str(tmp_path / "spool"),
                  "--train-socket", str(tmp_path / "train.sock")], tmp_path / "agent.log")
    try:
        wait_for(lambda: cli("status", "ad-1", "--collector", collector.address).returncode == 0, timeout=60,
                 what="the job's first samples")
        agent.stop(signal.SIGKILL)

        def firing():
            out = cli("status", "ad-1", "--collector", collector.address).stdout
            return "agent_down" in out and "FIRING" in out and out

        status = wait_for(firing, timeout=60, what="agent_down in the job's status")
        line = next(x for x in status.splitlines() if "agent_down" in x)
        assert "while job ad-1 runs there" in " ".join(status.split("\nAlerts\n", 1)[1].split()), line
        notes = " ".join(status.split("\nNotes\n", 1)[1].split())
        assert "The agent on ad-node is not reporting" in notes, status
    finally:
        for p in (agent, rank, collector):
            p.stop()
