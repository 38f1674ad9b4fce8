"""Real git repositories and processes for the provenance tests: helpers to import, and fixtures (a pytest plugin,
loaded by tests/conftest.py)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from clusterwatch.agent.provenance import failures as provenance_failures

from clusterwatch.log_once import SaidOnce

NOBODY = 65534


GIT = shutil.which("git")


TOKEN = "ghp_S3cr3tT0kenValue1234567890"


def git_env(home: Path | str = "/nonexistent") -> dict[str, str]:
    """An environment that keeps root's own git config out of the repositories made here."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org", "LC_ALL": "C"}


def git(cwd: Path, *args: str, user: int | None = None, check: bool = True) -> str:
    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    proc = subprocess.run([GIT, "-c", "protocol.file.allow=always", *args], cwd=cwd, env=git_env(),
                          capture_output=True, text=True, timeout=30, check=False, **kw)
    if check and proc.returncode:
        raise AssertionError(f"git {args} failed: {proc.stderr}")
    return proc.stdout.strip()


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in (files or {"train.py": "print('hi')\n", "README": "readme\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "init")
    return path


def stat_dirty(path: Path) -> None:
    """Make git distrust its index entry for a file, so status must read (and filter) it."""
    later = time.time() + 5
    os.utime(path, (later, later))


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    # the warn-once memory is per process; each test starts without it
    monkeypatch.setattr(provenance_failures, "_said", SaidOnce(provenance_failures.log))


@pytest.fixture
def shared_dir():
    """A directory under /tmp that nobody can traverse (pytest's tmp_path is 0700 root)."""
    d = Path(tempfile.mkdtemp(prefix="cw-prov-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def marker_dir():
    """Where hostile commands would write: writable by every user, so a blocked command is
    blocked by provenance and not by permissions."""
    d = Path(tempfile.mkdtemp(prefix="cw-pwned-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        os.chown(root, uid, uid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def git_wrapper(directory: Path) -> tuple[Path, Path]:
    """A git that logs who runs it, then runs the real git: the test's witness of identity."""
    log = directory / "git-calls.log"
    log.touch()
    log.chmod(0o666)
    wrapper = directory / "git"
    wrapper.write_text(f'#!/bin/sh\necho "$(id -u) $(id -G) HOME=$HOME" >> {log}\nexec {GIT} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


def hanging_repo(path: Path) -> Path:
    """A repository whose config includes a FIFO: git blocks reading it, a stand-in for any hang."""
    repo = make_repo(path)
    fifo = path.parent / f"{path.name}.fifo"
    os.mkfifo(fifo)
    with open(repo / ".git" / "config", "a") as f:
        f.write(f"[include]\n\tpath = {fifo}\n")
    return repo


def assert_no_git_left_on(repo: Path) -> None:
    time.sleep(0.2)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert str(repo).encode() not in cmd or b"git" not in cmd, f"git left running: {cmd!r}"


def spawn_ready(argv: list[str], cwd: Path, env: dict[str, str], user: int | None = None) -> subprocess.Popen:
    """Start a process that prints "ready" once up (as `user` when given) and waits on its stdin."""
    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kw)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def stop_ready(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


SLEEPER = "import sys\nprint('ready', flush=True)\nsys.stdin.read()\n"
