"""Which code this training process runs, from inside it: the git state behind `train.provenance()`.

The agent takes a fuller record from outside (agent/provenance/, git run as the process's
owner); when it has sent that record back over the request channel, `train.provenance()`
returns it. Otherwise this module asks git itself, as this process's own user, with the same
rule as the agent: the repository's configuration must not make git run anything. A checkout
can be hostile (a shared directory, a cloned repository with a config written by someone else)
or merely configured (git-lfs filters, an fsmonitor daemon, a pager), and training code should
not start those by asking for its commit. So each git call here:

- gets the environment and command-scope settings of clusterwatch/git_safety.py (the rule it shares with
  the agent): nothing inherited, no global or system config, every setting and every filter or diff driver
  that names a program switched off;
- runs in a session of its own with a deadline; on timeout its whole process group is killed.

Three git calls: `rev-parse --show-toplevel`, `config --list --name-only -z` (to learn the
filter drivers to empty), and `status --porcelain=v2 --branch --untracked-files=no`. The
record says "unknown" with a reason when git is missing, slow, refuses (another user's
repository: "dubious ownership") or the code is in no repository. Standard library only.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from clusterwatch.git_safety import driver_overrides, safe_env

UNKNOWN = "unknown"
BUDGET_S = 5.0
MAX_OUTPUT = 1 << 20   # status of tracked changes only; more than this is not read

class _GitFailed(Exception):
    pass


def _git(git: str, args: list[str], cwd: str, settings: list[tuple[str, str]], deadline: float) -> bytes:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _GitFailed(f"git took more than {BUDGET_S:g} s")
    try:
        proc = subprocess.Popen([git, "--no-pager", *args], cwd=cwd, env=safe_env(git, settings),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise _GitFailed(f"cannot run {git}: {exc.strerror}") from None
    try:
        out, err = proc.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # git and anything it started
        proc.communicate()
        raise _GitFailed(f"git took more than {BUDGET_S:g} s") from None
    if proc.returncode != 0:
        text = err.decode("utf-8", "replace").strip().splitlines()
        first = next((line for line in text if line.startswith("fatal:")), text[0] if text else "")
        if "dubious ownership" in err.decode("utf-8", "replace"):
            first = "the repository belongs to another user (git refuses it: dubious ownership)"
        raise _GitFailed(first.removeprefix("fatal: ") or f"git {args[0]} failed")
    return out[:MAX_OUTPUT]


def parse_status(data: bytes) -> tuple[str, str, bool]:
    """(commit, branch, dirty) from `git status --porcelain=v2 --branch -z` output."""
    commit = branch = UNKNOWN
    dirty = False
    for rec in data.split(b"\0"):
        if rec.startswith(b"# branch.oid "):
            commit = rec[13:].decode("ascii", "replace")
        elif rec.startswith(b"# branch.head "):
            branch = rec[14:].decode("utf-8", "replace")
        elif rec[:2] in (b"1 ", b"2 ", b"u "):
            dirty = True
    return commit, branch, dirty


def code_directory() -> tuple[str, str]:
    """(directory, source): the main script's directory ("script"), else the working directory ("cwd")."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path)), "script"
    return os.getcwd(), "cwd"


def git_record(path: str, git: str | None = None) -> dict[str, Any]:
    """The git state of the repository holding `path`; never raises (failures say why in "error")."""
    found = git or shutil.which("git")
    record: dict[str, Any] = {"root": UNKNOWN, "commit": UNKNOWN, "branch": UNKNOWN, "dirty": UNKNOWN,
                              "error": ""}
    if not found:
        record["error"] = "git is not installed (not on PATH)"
        return record
    git = os.path.abspath(found)
    deadline = time.monotonic() + BUDGET_S
    try:
        top = _git(git, ["rev-parse", "--show-toplevel"], path, [], deadline)
        root = top.decode("utf-8", "surrogateescape").strip()
        names = _git(git, ["config", "--list", "--name-only", "-z"], root, [], deadline)
        status = _git(git, ["status", "--porcelain=v2", "--branch", "-z", "--untracked-files=no",
                            "--no-renames", "--ignore-submodules=dirty"],
                      root, driver_overrides(names.decode("utf-8", "surrogateescape").split("\0")), deadline)
    except _GitFailed as exc:
        record["error"] = str(exc)
        return record
    commit, branch, dirty = parse_status(status)
    record.update(root=root, commit=commit, branch=branch, dirty=dirty)
    return record


def process_record(git: str | None = None) -> dict[str, Any]:
    """This process's provenance as computed here (the agent's record, when it has one, is fuller).

    No command line or environment: the agent redacts secrets from those; here only the code's
    identity is recorded.
    """
    path, source = code_directory()
    return {"from": "process", "time": time.time(), "pid": os.getpid(), "uid": os.geteuid(),
            "path": path, "source": source, "git": git_record(path, git)}
