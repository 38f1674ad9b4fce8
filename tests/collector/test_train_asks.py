"""The collector's requests to training processes (collector/alerting/train_asks.py) and the checkpoint/stop alert
steps: answers kept in SQLite, taken only from the node and for the process asked, bounded; the steps ask the alert's
process, or every rank of a job-wide alert, and are never run on resolution."""
from __future__ import annotations

import asyncio
import sqlite3

from clusterwatch.collector.alerting.actions import Dispatcher
from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.train_asks import MAX_PAYLOAD, Target, TrainAsks, collective_args, targets
from clusterwatch.collector.rules.config import ActionsConfig, ActionStep, parse_rules
from clusterwatch.collector.rules.model import FIRING, RESOLVED, AlertEvent
from clusterwatch.v1 import agent_pb2, query_pb2


class Agents:
    """The agents' side of the outboxes: what was sent to which node; nodes not connected refuse."""

    def __init__(self, connected=("n1", "n2")) -> None:
        self.connected = set(connected)
        self.sent: list[tuple[str, agent_pb2.TrainRequest]] = []

    def __call__(self, node: str, req: agent_pb2.TrainRequest) -> bool:
        if node not in self.connected:
            return False
        self.sent.append((node, req))
        return True


def _answer(req: agent_pb2.TrainRequest, status: str = "done", **kw) -> agent_pb2.TrainAnswer:
    fields = {"id": req.id, "pid": req.pid, "start_time": req.start_time, "status": status, **kw}
    return agent_pb2.TrainAnswer(**fields)


def test_an_ask_waits_for_the_answers_and_keeps_them_and_a_silent_process_is_no_answer():
    agents = Agents()
    asks = TrainAsks(sqlite3.connect(":memory:"), agents, clock=lambda: 1000.0)
    chosen = [Target("n1", 11, 5.0, 0), Target("n2", 22, 6.0, 1), Target("n9", 33, 7.0, 2)]

    async def scenario():
        task = asyncio.ensure_future(asks.ask("j1", chosen, "checkpoint", "user alice", wait_s=0.5))
        await asyncio.sleep(0.05)
        (n1, r1), (_, r2) = agents.sent
        asks.on_answer(n1, _answer(r1, "accepted"))
        asks.on_answer(n1, _answer(r1, "done", message="saved"))
        return await task

    views = asyncio.run(scenario())
    assert [(v.rank, v.status) for v in views] == [(0, "done"), (1, "no_answer"), (2, "unreachable")]
    assert views[0].message == "saved" and views[0].asked_by == "user alice"
    assert "not connected" in views[2].message
    latest = asks.latest("j1")
    assert [v.status for v in latest] == ["done", "no_answer", "unreachable"] and not latest[0].payload
    # a late answer still lands, and shows as the latest
    asks.on_answer("n2", _answer(agents.sent[1][1], "done", message="late"))
    assert [v.message for v in asks.latest("j1")][1] == "late"


def test_answers_from_another_node_for_another_process_of_no_request_or_after_the_final_one_are_refused():
    agents = Agents()
    asks = TrainAsks(sqlite3.connect(":memory:"), agents)
    asks.send_to("j1", Target("n1", 11, 5.0, 0), "dump_stacks", "user alice")
    (_, req), = agents.sent
    asks.on_answer("n2", _answer(req))                                    # another node's agent
    asks.on_answer("n1", _answer(req, pid=12))                            # another pid
    forged = _answer(req)
    forged.start_time = 99.0                                              # a reused pid
    asks.on_answer("n1", forged)
    asks.on_answer("n1", agent_pb2.TrainAnswer(id="nope", pid=11, start_time=5.0, status="done"))
    asks.on_answer("n1", _answer(req, "rebooted"))                       # no agent says that
    assert asks.answers_refused == 5 and asks.latest("j1")[0].status == "sent"
    asks.on_answer("n1", _answer(req, payload="Thread 1 (idle)\n" + "é" * MAX_PAYLOAD))
    got = asks.latest("j1")[0]
    assert got.status == "done" and got.truncated
    stored = asks.conn.execute("SELECT payload FROM train_answers").fetchone()[0]
    assert len(stored.encode()) <= MAX_PAYLOAD
    asks.on_answer("n1", _answer(req, "failed"))                          # after the final one
    assert asks.answers_refused == 6 and asks.latest("j1")[0].status == "done"


