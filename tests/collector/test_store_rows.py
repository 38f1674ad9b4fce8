"""The store's rows are named records both ways: what the collector hands it and what it reads back."""
from __future__ import annotations

from clusterwatch.collector.state.cluster import JobState
from clusterwatch.collector.state.store import (
    JobEnd,
    NodeRow,
    NodeSeen,
    ProvenanceRow,
    Store,
    StreamSeqs,
    job_row,
    open_db,
)


def test_rows_written_in_one_ingest_come_back_named(tmp_path):
    store = Store(open_db(str(tmp_path / "cw.db")))
    job = JobState("7", user="ana", state="COMPLETED", start_time=100.0, end_time=200.0)
    row = job_row(job)
    assert (row.job_id, row.state, row.user, row.start_time, row.end_time) == ("7", "COMPLETED", "ana", 100.0, 200.0)
    store.save_ingest([], [("boot-1", 3, [5])], nodes=[NodeRow("n1", "boot-1", "1.0", 1 << 30, ["GPU-a"], 150.0)],
                      jobs=[row], provenance=[ProvenanceRow("7", "n1", 42, 90.0, '{"code_id": "c"}')])
    assert store.load_node_times() == [NodeSeen("n1", 150.0)]
    assert store.ended_since(0.0) == [JobEnd("7", 200.0)]
    assert store.load_seqs() == [StreamSeqs("boot-1", 3, [5])]
    [prov] = store.load_provenance("7")
    assert (prov.node, prov.pid, prov.start_time, prov.record) == ("n1", 42, 90.0, '{"code_id": "c"}')
