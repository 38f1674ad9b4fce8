"""A sharded deployment on loopback for the e2e tests: three real collectors given one list, real agents on
simulated GPUs given it too, nodes and job ids chosen so that jobs span nodes whose node collectors differ.

Shared by tests/e2e/test_sharded_agents.py, test_sharded_rules.py and test_shard_outage.py.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from clusterwatch.shards import Collectors
from tests.services.procs import free_port
from tests.support.helpers import CLI, SIM_RUN, Collector, Proc, clean_environ, cli

SCENARIO = """
[gpus]
count = 4
name = "Test GPU"
memory_mib = 16384

[defaults]
profile = "steady"

[profiles.steady]
kind = "steady"
memory_mib = 2048
utilization = 60
"""


def addresses(n: int = 3) -> tuple[str, ...]:
    """A deployment's list: `n` distinct free loopback ports, in one order (free_port releases each port it
    finds, so two calls can give the same one: a list naming one collector twice has a collector no node maps to)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return tuple(f"127.0.0.1:{p}" for p in ports)


def start_shards(tmp: Path, listed: tuple[str, ...], *extra: str, tag: str = "s") -> dict[str, Collector]:
    """One collector for each address of the list, each given the list and its own --shard (`extra` to each)."""
    return {a: start_shard(tmp, listed, a, *extra, name=f"{tag}{i}") for i, a in enumerate(listed)}


def start_shard(tmp: Path, listed: tuple[str, ...], address: str, *extra: str, name: str,
                db: Path | None = None) -> Collector:
    """The collector of `address` in the list (again, after a restart: the same `db` keeps its store)."""
    return Collector(tmp, "--collectors", ",".join(listed), "--shard", address, *extra, name=name,
                     db=db or tmp / f"{name}.db", listen=address)


def nodes_on_every_collector(listed: Collectors, prefix: str = "sh") -> list[str]:
    """One node name for each collector of the list (`prefix`0, 1, ... as they come: the first found for each)."""
    by_collector: dict[str, str] = {}
    for i in range(10_000):  # each collector takes about a third of the names: a few dozen suffice
        by_collector.setdefault(listed.for_node(f"{prefix}{i}"), f"{prefix}{i}")
        if len(by_collector) == len(set(listed.current)):
            return list(by_collector.values())
    raise AssertionError(f"no node name maps to some collector of {listed.current} in 10,000 tries")


def job_spanning(listed: Collectors, span: list[str], start: int, avoid: set[str] = frozenset()) -> str:
    """The first job number from `start` whose collector is not in `avoid` and differs from the node collector
    of at least one node of `span` (so some of its ranks stream to another collector than their node's)."""
    for j in range(start, start + 10_000):
        if listed.for_job(str(j)) not in avoid and any(listed.for_node(n) != listed.for_job(str(j)) for n in span):
            return str(j)
    raise AssertionError(f"no job from {start} spans {span} off its collectors, outside {sorted(avoid)}")


def choose(listed: Collectors) -> tuple[list[str], dict[str, list[str]]]:
    """Four nodes, one on each node collector and one more, and three numbered jobs over them, each on its own
    collector and spanning a node whose node collector is another."""
    nodes = nodes_on_every_collector(listed)
    nodes = [*nodes, f"sh{max(int(n[2:]) for n in nodes) + 1}"]
    spans = [[nodes[0], nodes[1]], [nodes[1], nodes[2], nodes[3]], [nodes[0], nodes[2], nodes[3]]]
    jobs: dict[str, list[str]] = {}
    owners: set[str] = set()
    j = 7000
    for span in spans:
        job = job_spanning(listed, span, j, owners)
        owners.add(listed.for_job(job))
        jobs[job] = span
        j = int(job)
    return nodes, jobs


def rank_env(node: str, job: str, rank: int, gpu: int) -> dict[str, str]:
    """A rank's environment: on simulated GPU `gpu` of `node`, in Slurm job `job`."""
    return {**clean_environ(), "CLUSTERWATCH_SIM_RUN": f"{SIM_RUN}-{node}", "CLUSTERWATCH_SIM_GPU": str(gpu),
            "SLURM_JOB_ID": job, "RANK": str(rank), "LOCAL_RANK": str(gpu), "SLURMD_NODENAME": node}


def agent(tmp: Path, collector: str, node: str, tag: str, scenario: Path, *extra: str, provenance: bool = False,
          train_socket: str = "") -> Proc:
    """An agent of `node` on simulated GPUs, polling every 0.5 s and sending every second, to `collector` (one
    address or the list); without provenance or a training socket unless asked."""
    return Proc([*CLI, "agent", "--collector", collector, "--node", node, "--gpu-source", "sim",
                 "--sim-scenario", str(scenario), "--sim-run", f"{SIM_RUN}-{node}", "--interval", "0.5",
                 "--send-interval", "1", *([] if provenance else ["--no-provenance"]), "--kmsg", "none",
                 "--train-socket", train_socket, "--spool-dir", str(tmp / f"spool-{tag}-{node}"), *extra],
                tmp / f"agent-{tag}-{node}.log")


def counts(text: str) -> dict[str, tuple[int, int, int]]:
    """The agent's exit lines: collector (or 'all') → (sent, acked, dropped)."""
    out = {}
    for line in text.splitlines():
        m = re.search(r"(?:collector (\S+): )?samples_sent=(\d+) samples_acked=(\d+) samples_dropped=(\d+)", line)
        if m:
            out[m.group(1) or "all"] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
    return out


def assert_nothing_lost(node: str, listed: Collectors, text: str) -> dict[str, tuple[int, int, int]]:
    """A stopped agent's exit lines say: every stream's samples acknowledged, none dropped, the node's own
    collector among its streams, the totals their sum. Returns the streams' counts."""
    got = counts(text)
    streams = {c: v for c, v in got.items() if c != "all"} or {listed.for_node(node): got["all"]}
    assert listed.for_node(node) in streams, got
    for c, (sent, acked, dropped) in streams.items():
        assert dropped == 0 and acked == sent, (node, c, got)
    assert got["all"] == tuple(sum(v[i] for v in streams.values()) for i in range(3)), got
    return streams


def status_json(job: str, collector: str) -> dict | None:
    """`status JOB --json` through `collector` (an address or the list); None while it fails."""
    r = cli("status", job, "--json", "--collector", collector)
    return json.loads(r.stdout) if r.returncode == 0 else None


def live_ranks(doc: dict | None) -> set[tuple[str, int]]:
    """(node, rank) of a status document's live processes."""
    return {(p["node"], p["rank"]) for p in (doc or {}).get("processes", []) if p.get("alive", True)}
