# ruff: noqa: F811  (pytest fixtures imported from tests/support/train_agent.py are parameters here)
"""The ready callbacks honour checkpoint and stop: in a real process, asked by a socket playing the agent,
with objects shaped like the frameworks' (transformers' TrainerState/TrainerControl, a Lightning Trainer)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from clusterwatch import train
from clusterwatch.integrations._progress import StepRequests
from tests.support.train_agent import agent, sock_dir  # noqa: F401  (fixtures)

RUN = r"""
import json, sys, time, types
from clusterwatch import train
from clusterwatch.integrations._progress import HFReporter, LightningReporter
kind = sys.argv[1]
events = []
print("ready", flush=True)

class Control:
    should_save = False
    should_training_stop = False

class Trainer:
    global_step, current_epoch, log_every_n_steps, default_root_dir = 0, 0, 50, "/ckpt"
    callback_metrics, optimizers, should_stop = {}, [], False
    def save_checkpoint(self, path):
        events.append(["save", self.global_step, path])

cb = HFReporter() if kind == "hf" else LightningReporter()
pl = Trainer()
for step in range(1, 100000):
    if kind == "hf":
        control = Control()
        cb.on_step_end(None, types.SimpleNamespace(global_step=step, epoch=0.0), control)
        if control.should_save:
            events.append(["save", step])
        if control.should_training_stop:
            events.append(["stop", step])
            break
    else:
        pl.global_step = step
        cb.on_train_batch_end(pl, None, None, None, step)
        if pl.should_stop:
            events.append(["stop", step])
            break
    time.sleep(0.02)
print(json.dumps(events), flush=True)
"""


@pytest.mark.parametrize("kind", ["hf", "lightning"])
def test_checkpoint_at_a_step_then_stop(agent, kind):  # noqa: F811
    proc = subprocess.Popen([sys.executable, "-c", RUN, kind], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, train.SOCKET_ENV: agent.path})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        agent.first_report()
        pid = agent.sender_pid
        assert pid is not None
        now = max(r.get("step", 0) for r in agent.reports)
        agent.ask("checkpoint", "past", pid, at_step=0)
        assert agent.answers("past")[-1]["status"] == "refused"
        target = now + 15
        agent.checkpoint_then_stop(pid, target)
        out = proc.stdout.readline()
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = json.loads(out)
    saves = [e for e in events if e[0] == "save"]
    assert saves[0][1] == target  # the armed step, not the step the request arrived at
    if kind == "lightning":
        assert saves[0][2] == f"/ckpt/clusterwatch/step-{target}.ckpt"
    stop_step = events[-1][1]
    assert events[-1][0] == "stop" and saves[-1][1] == stop_step  # stop saves first, at the same step


def test_step_requests_arm_refuse_and_clear():
    r = StepRequests(register=False)
    r.step = 10
    assert r.on_checkpoint(train.Request("checkpoint", "a")) == "the trainer saves at the end of step 10"
    assert r.due(10) == (True, False) and r.due(10) == (False, False)
    r.on_stop(train.Request("stop", "b", {"at_step": 12}))
    assert r.due(11) == (False, False) and r.due(12) == (True, True)
    for bad, why in ((9, "this rank is at step 10, past step 9"), ("12", "at_step must be a step number"),
                     (True, "at_step must be a step number")):
        with pytest.raises(train.Refused, match=why):
            r.on_checkpoint(train.Request("checkpoint", "c", {"at_step": bad}))
