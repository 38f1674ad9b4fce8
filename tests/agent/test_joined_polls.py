"""Polls joined into one batch: the agent holds them for the send interval, the collector reads every row."""
from __future__ import annotations

from clusterwatch.agent.agent import PollJoiner
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.v1 import agent_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterwatch.model import GpuUse, ProcessKey, ProcessSample
from clusterwatch.wire import ProcessColumns, processes_from_table, processes_to_table
from tests.support.helpers import CLI, Collector, Proc, cli, metric_value, wait_for


def _poll(t: float, pids: list[int], event: bool = False) -> tuple[agent_pb2.Batch, list[ProcessSample]]:
    batch = agent_pb2.Batch(sent_at=t)
    batch.gpus.add(time=t, uuid="GPU-a", utilization=50.0)
    if event:
        batch.job_events.add(kind=agent_pb2.JobEvent.START, job_id="7", time=t)
    return batch, [ProcessSample(t, "n", pid, 100.0 + pid, rss_bytes=int(t) * 1000) for pid in pids]


def test_polls_are_held_until_the_send_interval_and_go_out_whole() -> None:
    joiner = PollJoiner(interval_s=1.0, send_interval_s=5.0)
    assert joiner.add(*_poll(0.0, [1, 2]), now=0.0) is not None  # the first poll goes out at once
    sent = [joiner.add(*_poll(float(t), [1, 2]), now=float(t)) for t in range(1, 11)]
    assert [i for i, due in enumerate(sent, 1) if due is not None] == [5, 10]  # every five polls
    batch, samples = sent[4]
    assert samples == 10 and len(batch.gpus) == 5 and batch.sent_at == 5.0
    rows = processes_from_table(batch.processes, "n")
    assert [(s.time, s.pid) for s in rows] == [(float(t), p) for t in range(1, 6) for p in (1, 2)]
    assert joiner.take() is None


def test_a_job_event_and_the_end_send_what_is_held_at_once() -> None:
    joiner = PollJoiner(interval_s=1.0, send_interval_s=5.0)
    joiner.add(*_poll(0.0, [1]), now=0.0)
    assert joiner.add(*_poll(1.0, [1]), now=1.0) is None
    batch, samples = joiner.add(*_poll(2.0, [1], event=True), now=2.0)
    assert samples == 2 and [e.job_id for e in batch.job_events] == ["7"]
    assert joiner.add(*_poll(3.0, [1]), now=3.0) is None
    batch, samples = joiner.take()  # the agent's SIGTERM path
    assert samples == 1


def test_a_long_poll_interval_sends_every_poll() -> None:
    joiner = PollJoiner(interval_s=10.0, send_interval_s=5.0)
    assert all(joiner.add(*_poll(t * 10.0, [1]), now=t * 10.0) is not None for t in range(4))


def _table(samples: list[ProcessSample]) -> ProcessColumns:
    t = agent_pb2.ProcessTable()
    processes_to_table(samples, t)
    return ProcessColumns(t)


def test_the_collector_keeps_every_row_and_who_left_during_the_batch() -> None:
    st = ClusterState(history_step_s=1.0)
    st.hello("n", "b", "1", 1.0, "none", 0, [], 0.0, send_interval_s=5.0)
    rows = [ProcessSample(float(t), "n", pid, 1.0, rss_bytes=t * 10) for t in range(1, 6) for pid in (1, 2)]
    rows = [s for s in rows if not (s.pid == 2 and s.time > 3)]  # pid 2 exits after the third poll
    touched = st.add_processes("n", _table(rows), 6.0)
    one, two = st.processes[ProcessKey("n", 1, 1.0)], st.processes[ProcessKey("n", 2, 1.0)]
    assert sorted(s.key.pid for s in touched) == [1, 2]  # each once
    assert (one.samples, two.samples) == (5, 3)
    assert (one.alive, two.alive) == (True, False)
    assert [p.rss_bytes for p in one.history] == [10, 20, 30, 40, 50]
    assert one.rss_peak == 50 and one.latest.time == 5.0
    # the node counts as up for three send intervals, not three poll intervals
    assert st.node_up(st.nodes["n"], 6.0 + 14.0, after_intervals=3.0)


