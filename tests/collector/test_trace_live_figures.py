"""What the live rules read beyond a process's NVML figures, through a trace (collector/traces/record.py, replay.py):
the allocator's figures (issue 16: a leak of allocated tensors under a flat NVML figure, a reserve that levels
off), a GPU's power (a hung collective's cause) and the health findings a stall names as its cause. Each
through a real core and the live rules, then `record`'s lines replayed with the same rules: the same alerts,
the same cause."""
from __future__ import annotations

import json

from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.live import Alerting
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.state.core import CollectorCore, new_cluster_state
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.collector.traces.replay import replay_file, replay_lines
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, JobEvent, ProcessSample
from clusterwatch.wire import job_event_to_proto, processes_to_table

from .test_ingest_integrity import T0, Clock

MIB, GIB = 1 << 20, 1 << 30
CONTEXT = 500 * MIB  # the CUDA context: NVML's figure is it plus the allocator's reserve
START = T0 - 50.0


def _batch(seq: int, t: float, *, nvml: int, util: float = 90.0, power: float | None = None,
           step: int | None = None, allocator: tuple[int, int, int] | None = None,
           xid: int | None = None) -> agent_pb2.Batch:
    """One poll of n1: job 7's rank 0 (pid 101) on GPU-a with `nvml` bytes; its training report, if any."""
    b = agent_pb2.Batch(seq=seq, sent_at=t)
    rank = ProcessSample(t, "n1", 101, START, ppid=1, uid=1000, user="alice", command="python", job_id="7", rank=0,
                         cpu_percent=90.0, rss_bytes=GIB, threads=8, open_fds=20, gpus=(GpuUse("GPU-a", nvml, util),))
    processes_to_table([rank], b.processes)
    g = b.gpus.add(time=t, uuid="GPU-a", utilization=util, memory_used_bytes=nvml, memory_total_bytes=80 * GIB)
    if power is not None:
        g.power_watts = power
    if seq == 1:
        job_event_to_proto(JobEvent("start", "7", START, uid=1000, user="alice", gpu_uuids=("GPU-a",)),
                           b.job_events.add())
    if step is not None or allocator is not None:
        tr = b.training.add(time=t, pid=101, start_time=START)
        if step is not None:
            tr.step = step
        if allocator is not None:
            a = tr.gpu_memory.add(gpu_uuid="GPU-a")
            a.allocated_bytes, a.reserved_bytes, a.alloc_retries = allocator
    if xid is not None:
        b.health_events.add(time=t, uuid="GPU-a", kind="xid", xid=xid, pid=101, process="python", source=2,
                            kernel_boot_id="kb", kmsg_seq=seq, text="Graphics SM Warp Exception")
    return b


def _live(tmp_path, polls: int, every: float, poll, batch=_batch):
    """A core and the live (shipped) rules fed `polls` polls `every` s apart, poll(i, t) giving each batch's
    keywords; (the rules, the alerts that fired, the job's trace)."""
    rules = load_rules(None)
    config = CollectorConfig(db_path=str(tmp_path / "cw.db"), history_points=polls + 10, history_step_s=every)
    conn = open_db(config.db_path)
    state = new_cluster_state(config)
    alerting = Alerting(rules, state, AlertStore(conn), min_interval_s=every)
    clock = Clock()
    core = CollectorCore(config, Store(conn), state=state, clock=clock, listeners=[alerting], alerts=alerting,
                         health=alerting.health.engine)
    core.hello(agent_pb2.Hello(node="n1", boot_id="b", agent_version="t", interval_s=every, send_interval_s=every,
                               node_memory_total_bytes=64 * GIB,
                               gpus=[agent_pb2.GpuInfo(uuid="GPU-a", index=0, memory_total_bytes=80 * GIB)]))
    for i in range(polls):
        t = T0 + i * every
        clock.now = t
        assert core.batch("n1", "b", batch(i + 1, t, **poll(i, t)))
        core.tick()
    fired = [a for a in alerting.store.history(1000) if a.fired_at]
    found = core.job_trace("7")
    assert found is not None
    return rules, fired, found[0]


def _replayed(rules, lines: list[str]) -> list:
    return [e for e in replay_lines((x.encode() for x in lines), rules) if e.state == "firing"]


