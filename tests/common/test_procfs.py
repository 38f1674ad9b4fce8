"""clusterwatch.procfs: the one parser of /proc texts (fixture table, properties), and our /proc reader's
figures for real processes checked against psutil's, the reference."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from clusterwatch.agent.backends.procs import ProcSource
from hypothesis import given
from hypothesis import strategies as st

from clusterwatch.errors import ParseError
from clusterwatch.procfs import (
    parse_btime,
    parse_environ,
    parse_stat,
    probe,
    read_boot_time,
    split_stat,
    stat_comm,
    stat_parent,
    stat_state,
)
from tests.support.helpers import wait_for

_TICK = os.sysconf("SC_CLK_TCK")
# A real stat line's layout: fields 3 (state) to 52; {exit} is field 38, exit_signal (-1 for a thread).
STAT = ("{pid} ({comm}) {state} {ppid} 100 100 0 -1 4194560 2000 0 0 0 {utime} {stime} 0 0 20 0 {threads} 0 "
        "{start} 1000000 {rss} 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 {exit} 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n")


def stat_text(comm="python", state="S", ppid=1, utime=150, stime=50, threads=7, start=123456, rss=2560, exit=17):
    return STAT.format(pid=42, comm=comm, state=state, ppid=ppid, utime=utime, stime=stime, threads=threads,
                       start=start, rss=rss, exit=exit).encode()


# (stat text, parse_stat's (comm, state, ppid, cpu_ticks, threads, start_ticks, rss_pages) or None, probe's)
TABLE = [
    (stat_text(), ("python", "S", 1, 200, 7, 123456, 2560), (1, 123456)),
    (stat_text(comm="a) b (c"), ("a) b (c", "S", 1, 200, 7, 123456, 2560), (1, 123456)),
    (stat_text(comm=") Z 9 9 ("), (") Z 9 9 (", "S", 1, 200, 7, 123456, 2560), (1, 123456)),
    (stat_text(state="Z", ppid=77), ("python", "Z", 77, 200, 7, 123456, 2560), (77, 123456)),
    (stat_text(exit=-1), ("python", "S", 1, 200, 7, 123456, 2560), None),  # a thread: not a process
    (b"42 (python) S 1 100", None, None),  # cut short
    (b"42 python S 1", None, None),  # no parenthesis
    (b"", None, None),
]


@pytest.mark.parametrize(("text", "fields", "probed"), TABLE)
def test_stat_table(text, fields, probed):
    if fields is None:
        with pytest.raises(ParseError):
            parse_stat(text)
    else:
        s = parse_stat(text)
        assert (s.comm, s.state, s.ppid, s.cpu_ticks, s.threads, s.start_ticks, s.rss_pages) == fields
        assert stat_state(text) == fields[1] and stat_parent(text) == fields[2]
    assert probe(text) == probed


def test_bad_text_is_none_for_the_lenient_readers():
    for text in (b"", b"42 python", b"42 (x)", b"42 (x) S notanumber"):
        assert stat_parent(text) is None and probe(text) is None
    assert stat_state(b"42 (x)") is None


@given(comm=st.text(st.characters(blacklist_categories=("Cs",)), max_size=15),
       nums=st.tuples(*[st.integers(0, 2**40)] * 6))
def test_any_name_and_numbers_come_back(comm, nums):
    ppid, utime, stime, threads, start, rss = nums
    text = stat_text(comm=comm, ppid=ppid, utime=utime, stime=stime, threads=threads, start=start, rss=rss)
    s = parse_stat(text)
    assert (s.comm, s.ppid, s.cpu_ticks, s.threads, s.start_ticks, s.rss_pages) == (
        comm, ppid, utime + stime, threads, start, rss)
    close, _ = split_stat(text)
    assert stat_comm(text, close) == comm


def test_btime_and_environ():
    assert parse_btime(b"cpu  1 2 3\nbtime 1700000000\nprocesses 9\n") == 1700000000.0
    assert parse_btime(b"cpu 1\n") is None and parse_btime(b"btime x\n") is None
    assert parse_environ(b"A=1\0B=x=y\0junk\0=v\0A=2\0") == {"A": "2", "B": "x=y"}
    with pytest.raises(ParseError):
        parse_environ("text")  # type: ignore[arg-type]


def test_read_boot_time(tmp_path):
    (tmp_path / "stat").write_bytes(b"cpu  1 2 3\nbtime 1700000000\nprocesses 9\n")
    assert read_boot_time(str(tmp_path)) == 1700000000.0
    (tmp_path / "stat").write_bytes(b"cpu  1 2 3\n")
    with pytest.raises(OSError, match="no btime line"):
        read_boot_time(str(tmp_path))
    assert abs(read_boot_time() - psutil.boot_time()) < 2.0  # the real one, beside psutil's


@pytest.fixture
def children():
    """A sleeping child and one that burns CPU, started here."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"],
                               stdout=subprocess.PIPE)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    assert sleeper.stdout.readline() == b"ready\n"  # done starting: its figures stand still from here
    time.sleep(0.5)
    yield sleeper, busy
    for p in (sleeper, busy):
        p.kill()
        p.wait()


