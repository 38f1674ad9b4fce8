"""The collector judges liveness by its own clock, and refuses times far ahead of it.

A node whose clock steps back made its processes count as dead (their new samples looked older
than the held ones) and closed its agent-only jobs for good; a sample stamped 1e300 froze its
process (every true sample after it looked older).
"""
from __future__ import annotations

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.ingest.checks import MAX_AHEAD_S
from clusterwatch.collector.state.core import AGENT_JOB_GONE_S, HOUSEKEEPING_S, CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import ProcessSample, TrainingReport
from clusterwatch.wire import processes_to_table, training_to_proto

T0 = 1_800_000_000.0
START = T0 - 1000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Node:
    """One agent's stream: numbered batches of one poll of two processes of an agent-only job."""

    def __init__(self, core: CollectorCore) -> None:
        self.core, self.seq = core, 0
        core.hello(agent_pb2.Hello(node="n1", boot_id="b1", interval_s=1.0, send_interval_s=1.0))

    def send(self, t: float, rss: int = 1 << 30, training: TrainingReport | None = None) -> bool:
        self.seq += 1
        b = agent_pb2.Batch(seq=self.seq)
        processes_to_table([ProcessSample(t, "n1", pid, START, user="alice", job_id="a-1", rss_bytes=rss)
                            for pid in (11, 12)], b.processes)
        if training is not None:
            training_to_proto(training, b.training.add())
        return self.core.batch("n1", "b1", b)


def make() -> tuple[CollectorCore, Clock, Node]:
    clock = Clock()
    core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")), clock=clock)
    return core, clock, Node(core)


def test_a_node_clock_stepping_back_neither_kills_its_processes_nor_ends_its_job() -> None:
    core, clock, node = make()
    for _ in range(10):
        node.send(clock.now)
        clock.now += 1
    step_back = 120.0  # the node's clock goes back two minutes; the collector's goes on
    for _ in range(int(3 * AGENT_JOB_GONE_S)):
        assert node.send(clock.now - step_back) is True
        core.tick()
        clock.now += 1
    job = core.state.jobs.get("a-1")
    assert job is not None and not job.ended, "the job was closed while its processes ran"
    processes = core.state.job_processes(job)
    assert len(processes) == 2 and all(p.alive for p in processes)  # both pids the node sends, alive
    # and once the node's clock passes the last time held, readings move on again
    node.send(clock.now, rss=5 << 30)
    assert {p.latest.rss_bytes for p in core.state.job_processes(job)} == {5 << 30}


def test_processes_that_are_gone_still_end_the_job_by_the_collectors_clock() -> None:
    core, clock, node = make()
    node.send(clock.now)
    gone = agent_pb2.Batch(seq=99)  # the next poll lists no process
    core.batch("n1", "b1", gone)
    clock.now += AGENT_JOB_GONE_S + HOUSEKEEPING_S + 1
    core.tick()
    assert "a-1" not in core.state.jobs  # closed



def test_a_sample_stamped_far_ahead_is_refused_and_freezes_nothing() -> None:
    core, clock, node = make()
    node.send(clock.now, rss=1 << 30)
    assert node.send(1e300, rss=2 << 30) is False
    assert node.send(clock.now + MAX_AHEAD_S + 60, rss=3 << 30) is False
    assert core.counters.refused["clock_ahead"] == 2
    clock.now += 1
    assert node.send(clock.now, rss=4 << 30) is True
    assert {p.latest.rss_bytes for p in core.state.processes.values()} == {4 << 30}
    assert core.counts()["refused_clock_ahead"] == 2


def test_a_training_report_stamped_far_ahead_is_refused() -> None:
    core, clock, node = make()
    node.send(clock.now)
    assert node.send(clock.now, training=TrainingReport(1e300, 11, START, step=5)) is False
    assert core.counters.refused["clock_ahead"] == 1


def test_a_little_ahead_and_long_behind_are_let_in() -> None:
    core, clock, node = make()
    assert node.send(clock.now + 60) is True  # a clock a minute fast: odd, but not a reason to lose data
    assert node.send(clock.now - 3 * 86400) is True  # a batch buffered through a long outage, resent
    assert core.counters.refused["clock_ahead"] == 0
