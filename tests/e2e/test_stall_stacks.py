"""When training_stall fires, the collector takes the job's stacks once and the alert carries the grouped summary
(issue 16 part 3): a real collector, a real agent (py-spy from outside) and a real Python process using
clusterwatch.train that blocks in a named function; `alerts` and `status` show that function. The rules file's
`take_stacks = false` leaves the alert without them."""
from __future__ import annotations

import json
import sys
import time

import pytest

from tests.support.helpers import CLI, Collector, Proc, clean_environ, cli, wait_for

pytestmark = pytest.mark.e2e

# steps long enough for the rules (which look every 5 s) to see the step move, then hangs where a collective would
TRAINER = r"""
import time
from clusterwatch import train

def blocked_in_a_collective():
    time.sleep(3600)   # a hung all_reduce never returns

for step in range(1, 1000000):
    train.report(step=step, loss=1.0)
    if step == 60:
        blocked_in_a_collective()
    time.sleep(0.2)
"""


def _stall(collector: Collector) -> dict | None:
    r = cli("alerts", "--collector", collector.address, "--json")
    if r.returncode != 0:
        return None
    return next((a for a in json.loads(r.stdout).get("alerts", [])
                 if a["rule"] == "training_stall" and a["state"] == "firing"), None)


def _run(tmp_path, job_id: str, rules_text: str):
    sock = tmp_path / "train.sock"
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    rules = tmp_path / "rules.toml"
    rules.write_text(rules_text)
    collector = Collector(tmp_path, "--rules", str(rules))
    rank = Proc([sys.executable, str(script)], tmp_path / "rank.log",
                env={**clean_environ(), "CLUSTERWATCH_TRAIN_SOCKET": str(sock)})
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "ss-node", "--interval", "0.3",
                  "--send-interval", "0", "--gpu-source", "none", "--no-provenance", "--pid", str(rank.pid),
                  "--job-id", job_id, "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(sock)],
                 tmp_path / "agent.log")
    return collector, rank, agent


def test_a_training_stall_carries_the_function_its_rank_is_blocked_in(tmp_path):
    collector, rank, agent = _run(tmp_path, "ss-1", "[training_stall]\nfor_s = 3\npending_after_s = 1\n")
    try:
        def with_stacks() -> dict | None:
            a = _stall(collector)
            return a if a is not None and "blocked_in_a_collective" in a["description"] else None

        alert = wait_for(with_stacks, timeout=120, interval=0.5, what="training_stall with the rank's stacks")
        print(alert["description"])
        assert "; stacks: " in alert["description"], alert
        status = cli("status", "ss-1", "--collector", collector.address)
        assert status.returncode == 0 and "blocked_in_a_collective" in status.stdout, status.stdout
        # taken once: one dump_stacks request for the alert, asked by it
        document = json.loads(cli("status", "ss-1", "--collector", collector.address, "--json").stdout)
        asked = [a for a in document["train_answers"] if a["kind"] == "dump_stacks"]
        assert len(asked) == 1 and asked[0]["asked_by"].startswith("alert ") and asked[0]["status"] == "done", asked
    finally:
        print(cli("alerts", "--collector", collector.address, "--json").stdout)
        for p in (agent, rank, collector):
            p.stop()


def test_take_stacks_false_leaves_the_alert_without_them(tmp_path):
    collector, rank, agent = _run(tmp_path, "ss-2",
                                  "[training_stall]\nfor_s = 3\npending_after_s = 1\ntake_stacks = false\n")
    try:
        wait_for(lambda: _stall(collector), timeout=120, interval=0.5, what="training_stall")
        # with the switch on, the stacks are on the alert a second or two after it fires (py-spy's time)
        time.sleep(10)
        alert = _stall(collector)
        assert alert is not None and "stacks" not in alert["description"], alert
        document = json.loads(cli("status", "ss-2", "--collector", collector.address, "--json").stdout)
        assert [a for a in document["train_answers"] if a["kind"] == "dump_stacks"] == []
    finally:
        for p in (agent, rank, collector):
            p.stop()
