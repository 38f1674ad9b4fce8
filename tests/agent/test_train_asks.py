"""The agent's side of requests back to a training process (agent/train_asks.py over a real TrainEndpoint):
a real process using clusterwatch.train, asked through the socket it reports from; its stacks read with
the real py-spy; hostile answers from a real process refused and counted."""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import time

import pytest
from clusterwatch.agent.train_asks import MAX_REPLY, TrainAsker, cut_stacks, py_spy_path
from clusterwatch.agent.train_endpoint import TrainEndpoint
from clusterwatch.v1 import agent_pb2

from tests.support.helpers import clean_environ, wait_for

TRAINER = r"""
import os, sys, threading, time
from clusterwatch import train
mode = sys.argv[1]

def checkpoint(request):
    return f"saved to /ckpt/step-{step} ({request.args.get('why', '')}, at_step {request.args.get('at_step')!r})"

train.on_request("checkpoint", checkpoint)

def blocked_in_collective():
    time.sleep(3600)   # a hung all_reduce never returns

print(os.getpid(), flush=True)
step = 0
while True:
    step += 1
    train.report(step=step)
    if mode == "stuck" and step == 10:
        blocked_in_collective()
    time.sleep(0.02)
"""

# A local process that writes answers of its own to the agent's socket: any user can.
HOSTILE = r"""
import json, socket, sys
path, ident = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("")
big = json.dumps({"v": 1, "reply": ident, "request": "checkpoint", "status": "done",
                  "message": "", "data": "x" * 70000}).encode()
for data in (big,
             b'{"v": 1, "reply": "' + ident.encode() + b'", "status": "done", "message": "\xff\xfe"}',
             json.dumps({"v": 1, "reply": ident, "request": "checkpoint", "status": "done",
                         "message": "forged: I am not the pid asked"}).encode()):
    s.sendto(data, path)
print("sent", flush=True)
"""


@pytest.fixture
def endpoint(tmp_path):
    ep = TrainEndpoint(str(tmp_path / "train.sock"))
    ep.start()
    yield ep
    ep.close()


@pytest.fixture
def trainer(tmp_path, endpoint):
    procs: list[subprocess.Popen] = []

    def start(mode: str) -> subprocess.Popen:
        script = tmp_path / "trainer.py"
        script.write_text(TRAINER)
        proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True,
                                env={**clean_environ(), "CLUSTERWATCH_TRAIN_SOCKET": endpoint.path})
        procs.append(proc)
        assert proc.stdout is not None and int(proc.stdout.readline()) == proc.pid
        return proc

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _start_time(pid: int) -> float | None:
    from clusterwatch.agent.provenance import process_start_time

    from clusterwatch.procfs import read_boot_time

    try:
        return process_start_time(pid, "/proc", read_boot_time("/proc"))
    except (OSError, ValueError):
        return None


def _reported(endpoint: TrainEndpoint, pid: int) -> float:
    start = _start_time(pid)
    assert start is not None
    wait_for(lambda: endpoint.reply_address(pid, start) is not None, what="a report from the trainer")
    return start


def _ask(asker: TrainAsker, kind: str, pid: int, start: float, ident: str = "r1", **args) -> queue.Queue:
    answers: queue.Queue = queue.Queue()
    asker(agent_pb2.TrainRequest(id=ident, pid=pid, start_time=start, kind=kind, asked_by="user test", args=args),
          answers.put)
    return answers


def _final(answers: queue.Queue, timeout: float = 20.0) -> agent_pb2.TrainAnswer:
    deadline = time.monotonic() + timeout
    while True:
        a = answers.get(timeout=max(0.1, deadline - time.monotonic()))
        if a.status != "accepted":
            return a


def test_a_checkpoint_request_reaches_the_handler_and_its_answer_comes_back(endpoint, trainer):
    proc = trainer("loop")
    start = _reported(endpoint, proc.pid)
    asker = TrainAsker(endpoint, _start_time, lambda pid: pid == proc.pid)
    answers = _ask(asker, "checkpoint", proc.pid, start, why="leak", at_step="120")
    first = answers.get(timeout=20)
    assert first.status == "accepted" and first.id == "r1"
    final = _final(answers)
    assert final.status == "done" and final.pid == proc.pid and final.start_time == start
    # a step number goes as the number the callbacks' at_step wants (clusterwatch/integrations/_progress.py)
    assert final.message.startswith("saved to /ckpt/step-") and "(leak, at_step 120)" in final.message
    # a request the process has no handler for is said so
    assert _final(_ask(asker, "stop", proc.pid, start, "r2")).status == "no_handler"


