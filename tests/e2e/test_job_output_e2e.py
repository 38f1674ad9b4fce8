"""End to end: a job that never calls clusterwatch.train, whose output file shows tqdm steps, watched by a real
agent (--read-job-output) and collector: `status --json` shows its step, and when its output stops,
training_stall fires."""
from __future__ import annotations

import json
import sys
import time

from clusterwatch.agent.spool import write_event

from clusterwatch.model import JobEvent
from tests.support.helpers import CLI, Collector, Proc, cli, firing_alert, unique_job_id, wait_for
from tests.support.stalling_job import RULES, RULES_LOOK_S

# Writes a tqdm bar to its stdout (the job's StdOut file, as Slurm opens it) until the stop file exists.
JOB = """
import os, sys, time
n = 0
while not os.path.exists(sys.argv[1]):
    n += 1
    sys.stdout.write(f"\\r{100 * n // 100000:3d}%|#         | {n}/100000 [00:01<00:10, 20.0it/s]")
    sys.stdout.flush()
    time.sleep(0.1)
time.sleep(300)
"""


def test_uninstrumented_job_steps_then_stalls(tmp_path):
    job_id = unique_job_id()
    stop, script, spool = tmp_path / "stop", tmp_path / "job.py", tmp_path / "spool"
    script.write_text(JOB)
    job = Proc([sys.executable, str(script), str(stop)], tmp_path / f"slurm-{job_id}.out",
               env={"SLURM_JOB_ID": job_id, "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"})
    write_event(str(spool), JobEvent("start", job_id, time.time()))
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    collector = Collector(tmp_path, "--rules", str(rules), "--rules-interval", str(RULES_LOOK_S))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "jo1", "--interval", "0.5",
                  "--send-interval", "0", "--no-provenance", "--gpu-source", "none", "--spool-dir", str(spool),
                  "--train-socket", str(tmp_path / "train.sock"), "--kmsg", "none", "--read-job-output"],
                 tmp_path / "agent.log", env={"SLURMD_NODENAME": "jo1"})
    try:
        def step() -> int | None:
            r = cli("status", job_id, "--collector", collector.address, "--json")
            if r.returncode != 0:
                return None
            steps = [p.get("step") for p in json.loads(r.stdout)["processes"] if p.get("step") is not None]
            return steps[0] if steps else None

        first = wait_for(step, timeout=90, interval=0.5, what="the job's step from its output")
        wait_for(lambda: (s := step()) is not None and s > first + 10, timeout=90, interval=0.5,
                 what="the step moving")
        stop.write_text("")
        alert = wait_for(lambda: firing_alert(collector, "training_stall"), timeout=90, interval=0.5,
                         what="training_stall once the output stops")
        assert job_id in json.dumps(alert)
    finally:
        print(agent.text())
        agent.stop()
        collector.stop()
        job.stop()
