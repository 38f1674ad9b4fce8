"""Every string of an agent's stream is bounded: an 8 MiB node name is refused in one line and costs nothing
(no state, no store row, no log line carrying it); over-long names in a batch refuse it, over-long descriptions
are cut. Real gRPC streams against a real collector, and the same checks on a core of its own."""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import grpc
import pytest
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.ingest.bounds import MAX_COMMAND, MAX_WCHAN, HelloRefused
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2, agent_pb2_grpc

from clusterwatch.model import JobEvent, ProcessSample
from clusterwatch.wire import job_event_to_proto, processes_to_table
from tests.support.helpers import AGENT_METADATA, Collector, metric_value, wait_for

HUGE = 8 << 20  # 8 MiB
MARK = "Z" * 64  # what a log, a store row or /metrics would hold of the hostile value


def stream(address: str, *messages: agent_pb2.AgentMessage, linger_s: float = 2.0):
    """Send the messages on one real stream; (acks, the error that ended it or None)."""
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
    acks: list[int] = []

    def gen():
        yield from messages
        time.sleep(linger_s)  # acks come after the collector's next flush

    try:
        for m in agent_pb2_grpc.IngestStub(channel).Stream(gen(), metadata=AGENT_METADATA, timeout=30):
            if m.WhichOneof("body") == "ack":
                acks.append(m.ack.seq)
        return acks, None
    except grpc.RpcError as exc:
        return acks, exc
    finally:
        channel.close()


def hello(node: str = "nb1", **fields) -> agent_pb2.AgentMessage:
    given = {"boot_id": "boot-nb1", "agent_version": "t", **fields}
    return agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, interval_s=1.0, **given))


def batch(seq: int, job_id: str = "9001", user: str = "alice", command: str = "python",
          wchan: str = "") -> agent_pb2.AgentMessage:
    b = agent_pb2.Batch(seq=seq, sent_at=time.time())
    now = time.time()
    processes_to_table([ProcessSample(now, "nb1", 4242, now - 100, ppid=1, uid=1000, user=user, command=command,
                                      job_id=job_id, rank=0, cpu_percent=5.0, rss_bytes=1 << 20, threads=2,
                                      open_fds=5, state="D" if wchan else None, wchan=wchan or None)],
                       b.processes)
    return agent_pb2.AgentMessage(batch=b)


def store_text(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return "\n".join(str(row) for table in ("nodes", "jobs") for row in conn.execute(f"SELECT * FROM {table}"))
    finally:
        conn.close()


@pytest.mark.parametrize("field", ["node", "boot_id", "agent_version", "gpu uuid"])
def test_an_8_mib_string_in_a_hello_is_refused_in_one_line_and_costs_nothing(tmp_path: Path, field: str) -> None:
    db = tmp_path / "cw.db"
    collector = Collector(tmp_path, db=db)
    try:
        hostile = MARK + "x" * HUGE
        if field == "gpu uuid":
            message = hello(gpus=[agent_pb2.GpuInfo(uuid=hostile, index=0, name="sim")])
        else:
            message = hello(**{field: hostile}) if field != "node" else hello(node=hostile)
        acks, error = stream(collector.address, message, batch(1))
        assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert len(error.details()) < 200 and "\n" not in error.details() and MARK not in error.details()
        assert acks == []
        text = collector.metrics()
        assert metric_value(text, "clusterwatch_ingest_rejected_total") == 1
        assert metric_value(text, "clusterwatch_ingest_batches_total") == 0
        assert MARK not in text
        # a sound agent is still taken
        acks, error = stream(collector.address, hello(), batch(1))
        assert error is None and acks == [1]
    finally:
        collector.stop()
    assert MARK not in collector.text() and len(collector.text()) < 20_000
    assert MARK not in store_text(db)


@pytest.mark.parametrize("label", ["job_id", "user"])
def test_a_batch_with_an_over_long_name_is_refused_whole_and_counted(tmp_path: Path, label: str) -> None:
    db = tmp_path / "cw.db"
    collector = Collector(tmp_path, db=db)
    try:
        acks, error = stream(collector.address, hello(), batch(1, **{label: MARK + "y" * (1 << 20)}), batch(2))
        assert error is None and acks == [1, 2]  # the refused one is acknowledged too: the agent drops it
        wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_ingest_refused_too_long_total") == 1,
                 what="the refusal counted")
        text = collector.metrics()
        assert metric_value(text, "clusterwatch_ingest_batches_total") == 1
        assert MARK not in text
    finally:
        collector.stop()
    assert MARK not in collector.text()
    assert MARK not in store_text(db)


def test_over_long_descriptions_are_cut_and_the_batch_taken(tmp_path: Path) -> None:
    core = CollectorCore(CollectorConfig(), Store(open_db(str(tmp_path / "cw.db"))), clock=time.time)
    core.hello(hello().hello)
    assert core.batch("nb1", "boot-nb1", batch(1, command="c" * (1 << 20), wchan="w" * 100_000).batch)
    (series,) = core.state.processes.values()
    assert series.latest.command == "c" * MAX_COMMAND
    assert series.latest.wchan == "w" * MAX_WCHAN


def test_a_core_takes_no_state_from_a_hello_past_its_bounds(tmp_path: Path) -> None:
    core = CollectorCore(CollectorConfig(), Store(open_db(str(tmp_path / "cw.db"))), clock=time.time)
    with pytest.raises(HelloRefused):
        core.hello(hello(node="n" * HUGE).hello)
    with pytest.raises(HelloRefused):
        core.hello(hello(node="bad\nnode").hello)
    assert core.state.nodes == {}
    core.flush()
    assert store_text(tmp_path / "cw.db") == ""


def test_job_events_with_an_over_long_job_id_refuse_the_batch(tmp_path: Path) -> None:
    core = CollectorCore(CollectorConfig(), Store(open_db(str(tmp_path / "cw.db"))), clock=time.time)
    core.hello(hello().hello)
    b = agent_pb2.Batch(seq=1, sent_at=time.time())
    job_event_to_proto(JobEvent("start", "1" * 10_000, time.time(), uid=1000, user="alice"), b.job_events.add())
    assert core.batch("nb1", "boot-nb1", b) is False
    assert core.counters.refused["too_long"] == 1 and core.state.jobs == {}
