"""Issue 24: a training endpoint whose socket goes away binds it again at its next check (the agent loop's
poll) and says so in one line; what keeps it from doing so (another agent took the path, a file is there)
is said once and left alone. Real sockets and files; the agent-process case is
tests/e2e/test_train_socket_lost_e2e.py."""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest
from clusterwatch.agent.train_endpoint import TrainEndpoint


@pytest.fixture
def sock_dir():
    d = Path(tempfile.mkdtemp(prefix="cw-rb-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _send(path: Path, step: int) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(json.dumps({"v": 1, "step": step}).encode(), str(path))


def _steps(ep: TrainEndpoint, want: int) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + 5
    while len(got) < want and time.monotonic() < deadline:
        got += [r.step for r in ep.drain()]
        time.sleep(0.02)
    return got


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_removed_socket_is_bound_again_and_said_once(sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    sock = sock_dir / "train.sock"
    with TrainEndpoint(str(sock)) as ep:
        _send(sock, 1)
        assert _steps(ep, 1) == [1]
        ep.check()
        assert _lines(caplog, "bound it again") == []  # nothing to do: nothing said
        os.unlink(sock)
        with pytest.raises(FileNotFoundError):
            _send(sock, 2)
        ep.check()
        assert sock.is_socket() and oct(sock.stat().st_mode & 0o777) == "0o666"
        _send(sock, 3)
        assert _steps(ep, 1) == [3]
        assert len(_lines(caplog, "bound it again")) == 1
        ep.check()
        assert len(_lines(caplog, "bound it again")) == 1
    assert not sock.exists() and not Path(f"{sock}.lock").exists()


def test_a_removed_folder_is_made_again(sock_dir: Path) -> None:
    sock = sock_dir / "sub" / "train.sock"
    with TrainEndpoint(str(sock)) as ep:
        shutil.rmtree(sock.parent)  # the socket, its lock file and their folder
        ep.check()
        assert sock.is_socket() and Path(f"{sock}.lock").is_file()
        _send(sock, 7)
        assert _steps(ep, 1) == [7]


def test_a_path_another_agent_took_meanwhile_is_not_fought_over(sock_dir: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    sock = sock_dir / "sub" / "train.sock"
    first = TrainEndpoint(str(sock))
    first.start()
    try:
        shutil.rmtree(sock.parent)  # the lock file went with it: a second agent may start now
        with TrainEndpoint(str(sock)) as second:
            before = os.lstat(sock).st_ino
            first.check()
            first.check()
            assert os.lstat(sock).st_ino == before
            [line] = _lines(caplog, "cannot bind it again")
            assert f"another agent (pid {os.getpid()})" in line
            _send(sock, 9)
            assert _steps(second, 1) == [9]
            first.close()  # nor does it remove the other's socket on its way out
            assert sock.is_socket() and os.lstat(sock).st_ino == before
            _send(sock, 10)
            assert _steps(second, 1) == [10]
    finally:
        first.close()


def test_a_file_put_at_the_path_is_left_alone_and_said_once(sock_dir: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    sock = sock_dir / "train.sock"
    with TrainEndpoint(str(sock)) as ep:
        os.unlink(sock)
        sock.write_text("not a socket")
        for _ in range(3):
            ep.check()
        assert sock.read_text() == "not a socket"
        [line] = _lines(caplog, "cannot bind it again")
        assert "is not a socket" in line
        sock.unlink()  # cleared: the next check binds
        ep.check()
        _send(sock, 4)
        assert _steps(ep, 1) == [4]
    assert not sock.exists()
