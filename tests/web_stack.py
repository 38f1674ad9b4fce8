"""A real collector serving its web pages, fed by a real agent with a simulated GPU and one real rank whose
simulated GPU memory leaks 40 MiB/s (the demo's short leak rules fire within a minute), and which names
itself, argues and tags itself with HTML that would run were it not escaped.
"""
from __future__ import annotations

import json
import os
import sys
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from clusterwatch.agent.spool import write_event

from clusterwatch.model import JobEvent
from tests.helpers import CLI, SIM_RUN, Collector, Proc, clean_environ, cli, wait_for

ROOT = Path(__file__).resolve().parent.parent
DEMO_RULES = ROOT / "collector" / "rules" / "demo_rules.toml"
JOB_ID = "web-test"
NODE = "web-node1"
# each would run a script (or show an alert dialog) were it written into the page raw
HOSTILE_TAG = "<script>alert('tag')</script>"
HOSTILE_ARG = "<img src=x onerror=alert('arg')>"
HOSTILE_COMM = "<b>x</b>&amp;"  # a process name is 15 bytes at most

WORKLOAD = textwrap.dedent(f"""
    import ctypes, os, sys, time
    from clusterwatch import train
    ctypes.CDLL(None).prctl(15, {HOSTILE_COMM.encode()!r}, 0, 0, 0)  # PR_SET_NAME: what the process table shows
    train.tags(exp={HOSTILE_TAG!r})
    mem_file, started, step = os.environ["CLUSTERWATCH_SIM_GPU_MEM_FILE"], time.time(), 0
    while True:
        step += 1
        with open(mem_file + ".tmp", "w") as f:
            f.write(str(int((20480 + 40 * (time.time() - started)) * 2**20)))
        os.replace(mem_file + ".tmp", mem_file)
        train.report(step=step, loss=1.0 / step)
        time.sleep(0.1)
""")


@dataclass
class WebStack:
    collector: Collector
    rank: Proc
    agent: Proc
    web_port: int
    cli_env: dict | None = None  # for `status` and `alerts` (a munged's socket)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.web_port}{path}"

    def get(self, path: str) -> tuple[int, str, dict]:
        try:
            with urllib.request.urlopen(self.url(path), timeout=10) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), dict(exc.headers)

    def status_json(self) -> dict | None:
        """`status JOBID --json`, or None while the collector does not know the job."""
        r = cli("status", JOB_ID, "--json", "--collector", self.collector.address, env=self.cli_env)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.text()[-2000:]}" for p in (self.collector, self.rank, self.agent))

    def wait_for_leak_alert(self, timeout: float = 150.0) -> None:
        def firing() -> bool:
            r = cli("alerts", "--collector", self.collector.address, "--json", env=self.cli_env)
            return r.returncode == 0 and any(
                e.get("job_id") == JOB_ID and e["rule"] == "gpu_memory_leak"
                and e["state"] == "firing" for e in _entries(r.stdout))
        try:
            wait_for(firing, timeout=timeout, interval=1.0, what="the leak alert firing")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def stop(self) -> None:
        for p in (self.agent, self.rank, self.collector):
            p.stop()


def _entries(text: str) -> list[dict]:
    data = json.loads(text)
    return data.get("alerts", data) if isinstance(data, dict) else data


def start_web_stack(tmp: Path, *collector_args: str, cli_env: dict | None = None) -> WebStack:
    collector = Collector(tmp, "--rules", str(DEMO_RULES), "--web-listen", "127.0.0.1:0", *collector_args)
    spool = tmp / "spool"
    spool.mkdir()
    write_event(str(spool), JobEvent("start", JOB_ID, time.time(), os.getuid(), gpu_indexes="0"))
    script = tmp / "workload.py"
    script.write_text(WORKLOAD)
    env = dict(clean_environ(), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", CLUSTERWATCH_SIM_GPU="0",
               CLUSTERWATCH_SIM_NODE=NODE, CLUSTERWATCH_SIM_PROFILE="steady", CLUSTERWATCH_SIM_RUN=SIM_RUN,
               CLUSTERWATCH_SIM_GPU_MEM_FILE=str(tmp / "gpu-mem-rank0"),
               CLUSTERWATCH_TRAIN_SOCKET=str(spool / "train.sock"))
    rank = Proc([sys.executable, str(script), HOSTILE_ARG], tmp / "rank0.log", env=env)
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", NODE, "--gpu-source", "sim",
                  "--sim-run", SIM_RUN, "--interval", "1", "--spool-dir", str(spool),
                  "--train-socket", str(spool / "train.sock"), "--job-id", JOB_ID, "--pid", str(rank.pid)],
                 tmp / "agent.log")
    web_port = json.loads(collector.ports_file.read_text())["web"]
    stack = WebStack(collector, rank, agent, web_port, cli_env)
    try:
        wait_for(lambda: (s := stack.status_json()) and s.get("processes") and s.get("tags")
                 and s.get("provenance"), timeout=60,
                 interval=0.5, what="the rank, its tags and provenance at the collector")
    except AssertionError as exc:
        stack.stop()
        raise AssertionError(f"{exc}\n{stack.logs()}") from None
    return stack


