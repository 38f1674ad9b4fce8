"""A real training process using clusterwatch.train, watched by its own real agent: the one the job page's
actions (tests/web_stack.py), `clusterwatch diagnose` (tests/e2e/test_diagnose.py) and the web pages' own
tests ask for a checkpoint, their stacks or a stop.

Mode "loop" steps for ever, reporting its allocator's figures too (moving, not growing); mode "stuck" steps
until the file MARKER.block exists, then blocks in blocked_in_collective (a hung all_reduce). It blocks only
when told: the reports a trainer sends before its agent listens are lost, so "stuck at step 30" would be
stuck before the collector ever saw a step on a loaded machine. Its checkpoint handler appends a line to
MARKER a request.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.helpers import CLI, SIM_RUN, Proc, clean_environ, cli, wait_for

TRAINER = r"""
import os, sys, time
from clusterwatch import train
mode, marker = sys.argv[1], sys.argv[2]
step = 0

def checkpoint(request):
    with open(marker, "a") as f:
        f.write(f"{step} {request.args}\n")
    return f"saved checkpoint at step {step}"

train.on_request("checkpoint", checkpoint)

def blocked_in_collective():
    time.sleep(3600)   # a hung all_reduce never returns

while True:
    step += 1
    if mode == "stuck":
        train.report(step=step, loss=1.0)
    else:  # its allocator's figures too, moving but not growing (no leak rule's business)
        train.report(step=step, loss=1.0, gpu_allocated_bytes=(2 << 30) + (step % 50) * 2**20,
                     gpu_reserved_bytes=6 << 30)
    if mode == "stuck" and os.path.exists(marker + ".block"):  # once the agent has seen it report
        blocked_in_collective()
    time.sleep(0.05)
"""


@dataclass
class Trainer:
    """One trainer process (`rank`) and the agent watching it (`agent`) for `job_id` at `collector` (gRPC),
    the agent's spool in `spool` (for job events)."""

    rank: Proc
    agent: Proc
    job_id: str
    collector: str
    marker: Path
    spool: Path
    sock_dir: Path | None = None  # the training socket's short folder, removed at stop

    def step(self) -> int | None:
        """Its latest step in `status --json`; None before the job is known or a step reported."""
        r = cli("status", self.job_id, "--json", "--collector", self.collector)
        processes = json.loads(r.stdout).get("processes") if r.returncode == 0 else None
        return processes[0].get("step") if processes else None

    def stepping(self, timeout: float = 180.0) -> None:
        """Wait until the collector has seen its step move (two steps: a stall rule judges only a step that
        moved before)."""
        seen: set = set()
        wait_for(lambda: seen.add(self.step()) or len(seen - {None}) >= 2, timeout=timeout, interval=0.5,
                 what=f"{self.job_id}'s step moving at the collector")

    def block(self) -> None:
        """A "stuck" trainer blocks in blocked_in_collective from its next step."""
        Path(str(self.marker) + ".block").touch()

    def stuck(self, timeout: float = 180.0) -> None:
        """Block it and wait until its step no longer moves at the collector."""
        self.block()
        seen: list = []
        wait_for(lambda: seen.append(self.step()) or len(seen) > 2 and seen[-1] == seen[-2] == seen[-3],
                 timeout=timeout, interval=1.0, what=f"{self.job_id}'s step to stop moving")

    def checkpoints(self) -> list[str]:
        return self.marker.read_text().splitlines() if self.marker.exists() else []

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.parent.name}/{p.log.name}\n{p.text()[-2000:]}" for p in (self.rank, self.agent))

    def stop(self) -> None:
        self.agent.stop()
        self.rank.stop()
        if self.sock_dir is not None:
            shutil.rmtree(self.sock_dir, ignore_errors=True)


def start_trainer(tmp: Path, collector: str, job_id: str, mode: str = "loop", node: str = "trainer-node",
                  gpu: bool = False, marker: Path | None = None) -> Trainer:
    """A trainer in `mode` and its agent (every poll sent, no provenance) in their own folder under `tmp`;
    `gpu`: on a simulated GPU (this session's SIM_RUN), else no GPU source."""
    folder = tmp / f"trainer-{node}"
    spool = folder / "spool"
    spool.mkdir(parents=True)
    # a Unix socket's path holds 107 bytes: pytest's tmp folder named after a long test leaves too few
    sock_dir = Path(tempfile.mkdtemp(prefix="cw-tr-", dir="/tmp"))
    script, sock = folder / "trainer.py", sock_dir / "train.sock"
    script.write_text(TRAINER)
    marker = marker or folder / "checkpoints.txt"
    env = dict(clean_environ(), CLUSTERWATCH_TRAIN_SOCKET=str(sock))
    if gpu:
        env.update(RANK="0", WORLD_SIZE="1", CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_NODE=node,
                   CLUSTERWATCH_SIM_PROFILE="steady", CLUSTERWATCH_SIM_RUN=SIM_RUN)
    rank = Proc([sys.executable, str(script), mode, str(marker)], folder / "rank.log", env=env)
    source = ["--gpu-source", "sim", "--sim-run", SIM_RUN] if gpu else ["--gpu-source", "none"]
    agent = Proc([*CLI, "agent", "--collector", collector, "--node", node, *source, "--interval", "0.5",
                  "--send-interval", "0", "--no-provenance", "--spool-dir", str(spool), "--train-socket", str(sock),
                  "--job-id", job_id, "--pid", str(rank.pid)], folder / "agent.log")
    return Trainer(rank, agent, job_id, collector, marker, spool, sock_dir)
