"""Slurm end to end: a real two-node cluster whose Prolog/Epilog call `clusterwatch prolog`/`epilog`, agents the
prolog starts, a collector with --slurm, and `clusterwatch status` checked against `scontrol listpids`.

Also the SSH fill-in: a collector with no agent at all learns a job's processes by `scontrol listpids` run on
each node over a real sshd.
"""
from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterwatch.slurm.listpids import parse_listpids
from tests.services.procs import pid_alive, read_pid, stop_pid
from tests.services.slurm import (  # noqa: F401  (fixtures)
    SlurmCluster,
    running_slurm_cluster,
    slurm_cluster,
    slurm_hooks,
    two_node_gpu_job,
)
from tests.services.sshd import SshServer, slurm_sshd  # noqa: F401  (fixtures)
from tests.support.helpers import AGENT_TOKEN, Collector, cli, metric_value, wait_for

pytestmark = pytest.mark.slurm

WORKLOAD = "import time; time.sleep(20)"

_HOOK = """#!/bin/sh
# Slurm drains a node whose hook fails: whatever happens, exit 0.
set -a
[ -r {env} ] && . {env}
set +a
{python} -m clusterwatch.cli.main {kind} 2>>{root}/{kind}-$SLURMD_NODENAME.log
exit 0
"""


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set variables for a child started inside the block (Popen copies the environment at start)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _status(job_id: int, collector: Collector) -> dict | None:
    out = cli("status", str(job_id), "--json", "--collector", collector.address, timeout=30)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _listpids(cluster: SlurmCluster, job_id: int, node: str) -> set[int]:
    """The job's task pids on the node, by `scontrol listpids` (slurmstepd's own short-lived helpers, which
    it lists without a task id, come and go and are left out)."""
    out = cluster.run(["scontrol", "listpids", str(job_id), node], check=False)
    if out.returncode != 0:
        return set()
    return {e.pid for e in parse_listpids(out.stdout) if e.local_id is not None}


def _by_node(doc: dict, alive_only: bool = True) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for p in doc["processes"]:
        if p["alive"] or not alive_only:
            out.setdefault(p["node"], set()).add(p["pid"])
    return out


@pytest.fixture(scope="module")
def hooked() -> Iterator[tuple[SlurmCluster, Collector, Path]]:
    """A cluster whose Prolog/Epilog run clusterwatch, and a --slurm collector; agents stopped at the end."""
    root = Path(tempfile.mkdtemp(prefix="cw-e2e-"))
    env_file = root / "hooks.env"
    hooks = {}
    for kind in ("prolog", "epilog"):
        path = root / f"{kind}.sh"
        path.write_text(_HOOK.format(env=env_file, python=sys.executable, kind=kind, root=root))
        path.chmod(0o755)
        hooks[kind] = path
    spool = root / "spool"
    try:
        with running_slurm_cluster(root / "slurm", prolog=hooks["prolog"], epilog=hooks["epilog"]) as cluster:
            with _environ(SLURM_CONF=str(cluster.conf)):
                collector = Collector(root, "--slurm", "--slurm-refresh", "1")
            try:
                # The collector takes the tests' token; the prologs read it from a root-only token file, as
                # docs/how-to/secure.md sets a cluster up, and hand it to the agents they start.
                token_file = root / "token"
                token_file.write_text(AGENT_TOKEN + "\n")
                token_file.chmod(0o600)
                # Read by the hooks at each job: where the agents they start report, and how.
                env_file.write_text(
                    f"CLUSTERWATCH_COLLECTOR={collector.address}\n"
                    f"CLUSTERWATCH_TOKEN_FILE={token_file}\n"
                    f"CLUSTERWATCH_SPOOL={spool}/{{node}}\n"
                    "CLUSTERWATCH_GPU_SOURCE=sim\n"
                    "CLUSTERWATCH_INTERVAL=1\n"
                    f"CLUSTERWATCH_TRAIN_SOCKET={root}/train.sock\n"
                )
                yield cluster, collector, spool
            finally:
                _stop_agents(spool)
                collector.stop()
    finally:
        # Again once slurmd is gone: a prolog still running at teardown may have started one late.
        _stop_agents(spool)
        shutil.rmtree(root, ignore_errors=True)


