"""Helpers for tests that start real clusterwatch processes on loopback."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from bench.waiting import wait_for as wait_for  # the one wait of the tests and benches, re-exported
from tests.support.hermetic import SUITE_SETTINGS

CLI = [sys.executable, "-m", "clusterwatch.cli.main"]

#: This test session's simulated-GPU run (CLUSTERWATCH_SIM_RUN): its sources play only its own processes,
#: never those of another session, a demo or a benchmark running on the same host.
SIM_RUN = f"tests-{os.getpid()}-{uuid.uuid4().hex[:8]}"


# the repository's root and its tests folder, wherever a test file lies under it
ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


#: The agents' token of every collector and agent the tests start (Proc gives it to them), as a deployment's
#: would share one: under the default --agent-auth auto a collector without it would take munge (installed here,
#: whatever munged runs) or nothing, and refuse the actions the tests ask. A test of agent authentication passes
#: its own --token, --agent-auth or --tls-client-ca. AGENT_METADATA is what a test's own raw stream sends.
AGENT_TOKEN = f"tests-agent-token-{uuid.uuid4().hex}"
AGENT_METADATA = (("authorization", f"Bearer {AGENT_TOKEN}"),)
_OWN_AGENT_AUTH = ("--token", "--agent-auth", "--tls-client-ca")


def with_agent_token(args: list[str], env: dict[str, str]) -> dict[str, str]:
    """`env` with the tests' AGENT_TOKEN when `args` start a collector or an agent that names no auth of its own
    (the CLI may come behind a wrapper: prlimit, runuser)."""
    at = next((i + len(CLI) for i in range(len(args)) if args[i:i + len(CLI)] == CLI), len(args))
    command = next((a for a in args[at:at + 3] if a in ("collector", "agent")), None)  # after a --config FILE
    if command is None or any(a in _OWN_AGENT_AUTH for a in args):
        return env
    return {**env, "CLUSTERWATCH_TOKEN": env.get("CLUSTERWATCH_TOKEN", AGENT_TOKEN)}


def clean_environ(base: dict | None = None) -> dict[str, str]:
    """`base` (default os.environ) without any CLUSTERWATCH_* variable but the suite's own
    (tests/support/hermetic.py): the caller's settings (a token, a collector address, a config file) must not
    reach the processes a test starts."""
    return {k: v for k, v in (os.environ if base is None else base).items()
            if not k.startswith("CLUSTERWATCH_") or k in SUITE_SETTINGS}


class Proc:
    """A child process with its log file; stopped by its pid.

    `env` is the whole environment, as the test built it; without one, this environment without any
    CLUSTERWATCH_* variable. A collector or an agent gets the tests' AGENT_TOKEN (with_agent_token).
    """

    def __init__(self, args: list[str], log: Path, env: dict | None = None) -> None:
        self.log = log
        env = with_agent_token(args, clean_environ() if env is None else env)
        with open(log, "ab") as f:
            self.popen = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()


class Collector(Proc):
    """`clusterwatch collector` on free loopback ports."""

    def __init__(self, tmp: Path, *extra: str, db: Path | None = None, name: str = "collector",
                 listen: str = "127.0.0.1:0") -> None:
        self.ports_file = tmp / f"{name}-ports.json"
        if self.ports_file.exists():
            self.ports_file.unlink()
        # Queries open to all unless a test asks for munge: `auto` depends on this host's munged
        # (refused while munge is installed but down), and a test must not.
        auth = [] if "--query-auth" in extra else ["--query-auth", "none"]
        # no web pages unless a test asks: the default port is one for the whole host
        web = [] if "--web-listen" in extra else ["--web-listen", "none"]
        super().__init__(
            [*CLI, "collector", "--listen", listen, "--metrics-listen", "127.0.0.1:0",
             "--db", str(db or tmp / "clusterwatch.db"), "--ports-file", str(self.ports_file), *auth, *web,
             *extra],
            tmp / f"{name}.log",
        )
        wait_for(lambda: self.ports_file.exists() or self.popen.poll() is not None, what="collector ports")
        if self.popen.poll() is not None:
            raise AssertionError(f"collector exited: {self.text()}")
        ports = json.loads(self.ports_file.read_text())
        self.grpc_port, self.metrics_port = ports["grpc"], ports["metrics"]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()


def popen_exec_done(args: list[str], **kwargs) -> subprocess.Popen:
    """Popen, returned once the child's execve is through (its environment readable).

    Popen returns when execve has switched the child to the new program, before its environment is laid out:
    a test that reads the child at once, as an agent that polls right then would, finds it looked up later.
    """
    from clusterwatch.procfs import ExecInProgress, read_environ

    child = subprocess.Popen(args, **kwargs)

    def through() -> bool:
        try:
            read_environ("/proc", child.pid)
        except ExecInProgress:
            return False
        return True

    wait_for(through, timeout=10.0, interval=0.001, what=f"execve of {args[0]}")
    return child


def unique_job_id() -> str:
    """A job id no other test uses at the same time. An agent watching an announced job takes every process of
    the host whose SLURM_JOB_ID is the job's, tests run side by side, and the test Slurm clusters number their
    jobs below 60,000,000 (tests/services/slurm.py): a fixed id, or a small one, shares a job with another test."""
    return str(random.SystemRandom().randrange(10**8, 10**9))


def kmsg_record(seq: int, message: str) -> str:
    """One /dev/kmsg record as the kernel writes it (priority, record number, microseconds since boot on the
    monotonic clock): what the agent's --kmsg reader takes, for a kernel-log file a test writes."""
    return f"3,{seq},{int(time.monotonic() * 1e6)},-;{message}\n"


def firing_alert(collector: "Collector", rule: str) -> dict | None:
    """The first firing alert of `rule` as `clusterwatch alerts --json` lists it, None while there is none."""
    r = cli("alerts", "--collector", collector.address, "--json")
    if r.returncode != 0:
        return None
    for entry in json.loads(r.stdout).get("alerts", []):
        if entry["rule"] == rule and entry["state"] == "firing":
            return entry
    return None


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the first series `name{labels…}` in an exposition text, None if absent."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def cli(*args: str, env: dict | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run the CLI with this environment less its CLUSTERWATCH_* variables, plus `env`."""
    full_env = clean_environ()
    if env:
        full_env.update(env)
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=full_env)


def left_behind(variable: str, value: str) -> list[int]:
    """Live processes (not zombies) whose environment holds variable=value: what a test's children left."""
    found = []
    needle = f"{variable}={value}".encode()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    found.append(int(name))
        except OSError:
            continue
    return found
