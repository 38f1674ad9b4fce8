"""The /proc process source: stat parsing, the kept tree (real children, grandchildren and children
forked from a non-main thread), identity across a reused pid, zombies, CPU percent from deltas."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterwatch.agent.backends.new_pids import NewPids
from clusterwatch.agent.backends.procs import ProcSource

from clusterwatch.model import GpuUse, ProcessSample
from clusterwatch.procfs import parse_stat, probe
from tests.support.helpers import wait_for

# A real /proc/<pid>/stat line of a process, with {comm} and a few fields to vary.
STAT = ("{pid} ({comm}) {state} 1 100 100 0 -1 4194560 2000 0 0 0 {utime} {stime} 0 0 20 0 {threads} 0 {start} "
        "1000000 {rss} 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n")


def stat_text(pid: int = 42, comm: str = "python", state: str = "S", utime: int = 150, stime: int = 50,
              threads: int = 7, start: int = 123456, rss: int = 2560) -> bytes:
    return STAT.format(pid=pid, comm=comm, state=state, utime=utime, stime=stime, threads=threads, start=start,
                       rss=rss).encode()


@pytest.mark.parametrize("comm", [
    "python", "my prog", "a) b (c", "))", "((", ") S 1 2 3 (", "x" * 15, "pt_main_thread", "ü ñ", "", "a\nb",
])
def test_parse_stat_takes_the_name_up_to_the_last_parenthesis(comm: str) -> None:
    st = parse_stat(stat_text(comm=comm))
    assert st.comm == comm
    assert (st.state, st.ppid, st.cpu_ticks, st.threads, st.start_ticks, st.rss_pages) == ("S", 1, 200, 7, 123456,
                                                                                            2560)
    assert probe(stat_text(comm=comm)) == (1, 123456)


def test_probe_tells_a_thread_from_a_process() -> None:
    thread = stat_text().replace(b" 17 1 0 0 0", b" -1 1 0 0 0")
    assert probe(thread) is None
    assert probe(b"garbage") is None
    assert probe(stat_text()) == (1, 123456)


# -- real processes ---------------------------------------------------------------------------------------

TREE_SCRIPT = r"""
import json, os, subprocess, sys, threading, time
SLEEP = ["sleep", "600"]
def spawn():
    middle = subprocess.Popen([sys.executable, "-c",
        "import subprocess, time; p = subprocess.Popen(['sleep', '600']); print(p.pid, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    grandchild = int(middle.stdout.readline())
    out = {}
    hold = threading.Event()
    def from_thread():
        out["thread_child"] = subprocess.Popen(SLEEP).pid
        out["thread_id"] = threading.get_native_id()
        started.set()
        hold.wait()  # the thread stays alive: its child stays in its own children list
    started = threading.Event()
    threading.Thread(target=from_thread, daemon=True).start()
    started.wait()
    return middle, {"middle": middle.pid, "grandchild": grandchild, **out}
for line in sys.stdin:
    if line.strip() == "spawn":
        middle, pids = spawn()
        print(json.dumps(pids), flush=True)
    elif line.strip() == "kill-middle":
        middle.kill()  # not waited for: it stays a zombie, its child goes to init
        while open(f"/proc/{middle.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)
        print("done", flush=True)
"""


class Tree:
    """A root process that, on request, starts a child with a grandchild and a child from another thread."""

    def __init__(self) -> None:
        self.root = subprocess.Popen([sys.executable, "-c", TREE_SCRIPT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pids: dict[str, int] = {}

    def ask(self, line: str) -> str:
        assert self.root.stdin is not None and self.root.stdout is not None
        self.root.stdin.write(line + "\n")
        self.root.stdin.flush()
        return self.root.stdout.readline()

    def spawn(self) -> dict[str, int]:
        self.pids = json.loads(self.ask("spawn"))
        return self.pids

    def stop(self) -> None:
        for name in ("grandchild", "thread_child", "middle"):
            if name in self.pids:
                try:
                    os.kill(self.pids[name], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.root.kill()
        self.root.wait()


@pytest.fixture
def tree() -> Iterator[Tree]:
    t = Tree()
    yield t
    t.stop()


@pytest.mark.parametrize(("when", "full_every"), [("before", 1000), ("after", 1000), ("after", 1)])
def test_the_tree_holds_children_grandchildren_and_children_of_other_threads(tree: Tree, when: str,
                                                                           full_every: int) -> None:
    src = ProcSource("n1", full_every=full_every)
    root = tree.root.pid
    if when == "before":  # the first look at a root walks its tree (every thread's children)
        pids = tree.spawn()
    else:  # the tree is known; the children come later and are found by their parent pid
        assert src.descendants({root}) == {root}
        pids = tree.spawn()
    assert pids["thread_id"] != root  # forked from a thread that is not the main thread
    middle, grandchild, thread_child = pids["middle"], pids["grandchild"], pids["thread_child"]
    assert src.descendants({root}) == {root, middle, grandchild, thread_child}
    samples = {s.pid: s for s in src.sample(src.descendants({root}), time.time(), {})}
    assert set(samples) == {root, middle, grandchild, thread_child}
    assert (samples[middle].ppid, samples[grandchild].ppid, samples[thread_child].ppid) == (root, middle, root)
    assert samples[grandchild].command == samples[thread_child].command == "sleep"
    # The middle process dies and is not reaped: a zombie in the tree, never sampled; its child went to
    # another parent and is no longer below the root.
    assert tree.ask("kill-middle").strip() == "done"
    now_tree = src.descendants({root})
    assert middle in now_tree and grandchild not in now_tree and thread_child in now_tree
    assert {s.pid for s in src.sample(now_tree, time.time(), {})} == {root, thread_child}
    # Roots that are gone leave nothing behind.
    assert src.descendants({2**22 + 7}) == set()
    assert src.descendants(set()) == set()


def settled(pid: int) -> bool:
    """Asleep with its memory paged in: a `sleep` just started is still loading (its RSS grows, and was
    read 82 pages against 327 a moment later)."""
    def read() -> tuple[str, int]:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = parse_stat(f.read())
        return st.state, st.rss_pages

    first = read()
    time.sleep(0.05)
    return first[0] == "S" and read() == first


def test_samples_read_the_real_process(tree: Tree) -> None:
    src = ProcSource("n1")
    root = tree.root.pid
    pids = tree.spawn()
    wait_for(lambda: settled(pids["grandchild"]), timeout=10, what="the grandchild asleep")
    use = [GpuUse("GPU-x", 123, 45.0)]
    first = {s.pid: s for s in src.sample(src.descendants({root}), 1000.0, {root: use})}
    s = first[root]
    assert isinstance(s, ProcessSample)
    with open(f"/proc/{root}/stat", "rb") as f:
        assert s.command == parse_stat(f.read()).comm == os.path.basename(sys.executable)[:15]
    assert s.node == "n1" and s.pid == root and s.ppid == os.getpid() and s.uid == os.getuid()
    assert s.gpus == (GpuUse("GPU-x", 123, 45.0),)
    assert s.cpu_percent is None  # first sight: no previous reading
    assert (s.job_id, s.rank, s.local_rank, s.step_id, s.mapped_by) == ("", None, None, "", "")
    # A sleeping `sleep`: its figures stay put, so a second read of /proc must agree with the sample.
    g = first[pids["grandchild"]]
    with open(f"/proc/{g.pid}/stat", "rb") as f:
        st = parse_stat(f.read())
    assert g.command == st.comm == "sleep" and g.ppid == pids["middle"] and g.gpus == ()
    assert g.start_time == round(src.boot_time + st.start_ticks / os.sysconf("SC_CLK_TCK"), 2)
    assert g.uid == os.stat(f"/proc/{g.pid}").st_uid and g.user
    assert g.threads == st.threads == len(os.listdir(f"/proc/{g.pid}/task")) == 1
    assert g.open_fds == len(os.listdir(f"/proc/{g.pid}/fd"))
    assert g.rss_bytes == st.rss_pages * os.sysconf("SC_PAGE_SIZE") and g.rss_bytes > 0
    second = {s.pid: s for s in src.sample(src.descendants({root}), 1001.0, {})}
    assert second[root].cpu_percent is not None and second[root].cpu_percent >= 0.0
    assert second[root].start_time == s.start_time
    assert src.is_known(root) and src.start_time(root) == pytest.approx(s.start_time, abs=0.01)
    # Without kept descriptors (over the budget) the same processes read the same.
    plain = ProcSource("n1", max_held=0)
    plain_samples = {s.pid: s for s in plain.sample(plain.descendants({root}), 1000.0, {})}
    assert set(plain_samples) == set(first)
    for pid, p in plain_samples.items():
        assert (p.ppid, p.start_time, p.command, p.uid) == (
            first[pid].ppid, first[pid].start_time, first[pid].command, first[pid].uid)
    q = plain_samples[g.pid]
    assert (q.threads, q.open_fds, q.rss_bytes) == (g.threads, g.open_fds, g.rss_bytes)


def test_open_fds_are_counted_when_first_seen_then_once_a_period() -> None:
    """Between counts a sample carries the last count (not None, which means unknown)."""
    me = os.getpid()

    def open_fds(src: ProcSource, now: float) -> int | None:
        [s] = [s for s in src.sample(src.descendants({me}), now, {}) if s.pid == me]
        return s.open_fds

    src, every_poll = ProcSource("n1", fd_count_every_s=5.0), ProcSource("n1", fd_count_every_s=0.0)
    open_fds(every_poll, 1000.0)  # (each source keeps descriptors of this process open: both are counted)
    first = open_fds(src, 1000.0)
    assert first is not None and first > 0 and open_fds(every_poll, 1000.5) == first
    r, w = os.pipe()
    try:
        assert open_fds(src, 1002.0) == open_fds(src, 1004.9) == first  # within the period: the count at 1000
        assert open_fds(every_poll, 1001.0) == first + 2
        assert open_fds(src, 1005.0) == first + 2  # the period has passed: counted anew, the pipe is there
        os.close(w)
        assert open_fds(src, 1009.0) == first + 2
        assert open_fds(src, 990.0) == first + 1  # the clock stepped back: counted anew
    finally:
        os.close(r)
        try:
            os.close(w)
        except OSError:
            pass


RENAME = r"""
import ctypes, sys
libc = ctypes.CDLL(None)
sys.stdout.write("ready\n"); sys.stdout.flush()
for line in sys.stdin:
    libc.prctl(15, line.rstrip("\n").encode(), 0, 0, 0)  # PR_SET_NAME
    sys.stdout.write("renamed\n"); sys.stdout.flush()
"""


def test_a_renamed_process_reads_its_new_name() -> None:
    child = subprocess.Popen([sys.executable, "-c", RENAME], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        src = ProcSource("n1")
        names = []
        for name in ("a) b (c", "x y", "))"):
            child.stdin.write(name + "\n")
            child.stdin.flush()
            assert child.stdout.readline() == "renamed\n"
            [s] = src.sample(src.descendants({child.pid}), time.time(), {})
            names.append(s.command)
        assert names == ["a) b (c", "x y", "))"]
    finally:
        child.kill()
        child.wait()


def test_a_reaped_process_is_gone_even_though_its_descriptor_is_kept() -> None:
    child = subprocess.Popen(["sleep", "600"])
    src = ProcSource("n1")
    assert {s.pid for s in src.sample(src.descendants({child.pid}), time.time(), {})} == {child.pid}
    child.kill()
    child.wait()
    assert src.descendants({child.pid}) == set()
    assert src.sample({child.pid}, time.time(), {}) == []
    assert not src.is_known(child.pid)


def test_a_reused_pid_is_a_new_process() -> None:
    """The kernel hands a dead process's pid to a new one (set through ns_last_pid; the suite runs as root)."""
    src = ProcSource("n1")
    first = subprocess.Popen(["sleep", "600"])
    pid = first.pid
    [old] = src.sample(src.descendants({pid}), time.time(), {})
    time.sleep(0.05)  # the next process starts some clock ticks later: identity is (pid, start time in ticks)
    first.kill()
    first.wait()
    second = None
    for _ in range(50):  # another process on the host may take the pid first: try again
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        p = subprocess.Popen(["sleep", "601"])
        if p.pid == pid:
            second = p
            break
        p.kill()
        p.wait()
    assert second is not None, f"could not get pid {pid} again"
    try:
        [new] = src.sample(src.descendants({pid}), time.time(), {})
        assert new.pid == old.pid and new.start_time != old.start_time
        assert new.cpu_percent is None  # never a delta against the process that had the pid before
    finally:
        second.kill()
        second.wait()


# -- a /proc fixture: exact figures -------------------------------------------------------------------------


@pytest.fixture
def fake_proc(tmp_path: Path) -> Path:
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    return tmp_path


def write_proc(root: Path, pid: int, **fields) -> None:
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    (d / "stat").write_bytes(stat_text(pid=pid, **fields))  # rewritten in place, as /proc reads anew


def test_cpu_percent_from_tick_deltas_and_identity_by_start_time(fake_proc: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    write_proc(fake_proc, 42, utime=100, stime=50, start=500)
    src = ProcSource("n1", proc=str(fake_proc), count_fds=False)
    [a] = src.sample(src.descendants({42}), 1000.0, {})
    assert a.cpu_percent is None and a.start_time == round(1700000000 + 500 / tick, 2) and a.open_fds is None
    write_proc(fake_proc, 42, utime=100 + tick // 2, stime=50 + tick // 2, start=500)  # one tick-second in 2 s
    [b] = src.sample(src.descendants({42}), 1002.0, {})
    assert b.cpu_percent == 50.0
    write_proc(fake_proc, 42, utime=100 + tick // 2, stime=50 + tick // 2, start=500)
    [c] = src.sample(src.descendants({42}), 1003.0, {})
    assert c.cpu_percent == 0.0
    # The pid now belongs to a process that started later: a new identity, no delta against the old one.
    write_proc(fake_proc, 42, utime=5, stime=0, start=900)
    [d] = src.sample(src.descendants({42}), 1004.0, {})
    assert d.cpu_percent is None and d.start_time == round(1700000000 + 900 / tick, 2)
    write_proc(fake_proc, 42, utime=5 + tick, stime=0, start=900)
    [e] = src.sample(src.descendants({42}), 1005.0, {})
    assert e.cpu_percent == 100.0


def test_zombies_are_skipped_and_the_tree_follows_parents(fake_proc: Path) -> None:
    write_proc(fake_proc, 10, start=1)
    src = ProcSource("n1", proc=str(fake_proc), count_fds=False)
    assert src.descendants({10}) == {10}
    (fake_proc / "11").mkdir()
    (fake_proc / "11" / "stat").write_bytes(stat_text(pid=11, start=2).replace(b" S 1 ", b" S 10 "))
    (fake_proc / "12").mkdir()
    (fake_proc / "12" / "stat").write_bytes(stat_text(pid=12, state="Z", start=3).replace(b" Z 1 ", b" Z 11 "))
    assert src.descendants({10}) == {10, 11, 12}
    assert sorted(s.pid for s in src.sample({10, 11, 12}, 5.0, {})) == [10, 11]


def test_new_pids_come_from_the_last_pid_and_a_listing_now_and_then() -> None:
    news = NewPids(full_every=1000)
    assert news.poll() is None and news.listed  # the first call lists /proc: the baseline
    child = subprocess.Popen(["sleep", "600"])
    try:
        found = news.poll()
        assert child.pid in found
        with open(f"/proc/{child.pid}/stat", "rb") as f:
            text = f.read()
        assert probe(text) == (os.getpid(), parse_stat(text).start_ticks)
        news.force()
        assert child.pid in news.poll() and news.listed  # new since the last listing (the first call)
        news.force()
        assert child.pid not in news.poll() and news.listed  # not new since the last listing
        assert news.listing is not None and child.pid in news.listing
    finally:
        child.kill()
        child.wait()


def test_an_unchanged_stat_text_reuses_its_figures_and_any_change_is_read(fake_proc: Path) -> None:
    """Both halves of a poll skip parsing a stat text equal to the last one: every change must still show."""
    tick = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    write_proc(fake_proc, 10, start=1)
    write_proc(fake_proc, 20, start=2)
    write_proc(fake_proc, 42, comm="worker", utime=100, stime=0, threads=3, rss=1000, start=5)
    (fake_proc / "42" / "stat").write_bytes(stat_text(pid=42, comm="worker", utime=100, stime=0, threads=3, rss=1000,
                                                      start=5).replace(b" S 1 ", b" S 10 "))
    src = ProcSource("n1", proc=str(fake_proc), count_fds=False)

    def poll(now: float, roots: set[int]) -> dict[int, ProcessSample]:
        return {s.pid: s for s in src.sample(src.descendants(roots), now, {})}

    def rewrite(**fields) -> None:
        ppid = fields.pop("ppid", 10)
        text = stat_text(pid=42, start=5, **fields).replace(b" S 1 ", f" S {ppid} ".encode())
        (fake_proc / "42" / "stat").write_bytes(text)

    poll(1000.0, {10, 20})
    for now in (1001.0, 1002.0):  # nothing changed: the same figures, no CPU used
        s = poll(now, {10, 20})[42]
        assert (s.cpu_percent, s.threads, s.rss_bytes, s.ppid, s.command) == (0.0, 3, 1000 * page, 10, "worker")
        assert s.time == now
    assert poll(1002.0, {10, 20})[42].cpu_percent is None  # no time passed: no rate
    rewrite(comm="worker", utime=100 + tick, stime=0, threads=3, rss=1000)
    assert poll(1003.0, {10, 20})[42].cpu_percent == 100.0
    rewrite(comm="worker", utime=100 + tick, stime=0, threads=9, rss=1000)
    assert poll(1004.0, {10, 20})[42].threads == 9
    rewrite(comm="worker", utime=100 + tick, stime=0, threads=9, rss=4321)
    assert poll(1005.0, {10, 20})[42].rss_bytes == 4321 * page
    rewrite(comm="renamed", utime=100 + tick, stime=0, threads=9, rss=4321)
    assert poll(1006.0, {10, 20})[42].command == "renamed"
    # It moves below another watched parent, then that parent is no longer watched: the tree follows.
    rewrite(comm="renamed", utime=100 + tick, stime=0, threads=9, rss=4321, ppid=20)
    assert poll(1007.0, {10, 20})[42].ppid == 20
    assert src.descendants({10}) == {10}
    # Exited and not reaped yet: a zombie is not sampled, whatever was read before.
    (fake_proc / "42" / "stat").write_bytes(stat_text(pid=42, state="Z", start=5).replace(b" Z 1 ", b" Z 20 "))
    assert 42 in src.descendants({20}) and 42 not in poll(1008.0, {20})