def _samples_total(collector: Collector) -> float:
    return metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0


def test_a_real_agent_joins_polls_and_every_sample_arrives_once(tmp_path) -> None:
    collector = Collector(tmp_path)
    sleeper = Proc(["sleep", "60"], tmp_path / "sleep.log")
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "join-node", "--interval", "0.2",
                  "--send-interval", "1", "--gpu-source", "none", "--no-provenance", "--pid", str(sleeper.pid),
                  "--job-id", "join-1", "--spool-dir", str(tmp_path / "spool"),
                  "--train-socket", str(tmp_path / "train.sock")], tmp_path / "agent.log")
    try:
        wait_for(lambda: _samples_total(collector) >= 15, timeout=30, what="a few joined batches")
        assert agent.stop() == 0  # SIGTERM: the polls held go out, then the counters line
        sent = int(agent.text().split("samples_sent=")[1].split()[0])
        assert sent >= 15 and f"samples_acked={sent} " in agent.text()
        assert _samples_total(collector) == sent
        batches = metric_value(collector.metrics(), "clusterwatch_ingest_batches_total")
        assert batches <= sent / 3  # about five polls a batch (the first and the last go out alone)
        r = cli("status", "join-1", "--collector", collector.address, "--json")
        assert r.returncode == 0, r.stderr
    finally:
        agent.stop()
        sleeper.stop()
        collector.stop()


def _gpus(t: float, pid: int) -> tuple[GpuUse, ...]:
    """None for even pids, one GPU for odd ones, two (one without readings) for pid 4."""
    if pid == 4:
        return (GpuUse("GPU-a", int(t) * 10, 30.0 + t % 3), GpuUse("GPU-b"))
    return (GpuUse("GPU-a", int(t) * 10 + pid, 50.0),) if pid % 2 else ()


def _polls(times: list[float], pids: list[int], **kw) -> list[ProcessSample]:
    return [ProcessSample(t, "n", pid, 1.0, rss_bytes=int(t) * 100 + pid, cpu_percent=t % 7, gpus=_gpus(t, pid),
                          **kw) for t in times for pid in pids]


def test_poll_width_tells_the_agents_usual_batch_from_the_rest() -> None:
    assert _table(_polls([1.0, 2.0, 3.0], [5, 6, 7])).poll_width() == 3
    assert _table(_polls([1.0], [5, 6])).poll_width() == 2
    gone = [s for s in _polls([1.0, 2.0], [5, 6]) if not (s.pid == 6 and s.time == 2.0)]
    assert _table(gone).poll_width() == 0
    relabelled = _polls([1.0, 2.0], [5, 6])
    relabelled[-1].job_id = "9"
    assert _table(relabelled).poll_width() == 0
    backwards = _polls([2.0, 1.0], [5, 6])
    assert _table(backwards).poll_width() == 0


class _RowsOnly(ProcessColumns):
    def poll_width(self) -> int:
        return 0  # every row through the row path


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=4, unique=True),
       st.integers(min_value=1, max_value=6), st.integers(min_value=1, max_value=4),
       st.integers(min_value=0, max_value=4))
def test_the_per_poll_path_keeps_what_the_row_path_keeps(pids: list[int], polls: int, batches: int,
                                                         relabel_at: int) -> None:
    fast, slow = ClusterState(history_step_s=2.0), ClusterState(history_step_s=2.0)
    for k in range(batches):
        # from batch `relabel_at` on, the processes belong to a job: the per-poll path converts them anew
        # Unix times, fractions and all, as an agent sends them
        batch = _polls([1_795_989_241.37 + k * polls + i for i in range(polls)], pids,
                       job_id="9" if k >= relabel_at else "")
        fast.add_processes("n", _table(batch), 0.0)
        t = agent_pb2.ProcessTable()
        processes_to_table(batch, t)
        slow.add_processes("n", _RowsOnly(t), 0.0)
    assert fast.processes.keys() == slow.processes.keys()
    for key, a in fast.processes.items():
        b = slow.processes[key]
        assert (a.latest, a.samples, a.rss_peak, a.gpu_memory_peak, a.alive, list(a.history)) == \
               (b.latest, b.samples, b.rss_peak, b.gpu_memory_peak, b.alive, list(b.history))
