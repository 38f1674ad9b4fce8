"""Progress without instrumentation on the real two-node Slurm: a batch job, run as a real unprivileged user
(`sbatch --uid`), prints a tqdm bar to its StdOut, a file slurmstepd opens as that user and the job's processes hold
as fd 1. The prolog starts the agent with --read-job-output, as a site turns it on (CLUSTERWATCH_READ_JOB_OUTPUT=1 in
the hooks' env file); the agent opens the file as its owner. `status --json` shows the job's step rising, and once
the job stops printing training_stall fires (short windows from the collector's rules file).

Two shapes: the batch script itself prints (one node), and a two-node job whose tasks print through srun, so that
only srun and the batch script hold the StdOut file (the tasks write to srun's pipes) and the progress goes to the
job's lowest rank on the node that holds it.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.procs import pid_alive, read_pid, stop_pid
from tests.services.slurm import SlurmCluster, running_slurm_cluster
from tests.slurm.test_slurm_e2e import _HOOK  # the prolog and epilog as a site writes them
from tests.support.helpers import AGENT_TOKEN, Collector, cli, wait_for
from tests.support.local_users import SYSTEM_PYTHON, Users, group_and_two_users
from tests.support.stalling_job import RULES, RULES_LOOK_S

pytestmark = pytest.mark.slurm

# A job that never calls clusterwatch.train: rank 0 writes a tqdm bar ("\r" before each update) to its stdout
# until the stop file exists, then sleeps (its output stops; the process lives on).
JOB = """
import os, sys, time
if os.environ.get("SLURM_PROCID", "0") == "0":
    n = 0
    while not os.path.exists(sys.argv[1]):
        n += 1
        sys.stdout.write(f"\\r{n // 1000:3d}%|#         | {n}/100000 [00:01<00:10, 10.0it/s]")
        sys.stdout.flush()
        time.sleep(0.1)
