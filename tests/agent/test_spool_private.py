"""The agent's spool (locks, log, pid file, job events) is root's alone: another user can neither stop the agent
with a lock of their own nor make root write where they point, and the files are private whatever the umask.

Real processes, a real second Unix user (useradd; the suite runs as root), real flock.
"""
from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterwatch.agent.ensure import agent_alive, read_pid
from clusterwatch.agent.spool import JobSpool, write_event

from clusterwatch.model import JobEvent
from tests.services.procs import free_port, stop_pid
from tests.support.helpers import CLI, clean_environ, wait_for

SYSTEM_PYTHON = "/usr/bin/python3"  # one the other user may run
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
HOLD_FLOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def other_user() -> Iterator[str]:
    """A real user that is not root, removed afterwards."""
    assert os.geteuid() == 0, "this test makes a real user (useradd): run the suite as root, as CI does"
    name = f"cwsp{secrets.token_hex(3)}"
    r = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user may write into, as /tmp is (1777); the other user must reach it, so not under
    pytest's 0700 tmp_path."""
    path = Path(tempfile.mkdtemp(prefix="cw-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([RUNUSER, "-u", user, "--", *argv], capture_output=True, text=True, timeout=60,
                          cwd="/", env={"PATH": "/usr/bin:/bin"})


def hold_lock_as(user: str, path: Path) -> subprocess.Popen:
    holder = subprocess.Popen([RUNUSER, "-u", user, "--", SYSTEM_PYTHON, "-c", HOLD_FLOCK, str(path)],
                              stdout=subprocess.PIPE, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert holder.stdout.readline().strip() == "held"
    return holder


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def agent_argv(spool: Path, node: str, private: Path) -> list[str]:
    return [*CLI, "agent", "--collector", f"127.0.0.1:{free_port()}", "--node", node, "--gpu-source", "none",
            "--no-provenance", "--kmsg", "none", "--spool-dir", str(spool),
            "--train-socket", str(private / f"{node}.sock")]


def stop_agent_of(spool: Path) -> None:
    pid = read_pid(str(spool / "agent.pid"))
    if pid is not None and agent_alive(pid, str(spool)):
        stop_pid(pid, grace=15.0)


def prolog_env(spool_root: Path, node: str) -> dict[str, str]:
    return {**clean_environ(), **{
        "SLURM_JOB_ID": "4243", "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_USER": "alice",
        "SLURMD_NODENAME": node, "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "CLUSTERWATCH_SPOOL": f"{spool_root}/{{node}}", "CLUSTERWATCH_COLLECTOR": f"127.0.0.1:{free_port()}",
        "CLUSTERWATCH_GPU_SOURCE": "none", "CLUSTERWATCH_CONFIG": os.devnull,
    }}


@pytest.mark.serial  # the prolog gives up after 0.9 s by design: load would make it give up
def test_a_prologs_spool_its_locks_log_pid_and_event_are_private(tmp_path: Path) -> None:
    spool_root = tmp_path / "spool"
    node_dir = spool_root / "sp1"
    old = os.umask(0o022)  # the prolog's children inherit a shell's usual umask
    try:
        proc = subprocess.run([*CLI, "prolog"], env=prolog_env(spool_root, "sp1"), capture_output=True, text=True,
                              timeout=30)
    finally:
        os.umask(old)
    try:
        assert proc.returncode == 0, proc.stderr
        wait_for(lambda: (node_dir / "agent.run.lock").exists(), what="the agent's run lock")
        # the agent it started may already have taken the job's event (it removes what it reads): any left
        # must be private; the event's own mode under this umask is test_an_event_is_private_whatever_the_umask's
        events = list((node_dir / "events").glob("*.json"))
        assert mode(node_dir) == 0o700 and mode(node_dir / "events") == 0o700
        made = {p.name: mode(p) for p in [*node_dir.iterdir(), *events] if p.is_file()}
        assert {"agent.lock", "agent.run.lock", "agent.log", "agent.pid"} <= set(made), made
        assert made == {name: 0o600 for name in made}, made
    finally:
        stop_agent_of(node_dir)


def test_an_event_is_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the prolog's shell's usual umask
    try:
        path = write_event(str(tmp_path / "sp"), JobEvent("start", "4244", time.time(), uid=0, user="root"))
    finally:
        os.umask(old)
    assert mode(Path(path)) == 0o600
    assert mode(tmp_path / "sp") == 0o700 and mode(tmp_path / "sp" / "events") == 0o700


def test_a_spool_another_user_made_is_refused_in_one_line_and_root_writes_nothing_there(
        other_user: str, shared_dir: Path, tmp_path: Path) -> None:
    # The site put the spool in a shared folder; a user made the node's folder before any prolog ran, with a
    # link where the agent's log goes, pointing at a file of root's.
    victim = tmp_path / "root-only.txt"
    victim.write_text("root's own\n")
    node_dir = shared_dir / "sp2"
    assert as_user(other_user, "mkdir", "-m", "0777", str(node_dir)).returncode == 0
    assert as_user(other_user, "ln", "-s", str(victim), str(node_dir / "agent.log")).returncode == 0

    proc = subprocess.run([*CLI, "prolog"], env=prolog_env(shared_dir, "sp2"), capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "belongs to uid" in lines[0] and str(node_dir) in lines[0], proc.stderr
    time.sleep(0.5)
    assert sorted(p.name for p in node_dir.iterdir()) == ["agent.log"]  # no event, lock, pid or agent
    assert victim.read_text() == "root's own\n"

    agent = subprocess.run(agent_argv(node_dir, "sp2", tmp_path), env=prolog_env(shared_dir, "sp2"),
                           capture_output=True, text=True, timeout=60)
    assert agent.returncode == 1 and "Traceback" not in agent.stderr
    assert "belongs to uid" in agent.stderr.strip().splitlines()[-1], agent.stderr


def test_a_lock_another_user_left_in_the_agents_folder_does_not_stop_the_agent(
        other_user: str, shared_dir: Path, tmp_path: Path) -> None:
    # The node's folder is root's but was left writable by all (an old install, a chmod): a user put the
    # agent's run lock there first and holds it.
    node_dir = shared_dir / "sp3"
    node_dir.mkdir()
    node_dir.chmod(0o777)
    holder = hold_lock_as(other_user, node_dir / "agent.run.lock")
    agent = None
    try:
        agent = subprocess.Popen(agent_argv(node_dir, "sp3", tmp_path), env=prolog_env(shared_dir, "sp3"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: read_pid(str(node_dir / "agent.pid")) == agent.pid or agent.poll() is not None,
                 what="the agent's pid file")
        assert agent.poll() is None, agent.communicate()[1][-2000:]
        lock = node_dir / "agent.run.lock"
        assert lock.stat().st_uid == 0 and mode(lock) == 0o600
        assert mode(node_dir) & 0o022 == 0  # nobody else may make files there any more
        # and the user can no longer slip a file in
        assert as_user(other_user, "touch", str(node_dir / "agent.lock")).returncode != 0
    finally:
        holder.kill()
        holder.wait()
        if agent is not None and agent.poll() is None:
            stop_pid(agent.pid, grace=15.0)


def test_a_job_event_written_by_another_user_is_not_taken(other_user: str, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    theirs = write_event(str(spool), JobEvent("start", "77", time.time(), uid=0, user="root"))
    ours = write_event(str(spool), JobEvent("start", "78", time.time(), uid=1000, user="alice"))
    os.chown(theirs, int(subprocess.run(["id", "-u", other_user], capture_output=True, text=True).stdout), -1)
    reader = JobSpool(str(spool))
    assert [e.job_id for e in reader.take_events()] == ["78"]
    assert reader.rejected == 1 and not os.path.exists(theirs) and not os.path.exists(ours)
