"""`record` then `replay`, for real: a real collector and a real agent on simulated GPUs watch a rank whose GPU
memory and host memory leak, on a job holding a second GPU it never uses; once the collector raises both leaks
and idle_gpu, the job is recorded and the trace replayed with the same rules file, and the replay must raise
the same alerts (rule, job, node, rank, process, GPU). Run with the collector's default history step: the
trace holds what the collector keeps, not what a test tuned it to keep."""
from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import pytest
from clusterwatch.agent.spool import write_event

from clusterwatch.model import JobEvent
from tests.support.helpers import CLI, ROOT, SIM_RUN, Collector, Proc, clean_environ, cli, wait_for

pytestmark = pytest.mark.e2e

JOB_ID = "rr-17"
NODE = "rr-node1"
LIVE_RULES = ("gpu_memory_leak", "host_memory_leak", "idle_gpu")

SCENARIO = """
[gpus]
count = 2
name = "Test GPU (simulated)"
memory_mib = 16384
base_memory_mib = 100

[defaults]
profile = "leak"

[profiles.leak]
kind = "linear_leak"
memory_mib = 2048
leak_mib_per_min = 600
utilization = 80
noise = 3
"""

# Host memory grows 10 MiB/s (touched, so that it is resident); GPU memory grows by the scenario's curve.
RANK = textwrap.dedent("""
    import time
    from clusterwatch import train
    hoard, started, step = [], time.time(), 0
    while time.time() - started < 600:
        step += 1
        block = bytearray(1 << 20)
        block[::4096] = b"x" * len(block[::4096])
        hoard.append(block)
        train.report(step=step)
        time.sleep(0.1)
""")


def _key(a: dict) -> tuple:
    """What an alert is about: its rule, job, node, rank, process and GPU (no process: None, however spelt)."""
    pid = a.get("pid")
    return (a["rule"], a.get("job_id") or "", a.get("node") or "", a.get("rank"), pid if pid and pid > 0 else None,
            a.get("gpu") or "")


def _live_firing(collector) -> set[tuple]:
    """The collector's firing alerts, asked over its query API (the message, not a JSON rendering of it)."""
    import grpc
    from clusterwatch.v1 import query_pb2, query_pb2_grpc

    with grpc.insecure_channel(collector.address) as channel:
        resp = query_pb2_grpc.QueryStub(channel).ListAlerts(query_pb2.ListAlertsRequest(limit=1000), timeout=10)
    return {_key({"rule": e.alert.rule, "job_id": e.job_id, "node": e.alert.node, "pid": e.alert.pid,
                  "gpu": e.alert.gpu, "rank": e.alert.rank if e.alert.HasField("rank") else None})
            for e in resp.alerts if e.alert.state == "firing"}


def test_recorded_incident_replays_to_the_same_alerts(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text((ROOT / "collector" / "rules" / "demo_rules.toml").read_text() + "\n[idle_gpu]\nfor_s = 20\n")
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    spool = tmp_path / "spool"
    spool.mkdir()
    write_event(str(spool), JobEvent("start", JOB_ID, time.time(), os.getuid(), gpu_indexes="0,1"))
    (tmp_path / "rank.py").write_text(RANK)
    collector = Collector(tmp_path, "--rules", str(rules))
    env = dict(clean_environ(), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", CLUSTERWATCH_SIM_GPU="0",
               CLUSTERWATCH_SIM_NODE=NODE, CLUSTERWATCH_SIM_PROFILE="leak", CLUSTERWATCH_SIM_RUN=SIM_RUN,
               CLUSTERWATCH_TRAIN_SOCKET=str(spool / "train.sock"))
    rank = Proc([sys.executable, str(tmp_path / "rank.py")], tmp_path / "rank.log", env=env)
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", NODE, "--gpu-source", "sim",
                  "--sim-scenario", str(scenario), "--sim-run", SIM_RUN, "--interval", "1", "--no-provenance",
                  "--spool-dir", str(spool), "--train-socket", str(spool / "train.sock"), "--job-id", JOB_ID,
                  "--pid", str(rank.pid)], tmp_path / "agent.log")
    try:
        try:
            live = wait_for(lambda: (got := _live_firing(collector)) and set(LIVE_RULES) <= {k[0] for k in got}
                            and got, timeout=180, interval=1.0,
                            what="both leaks and idle_gpu firing at the collector")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{collector.text()[-3000:]}\n{agent.text()[-3000:]}") from None
        trace = tmp_path / "incident.jsonl"
        recorded = cli("record", JOB_ID, "--collector", collector.address, "-o", str(trace))
        assert recorded.returncode == 0, recorded.stderr
        bare = tmp_path / "processes.jsonl"
        recorded = cli("record", JOB_ID, "--collector", collector.address, "-o", str(bare), "--processes-only")
        assert recorded.returncode == 0, recorded.stderr
    finally:
        for p in (agent, rank, collector):
            p.stop()

    replayed = cli("replay", str(trace), "--rules", str(rules), "--format", "jsonl")
    assert replayed.returncode == 0, replayed.stderr
    events = [json.loads(x) for x in replayed.stdout.splitlines()]
    assert {_key(e) for e in events if e["state"] == "firing"} == live, replayed.stdout

    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert {x.get("kind") for x in lines} == {None, "job", "gpu", "node"}
    assert lines[0]["kind"] == "job" and lines[0]["job_id"] == JOB_ID and lines[0]["start_time"] > 0
    readings = [x for x in lines if "kind" not in x and "gpu_mem_bytes" in x]
    assert readings and all(x["gpu_mem_total_bytes"] == 16384 << 20 and x["node_mem_total_bytes"] > 0
                            for x in readings)
    # process lines only, each with the readings a tool that knows no records reads (the scorer's reference rules)
    bare_lines = [json.loads(x) for x in bare.read_text().splitlines()]
    assert bare_lines and all("kind" not in x and {"t", "node", "pid", "gpu_mem_bytes", "rss_bytes"} <= x.keys()
                              for x in bare_lines)
