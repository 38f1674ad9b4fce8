"""The psutil process source (for systems without a Linux /proc), run here on Linux by name: the same
processes and figures as the /proc reader, zombies and gone processes skipped, and chosen when /proc is absent."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from clusterwatch.agent.backends.procs import ProcSource
from clusterwatch.agent.backends.psutil_procs import PsutilProcSource
from clusterwatch.agent.config import AgentConfig
from clusterwatch.agent.runtime import open_procs

from clusterwatch.errors import ConfigError
from tests.support.helpers import cli, wait_for

# a child that starts a grandchild and burns CPU; it prints the grandchild's pid once both are up
TREE = ("import subprocess, sys; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "print(g.pid, flush=True)\nwhile True: pass")


@pytest.fixture
def tree():
    child = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE)
    grandchild = int(child.stdout.readline())
    time.sleep(0.3)  # the grandchild done starting
    yield child.pid, grandchild
    os.kill(grandchild, signal.SIGKILL)
    child.kill()
    child.wait()


def test_same_tree_and_figures_as_the_proc_reader(tree):
    child, grandchild = tree
    ours, ref = PsutilProcSource("n"), ProcSource("n")
    pids = ours.descendants({child})
    assert pids == ref.descendants({child}) == {child, grandchild}
    now = time.time()
    got = {s.pid: s for s in ours.sample(pids, now, {})}
    want = {s.pid: s for s in ref.sample(pids, now, {})}
    assert got.keys() == want.keys() == pids
    for pid in pids:
        a, b = got[pid], want[pid]
        assert (a.node, a.ppid, a.uid, a.user, a.command, a.threads, a.open_fds) == \
               (b.node, b.ppid, b.uid, b.user, b.command, b.threads, b.open_fds)
        assert abs(a.start_time - b.start_time) <= 0.011
        assert abs(a.rss_bytes - b.rss_bytes) <= 0.05 * b.rss_bytes  # statm vs the stat line's approximation
        assert a.cpu_percent is None and b.cpu_percent is None  # first sight: no previous reading
    assert ours.is_known(child) and not ours.is_known(os.getpid())
    assert ours.start_time(child) == got[child].start_time


def test_cpu_percent_from_deltas(tree):
    """The busy child's share is its CPU time over the wall time between two samples: bracketed by CPU times
    read just around each sample, so the check holds whatever share a loaded machine leaves it."""
    child, grandchild = tree
    busy = psutil.Process(child)

    def cpu() -> float:
        t = busy.cpu_times()
        return t.user + t.system

    src = PsutilProcSource("n")
    before_first, t0 = cpu(), time.time()
    src.sample({child, grandchild}, t0, {})
    after_first = cpu()
    wait_for(lambda: cpu() - after_first >= 0.3, timeout=60, interval=0.05, what="the busy child's CPU time")
    before_second, t1 = cpu(), time.time()
    got = {s.pid: s for s in src.sample({child, grandchild}, t1, {})}
    after_second = cpu()
    low, high = (100 * (before_second - after_first) / (t1 - t0), 100 * (after_second - before_first) / (t1 - t0))
    assert low - 0.1 <= got[child].cpu_percent <= high + 0.1, (low, got[child].cpu_percent, high)
    assert got[child].cpu_percent > 0
    assert got[grandchild].cpu_percent < 10  # asleep


def test_gone_and_zombie_processes_are_skipped():
    src = PsutilProcSource("n")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    assert [s.pid for s in src.sample({p.pid}, time.time(), {})] == [p.pid]
    p.kill()

    def state() -> str:
        with open(f"/proc/{p.pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    wait_for(lambda: state() == "Z", timeout=10, what="the killed child a zombie")  # dead, not reaped
    assert src.sample({p.pid}, time.time(), {}) == []
    p.wait()
    assert src.sample({p.pid}, time.time(), {}) == [] and src.descendants({p.pid}) == set()
    assert src.start_time(p.pid) is None and src.read_errors == 0


def test_chosen_when_there_is_no_proc(tmp_path):
    config = AgentConfig(collector=None, node="n")
    assert isinstance(open_procs(config, proc_root=str(tmp_path)), PsutilProcSource)
    assert isinstance(open_procs(config), ProcSource)
    forced = AgentConfig(collector=None, node="n", process_source="psutil")
    assert isinstance(open_procs(forced), PsutilProcSource)
    with pytest.raises(ConfigError, match="needs a Linux /proc .*--process-source psutil"):
        open_procs(AgentConfig(collector=None, node="n", process_source="proc"), proc_root=str(tmp_path))
    with pytest.raises(ConfigError, match="unknown process source 'x'"):
        open_procs(AgentConfig(collector=None, node="n", process_source="x"))


def test_agent_once_with_the_psutil_source(tree, tmp_path):
    child, grandchild = tree
    r = cli("agent", "--once", "--json", "--process-source", "psutil", "--gpu-source", "none", "--node", "m1",
            "--pid", str(child), "--job-id", "mac-1", "--no-provenance", "--spool-dir", str(tmp_path / "spool"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {p["pid"]: p for p in doc["batch"]["processes"]}
    assert rows.keys() == {child, grandchild}
    assert all(p["job_id"] == "mac-1" and p["rss_bytes"] > 0 for p in rows.values())
    assert rows[child]["cpu_percent"] > 0
    assert int(doc["hello"]["node_memory_total_bytes"]) > 0
