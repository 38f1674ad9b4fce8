"""job_slowdown on steps read from a job's own output: a job that never calls clusterwatch.train writes a tqdm bar
to its StdOut file, a real agent (--read-job-output) reads its steps and a real collector with short rule windows
judges them. At speed the job stays quiet; once its step rate falls 30 % for the rule's window, job_slowdown fires
for it, with the baseline it measured from the output.

The job's steps follow a clock (20 steps/s, 14 once slow), not a sleep per step: a loaded machine changes when a
step is written and read, never the rate the rule measures.
"""
from __future__ import annotations

import json
import re
import sys
import time

import pytest
from clusterwatch.agent.spool import write_event

from clusterwatch.model import JobEvent
from tests.support.helpers import CLI, Collector, Proc, cli, unique_job_id, wait_for

# serial: the rule judges 2 s buckets of a clock-driven rate; under the parallel pass's load the agent's reads
# bunch up and its buckets read as noise
pytestmark = [pytest.mark.e2e, pytest.mark.serial]

# 4 s buckets, a 12 s window against a 20 s baseline after 2 s of warm-up; a fall of 20 % or more is slow. The
# agent reads the output once a second: a bucket holds four reads, so a loaded machine's late read moves a
# bucket's rate by a quarter at most (2 s buckets, two reads, read as noise under load).
RULES = ("[job_slowdown]\nbucket_s = 4\nbaseline_s = 20\nwarmup_s = 2\nfor_s = 12\ndrop_percent = 20\n"
         "low_fraction = 0.7\n")
JOB = """
import os, sys, time
slow = sys.argv[1]
step, last = 0.0, time.monotonic()
while True:
    now = time.monotonic()
    step += (now - last) * (14.0 if os.path.exists(slow) else 20.0)
    last = now
    n = int(step)
    sys.stdout.write(f"\\r{n // 1000:3d}%|#         | {n}/100000 [00:01<00:10, 20.0it/s]")
    sys.stdout.flush()
    time.sleep(0.1)
"""


def _slowdown(collector: Collector, job_id: str) -> dict | None:
    r = cli("alerts", "--collector", collector.address, "--json")
    alerts = json.loads(r.stdout).get("alerts", []) if r.returncode == 0 else []
    return next((a for a in alerts if a["rule"] == "job_slowdown" and a["state"] == "firing"
                 and a.get("job_id") == job_id), None)


def _step(collector: Collector, job_id: str) -> int | None:
    r = cli("status", job_id, "--collector", collector.address, "--json")
    if r.returncode != 0:
        return None
    steps = [p["step"] for p in json.loads(r.stdout)["processes"] if p.get("step") is not None]
    return steps[0] if steps else None


def test_a_job_whose_output_shows_its_steps_slowing_raises_job_slowdown(tmp_path) -> None:
    job_id = unique_job_id()
    slow, script, spool = tmp_path / "slow", tmp_path / "job.py", tmp_path / "spool"
    script.write_text(JOB)
    job = Proc([sys.executable, str(script), str(slow)], tmp_path / f"slurm-{job_id}.out",
               env={"SLURM_JOB_ID": job_id, "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"})
    write_event(str(spool), JobEvent("start", job_id, time.time()))
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    collector = Collector(tmp_path, "--rules", str(rules), "--rules-interval", "1")
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "jos1", "--interval", "0.5",
                  "--send-interval", "0", "--no-provenance", "--gpu-source", "none", "--spool-dir", str(spool),
                  "--train-socket", str(tmp_path / "train.sock"), "--kmsg", "none", "--read-job-output"],
                 tmp_path / "agent.log", env={"SLURMD_NODENAME": "jos1"})
    try:
        wait_for(lambda: (_step(collector, job_id) or 0) >= 40, timeout=90, interval=0.5,
                 what="the job's steps from its output at the collector")
        # A baseline at speed: the warm-up, then five 4 s buckets and some; nothing fires meanwhile.
        at_speed = time.monotonic() + 26
        while time.monotonic() < at_speed:
            assert _slowdown(collector, job_id) is None
            time.sleep(1.0)
        slow.touch()
        fired = wait_for(lambda: _slowdown(collector, job_id), timeout=90, interval=1.0,
                         what="job_slowdown on the steps read from the output")
        # Its figures are the output's: a baseline near 20 steps/s, a fall near 30 %.
        said = re.search(r"runs (\d+) % slower than it did: .* against a steady ([0-9.]+) steps/s",
                         fired["description"])
        assert said is not None, fired
        assert 20 <= int(said[1]) <= 45 and 17.0 <= float(said[2]) <= 23.0, fired
    finally:
        print(agent.text())
        code = agent.stop()
        collector.stop()
        job.stop()
    assert code == 0
