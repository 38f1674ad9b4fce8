"""A stalled job's stacks taken once and kept with its alerts (collector/alerting/stall_stacks.py), through a real core,
the live rules and a real TrainAsks on the store: every rank of a hung job raises training_stall, the job is asked
once (one dump_stacks a rank, not one a rank per alert), each alert carries the grouped summary, the engine's
refreshes keep it, and an alert that fires again after a restart is not asked again. The summary is bounded."""
from __future__ import annotations

import time

from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.live import Alerting
from clusterwatch.collector.alerting.stall_stacks import MAX_LINES, summary_lines
from clusterwatch.collector.alerting.train_asks import TrainAsks
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.rules import parse_rules
from clusterwatch.collector.rules.model import FIRING, AlertEvent
from clusterwatch.collector.state.core import CollectorCore, new_cluster_state
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2, query_pb2

from clusterwatch.model import JobEvent, ProcessSample
from clusterwatch.wire import job_event_to_proto, processes_to_table

from .test_ingest_integrity import T0, Clock
from .test_train_asks import Agents

START = T0 - 50.0
RULES = "[training_stall]\nfor_s = 3\npending_after_s = 1\n"


def _dump(pid: int, function: str) -> str:
    return (f"Process {pid}: python train.py\nPython v3.11.4 (/usr/bin/python3.11)\n\n"
            f'Thread {pid} (idle): "MainThread"\n    {function} (train.py:12)\n    <module> (train.py:20)\n')


def _batch(seq: int, t: float, step: int) -> agent_pb2.Batch:
    b = agent_pb2.Batch(seq=seq, sent_at=t)
    ranks = [ProcessSample(t, "n1", 101 + r, START, ppid=1, uid=1000, user="alice", command="python", job_id="7",
                           rank=r, cpu_percent=90.0, rss_bytes=1 << 30, threads=8, open_fds=20) for r in (0, 1)]
    processes_to_table(ranks, b.processes)
    if seq == 1:
        job_event_to_proto(JobEvent("start", "7", START, uid=1000, user="alice"), b.job_events.add())
    for r in (0, 1):
        b.training.add(time=t, pid=101 + r, start_time=START, step=step)
    return b


def _collector(conn, rules_text: str = RULES):
    config = CollectorConfig(db_path=":memory:", history_points=100, history_step_s=1.0)
    state = new_cluster_state(config)
    alerting = Alerting(parse_rules(rules_text), state, AlertStore(conn), min_interval_s=1.0)
    clock = Clock()
    core = CollectorCore(config, Store(conn), state=state, clock=clock, listeners=[alerting], alerts=alerting)
    agents = Agents(connected=("n1",))
    asks = TrainAsks(conn, agents, job_view=lambda job_id: core.live_job_view(job_id, 2), clock=lambda: clock.now)
    alerting.dispatcher.ask_train = asks.ask_for_alert  # as the collector's service gives it
    core.hello(agent_pb2.Hello(node="n1", boot_id="b", agent_version="t", interval_s=1.0, send_interval_s=1.0))
    return core, clock, alerting, asks, agents


def _stall(core, clock, polls: int = 30) -> None:
    """Both ranks step for 15 s, then stop."""
    for i in range(polls):
        clock.now = T0 + i
        assert core.batch("n1", "b", _batch(i + 1, T0 + i, min(i, 15)))
        core.tick()


def _stalls(alerting) -> list:
    return [a for a in alerting.store.active(job_id="7") if a.rule == "training_stall" and a.state == FIRING]


def _wait_taken(alerting) -> list:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = _stalls(alerting)
        if got and all(a.figures.get("stacks_status") == "taken" for a in got):
            return got
        time.sleep(0.05)
    raise AssertionError(f"stacks not on the alerts: {[a.figures for a in _stalls(alerting)]}")


