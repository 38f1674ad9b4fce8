"""A shard keeps only its own: a batch's samples of a job the collectors list gives another shard (and, from a
node that is not its own, the node's own data) are dropped at ingest, counted, and the node named once in the
log; the rest of the batch is applied and acknowledged. A collector that is not a shard keeps everything.

Through the core's real ingest path (protobuf batches as an agent's stream brings them), the job's `status`
view and the real exporter.
"""
from __future__ import annotations

import json
import logging

import pytest
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.export import ClusterCollector, Exposition
from clusterwatch.collector.export.counter_metrics import counter_families
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import ProcessSample, TrainingReport
from clusterwatch.shards import Collectors
from clusterwatch.wire import processes_to_table, training_to_proto

T0 = 1_800_000_000.0
START = T0 - 100
A, B = "127.0.0.1:7101", "127.0.0.1:7102"  # never dialled: the list is only names here
LISTED = Collectors((A, B))


def first(prefix: str, where: str, of) -> str:
    return next(f"{prefix}{i}" for i in range(10_000) if of(f"{prefix}{i}") == where)


JOB_A, JOB_B = first("", A, LISTED.for_job), first("", B, LISTED.for_job)
NODE_A, NODE_B = first("gpu", A, LISTED.for_node), first("gpu", B, LISTED.for_node)


def core_of(shard: str | None) -> CollectorCore:
    config = CollectorConfig(collectors=f"{A},{B}", shard=shard) if shard else CollectorConfig()
    return CollectorCore(config, Store(open_db(":memory:")), clock=lambda: T0 + 10)


def batch(seq: int, rows: list[tuple[int, str]], events: tuple[str, ...] = (), health: bool = False,
          training: tuple[int, ...] = (), provenance: tuple[int, ...] = ()) -> agent_pb2.Batch:
    """(pid, job id) rows, a prolog start for each of `events`, an XID and a health reading, training reports and
    provenance records for some pids."""
    b = agent_pb2.Batch(seq=seq, sent_at=T0 + seq)
    processes_to_table([ProcessSample(T0 + seq, "x", pid, START, user="alice", job_id=job, rank=0)
                        for pid, job in rows], b.processes)
    for job in events:
        b.job_events.add(kind=agent_pb2.JobEvent.START, job_id=job, user="alice", time=T0 + seq)
    if health:
        b.health_events.add(time=T0 + seq, uuid="GPU-1", kind="xid", xid=79)
        b.gpu_health.add(time=T0 + seq, uuid="GPU-1", ecc_uncorrected_volatile=3)
    for pid in training:
        training_to_proto(TrainingReport(T0 + seq, pid, START, step=seq, tags={"run": "x"}), b.training.add())
    for pid in provenance:
        b.provenance.add(pid=pid, start_time=START, json=json.dumps({"code_id": "c1"}))
    return b


def scrape(core: CollectorCore) -> str:
    collector = ClusterCollector(core.state, lambda: T0 + 10, counters=lambda: counter_families(core.counts()))
    return Exposition(collector, core.lock).scrape().decode()


def test_a_shard_drops_another_shards_job_and_keeps_its_own_from_the_same_batch(caplog) -> None:
    core = core_of(B)
    with caplog.at_level(logging.WARNING, logger="clusterwatch.collector"):
        applied = core.batch(NODE_B, "boot-b", batch(1, [(100, JOB_B), (200, JOB_A), (201, JOB_A), (300, "")],
                                                     events=(JOB_A, JOB_B), training=(100, 200),
                                                     provenance=(100, 200)))
        assert applied  # acknowledged: refused whole, the agent would resend it for ever
        assert core.batch(NODE_B, "boot-b", batch(2, [(200, JOB_A)], events=(JOB_A,)))
    st = core.state
    assert JOB_B in st.jobs and JOB_A not in st.jobs
    assert {k.pid for k in st.processes} == {100, 300}  # its own job's, and the node's own (the node is B's)
    assert st.jobs[JOB_B].provenance and st.processes[next(k for k in st.processes if k.pid == 100)].step == 1
    assert st.training_unmatched == 1  # the dropped process's report has no process here
    assert core.counts()["other_shard_dropped"] == 2 + 1 + 1 + 1  # rows, then the start event, twice
    text = scrape(core)
    assert f'job_id="{JOB_A}"' not in text and f'job_id="{JOB_B}"' in text
    assert "clusterwatch_ingest_other_shard_dropped_total 5" in text
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(said) == 1, said  # once a node, however many batches
    assert JOB_A in said[0] and A in said[0] and NODE_B in said[0] and "same order" in said[0]


def test_a_shard_drops_a_node_not_its_own_its_processes_of_no_job_and_health_records() -> None:
    core = core_of(B)
    assert core.batch(NODE_A, "boot-a", batch(1, [(100, JOB_B), (300, "")], events=(JOB_B,), health=True))
    st = core.state
    assert {k.pid for k in st.processes} == {100}
    assert core.counts()["other_shard_dropped"] == 1 + 2  # the process of no job, the XID and the reading


def test_a_well_configured_agents_batch_passes_as_it_is() -> None:
    core = core_of(B)
    b = batch(1, [(100, JOB_B), (300, "")], events=(JOB_B,), health=True)
    assert core.batch(NODE_B, "boot-b", b)
    assert core.counts()["other_shard_dropped"] == 0
    assert {k.pid for k in core.state.processes} == {100, 300}


@pytest.mark.parametrize("shard", [None, A])
def test_a_collector_that_is_not_a_shard_or_the_jobs_own_keeps_it(shard) -> None:
    core = core_of(shard)
    assert core.batch(NODE_A, "boot-a", batch(1, [(200, JOB_A), (300, "")], events=(JOB_A,)))
    assert JOB_A in core.state.jobs and {k.pid for k in core.state.processes} == {200, 300}
    assert core.counts()["other_shard_dropped"] == 0


def test_a_job_of_the_earlier_list_is_the_earlier_lists_shards() -> None:
    # collectors_before: jobs numbered below 1000 stay on the list they started on (A alone)
    config = CollectorConfig(collectors=f"{A},{B}", collectors_before=f"1000={A}", shard=B)
    core = CollectorCore(config, Store(open_db(":memory:")), clock=lambda: T0 + 10)
    old = next(str(j) for j in range(1, 1000) if LISTED.for_job(str(j)) == B)  # B's by the current list
    assert core.batch(NODE_B, "boot-b", batch(1, [(100, old)]))
    assert old not in core.state.jobs and core.counts()["other_shard_dropped"] == 1
