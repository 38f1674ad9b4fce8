"""A shard down for a minute under running agents (issue 19's fault test): three real collectors given one
list, four real agents on simulated GPUs, three jobs spanning nodes whose node collectors differ. One
collector is SIGKILLed for 60 s, long past the agents' reconnect backoff reaching its 30 s cap, and started
again on its address and store:

- meanwhile the other two go on: their jobs' status whole, their ingest counters growing, their processes
  the same;
- afterwards its jobs' status returns whole, and the history it holds of each of their ranks has no hole
  where it was down (the agents resent that minute from their buffers);
- every stream of every agent: each sample acknowledged, none dropped.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterwatch.shards import Collectors
from tests.support.helpers import cli, metric_value, popen_exec_done, wait_for
from tests.support.shard_stack import (
    SCENARIO,
    addresses,
    agent,
    assert_nothing_lost,
    choose,
    live_ranks,
    rank_env,
    start_shard,
    start_shards,
    status_json,
)

pytestmark = pytest.mark.e2e

SLEEP = shutil.which("sleep") or "/bin/sleep"
OUTAGE_S = 60.0
HISTORY_STEP_S = 1.0
#: The widest gap allowed between two history points of a rank (a point a second): seconds of jitter, not
#: the minute a lost buffer would leave.
GAP_S = 10.0


def rank_points(job: str, collector: str) -> dict[tuple[str, int], list[float]]:
    """`record JOB` through the list: each rank's history point times, in order."""
    r = cli("record", job, "-o", "-", "--processes-only", "--collector", collector)
    assert r.returncode == 0, r.stderr
    out: dict[tuple[str, int], list[float]] = {}
    for line in r.stdout.splitlines():
        row = json.loads(line)
        if "rss_bytes" in row and row.get("rank") is not None:
            out.setdefault((row["node"], row["rank"]), []).append(row["t"])
    return {k: sorted(v) for k, v in out.items()}


def test_a_shard_down_a_minute_loses_nothing_and_the_others_go_on(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    listed_addresses = addresses()
    listed = Collectors(listed_addresses)
    everyone = ",".join(listed_addresses)
    nodes, jobs = choose(listed)
    step = ("--history-step", str(HISTORY_STEP_S))
    started: list = []
    children: list[subprocess.Popen] = []
    try:
        shards = start_shards(tmp_path, listed_addresses, *step)
        started += shards.values()
        gpu_next = dict.fromkeys(nodes, 0)
        ranks: dict[str, set[tuple[str, int]]] = {}
        for job, span in jobs.items():
            for rank, node in enumerate(span):
                children.append(popen_exec_done([SLEEP, "600"], env=rank_env(node, job, rank, gpu_next[node])))
                gpu_next[node] += 1
                ranks.setdefault(job, set()).add((node, rank))
        agents = {n: agent(tmp_path, everyone, n, "outage", scenario) for n in nodes}
        started += agents.values()

        def whole(job: str) -> bool:
            return live_ranks(status_json(job, everyone)) == ranks[job]

        for job in jobs:
            wait_for(lambda j=job: whole(j), timeout=60, interval=0.5, what=f"every rank of job {job}")

        victim_address = listed.for_job(next(iter(jobs)))
        victim = shards[victim_address]
        victims_jobs = [j for j in jobs if listed.for_job(j) == victim_address]
        others = {a: shards[a] for a in listed_addresses if a != victim_address}
        others_jobs = [j for j in jobs if j not in victims_jobs]
        assert others_jobs  # choose() puts each job on its own collector
        before = {a: metric_value(c.metrics(), "clusterwatch_ingest_samples_total") or 0 for a, c in others.items()}

        victim.stop(signal.SIGKILL)
        down_at = time.time()
        while time.time() - down_at < OUTAGE_S:  # the others answer for their jobs the whole minute
            for job in others_jobs:
                assert whole(job), (job, status_json(job, everyone))
            time.sleep(5)
        grown = {a: metric_value(c.metrics(), "clusterwatch_ingest_samples_total") or 0 for a, c in others.items()}
        assert all(grown[a] > before[a] for a in others), (before, grown)
        back = start_shard(tmp_path, listed_addresses, victim_address, *step,
                           name=f"s{listed_addresses.index(victim_address)}-again",
                           db=tmp_path / f"s{listed_addresses.index(victim_address)}.db")
        up_at = time.time()
        started.append(back)
        # the agents' next try: within the backoff's 30 s cap (and its jitter)
        for job in victims_jobs:
            wait_for(lambda j=job: whole(j), timeout=90, interval=0.5, what=f"job {job} after the restart")

        def resent(job: str) -> dict | None:
            """Each rank's history on the restarted shard, once it reaches past the restart."""
            points = rank_points(job, everyone)
            return points if set(points) == ranks[job] and all(p[-1] > up_at for p in points.values()) else None

        for job in victims_jobs:
            points = wait_for(lambda j=job: resent(j), timeout=30, interval=1, what=f"job {job}'s history resent")
            for key, times in points.items():
                # the minute it was down is there: from before the kill, point after point, to after the restart
                assert times[0] <= down_at + GAP_S, (job, key, times[0] - down_at)
                gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
                assert max(gaps) <= GAP_S, (job, key, max(gaps), down_at, up_at)
        for c in others.values():  # never restarted, never refused
            assert c.popen.poll() is None, c.text()
        for job in others_jobs:
            assert whole(job)
        for n, a in agents.items():
            assert a.stop() == 0, a.text()
            streams = assert_nothing_lost(n, listed, a.text())
            if any(listed.for_job(j) == victim_address and n in jobs[j] for j in jobs) or \
                    listed.for_node(n) == victim_address:
                assert victim_address in streams, (n, streams)
    finally:
        for p in reversed(started):
            p.stop()
        for c in children:
            c.kill()
            c.wait()
