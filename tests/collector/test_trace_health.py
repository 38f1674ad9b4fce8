"""GPU health records in the trace (collector/traces/record.py, collector/traces/replay.py), through a real core and
the live health rules: what `record` writes of a job's GPUs (XIDs with their pid and process, ECC, a lost GPU,
throttling, a kernel-log XID read at the agent's start) replays to the health alerts the collector raised; and the
records themselves, hostile process names included, round-trip safely."""
from __future__ import annotations

import json

import orjson
from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.live import Alerting
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.health.engine import HEALTH_RULES, HISTORY_READINGS
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.state.core import CollectorCore, new_cluster_state
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.collector.traces.record import gpu_health_record, health_event_record
from clusterwatch.collector.traces.replay import ReplayStats, replay_file, replay_lines
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, JobEvent, ProcessSample
from clusterwatch.wire import job_event_to_proto, processes_to_table

from .test_ingest_integrity import T0, Clock

GiB = 1 << 30
START = T0 - 50.0
POLLS = 400
HOSTILE = 'evil\nname "pid":9 \x1b[31m\\u2028\u2028'   # newline, a quote, an escape, a JSON escape's text


def _batch(seq: int, t: float) -> agent_pb2.Batch:
    """One poll of node n1: job 7's rank 0 (pid 101) on GPU-a, rank 1 (pid 102) on GPU-b; the health records
    the agent would send with it."""
    b = agent_pb2.Batch(seq=seq, sent_at=t)
    ranks = [ProcessSample(t, "n1", 101 + r, START, ppid=1, uid=1000, user="alice", command=cmd, job_id="7",
                           rank=r, cpu_percent=90.0, rss_bytes=GiB, threads=8, open_fds=20,
                           gpus=(GpuUse(uuid, 2 * GiB, 85.0),))
             for r, (uuid, cmd) in enumerate((("GPU-a", "python"), ("GPU-b", HOSTILE)))]
    processes_to_table(ranks, b.processes)
    for uuid in ("GPU-a", "GPU-b"):
        b.gpus.add(time=t, uuid=uuid, utilization=85.0, memory_used_bytes=2 * GiB, memory_total_bytes=16 * GiB)
    i = seq - 1
    if i == 0:
        job_event_to_proto(JobEvent("start", "7", START, uid=1000, user="alice", gpu_uuids=("GPU-a", "GPU-b")),
                           b.job_events.add())
        # the kernel log read at the agent's start: an XID of rank 0's process from before the first poll
        b.health_events.add(time=T0 - 20, uuid="GPU-a", kind="xid", xid=31, pid=101, process="python", source=2,
                            kernel_boot_id="kb", kmsg_seq=7, text="MMU Fault")
    if i == 50:   # an application XID naming rank 1's process, by its hostile name
        b.health_events.add(time=t, uuid="GPU-b", kind="xid", xid=13, pid=102, process=HOSTILE, source=2,
                            kernel_boot_id="kb", kmsg_seq=8, text="Graphics SM Warp Exception")
    if i == 100:  # a double-bit ECC error on GPU-a, then the counters that count it
        b.health_events.add(time=t, uuid="GPU-a", kind="ecc_double_bit", source=1)
    if i == 200:  # GPU-a falls off the bus
        b.health_events.add(time=t, uuid="GPU-a", kind="xid", xid=79, source=2, kernel_boot_id="kb", kmsg_seq=9,
                            text="GPU has fallen off the bus.")
    if i % 10 == 0:
        for uuid in ("GPU-a", "GPU-b"):
            h = b.gpu_health.add(time=t, uuid=uuid, temperature_c=60, ecc_corrected_volatile=1)
            h.ecc_uncorrected_volatile = 2 if uuid == "GPU-a" and i >= 110 else 0
            h.clock_event_reasons = 0x40 if uuid == "GPU-b" else 0x1   # GPU-b hardware-thermal throttled
            h.violation_seconds["thermal"] = float(i)
            if uuid == "GPU-b":   # its PCIe link degrades: 100 replays between readings from the 300th poll
                h.pcie_replays = max(0, i - 290) * 10
    return b


