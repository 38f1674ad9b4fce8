# ruff: noqa: F811  (pytest fixtures imported from tests/support/train_agent.py are parameters here)
"""The Hugging Face callback inside transformers' own machinery: its real TrainingArguments, TrainerState,
TrainerControl and CallbackHandler (with the DefaultFlowCallback every Trainer has), in a real process that a
socket playing the agent asks for a checkpoint and a stop.

transformers' Trainer itself needs torch: without it, `transformers.Trainer` is a placeholder that raises, and
torch is not installed here (3 GB of wheels with its CUDA libraries). Everything the callback meets runs for real; only
the Trainer's loop is replayed, event for event and in its order (transformers/trainer.py: _inner_training_loop,
_run_epoch, _maybe_log_save_evaluate, log, _finalize_training), with the forward and backward passes left out.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from clusterwatch import train
from tests.support.train_agent import Agent, agent, sock_dir  # noqa: F401  (fixtures)

STEPS_PER_EPOCH = 20
LR = 1e-4

TRAINER = r"""
import json, sys, time
from transformers import TrainingArguments
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback, TrainerControl, TrainerState
from clusterwatch.integrations.hf import ClusterwatchCallback

output_dir, per_epoch, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
max_steps = per_epoch * 500
# save_strategy "no": every save the loop makes was asked for by clusterwatch's callback
args = TrainingArguments(output_dir=output_dir, max_steps=max_steps, logging_steps=5, save_strategy="no",
                         report_to="none", disable_tqdm=True)
# as Trainer.__init__ builds it: the default callbacks first, the user's after them (a class, as users pass it)
handler = CallbackHandler([DefaultFlowCallback, ClusterwatchCallback], None, None, None, None)
control = TrainerControl()
state = TrainerState()
state.max_steps = max_steps
state.compute_steps(args, max_steps)
control = handler.on_init_end(args, state, control)
events, last_logged = [], 0


def log(logs):  # Trainer.log
    logs["epoch"] = state.epoch
    state.log_history.append({**logs, "step": state.global_step})
    return handler.on_log(args, state, control, logs)


print("ready", flush=True)
control = handler.on_train_begin(args, state, control)
for epoch in range(500):
    control = handler.on_epoch_begin(args, state, control)
    for i in range(per_epoch):
        control = handler.on_step_begin(args, state, control)
        control = handler.on_pre_optimizer_step(args, state, control)
        control = handler.on_optimizer_step(args, state, control)
        state.global_step += 1
        state.epoch = epoch + (i + 1) / per_epoch
        control = handler.on_step_end(args, state, control)
        # Trainer._maybe_log_save_evaluate
        if control.should_log and state.global_step > last_logged:
            last_logged = state.global_step
            control = log({"loss": 1 / state.global_step, "grad_norm": 0.5, "learning_rate": lr})
        if control.should_save:
            events.append(["save", state.global_step])
            control = handler.on_save(args, state, control)
            assert not control.should_save  # the handler clears the flag once saved
        if state.global_step == 3:  # a user's own trainer.log(), with what users put in it
            control = log({"note": "warm-up done", "eval/accuracy": 0.75, "diverged": float("nan"),
                           "overflow": float("inf"), "flag": True, "step": 99, "ok_metric": 0.25})
        if control.should_epoch_stop or control.should_training_stop:
            break
        time.sleep(0.02)
    control = handler.on_epoch_end(args, state, control)
    if control.should_training_stop:
        events.append(["stop", state.global_step])
        break
# Trainer._finalize_training: the run's summary, then on_train_end
control = log({"train_runtime": 1.5, "train_steps_per_second": 40.0, "total_flos": 0.0, "train_loss": 0.125})
control = handler.on_train_end(args, state, control)
print(json.dumps(events), flush=True)
"""


def epoch(step: int) -> float:
    """TrainerState.epoch after `step`, as the Trainer computes it."""
    return (step - 1) // STEPS_PER_EPOCH + ((step - 1) % STEPS_PER_EPOCH + 1) / STEPS_PER_EPOCH


def test_checkpoint_and_stop_set_the_real_control_and_progress_reaches_the_agent(agent, tmp_path):  # noqa: F811
    env = {**os.environ, train.SOCKET_ENV: agent.path, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(tmp_path / "out"), str(STEPS_PER_EPOCH), str(LR)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        agent.first_report()
        pid = agent.sender_pid
        assert pid is not None
        target = max(r.get("step", 0) for r in agent.reports) + 15
        agent.checkpoint_then_stop(pid, target)
        out = proc.stdout.readline()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    agent.pump(0.3)  # what the process sent before it ended is still queued at the socket
    events = json.loads(out)
    saves = [step for kind, step in events if kind == "save"]
    kind, stop_step = events[-1]
    assert saves[:1] == [target]  # the step the request named, not the one it arrived at
    assert kind == "stop" and saves[-1] == stop_step > target  # the stop saved first, at the same step
    assert stop_step < STEPS_PER_EPOCH * 500  # the request stopped it, not DefaultFlowCallback's max_steps

    reports = [{k: v for k, v in r.items() if k != "v"} for r in agent.reports]
    logged = [r for r in reports if "loss" in r]
    assert logged, "no logged loss reached the agent"
    for r in logged:  # DefaultFlowCallback's logging_steps decided when; the values are the Trainer's logs
        assert r["step"] % 5 == 0
        assert r == {"step": r["step"], "loss": 1 / r["step"], "lr": LR, "epoch": epoch(r["step"]),
                     "m": {"grad_norm": 0.5}}
    assert {"step": 3, "epoch": epoch(3), "m": {"ok_metric": 0.25}} in reports  # the rest left out
    assert reports[-1] == {"step": stop_step, "epoch": epoch(stop_step),
                           "m": {"train_runtime": 1.5, "train_steps_per_second": 40.0, "total_flos": 0.0,
                                 "train_loss": 0.125}}
    steps = [r["step"] for r in reports if set(r) == {"step", "epoch"}]  # on_step_end's reports, one a step
    assert steps == sorted(steps) and steps[-1] == stop_step


IMPORTS = r"""
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_clusterwatch_and_its_services_start_without_importing_transformers():
    # transformers is installed here for the test above; the extra stays optional and costs no start-up
    modules = ["clusterwatch", "clusterwatch.train", "clusterwatch.integrations", "clusterwatch.integrations._progress",
               "clusterwatch.cli.main", "clusterwatch.agent.runtime", "clusterwatch.collector.service"]
    r = subprocess.run([sys.executable, "-c", IMPORTS, *modules], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = set(json.loads(r.stdout))
    assert "clusterwatch" in loaded
    assert loaded & {"transformers", "huggingface_hub", "tokenizers", "safetensors", "numpy", "torch"} == set()


def test_without_transformers_the_import_says_what_to_install():
    # sys.modules[name] = None makes `import name` raise ImportError, as on a machine without the package
    code = "import sys; sys.modules['transformers'] = None; import clusterwatch.integrations.hf"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert ("ImportError: clusterwatch.integrations.hf needs the `transformers` package, which is not installed "
            "here; install it (pip install transformers)") in r.stderr
