"""Reading a job's output as its owner, with real users, real processes and hostile files
(agent/job_output_open.py, agent/job_output.py). The suite runs as root, as the agent does."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from clusterwatch.agent.gitrun import RunAs
from clusterwatch.agent.job_output import SOURCE_TAG, JobOutputReader
from clusterwatch.agent.job_output_open import Refused, open_in_child, open_output, output_file

from clusterwatch.model import ProcessSample, TrainingReport
from clusterwatch.procfs import process_start_time
from tests.support.local_users import SYSTEM_PYTHON, group_and_two_users
from tests.support.progress_output import tqdm_bar

# A "rank": writes tqdm updates to its stdout until the stop file exists, then sleeps (its output stops).
RANK = """
import os, sys, time
stop = sys.argv[1]
n = 0
while not os.path.exists(stop):
    n += 1
    try:  # stdout may be open read-only (a hostile case): the writes fail, the process goes on
        sys.stdout.write("\\r" + sys.argv[2].replace("N", str(n)))
        sys.stdout.flush()
    except OSError:
        pass
    time.sleep(0.05)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def users():
    with group_and_two_users("jo") as u:
        yield u


@pytest.fixture
def home():
    """A folder the users can reach (pytest's tmp_path sits under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix="cw-jo-", dir="/var/tmp"))  # /tmp may be 0700 here
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def uid_of(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


def owned(path: Path, user: str, mode: int = 0o644, text: str = "") -> Path:
    path.write_text(text)
    os.chown(path, uid_of(user), -1)
    path.chmod(mode)
    return path


class Rank:
    """A process running as `user` whose stdout is `stdout_file` opened as that user (as slurmstepd does)."""

    def __init__(self, user: str, home: Path, stdout_file: Path, bar: str = "", stdout_mode: str = "a") -> None:
        self.stop = home / f"stop-{stdout_file.name}"
        script = home / "rank.py"
        script.write_text(RANK)
        script.chmod(0o644)
        redirect = {"a": '>>"$0"', "w": '>"$0"', "r": '1<"$0"'}[stdout_mode]
        shell = f'exec {SYSTEM_PYTHON} {script} {self.stop} "$1" {redirect}'
        self.proc = subprocess.Popen(["/usr/sbin/runuser", "-u", user, "--", "/bin/sh", "-c", shell,
                                      str(stdout_file), bar or tqdm_bar(0, 1000).replace(" 0/", " N/")],
                                     cwd="/", env={"PATH": "/usr/bin:/bin"})
        self.pid = self._python_pid()

    def _python_pid(self) -> int:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            # runuser forks (still root, still runuser's arguments), drops to the user, runs the shell, which sets
            # up stdout and execs python: only once argv[0] is python are the uid and the descriptors the rank's.
            for child in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split():
                try:
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if argv[0] == SYSTEM_PYTHON.encode():
                    return int(child)
            time.sleep(0.05)
        raise AssertionError("the rank did not start")

    def sample(self, job_id: str = "77", rank: int | None = 0) -> ProcessSample:
        st = os.stat(f"/proc/{self.pid}")
        return ProcessSample(time=time.time(), node="n1", pid=self.pid, start_time=process_start_time(self.pid),
                             uid=st.st_uid, job_id=job_id, rank=rank)

    def close(self) -> None:
        self.stop.write_text("")
        self.proc.kill()
        subprocess.run(["kill", "-9", str(self.pid)], capture_output=True)
        self.proc.wait()


@pytest.fixture
def ranks():
    made: list[Rank] = []
    yield made
    for r in made:
        r.close()


def steps_read(reader: JobOutputReader, rounds: int = 600) -> list[TrainingReport]:
    """The reports of the first rounds that give some (a loaded machine starts the rank slowly), at most `rounds`."""
    got: list[TrainingReport] = []
    for _ in range(rounds):
        reader.read_round()
        got += reader.drain()
        if got:
            return got
        time.sleep(0.1)
    return got


def test_a_users_rank_is_read_as_the_user(users, home, ranks):
    out = owned(home / "slurm-77.out", users.member)
    rank = Rank(users.member, home, out)
    ranks.append(rank)
    reader = JobOutputReader()
    reader.see([rank.sample()])
    reports = steps_read(reader)
    assert reports and reports[-1].pid == rank.pid and reports[-1].step > 0
    assert reports[-1].tags == dict([SOURCE_TAG]) and reader.refused == 0
    reader.close()


def test_a_file_of_another_user_is_never_opened(users, home, ranks):
    """The member's stdout is the outsider's world-writable file: the member can write it, but it is not theirs."""
    out = owned(home / "theirs.out", users.outsider, 0o666)
    rank = Rank(users.member, home, out)
    ranks.append(rank)
    opened = []
    reader = JobOutputReader(opener=lambda *a: opened.append(a))
    reader.see([rank.sample()])
    assert steps_read(reader, rounds=5) == [] and opened == []


def test_a_root_file_as_stdout_is_never_opened(users, home, ranks):
    """stdout opened read-only on /etc/passwd (any user may): root's file, never read for the user."""
    rank = Rank(users.member, home, Path("/etc/passwd"), stdout_mode="r")
    ranks.append(rank)
    opened = []
    reader = JobOutputReader(opener=lambda *a: opened.append(a))
    reader.see([rank.sample()])
    assert steps_read(reader, rounds=3) == [] and opened == []