def _live(tmp_path, batch=_batch, polls: int = POLLS):
    """(what the live health rules fired, the job's trace)."""
    rules = load_rules(None)
    config = CollectorConfig(db_path=str(tmp_path / "cw.db"), history_points=720, history_step_s=1.0)
    conn = open_db(config.db_path)
    state = new_cluster_state(config)
    alerting = Alerting(rules, state, AlertStore(conn), min_interval_s=1.0)
    clock = Clock()
    core = CollectorCore(config, Store(conn), state=state, clock=clock, listeners=[alerting], alerts=alerting,
                         health=alerting.health.engine)
    core.hello(agent_pb2.Hello(node="n1", boot_id="b", agent_version="t", interval_s=1.0, send_interval_s=1.0,
                               node_memory_total_bytes=64 * GiB,
                               gpus=[agent_pb2.GpuInfo(uuid="GPU-a", index=0, memory_total_bytes=16 * GiB),
                                     agent_pb2.GpuInfo(uuid="GPU-b", index=1, memory_total_bytes=16 * GiB)]))
    for i in range(polls):
        clock.now = T0 + i
        assert core.batch("n1", "b", batch(i + 1, T0 + i))
        core.tick()
    fired = {_key(a): a.description for a in alerting.store.history(1000) if a.fired_at and a.rule in HEALTH_RULES}
    found = core.job_trace("7")
    assert found is not None
    return rules, fired, found[0]


def _key(a) -> tuple:
    return a.rule, a.job_id, a.node, a.rank, a.pid if a.pid and a.pid > 0 else None, a.gpu


def _replayed(rules, lines: list[str]) -> dict[tuple, str]:
    return {_key(e): e.description for e in replay_lines((x.encode() for x in lines), rules)
            if e.state == "firing" and e.rule in HEALTH_RULES}


def test_the_health_records_replay_to_the_live_health_alerts(tmp_path):
    rules, live, lines = _live(tmp_path)
    assert set(live) == {
        ("gpu_xid", "7", "n1", 0, 101, "GPU-a"),        # the kernel log's, from before the first poll
        ("gpu_xid", "7", "n1", 1, 102, "GPU-b"),        # XID 13, naming the process
        ("gpu_memory_errors", "7", "n1", 0, None, "GPU-a"),
        ("gpu_lost", "7", "n1", 0, None, "GPU-a"),
        ("gpu_throttle", "7", "n1", 1, None, "GPU-b"),
        ("gpu_link_errors", "7", "n1", 1, None, "GPU-b"),
    }, live
    assert _replayed(rules, lines) == live
    assert HOSTILE in live[("gpu_xid", "7", "n1", 1, 102, "GPU-b")]
    rows = [json.loads(x) for x in lines]
    events = [r for r in rows if r.get("kind") == "health_event"]
    assert [(r["event"], r.get("xid")) for r in events] == [("xid", 31), ("xid", 13), ("ecc_double_bit", None),
                                                            ("xid", 79)]
    # read at the agent's start: placed at the node's first line, its own time kept
    assert events[0]["t"] == T0 and events[0]["event_t"] == T0 - 20 and events[0]["hit_pid"] == 101
    assert events[1] == {"kind": "health_event", "t": T0 + 50, "node": "n1", "gpu": "GPU-b", "event": "xid",
                         "xid": 13, "hit_pid": 102, "process": HOSTILE, "source": "kmsg",
                         "text": "Graphics SM Warp Exception",
                         "users": [{"job_id": "7", "rank": 1, "process_id": 102, "process": HOSTILE,
                                    "start_time": START}]}   # whom the collector named
    readings = [r for r in rows if r.get("kind") == "gpu_health"]
    assert len(readings) == 2 * POLLS // 10
    assert readings[-1] == {"kind": "gpu_health", "t": T0 + 390, "node": "n1", "gpu": "GPU-b",
                            "ecc_corrected_volatile": 1, "ecc_uncorrected_volatile": 0, "clock_event_reasons": 0x40,
                            "temperature_c": 60, "pcie_replays": 1000,
                            "violation_seconds": {"thermal": 390.0}}   # job_slowdown's held-down share
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)


def test_the_records_carry_the_gpu_users_the_collector_named(tmp_path):
    _, _, lines = _live(tmp_path)
    rows = [json.loads(x) for x in lines]
    rank = {"GPU-a": (0, 101, "python"), "GPU-b": (1, 102, HOSTILE)}
    # every event names its GPU's rank; a reading only where it raised a finding: GPU-a's ECC errors counted
    # (gpu_memory_errors), GPU-b throttled for the rule's window and its link replaying (both at its 300th poll)
    named = [(r["kind"], r["t"], r["gpu"]) for r in rows if "users" in r]
    assert [n for n in named if n[0] == "gpu_health"] == [("gpu_health", T0 + 110, "GPU-a"),
                                                          ("gpu_health", T0 + 300, "GPU-b")], named
    assert sum(n[0] == "health_event" for n in named) == 4
    for r in rows:
        if "users" in r:
            (user,) = r["users"]
            assert (user["job_id"], user["rank"], user["process_id"], user["process"], user["start_time"]) == (
                "7", *rank[r["gpu"]], START), r
    assert all('"pid":' not in x for x in lines if '"kind":"health_' in x or '"kind":"gpu_health"' in x)


