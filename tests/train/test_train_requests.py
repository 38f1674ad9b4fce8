# ruff: noqa: F811  (pytest fixtures imported from tests/support/train_agent.py are parameters here)
"""Requests back to a training process: a real process using clusterwatch.train, and this test playing
the agent's part on a real socket (bound where the process reports to, reading its reports, answering
to the address they come from)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterwatch import train_requests as tr
from tests.support.train_agent import agent, sock_dir  # noqa: F401  (fixtures)

NOBODY = 65534

TRAINER = r"""
import os, sys, threading, time
from clusterwatch import train
mode = sys.argv[1]
state = {"step": 0, "checkpoints": 0}

def checkpoint(request):
    state["checkpoints"] += 1
    return (f"saved at step {state['step']} on {threading.current_thread().name}, "
            f"checkpoint {state['checkpoints']}, args {request.args}")

def nope(request):
    raise train.Refused("not while evaluating")

def fail(request):
    raise ValueError("disk full")

def stop(request):
    print("stopping", flush=True)
    sys.exit(0)

train.on_request("checkpoint", checkpoint)
train.on_request("nope", nope)
train.on_request("fail", fail)
train.on_request("gone", fail)
train.on_request("gone", None)
train.on_request("stop", stop)

def blocked_in_collective():
    threading.Event().wait()   # a hung all_reduce never returns

print(os.getpid(), flush=True)
while True:
    state["step"] += 1
    train.report(step=state["step"])
    if mode == "stuck" and state["step"] == 20:
        print("stuck", flush=True)
        blocked_in_collective()
    time.sleep(0.02)
"""

@pytest.fixture
def start(tmp_path, agent):
    procs: list[subprocess.Popen] = []

    def run(mode: str = "loop") -> tuple[subprocess.Popen, int]:
        script = tmp_path / "trainer.py"
        script.write_text(TRAINER)
        env = {**os.environ, "CLUSTERWATCH_TRAIN_SOCKET": agent.path}
        proc = subprocess.Popen([sys.executable, str(script), mode], env=env, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        agent.first_report()
        assert agent.sender_pid == pid
        return proc, pid

    yield run
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_checkpoint_runs_in_the_training_loop_and_is_answered(agent, start):
    _proc, pid = start()
    steps_before = len(agent.reports)
    agent.ask("checkpoint", "alert-7", pid, reason="gpu_memory_leak")
    got = agent.answers("alert-7")
    assert [r["status"] for r in got] == ["accepted", "done"]
    assert got[0]["message"] == "runs at the next clusterwatch.train.report()"
    done = got[1]
    assert done["request"] == "checkpoint"
    assert "on MainThread" in done["message"] and "args {'reason': 'gpu_memory_leak'}" in done["message"]
    step = int(done["message"].split("saved at step ")[1].split()[0])
    assert step >= steps_before  # ran inside a later report(), in the loop


@pytest.mark.parametrize("name, status, message", [
    ("nope", "refused", "not while evaluating"),
    ("fail", "failed", "ValueError: disk full"),
    ("gone", "no_handler", "this process has no handler for 'gone' (clusterwatch.train.on_request)"),
    ("memory_snapshot", "refused", "this process has no PyTorch using CUDA (torch is not imported or CUDA "
                                   "not initialised)"),  # the built-in handler, without torch
])
def test_every_outcome_is_answered(agent, start, name, status, message):
    proc, pid = start()
    agent.ask(name, "r1", pid)
    got = agent.answers("r1")
    assert (got[-1]["status"], got[-1]["message"]) == (status, message)
    agent.ask("checkpoint", "r2", pid)  # the loop goes on after a handler failed
    assert agent.answers("r2")[-1]["status"] == "done"
    assert proc.poll() is None


def test_stop_is_answered_before_the_process_exits(agent, start):
    proc, pid = start()
    agent.ask("stop", "s1", pid)
    got = agent.answers("s1")
    assert [r["status"] for r in got] == ["accepted", "done"]
    assert proc.wait(10) == 0


def test_dump_stacks_answers_while_the_main_thread_is_stuck(agent, start):
    proc, pid = start("stuck")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "stuck"
    agent.pump(0.5)
    reports_when_stuck = len(agent.reports)
    agent.ask("dump_stacks", "d1", pid)
    got = agent.answers("d1")
    assert [r["status"] for r in got] == ["done"]
    stacks = got[0]["data"]
    assert stacks.startswith(f"Process {pid}: ")
    main = stacks.split('"MainThread"\n', 1)[1].split("\nThread ")[0].splitlines()
    assert main[0].startswith("    wait (") and "threading.py:" in main[0]
    assert any(line.startswith("    blocked_in_collective (") and "trainer.py:" in line for line in main)
    assert "clusterwatch-train-requests" not in stacks  # the thread answering is not part of it
    agent.ask("checkpoint", "c1", pid)  # queued for a report() that never comes: said so
    assert [r["status"] for r in agent.answers("c1", timeout=2)] == ["accepted"]
    assert len(agent.reports) == reports_when_stuck


SPOOF = r"""
import json, socket, sys
address, pid, path = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
if path:
    s.bind(path)
