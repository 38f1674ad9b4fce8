"""A batch is applied whole or not at all, and acknowledged only once durable.

Against the real Store (SQLite) on a real full disk (a small tmpfs, mounted as root for the
test), and with a real collector and agent: every sample arrives exactly once. Batches with
values the state cannot hold (NaN times, pid 0, 2^63 bytes) are refused whole, counted by reason.
"""
from __future__ import annotations

import errno
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.state.cluster import JobState
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, JobEvent, ProcessSample, TrainingReport
from clusterwatch.wire import ProcessColumns, job_event_to_proto, processes_to_table, training_to_proto
from tests.support.helpers import CLI, Collector, Proc, cli, metric_value, unique_job_id, wait_for

T0 = 1_800_000_000.0

JOB = unique_job_id()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def make_batch(seq: int, samples=(), events=(), training=(), provenance=(), gpus=()) -> agent_pb2.Batch:
    b = agent_pb2.Batch(seq=seq, sent_at=T0)
    processes_to_table(list(samples), b.processes)
    for e in events:
        job_event_to_proto(e, b.job_events.add())
    for r in training:
        training_to_proto(r, b.training.add())
    for pid, start in provenance:
        b.provenance.add(pid=pid, start_time=start, json=json.dumps({"code_id": "abc", "pid": pid}))
    for uuid, used in gpus:
        b.gpus.add(time=T0, uuid=uuid, utilization=50.0, memory_used_bytes=used, memory_total_bytes=80 << 30)
    return b


def samples(t: float, job_id: str = "7", pids=(101, 102)) -> list[ProcessSample]:
    return [ProcessSample(t, "n1", pid, T0 - 100 + pid, ppid=1, uid=1000, user="alice", command="python",
                          job_id=job_id, rank=i, cpu_percent=50.0, rss_bytes=1 << 30, threads=8, open_fds=20,
                          gpus=(GpuUse("GPU-a", 2 << 30, 80.0),))
            for i, pid in enumerate(pids)]


def good_batch(seq: int, t: float = T0) -> agent_pb2.Batch:
    """A prolog's start, two ranks on a GPU, a GPU reading, a training report and a provenance record."""
    return make_batch(seq, samples(t), events=[JobEvent("start", "7", t - 5, uid=1000, user="alice")],
                      training=[TrainingReport(t, 101, T0 - 100 + 101, step=10, loss=0.5)],
                      provenance=[(101, T0 - 100 + 101)], gpus=[("GPU-a", 4 << 30)])


def new_core(db: Path, clock: Clock) -> CollectorCore:
    core = CollectorCore(CollectorConfig(), Store(open_db(str(db))), clock=clock)
    core.hello(agent_pb2.Hello(node="n1", boot_id="boot-1", agent_version="t", interval_s=1.0,
                               gpus=[agent_pb2.GpuInfo(uuid="GPU-a", index=0, name="sim",
                                                       memory_total_bytes=80 << 30)]), authenticated=True)
    return core


# -- refused batches -------------------------------------------------------------------------------


def _set(column: str, value) -> callable:
    def change(b: agent_pb2.Batch) -> None:
        getattr(b.processes, column)[1] = value
    return change


def _training(**values) -> callable:
    def change(b: agent_pb2.Batch) -> None:
        for k, v in values.items():
            setattr(b.training[0], k, v)
    return change


def _event_time(b: agent_pb2.Batch) -> None:
    b.job_events[0].time = math.nan


def _gpu_memory(b: agent_pb2.Batch) -> None:
    b.gpus[0].memory_used_bytes = 1 << 63


def _provenance_start(b: agent_pb2.Batch) -> None:
    b.provenance[0].start_time = math.inf