def test_replay_names_the_users_a_record_carries_and_an_older_record_the_traces():
    proc = {"t": T0, "node": "n1", "pid": 7, "start_time": T0 - 5, "job_id": "9", "rank": 2, "gpu": "GPU-a",
            "gpu_util": 90.0}
    lost = {"kind": "health_event", "t": T0 + 1, "node": "n1", "gpu": "GPU-a", "event": "xid", "xid": 79,
            "source": "kmsg"}

    def replayed(*records: dict) -> list[tuple]:
        lines = [json.dumps(x).encode() for x in (proc, *records)]
        return [(e.rule, e.job_id, e.rank) for e in replay_lines(lines, load_rules(None)) if e.rule == "gpu_lost"]

    # a trace from before records named users: the process lines say who was on the GPU
    assert replayed(lost) == [("gpu_lost", "9", 2)]
    # a record that names users: those, whatever the process lines say (here: a rank they do not show)
    other = {"job_id": "11", "rank": 5, "process_id": 8, "process": "python", "start_time": T0 - 9}
    assert replayed({**lost, "users": [other]}) == [("gpu_lost", "11", 5)]
    # the collector named no one (the process had not reached the GPU yet): no one
    assert replayed({**lost, "users": []}) == [("gpu_lost", "", None)]
    # a throttled GPU's readings: without users (an older trace's) the trace's rank; the reading that raised
    # gpu_throttle naming users, those
    hot = [{"kind": "gpu_health", "t": T0 + 30 * i, "node": "n1", "gpu": "GPU-a", "clock_event_reasons": 0x40}
           for i in range(12)]

    def throttled(readings: list[dict]) -> list[tuple]:
        lines = [json.dumps(x).encode() for x in (proc, *readings)]
        return [(e.t, e.job_id, e.rank) for e in replay_lines(lines, load_rules(None)) if e.rule == "gpu_throttle"]

    ((t, *who),) = throttled(hot)
    assert who == ["9", 2]
    assert throttled([{**r, "users": [other]} if r["t"] == t else r for r in hot]) == [(t, "11", 5)]
    st = ReplayStats()
    bad = [{**lost, "users": "alice"}, {**lost, "users": [{"rank": 1}]},
           {**lost, "users": [{"job_id": "9", "rank": "2"}]}, {**lost, "users": [["9", 2]]}]
    assert list(replay_lines([json.dumps(x).encode() for x in bad], load_rules(None), st)) == []
    assert st.bad_lines == 4, st.first_bad


def _counted_before_the_first_poll(seq: int, t: float) -> agent_pb2.Batch:
    """`_batch`, but GPU-a counts uncorrected ECC errors from the agent's start, and its health thread read
    them 0.3 s before the first poll's time: the reading comes in the first batch, older than its samples."""
    b = _batch(seq, t)
    del b.health_events[:], b.gpu_health[:]
    if seq == 1:
        b.gpu_health.add(time=t - 0.3, uuid="GPU-a", ecc_uncorrected_volatile=2)
    return b


def test_a_reading_older_than_the_first_samples_names_the_job_in_replay_as_live(tmp_path):
    rules, live, lines = _live(tmp_path, _counted_before_the_first_poll, polls=20)
    assert set(live) == {("gpu_memory_errors", "7", "n1", 0, None, "GPU-a")}, live
    assert _replayed(rules, lines) == live
    readings = [r for r in map(json.loads, lines) if r.get("kind") == "gpu_health"]
    assert [r["t"] for r in readings] == [T0]   # placed at the node's first process line, after it


def test_without_the_health_records_the_replay_raises_none_of_them(tmp_path):
    # what the trace held before it carried health records: the replay could not raise these
    rules, live, lines = _live(tmp_path)
    bare = [x for x in lines if '"kind":"health_event"' not in x and '"kind":"gpu_health"' not in x]
    assert len(bare) < len(lines) and _replayed(rules, bare) == {}


