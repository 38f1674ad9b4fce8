"""Small helpers the service fixtures share: free loopback ports, binaries, stopping daemons by PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.waiting import poll_until

# Daemons live in sbin, which a non-login PATH may lack.
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"])


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now.

    The port is released before returning, so a daemon started soon after can bind it; a collision is
    possible in theory but every fixture picks its own, so a leftover service never blocks a new one.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 where a connection is refused for as long as the block runs.

    The port is bound and never listened on, so nothing else can take it meanwhile, and a connect gets a
    reset at once (a fixed low port such as 1 or 9 may have a listener on some host, or a firewall that
    drops instead of refusing).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def require_binary(name: str, package: str) -> str:
    """Return the absolute path of ``name`` or fail the test, naming the Debian package to install.

    Tests never skip for a missing service: CI installs these packages before pytest runs, so a missing
    binary is a broken environment and must be loud.
    """
    path = shutil.which(name, path=_SEARCH_PATH)
    if path is None:
        pytest.fail(
            f"{name} not found: install the Debian package {package!r} "
            f"(apt-get install -y {package}) before running these tests",
            pytrace=False,
        )
    return path


def read_pid(pid_file: Path) -> int | None:
    """Return the PID written in ``pid_file``, or None when it is missing or empty."""
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def pid_alive(pid: int) -> bool:
    """Tell whether ``pid`` still runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the last ')' (the command name may hold spaces or parentheses).
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_http_ready(popen, url: str, name: str, log: Callable[[], str], timeout: float) -> None:
    """Wait until ``url`` answers 200; raise with the server's log when it exits or is not ready in time."""
    def ready() -> bool:
        if popen.poll() is not None:
            return True  # exited: reported below
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    is_ready = poll_until(ready, timeout, interval=0.1)
    if popen.poll() is not None:
        raise AssertionError(f"{name} exited with {popen.returncode}:\n{log()}")
    if not is_ready:
        raise AssertionError(f"{name} not ready within {timeout:.0f} s:\n{log()}")


def stop_pid(pid: int, grace: float = 5.0) -> None:
    """Stop one process we started: SIGTERM, then SIGKILL if it is still there after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if poll_until(lambda: not pid_alive(pid), wait):
            return


def stop_child(popen: subprocess.Popen) -> None:
    """Stop a daemon this process started (stop_pid) and reap it, so that no zombie is left behind."""
    stop_pid(popen.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(5)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a daemon's log, for assertion messages ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
