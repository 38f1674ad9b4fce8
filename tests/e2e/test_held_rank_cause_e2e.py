"""A stalled job one of whose ranks is stopped (SIGSTOP, as ctrl-Z or `kill -STOP` leaves it) says so: two real
training processes report steps through clusterwatch.train to a real agent reading the real /proc; rank 1 is
stopped and rank 0 stops advancing (it would wait for rank 1 in the next collective); a real collector's
training_stall of rank 0 names rank 1, its node, its pid and state T, and `status` shows rank 1 stopped."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import CLI, Collector, Proc, clean_environ, cli, wait_for

pytestmark = pytest.mark.e2e

RANK = """
import os, sys, time
from clusterwatch import train
stop = sys.argv[1]
step = 0
while not os.path.exists(stop):
    step += 1
    train.report(step=step, loss=1.0 / step)
    time.sleep(0.2)
time.sleep(300)
"""


def _stall_of_rank(collector: Collector, rank: int) -> dict | None:
    r = cli("alerts", "--collector", collector.address, "--json")
    if r.returncode != 0:
        return None
    for entry in json.loads(r.stdout).get("alerts", []):
        if entry["rule"] == "training_stall" and entry["state"] == "firing" and entry["rank"] == rank:
            return entry
    return None


def test_a_stalled_jobs_training_stall_names_its_stopped_rank(tmp_path: Path) -> None:
    sock = tmp_path / "train.sock"
    stop = tmp_path / "stop"
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in clean_environ().items() if not k.startswith("SLURM")}
    ranks = [Proc([sys.executable, str(script), str(stop)], tmp_path / f"rank{r}.log",
                  env={**env, "CLUSTERWATCH_TRAIN_SOCKET": str(sock), "SLURM_JOB_ID": "702", "SLURM_PROCID": str(r),
                       "SLURM_LOCALID": str(r), "SLURM_STEP_ID": "0"}) for r in (0, 1)]
    rules = tmp_path / "rules.toml"
    rules.write_text("[training_stall]\nfor_s = 3\npending_after_s = 1\n")
    collector = Collector(tmp_path, "--rules", str(rules))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "held-node", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "none", "--no-provenance",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(sock),
                  *[a for p in ranks for a in ("--pid", str(p.pid))]],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": "held-node"})
    stopped = ranks[1].pid
    try:
        def both_advance() -> bool:
            r = cli("status", "702", "--collector", collector.address, "--json")
            if r.returncode != 0:
                return False
            procs = json.loads(r.stdout)["processes"]
            return len(procs) == 2 and all((p.get("step") or 0) >= 30 and p.get("rank") is not None for p in procs)

        wait_for(both_advance, timeout=90, interval=0.5, what="both ranks reporting steps")
        os.kill(stopped, signal.SIGSTOP)  # rank 1 is stopped; rank 0 waits for it
        stop.write_text("")
        stall = wait_for(lambda: (a := _stall_of_rank(collector, 0)) and "has been stopped" in a["description"]
                         and a, interval=0.5, timeout=90, what="rank 0's training_stall naming the stopped rank")
        desc = stall["description"]
        assert f"likely cause: rank 1 on held-node (pid {stopped}) has been stopped (state T) for " in desc, desc
        assert "SIGCONT" in desc, desc
        assert (stall["cause"], stall["cause_rank"], stall["cause_node"]) == ("process_held", 1, "held-node"), stall
        r = cli("status", "702", "--collector", collector.address, "--json")
        [p1] = [p for p in json.loads(r.stdout)["processes"] if p["rank"] == 1]
        assert (p1["state"], p1["wchan"]) == ("T", None) and p1["state_since"] <= time.time(), p1
        status = cli("status", "702", "--collector", collector.address)
        assert status.returncode == 0 and "stopped (T) for " in status.stdout, status.stdout
        # the alert's text is wrapped to the terminal's width: read it as one line
        assert "has been stopped (state T)" in " ".join(status.stdout.split()), status.stdout
    finally:
        print(cli("alerts", "--collector", collector.address, "--json").stdout)
        print(cli("status", "702", "--collector", collector.address).stdout)
        os.kill(stopped, signal.SIGCONT)
        agent_code = agent.stop()
        collector.stop()
        for p in ranks:
            p.stop()
    assert agent_code == 0, agent.text()
