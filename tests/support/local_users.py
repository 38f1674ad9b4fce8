"""Real local users and groups for tests where ownership is the point (the suite runs as root, as CI does).

Each name carries a random suffix, so that parallel workers never share one; all are removed at the end.
"""
from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SYSTEM_PYTHON = "/usr/bin/python3"  # one that any user may run (the venv's may sit in a folder they may not enter)


@dataclass(frozen=True)
class Users:
    group: str  # the group `member` belongs to and `outsider` does not
    member: str
    outsider: str


def _run(*args: str) -> None:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{' '.join(args)}: {r.stderr.strip()}"


@contextmanager
def group_and_two_users(prefix: str = "cw") -> Iterator[Users]:
    """A new group, a user in it and a user not in it (no home, no login shell), removed afterwards."""
    assert os.geteuid() == 0, "this test makes real users (useradd): run the suite as root, as CI does"
    tag = secrets.token_hex(3)
    users = Users(f"{prefix}g{tag}", f"{prefix}m{tag}", f"{prefix}o{tag}")
    _run("groupadd", users.group)
    made = []
    try:
        for name, extra in ((users.member, ["-G", users.group]), (users.outsider, [])):
            _run("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", *extra, name)
            made.append(name)
        yield users
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, timeout=60)
        subprocess.run(["groupdel", users.group], capture_output=True, timeout=60)


def run_as(user: str, code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run Python `code` (with `args` as sys.argv[1:]) as `user`, from /, with the system's Python."""
    return subprocess.run(["/usr/sbin/runuser", "-u", user, "--", SYSTEM_PYTHON, "-c", code, *args],
                          capture_output=True, text=True, timeout=timeout, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
