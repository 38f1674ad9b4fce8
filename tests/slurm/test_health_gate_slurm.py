"""The prolog's health gate on the real two-node Slurm: a node whose health file says a GPU is lost refuses the
next job (slurmd drains it, Slurm requeues the job, which then runs on the other node); with the gate off, or a
stale file, the job runs.

The health file is written here as the agent writes it (clusterwatch/slurm/health_gate.py's HealthFile), so the
test drives the one thing the gate reads; agent/health_file.py's tests cover how an agent writes it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterwatch.slurm.health_gate import FILE_NAME, Finding, HealthFile
from tests.services.slurm import SlurmCluster, running_slurm_cluster
from tests.support.helpers import wait_for

pytestmark = pytest.mark.slurm

_PROLOG = """#!/bin/sh
set -a
[ -r {env} ] && . {env}
set +a
exec {python} -m clusterwatch.cli.main prolog 2>>{root}/prolog-$SLURMD_NODENAME.log
"""


@pytest.fixture(scope="module")
def gated() -> Iterator[tuple[SlurmCluster, Path, Path]]:
    """A cluster whose Prolog is `clusterwatch prolog`, its settings from an env file the tests rewrite."""
    root = Path(tempfile.mkdtemp(prefix="cw-gate-"))
    env_file = root / "hooks.env"
    prolog = root / "prolog.sh"
    prolog.write_text(_PROLOG.format(env=env_file, python=sys.executable, root=root))
    prolog.chmod(0o755)
    try:
        with running_slurm_cluster(root / "slurm", prolog=prolog) as cluster:
            yield cluster, root, env_file
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def node_spool(gated) -> Iterator[tuple[SlurmCluster, Path, Path]]:
    """Each test starts with both nodes up, no jobs and no health files."""
    cluster, root, env_file = gated
    spool = root / "spool"
    yield cluster, root, env_file
    jobs = cluster.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
    if jobs:
        cluster.run(["scancel", *jobs], check=False)
    for node in cluster.nodes:
        cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
    shutil.rmtree(spool, ignore_errors=True)
    wait_for(lambda: all(s == "idle" for s in cluster.node_states().values()), timeout=30, what="nodes idle")


def _settings(env_file: Path, root: Path, gate: str) -> None:
    env_file.write_text(f"CLUSTERWATCH_SPOOL={root}/spool/{{node}}\nCLUSTERWATCH_GATE={gate}\n")


def _health_file(root: Path, node: str, *, age_s: float = 0.0) -> None:
    """n's health file as its agent writes it: a lost GPU. The agent it names is this test's process, which
    runs: the gate takes a file whose writer is gone for an agent that is down."""
    spool = root / "spool" / node
    spool.mkdir(parents=True, exist_ok=True)
    spool.chmod(0o700)
    doc = HealthFile(written_at=time.time() - age_s, valid_for_s=60.0, agent_pid=os.getpid(),
                     findings=(Finding("gpu_lost", "GPU-gate0", since=time.time() - age_s),),
                     counters_read_at=time.time() - age_s)
    path = spool / FILE_NAME
    path.write_text(doc.to_json())
    path.chmod(0o600)


def _show(cluster: SlurmCluster, what: str, name: str) -> dict[str, str]:
    out = cluster.run(["scontrol", "show", what, name]).stdout
    fields = {}
    for token in out.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    with contextlib.suppress(IndexError):  # a node's reason holds spaces: the rest of its line
        fields["Reason"] = out.split("Reason=", 1)[1].splitlines()[0].strip()
    return fields


def _submit(cluster: SlurmCluster, *args: str) -> int:
    out = cluster.run(["sbatch", "--parsable", "-N1", "-J", "cw-gate", "-o", "/dev/null", *args,
                       "--wrap", "sleep 1"])
    return int(out.stdout.strip().split(";")[0])


def _prolog_log(root: Path, node: str) -> str:
    path = root / f"prolog-{node}.log"
    return path.read_text() if path.exists() else ""


def refused_then_runs_elsewhere(cluster: SlurmCluster, root: Path, reason: str) -> int:
    """Submit a one-node job while both nodes are idle, so Slurm gives it the first, whose prolog must refuse it
    for `reason`; check that Slurm drains that node and requeues the job, which then runs on the other node.
    Returns the job's id."""
    bad, good = cluster.nodes
    job = _submit(cluster)
    drained = wait_for(lambda: (f := _show(cluster, "node", bad)) and "DRAIN" in f["State"] and f,
                       timeout=60, what=f"{bad} drained by its failed prolog")
    assert f"job {job} refused: {reason}" in _prolog_log(root, bad)
    # Slurm 22.05 drains with its own reason (the prolog's output goes nowhere); the gate's is in the log above.
    assert drained["Reason"].startswith("Prolog error"), drained["Reason"]
    # Requeued and held (Slurm holds a job whose prolog failed unless nohold_on_prolog_fail is set).
    held = wait_for(lambda: (f := _show(cluster, "job", str(job))) and f["JobState"] == "PENDING" and f,
                    timeout=30, what=f"job {job} requeued")
    assert int(held["Restarts"]) >= 1 and "held" in held["Reason"].lower(), held
    # Released, and eligible now rather than after the 120 s Slurm waits before a requeued job may start
    # (Reason=BeginTime), it runs on the other node: the drained one takes no job.
    cluster.run(["scontrol", "release", str(job)])
    cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    cluster.wait_job_state(job, ["RUNNING", "COMPLETING", "COMPLETED"], timeout=60)
    assert _show(cluster, "job", str(job))["NodeList"] == good
    assert "DRAIN" in _show(cluster, "node", bad)["State"]
    return job


def test_a_node_with_a_lost_gpu_refuses_the_job_which_runs_elsewhere(node_spool) -> None:
    cluster, root, env_file = node_spool
    _settings(env_file, root, gate="1")
    _health_file(root, cluster.nodes[0])
    refused_then_runs_elsewhere(cluster, root, "clusterwatch gate: GPU-gate0: lost")


@pytest.mark.parametrize("gate, age_s", [("0", 0.0), ("1", 3600.0)], ids=["gate off", "stale file"])
def test_the_job_runs_when_the_gate_is_off_or_cannot_tell(node_spool, gate: str, age_s: float) -> None:
    cluster, root, env_file = node_spool
    node = cluster.nodes[0]
    _settings(env_file, root, gate=gate)
    _health_file(root, node, age_s=age_s)
    job = _submit(cluster, "-w", node)
    cluster.wait_job_state(job, ["COMPLETED"], timeout=60)
    assert "DRAIN" not in _show(cluster, "node", node)["State"]
    if age_s:
        assert f"gate: job {job}: the health file is stale" in _prolog_log(root, node)
