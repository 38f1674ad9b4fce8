"""CollectorCore tells the listeners it was built with of samples, provenance, closed jobs and ticks.

A listener that raises is counted and said once; ingest goes on (the batch is applied already).
The registry and the query service ask the core, through its methods, for what they read and change.
"""
from __future__ import annotations

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.export.counter_metrics import COUNTERS, counter_families
from clusterwatch.collector.state.core import CollectorCore, CoreListener
from clusterwatch.collector.state.store import Store, open_db

from clusterwatch.model import JobEvent

from .test_ingest_integrity import T0, Clock, make_batch, samples


class Recorder(CoreListener):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_samples(self, node, touched, now):
        self.events.append(("samples", node, len(touched)))

    def on_provenance(self, job, now):
        self.events.append(("provenance", job.job_id))

    def on_job_closed(self, job, now):
        self.events.append(("closed", job.job_id))

    def on_tick(self, now):
        self.events.append(("tick", now))


class Broken(CoreListener):
    def on_samples(self, node, touched, now):
        raise RuntimeError("a bug in a listener")


def _core(tmp_path, *listeners) -> tuple[CollectorCore, Clock]:
    clock = Clock()
    core = CollectorCore(CollectorConfig(db_path=str(tmp_path / "cw.db")), Store(open_db(str(tmp_path / "cw.db"))),
                         clock=clock, listeners=listeners)
    return core, clock


def test_listeners_hear_of_every_event_in_order(tmp_path):
    rec = Recorder()
    core, clock = _core(tmp_path, rec)
    core.hello(_hello())
    start = JobEvent("start", "7", T0, 1000)
    assert core.batch("n1", "boot-1", make_batch(1, samples(T0), events=[start], provenance=[(101, T0 + 1)]))
    clock.now += 1
    core.tick()
    end = JobEvent("end", "7", T0 + 1, 1000, exit_code=0)
    assert core.batch("n1", "boot-1", make_batch(2, events=[end]))
    assert rec.events[:3] == [("provenance", "7"), ("samples", "n1", 2), ("tick", T0 + 1)]
    assert ("closed", "7") in rec.events[3:]


def test_a_listener_that_raises_is_counted_and_ingest_goes_on(tmp_path):
    rec = Recorder()
    core, _ = _core(tmp_path, Broken(), rec)
    core.hello(_hello())
    assert core.batch("n1", "boot-1", make_batch(1, samples(T0)))
    assert core.batch("n1", "boot-1", make_batch(2, samples(T0 + 1)))
    assert core.counts()["callback_errors"] == 2
    assert [e[0] for e in rec.events] == ["samples", "samples"]  # the next listener still hears of both


def test_a_listener_added_after_construction_hears_closes(tmp_path):
    core, _ = _core(tmp_path)
    rec = Recorder()
    core.add_listener(rec)
    assert core.listeners == (rec,)
    core.hello(_hello())
    core.batch("n1", "boot-1", make_batch(1, samples(T0), events=[JobEvent("start", "7", T0, 1000)]))
    core.batch("n1", "boot-1", make_batch(2, events=[JobEvent("end", "7", T0, 1000, exit_code=0)]))
    assert ("closed", "7") in rec.events


def test_every_count_has_a_metric_name(tmp_path):
    core, _ = _core(tmp_path)
    families = counter_families(core.counts())
    assert set(core.counts()) <= set(COUNTERS)
    assert families["clusterwatch_ingest_batches"] == (0, "Batches stored.")
    assert families["clusterwatch_ingest_refused_clock_ahead"][0] == 0
    assert all(name.startswith("clusterwatch_") and not name.endswith("_total") and text
               for name, (_, text) in families.items())


def test_job_edits_and_reads_go_through_the_core(tmp_path):
    core, clock = _core(tmp_path)
    job, made = core.edit_job("42", lambda j: setattr(j, "user", "bob") or "made", create=True)
    assert made == "made" and job.user == "bob" and core.holds(job)
    assert core.edit_job("nope", lambda j: 1) == (None, None)
    assert "42" in core.job_ids()
    core.edit_jobs(lambda j: setattr(j, "note", "n"))
    assert job.note == "n"
    assert core.job_owners()["42"] == "bob"
    assert [i.job_id for i in core.job_infos(False, lambda user: user == "bob")] == ["42"]
    assert core.job_infos(False, lambda user: False) == []
    assert core.agent_up("n1", clock.now) is False and core.gpu_uuids_by_index("n1") is None


def _hello():
    from clusterwatch.v1 import agent_pb2

    return agent_pb2.Hello(node="n1", boot_id="boot-1", agent_version="t", interval_s=1.0, gpu_source="none")
