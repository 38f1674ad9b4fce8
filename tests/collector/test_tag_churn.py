"""A job's run tags are bounded in churn: a tag whose value changes at every report makes a handful of
clusterwatch_job_info series over a job's life, not one a scrape.

Tags become labels of clusterwatch_job_info (collector/export/families.py), and every new label value is a new
Prometheus series. Each key may change MAX_TAG_CHANGES times in a job; then it shows TAG_CHANGING, and
the values after that are counted (clusterwatch_ingest_tag_changes_dropped_total), not shown.
"""
from __future__ import annotations

import urllib.request

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.export import ClusterCollector, Exposition, serve_metrics
from clusterwatch.collector.export.counter_metrics import counter_families
from clusterwatch.collector.queries.views import job_view
from clusterwatch.collector.state.cluster import MAX_TAG_CHANGES, TAG_CHANGING
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2
from prometheus_client.parser import text_string_to_metric_families

from clusterwatch.model import ProcessSample, TrainingReport
from clusterwatch.wire import ProcessColumns, processes_to_table, training_to_proto

T0 = 1_800_000_000.0
START = T0 - 100
JOB = "4711"
RANKS = {500: 0, 501: 1}  # pid → rank


class Feed:
    """A collector core fed through its real ingest path (protobuf batches, as an agent's stream brings them),
    its /metrics served over HTTP on loopback by the real exporter."""

    def __init__(self) -> None:
        self.now = T0
        self.core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")), clock=lambda: self.now)
        self.seq = 0
        collector = ClusterCollector(self.core.state, lambda: self.now,
                                     counters=lambda: counter_families(self.core.counts()))
        self.httpd = serve_metrics(Exposition(collector, self.core.lock), "127.0.0.1", 0)

    def report(self, tags_by_pid: dict[int, dict[str, str]]) -> None:
        self.now += 1.0
        self.seq += 1
        batch = agent_pb2.Batch(seq=self.seq, sent_at=self.now)
        processes_to_table([ProcessSample(self.now, "n1", pid, START, user="alice", job_id=JOB, rank=rank)
                            for pid, rank in RANKS.items()], batch.processes)
        for pid, tags in tags_by_pid.items():
            training_to_proto(TrainingReport(self.now, pid, START, step=self.seq, tags=tags), batch.training.add())
        assert self.core.batch("n1", "boot-1", batch)

    def scrape(self) -> dict[str, list]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.httpd.server_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        return {f.name: f.samples for f in text_string_to_metric_families(text)}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def job_info_series(families: dict[str, list]) -> set[tuple]:
    return {tuple(sorted(s.labels.items())) for s in families["clusterwatch_job_info"] if s.labels.get("job_id") == JOB}


def dropped(families: dict[str, list]) -> float:
    return next(s.value for name in ("clusterwatch_ingest_tag_changes_dropped",
                                     "clusterwatch_ingest_tag_changes_dropped_total")
                for s in families.get(name, ()) if s.name.endswith("_total"))


def test_a_tag_that_changes_at_every_scrape_makes_a_bounded_number_of_series() -> None:
    feed = Feed()
    try:
        series: set[tuple] = set()
        for i in range(300):
            feed.report({500: {"experiment": "resnet", "now": f"t{i}"}})
            families = feed.scrape()
            series |= job_info_series(families)
        # the first value, MAX_TAG_CHANGES changes, then the marker: never more, however long it runs
        assert len(series) == MAX_TAG_CHANGES + 2, sorted(series)
        last = dict(next(iter(job_info_series(families))))
        assert last["tag_now"] == TAG_CHANGING and last["tag_experiment"] == "resnet"
        assert dropped(families) == 300 - 1 - MAX_TAG_CHANGES
        # status says the same as /metrics
        view = job_view(feed.core.state, feed.core.state.jobs[JOB], feed.now)
        assert dict(view.tags) == {"experiment": "resnet", "now": TAG_CHANGING}
    finally:
        feed.close()


def test_ranks_that_disagree_on_a_tag_settle_on_the_marker_and_a_steady_tag_keeps_its_value() -> None:
    feed = Feed()
    try:
        shown: set[str] = set()
        for _ in range(100):
            # rank 0 and rank 1 each say their own rank: the job's value flips twice a report
            feed.report({500: {"seed": "1", "host": "a"}, 501: {"seed": "1", "host": "b"}})
            families = feed.scrape()
            shown |= {dict(k)["tag_host"] for k in job_info_series(families)}
        # a scrape sees the last rank's value until the changes run out, then the marker: two series
        assert shown == {"b", TAG_CHANGING}
        assert dropped(families) == 2 * 100 - 1 - MAX_TAG_CHANGES
        tags = feed.core.state.jobs[JOB].tags
        assert tags == {"seed": "1", "host": TAG_CHANGING}
    finally:
        feed.close()


def test_a_few_changes_of_a_tag_are_shown_as_they_come() -> None:
    feed = Feed()
    try:
        for phase in ("warmup", "train", "eval", "train", "export")[:MAX_TAG_CHANGES + 1]:
            feed.report({500: {"phase": phase}})
            got = {dict(k)["tag_phase"] for k in job_info_series(feed.scrape())}
            assert got == {phase}
        assert dropped(feed.scrape()) == 0
    finally:
        feed.close()


def test_a_changing_tag_stays_held_across_a_restart(tmp_path) -> None:
    db = str(tmp_path / "c.db")
    core = CollectorCore(CollectorConfig(), Store(open_db(db)), clock=lambda: T0)
    st = core.state
    table = agent_pb2.ProcessTable()
    processes_to_table([ProcessSample(T0, "n1", 500, START, user="alice", job_id=JOB)], table)
    st.add_processes("n1", ProcessColumns(table), T0)
    for i in range(MAX_TAG_CHANGES + 2):
        st.add_training("n1", TrainingReport(T0, 500, START, tags={"now": f"t{i}"}))
    assert st.jobs[JOB].tags["now"] == TAG_CHANGING
    core.save_job(st.jobs[JOB])
    core.flush()
    again = CollectorCore(CollectorConfig(), Store(open_db(db)), clock=lambda: T0)
    again.state.add_processes("n1", ProcessColumns(table), T0)
    again.state.add_training("n1", TrainingReport(T0, 500, START, tags={"now": "later"}))
    assert again.state.jobs[JOB].tags["now"] == TAG_CHANGING


def test_the_users_guide_and_the_counters_help_give_the_bound() -> None:
    from clusterwatch.collector.export.counter_metrics import COUNTERS

    from tests.support.helpers import ROOT

    text = " ".join((ROOT / "docs" / "how-to" / "instrument-training.md").read_text().split())
    assert f"A key's value may change {MAX_TAG_CHANGES} times in a job" in text
    assert f"`{TAG_CHANGING}`" in text
    metrics = " ".join((ROOT / "docs" / "metrics.md").read_text().split())
    assert (f"`clusterwatch_ingest_tag_changes_dropped_total` | Run tag values not shown: their key had changed "
            f"{MAX_TAG_CHANGES} times in the job.") in metrics
    assert f"changed {MAX_TAG_CHANGES} times" in COUNTERS["tag_changes_dropped"][1]
