"""agent/provenance_worker.py: provenance off the poll thread, each process once, git stopped with the worker."""
from __future__ import annotations

import sys
import time

from clusterwatch.agent import provenance as prov
from clusterwatch.agent.provenance import (
    ProvenanceConfig,
)
from clusterwatch.agent.provenance_worker import ProvenanceWorker

from clusterwatch.model import ProcessSample
from tests.support.git_repos import (
    SLEEPER,
    assert_no_git_left_on,
    git_wrapper,
    hanging_repo,
    spawn_ready,
    stop_ready,
)
from tests.support.helpers import wait_for


def test_stopping_the_worker_kills_the_git_it_is_waiting_on(tmp_path, shared_dir):
    # A hostile tree blocks git: the agent stopping must not leave it behind.
    repo = hanging_repo(tmp_path / "r")
    wrapper, log = git_wrapper(shared_dir)
    proc = spawn_ready([sys.executable, "-c", SLEEPER], repo, {"PATH": "/usr/bin:/bin"})
    worker = ProvenanceWorker(ProvenanceConfig(git=str(wrapper), budget_s=60.0))
    try:
        worker.offer([ProcessSample(time=time.time(), node="n", pid=proc.pid,
                                    start_time=prov.process_start_time(proc.pid), job_id="1", mapped_by="environ")])
        wait_for(lambda: log.read_text().strip(), timeout=10, what="git to start")
        started = time.monotonic()
        worker.stop()
        assert time.monotonic() - started < 5.0
        assert worker._thread.stop(0.0)  # its thread has ended
        assert_no_git_left_on(repo)
    finally:
        worker.stop()
        stop_ready(proc)


def test_the_worker_takes_a_process_once_and_its_memory_stays_bounded():
    from clusterwatch.agent.provenance_worker import MAX_PENDING

    taken = []
    worker = ProvenanceWorker(capture=lambda pid, cfg: taken.append(pid) or prov.Provenance(0.0, "", "cwd",
                                                                                           prov.GitState()))
    try:
        def rank(pid: int) -> ProcessSample:
            return ProcessSample(time=0.0, node="n", pid=pid, start_time=float(pid), job_id="1", mapped_by="environ")

        bound = 4 * MAX_PENDING
        pids = list(range(bound + 100))
        for first in range(0, len(pids), 50):  # offered 50 a poll, as new ranks appear
            worker.offer([rank(pid) for pid in pids[first:first + 50]])
            worker._todo.join()
        assert len(worker._seen) == bound  # the oldest forgotten
        worker.offer([rank(pids[-1])])  # the newest is remembered: not taken again
        worker._todo.join()
        assert sorted(taken) == pids
    finally:
        worker.stop()