time.sleep(300)
"""


@pytest.fixture(scope="module")
def reading() -> Iterator[tuple[SlurmCluster, Collector, Path, Users]]:
    """A cluster whose prolog starts agents that read jobs' output, a --slurm collector with short rule windows,
    and a real unprivileged user to run the jobs as."""
    root = Path(tempfile.mkdtemp(prefix="cw-jo-"))
    root.chmod(0o755)  # the job's user runs the batch script slurmd keeps under the cluster's spool
    env_file, spool = root / "hooks.env", root / "spool"
    hooks = {}
    for kind in ("prolog", "epilog"):
        hooks[kind] = root / f"{kind}.sh"
        hooks[kind].write_text(_HOOK.format(env=env_file, python=sys.executable, kind=kind, root=root))
        hooks[kind].chmod(0o755)
    rules = root / "rules.toml"
    rules.write_text(RULES)
    try:
        with group_and_two_users("cwjo") as users, \
                running_slurm_cluster(root / "slurm", prolog=hooks["prolog"], epilog=hooks["epilog"]) as cluster:
            # srun inside the job runs as the job's user and authenticates through munged's socket: its folder
            # is root's alone while munged starts (munged insists); opened for traversal now (the key stays 0600).
            (cluster.root / "munge").chmod(0o711)
            saved = os.environ.get("SLURM_CONF")
            os.environ["SLURM_CONF"] = str(cluster.conf)
            try:
                collector = Collector(root, "--slurm", "--slurm-refresh", "1", "--rules", str(rules),
                                      "--rules-interval", str(RULES_LOOK_S))
            finally:
                if saved is None:
                    os.environ.pop("SLURM_CONF", None)
                else:
                    os.environ["SLURM_CONF"] = saved
            try:
                token_file = root / "token"  # the collector's token, in a root-only file as the prologs read it
                token_file.write_text(AGENT_TOKEN + "\n")
                token_file.chmod(0o600)
                env_file.write_text(
                    f"CLUSTERWATCH_COLLECTOR={collector.address}\n"
                    f"CLUSTERWATCH_TOKEN_FILE={token_file}\n"
                    f"CLUSTERWATCH_SPOOL={spool}/{{node}}\n"
                    "CLUSTERWATCH_GPU_SOURCE=none\n"
                    "CLUSTERWATCH_INTERVAL=1\n"
                    "CLUSTERWATCH_READ_JOB_OUTPUT=1\n"
                    f"CLUSTERWATCH_TRAIN_SOCKET={root}/train.sock\n"
                )
                yield cluster, collector, root, users
            finally:
                _stop_agents(spool)
                collector.stop()
    finally:
        _stop_agents(spool)
        shutil.rmtree(root, ignore_errors=True)


def _stop_agents(spool: Path) -> None:
    for pid_file in sorted(spool.glob("*/agent.pid")):
        pid = read_pid(pid_file)
        if pid is not None and pid_alive(pid):
            stop_pid(pid, grace=15.0)


def _status(collector: Collector, job_id: int) -> dict | None:
    r = cli("status", str(job_id), "--collector", collector.address, "--json", timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else None


def _stepping(collector: Collector, job_id: int) -> list[dict]:
    doc = _status(collector, job_id)
    return [p for p in (doc or {}).get("processes", []) if p.get("step") is not None]


@pytest.mark.parametrize("nodes", [1, 2], ids=["the batch script prints", "two nodes' tasks print through srun"])
def test_a_jobs_own_output_gives_its_steps_then_its_stall(reading, nodes: int) -> None:
    cluster, collector, root, users = reading
    work = Path(tempfile.mkdtemp(prefix=f"job{nodes}-", dir=root))
    work.chmod(0o755)
    shutil.chown(work, users.member)  # where Slurm writes the job's StdOut, as the job's user
    (work / "job.py").write_text(JOB)
    stop = work / "stop"
    run = f"{SYSTEM_PYTHON} {work}/job.py {stop}"
    script = work / "job.sh"
    script.write_text(f"#!/bin/sh\n{'srun ' if nodes > 1 else 'exec '}{run}\n")
    script.chmod(0o755)
    out = cluster.run(["sbatch", "--parsable", f"--uid={users.member}", f"-N{nodes}", "--ntasks-per-node=1",
                       "-J", f"cw-jo{nodes}", f"--chdir={work}", "-o", f"{work}/out-%j.txt", str(script)])
    job_id = int(out.stdout.strip().split(";")[0])
    try:
        cluster.wait_job_state(job_id, ["RUNNING"], timeout=30)
        output = work / f"out-{job_id}.txt"
        try:
            wait_for(lambda: output.exists() and output.stat().st_size > 0, timeout=30, what="the job's StdOut")
        except AssertionError as exc:
            shown = cluster.run(["scontrol", "show", "job", str(job_id)], check=False).stdout
            raise AssertionError(f"{exc}: {sorted(os.listdir(work))}\n{shown}\n{cluster.logs()}") from None
        assert output.stat().st_uid != 0  # Slurm wrote it as the job's user: the agent opens it as that user

        def first() -> dict | None:
            found = _stepping(collector, job_id)
            return found[0] if found else None

        try:
            proc = wait_for(first, timeout=60, interval=0.5, what=f"job {job_id}'s step from its output")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_agent_logs(root)}\n{_status(collector, job_id)}") from None
        doc = _status(collector, job_id)
        assert doc is not None and doc["job"]["user"] == users.member, doc
        # One node: the batch script writes the file, and it has no rank. Two: only the batch script and srun
        # hold it, so the progress goes to the job's lowest rank on the node holding it (n1 runs the batch step).
        assert (proc["node"], proc["rank"]) == (cluster.nodes[0], 0 if nodes > 1 else None), proc
        assert len(_stepping(collector, job_id)) == 1  # one process carries it, not every writer of the file
        wait_for(lambda: (s := _stepping(collector, job_id)) and s[0]["step"] > proc["step"] + 10, timeout=60,
                 interval=0.5, what="the step rising")
        if nodes > 1:
            holds = {p["node"] for p in doc["processes"]}
            assert holds == set(cluster.nodes[:nodes]), doc["processes"]  # the job is seen on both nodes
        stop.write_text("")
        alert = wait_for(lambda: _stall(collector, job_id), timeout=90, interval=0.5,
                         what="training_stall once the output stops")
        assert (alert["node"], alert["pid"]) == (proc["node"], proc["pid"]), alert
    finally:
        cluster.run(["scancel", str(job_id)], check=False)
        cluster.wait_job_state(job_id, ["CANCELLED", "COMPLETED", "FAILED"], timeout=30)


def _stall(collector: Collector, job_id: int) -> dict | None:
    """Job `job_id`'s firing training_stall, None while there is none."""
    r = cli("alerts", "--collector", collector.address, "--json")
    alerts = json.loads(r.stdout).get("alerts", []) if r.returncode == 0 else []
    return next((a for a in alerts if a["rule"] == "training_stall" and a["state"] == "firing"
                 and a.get("job_id") == str(job_id)), None)


def _agent_logs(root: Path) -> str:
    parts = []
    for path in sorted((root / "spool").glob("*/agent.log")) + sorted(root.glob("prolog-*.log")):
        parts.append(f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-20:]))
    return "\n".join(parts)