def test_a_fifo_as_stdout_is_never_opened(users, home, ranks):
    fifo = home / "pipe"
    os.mkfifo(fifo)
    os.chown(fifo, uid_of(users.member), -1)
    reader_end = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the rank's open does not block
    try:
        rank = Rank(users.member, home, fifo, stdout_mode="w")
        ranks.append(rank)
        assert output_file("/proc", rank.pid, 1) is None
        reader = JobOutputReader(opener=lambda *a: pytest.fail("a FIFO was opened"))
        reader.see([rank.sample()])
        assert steps_read(reader, rounds=3) == []
    finally:
        os.close(reader_end)


def test_the_path_swapped_for_a_symlink_to_shadow_changes_nothing(users, home, ranks):
    """The user replaces their output's path with a link to /etc/shadow: the reader follows the file the process
    writes (its descriptor), so it keeps reading that and never shadow."""
    out = owned(home / "slurm-78.out", users.member)
    rank = Rank(users.member, home, out)
    ranks.append(rank)
    reader = JobOutputReader()
    reader.see([rank.sample()])
    assert steps_read(reader)
    out.rename(home / "moved.out")
    os.symlink("/etc/shadow", out)
    again = steps_read(reader)
    assert again and again[-1].step > 0
    reader.close()


def test_the_owner_cannot_open_what_only_root_reads(users, home):
    member = RunAs(uid_of(users.member), uid_of(users.member), ())
    with pytest.raises(Refused, match="cannot open"):
        open_in_child("/etc/shadow", member)
    secret = owned(home / "secret", users.outsider, 0o600, "the outsider's secret")
    os.symlink(secret, home / "link")
    with pytest.raises(Refused, match="cannot open"):
        open_in_child(str(home / "link"), member)


def test_a_file_changed_between_stat_and_open_is_refused(users, home, ranks):
    out = owned(home / "slurm-79.out", users.member)
    rank = Rank(users.member, home, out)
    ranks.append(rank)
    other = owned(home / "other.out", users.member)
    with pytest.raises(Refused, match="changed"):
        open_output("/proc", rank.pid, 1, os.stat(other))  # as if the stat had seen another file


def test_a_file_truncated_and_rewritten_is_read_on(users, home, ranks):
    out = owned(home / "slurm-80.out", users.member)
    rank = Rank(users.member, home, out)
    ranks.append(rank)
    reader = JobOutputReader()
    reader.see([rank.sample()])
    assert steps_read(reader)
    os.truncate(out, 0)
    assert steps_read(reader)
    reader.close()


def test_a_shared_file_goes_to_rank_zero_and_a_clusterwatch_train_process_is_left_alone(users, home, ranks):
    out = owned(home / "slurm-81.out", users.member)
    first, second = Rank(users.member, home, out), Rank(users.member, home, out)
    ranks += [first, second]
    reader = JobOutputReader()
    reader.see([second.sample(rank=1), first.sample(rank=0)])
    reports = steps_read(reader)
    assert {r.pid for r in reports} == {first.pid}
    s0 = first.sample(rank=0)
    reader.see([second.sample(rank=1), s0], [TrainingReport(time.time(), s0.pid, s0.start_time, step=1)])
    reader.drain()
    time.sleep(0.2)
    reader.read_round()
    assert reader.drain() == []
    reader.close()


def test_output_on_fuse_is_refused_by_its_filesystem():
    from clusterwatch.agent.job_output_open import _fs_type

    info = (b"36 25 0:51 / /home/u/mnt rw,nosuid - fuse.sshfs u@h:/ rw\n"
            b"25 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    assert _fs_type(info, os.makedev(0, 51)) == "fuse.sshfs"
    assert _fs_type(info, os.makedev(8, 1)) == "ext4"
    assert _fs_type(info, os.makedev(9, 9)) is None