REFUSED = {
    "NaN start time": (_set("start_time", math.nan), "not_finite"),
    "infinite time": (_set("time", math.inf), "not_finite"),
    "pid 0": (_set("pid", 0), "bad_pid"),
    "pid 2^32-1": (_set("pid", (1 << 32) - 1), "bad_pid"),
    "rss 2^63-1": (_set("rss_bytes", (1 << 63) - 1), "bad_value"),
    "negative rss": (_set("rss_bytes", -5), "bad_value"),
    "GPU memory 2^63-1": (_set("gpu_memory_bytes", (1 << 63) - 1), "bad_value"),
    "negative threads": (_set("threads", -3), "bad_value"),
    "infinite CPU": (_set("cpu_percent", math.inf), "bad_value"),
    "SM utilisation 1e9": (_set("gpu_sm_utilization", 1e9), "bad_value"),
    "GPU reading 2^63 bytes": (_gpu_memory, "bad_value"),
    "NaN job event time": (_event_time, "not_finite"),
    "NaN training start time": (_training(start_time=math.nan), "not_finite"),
    "training pid 0": (_training(pid=0), "bad_pid"),
    "infinite provenance start time": (_provenance_start, "not_finite"),
}


# Batches of several polls are checked poll by poll where every poll lists the same processes (each poll's time
# and the first poll's processes stand for every row): a bad value that keeps that shape, in every poll or only
# in the last, is refused as in a batch of one poll. Rows 1, 3 and 5 are the second process in each of 3 polls.
IN_POLLS = {
    "pid 0 in every poll": ("pid", (1, 3, 5), 0, "bad_pid"),
    "negative start time in every poll": ("start_time", (1, 3, 5), -5.0, "bad_value"),
    "NaN start time in the last poll": ("start_time", (5,), math.nan, "not_finite"),
    "the last poll an hour ahead": ("time", (4, 5), T0 + 3600.0, "clock_ahead"),
    "the first poll at time 0": ("time", (0, 1), 0.0, "bad_value"),
    "rss 2^63-1 in the last poll": ("rss_bytes", (5,), (1 << 63) - 1, "bad_value"),
    "infinite CPU in the last poll": ("cpu_percent", (5,), math.inf, "bad_value"),
    "SM utilisation 1e9 in the last poll": ("gpu_sm_utilization", (5,), 1e9, "bad_value"),
}


@pytest.mark.parametrize("case", list(IN_POLLS))
def test_an_impossible_value_in_a_batch_of_polls_is_refused(tmp_path: Path, case: str) -> None:
    column, rows, value, reason = IN_POLLS[case]
    core = new_core(tmp_path / "cw.db", Clock())
    bad = make_batch(1, samples(T0 - 2) + samples(T0 - 1) + samples(T0))
    assert ProcessColumns(bad.processes).poll_width() == 2  # as the agent sends them: polls of one shape
    for row in rows:
        getattr(bad.processes, column)[row] = value
    assert core.batch("n1", "boot-1", bad) is False
    assert core.counters.refused[reason] == 1 and core.state.processes == {}
    assert core.batch("n1", "boot-1", make_batch(2, samples(T0 - 2) + samples(T0 - 1) + samples(T0))) is True
    assert core.counters.samples == 6


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_batch_with_impossible_values_is_refused_whole_and_counted(tmp_path: Path, case: str) -> None:
    change, reason = REFUSED[case]
    clock = Clock()
    core = new_core(tmp_path / "cw.db", clock)
    bad = good_batch(1)
    change(bad)
    assert core.batch("n1", "boot-1", bad) is False
    st = core.state
    # nothing of it applied: no process, no job, no GPU reading, no training step
    assert st.processes == {} and st.jobs == {} and st.gpus["GPU-a"].latest is None
    assert (core.counters.batches, core.counters.samples) == (0, 0)
    assert core.counters.refused[reason] == 1 and core.counters.rejected == 1
    assert sum(core.counters.refused.values()) == 1
    assert core.counts()[f"refused_{reason}"] == 1
    core.flush()
    assert core.store.load_jobs() == [] and core.store.load_provenance("7") == []
    # recorded as handled: the agent's resend is dropped (and acknowledged), not applied
    assert core.batch("n1", "boot-1", bad) is False
    assert core.counters.duplicates == 1 and st.processes == {}
    # the agent's next batch goes in as usual
    assert core.batch("n1", "boot-1", good_batch(2)) is True
    assert len(st.processes) == 2 and st.jobs["7"].user == "alice"


