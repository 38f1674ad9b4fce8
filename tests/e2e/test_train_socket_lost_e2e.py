"""Issue 24: a training socket removed under a running agent (a cleanup script, a second agent of an older
version) is bound again by that agent, and a rank that keeps stepping meanwhile is told once on its stderr why
its reports did not arrive, and gets no training_stall: a real training process reporting through
clusterwatch.train, a real agent, a real collector whose stall rule looks every second."""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.helpers import CLI, Collector, Proc, clean_environ, cli, unique_job_id, wait_for

pytestmark = pytest.mark.e2e

# It reports only once its agent listens (a report before would be said on stderr, and that is not this
# test's line), then a step every 0.2 s until the stop file exists, then stays alive without reporting.
RANK = """
import os, sys, time
from clusterwatch import train
sock, stop = sys.argv[1], sys.argv[2]
while not os.path.exists(sock):
    time.sleep(0.05)
step = 0
while not os.path.exists(stop):
    step += 1
    train.report(step=step, loss=1.0 / step)
    time.sleep(0.2)
time.sleep(300)
"""
FOR_S = 6.0  # training_stall's for_s: the socket's gap (a poll, the library's 1 s pause, a report) is far shorter
RULES = f"[training_stall]\nfor_s = {FOR_S}\npending_after_s = {FOR_S}\n"


@pytest.fixture
def sock_dir():
    d = Path(tempfile.mkdtemp(prefix="cw-lost-", dir="/tmp"))  # a socket path holds 107 bytes
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_removed_socket_is_bound_again_and_the_rank_is_told_once_and_not_called_stalled(
        tmp_path: Path, sock_dir: Path) -> None:
    job = unique_job_id()
    sock, stop, script = sock_dir / "train.sock", tmp_path / "stop", tmp_path / "rank.py"
    script.write_text(RANK)
    (tmp_path / "rules.toml").write_text(RULES)
    collector = Collector(tmp_path, "--rules", str(tmp_path / "rules.toml"), "--rules-interval", "1")
    rank = Proc([sys.executable, str(script), str(sock), str(stop)], tmp_path / "rank.log",
                env={**clean_environ(), "CLUSTERWATCH_TRAIN_SOCKET": str(sock)})
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "lost-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "none", "--no-provenance", "--kmsg", "none",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(sock), "--pid", str(rank.pid),
                  "--job-id", job], tmp_path / "agent.log")

    def step() -> int | None:
        r = cli("status", job, "--collector", collector.address, "--json")
        procs = json.loads(r.stdout).get("processes") if r.returncode == 0 else None
        return procs[0].get("step") if procs else None

    def stalls() -> list[dict]:
        r = cli("alerts", "--collector", collector.address, "--json")
        assert r.returncode == 0, r.stderr
        return [a for a in json.loads(r.stdout).get("alerts", []) if a["rule"] == "training_stall"]

    try:
        # the rules have seen its step move (training_stall judges only a step seen moving)
        first = wait_for(lambda: (s := step()) and s >= 5 and s, timeout=90, interval=0.5, what="steps reported")
        after = time.monotonic() + 3
        wait_for(lambda: time.monotonic() > after and (step() or 0) > first, timeout=60, interval=0.5,
                 what="the step moving through the rules' looks")

        os.unlink(sock)  # a cleanup script
        gone = step() or 0
        wait_for(lambda: "bound it again" in agent.text(), timeout=30, what="the agent binding its socket again")
        wait_for(lambda: (step() or 0) > gone + 5, timeout=30, interval=0.5, what="reports arriving again")
        # well past for_s with the rank stepping: no stall, not even pending
        deadline = time.monotonic() + FOR_S + 4
        while time.monotonic() < deadline:
            assert stalls() == [], stalls()
            time.sleep(0.5)
        assert (step() or 0) > gone + 20

        [line] = rank.text().splitlines()  # told once, in one line, with why and what to do
        assert line.startswith(f"clusterwatch.train: reports of pid {rank.pid} cannot reach the clusterwatch "
                               f"agent at {sock}: no socket there"), line
        assert "CLUSTERWATCH_TRAIN_SOCKET" in line
        assert agent.text().count("bound it again") == 1

        # the rule was live all along: the rank stopping its steps is called a stall
        stop.write_text("")
        wait_for(lambda: any(a["state"] == "firing" for a in stalls()), timeout=60, interval=0.5,
                 what="training_stall once the steps really stop")
    finally:
        print(cli("alerts", "--collector", collector.address, "--json").stdout)
        print(agent.text()[-3000:])
        for p in (agent, rank, collector):
            p.stop()
