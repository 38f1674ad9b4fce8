"""A stalled job one of whose ranks is stopped (SIGSTOP, as ctrl-Z or `kill -STOP` leaves it) says so: two real
training processes report steps through clusterwatch.train to a real agent reading the real /proc; rank 1 is
stopped and rank 0 stops advancing (it would wait for rank 1 in the next collective); a real collector's
training_stall of rank 0 names rank 1, its node, its pid and state T, and `status` shows rank 1 stopped; the job
recorded and replayed names the same cause."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from clusterwatch.collector.rules.causes import HELD_FLOOR_S

from tests.support.helpers import clean_environ, cli
from tests.support.stalling_job import start_stalling_job

pytestmark = pytest.mark.e2e


def test_a_stalled_jobs_training_stall_names_its_stopped_rank(tmp_path: Path) -> None:
    env = {k: v for k, v in clean_environ().items() if not k.startswith("SLURM")}
    job = start_stalling_job(tmp_path, "held-node", env, ["--gpu-source", "none"], by_pid=True)
    stopped = job.ranks[1].pid
    try:
        job.both_advance(30)
        os.kill(stopped, signal.SIGSTOP)  # rank 1 is stopped; rank 0 waits for it at its next collective
        # rank 0 ends the step it is in first: by its stall, rank 1 has been held long enough to be its cause at
        # once (HELD_FLOOR_S), so the alert's first figures name it, live and replayed (the replay gives no
        # refreshes of an alert's figures, the collector does)
        time.sleep(HELD_FLOOR_S + 2)
        job.stall()
        stall = job.stall_with(0, "has been stopped")
        desc = stall["description"]
        assert f"likely cause: rank 1 on held-node (pid {stopped}) has been stopped (state T) for " in desc, desc
        assert "SIGCONT" in desc, desc
        assert (stall["cause"], stall["cause_rank"], stall["cause_node"]) == ("process_held", 1, "held-node"), stall
        [p1] = [p for p in json.loads(job.status("--json").stdout)["processes"] if p["rank"] == 1]
        assert (p1["state"], p1["wchan"]) == ("T", None) and p1["state_since"] <= time.time(), p1
        status = job.status()
        assert status.returncode == 0 and "stopped (T) for " in status.stdout, status.stdout
        # the alert's text is wrapped to the terminal's width: read it as one line
        assert "has been stopped (state T)" in " ".join(status.stdout.split()), status.stdout
        # recorded and replayed, the stall names the same cause: the trace carries the hold
        trace = tmp_path / "held.jsonl"
        recorded = cli("record", job.job_id, "--collector", job.collector.address, "-o", str(trace))
        assert recorded.returncode == 0, recorded.stderr
    finally:
        os.kill(stopped, signal.SIGCONT)
        agent_code = job.close()
    assert agent_code == 0, job.agent.text()
    held = [json.loads(x) for x in trace.read_text().splitlines() if '"state":"T"' in x]
    assert held and all((r["rank"], r["pid"]) == (1, stopped) for r in held), held
    replayed = cli("replay", str(trace), "--format", "jsonl", "--rules", str(tmp_path / "rules.toml"))
    assert replayed.returncode == 0, replayed.stderr
    stalls = [e for e in map(json.loads, replayed.stdout.splitlines())
              if e["rule"] == "training_stall" and e["state"] == "firing" and e["rank"] == 0]
    assert stalls, replayed.stdout
    assert (stalls[0]["cause"], stalls[0]["cause_rank"], stalls[0]["cause_state"]) == ("process_held", 1, "T"), \
        stalls[0]
