"""A job's run tags stay bounded: 32 keys, keys of 64 bytes, values of 256; what is over is dropped and counted.

Before, every key ever sent was kept: one process sending new keys in a loop grew the collector
by hundreds of MB and made `status` of its job fail.
"""
from __future__ import annotations

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.queries.views import job_view
from clusterwatch.collector.state.cluster import MAX_TAG_KEYS, ClusterState
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import ProcessSample, TrainingReport
from clusterwatch.wire import ProcessColumns, processes_to_table

T0 = 1_800_000_000.0
START = T0 - 100


def state_with_a_job() -> ClusterState:
    st = ClusterState()
    table = agent_pb2.ProcessTable()
    processes_to_table([ProcessSample(T0, "n1", 500, START, user="alice", job_id="9")], table)
    st.add_processes("n1", ProcessColumns(table), T0)
    return st


def tag(st: ClusterState, **tags: str) -> dict[str, str]:
    st.add_training("n1", TrainingReport(T0, 500, START, tags=tags))
    return st.jobs["9"].tags


def test_keys_past_the_bound_are_dropped_and_counted_known_keys_still_change() -> None:
    st = state_with_a_job()
    tags = tag(st, **{f"k{i}": "v" for i in range(40)})
    assert len(tags) == MAX_TAG_KEYS == 32
    assert set(tags) == {f"k{i}" for i in range(32)}  # the first ones stay
    assert st.tags_dropped == 8
    assert tag(st, k0="changed", k99="new")["k0"] == "changed"  # a known key takes its new value
    assert "k99" not in tags and st.tags_dropped == 9


def test_keys_and_values_too_long_in_utf8_are_dropped() -> None:
    st = state_with_a_job()
    tags = tag(st, **{"a" * 64: "ok", "b" * 65: "x", "é" * 33: "x", "short": "v" * 256, "long": "v" * 257,
                      "wide": "é" * 129})
    assert set(tags) == {"a" * 64, "short"}
    assert st.tags_dropped == 4


def test_thirty_thousand_reports_of_new_keys_leave_a_small_job() -> None:
    core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")), clock=lambda: T0)
    st = core.state = state_with_a_job()
    for i in range(30_000):
        st.add_training("n1", TrainingReport(T0, 500, START, tags={f"key-{i}-{j}": "x" * 200 for j in range(4)}))
    job = st.jobs["9"]
    assert len(job.tags) == 32
    assert job_view(st, job, T0).ByteSize() < 64 * 1024  # status of the job answers as usual
    assert core.counts()["tags_dropped"] == 30_000 * 4 - 32
