"""Issue 24: a training process whose reports cannot reach the agent is told so once, in one line on its own
stderr, with why and what to check: at once when its agent's socket goes away, after a grace when no agent
was ever reached (one may be starting after it, as under `clusterwatch run`); a full queue is not said.
Real processes and real sockets; the agent's side is a plain bound socket."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.helpers import clean_environ

# Reports `n` steps `pause` s apart; between steps the file named `go` (when given) must exist; then prints its
# counters on stdout. The grace is shortened so that the test runs in seconds.
PROCESS = r"""
import json, os, sys, time
from clusterwatch import train
train.UNREACHED_GRACE_S = float(sys.argv[1])
n, pause, go = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
for step in range(1, n + 1):
    if go and step == n // 2:
        open(go[0] + ".half", "w").close()
        while not os.path.exists(go[0]):
            time.sleep(0.01)
    train.report(step=step, loss=1.0)
    time.sleep(pause)
print(json.dumps({"sent": train.sent(), "dropped": train.dropped()}))
"""


@pytest.fixture
def sock_dir():
    d = Path(tempfile.mkdtemp(prefix="cw-un-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _start(sock: Path, grace: float, n: int, pause: float, *go: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PROCESS, str(grace), str(n), str(pause), *go],
                            env={**clean_environ(), "CLUSTERWATCH_TRAIN_SOCKET": str(sock)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p: subprocess.Popen) -> tuple[dict, list[str]]:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return json.loads(out), err.splitlines()


def _wait_file(path: Path) -> None:
    import time

    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def test_a_socket_that_goes_away_is_said_once_at_once(sock_dir: Path) -> None:
    sock, go = sock_dir / "train.sock", sock_dir / "go"
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(str(sock))
    try:
        p = _start(sock, 3600.0, 40, 0.05, str(go))  # a grace of an hour: only "reached before" can say it
        _wait_file(Path(f"{go}.half"))
        os.unlink(sock)  # a cleanup script
        go.touch()
        counters, lines = _finish(p)
    finally:
        agent.close()
    assert counters["sent"] > 0 and counters["dropped"] > 0
    [line] = lines
    assert line.startswith(f"clusterwatch.train: reports of pid {p.pid} cannot reach the clusterwatch agent at "
                           f"{sock}: no socket there"), line
    assert "said once" in line and "CLUSTERWATCH_TRAIN_SOCKET" in line


def test_a_socket_nobody_reads_any_more_is_said_with_its_reason(sock_dir: Path) -> None:
    sock, go = sock_dir / "train.sock", sock_dir / "go"
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(str(sock))
    p = _start(sock, 3600.0, 40, 0.05, str(go))
    _wait_file(Path(f"{go}.half"))
    agent.close()  # the agent died: its socket file stays, nobody reads it
    go.touch()
    _counters, lines = _finish(p)
    [line] = lines
    assert f"at {sock}: the socket there is not read (its agent stopped)" in line, line


def test_no_agent_ever_reached_is_said_after_the_grace_only(sock_dir: Path) -> None:
    sock = sock_dir / "nobody.sock"
    # 0.5 s of reports, a grace of 30 s: nothing said (an agent may be starting after the process)
    counters, lines = _finish(_start(sock, 30.0, 10, 0.05))
    assert lines == [] and counters["sent"] == 0 and counters["dropped"] == 10
    # 3 s of reports, a grace of 1 s: said once
    counters, lines = _finish(_start(sock, 1.0, 30, 0.1))
    [line] = lines
    assert f"at {sock}: no socket there" in line and counters["sent"] == 0


def test_a_full_queue_is_not_said(sock_dir: Path) -> None:
    sock = sock_dir / "train.sock"
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(str(sock))  # bound, never read: the queue fills and sends fail with EAGAIN
    try:
        counters, lines = _finish(_start(sock, 0.0, 2000, 0.0))
    finally:
        agent.close()
    assert counters["dropped"] > 0 and counters["sent"] > 0
    assert lines == []