def test_a_hung_jobs_stacks_are_taken_once_and_every_ranks_alert_carries_them(tmp_path):
    conn = open_db(str(tmp_path / "cw.db"))
    core, clock, alerting, asks, agents = _collector(conn)
    _stall(core, clock)
    assert len(_stalls(alerting)) == 2
    # one request a rank for the job, asked by the first alert: not one a rank for each rank's alert
    assert sorted((r.pid, r.kind) for _, r in agents.sent) == [(101, "dump_stacks"), (102, "dump_stacks")]
    assert all(r.asked_by.startswith("alert ") and "training_stall" in r.asked_by for _, r in agents.sent)
    assert all(a.figures["stacks_status"] == "asked" and "; stacks: being taken" in a.description
               for a in _stalls(alerting))
    for _, req in agents.sent:
        asks.on_answer("n1", agent_pb2.TrainAnswer(id=req.id, pid=req.pid, start_time=req.start_time, status="done",
                                                   payload=_dump(req.pid, "blocked_in_all_reduce")))
    taken = _wait_taken(alerting)
    for a in taken:
        assert a.figures["stacks"] == ["ranks 0-1 in blocked_in_all_reduce at train.py:12"], a.figures
        assert a.description.endswith("; stacks: ranks 0-1 in blocked_in_all_reduce at train.py:12"), a.description
    # the engine's refreshes (every 10 s) bring the figures up to date and keep the stacks
    clock.now += 20
    alerting.refresh(clock.now)
    assert [a.figures.get("stacks") for a in _stalls(alerting)] == [taken[0].figures["stacks"]] * 2
    assert all(a.description.count("; stacks: ") == 1 for a in _stalls(alerting))
    # `alerts` and `status` read the description
    views = [v for v in alerting.alert_views("7") if v.rule == "training_stall"]
    assert len(views) == 2 and all("blocked_in_all_reduce" in v.description for v in views), views

    # a restarted collector whose engine raises the alert again asks nothing and keeps what the row holds
    core2, clock2, alerting2, asks2, agents2 = _collector(conn)
    a = _stalls(alerting2)[0]
    alerting2.handle([AlertEvent(t=clock.now, rule=a.rule, state=FIRING, severity=a.severity, node=a.node,
                                  job_id=a.job_id, pid=a.pid, start_time=a.start_time, rank=a.rank,
                                  description="Training of rank 0 stuck", figures={"step": 15})], clock.now)
    assert agents2.sent == []
    again = next(x for x in _stalls(alerting2) if x.key == a.key)
    assert again.figures["stacks"] == taken[0].figures["stacks"], again.figures
    assert again.description == "Training of rank 0 stuck; stacks: ranks 0-1 in blocked_in_all_reduce at train.py:12"


def test_ranks_that_do_not_answer_are_said_and_the_switch_turns_it_off(tmp_path):
    conn = open_db(str(tmp_path / "cw.db"))
    core, clock, alerting, asks, agents = _collector(conn)
    _stall(core, clock)
    first, second = agents.sent
    asks.on_answer("n1", agent_pb2.TrainAnswer(id=first[1].id, pid=first[1].pid, start_time=first[1].start_time,
                                               status="done", payload=_dump(first[1].pid, "wait_for_peer")))
    asks.on_answer("n1", agent_pb2.TrainAnswer(id=second[1].id, pid=second[1].pid, start_time=second[1].start_time,
                                               status="failed", message="py-spy: Permission denied"))
    [a, _] = _wait_taken(alerting)
    assert a.figures["stacks"] == ["rank 0 in wait_for_peer at train.py:12",
                                   "rank 1: no stacks: py-spy: Permission denied"], a.figures

    off = open_db(str(tmp_path / "off.db"))
    core, clock, alerting, asks, agents = _collector(off, RULES + "take_stacks = false\n")
    _stall(core, clock)
    assert len(_stalls(alerting)) == 2 and agents.sent == []
    assert all("stacks" not in a.figures and "stacks" not in a.description for a in _stalls(alerting))


def test_the_summary_is_bounded_and_one_line_each():
    answers = []
    for r in range(40):
        a = query_pb2.TrainAnswerView(pid=1000 + r, status="done", payload=_dump(1000 + r, f"f{r}\x1b[31m" + "x" * 300))
        a.rank = r
        answers.append(a)
    lines = summary_lines(answers)
    assert len(lines) == MAX_LINES + 1 and lines[-1] == f"... {40 - MAX_LINES} more"
    assert all(len(x) <= 200 and x.isprintable() for x in lines), lines
