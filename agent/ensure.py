"""Make sure this node's agent runs: start it detached when its pid file names no live agent.

Used by the Slurm prolog and by ``clusterwatch agent --ensure``. Several prologs start at once when
jobs land on a node together, so the check and the start happen under an ``flock`` on
``<spool>/agent.lock``: the first prolog starts the agent and writes ``<spool>/agent.pid`` before it lets
go of the lock, the next one finds that agent alive and leaves it alone. A running agent also holds
``<spool>/agent.run.lock`` for its whole life (``claim_spool``): should a hook be cut off between
starting an agent and writing its pid (its deadline), the next hook still sees that agent, and a second
agent for the same folder exits at once instead of sampling the node twice. The lock is waited for a bounded
time only (a hook must return within a second), and the agent is started in its own session with its
output in ``<spool>/agent.log`` and no inherited descriptors, so slurmd never waits on it and killing
the prolog's process group does not kill it.

The spool folder is the agent's alone: made 0700, its locks, log and pid file 0600, never through a
link. One that another user owns is refused (:class:`SpoolNotPrivate`): whoever owns the folder could
hold its locks (no agent would start), plant job events, or link ``agent.log`` to a file for root to
append to. The default, ``/run/clusterwatch/<node>``, sits in a folder only root may write. A lock or
log file in our folder that is not ours (left while the folder was writable by others) is replaced,
never used.

Imports stay small (no grpc, no psutil): this runs inside every prolog.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clusterwatch.errors import ClusterwatchError
from clusterwatch.procfs import stat_state

PID_FILE = "agent.pid"
LOCK_FILE = "agent.lock"
RUN_LOCK_FILE = "agent.run.lock"
LOG_FILE = "agent.log"
#: How long a hook waits for another hook's start to finish before giving up (it exits 0 either way).
LOCK_WAIT_S = 0.5
#: Variables of the job's environment that must not reach the agent: with SLURM_JOB_ID in its own
#: environment the agent would count itself as one of the job's processes.
_JOB_VARIABLE_PREFIXES = ("SLURM_", "SLURMD_", "SBATCH_", "SRUN_")
_JOB_VARIABLES = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


class SpoolNotPrivate(ClusterwatchError):
    """The spool folder belongs to another user: its locks, events and log cannot be trusted."""


def private_folder(path: str) -> None:
    """Make ``path`` (0700 when new) and check it is ours: SpoolNotPrivate when another user owns it.

    A folder of ours that others may write into loses those bits; its read bits are left, since the
    spool may be the parent of the training socket, which every user's job must reach.
    """
    os.makedirs(path, mode=PRIVATE_FOLDER, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise SpoolNotPrivate(
            f"the spool folder {path} belongs to uid {st.st_uid}, not to this agent's uid {os.geteuid()}: whoever "
            "owns it could hold its locks or plant job events; remove it, or give --spool-dir (spool_dir) a folder "
            "only root can write into (the default /run/clusterwatch/<node>)")
    if st.st_mode & 0o022:
        os.chmod(path, st.st_mode & 0o755)


def open_private(path: str, flags: int) -> int:
    """Open (creating it 0600) a file of our private folder, never through a link; one left there by another
    user, or a link, is removed and made afresh (we own the folder, so we may)."""
    for _ in range(3):
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            os.unlink(path)
            continue
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode):
            if st.st_mode & 0o077:
                os.fchmod(fd, PRIVATE_FILE)
            return fd
        os.close(fd)
        os.unlink(path)
    raise OSError(errno.EEXIST, f"{path} keeps being replaced by another user's file")


@dataclass(frozen=True)
class EnsureResult:
    """What :func:`ensure_agent` did.

    Attributes:
        action: "running" (an agent was already there), "started", or "busy" (another hook held the
            lock past the wait; that hook is starting the agent).
        pid: the agent's pid; None when busy, or when the running agent has not written its pid file.
    """

    action: str
    pid: int | None


def read_pid(path: str) -> int | None:
    """The pid written in a pid file, None when the file is missing, empty or not a number."""
    try:
        with open(path) as f:
            text = f.read(32).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def agent_alive(pid: int, spool_dir: str | None = None) -> bool:
    """True when ``pid`` runs a clusterwatch agent (of this spool folder, when given).

    The command line is checked, not only the pid, because a pid file outlives a reboot or a crash and
    the pid may since belong to anything.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    if stat_state(stat) in (None, "Z"):
        return False
    if b"agent" not in argv or not any(b"clusterwatch" in a for a in argv):
        return False
    return spool_dir is None or os.fsencode(spool_dir) in argv


