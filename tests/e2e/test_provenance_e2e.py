"""Which code ran and how far training got, end to end: real git repositories, real processes
reporting through clusterwatch.train, a real agent and collector."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.helpers import CLI, Collector, Proc, cli, metric_value, wait_for

pytestmark = pytest.mark.e2e

TRAIN = """
import sys, time
from clusterwatch import train
train.tags(experiment="lr-sweep", dataset="c4")
for step in range(int(sys.argv[1])):
    train.report(step=step, loss=1.0 / (step + 1), lr=3e-4)
    time.sleep(0.05)
"""


def _repo(path, content: str) -> str:
    path.mkdir()
    (path / "train.py").write_text(TRAIN + f"\n# {content}\n")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e")
    for args in (["init", "-q", "-b", "main"], ["add", "train.py"], ["commit", "-q", "-m", content]):
        subprocess.run(["git", *args], cwd=path, check=True, env=env, timeout=30)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_run_records_progress_provenance_and_a_summary(tmp_path):
    commit = _repo(tmp_path / "repo", "v1")
    out = tmp_path / "summaries"
    out.mkdir()
    r = subprocess.run([*CLI, "run", "--interval", "0.3", "--gpu-source", "none", "--summary-dir", str(out), "--",
                        sys.executable, "train.py", "80"], cwd=tmp_path / "repo", capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "STEP" in r.stderr and "STEP/S" in r.stderr  # progress in the report
    assert commit[:12] in r.stderr and "(main), clean" in r.stderr  # provenance in the report
    assert "experiment=lr-sweep" in r.stderr
    (path,) = out.glob("clusterwatch-local-*.json")
    summary = json.loads(path.read_text())
    assert summary["version"] == 2 and summary["job"]["state"] == "COMPLETED"
    # numbers as numbers, null for unknown (version 1 had "1796..." strings and 0 for unset times)
    assert isinstance(summary["job"]["start_time"], float) and summary["job"]["memory_bytes"] is None
    assert summary["provenance"][0]["git"]["commit"] == commit
    assert summary["tags"] == {"experiment": "lr-sweep", "dataset": "c4"}
    (rank,) = [r for r in summary["ranks"] if r["command"].startswith("python")]
    assert rank["last_step"] >= 60  # the steps reached the collector
    assert rank["samples"] >= 3


def test_ranks_on_different_commits_raise_code_mismatch(tmp_path):
    _repo(tmp_path / "a", "version A")
    _repo(tmp_path / "b", "version B")
    collector = Collector(tmp_path)
    sock = tmp_path / "train.sock"
    env = dict(os.environ, CLUSTERWATCH_TRAIN_SOCKET=str(sock))
    ranks = []
    for i, repo in enumerate(("a", "b")):
        with open(tmp_path / f"rank{i}.log", "ab") as log:
            popen = subprocess.Popen([sys.executable, "train.py", "1000"], cwd=tmp_path / repo, stdout=log,
                                     stderr=subprocess.STDOUT, env=dict(env, RANK=str(i)))
        ranks.append(popen)
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "mm-node", "--interval", "0.3",
                  "--gpu-source", "none", *[a for p in ranks for a in ("--pid", str(p.pid))], "--job-id", "mm-1",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(sock)], tmp_path / "agent.log")
    try:
        def mismatch():
            r = cli("alerts", "--collector", collector.address, "--json")
            alerts = json.loads(r.stdout).get("alerts", []) if r.returncode == 0 else []
            return [a for a in alerts if a["rule"] == "code_mismatch"]
        (alert,) = wait_for(mismatch, timeout=60, what="code_mismatch")
        assert alert["job_id"] == "mm-1" and alert["state"] == "firing"
        assert "2 different versions" in alert["description"]
        text = collector.metrics()
        assert metric_value(text, "clusterwatch_job_code_info", job_id="mm-1", versions="2") == 1.0
        # run tags ride on the job's info series (tags sent before the agent was up are resent)
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_job_info", job_id="mm-1",
                                      tag_experiment="lr-sweep") == 1.0, timeout=60, what="the run tags")
        # progress per rank, step rate from step deltas
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_rank_steps_per_second", job_id="mm-1",
                                       rank="1") or 0) > 1, what="a step rate for rank 1")
        status = cli("status", "mm-1", "--collector", collector.address)
        assert "2 different versions of the code" in status.stdout
    finally:
        agent.stop()
        for p in ranks:
            p.terminate()
            p.wait(10)
        collector.stop()
