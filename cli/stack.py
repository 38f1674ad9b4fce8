"""A collector and agents started as child processes, private to their user, for `run` and `demo`.

Each piece runs as its own process (`python -m clusterwatch.cli.main …`), exactly as it
would on a cluster, in the stack's own folder: `python -m` puts the working directory first on
sys.path, and started from the root of a clone, the clone's `clusterwatch/` folder would shadow an
installed (non-editable) package (`python -P` would do from 3.11 only; we support 3.10). The stack
uses a temporary store and stops every process it started, by its pid.

The collector takes agents and queries on a Unix socket in a folder of mode 0700, so on a shared
login node no other user can read the job or feed it samples (its queries are not authenticated:
`--query-auth none`, since munge may be installed and down; so it opts in to actions from its
unauthenticated callers, `--allow-unauthenticated-actions`, and its web page, when it has one, answers
only its user's connections, `--web-owner-uid`). /metrics is off unless asked for (the
demo shows it): then on a free loopback TCP port, read back from a ports file; it is read-only and
shows what Prometheus would scrape, so another user reaching it learns nothing a scrape would not.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clusterwatch.errors import ClusterwatchError
from clusterwatch.unix_address import UNIX_PATH_MAX

from .proctree import parent_death_signal

START_TIMEOUT_S = 20.0
# The caller's settings for the cluster's collector and agents (its TLS files, token, extra ports, Slurm):
# the stack's own pieces are configured by their flags, and any of these would break them or open them
# to other users (CLUSTERWATCH_QUERY_LISTEN would add a TCP port; a TLS CA, a TLS handshake to plaintext).
CLUSTER_SETTINGS = (
    "CLUSTERWATCH_TLS_CA", "CLUSTERWATCH_TLS_CERT", "CLUSTERWATCH_TLS_KEY", "CLUSTERWATCH_TLS_CLIENT_CA",
    "CLUSTERWATCH_TOKEN", "CLUSTERWATCH_QUERY_LISTEN", "CLUSTERWATCH_SLURM", "CLUSTERWATCH_SUMMARY_DIR",
    "CLUSTERWATCH_MUNGE_SOCKET", "CLUSTERWATCH_COLLECTOR",
)


def make_workdir(keep: str | None, prefix: str) -> str:
    """The folder of a run or demo: --keep DIR (made if missing), else a fresh temporary one; absolute.

    One line and exit 2 when it cannot be made (`--keep /proc/nope`, an unwritable $TMPDIR).
    """
    from .common import fail

    try:
        if keep:
            os.makedirs(keep, exist_ok=True)
            if not os.access(keep, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied")
            return os.path.abspath(keep)
        return os.path.abspath(tempfile.mkdtemp(prefix=prefix))
    except OSError as exc:
        where = f"--keep {keep}" if keep else f"a temporary folder in {tempfile.gettempdir()} ($TMPDIR)"
        fail(f"cannot use {where}: {exc.strerror or exc}")


class Stack:
    """Child processes of one `run` or `demo`, and their temporary folder.

    Args:
        workdir: folder for the store, the ports file, spools and logs.
    """

    def __init__(self, workdir: str) -> None:
        self.workdir = Path(os.path.abspath(workdir))
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.metrics_port = 0
        self.web_port = 0
        self._socket_dir: Path | None = None
        self._private_dir: Path | None = None
        # the agents prove themselves with it (--agent-auth token), so actions reach the job's processes
        self.agent_token = secrets.token_urlsafe(32)

    @property
    def address(self) -> str:
        """The collector's gRPC address, for the agents and the stack's queries."""
        return f"unix:{self.collector_socket}"

    @property
    def collector_socket(self) -> Path:
        return self.private_dir() / "collector.sock"

    def private_dir(self) -> Path:
        """A folder of mode 0700 for the collector's socket: only our uid (and root) may enter it.

        In the workdir (whatever its mode: --keep may name a shared one), unless a socket's path
        there would be too long: then under /tmp.
        """
        if self._private_dir is None:
            fits = len(os.fsencode(self.workdir / "private-XXXXXXXX" / "collector.sock")) < UNIX_PATH_MAX
            if fits:
                self._private_dir = Path(tempfile.mkdtemp(prefix="private-", dir=self.workdir))
            else:
                self._private_dir = Path(tempfile.mkdtemp(prefix="clusterwatch-private-", dir="/tmp"))
            os.chmod(self._private_dir, 0o700)  # mkdtemp's mode already; said here as the constraint
        return self._private_dir

    def _spawn(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        env = {k: v for k, v in (os.environ if env is None else env).items() if k not in CLUSTER_SETTINGS}
        # the stack's own agents' token, in the environment (another user can read a command line, not it)
        env["CLUSTERWATCH_TOKEN"] = self.agent_token
        log = open(self.workdir / f"{name}.log", "ab")
        # own session: a Ctrl-C on the terminal reaches the user's command, and we stop ours in order;
        # SIGTERM when we die without stopping them (SIGKILL, OOM), so they never outlive us
        proc = subprocess.Popen(
            [sys.executable, "-m", "clusterwatch.cli.main", *args], cwd=self.workdir,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=parent_death_signal(),
        )
        log.close()
        self.children.append((name, proc))
        return proc

    def start_collector(self, extra: list[str] = (), metrics: bool = False) -> None:
        """Start the collector and wait for it to listen; `metrics`: also serve /metrics (metrics_port) and
        the jobs' web pages (web_port)."""
        ports = self.workdir / "ports.json"
        # `run` and `demo` watch one command on one machine, their collector on a private socket: no munge
        # (under `auto` a host with munge installed but munged down would refuse their own queries). Whoever
        # reaches that socket is this user (or root), so its callers may act on the job (diagnose, stop); a
        # web page, on loopback, which every user of the host reaches, answers this user's connections alone.
        proc = self._spawn("collector", [
            "collector", "--listen", self.address, "--metrics-listen", "127.0.0.1:0" if metrics else "none",
            # the job's web page with /metrics (the demo's); a run opens no TCP port
            "--web-listen", "127.0.0.1:0" if metrics else "none", "--query-auth", "none",
            "--agent-auth", "token",  # its agents get the stack's token (_spawn)
            "--allow-unauthenticated-actions", "--web-owner-uid", str(os.getuid()),
            "--db", str(self.workdir / "clusterwatch.db"), "--ports-file", str(ports), *extra,
        ])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ports.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterwatchError(f"the embedded collector did not start; see {self.workdir}/collector.log:\n"
                                        + self.log_tail("collector"))
            time.sleep(0.05)
        bound = json.loads(ports.read_text())
        self.metrics_port, self.web_port = bound["metrics"], bound.get("web", 0)

    def start_agent(self, node: str, extra: list[str] = (), env: dict | None = None) -> subprocess.Popen:
        spool = self.spool(node)
        spool.mkdir(parents=True, exist_ok=True)
        return self._spawn(f"agent-{node}", [
            "agent", "--collector", self.address, "--node", node, "--spool-dir", str(spool),
            "--train-socket", str(self.train_socket(node)), *extra,
        ], env=env)

    def wait_for_agent(self, node: str, proc: subprocess.Popen) -> None:
        """Wait until the agent of `node` is ready to poll: its training socket bound (or given up, with one line
        in its log) and its signal handlers set, which its pid file, written next, says.

        Raises:
            ClusterwatchError: it stopped (with its log's last line), or is not ready after START_TIMEOUT_S.
        """
        from clusterwatch.agent.ensure import PID_FILE

        pid_file = self.spool(node) / PID_FILE
        deadline = time.monotonic() + START_TIMEOUT_S
        while not pid_file.exists():
            if proc.poll() is not None:
                said = self.log_tail(f"agent-{node}", 1).strip() or f"exit status {proc.returncode}"
                raise ClusterwatchError(f"the embedded agent stopped: {said}")
            if time.monotonic() > deadline:
                raise ClusterwatchError(f"the embedded agent was not ready within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.02)

    def train_socket(self, node: str) -> Path:
        """Each embedded agent listens on its own socket (two demo nodes share one host).

        In the spool, unless that path is too long for a Unix socket (108 bytes with the NUL, on
        Linux: a deep $TMPDIR or --keep): then in a short folder of our own under /tmp.
        """
        path = self.spool(node) / "train.sock"
        if len(os.fsencode(path)) < UNIX_PATH_MAX:
            return path
        if self._socket_dir is None:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="clusterwatch-sockets-", dir="/tmp"))
        return self._socket_dir / f"{node}.sock"

    def spool(self, node: str) -> Path:
        return self.workdir / "spool" / node

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop agents first (their last batches flush to the collector), then the rest; each by its pid."""
        agents = [p for n, p in self.children if n.startswith("agent-")]
        others = [p for n, p in self.children if not n.startswith("agent-")]
        for group in (agents, others):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for proc in group:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.children.clear()
        for folder in (self._socket_dir, self._private_dir):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        self._socket_dir = self._private_dir = None
