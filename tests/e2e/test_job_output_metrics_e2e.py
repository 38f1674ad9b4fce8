"""What the agent's job-output reader does, on the collector's /metrics: a real agent (--read-job-output) follows
one rank's output file and refuses another's that its owner cannot read (a descriptor opened for writing only), and
the collector exports both counts for the node, with the agent's read errors."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from clusterwatch.agent.spool import write_event
from prometheus_client.parser import text_string_to_metric_families

from clusterwatch.model import JobEvent
from tests.support.helpers import CLI, Collector, Proc, unique_job_id, wait_for
from tests.support.local_users import SYSTEM_PYTHON

pytestmark = pytest.mark.e2e

BAR = ("import sys, time\nn = 0\nwhile True:\n    n += 1\n"
       "    sys.stdout.write(f'\\r{n // 10:3d}%|#  | {n}/1000 [00:01<00:10, 20.0it/s]')\n"
       "    sys.stdout.flush()\n    time.sleep(0.2)\n")


def _node_series(collector: Collector, node: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(collector.metrics()) for s in f.samples
            if s.name.startswith("clusterwatch_agent_") and s.labels.get("node") == node}


def _exec_done(proc: subprocess.Popen) -> bool:
    """Whether runuser's child has exec'd the system python (its uid and descriptors are the rank's)."""
    for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == SYSTEM_PYTHON.encode():
                return True
        except OSError:
            continue
    return False


def _kill_with_children(proc: subprocess.Popen) -> None:
    """runuser and the rank it forked (runuser's SIGKILL would leave the rank running)."""
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        children = []
    for pid in children:
        subprocess.run(["kill", "-9", pid], capture_output=True)
    proc.kill()
    proc.wait()


def test_the_files_followed_and_refused_are_counted_on_metrics(tmp_path) -> None:
    job_id, node = unique_job_id(), "jom1"
    spool = tmp_path / "spool"
    shared = Path(tempfile.mkdtemp(prefix="cw-jom-", dir="/var/tmp"))  # reachable by nobody (tmp_path is not)
    shared.chmod(0o755)
    env = {"SLURM_JOB_ID": job_id, "SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "PATH": "/usr/bin:/bin"}
    readable = Proc([sys.executable, "-c", BAR], tmp_path / f"slurm-{job_id}.out", env=env)
    # nobody's rank writes to nobody's file, mode 0200: the owner may write it but not read it, so the agent,
    # which opens it as the owner, is refused
    write_only = shared / "write-only.out"
    write_only.write_text("")
    shutil.chown(write_only, "nobody")
    write_only.chmod(0o200)
    refused = subprocess.Popen(["/usr/sbin/runuser", "-u", "nobody", "--", "/bin/sh", "-c",
                                f'exec {SYSTEM_PYTHON} -c "$1" >>"$0"', str(write_only), BAR],
                               cwd="/", env={**env, "SLURM_PROCID": "1"}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # runuser (root, in the
    # job by its environment) would have the test's own output files, root's, which the agent follows
    # the agent starts once the rank is python: before, it is runuser's child (root, with the test's stdout), a
    # file the agent could be refused too, which would count
    wait_for(lambda: _exec_done(refused), timeout=30, what="nobody's rank to start")
    write_event(str(spool), JobEvent("start", job_id, time.time()))
    collector = Collector(tmp_path)
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", node, "--interval", "0.5",
                  "--send-interval", "0", "--no-provenance", "--gpu-source", "none", "--spool-dir", str(spool),
                  "--train-socket", str(tmp_path / "train.sock"), "--kmsg", "none", "--read-job-output"],
                 tmp_path / "agent.log", env={"SLURMD_NODENAME": node, "PATH": "/usr/bin:/bin"})
    try:
        seen = wait_for(lambda: (lambda s: s if s.get("clusterwatch_agent_job_output_files") == 1.0
                                 and s.get("clusterwatch_agent_job_output_refused_total") == 1.0 else None)(
                                     _node_series(collector, node)),
                        timeout=90, interval=0.5, what="one file followed and one refused on /metrics")
        assert seen["clusterwatch_agent_job_output_errors_total"] == 0.0
        assert "clusterwatch_agent_read_errors_total" in seen
        assert "not reading the output" in agent.text() and "write-only" not in agent.text()
    finally:
        code = agent.stop()
        collector.stop()
        readable.stop()
        _kill_with_children(refused)
        shutil.rmtree(shared, ignore_errors=True)
    assert code == 0