s.sendto(json.dumps({"v": 1, "request": "checkpoint", "id": "spoof", "pid": pid}).encode(), address)
"""


def test_only_the_agent_may_ask(agent, start, sock_dir):
    _proc, pid = start()
    address = agent.address
    assert address is not None and address.startswith(b"\0")  # abstract: no file mode protects it
    other = sock_dir / "other"
    other.mkdir()
    other.chmod(0o777)
    spoofers = [
        {"user": NOBODY, "group": NOBODY, "extra_groups": [], "path": str(other / "nobody.sock")},  # another uid
        {"path": str(other / "same-uid.sock")},  # this uid, but not the agent's socket
        {"path": ""},  # this uid, unbound
    ]
    for spoof in spoofers:
        path = spoof.pop("path")
        subprocess.run(["/usr/bin/python3", "-c", SPOOF, address.hex(), str(pid), path], check=True,
                       timeout=30, **spoof)
    agent.ask("checkpoint", "other-pid", pid + 1)  # the agent's socket, but meant for another process
    refused = agent.answers("other-pid")
    assert [(r["status"], r["message"]) for r in refused] == [
        ("refused", f"the request names pid {pid + 1}, this is pid {pid}")]
    agent.ask("checkpoint", "real", pid)
    done = agent.answers("real")[-1]
    assert done["status"] == "done" and "checkpoint 1," in done["message"]  # no spoofed one ran
    assert not [r for r in agent.replies if r["reply"] == "spoof"]


# -- the pure parts -------------------------------------------------------------------------------

@pytest.mark.parametrize("data, error", [
    (b"not json", "not JSON"),
    (b'{"v": 2, "request": "checkpoint", "id": "a", "pid": 5}', "not a version-1 object"),
    (b'{"v": 1, "id": "a", "pid": 5}', "request is not a printable string of 1-64 characters"),
    (b'{"v": 1, "request": "checkpoint", "id": "a\\nb", "pid": 5}', "id is not a printable string"),
    (b'{"v": 1, "request": "checkpoint", "id": "a", "pid": "5"}', "the request names pid '5', this is pid 5"),
    (b'{"v": 1, "request": "checkpoint", "id": "a", "pid": 5, "args": []}', "args is not an object"),
    (b'{"v": 1, "request": "' + b"x" * 5000 + b'"}', "request too large"),
])
def test_malformed_requests_say_what_is_wrong(data, error):
    with pytest.raises(ValueError, match="^" + error.replace("(", r"\(").replace("'", "'")):
        tr.parse_request(data, 5)


def test_a_valid_request():
    assert tr.parse_request(b'{"v":1,"request":"checkpoint","id":"a-1","pid":5,"args":{"k":1}}', 5) == \
        tr.Request("checkpoint", "a-1", {"k": 1})


def test_a_large_stack_dump_is_cut_at_a_thread_and_says_so():
    threads = "".join(f"Thread {i} (idle): \"t{i}\"\n" + "    f (x.py:1)\n" * 200 for i in range(100))
    data = json.loads(tr.reply_datagram("d", "dump_stacks", "done", data="Process 1: x\n\n" + threads))
    assert len(tr.reply_datagram("d", "dump_stacks", "done", data="Process 1: x\n\n" + threads)) <= tr.MAX_REPLY
    assert data["truncated"] is True and data["data"].endswith("    f (x.py:1)\n")
    assert data["data"].count("Thread ") == data["data"].count('" \n') + data["data"].count('"\n')
    small = json.loads(tr.reply_datagram("d", "dump_stacks", "done", data="Process 1: x\n"))
    assert "truncated" not in small


def test_on_request_refuses_names_no_request_can_carry():
    from clusterwatch import train

    for name in ("", "x" * 65, "a\nb", "dump_stacks"):
        with pytest.raises(ValueError):
            train.on_request(name, lambda r: None)


def test_the_process_side_needs_only_the_standard_library():
    import ast

    for module in ("train_requests.py", "stacks.py", "train_provenance.py", "train_snapshot.py"):
        path = Path(tr.__file__).parent / module
        names = {a.name.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Import) for a in node.names}
        names |= {node.module.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
        assert names <= set(sys.stdlib_module_names) | {"clusterwatch"}, (module, names)
