"""Training reports land on their own process, found by (node, pid, start time), never by pid alone.

After pid reuse, a late report of a finished process must not give its steps, loss and tags to
the new process that holds the pid (another user's, another job). Against the state directly,
and through a real agent and collector, with the start time the agent reads for the sender.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import ProcessSample, TrainingReport
from clusterwatch.wire import ProcessColumns, processes_to_table, training_to_proto
from tests.support.helpers import CLI, Collector, Proc, cli, wait_for

T0 = 1_800_000_000.0


def _poll(st: ClusterState, t: float, *samples: ProcessSample) -> None:
    table = agent_pb2.ProcessTable()
    processes_to_table(list(samples), table)
    st.add_processes("n1", ProcessColumns(table), t)


def test_after_pid_reuse_a_late_report_never_lands_on_the_new_process() -> None:
    st = ClusterState()
    old = ProcessSample(T0, "n1", 500, T0 - 100, user="alice", job_id="1")
    _poll(st, T0, old)
    new = ProcessSample(T0 + 10, "n1", 500, T0 + 5, user="bob", job_id="2")  # pid 500 reused by bob's job
    _poll(st, T0 + 10, new)
    late = TrainingReport(T0 + 11, 500, T0 - 100, step=99, loss=0.1, tags={"run": "alice-secret"})
    assert st.add_training("n1", late) is st.processes[old.key]  # alice's own (ended) process, not bob's
    bob = st.processes[new.key]
    assert (bob.step, bob.loss) == (None, None)
    assert st.jobs["2"].tags == {} and st.jobs["1"].tags == {"run": "alice-secret"}
    assert st.add_training("n1", TrainingReport(T0 + 12, 500, T0 + 5, step=3)) is bob
    assert bob.step == 3
    assert st.training_unmatched == 0


def test_a_report_whose_start_time_names_no_process_is_dropped_and_counted() -> None:
    core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")), clock=lambda: T0)
    core.hello(agent_pb2.Hello(node="n1", boot_id="b", interval_s=1.0))
    b = agent_pb2.Batch(seq=1)
    processes_to_table([ProcessSample(T0, "n1", 500, T0 + 5, user="bob", job_id="2")], b.processes)
    training_to_proto(TrainingReport(T0, 500, T0 - 100, step=99, tags={"run": "x"}), b.training.add())
    assert core.batch("n1", "b", b) is True
    series = next(iter(core.state.processes.values()))
    assert series.step is None and core.state.jobs["2"].tags == {}
    assert core.counts()["training_unmatched"] == 1


REPORTER = """
import time
from clusterwatch import train
for step in range(1, 100000):
    train.report(step=step, loss=1.0 / step)
    if step == 1:
        train.tags(run="identity-check")
    time.sleep(0.1)
"""


def test_a_real_agents_reports_find_their_process(tmp_path: Path, monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith("CLUSTERWATCH_"):
            monkeypatch.delenv(name)
    sock = tmp_path / "train.sock"
    collector = Collector(tmp_path)
    # reports before the agent binds the socket are dropped by the client; it tries again a little later
    workload = Proc([sys.executable, "-c", REPORTER], tmp_path / "workload.log",
                    env={**os.environ, "CLUSTERWATCH_TRAIN_SOCKET": str(sock)})
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "train-node", "--interval", "0.2",
                  "--send-interval", "0.5", "--gpu-source", "none", "--pid", str(workload.pid),
                  "--job-id", "6161", "--no-provenance", "--spool-dir", str(tmp_path / "spool"),
                  "--train-socket", str(sock)], tmp_path / "agent.log")
    try:
        def step_seen() -> bool:
            r = cli("status", "6161", "--json", "--collector", collector.address)
            return (r.returncode == 0 and "identity-check" in r.stdout
                    and any(p["step"] is not None for p in json.loads(r.stdout)["processes"]))

        wait_for(step_seen, timeout=40, what="the workload's steps on its process in status")
    finally:
        for p in (agent, workload, collector):
            p.stop()