def test_the_ranks_asked_are_the_live_ones_with_a_rank_or_every_live_process_when_none_has_one():
    view = query_pb2.JobView()
    view.processes.add(node="n1", pid=1, start_time=1.0, alive=True, rank=1)
    view.processes.add(node="n1", pid=2, start_time=1.0, alive=True, rank=0)
    view.processes.add(node="n1", pid=3, start_time=1.0, alive=False, rank=2)
    view.processes.add(node="n1", pid=4, start_time=1.0, alive=True)  # a data loader worker
    assert [t.pid for t in targets(view, None)] == [2, 1]
    assert [t.pid for t in targets(view, 1)] == [1] and targets(view, 2) == []
    bare = query_pb2.JobView()
    bare.processes.add(node="n1", pid=9, start_time=1.0, alive=True)
    assert [t.pid for t in targets(bare, None)] == [9]


def _event(state: str, pid: int = 11, **kw) -> AlertEvent:
    return AlertEvent(t=1.0, rule="gpu_memory_leak", state=state, severity="warning", node="n1" if pid >= 0 else "",
                      job_id="j1", pid=pid, start_time=5.0, description="leak", **kw)


def test_checkpoint_then_stop_steps_ask_the_alerts_process_in_turn_and_not_on_resolution():
    agents = Agents()
    asks = TrainAsks(sqlite3.connect(":memory:"), agents)
    config = ActionsConfig(steps=(ActionStep("checkpoint"), ActionStep("stop", after_s=600.0)))
    dispatcher = Dispatcher(AlertStore(sqlite3.connect(":memory:")), config)
    dispatcher.ask_train = asks.ask_for_alert
    dispatcher.process([_event(FIRING)], 1.0)
    assert [(n, r.pid, r.start_time, r.kind) for n, r in agents.sent] == [("n1", 11, 5.0, "checkpoint")]
    assert agents.sent[0][1].asked_by.startswith("alert ") and "gpu_memory_leak" in agents.sent[0][1].asked_by
    dispatcher.tick(300.0)
    assert len(agents.sent) == 1  # stop waits its 600 s
    dispatcher.tick(700.0)
    assert [r.kind for _, r in agents.sent] == ["checkpoint", "stop"]
    dispatcher.process([_event(RESOLVED)], 800.0)
    assert len(agents.sent) == 2


def test_a_job_wide_alert_asks_every_rank_of_its_job_to_save_at_one_step_ahead_of_all():
    agents = Agents()
    view = query_pb2.JobView()
    view.processes.add(node="n1", pid=1, start_time=1.0, alive=True, rank=0, step=1200, steps_per_s=2.0)
    view.processes.add(node="n2", pid=2, start_time=2.0, alive=True, rank=1, step=1198, steps_per_s=2.0)
    asks = TrainAsks(sqlite3.connect(":memory:"), agents, job_view=lambda job_id: view if job_id == "j1" else None)
    dispatcher = Dispatcher(AlertStore(sqlite3.connect(":memory:")), ActionsConfig(steps=(ActionStep("checkpoint"),)))
    dispatcher.ask_train = asks.ask_for_alert
    dispatcher.process([_event(FIRING, pid=-1)], 1.0)
    assert sorted((n, r.pid) for n, r in agents.sent) == [("n1", 1), ("n2", 2)]
    # saving is collective (FSDP, DeepSpeed): every rank is asked for the same step, past the furthest one
    assert [dict(r.args) for _, r in agents.sent] == [{"at_step": "1230"}] * 2
    assert collective_args([Target("n1", 1, 1.0, 0, step=5)], "checkpoint") == {}  # one rank: its next step
    assert collective_args([Target("n1", 1, 1.0, 0, step=5), Target("n1", 2, 1.0, 1)], "dump_stacks") == {}


def test_the_rules_file_takes_checkpoint_and_stop_steps():
    rules = parse_rules('[actions]\nsteps = [{action = "log"}, {action = "checkpoint", after_s = 600},'
                            ' {action = "stop", after_s = 1800}]\n')
    assert [s.action for s in rules.actions.steps] == ["log", "checkpoint", "stop"]