def test_our_proc_reader_agrees_with_psutil(children):
    """Start time, parent, threads, RSS, CPU times, user, descriptors: as psutil reads them (the reference)."""
    sleeper, busy = children
    src = ProcSource("n")
    pids = src.descendants({os.getpid()})
    assert {sleeper.pid, busy.pid} <= pids
    samples = {s.pid: s for s in src.sample(pids, time.time(), {})}
    for pid in (sleeper.pid, busy.pid):
        ours, ref = samples[pid], psutil.Process(pid)
        assert ours.ppid == ref.ppid() == os.getpid()
        assert abs(ours.start_time - ref.create_time()) < 0.02  # ours is rounded to 0.01 s
        assert ours.uid == ref.uids().real and ours.user == ref.username()
        assert ours.command == ref.name()[:15]
        assert ours.threads == ref.num_threads()
        assert ours.open_fds == ref.num_fds()
    # RSS: psutil reads statm, exact since Linux 6.16; the stat line's field is the kernel's per-CPU
    # approximation of the same counters (off by a few dozen pages on a 6.18 kernel), so: close, not equal
    ours, ref = samples[sleeper.pid].rss_bytes, psutil.Process(sleeper.pid).memory_info().rss
    assert abs(ours - ref) <= 0.05 * ref, (ours, ref)
    with open(f"/proc/{sleeper.pid}/stat", "rb") as f:
        ticks = parse_stat(f.read()).cpu_ticks
    t = psutil.Process(sleeper.pid).cpu_times()
    assert abs(ticks / _TICK - (t.user + t.system)) < 1.5 / _TICK
    # a busy one's CPU time, read by both within a moment: a few ticks apart at most; waited for, not slept
    # for, since a loaded machine gives the busy loop a fraction of a core
    def busy_ticks() -> int:
        with open(f"/proc/{busy.pid}/stat", "rb") as f:
            return parse_stat(f.read()).cpu_ticks

    wait_for(lambda: busy_ticks() / _TICK > 0.2, timeout=60, interval=0.05, what="the busy child's CPU time")
    ticks = busy_ticks()
    t = psutil.Process(busy.pid).cpu_times()
    assert ticks / _TICK > 0.2
    assert abs(ticks / _TICK - (t.user + t.system)) < 0.25


def test_parse_stat_handles_names_with_spaces_and_parentheses():
    for comm in ("python", "my prog", "a) b (c", "))", "x" * 15):
        st_ = parse_stat(stat_text(comm=comm))
        assert st_.comm == comm
        assert (st_.state, st_.ppid, st_.cpu_ticks, st_.threads, st_.start_ticks, st_.rss_pages) == (
            "S", 1, 200, 7, 123456, 2560)
