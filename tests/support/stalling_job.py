"""A two-rank job that steps, then stalls, watched by a real agent and collector: the stack the stall-cause
end-to-end tests share (tests/e2e/test_stall_cause_e2e.py, test_mig_health_cause_e2e.py,
test_held_rank_cause_e2e.py).

Each rank reports steps through clusterwatch.train until the stop file exists, then blocks (a collective that
never returns). The collector's training_stall fires 3 s after the steps stop (pending after 1 s).
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.helpers import CLI, Collector, Proc, cli, unique_job_id, wait_for

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
RULES = "[training_stall]\nfor_s = 3\npending_after_s = 1\n"
RULES_LOOK_S = 1.0  # the collector's --rules-interval: how often its rules look at a process's step


def kmsg_line(seq: int, message: str) -> str:
    """A kernel log record as /dev/kmsg gives it (priority 3, now)."""
    return f"3,{seq},{int(time.monotonic() * 1e6)},-;{message}\n"


@dataclass
class StallingJob:
    """Job `job_id`'s two ranks, their agent on `node` and the collector; `stop` ends their steps."""

    job_id: str
    node: str
    ranks: list[Proc]
    collector: Collector
    agent: Proc
    stop_file: Path
    kmsg: Path | None

    def steps(self) -> dict[int, int] | None:
        """Each rank's latest step at the collector; None until both ranks have reported one."""
        r = cli("status", self.job_id, "--collector", self.collector.address, "--json")
        if r.returncode != 0:
            return None
        procs = json.loads(r.stdout)["processes"]
        steps = {p["rank"]: p.get("step") for p in procs if p.get("rank") is not None}
        return steps if len(procs) == 2 and len(steps) == 2 and None not in steps.values() else None

    def both_advance(self, min_step: int) -> None:
        """Wait until the collector has both ranks past `min_step`, then until the rules have seen their steps
        move: training_stall judges only a step that moved between two of its looks, every RULES_LOOK_S (a
        loaded machine can reach min_step before the first look)."""
        first = wait_for(lambda: (s := self.steps()) and min(s.values()) >= min_step and s, timeout=90,
                         interval=0.5, what="both ranks reporting steps")
        after = time.monotonic() + 2 * RULES_LOOK_S + 1
        wait_for(lambda: time.monotonic() > after and (s := self.steps()) and all(s[r] > first[r] for r in s),
                 timeout=90, interval=0.5, what="both ranks' steps moving through two looks of the rules")

    def kernel_says(self, seq: int, message: str) -> None:
        assert self.kmsg is not None, "this job's agent reads no kernel log"
        with self.kmsg.open("a") as f:
            f.write(kmsg_line(seq, message))

    def stall(self) -> None:
        self.stop_file.write_text("")

    def stall_of_rank(self, rank: int) -> dict | None:
        """The rank's firing training_stall as `alerts --json` gives it; None while there is none."""
        r = cli("alerts", "--collector", self.collector.address, "--json")
        if r.returncode != 0:
            return None
        return next((a for a in json.loads(r.stdout).get("alerts", []) if a["rule"] == "training_stall"
                     and a["state"] == "firing" and a["rank"] == rank), None)

    def stall_with(self, rank: int, text: str) -> dict:
        """Wait for the rank's training_stall whose description holds `text` (the cause is worked out per job
        every few seconds and kept current in the alert: a first read may precede it)."""
        return wait_for(lambda: (a := self.stall_of_rank(rank)) and text in a["description"] and a,
                        interval=0.5, timeout=90, what=f"rank {rank}'s training_stall with {text!r}")

    def status(self, *args: str):
        return cli("status", self.job_id, "--collector", self.collector.address, *args)

    def close(self) -> int:
        """Print what the collector held (shown when the test fails), stop everything; the agent's exit code."""
        print(cli("alerts", "--collector", self.collector.address, "--json").stdout)
        print(self.status().stdout)
        code = self.agent.stop()
        self.collector.stop()
        for p in self.ranks:
            p.stop()
        return code


def start_stalling_job(tmp_path: Path, node: str, env: dict[str, str], agent_args: list[str],
                       gpu_state: Callable[[list[Proc]], None] | None = None, kmsg: bool = False,
                       by_pid: bool = False) -> StallingJob:
    """Start the ranks (in `env`, as Slurm ranks 0 and 1 of a job id of their own), then `gpu_state(ranks)` (a
    test writes its NVML stand-in's state there, naming their pids), the collector and the agent (`agent_args`:
    its GPU source). `kmsg`: the agent reads a kernel log file the test appends to; `by_pid`: the agent is given the
    ranks' pids, else the job's start event in its spool."""
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    job_id = unique_job_id()
    sock, stop, script = tmp_path / "train.sock", tmp_path / "stop", tmp_path / "rank.py"
    script.write_text(RANK)
    ranks = [Proc([sys.executable, str(script), str(stop)], tmp_path / f"rank{r}.log",
                  env={**env, "CLUSTERWATCH_TRAIN_SOCKET": str(sock), "SLURM_JOB_ID": job_id, "SLURM_PROCID": str(r),
                       "SLURM_LOCALID": str(r), "SLURM_STEP_ID": "0"}) for r in (0, 1)]
    if gpu_state is not None:
        gpu_state(ranks)
    spool = tmp_path / "spool"
    if by_pid:
        watch = [a for p in ranks for a in ("--pid", str(p.pid))]
    else:
        write_event(str(spool), JobEvent("start", job_id, time.time(), gpu_indexes="0,1"))
        watch = []
    kmsg_path = tmp_path / "kmsg" if kmsg else None
    if kmsg_path is not None:
        kmsg_path.write_text(kmsg_line(1, "Linux version 6.8.0"))
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    collector = Collector(tmp_path, "--rules", str(rules), "--rules-interval", str(RULES_LOOK_S))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", node, "--interval", "0.5",
                  "--send-interval", "0", "--no-provenance", "--spool-dir", str(spool), "--train-socket", str(sock),
                  "--kmsg", str(kmsg_path) if kmsg_path is not None else "none", *agent_args, *watch],
                 tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": node})
    return StallingJob(job_id, node, ranks, collector, agent, stop, kmsg_path)