def test_a_parallel_replay_of_a_trace_with_health_records_gives_one_engines_output(tmp_path):
    rules, live, lines = _live(tmp_path)
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(x + "\n" for x in lines))
    one = [e.to_dict() for e in replay_file(path, rules, workers=1)]
    st = ReplayStats()
    two = [e.to_dict() for e in replay_file(path, rules, st, workers=2)]
    assert one == two and st.health == sum(1 for x in lines if '"kind":"health_event"' in x or "gpu_health" in x)
    assert {e["rule"] for e in one} >= set(HEALTH_RULES)


def test_hostile_names_in_an_xid_record_round_trip_as_one_line():
    msg = agent_pb2.HealthEvent(time=T0, uuid="GPU-x", kind="xid", xid=13, pid=4242, process=HOSTILE,
                                text='line one\nline two "pid":1 \\', source=2, pci="0000:3b:00")
    line = json.dumps(health_event_record("n\n1", msg, T0), separators=(",", ":"))
    assert "\n" not in line and "\u2028" not in line and '"pid":' not in line   # one line; a parallel replay's
    back = orjson.loads(line)                                                     # reader 0 gets it
    assert back["process"] == HOSTILE and back["text"] == msg.text and back["node"] == "n\n1"
    proc = json.dumps({"t": T0, "node": "n\n1", "pid": 4242, "start_time": T0 - 5, "job_id": "9", "rank": 2,
                       "gpu": "GPU-x", "command": HOSTILE, "gpu_util": 90.0})
    (ev,) = replay_lines([proc.encode(), line.encode()], load_rules(None))
    assert ev.rule == "gpu_xid" and ev.job_id == "9" and ev.rank == 2 and ev.pid == 4242
    assert f"process {HOSTILE} (pid 4242)" in ev.description


def test_counter_records_keep_only_what_the_gpu_gave_and_bad_ones_are_counted():
    msg = agent_pb2.GpuHealth(time=T0, uuid="GPU-x", remapped_rows_pending=True, retired_pages_dbe=3)
    rec = gpu_health_record("n1", msg)
    assert rec == {"kind": "gpu_health", "t": T0, "node": "n1", "gpu": "GPU-x", "remapped_rows_pending": True,
                   "retired_pages_dbe": 3}
    st = ReplayStats()
    bad = [b'{"kind":"gpu_health","t":1,"node":"n1","gpu":"G","ecc_uncorrected_volatile":-3}',
           b'{"kind":"gpu_health","t":1,"node":"n1","gpu":"G","temperature_c":"hot"}',
           b'{"kind":"health_event","t":1,"node":"n1","gpu":"G"}',
           b'{"kind":"health_event","t":1,"node":"n1","gpu":"G","event":"xid","xid":"79"}']
    assert list(replay_lines(bad, load_rules(None), st)) == [] and st.bad_lines == 4, st.first_bad


def test_the_engine_keeps_a_bounded_history_per_gpu():
    from clusterwatch.collector.health.engine import HealthEngine
    from clusterwatch.collector.health.xid_catalog import load_catalog

    eng = HealthEngine(load_catalog())
    for i in range(HISTORY_READINGS + 50):
        eng.observe_counters("n1", agent_pb2.GpuHealth(time=T0 + i, uuid="GPU-x", temperature_c=50), [])
    view = eng.gpus[("n1", "GPU-x")]
    kept = view.history_readings()
    assert len(kept) == HISTORY_READINGS and kept[0][0] == T0 + 50
    assert len({id(body) for body in view.readings}) == 1     # the same counters share one body


def test_process_lines_whose_gpu_is_no_name_leave_a_health_event_its_users():
    # a hostile or broken trace: a GPU that is a list or an object, beside a real rank on GPU-a
    lines = [json.dumps({"t": T0, "node": "n1", "pid": 5, "job_id": "9", "rank": 0, "gpu": ["GPU-a"]}),
             json.dumps({"t": T0, "node": "n1", "pid": 6, "job_id": "9", "rank": 1, "gpu": {"GPU-a": 1}}),
             json.dumps({"t": T0 + 1, "node": "n1", "pid": 7, "job_id": "9", "rank": 2, "gpu": "GPU-a"}),
             json.dumps({"kind": "health_event", "t": T0 + 2, "node": "n1", "gpu": "GPU-a", "event": "xid",
                         "xid": 79, "source": "kmsg"})]
    stats = ReplayStats()
    events = list(replay_lines((x.encode() for x in lines), load_rules(None), stats))
    assert [(e.rule, e.job_id, e.rank) for e in events] == [("gpu_lost", "9", 2)]
    assert stats.bad_lines == 0 and stats.health == 1


