"""collector/traces/record.py through a real core and the live rules: the trace `record` writes, replayed with the
rules the collector ran, raises what the collector raised, also once the collector has dropped a process's
oldest samples (its warm-up began before the first one kept)."""
from __future__ import annotations

import json

from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.live import Alerting
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.state.core import CollectorCore, new_cluster_state
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.collector.traces.replay import replay_lines
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, JobEvent, ProcessSample
from clusterwatch.wire import job_event_to_proto, processes_to_table

from .test_ingest_integrity import T0, Clock

GiB = 1 << 30
NODE_RAM = 64 * GiB
START = T0 - 50.0  # the rank started 50 s before the first sample
RULES = """
[host_memory_leak]
min_rate_mb_per_h = 50
min_growth_mb = 40
warmup_s = 30
bucket_s = 5
windows = [[35, 50]]
sub_buckets = 6
min_t_stat = 3.0
min_mk_z = 2.5

[gpu_memory_leak]
enabled = false

[idle_gpu]
for_s = 20
"""


def _batch(seq: int, t: float, rank: bool = True) -> agent_pb2.Batch:
    """One poll: rank 0 on GPU-a, its RSS growing 10 MiB/s; GPU-a busy, GPU-b (also the job's) unused."""
    b = agent_pb2.Batch(seq=seq, sent_at=t)
    sample = ProcessSample(t, "n1", 101, START, ppid=1, uid=1000, user="alice", command="python", job_id="7",
                           rank=0, cpu_percent=90.0, rss_bytes=GiB + int((t - T0) * 10 * (1 << 20)), threads=8,
                           open_fds=20, gpus=(GpuUse("GPU-a", 2 * GiB, 85.0),))
    processes_to_table([sample] if rank else [], b.processes)
    if seq == 1:
        job_event_to_proto(JobEvent("start", "7", t - 1, uid=1000, user="alice", gpu_uuids=("GPU-a", "GPU-b")),
                           b.job_events.add())
    for uuid, util in (("GPU-a", 85.0 if rank else 0.0), ("GPU-b", 0.0)):
        b.gpus.add(time=t, uuid=uuid, utilization=util, memory_used_bytes=2 * GiB, memory_total_bytes=16 * GiB)
    return b


def _run(tmp_path, history_points: int, rank_polls: int = 120, job_memory: int = 0):
    """A collector's core and live rules fed 120 one-second polls, the rank in the first `rank_polls`;
    (the rules, what fired, the job's trace, the keys and states pending or firing at the end, those alerts)."""
    rules_path = tmp_path / "rules.toml"
    rules_path.write_text(RULES)
    rules = load_rules(str(rules_path))
    config = CollectorConfig(db_path=str(tmp_path / "cw.db"), history_points=history_points, history_step_s=1.0)
    conn = open_db(config.db_path)
    state = new_cluster_state(config)
    alerting = Alerting(rules, state, AlertStore(conn), min_interval_s=1.0)
    clock = Clock()
    core = CollectorCore(config, Store(conn), state=state, clock=clock, listeners=[alerting], alerts=alerting,
                         health=alerting.health.engine)
    core.hello(agent_pb2.Hello(node="n1", boot_id="b", agent_version="t", interval_s=1.0, send_interval_s=1.0,
                               node_memory_total_bytes=NODE_RAM,
                               gpus=[agent_pb2.GpuInfo(uuid="GPU-a", index=0, memory_total_bytes=16 * GiB),
                                     agent_pb2.GpuInfo(uuid="GPU-b", index=1, memory_total_bytes=16 * GiB)]))
    for i in range(120):
        clock.now = T0 + i
        assert core.batch("n1", "b", _batch(i + 1, T0 + i, rank=i < rank_polls))
        state.jobs["7"].memory_bytes = job_memory  # what Slurm would say of the job's --mem
        core.tick()
    fired = {_key(a) for a in alerting.store.history(1000) if a.fired_at}
    active = {(_key(a), a.state) for a in alerting.store.active()}
    found = core.job_trace("7")
    assert found is not None
    return rules, fired, found[0], active, alerting.store.active()


def _key(a) -> tuple:
    """What an alert is about (no process: None, however spelt)."""
    return a.rule, a.job_id, a.node, a.rank, a.pid if a.pid and a.pid > 0 else None, a.gpu


def _replayed(rules, lines: list[str]) -> tuple[set[tuple], set[tuple]]:
    """(what fired, what is pending or firing at the end) when the lines are replayed."""
    last: dict[tuple, str] = {}
    fired = set()
    for e in replay_lines((x.encode() for x in lines), rules):
        last[_key(e)] = e.state
        if e.state == "firing":
            fired.add(_key(e))
    return fired, {(k, state) for k, state in last.items() if state != "resolved"}


