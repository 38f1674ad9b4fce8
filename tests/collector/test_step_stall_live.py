"""A rank whose step stops moving does not keep its step rate (issue 17, item 5): a real training process
reports steps through clusterwatch.train, then hangs without reporting; its rate in /metrics and `status`
falls to 0 and its row says since when it is stalled, and so does the report of the job once it has ended."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.helpers import CLI, Collector, Proc, clean_environ, cli, metric_value, wait_for

pytestmark = pytest.mark.e2e

# 20 steps a second for `steps` steps, then stuck (alive, no more reports) for `hang` seconds
STALLER = """
import sys, time
from clusterwatch import train
steps, hang = int(sys.argv[1]), float(sys.argv[2])
for i in range(steps):
    train.report(step=i, loss=1.0)
    time.sleep(0.05)
time.sleep(hang)
"""


def test_a_rank_stuck_at_one_step_reads_0_steps_per_s_and_stalled_since(tmp_path):
    sock = tmp_path / "train.sock"
    script = tmp_path / "staller.py"
    script.write_text(STALLER)
    collector = Collector(tmp_path)
    rank = Proc([sys.executable, str(script), "200", "300"], tmp_path / "rank.log",
                env={**clean_environ(), "CLUSTERWATCH_TRAIN_SOCKET": str(sock)})
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "st-node", "--interval", "0.3",
                  "--send-interval", "0", "--gpu-source", "none", "--no-provenance", "--pid", str(rank.pid),
                  "--job-id", "st-1", "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(sock)],
                 tmp_path / "agent.log")

    def metric(name: str) -> float | None:
        return metric_value(collector.metrics(), name, job_id="st-1")

    try:
        # while it advances: a rate, and no stall said
        wait_for(lambda: (metric("clusterwatch_rank_step") or 0) >= 40, timeout=60, what="steps reported")
        assert (metric("clusterwatch_rank_steps_per_second") or 0) > 5
        status = cli("status", "st-1", "--collector", collector.address)
        assert status.returncode == 0 and "stalled since" not in status.stdout, status.stdout
        # stuck at step 199: the rate is not that of its last reports
        wait_for(lambda: metric("clusterwatch_rank_step") == 199, timeout=60, what="the last step")
        wait_for(lambda: metric("clusterwatch_rank_steps_per_second") == 0.0, timeout=30,
                 what="the stuck rank's rate to read 0")
        status = cli("status", "st-1", "--collector", collector.address)
        lines = status.stdout.splitlines()  # its Training row, and the note below it
        at = next(n for n, x in enumerate(lines) if f" {rank.pid} " in x and " 199 " in x)
        assert "0.00" in lines[at] and "stalled since" in lines[at + 1], status.stdout
    finally:
        for p in (agent, rank, collector):
            p.stop()


def test_the_report_of_an_ended_job_says_its_rank_stalled(tmp_path):
    script = tmp_path / "staller.py"
    script.write_text(STALLER)
    env = clean_environ()
    env.pop("COLUMNS", None)
    done = subprocess.run([*CLI, "run", "--interval", "0.3", "--gpu-source", "none", "--status-every", "0", "--",
                           sys.executable, str(script), "60", "6"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=os.fspath(tmp_path))
    assert done.returncode == 0, done.stderr
    report = done.stdout + done.stderr
    lines = report.splitlines()  # its Training row, and the note below it
    at = next((n for n, x in enumerate(lines) if " 59 " in x and "0.00" in x), None)
    assert at is not None, report
    assert "stalled since" in lines[at + 1], report
