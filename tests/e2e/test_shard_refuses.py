"""A shard refuses a job that is not its own: two real shards given one list, and a real agent given another
list (one collector, the wrong one) that streams a job the deployment's list gives the other shard. The
wrong shard keeps no copy of the job (`status` through it says unknown, its /metrics has no series of the
job), counts what it dropped and says so once in its log; an agent given the right list puts the same job
whole on its own shard.
"""
from __future__ import annotations

import sys

import pytest

from clusterwatch.shards import Collectors
from tests.support.helpers import CLI, Proc, cli, metric_value, unique_job_id, wait_for
from tests.support.shard_stack import addresses, start_shards

pytestmark = pytest.mark.e2e

SLEEPER = "import time; time.sleep(600)"


def agent(tmp_path, collector: str, node: str, pid: int, job: str, tag: str) -> Proc:
    return Proc([*CLI, "agent", "--collector", collector, "--node", node, "--interval", "0.5", "--send-interval",
                 "0.5", "--gpu-source", "none", "--kmsg", "none", "--no-provenance", "--pid", str(pid),
                 "--job-id", job, "--spool-dir", str(tmp_path / f"spool-{tag}"),
                 "--train-socket", str(tmp_path / f"{tag}.sock")], tmp_path / f"agent-{tag}.log")


def test_a_shard_keeps_no_copy_of_another_shards_job_sent_by_a_misconfigured_agent(tmp_path):
    listed = addresses(2)
    deployment = Collectors(listed)
    job = unique_job_id()
    while deployment.for_job(job) != listed[0]:
        job = unique_job_id()
    right, wrong = listed
    node = next(f"gw{i}" for i in range(1000) if deployment.for_node(f"gw{i}") == wrong)  # the node is wrong's
    started: list[Proc] = []
    try:
        shards = start_shards(tmp_path, listed)
        started += shards.values()
        work = Proc([sys.executable, "-c", SLEEPER], tmp_path / "work.log")
        started.append(work)
        # given one collector alone, the agent sends everything there: the job's samples too
        stray = agent(tmp_path, wrong, node, work.pid, job, "stray")
        started.append(stray)
        batches = lambda: metric_value(shards[wrong].metrics(), "clusterwatch_ingest_batches_total") or 0  # noqa: E731
        wait_for(lambda: batches() >= 4, timeout=60, what="the wrong shard taking the agent's batches")
        # the node's own stream is taken: the node is this shard's, and its heartbeat comes
        assert metric_value(shards[wrong].metrics(), "clusterwatch_node_up", node=node) == 1.0
        r = cli("status", job, "--collector", wrong)
        assert r.returncode == 1 and "unknown" in r.stderr, r.stdout + r.stderr
        text = shards[wrong].metrics()
        assert f'job_id="{job}"' not in text
        assert metric_value(text, "clusterwatch_ingest_other_shard_dropped_total") >= 4
        said = [ln for ln in shards[wrong].text().splitlines() if "shard" in ln and " dropped " in ln]
        assert len(said) == 1, said  # one line for the node, however many batches
        assert f"job '{job}'" in said[0] and right in said[0] and f"'{node}'" in said[0]

        # an agent given the deployment's list puts the same job on its shard, whole
        stray.stop()
        other = next(f"gw{i}" for i in range(1000) if deployment.for_node(f"gw{i}") == right)
        good = agent(tmp_path, ",".join(listed), other, work.pid, job, "good")
        started.append(good)
        wait_for(lambda: cli("status", job, "--collector", right).returncode == 0, timeout=60,
                 what="the job on its own shard")
        assert cli("status", job, "--collector", wrong).returncode == 1
        assert f'job_id="{job}"' in shards[right].metrics()
    finally:
        for p in reversed(started):
            p.stop()