def test_allocated_tensors_growing_under_a_flat_nvml_figure_replay_as_the_allocators_leak(tmp_path):
    # the allocator reserved 20 GiB up front (NVML flat); live tensors grow 80 MiB/h inside it, 6 h at 30 s polls
    def poll(i, t):
        return {"nvml": CONTEXT + 20 * GIB, "step": i,
                "allocator": (4 * GIB + int(80 * MIB * (t - T0) / 3600), 20 * GIB, 0)}

    rules, live, lines = _live(tmp_path, 720, 30.0, poll)
    assert [(a.rule, a.figures.get("source")) for a in live] == [("gpu_memory_leak", "allocator")]
    procs = [r for r in map(json.loads, lines) if "kind" not in r and "gpu_mem_bytes" in r]
    assert all(r["gpu_reserved_bytes"] == 20 * GIB and r["gpu_alloc_retries"] == 0 for r in procs)
    assert procs[-1]["gpu_allocated_bytes"] > procs[0]["gpu_allocated_bytes"] + 400 * MIB
    [ev] = _replayed(rules, lines)
    assert ev.rule == "gpu_memory_leak" and ev.figures["source"] == "allocator", ev
    assert "allocated tensors grow" in ev.description and "the allocator's figure" in ev.description


def test_a_reserve_that_levels_off_replays_nothing_as_live(tmp_path):
    # allocated flat at 2 GiB; the reserve steps up 256 MiB every 10 min for 3 h, then stays: NVML's figure
    # alone reads as a leak, the allocator's say it is the cache
    def poll(i, t):
        reserved = 2 * GIB + min(int((t - T0) // 600), 18) * 256 * MIB
        return {"nvml": CONTEXT + reserved, "step": i, "allocator": (2 * GIB, reserved, 0)}

    rules, live, lines = _live(tmp_path, 960, 30.0, poll)
    assert live == []
    assert _replayed(rules, lines) == []


def test_a_hung_collective_replays_with_its_cause_from_the_gpus_power(tmp_path):
    # the rank steps every second for 200 s at 300 W, then hangs: its GPU spins at 95 % drawing 80 W
    def poll(i, t):
        return {"nvml": 4 * GIB, "util": 95.0, "power": 300.0 if i < 200 else 80.0,
                "step": i if i < 200 else None}

    rules, live, lines = _live(tmp_path, 700, 1.0, poll)
    [stall] = [a for a in live if a.rule == "training_stall"]
    assert stall.figures.get("cause") == "hung_collective", stall.description
    gpus = [r for r in map(json.loads, lines) if r.get("kind") == "gpu"]
    assert {r["power_watts"] for r in gpus} == {300.0, 80.0}
    [ev] = [e for e in _replayed(rules, lines) if e.rule == "training_stall"]
    assert ev.figures.get("cause") == "hung_collective", ev.description
    # the same cause, said the same way (the stored alert's duration is refreshed while it fires)
    assert ev.description.split("; likely cause: ")[1] == stall.description.split("; likely cause: ")[1]


def test_a_stall_after_an_xid_on_the_ranks_gpu_replays_naming_it(tmp_path, tmp_path_factory):
    # an XID 13 hits the rank's process at 150 s; it stops stepping at 200 s (its GPU's power steady: no hang)
    def poll(i, t):
        return {"nvml": 4 * GIB, "power": 300.0, "step": i if i < 200 else None, "xid": 13 if i == 150 else None}

    rules, live, lines = _live(tmp_path, 700, 1.0, poll)
    [stall] = [a for a in live if a.rule == "training_stall"]
    assert stall.figures.get("cause") == "gpu_health" and stall.figures.get("cause_xid") == 13, stall.description
    [ev] = [e for e in _replayed(rules, lines) if e.rule == "training_stall"]
    assert {k: v for k, v in ev.figures.items() if k.startswith("cause")} == \
        {k: v for k, v in stall.figures.items() if k.startswith("cause")}
    assert "likely cause: XID 13 on GPU 0 (GPU-a) of rank 0 on n1" in ev.description, ev.description


def test_a_parallel_replay_of_a_stall_gives_one_engines_cause(tmp_path):
    # two ranks of one job in a trace read by two processes: the GPU records (the power) go to the first, the
    # ranks to either; a stall's cause is the job's, so the replay falls back to one engine
    rules, live, lines = _live(tmp_path, 700, 1.0, lambda i, t: {
        "nvml": 4 * GIB, "util": 95.0, "power": 300.0 if i < 200 else 80.0, "step": i if i < 200 else None})
    mixed = []
    for x in lines:
        mixed.append(x)
        d = json.loads(x)
        if "kind" not in d:  # rank 1, the same readings on GPU-b
            mixed.append(json.dumps({**d, "pid": 202, "rank": 1, "gpu": "GPU-b"}))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(mixed) + "\n")

    def said(workers):
        return [(e.rule, e.state, e.pid, e.description, e.figures) for e in replay_file(path, rules, workers=workers)]

    one = said(1)
    assert any(rule == "training_stall" and pid == 101 and figures.get("cause") == "hung_collective"
               for rule, _, pid, _, figures in one), one
    two = said(2)
    assert two == one


def test_a_fault_after_the_prolog_before_the_first_process_is_the_stalls_cause_in_replay_too(tmp_path):
    # the prolog starts job 7 100 s before its process, and an XID hits GPU-a in between (read from the kernel
    # log at the agent's start); the rank stops stepping at 200 s. The collector reads a stall's causes from the
    # job's start, which only the trace's job record carries: its process lines start later.
    def poll(i, t):
        return {"nvml": 4 * GIB, "power": 300.0, "step": i if i < 200 else None}

    def batch(seq, t, **kw):
        b = _batch(seq, t, **kw)
        if seq == 1:
            b.job_events[0].time = START - 100
            b.health_events.add(time=START - 60, uuid="GPU-a", kind="xid", xid=13, source=2, kernel_boot_id="kb",
                                kmsg_seq=1, text="Graphics SM Warp Exception")
        return b

    rules, live, lines = _live(tmp_path, 700, 1.0, poll, batch=batch)
    [stall] = [a for a in live if a.rule == "training_stall"]
    assert stall.figures.get("cause_xid") == 13, stall.description
    job = json.loads(lines[0])
    assert job == {"kind": "job", "t": job["t"], "job_id": "7", "start_time": START - 100,
                   "gpus": [{"node": "n1", "gpu": "GPU-a", "index": 0, "allocated": True}]}
    [ev] = [e for e in _replayed(rules, lines) if e.rule == "training_stall"]
    assert {k: v for k, v in ev.figures.items() if k.startswith("cause")} == \
        {k: v for k, v in stall.figures.items() if k.startswith("cause")}, ev.description
    # without the job record (a hand-written trace) the start is the first process's: the XID is before it
    [old] = [e for e in _replayed(rules, lines[1:]) if e.rule == "training_stall"]
    assert "cause_xid" not in old.figures, old.description


def test_a_job_counting_tokens_replays_in_tokens_as_live(tmp_path):
    # 2 steps/s of 1,000 tokens for 90 min, then the batch doubles: 1 step/s of 2,000 tokens. Live, job_slowdown
    # judges tokens/s and raises nothing; the trace carries the counts, so its replay judges them too
    def poll(i, t):
        return {"nvml": 4 * GIB, "power": 300.0, "step": _steps_at(i)}

    def batch(seq, t, **kw):
        b = _batch(seq, t, **kw)
        b.training[0].metrics["tokens"] = _tokens_at(seq - 1)
        return b

    rules, live, lines = _live(tmp_path, 1800, 5.0, poll, batch=batch)
    assert [a for a in live if a.rule == "job_slowdown"] == []
    rows = [json.loads(x) for x in lines if '"kind"' not in x]
    assert rows[-1]["tokens"] == _tokens_at(1799) and all("tokens" in r for r in rows[1:]), rows[-1]
    assert [e for e in _replayed(rules, lines) if e.rule == "job_slowdown"] == []
    # what the counts spare it: the same trace without them is judged in steps/s, which halved
    bare = [json.dumps({k: v for k, v in json.loads(x).items() if k != "tokens"}) for x in lines]
    assert [e.rule for e in _replayed(rules, bare)] == ["job_slowdown"]


def _steps_at(i: int) -> int:
    """The step of the poll i (every 5 s): 10 a poll for 90 minutes, then 5 (a batch twice as large)."""
    return 10 * i if i < 1080 else 10 * 1080 + 5 * (i - 1080)


def _tokens_at(i: int) -> float:
    """The tokens trained on by the poll i: 1,000 a step, then 2,000 (the same 2,000 a second throughout)."""
    return 1000.0 * _steps_at(i) if i < 1080 else 1000.0 * 10 * 1080 + 2000.0 * 5 * (i - 1080)