# -- the job page's actions: a collector with --web-actions and two real trainers using clusterwatch.train --

ACTION_TRAINER = r"""
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
RUNNING_JOB, STUCK_JOB = "act-run", "act-stuck"


@dataclass
class ActionsStack:
    """A collector serving pages with actions; job RUNNING_JOB (a trainer with a checkpoint handler on a
    simulated GPU, whose handler appends to `marker`) and STUCK_JOB (a trainer blocked in
    blocked_in_collective once its agent has seen it report), each with its own real agent."""

    collector: Collector
    procs: list
    web_port: int
    marker: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.web_port}{path}"

    def request(self, path: str, data: dict | None = None, headers: dict | None = None,
                timeout: float = 60) -> tuple[int, str]:
        """GET, or POST `data` urlencoded; (status, body)."""
        from urllib.parse import urlencode

        body = urlencode(data).encode() if data is not None else None
        req = urllib.request.Request(self.url(path), data=body, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def status_json(self, job_id: str) -> dict | None:
        r = cli("status", job_id, "--json", "--collector", self.collector.address)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def step(self, job_id: str) -> int | None:
        s = self.status_json(job_id)
        return s["processes"][0].get("step") if s and s.get("processes") else None

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.text()[-2000:]}" for p in (self.collector, *self.procs))

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.collector.stop()


def start_actions_stack(tmp: Path, *collector_args: str) -> ActionsStack:
    collector = Collector(tmp, "--web-listen", "127.0.0.1:0", *collector_args)
    script = tmp / "trainer.py"
    script.write_text(ACTION_TRAINER)
    marker = tmp / "checkpoints.txt"
    procs = []
    stack = ActionsStack(collector, procs, json.loads(collector.ports_file.read_text())["web"], marker)
    for job_id, mode, node, gpu in ((RUNNING_JOB, "loop", "act-node1", True), (STUCK_JOB, "stuck", "act-node2", False)):
        spool = tmp / f"spool-{node}"
        spool.mkdir()
        sock = spool / "train.sock"
        env = dict(clean_environ(), CLUSTERWATCH_TRAIN_SOCKET=str(sock))
        if gpu:
            env.update(RANK="0", WORLD_SIZE="1", CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_NODE=node,
                       CLUSTERWATCH_SIM_PROFILE="steady", CLUSTERWATCH_SIM_RUN=SIM_RUN)
        rank = Proc([sys.executable, str(script), mode, str(marker)], tmp / f"{job_id}.log", env=env)
        procs.append(rank)
        source = ["--gpu-source", "sim", "--sim-run", SIM_RUN] if gpu else ["--gpu-source", "none"]
        procs.append(Proc([*CLI, "agent", "--collector", collector.address, "--node", node, *source,
                           "--interval", "0.5", "--send-interval", "0", "--no-provenance", "--spool-dir", str(spool),
                           "--train-socket", str(sock), "--job-id", job_id, "--pid", str(rank.pid)],
                          tmp / f"agent-{node}.log"))
    try:
        # the trainers report before their agents listen (those reports are lost): the stuck one blocks
        # only once its agent has passed one on, and is stuck once its step no longer moves
        wait_for(lambda: stack.step(STUCK_JOB) is not None and stack.step(RUNNING_JOB) is not None, timeout=180,
                 interval=0.5, what="both trainers' steps at the collector")
        Path(str(marker) + ".block").touch()
        seen: list = []
        wait_for(lambda: seen.append(stack.step(STUCK_JOB)) or len(seen) > 2 and seen[-1] == seen[-2] == seen[-3],
                 timeout=180, interval=1.0, what="the stuck trainer's step to stop moving")
    except AssertionError as exc:
        stack.stop()
        raise AssertionError(f"{exc}\n{stack.logs()}") from None
    return stack
