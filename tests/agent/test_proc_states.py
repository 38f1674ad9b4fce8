"""A process held where it is (state D, T or t of /proc/PID/stat) is said in its sample, with, in D, the kernel
function it waits in (/proc/PID/wchan): read when it enters D and then seldom, a bounded number a poll, and
cleaned (an agent's text reaches people). D cannot be made on demand without root tricks: a fake /proc tree;
T is a real process stopped with SIGSTOP, through both process sources."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clusterwatch.agent.backends.procs import WCHAN_EVERY_S, WCHAN_READS_A_POLL, ProcSource
from clusterwatch.agent.backends.psutil_procs import PsutilProcSource

from clusterwatch.model import WCHAN_CHARS, clean_wchan
from tests.agent.test_procs import stat_text
from tests.support.helpers import wait_for


@pytest.fixture
def fake_proc(tmp_path: Path) -> Path:
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    return tmp_path


def write(root: Path, pid: int, state: str = "S", wchan: str | bytes | None = None, **fields) -> None:
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    (d / "stat").write_bytes(stat_text(pid=pid, state=state, start=pid, **fields))
    if wchan is not None:
        (d / "wchan").write_bytes(wchan if isinstance(wchan, bytes) else wchan.encode())


def poll(src: ProcSource, roots: set[int], now: float) -> dict[int, tuple[str, str]]:
    return {s.pid: (s.state, s.wchan) for s in src.sample(src.descendants(roots), now, {})}


def test_a_process_in_d_says_so_with_its_wchan_and_a_running_one_says_nothing(fake_proc: Path) -> None:
    write(fake_proc, 42, "D", "nfs_wait_bit_killable")
    write(fake_proc, 43, "R", "do_not_read_me")
    write(fake_proc, 44, "S")
    src = ProcSource("n1", proc=str(fake_proc), count_fds=False)
    assert poll(src, {42, 43, 44}, 1000.0) == {42: ("D", "nfs_wait_bit_killable"), 43: ("", ""), 44: ("", "")}
    # still in D, its text unchanged: the same state and wchan (not read again)
    (fake_proc / "42" / "wchan").write_text("elsewhere")
    assert poll(src, {42}, 1001.0)[42] == ("D", "nfs_wait_bit_killable")
    # its text changes within WCHAN_EVERY_S: the wchan read then stands; after it, read again
    write(fake_proc, 42, "D", utime=151)
    assert poll(src, {42}, 1002.0)[42] == ("D", "nfs_wait_bit_killable")
    write(fake_proc, 42, "D", utime=152)
    assert poll(src, {42}, 1002.0 + WCHAN_EVERY_S)[42] == ("D", "elsewhere")
    # out of D: nothing said; back in D: its wchan read anew
    write(fake_proc, 42, "S", utime=153)
    assert poll(src, {42}, 1020.0)[42] == ("", "")
    (fake_proc / "42" / "wchan").write_text("rpc_wait_bit_killable\n")
    write(fake_proc, 42, "D", utime=154)
    assert poll(src, {42}, 1021.0)[42] == ("D", "rpc_wait_bit_killable")


def test_stopped_and_traced_processes_say_so_without_a_wchan(fake_proc: Path) -> None:
    write(fake_proc, 50, "T", "do_signal_stop")
    write(fake_proc, 51, "t", "ptrace_stop")
    src = ProcSource("n1", proc=str(fake_proc), count_fds=False)
    assert poll(src, {50, 51}, 1000.0) == {50: ("T", ""), 51: ("t", "")}


def test_an_unreadable_wchan_is_unknown_not_an_error(fake_proc: Path) -> None:
    write(fake_proc, 42, "D")  # no wchan file: another user's process to an agent that is not root
    src = ProcSource("n1", proc=str(fake_proc), count_fds=False)
    assert poll(src, {42}, 1000.0)[42] == ("D", "")
    assert src.read_errors == 0


def test_wchan_reads_are_bounded_a_poll_and_the_rest_come_at_the_next_polls(fake_proc: Path) -> None:
    n = 2 * WCHAN_READS_A_POLL + 3  # a hung file system: every process that touched it in D at once
    pids = set(range(100, 100 + n))
    for pid in pids:
        write(fake_proc, pid, "D", f"wait_{pid}")
    src = ProcSource("n1", proc=str(fake_proc), count_fds=False)
    known = []
    for i in range(3):
        got = poll(src, pids, 1000.0 + i)
        assert all(state == "D" for state, _ in got.values())
        known.append(sum(1 for _, w in got.values() if w))
        assert all(w in ("", f"wait_{pid}") for pid, (_, w) in got.items())
    assert known == [WCHAN_READS_A_POLL, 2 * WCHAN_READS_A_POLL, n]


@pytest.mark.parametrize("raw", [
    b"\x1b[31mnfs_wait\x1b[0m\nrm -rf /",
    b"a" * 10_000,
    "schl\u00e4ft\u202e".encode(),
    b"\xff\xfe\x00\x01",
])
def test_hostile_wchan_text_is_bounded_and_printable(fake_proc: Path, raw: bytes) -> None:
    write(fake_proc, 42, "D", raw)
    src = ProcSource("n1", proc=str(fake_proc), count_fds=False)
    _, wchan = poll(src, {42}, 1000.0)[42]
    assert 0 < len(wchan) <= WCHAN_CHARS
    assert all(c.isascii() and (c.isalnum() or c in "_.?") for c in wchan), wchan
    assert wchan == clean_wchan(raw)


def test_clean_wchan_keeps_a_symbol_and_says_nothing_for_none() -> None:
    assert clean_wchan(b"nfs_wait_bit_killable") == "nfs_wait_bit_killable"
    assert clean_wchan("folio_wait_bit_common.isra.0\n") == "folio_wait_bit_common.isra.0"
    assert clean_wchan(b"0") == "" and clean_wchan("") == "" and clean_wchan(b"  \n") == ""
    assert clean_wchan("a b") == "a?b"


@pytest.fixture
def stopped():
    """A real process, stopped with SIGSTOP (as ctrl-Z or `kill -STOP` leaves a rank)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    def state() -> str:
        with open(f"/proc/{p.pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()

    try:
        os.kill(p.pid, signal.SIGSTOP)
        wait_for(lambda: state() == "T", timeout=10, what="the process stopped")
        yield p
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("source", ["proc", "psutil"])
def test_a_real_stopped_process_reads_t_and_running_again_reads_nothing(stopped, source: str) -> None:
    src = ProcSource("n1") if source == "proc" else PsutilProcSource("n1")
    [s] = src.sample(src.descendants({stopped.pid}), 1000.0, {})
    assert (s.state, s.wchan) == ("T", "")
    os.kill(stopped.pid, signal.SIGCONT)

    def resumed() -> bool:
        [s] = src.sample(src.descendants({stopped.pid}), 1001.0, {})
        return s.state == ""

    wait_for(resumed, timeout=10, what="the process running again")


def test_the_psutil_source_reads_a_wchan_when_its_process_enters_d_not_every_poll(monkeypatch) -> None:
    import psutil

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    reads = []

    class Counted(PsutilProcSource):
        @staticmethod
        def _wchan(pid: int) -> str:
            reads.append(pid)
            return "nfs_wait_bit_killable"

    try:
        src = Counted("n1")
        # psutil as it answers for a process in D (one cannot be made on demand without root tricks)
        monkeypatch.setattr(psutil.Process, "status", lambda self: psutil.STATUS_DISK_SLEEP)
        for i in range(3):
            [s] = src.sample(src.descendants({p.pid}), 1000.0 + i, {})
            assert (s.state, s.wchan) == ("D", "nfs_wait_bit_killable")
        assert reads == [p.pid]
        monkeypatch.setattr(psutil.Process, "status", lambda self: psutil.STATUS_SLEEPING)
        [s] = src.sample(src.descendants({p.pid}), 1004.0, {})
        assert (s.state, s.wchan) == ("", "")
        monkeypatch.setattr(psutil.Process, "status", lambda self: psutil.STATUS_DISK_SLEEP)
        src.sample(src.descendants({p.pid}), 1005.0, {})
        assert reads == [p.pid, p.pid]  # entered D again: read again
    finally:
        p.kill()
        p.wait()