def _stop_agents(spool: Path) -> list[int]:
    """Stop the agents the prologs started, each by the pid in its node's pid file; return their pids."""
    stopped = []
    for pid_file in sorted(spool.glob("*/agent.pid")):
        pid = read_pid(pid_file)
        if pid is not None and pid_alive(pid):
            stop_pid(pid, grace=15.0)  # it flushes to the collector for up to 5 s before it exits
            stopped.append(pid)
    return stopped


def test_two_node_job_seen_whole_closed_by_the_epilog_and_kept(hooked) -> None:
    cluster, collector, spool = hooked
    name = "cw-e2e-job"
    srun = cluster.popen(["srun", "-N2", "--ntasks-per-node=1", "--gres=gpu:1", "-J", name,
                          sys.executable, "-c", WORKLOAD])
    try:
        job_id = int(wait_for(lambda: cluster.run(["squeue", "-h", "-n", name, "-o", "%i"]).stdout.strip(),
                              timeout=30, what="the job in squeue"))
        cluster.wait_job_state(job_id, ["RUNNING"])

        def tasks_everywhere() -> bool:
            return all(_listpids(cluster, job_id, n) for n in cluster.nodes)

        wait_for(tasks_everywhere, timeout=30, what="the tasks on both nodes")
        expected = {n: _listpids(cluster, job_id, n) for n in cluster.nodes}

        def seen_whole() -> dict | None:
            doc = _status(job_id, collector)
            if doc is None or doc["job"]["source"] != "slurm" or _by_node(doc) != expected:
                return None
            if len(doc["gpus"]) != 2:
                return None
            return doc

        doc = wait_for(seen_whole, timeout=30, what=f"status {job_id} to show both nodes as listpids does")
        job = doc["job"]
        assert job["user"] == getpass.getuser()
        assert job["state"] == "RUNNING"
        assert job["name"] == name
        assert job["nodes"] == list(cluster.nodes)
        assert job["ranks_expected"] == 2
        assert job["gpus"] == 2
        ranks = sorted((p["node"], p["rank"]) for p in doc["processes"])
        assert ranks == [("n1", 0), ("n2", 1)]
        assert {p["mapped_by"] for p in doc["processes"]} == {"environ"}
        # One allocated GPU per node, named by the UUID the node's agent has for Slurm's index.
        assert sorted(g["node"] for g in doc["gpus"]) == ["n1", "n2"]
        assert all(g["uuid"].startswith("GPU-") for g in doc["gpus"])
        assert metric_value(collector.metrics(), "clusterwatch_job_info", job_id=str(job_id)) == 1.0

        # Each prolog started its node's agent; nothing else is an agent of these spools.
        pids = {n: read_pid(spool / n / "agent.pid") for n in cluster.nodes}
        assert all(p is not None and pid_alive(p) for p in pids.values()), pids

        out, err = srun.communicate(timeout=60)
        assert srun.returncode == 0, err
        finished = time.monotonic()

        def closed() -> dict | None:
            doc = _status(job_id, collector)
            return doc if doc is not None and doc["job"]["state"] == "COMPLETED" else None

        wait_for(closed, timeout=30, what=f"job {job_id} to be closed")
        # The epilogs' end events closed it: the registry alone would wait out its 10 s grace.
        assert time.monotonic() - finished < 9.0, collector.text()[-3000:]
        wait_for(lambda: not list(spool.glob("*/events/*.json")), timeout=10, what="the agents to take the events")
        # An end event arriving after the close must not replace the summary. Each agent sent its end event at
        # once, on its one ordered stream, before the file went: a batch the collector applies from each node
        # over a second after that came behind it.
        taken = time.time()

        def applied_after(node: str) -> bool:
            seen = metric_value(collector.metrics(), "clusterwatch_node_last_seen_timestamp_seconds", node=node)
            return seen is not None and seen > taken + 1.0

        wait_for(lambda: all(applied_after(n) for n in cluster.nodes), timeout=30,
                 what="a batch from each node behind its end event")
        doc = closed()
        assert doc is not None, collector.text()[-3000:]
        assert doc["job"]["exit_code"] == 0
        assert doc["job"]["end_time"] > doc["job"]["start_time"] > 0
        assert _by_node(doc, alive_only=False) == expected  # the summary keeps the processes
        assert metric_value(collector.metrics(), "clusterwatch_job_info", job_id=str(job_id)) is None
        listed = json.loads(cli("jobs", "--json", "--collector", collector.address).stdout or "{}")
        assert str(job_id) not in {j["job_id"] for j in listed.get("jobs", [])}
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
    stopped = _stop_agents(spool)
    assert sorted(stopped) == sorted(pids.values())
    assert not any(pid_alive(p) for p in stopped)