def agent_command(
    collector: str,
    node: str,
    spool_dir: str,
    gpu_source: str | None = None,
    interval_s: float | None = None,
    python: str = sys.executable,
    collectors_before: str | None = None,
) -> list[str]:
    """The command line of a detached agent for this node.

    Args:
        collector: the collector address HOST:PORT, or the deployment's collectors list.
        node: the node name the agent reports as.
        spool_dir: the node's spool folder (events, pid file).
        gpu_source: ``auto``, ``nvml``, ``sim`` or ``none``; None: the agent's default.
        interval_s: poll interval; None: the agent's default.
        python: the interpreter (the one running this code, so the agent is the same install).
        collectors_before: ``JOB=HOST:PORT,...`` after a change of the list: passed on, so the jobs numbered
            below JOB still stream to the collector they started on (without it the agent sends them to the
            new list's collector, where status with both lists does not look).

    Returns:
        The argv list.
    """
    argv = [python, "-m", "clusterwatch.cli.main", "agent", "--collector", collector, "--node", node,
            "--spool-dir", spool_dir]
    if collectors_before:
        argv += ["--collectors-before", collectors_before]
    if gpu_source:
        argv += ["--gpu-source", gpu_source]
    if interval_s:
        argv += ["--interval", f"{interval_s:g}"]
    return argv


def agent_environment(environ: Mapping[str, str], token: str | None = None) -> dict[str, str]:
    """The agent's environment: this one without the job's variables; the token passed by variable.

    The token travels in CLUSTERWATCH_TOKEN rather than on the command line, where ``ps`` shows it.
    """
    env = {
        k: v for k, v in environ.items()
        if not k.startswith(_JOB_VARIABLE_PREFIXES) and k not in _JOB_VARIABLES
    }
    if token:
        env["CLUSTERWATCH_TOKEN"] = token
        env.pop("CLUSTERWATCH_TOKEN_FILE", None)  # read already: the agent takes the token once
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
    return env


def start_detached(argv: Sequence[str], env: Mapping[str, str], log_path: str) -> int:
    """Start ``argv`` in a new session, stdin from /dev/null, output appended to ``log_path``.

    Returns:
        The new process's pid (exec has succeeded when this returns).

    Raises:
        OSError: the log file cannot be opened or the program cannot be run.
    """
    with os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab", buffering=0) as log:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env),
            cwd="/", close_fds=True, start_new_session=True,
        )
    # Not waited for: it outlives us, and init (or the nearest subreaper) reaps it.
    proc.returncode = 0
    return proc.pid


def _lock(fd: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def claim_spool(spool_dir: str) -> int | None:
    """Hold ``<spool_dir>/agent.run.lock`` for the life of this agent: one agent per spool folder.

    Returns:
        The lock's descriptor, to keep open (the kernel lets go when the agent ends, however it
        ends); None when another live agent holds it.

    Raises:
        SpoolNotPrivate: another user owns the folder.
        OSError: the folder or the lock file cannot be created.
    """
    private_folder(spool_dir)
    fd = open_private(os.path.join(spool_dir, RUN_LOCK_FILE), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def spool_claimed(spool_dir: str) -> bool:
    """Whether a live agent holds the folder's run lock (see claim_spool)."""
    try:
        fd = os.open(os.path.join(spool_dir, RUN_LOCK_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: no agent has run here since the folder was made
    if os.fstat(fd).st_uid != os.geteuid():  # not an agent of ours: claim_spool replaces it
        os.close(fd)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also lets go of the shared lock, when it was taken


def write_pid(path: str, pid: int) -> None:
    """Write a pid file whole (aside, then renamed), 0600, never through a link."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
        f.write(f"{pid}\n")
    os.replace(tmp, path)


def ensure_agent(
    spool_dir: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    lock_wait_s: float = LOCK_WAIT_S,
) -> EnsureResult:
    """Start the node's agent unless ``<spool_dir>/agent.pid`` names a live one.

    Args:
        spool_dir: the node's spool folder (created when missing).
        argv: the agent's command line (see :func:`agent_command`).
        env: the agent's environment (see :func:`agent_environment`).
        lock_wait_s: how long to wait for another hook that is starting the agent.

    Returns:
        What was done, and the agent's pid.

    Raises:
        SpoolNotPrivate: another user owns the spool folder.
        OSError: the spool folder, lock, log or pid file cannot be written, or the agent cannot be run.
    """
    private_folder(spool_dir)
    pid_path = os.path.join(spool_dir, PID_FILE)
    fd = open_private(os.path.join(spool_dir, LOCK_FILE), os.O_RDWR)
    try:
        if not _lock(fd, lock_wait_s):
            return EnsureResult("busy", None)
        pid = read_pid(pid_path)
        if pid is not None and agent_alive(pid, spool_dir):
            return EnsureResult("running", pid)
        if spool_claimed(spool_dir):  # an agent whose pid file is not written (yet): it writes it itself
            return EnsureResult("running", None)
        pid = start_detached(argv, env, os.path.join(spool_dir, LOG_FILE))
        # Written before the lock is released, so the next hook sees this agent.
        write_pid(pid_path, pid)
        return EnsureResult("started", pid)
    finally:
        os.close(fd)  # also releases the flock
