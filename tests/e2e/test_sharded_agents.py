"""Agents of a sharded deployment: three real collectors, four real agents on simulated GPUs given the list.

Jobs span nodes whose node collectors differ. Every job's ranks land on its one collector; `status` with
the list shows every node and rank; `jobs` lists each job once; a node's own series are on exactly one
collector, and a real Prometheus scraping the three sums to what a fourth collector holds, fed the same
load by four more agents given it alone. One collector killed and restarted: its streams resend, nothing
is lost, the other collectors go on meanwhile.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import pytest

from clusterwatch.shards import Collectors
from tests.services.procs import free_port
from tests.services.prometheus import running_prometheus
from tests.support.helpers import SIM_RUN, Collector, clean_environ, cli, metric_value, popen_exec_done, wait_for
from tests.support.shard_stack import SCENARIO, agent, choose, counts, rank_env

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus]

SLEEP = shutil.which("sleep") or "/bin/sleep"
NODE_FAMILIES = ("clusterwatch_node_up", "clusterwatch_node_memory_total_bytes", "clusterwatch_gpu_memory_total_bytes",
                 "clusterwatch_gpu_utilization_ratio")
JOB_FAMILIES = ("clusterwatch_rank_rss_bytes", "clusterwatch_rank_gpu_memory_used_bytes", "clusterwatch_job_processes")


def test_agents_keep_a_stream_per_collector_and_every_job_whole(tmp_path):
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    addresses = tuple(f"127.0.0.1:{free_port()}" for _ in range(3))
    listed = Collectors(addresses)
    everyone = ",".join(addresses)
    nodes, jobs = choose(listed)
    started: list = []
    children: list[subprocess.Popen] = []
    try:
        shards = {a: Collector(tmp_path, "--collectors", everyone, "--shard", a, name=f"s{i}", db=tmp_path / f"s{i}.db",
                               listen=a) for i, a in enumerate(addresses)}
        started += shards.values()
        whole = Collector(tmp_path, name="whole", db=tmp_path / "whole.db")
        started.append(whole)
        gpu_next = dict.fromkeys(nodes, 0)
        ranks: dict[str, list[tuple[str, int]]] = {}
        for job, span in jobs.items():
            for rank, node in enumerate(span):
                env = rank_env(node, job, rank, gpu_next[node])
                gpu_next[node] += 1
                children.append(popen_exec_done([SLEEP, "600"], env=env))
                ranks.setdefault(job, []).append((node, rank))
        # a process of no job on a GPU: the node's own
        loose = {**clean_environ(), "CLUSTERWATCH_SIM_RUN": f"{SIM_RUN}-{nodes[2]}",
                 "CLUSTERWATCH_SIM_GPU": str(gpu_next[nodes[2]])}
        children.append(popen_exec_done([SLEEP, "600"], env=loose))
        sharded = {n: agent(tmp_path, everyone, n, "sharded", scenario) for n in nodes}
        started += sharded.values()
        started += [agent(tmp_path, whole.address, n, "whole", scenario) for n in nodes]

        seen: dict = {}

        def status(job: str, collector: str = everyone):
            r = cli("status", job, "--json", "--collector", collector)
            seen["stderr"] = r.stderr[-300:]
            return json.loads(r.stdout) if r.returncode == 0 else None

        def whole_job(job: str):
            doc = status(job)
            if doc is None:
                return None
            got = {(p["node"], p["rank"]) for p in doc["processes"] if p.get("alive", True)}
            seen[job] = sorted(got, key=str)
            return doc if got == set(ranks[job]) else None

        for job in jobs:
            try:
                doc = wait_for(lambda j=job: whole_job(j), timeout=60, what=f"every rank of job {job}")
            except AssertionError:
                raise AssertionError(f"job {job}: ranks {ranks[job]} expected; status said {seen}") from None
            assert {n["node"] for n in doc["nodes"]} >= set(jobs[job])
            # the readings of the GPUs its ranks use reach the job's collector too, whichever node collector
            read = {g["node"] for g in doc["gpus"] if g.get("utilization") is not None}
            assert read >= set(jobs[job]), (job, doc["gpus"])
            for address in addresses:  # the job is on its own collector, on no other
                alone = cli("status", job, "--collector", address)
                assert (alone.returncode == 0) == (address == listed.for_job(job)), (job, address, alone.stderr)

        listed_jobs = cli("jobs", "--json", "--collector", everyone)
        assert listed_jobs.returncode == 0, listed_jobs.stderr
        assert sorted(j["job_id"] for j in json.loads(listed_jobs.stdout)["jobs"]) == sorted(jobs)

        # a node's own series on exactly one collector: its node collector
        def node_series_placed() -> bool:
            texts = {a: shards[a].metrics() for a in addresses}
            for n in nodes:
                holders = [a for a, t in texts.items() if metric_value(t, "clusterwatch_node_up", node=n) is not None]
                gpu_holders = [a for a, t in texts.items()
                               if metric_value(t, "clusterwatch_gpu_memory_total_bytes", node=n) is not None]
                if holders != [listed.for_node(n)] or gpu_holders != holders:
                    return False
            return True

        wait_for(node_series_placed, timeout=30, what="node series on their node's collector only")

        targets = [f"127.0.0.1:{c.metrics_port}" for c in (*shards.values(), whole)]
        shard_instances = "|".join(targets[:3])
        with running_prometheus(tmp_path / "prom", targets) as prom:
            def same_as_whole() -> bool:
                for name in (*NODE_FAMILIES, *JOB_FAMILIES):
                    split = prom.query(f'count({name}{{instance=~"{shard_instances}"}})')
                    one = prom.query(f'count({name}{{instance="{targets[3]}"}})')
                    if not split or not one or split[0]["value"][1] != one[0]["value"][1]:
                        return False
                per_node = prom.query(f'count by (node) (clusterwatch_node_up{{instance=~"{shard_instances}"}})')
                return sorted(r["metric"]["node"] for r in per_node) == sorted(nodes) and \
                    all(r["value"][1] == "1" for r in per_node)

            wait_for(same_as_whole, timeout=60, what="the three collectors' series summing to the one's")
            expected_gpus = prom.query(f'count(clusterwatch_gpu_memory_total_bytes{{instance="{targets[3]}"}})')
            assert expected_gpus[0]["value"][1] == str(4 * len(nodes))

        # one collector killed for some seconds and restarted: its streams resend, the others go on
        victim_address = listed.for_job(next(iter(jobs)))
        victim = shards[victim_address]
        others = [a for a in addresses if a != victim_address]
        before = {a: metric_value(shards[a].metrics(), "clusterwatch_ingest_samples_total") or 0 for a in others}
        victim.stop(signal.SIGKILL)
        time.sleep(6)
        for job in jobs:
            if listed.for_job(job) != victim_address:
                assert whole_job(job) is not None, job  # the other collectors' jobs, whole meanwhile
        grown = {a: metric_value(shards[a].metrics(), "clusterwatch_ingest_samples_total") or 0 for a in others}
        assert all(grown[a] > before[a] for a in others if before[a]), (before, grown)
        index = addresses.index(victim_address)
        back = Collector(tmp_path, "--collectors", everyone, "--shard", victim_address, name=f"s{index}-again",
                         db=tmp_path / f"s{index}.db", listen=victim_address)
        started.append(back)
        for job in jobs:
            wait_for(lambda j=job: whole_job(j), timeout=90, what=f"job {job} after the restart")
        for n, proc in sharded.items():
            assert proc.stop() == 0, proc.text()
            got = counts(proc.text())
            streams = {c: v for c, v in got.items() if c != "all"} or {listed.for_node(n): got["all"]}
            assert listed.for_node(n) in streams, got
            for c, (sent, acked, dropped) in streams.items():
                assert dropped == 0 and acked == sent, (n, c, got)
            assert got["all"] == tuple(sum(v[i] for v in streams.values()) for i in range(3)), got
    finally:
        for p in reversed(started):
            p.stop()
        for c in children:
            c.kill()
            c.wait()
