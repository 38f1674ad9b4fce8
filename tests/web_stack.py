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
from tests.support.helpers import CLI, SIM_RUN, Collector, Proc, clean_environ, cli, wait_for
from tests.support.trainers import start_trainer

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


# -- behind the site's authenticating proxy: what the tests' stand-in for it sends, besides the user's header --

PROXY_SECRET = "5f0c2e9a7d41b8c3e6f1a0d9b2c7e4f85a1d3c6b9e0f2a4c"
PROXY_SECRET_HEADER = "X-Clusterwatch-Proxy-Secret"


def proxy_secret_args(folder: Path) -> list[str]:
    """--web-proxy-secret-file FILE, the file holding PROXY_SECRET written in `folder`, mode 0600."""
    path = folder / "web-proxy-secret"
    path.write_text(PROXY_SECRET + "\n")
    path.chmod(0o600)
    return ["--web-proxy-secret-file", str(path)]


# -- the job page's actions: a collector with --web-actions and two real trainers using clusterwatch.train --

RUNNING_JOB, STUCK_JOB = "act-run", "act-stuck"


@dataclass
class ActionsStack:
    """A collector serving pages with actions; job RUNNING_JOB (a "loop" trainer on a simulated GPU, whose
    checkpoint handler appends to `marker`) and STUCK_JOB (a "stuck" trainer, blocked in
    blocked_in_collective once the collector has seen its step move), each with its own real agent
    (tests/support/trainers.py)."""

    collector: Collector
    trainers: list
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

    def logs(self) -> str:
        return "\n".join([f"--- {self.collector.log.name}\n{self.collector.text()[-2000:]}",
                          *(t.logs() for t in self.trainers)])

    def stop(self) -> None:
        for t in reversed(self.trainers):
            t.stop()
        self.collector.stop()


def start_actions_stack(tmp: Path, *collector_args: str) -> ActionsStack:
    collector = Collector(tmp, "--web-listen", "127.0.0.1:0", *collector_args)
    marker = tmp / "checkpoints.txt"
    stack = ActionsStack(collector, [], json.loads(collector.ports_file.read_text())["web"], marker)
    try:
        for job_id, mode, node, gpu in ((RUNNING_JOB, "loop", "act-node1", True),
                                        (STUCK_JOB, "stuck", "act-node2", False)):
            stack.trainers.append(start_trainer(tmp, collector.address, job_id, mode, node, gpu=gpu, marker=marker))
        running, stuck = stack.trainers
        running.stepping()
        stuck.stepping()
        stuck.stuck()
    except AssertionError as exc:
        stack.stop()
        raise AssertionError(f"{exc}\n{stack.logs()}") from None
    return stack