def test_a_refused_batch_is_said_once_per_node_and_reason(tmp_path: Path, caplog) -> None:
    core = new_core(tmp_path / "cw.db", Clock())
    for seq in range(1, 4):
        bad = good_batch(seq)
        bad.processes.start_time[0] = math.nan
        core.batch("n1", "boot-1", bad)
    said = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(said) == 1 and "n1" in said[0].getMessage() and "NaN" in said[0].getMessage()
    assert core.counters.refused["not_finite"] == 3


# -- a full disk ------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs at tmp_path/disk (the test runs as root, as the suite does), unmounted after."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"cannot mount a tmpfs (the test needs root): {done.stderr.strip()}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Fill the file system until writes fail with ENOSPC; returns the filler file."""
    filler = disk / "filler"
    chunk = b"\0" * 4096
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
    return filler


def test_a_full_disk_during_ingest_loses_and_doubles_nothing(small_disk: Path) -> None:
    clock = Clock()
    db = small_disk / "cw.db"
    core = new_core(db, clock)
    assert core.batch("n1", "boot-1", good_batch(1)) is True
    core.flush()
    filler = fill(small_disk)
    # the disk is full: batches still go in whole (nothing is written on the way), a new job by its samples,
    # another's epilog closing it
    clock.now += 1
    assert core.batch("n1", "boot-1", make_batch(2, samples(clock.now, "8", pids=(201,)),
                                                 provenance=[(201, T0 - 100 + 201)])) is True
    clock.now += 1
    end = JobEvent("end", "7", clock.now, exit_code=0)
    assert core.batch("n1", "boot-1", make_batch(3, samples(clock.now, "8", pids=(201,)), events=[end])) is True
    assert core.state.jobs["7"].ended  # closed, but not stored: it stays in memory
    for _ in range(3):  # nothing is acknowledged while the store refuses it
        with pytest.raises(Exception, match="full"):
            core.flush()
    assert core.counters.store_errors >= 4
    assert core.store.load_summary("7") is None
    filler.unlink()  # room again
    core.flush()
    assert "7" not in core.state.jobs
    assert core.store.load_summary("7") is not None
    stored = {j.job_id: j for j in core.store.load_jobs()}
    assert stored["7"].state == "COMPLETED" and stored["8"].user == "alice"
    assert [r.pid for r in core.store.load_provenance("8")] == [201]
    held = {k.pid: s.samples for k, s in core.state.processes.items()}
    assert held == {201: 2}
    # a collector started on that store now takes every resent batch as the duplicate it is
    again = new_core(db, clock)
    for seq in (1, 2, 3):
        assert again.batch("n1", "boot-1", agent_pb2.Batch(seq=seq)) is False
    assert again.counters.duplicates == 3
    assert again.state.restored_samples == {("n1", 201, T0 - 100 + 201): 2}


def test_an_epilog_is_acknowledged_only_once_its_jobs_summary_is_stored(tmp_path: Path) -> None:
    clock = Clock()
    core = new_core(tmp_path / "cw.db", clock)
    core.batch("n1", "boot-1", good_batch(1))
    core.flush()
    # the store takes the small ingest rows but refuses summaries (a trigger of the real SQLite)
    core.store.conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON job_summaries "
                            "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
    clock.now += 1
    core.batch("n1", "boot-1", make_batch(2, events=[JobEvent("end", "7", clock.now, exit_code=0)]))
    with pytest.raises(Exception, match="not stored yet"):
        core.flush()  # so the service holds the epilog's ack back
    assert core.store.load_seqs() == [("boot-1", 2, [])]  # the ingest rows went in
    assert core.state.jobs["7"].ended and core.store.load_summary("7") is None
    core.store.conn.execute("DROP TRIGGER refuse")
    core.flush()
    assert core.store.load_summary("7") is not None and "7" not in core.state.jobs


