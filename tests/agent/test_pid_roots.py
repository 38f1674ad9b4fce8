"""An agent's --pid root is (pid, start time): when the watched root exits and another user's process is given
its pid, neither that process nor its children are the job's.

Real pid reuse: the agent and its root run in a PID namespace of their own, where the root's pid, once it has
exited, is handed to nobody's shell (through the namespace's /proc/sys/kernel/ns_last_pid, which its root may
write), and the agent streams to a real collector on loopback.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import CLI, Collector, clean_environ, cli, metric_value, wait_for, with_agent_token

pytestmark = pytest.mark.e2e
JOB = "pid-root-1"

# pid 1 of the namespace: starts the root and the agent, then, told to, ends the root and gives its pid to
# nobody's `sh -c 'sleep 600 & wait'` (a shell with a child)
DRIVER = r"""
import json, os, subprocess, sys, time
from pathlib import Path
work, agent_argv = Path(sys.argv[1]), json.loads(sys.argv[2])
root = subprocess.Popen(["sleep", "600"])
log = open(work / "agent.log", "w")
agent = subprocess.Popen([*agent_argv, "--pid", str(root.pid)], stdout=log, stderr=subprocess.STDOUT)
(work / "root").write_text(str(root.pid))
while not (work / "go").exists():
    time.sleep(0.05)
root.kill()
root.wait()
for _ in range(100):   # the agent's threads fork nothing, but a retry costs nothing
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(root.pid - 1))
    other = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], user=65534, group=65534)
    if other.pid == root.pid:
        break
    other.kill()
    other.wait()
(work / "reused").write_text(str(other.pid))
while not (work / "done").exists():
    time.sleep(0.05)
agent.terminate()
print("agent exit", agent.wait(30), flush=True)
"""


def _status(collector: Collector) -> dict | None:
    r = cli("status", JOB, "--json", "--collector", collector.address)
    return json.loads(r.stdout) if r.returncode == 0 else None


def test_a_root_whose_pid_another_users_process_takes_is_not_followed(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    assert unshare, "unshare (util-linux) is needed for a PID namespace"
    work = tmp_path / "work"
    work.mkdir()
    collector = Collector(tmp_path)
    agent_argv = [*CLI, "agent", "--collector", collector.address, "--node", "ns-node", "--interval", "0.2",
                  "--send-interval", "0", "--gpu-source", "none", "--no-provenance", "--kmsg", "none",
                  "--job-id", JOB, "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "t.sock")]
    driver = subprocess.Popen([unshare, "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
                               sys.executable, "-c", DRIVER, str(work), json.dumps(agent_argv)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=with_agent_token(agent_argv, clean_environ()))  # the agent inherits it
    try:
        wait_for(lambda: (work / "root").exists(), what="the root in the namespace")
        root = int((work / "root").read_text())
        first = wait_for(lambda: (s := _status(collector)) and s["processes"] and s, timeout=60,
                         what=f"the root's process in status {JOB}")
        assert [(p["pid"], p["user"]) for p in first["processes"]] == [(root, "root")]
        (work / "go").write_text("")
        wait_for(lambda: (work / "reused").exists(), what="the root's pid given to another process")
        assert int((work / "reused").read_text()) == root, "the namespace gave the pid to another process"
        # a dozen polls after the pid went to nobody's shell
        batches = metric_value(collector.metrics(), "clusterwatch_ingest_batches_total") or 0
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_batches_total") or 0) >= batches + 12,
                 timeout=60, what="the agent's polls after the reuse")
        after = _status(collector)
        assert after is not None
        strangers = [(p["pid"], p["user"], p["command"]) for p in after["processes"] if p["user"] != "root"]
        assert strangers == []
    finally:
        (work / "done").write_text("")
        try:
            out, _ = driver.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            driver.kill()
            out, _ = driver.communicate()
        collector.stop()
    assert "agent exit 0" in out, out + (work / "agent.log").read_text()


def _one_poll(tmp_path: Path, *pid_args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    r = subprocess.run([*CLI, "agent", "--once", "--json", "--gpu-source", "none", "--no-provenance", "--kmsg", "none",
                        "--node", "once-node", "--spool-dir", str(tmp_path / "spool"), "--job-id", JOB, *pid_args],
                       capture_output=True, text=True, timeout=60, env=clean_environ())
    return r, (json.loads(r.stdout)["batch"]["processes"] if r.returncode == 0 else [])


def test_a_root_given_with_its_start_time_is_watched_only_while_the_time_matches(tmp_path: Path) -> None:
    from clusterwatch.agent.backends.procs import ProcSource

    other = subprocess.Popen(["sleep", "600"], user=65534, group=65534)   # nobody's
    try:
        started = ProcSource("n").start_time(other.pid)
        assert started is not None
        r, procs = _one_poll(tmp_path, "--pid", f"{other.pid}:{started:.2f}")
        assert r.returncode == 0, r.stderr
        assert [(p["pid"], p["job_id"], p["start_time"]) for p in procs] == [(other.pid, JOB, round(started, 2))]
        # the same pid given with the start time of a process that is gone: the one there now is not the root
        r, procs = _one_poll(tmp_path, "--pid", f"{other.pid}:{started - 3600:.2f}")
        assert r.returncode == 0, r.stderr
        assert procs == []
        assert f"--pid {other.pid}:" in r.stderr and "is another process now" in r.stderr
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("value", ["x", "12:y", "0", "12:-5", "12:"])
def test_a_malformed_pid_is_one_line(tmp_path: Path, value: str) -> None:
    r, _ = _one_poll(tmp_path, "--pid", value)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("clusterwatch: --pid ")


def test_a_malformed_pid_is_a_config_error() -> None:
    from clusterwatch.agent.roots import parse_root

    from clusterwatch.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--pid 'x': expected PID or PID:STARTTIME"):
        parse_root("x")
