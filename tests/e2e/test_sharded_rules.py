"""The job-wide rules see every rank of a job whose nodes' own collectors differ (issue 19): three real
collectors given one list, three real agents on simulated GPUs, one node on each node collector, and real
training processes reporting through clusterwatch.train to their node's agent.

- code_mismatch: two ranks of one job on two nodes, run from two git checkouts on different commits (the
  agents' provenance reads them); the job's collector raises it, naming both versions, and no other does.
- training_stall: three ranks of one job on the three nodes; rank 1 stops first, the other two later at
  one step; a stall of rank 0 names rank 1 on its node as the odd rank out, which only a collector holding
  all three ranks' steps can say.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterwatch.shards import Collectors
from tests.support.git_repos import make_repo
from tests.support.helpers import Proc, cli, wait_for
from tests.support.shard_stack import (
    SCENARIO,
    addresses,
    agent,
    assert_nothing_lost,
    job_spanning,
    live_ranks,
    nodes_on_every_collector,
    rank_env,
    start_shards,
    status_json,
)

pytestmark = pytest.mark.e2e

# steps 10 a second until its stop file names a step it has reached, then stays alive without reporting
RANK = """
import os, sys, time
from clusterwatch import train
stop = sys.argv[1]
step = 0
while True:
    step += 1
    train.report(step=step, loss=1.0 / step)
    try:
        with open(stop) as f:
            if step >= int(f.read().strip() or 0):
                break
    except (OSError, ValueError):
        pass
    time.sleep(0.1)
time.sleep(600)
"""


class InFolder(Proc):
    """A Proc started in `cwd`: a rank runs its code from its checkout, where the agent's provenance looks."""

    def __init__(self, cwd: Path, args: list[str], log: Path, env: dict) -> None:
        self.log = log
        with open(log, "ab") as f:
            self.popen = subprocess.Popen(args, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env)


def alerts_of(collector: str, job: str, rule: str) -> list[dict]:
    r = cli("alerts", "--collector", collector, "--json")
    if r.returncode != 0:
        return []
    return [a for a in json.loads(r.stdout).get("alerts", [])
            if a["rule"] == rule and a["job_id"] == job and a["state"] == "firing"]


def test_code_mismatch_and_training_stall_see_every_rank_across_node_collectors(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    rules = tmp_path / "rules.toml"
    rules.write_text("[training_stall]\nfor_s = 3\npending_after_s = 1\n")
    listed_addresses = addresses()
    listed = Collectors(listed_addresses)
    everyone = ",".join(listed_addresses)
    nodes = nodes_on_every_collector(listed)  # node i's own collector is the i-th found: all three differ
    code_job = job_spanning(listed, nodes[:2], 8100)
    stall_job = job_spanning(listed, nodes, int(code_job) + 1)
    repos = [make_repo(tmp_path / f"checkout-{v}", {"train.py": RANK + f"# version {v}\n"}) for v in "ab"]
    plain = tmp_path / "stall.py"
    plain.write_text(RANK)
    sockets = {n: tmp_path / f"train-{n}.sock" for n in nodes}
    started: list[Proc] = []
    ranks: list[Proc] = []
    try:
        shards = start_shards(tmp_path, listed_addresses, "--rules", str(rules))
        started += shards.values()
        agents = {n: agent(tmp_path, everyone, n, "rules", scenario, provenance=True, train_socket=str(sockets[n]))
                  for n in nodes}
        started += agents.values()
        wait_for(lambda: all(s.exists() for s in sockets.values()), timeout=30, what="the agents' train sockets")

        # the two versions, a rank each on the first two nodes (cwd: the checkout, as a job runs its code)
        never = tmp_path / "never"
        for r, (node, repo) in enumerate(zip(nodes[:2], repos, strict=True)):
            env = {**rank_env(node, code_job, r, 0), "CLUSTERWATCH_TRAIN_SOCKET": str(sockets[node])}
            ranks.append(InFolder(repo, [sys.executable, "train.py", str(never)],
                                  tmp_path / f"rank-{code_job}-{r}.log", env))
        stops = [tmp_path / f"stop-{r}" for r in range(3)]
        for r, node in enumerate(nodes):
            env = {**rank_env(node, stall_job, r, 1), "CLUSTERWATCH_TRAIN_SOCKET": str(sockets[node])}
            ranks.append(InFolder(tmp_path, [sys.executable, str(plain), str(stops[r])],
                                  tmp_path / f"rank-{stall_job}-{r}.log", env))

        (mismatch,) = wait_for(lambda: alerts_of(everyone, code_job, "code_mismatch"), timeout=90,
                               what=f"code_mismatch of job {code_job}")
        assert "2 different versions" in mismatch["description"], mismatch
        for address in listed_addresses:  # raised where the job is, and nowhere else (no shard saw half of it)
            assert bool(alerts_of(address, code_job, "code_mismatch")) == (address == listed.for_job(code_job))
        doc = status_json(code_job, everyone)
        assert live_ranks(doc) == {(nodes[0], 0), (nodes[1], 1)}, doc

        def stepping(least: int) -> dict | None:
            doc = status_json(stall_job, everyone)
            procs = (doc or {}).get("processes", [])
            got = {(p["node"], p["rank"]): p.get("step") or 0 for p in procs}
            return got if set(got) == {(n, r) for r, n in enumerate(nodes)} and min(got.values()) >= least else None

        wait_for(lambda: stepping(20), timeout=60, interval=0.5, what="the three ranks stepping")
        stops[1].write_text("0")  # rank 1 stops at its next step

        def rank1_held() -> int | None:
            first = stepping(0)
            time.sleep(1.5)
            then = stepping(0)
            if not first or not then or then[(nodes[1], 1)] != first[(nodes[1], 1)]:
                return None
            return then[(nodes[1], 1)] if then[(nodes[0], 0)] > first[(nodes[0], 0)] else None

        behind = wait_for(rank1_held, timeout=30, interval=0, what="rank 1's step held, the others going on")
        target = max(stepping(0).values()) + 60  # ~6 s ahead of what status says: written before they get there
        for r in (0, 2):  # the others reach one step and wait there (in the collective rank 1 never joins)
            stops[r].write_text(str(target))
        # the cause is worked out per job every few seconds and the alert's figures kept current: the first
        # read of a just-fired alert may precede it (a CI run read cause None once)
        stall = wait_for(lambda: [a for a in alerts_of(everyone, stall_job, "training_stall")
                                  if a["rank"] == 0 and a.get("cause")],
                         timeout=90, interval=0.5, what="rank 0's training_stall with its cause")[0]
        assert (stall.get("cause"), stall.get("cause_rank"), stall.get("cause_node")) == ("odd_rank", 1, nodes[1]), \
            stall
        assert f"at step {behind}" in stall["description"] and f"the others at step {target}" in stall["description"], \
            stall["description"]
        for address in listed_addresses:
            assert bool(alerts_of(address, stall_job, "training_stall")) == (address == listed.for_job(stall_job))
        for n, a in agents.items():
            assert a.stop() == 0, a.text()
            assert_nothing_lost(n, listed, a.text())
    finally:
        for p in ranks:
            p.stop()
        for p in reversed(started):
            p.stop()