def test_a_job_saved_through_the_core_waits_for_the_flush_and_survives_a_full_disk(small_disk: Path) -> None:
    core = new_core(small_disk / "cw.db", Clock())
    core.flush()
    filler = fill(small_disk)
    core.save_job(JobState("55", name="from-slurm", user="bob"))  # what the registry does each pass
    with pytest.raises(Exception, match="full"):
        core.flush()
    filler.unlink()
    core.flush()
    assert [(j.job_id, j.user) for j in core.store.load_jobs()] == [("55", "bob")]


# -- the same with a real collector and agent -------------------------------------------------------

# Two workers under a rank; they leave when the rank is stopped.
WORKERS = """
import os, sys, time
rank = os.getpid()
for _ in range(2):
    if os.fork() == 0:
        deadline = time.time() + 600
        while os.getppid() == rank and time.time() < deadline:
            time.sleep(0.2)
        sys.exit(0)
time.sleep(600)
"""


@pytest.fixture
def no_clusterwatch_env(monkeypatch):
    """Hermetic: the children see none of the caller's CLUSTERWATCH_* settings."""
    for name in list(os.environ):
        if name.startswith("CLUSTERWATCH_"):
            monkeypatch.delenv(name)


def _held(address: str, job_id: str) -> dict:
    r = cli("status", job_id, "--collector", address, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.e2e
def test_a_full_disk_under_a_real_collector_every_sample_arrives_once(tmp_path: Path, small_disk: Path,
                                                                     no_clusterwatch_env) -> None:
    db = small_disk / "cw.db"
    collector = Collector(tmp_path, db=db)
    workload = Proc([sys.executable, "-c", WORKERS], tmp_path / "workload.log")
    spool = tmp_path / "spool"
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "disk-node", "--interval", "0.2",
                  "--send-interval", "0.5", "--gpu-source", "none", "--pid", str(workload.pid),
                  "--job-id", JOB, "--no-provenance", "--spool-dir", str(spool),
                  "--train-socket", str(tmp_path / "train.sock")], tmp_path / "agent.log")
    try:
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0) > 30,
                 what="samples before the disk fills")
        filler = fill(small_disk)
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_store_errors_total") or 0) >= 5,
                 what="flushes refused by the full disk")
        # the job's processes end and its epilog runs while nothing can be written
        workload.stop()
        time.sleep(2)
        hook = subprocess.run([*CLI, "epilog"], capture_output=True, text=True, timeout=30, env={
            **os.environ, "SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "disk-node",
            "SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "CLUSTERWATCH_SPOOL": str(spool),
            "CLUSTERWATCH_COLLECTOR": collector.address})
        assert hook.returncode == 0, hook.stderr
        time.sleep(3)
        assert collector.popen.poll() is None
        assert cli("status", JOB, "--collector", collector.address).returncode == 0
        filler.unlink()  # room again
        wait_for(lambda: _held(collector.address, JOB)["job"]["state"] == "COMPLETED", timeout=30,
                 what="the job's summary stored once the disk has room")
        assert agent.stop() == 0
        # a full disk fails every flush: said once when it starts and once when it ends, no traceback
        log_text = collector.text()
        assert log_text.count("cannot write the store") == 1, log_text[-2000:]
        assert "the store takes writes again" in log_text and "Traceback" not in log_text
        line = [ln for ln in agent.text().splitlines() if ln.startswith("samples_sent=")][-1]
        counters = dict(kv.split("=") for kv in line.split())
        sent = int(counters["samples_sent"])
        assert counters["samples_dropped"] == "0" and int(counters["samples_acked"]) == sent
        view = _held(collector.address, JOB)
        held = sum(int(p["samples_held"]) for p in view["processes"])
        assert len(view["processes"]) == 3
        assert held == sent, f"collector holds {held} samples, the agent sent {sent}"
        # and the same after a restart: the summary was stored, not only held in memory
        collector.stop(signal.SIGKILL)
        collector = Collector(tmp_path, db=db, name="collector2")
        view = _held(collector.address, JOB)
        assert view["job"]["state"] == "COMPLETED"
        assert sum(int(p["samples_held"]) for p in view["processes"]) == sent
    finally:
        for p in (agent, workload, collector):
            p.stop()