def _replaying_link(seq: int, t: float) -> agent_pb2.Batch:
    """`_batch`'s job, GPU-b's PCIe link replaying 50 times between readings (every 10 s) from the 40th poll."""
    b = _batch(seq, t)
    del b.health_events[:], b.gpu_health[:]
    i = seq - 1
    if i % 10 == 0:
        h = b.gpu_health.add(time=t, uuid="GPU-b", pcie_replays=max(0, i - 30) * 5)
        h.nvlink_errors["replay"], h.nvlink_errors["crc_flit"] = 4, 100
    return b


def test_a_degraded_link_replays_to_the_live_alert_its_counters_in_the_trace(tmp_path):
    rules, live, lines = _live(tmp_path, _replaying_link, polls=80)
    assert set(live) == {("gpu_link_errors", "7", "n1", 1, None, "GPU-b")}, live
    assert "50 PCIe replays in 10 s" in live[("gpu_link_errors", "7", "n1", 1, None, "GPU-b")]
    assert _replayed(rules, lines) == live
    [reading] = [r for r in map(json.loads, lines) if r.get("kind") == "gpu_health"][-1:]
    assert (reading["pcie_replays"], reading["nvlink_errors"]) == (200, {"crc_flit": 100, "replay": 4})


def test_the_violation_time_is_kept_at_its_changes_and_a_record_carries_it_back():
    """job_slowdown's culprit reads NVML's violation time: the engine keeps it with the link counters (a new
    value only when it moves), `record` writes it and `replay` reads it back; a hostile value is a bad line."""
    from clusterwatch.collector.health.engine import HealthEngine
    from clusterwatch.collector.health.xid_catalog import load_catalog

    eng = HealthEngine(load_catalog())
    for i in range(10):  # held down from the 6th reading on, 0.8 s a second
        msg = agent_pb2.GpuHealth(time=T0 + i, uuid="GPU-x", temperature_c=50)
        msg.violation_seconds["thermal"] = 0.8 * max(0, i - 5)
        msg.violation_seconds["sync_boost"] = 1.0 * i  # a policy no rule reads: not kept
        eng.observe_counters("n1", msg, [])
    view = eng.gpus[("n1", "GPU-x")]
    assert len(view.violations.times) == 5 and list(view.link_values) == [b""]  # the flat run once, then each move
    kept = [agent_pb2.GpuHealth.FromString(body) for _, body in view.history_readings()]
    assert [dict(k.violation_seconds) for k in kept] == [{"thermal": 0.8 * max(0, i - 5)} for i in range(10)]
    last = kept[-1]
    last.time, last.uuid = T0 + 9, "GPU-x"
    rec = gpu_health_record("n1", last)
    assert rec["violation_seconds"] == {"thermal": 0.8 * 4} and rec["temperature_c"] == 50
    st = ReplayStats()
    good = orjson.dumps(rec)
    bad = b'{"kind":"gpu_health","t":1,"node":"n1","gpu":"G","violation_seconds":{"thermal":"long"}}'
    assert list(replay_lines([good, bad], load_rules(None), st)) == [] and st.bad_lines == 1, st.first_bad


def test_the_violation_history_is_bounded_and_covers_every_reading_kept():
    from clusterwatch.collector.health.engine import HealthEngine
    from clusterwatch.collector.health.xid_catalog import load_catalog

    eng = HealthEngine(load_catalog())
    n = 3 * HISTORY_READINGS
    for i in range(n):  # capped all along, then flat for the last 100 readings
        msg = agent_pb2.GpuHealth(time=T0 + i, uuid="GPU-x", temperature_c=50)
        msg.violation_seconds["power"] = float(min(i, n - 100))
        eng.observe_counters("n1", msg, [])
    view = eng.gpus[("n1", "GPU-x")]
    assert len(view.violations.times) <= HISTORY_READINGS + max(8, HISTORY_READINGS // 8)
    kept = [(t, agent_pb2.GpuHealth.FromString(body)) for t, body in view.history_readings()]
    assert [dict(k.violation_seconds) for _, k in kept] == [{"power": float(min(t - T0, n - 100))} for t, _ in kept]