def _slurm_final(cluster: SlurmCluster, job_id: int) -> tuple[str, int] | None:
    """(JobState, exit code as clusterwatch gives it: the code, or 128 + the signal) once Slurm has the job's
    final state (no longer COMPLETING); None before."""
    fields = dict(t.split("=", 1) for t in cluster.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout.split()
                  if "=" in t)
    if fields.get("JobState") in ("RUNNING", "COMPLETING", "PENDING", None):
        return None
    code, signal = (int(x) for x in fields["ExitCode"].split(":"))
    return fields["JobState"], 128 + signal if signal else code


def test_a_cancelled_job_reads_slurms_final_state_not_what_its_epilogs_guessed(hooked) -> None:
    """The epilogs know an exit code, not why the job ended, and Slurm's ExitCode of a cancelled job is set
    only once it has completed: whichever closes the job first, the stored summary ends with Slurm's final
    state and exit code."""
    cluster, collector, spool = hooked
    name = "cw-e2e-cancel"
    srun = cluster.popen(["srun", "-N2", "--ntasks-per-node=1", "-J", name, sys.executable, "-c", WORKLOAD])
    try:
        job_id = int(wait_for(lambda: cluster.run(["squeue", "-h", "-n", name, "-o", "%i"]).stdout.strip(),
                              timeout=30, what="the job in squeue"))
        cluster.wait_job_state(job_id, ["RUNNING"])
        wait_for(lambda: (doc := _status(job_id, collector)) is not None and len(_by_node(doc)) == 2,
                 timeout=30, what=f"status {job_id} to show both nodes")
        cluster.run(["scancel", str(job_id)])
        state, exit_code = wait_for(lambda: _slurm_final(cluster, job_id), timeout=30,
                                    what=f"Slurm's final state of job {job_id}")
        assert state == "CANCELLED"

        def settled() -> dict | None:
            doc = _status(job_id, collector)
            if doc is None or doc["job"]["end_time"] is None:
                return None
            return doc if (doc["job"]["state"], doc["job"].get("exit_code")) == (state, exit_code) else None

        doc = wait_for(settled, timeout=30, what=f"job {job_id} to read {state}, exit code {exit_code}")
        assert _by_node(doc, alive_only=False), "the summary keeps the processes"
        assert metric_value(collector.metrics(), "clusterwatch_job_info", job_id=str(job_id)) is None
    finally:
        if srun.poll() is None:
            srun.kill()
        srun.wait(timeout=30)
    _stop_agents(spool)


def test_nodes_without_agents_are_filled_in_over_ssh(
    slurm_cluster: SlurmCluster, slurm_sshd: SshServer, tmp_path: Path  # noqa: F811
) -> None:
    target = f"{slurm_sshd.host}:{slurm_sshd.port}"
    with _environ(SLURM_CONF=str(slurm_cluster.conf)):
        collector = Collector(
            tmp_path, "--slurm", "--slurm-refresh", "1", "--ssh-known-hosts", str(slurm_sshd.known_hosts),
            "--ssh-key", str(slurm_sshd.client_key), "--ssh-user", slurm_sshd.username,
            *(f"--ssh-address={n}={target}" for n in slurm_cluster.nodes),
        )
    try:
        with two_node_gpu_job(slurm_cluster, name="cw-fill-in") as job_id:
            expected = {n: _listpids(slurm_cluster, job_id, n) for n in slurm_cluster.nodes}

            def filled() -> dict | None:
                doc = _status(job_id, collector)
                return doc if doc is not None and _by_node(doc) == expected else None

            try:
                doc = wait_for(filled, timeout=30, what="the listpids fill-in over SSH")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: expected {expected}, status {_status(job_id, collector)}\n"
                                     f"{collector.text()[-3000:]}") from None
            assert {p["mapped_by"] for p in doc["processes"]} == {"listpids"}
            assert sorted(p["rank"] for p in doc["processes"] if p["rank"] is not None) == [0, 1]
            assert all(p["rss_bytes"] is None for p in doc["processes"])  # no agent: no figures
            assert doc["job"]["ranks_expected"] == 2
            human = cli("status", str(job_id), "--collector", collector.address)
            assert "mapped to the job by: listpids" in human.stdout
    finally:
        collector.stop()
