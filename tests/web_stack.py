"""A real collector serving its web pages, fed by a real agent with a simulated GPU and one real rank whose
simulated GPU memory leaks 40 MiB/s (the demo's short leak rules fire within a minute), and which names
itself, argues and tags itself with HTML that would run were it not escaped.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
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


# -- jobs with one faulty rank among healthy ones: the job page must show which --------------------------------

LEAK_JOB, STALL_JOB = "web-leak", "web-stall"
LEAKING_RANK, STALLED_RANK, RANKS = 1, 2, 3
GIB = 2**30

# A rank of a data-parallel job: its simulated GPU memory steady at 20 GiB with a little jitter, or leaking
# 40 MiB/s ("leak"); it reports its step, loss and lr ten times a second, and a "stall" rank stops (a hung
# collective) once the file STALL exists, which the test makes after the collector has seen its step move.
FAULT_WORKLOAD = textwrap.dedent("""
    import os, random, sys, time
    from clusterwatch import train
    mode, stall = sys.argv[1], sys.argv[2]
    mem_file, started, step = os.environ["CLUSTERWATCH_SIM_GPU_MEM_FILE"], time.time(), 0
    while True:
        step += 1
        grown = 40 * (time.time() - started) if mode == "leak" else 0
        with open(mem_file + ".tmp", "w") as f:
            f.write(str(int((20480 + grown + random.uniform(-40, 40)) * 2**20)))
        os.replace(mem_file + ".tmp", mem_file)
        train.report(step=step, loss=2.0 / (1 + step / 200), lr=3e-4)
        if mode == "stall" and os.path.exists(stall):
            time.sleep(3600)
        time.sleep(0.1)
""")


@dataclass
class FaultStack:
    """A collector (web pages on, the demo's short rules) with LEAK_JOB (rank LEAKING_RANK leaks) and STALL_JOB
    (rank STALLED_RANK stalls once stall() is called), RANKS ranks each on a node of its own agent."""

    collector: Collector
    procs: list
    web_port: int
    stall_file: Path
    sock_dirs: list = field(default_factory=list)  # the training sockets' short folders, removed at stop

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.web_port}{path}"

    def status_json(self, job_id: str) -> dict | None:
        r = cli("status", job_id, "--json", "--collector", self.collector.address)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def _steps(self, job_id: str) -> dict:
        s = self.status_json(job_id) or {}
        return {p.get("rank"): p.get("step") for p in s.get("processes", [])}

    def firing(self, job_id: str, rule: str) -> dict | None:
        s = self.status_json(job_id) or {}
        return next((a for a in s.get("alerts", []) if a["rule"] == rule and a["state"] == "firing"), None)

    def stall(self) -> None:
        """Stop STALLED_RANK once the collector has seen its step move."""
        seen: set = set()
        wait_for(lambda: seen.add(self._steps(STALL_JOB).get(STALLED_RANK)) or len(seen - {None}) >= 2,
                 timeout=90, interval=0.5, what="the stalling rank's step moving at the collector")
        self.stall_file.touch()

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.text()[-1500:]}" for p in (self.collector, *self.procs))

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.collector.stop()
        for folder in self.sock_dirs:
            shutil.rmtree(folder, ignore_errors=True)


def start_fault_stack(tmp: Path) -> FaultStack:
    collector = Collector(tmp, "--rules", str(DEMO_RULES), "--web-listen", "127.0.0.1:0")
    stack = FaultStack(collector, [], json.loads(collector.ports_file.read_text())["web"], tmp / "stall")
    try:
        for job_id, node, faulty, mode in ((LEAK_JOB, "leak-node", LEAKING_RANK, "leak"),
                                           (STALL_JOB, "stall-node", STALLED_RANK, "stall")):
            folder = tmp / job_id
            spool = folder / "spool"
            spool.mkdir(parents=True)
            write_event(str(spool), JobEvent("start", job_id, time.time(), os.getuid(),
                                             gpu_indexes=",".join(map(str, range(RANKS)))))
            script = folder / "rank.py"
            script.write_text(FAULT_WORKLOAD)
            stack.sock_dirs.append(Path(tempfile.mkdtemp(prefix="cw-web-", dir="/tmp")))  # 107 bytes at most
            sock = stack.sock_dirs[-1] / "train.sock"
            pids = []
            for rank in range(RANKS):
                env = dict(clean_environ(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS),
                           CLUSTERWATCH_SIM_GPU=str(rank), CLUSTERWATCH_SIM_NODE=node,
                           CLUSTERWATCH_SIM_PROFILE="steady", CLUSTERWATCH_SIM_RUN=SIM_RUN,
                           CLUSTERWATCH_SIM_GPU_MEM_FILE=str(folder / f"gpu-mem-rank{rank}"),
                           CLUSTERWATCH_TRAIN_SOCKET=str(sock))
                proc = Proc([sys.executable, str(script), mode if rank == faulty else "steady", str(stack.stall_file)],
                            folder / f"rank{rank}.log", env=env)
                stack.procs.append(proc)
                pids += ["--pid", str(proc.pid)]
            stack.procs.append(Proc([*CLI, "agent", "--collector", collector.address, "--node", node,
                                     "--gpu-source", "sim", "--sim-run", SIM_RUN, "--interval", "1",
                                     "--no-provenance", "--spool-dir", str(spool), "--train-socket", str(sock),
                                     "--job-id", job_id, *pids], folder / "agent.log"))
        for job_id in (LEAK_JOB, STALL_JOB):
            wait_for(lambda j=job_id: len([s for s in stack._steps(j).values() if s]) == RANKS, timeout=90,
                     interval=0.5, what=f"{job_id}'s ranks stepping at the collector")
    except AssertionError as exc:
        stack.stop()
        raise AssertionError(f"{exc}\n{stack.logs()}") from None
    return stack