def test_a_process_not_watched_or_with_another_start_time_is_not_yours_and_one_never_reporting_unreachable(
        endpoint, trainer, tmp_path):
    proc = trainer("loop")
    start = _reported(endpoint, proc.pid)
    asker = TrainAsker(endpoint, _start_time, lambda pid: pid in (proc.pid, os.getpid()))
    assert _final(_ask(asker, "checkpoint", proc.pid, start - 100)).status == "not_yours"
    assert _final(_ask(asker, "checkpoint", 1, 0.0)).status == "not_yours"
    mine = _start_time(os.getpid())  # watched, alive, but it never reported
    silent = _final(_ask(asker, "checkpoint", os.getpid(), mine))
    assert silent.status == "unreachable" and "never reported" in silent.message
    assert _final(_ask(asker, "format_disk", proc.pid, start)).status == "refused"


def test_dump_stacks_of_a_process_stuck_in_a_function_names_it_read_with_py_spy(endpoint, trainer):
    assert py_spy_path() is not None, "py-spy is a dependency (pyproject.toml)"
    proc = trainer("stuck")
    start = _reported(endpoint, proc.pid)
    asker = TrainAsker(endpoint, _start_time, lambda pid: pid == proc.pid)
    time.sleep(0.5)  # past step 10: in blocked_in_collective
    final = _final(_ask(asker, "dump_stacks", proc.pid, start))
    assert final.status == "done" and "py-spy" in final.message, final
    assert "blocked_in_collective" in final.payload and f"Process {proc.pid}" in final.payload


def test_without_py_spy_a_reporting_process_answers_dump_stacks_itself(endpoint, trainer, tmp_path):
    proc = trainer("stuck")
    start = _reported(endpoint, proc.pid)
    asker = TrainAsker(endpoint, _start_time, lambda pid: pid == proc.pid, py_spy=str(tmp_path / "no-py-spy"))
    time.sleep(0.5)
    final = _final(_ask(asker, "dump_stacks", proc.pid, start))
    assert final.status == "done" and "blocked_in_collective" in final.payload, final


def test_hostile_answers_oversized_invalid_utf8_or_from_another_pid_are_refused_and_counted(
        endpoint, trainer, tmp_path):
    proc = trainer("stuck")  # asked, it accepts; its handler never runs (stuck): the answer stays open
    start = _reported(endpoint, proc.pid)
    asker = TrainAsker(endpoint, _start_time, lambda pid: pid == proc.pid)
    time.sleep(0.5)  # past step 10: stuck, no report() runs the handler
    answers = _ask(asker, "checkpoint", proc.pid, start, "victim")
    assert answers.get(timeout=20).status == "accepted"
    hostile = tmp_path / "hostile.py"
    hostile.write_text(HOSTILE)
    done = subprocess.run([sys.executable, str(hostile), endpoint.path, "victim"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: asker.answers_refused >= 3, timeout=10, what="three refusals")
    assert asker.answers_refused == 3
    assert answers.empty(), "a hostile answer was passed on"


def test_stacks_are_cut_at_a_thread_start_within_the_bound():
    text = "Process 1: python\n\n" + "".join(f"Thread {i} (idle)\n    f (a.py:{i})\n" for i in range(20000))
    cut, truncated = cut_stacks(text)
    assert truncated and len(cut.encode()) <= MAX_REPLY and cut.endswith("\n")
    assert cut_stacks("short") == ("short", False)


def test_a_report_with_a_metric_named_reply_is_still_a_report(endpoint):
    import socket

    TrainAsker(endpoint, _start_time, lambda pid: True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b'{"v":1,"m":{"reply":1.5}}', endpoint.path)
    reports = wait_for(endpoint.drain, timeout=10, what="the report")
    assert reports[0].metrics == {"reply": 1.5}
