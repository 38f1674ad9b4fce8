# ruff: noqa: F811  (pytest fixtures imported from tests/support/train_agent.py are parameters here)
"""The memory snapshot's default folder cannot be taken first by another user.

The default is `clusterwatch-<uid>` in the temp folder, a name anyone can guess. Another user (nobody, for
real: through runuser) makes it first, open to all, as a link to a folder of theirs, or private to them; a
rank of root's then answers `memory_snapshot`: the snapshot is written, never into their folder, but into a
0700 folder of its own user's, and the answer says where.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterwatch import train
from clusterwatch import train_snapshot as ts
from tests.support.train_agent import agent, sock_dir  # noqa: F401  (fixtures)
from tests.train.test_train_snapshot import RUN

NOBODY = 65534


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A temp folder shared like /tmp (mode 1777), which nobody can reach (pytest's tmp_path is root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="cw-snaptmp-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_nobody(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "nobody", "--", *argv], check=True, timeout=30)


def ask(agent, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERWATCH_")}
    env.update({train.SOCKET_ENV: agent.path, "TMPDIR": str(tmp)})
    proc = subprocess.Popen([sys.executable, "-c", RUN, "torch"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        agent.first_report()
        agent.ask("memory_snapshot", "m1", agent.sender_pid)
        return agent.answers("m1")[-1]
    finally:
        proc.kill()
        proc.wait()


def written(answer: dict) -> Path:
    assert answer["status"] == "done", answer
    path = Path(answer["message"].split()[1])
    st = os.lstat(path.parent)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600 and os.lstat(path).st_uid == os.geteuid()
    return path


def test_the_default_folder_is_clusterwatch_uid_in_the_temp_folder(agent, shared_tmp: Path) -> None:
    path = written(ask(agent, shared_tmp))
    assert path.parent == shared_tmp / f"clusterwatch-{os.geteuid()}"


@pytest.mark.parametrize("preempt", ["open to all", "a link to their folder", "private to them"])
def test_a_default_folder_another_user_made_first_is_not_used(agent, shared_tmp: Path, preempt: str) -> None:
    guessed = shared_tmp / f"clusterwatch-{os.geteuid()}"
    theirs = shared_tmp / "nobodys"
    as_nobody("mkdir", "-m", "0777", str(theirs))
    if preempt == "open to all":
        as_nobody("mkdir", "-m", "0777", str(guessed))
    elif preempt == "a link to their folder":
        as_nobody("ln", "-s", str(theirs), str(guessed))
    else:
        as_nobody("mkdir", "-m", "0700", str(guessed))
    assert os.lstat(guessed).st_uid == NOBODY
    path = written(ask(agent, shared_tmp))
    assert path.parent != guessed and path.parent.parent == shared_tmp
    assert path.parent.name.startswith(f"clusterwatch-{os.geteuid()}-")
    assert list(theirs.iterdir()) == []
    if preempt == "open to all":
        assert list(guessed.iterdir()) == []


def test_a_folder_the_user_names_is_still_refused_in_one_line_when_unsafe(shared_tmp: Path) -> None:
    """$CLUSTERWATCH_SNAPSHOT_DIR is the user's choice: an unsafe one is said, not replaced."""
    named = shared_tmp / "named"
    as_nobody("mkdir", "-m", "0777", str(named))
    with pytest.raises(ts.NoSnapshot) as err:
        ts.private_folder(str(named))
    assert "\n" not in str(err.value) and "must be this user's and mode 0700" in str(err.value)
