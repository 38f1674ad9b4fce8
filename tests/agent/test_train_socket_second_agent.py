"""Issue 24: one agent per training socket. A second agent on the node (another spool folder, the same
--train-socket) refuses the socket in one line and leaves the running agent's socket alone, while it runs
(sampling the node without training reports) and when it stops; a socket nobody reads any more (an agent
killed with SIGKILL) is taken over; a live socket another program holds is not; a socket owned by a user
other than the agent's is never trusted; the lock file is root's alone."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.helpers import CLI, Collector, Proc, wait_for

NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def sock_dir():
    # a Unix socket's path holds 107 bytes: pytest's folder named after a long test leaves too few
    d = Path(tempfile.mkdtemp(prefix="cw-2a-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _args(collector: str, spool: Path, sock: Path) -> list[str]:
    return [*CLI, "agent", "--collector", collector, "--node", "n1", "--interval", "0.2", "--gpu-source", "none",
            "--no-provenance", "--kmsg", "none", "--spool-dir", str(spool), "--train-socket", str(sock)]


def _start(tmp_path: Path, collector: Collector, name: str, sock: Path) -> Proc:
    agent = Proc(_args(collector.address, tmp_path / f"spool-{name}", sock), tmp_path / f"{name}.log")
    wait_for(lambda: "agent on n1" in agent.text(), timeout=30, what=f"agent {name} running")
    return agent


def _second(tmp_path: Path, collector: Collector, sock: Path) -> tuple[list[str], int]:
    """A second agent on the path, run until it samples, then stopped: the lines it said about the socket, its
    exit code."""
    second = _start(tmp_path, collector, "b", sock)  # its poll loop runs: it did not exit
    code = second.stop()
    return [line for line in second.text().splitlines() if str(sock) in line], code


def _inode(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def _reaches(sock: Path) -> bool:
    """Whether a datagram sent to the path is taken (someone reads the socket bound there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(b'{"v":1}', str(sock))
            return True
        except OSError:
            return False


def test_a_second_agent_refuses_the_running_agents_socket(tmp_path: Path, sock_dir: Path) -> None:
    collector = Collector(tmp_path)
    sock = sock_dir / "train.sock"
    first = _start(tmp_path, collector, "a", sock)
    try:
        before = _inode(sock)
        lines, code = _second(tmp_path, collector, sock)
        assert code == 0  # it samples the node all the same
        [line] = lines
        assert f"another agent (pid {first.pid}) listens on the training socket {sock}" in line, line
        assert "gets no training reports" in line and "--train-socket" in line, line
        # neither taken over while the second ran nor removed when it stopped
        assert sock.is_socket() and _inode(sock) == before
        assert _reaches(sock)
        assert first.popen.poll() is None
        # the first still owns it: stopped, it removes its socket
        assert first.stop() == 0, first.text()
        assert not sock.exists()
    finally:
        first.stop()
        collector.stop()


def test_a_socket_nobody_reads_is_taken_over(tmp_path: Path, sock_dir: Path) -> None:
    collector = Collector(tmp_path)
    sock = sock_dir / "train.sock"
    first = _start(tmp_path, collector, "a", sock)
    try:
        first.stop(signal.SIGKILL)  # no close(): its socket and lock file stay behind
        assert sock.is_socket() and not _reaches(sock)
        second = _start(tmp_path, collector, "b", sock)
        try:
            assert _reaches(sock)
            assert "Traceback" not in second.text()
        finally:
            assert second.stop() == 0
        assert not sock.exists()
    finally:
        collector.stop()


def test_a_live_socket_another_program_holds_is_not_taken(tmp_path: Path, sock_dir: Path) -> None:
    collector = Collector(tmp_path)
    sock = sock_dir / "train.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    other.bind(str(sock))  # an agent of an older version, or another root program: bound, no lock
    try:
        before = _inode(sock)
        lines, code = _second(tmp_path, collector, sock)
        assert code == 0
        [line] = lines
        assert f"holds no train.sock.lock (an older agent?) listens on the training socket {sock}" in line, line
        assert "--train-socket" in line, line
        assert _inode(sock) == before
        # it still gets what is sent there
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"x", str(sock))
        other.settimeout(5)
        assert other.recv(16) == b"x"
    finally:
        other.close()
        collector.stop()


def test_a_socket_owned_by_another_user_is_never_trusted(tmp_path: Path, sock_dir: Path) -> None:
    """A live socket in the agent's folder that belongs to an ordinary user is no agent's: it is replaced, so
    that user does not receive every rank's reports."""
    collector = Collector(tmp_path)
    sock = sock_dir / "train.sock"
    planted = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    planted.bind(str(sock))
    os.chown(sock, NOBODY, NOBODY)
    try:
        agent = _start(tmp_path, collector, "a", sock)
        try:
            st = os.lstat(sock)
            assert st.st_uid == os.geteuid() and (st.st_dev, st.st_ino) != (0, 0)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(b'{"v":1,"step":1}', str(sock))
            planted.settimeout(0.5)
            with pytest.raises(TimeoutError):
                planted.recv(64)
            assert "belongs to uid" in agent.text()
        finally:
            assert agent.stop() == 0
    finally:
        planted.close()
        collector.stop()


HOLD = """
import fcntl, sys, time
fd = open(sys.argv[1], "rb")  # flock needs no write permission
print("opened", flush=True)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


def test_a_user_cannot_hold_the_lock_against_the_next_agent(tmp_path: Path, sock_dir: Path) -> None:
    """An ordinary user who opens the lock file while an agent runs, and takes the lock the moment that agent is
    killed, would make every later agent refuse to start (and name a dead pid). (/usr/bin/python3: the test's
    virtualenv may not be open to that user.)"""
    collector = Collector(tmp_path)
    sock = sock_dir / "train.sock"
    lock = Path(f"{sock}.lock")
    first = _start(tmp_path, collector, "a", sock)
    holder = subprocess.Popen(["/usr/bin/python3", "-c", HOLD, str(lock)], user=NOBODY, group=NOBODY, extra_groups=[],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert oct(lock.stat().st_mode & 0o777) == "0o600"
        first.stop(signal.SIGKILL)
        try:
            out, err = holder.communicate(timeout=3)
        except subprocess.TimeoutExpired:
            out, err = "opened: it holds the file open", ""
        assert "opened" not in out and "Permission denied" in err, out + err
        second = _start(tmp_path, collector, "b", sock)
        try:
            assert _reaches(sock)
        finally:
            assert second.stop() == 0
    finally:
        holder.kill()
        holder.wait()
        first.stop()
        collector.stop()