def test_the_trace_replays_to_the_live_alerts(tmp_path):
    rules, live, lines, active, alerts = _run(tmp_path, history_points=720)
    assert {r[0] for r in live} == {"host_memory_leak", "idle_gpu"}
    assert _replayed(rules, lines) == (live, active)
    rows = [json.loads(x) for x in lines]
    procs = [r for r in rows if "kind" not in r]
    assert procs[0]["t"] == T0 and procs[-1]["t"] == T0 + 119  # the agents' time, to the last sample
    assert procs[0]["user"] == "alice" and procs[0]["command"] == "python" and "user" not in procs[1]
    assert all(r["gpu"] == "GPU-a" and r["gpu_index"] == 0 and r["gpu_mem_total_bytes"] == 16 * GiB
               and r["node_mem_total_bytes"] == NODE_RAM for r in procs)
    gpus = {(r["gpu"], r["job_id"], r["processes"]) for r in rows if r.get("kind") == "gpu"}
    assert gpus == {("GPU-a", "7", 1), ("GPU-b", "7", 0)}
    assert {r["every_s"] for r in rows if r.get("kind") == "node"} == {1.0}


def test_a_process_whose_oldest_samples_were_dropped_keeps_its_warm_up(tmp_path):
    rules, live, lines, active, alerts = _run(tmp_path, history_points=50)
    assert "host_memory_leak" in {r[0] for r in live}
    assert _replayed(rules, lines) == (live, active)
    # the first 70 polls are gone; a line without readings at the process's start opens it
    procs = [r for r in map(json.loads, lines) if "kind" not in r]
    assert procs[0] == {"t": START, "node": "n1", "job_id": "7", "pid": 101, "start_time": START, "gpu": "GPU-a",
                        "gpu_index": 0, "rank": 0, "user": "alice", "command": "python"}
    assert procs[1]["t"] == T0 + 70


def test_a_process_gone_ends_its_alerts_in_the_replay_as_in_the_collector(tmp_path):
    rules, live, lines, active, alerts = _run(tmp_path, history_points=720, rank_polls=100)
    assert {r[0] for r in live} == {"host_memory_leak", "idle_gpu"}
    assert "host_memory_leak" not in {k[0] for k, _ in active}  # it ended with its process
    assert _replayed(rules, lines) == (live, active)
    ends = [r for r in map(json.loads, lines) if r.get("kind") == "end"]
    assert ends == [{"kind": "end", "t": T0 + 100, "node": "n1", "pid": 101, "start_time": START}]


def test_a_host_leak_under_the_jobs_allocation_replays_against_it(tmp_path):
    rules, live, lines, active, alerts = _run(tmp_path, history_points=720, job_memory=4 * GiB)
    assert _replayed(rules, lines) == (live, active)
    (was,) = [a for a in alerts if a.rule == "host_memory_leak"]
    (now,) = [e for e in replay_lines((x.encode() for x in lines), rules)
              if e.rule == "host_memory_leak" and e.state == "firing"]
    assert "the job's memory allocation full in ~" in was.description, was.description
    assert "the job's memory allocation full in ~" in now.description, now.description
    # the room left under 4 GiB at 10 MiB/s (against the node's 64 GiB it would be some 6,000 s)
    room_s = (4 * GiB - now.figures["level_bytes"]) / (10 << 20)
    assert abs(now.figures["time_to_full_s"] - room_s) < 0.2 * room_s, (now.figures, room_s)


def test_the_history_holds_a_point_wherever_the_rules_look(tmp_path):
    """`record` writes the history: with the demo rules' 5 s leak buckets the rules look every 5/3 s, and a
    point every 5 s (the default step) leaves buckets empty in the trace (a replay missed both leaks in 2 runs
    of 4 of tests/e2e/test_record_replay.py); with the shipped rules' 60 s buckets the step stays 5 s."""
    from clusterwatch.collector.service import CollectorServer

    from tests.support.helpers import ROOT

    demo = CollectorServer(CollectorConfig(db_path=str(tmp_path / "a.db"),
                                           rules_path=str(ROOT / "collector" / "rules" / "demo_rules.toml")))
    assert demo.core.state.history_step_s == demo.alerting.min_interval_s == 5.0 / 3
    shipped = CollectorServer(CollectorConfig(db_path=str(tmp_path / "b.db")))
    assert shipped.core.state.history_step_s == shipped.alerting.min_interval_s == 5.0
