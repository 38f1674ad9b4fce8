"""collector/state/job_closing.py through the core: a closed job's summary stored and written as a file, Slurm's
later word amending both, and a job the store refused closed once it takes it."""
from __future__ import annotations

import json

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db

from clusterwatch.model import JobEvent

T0 = 1_700_000_000.0


def _core(tmp_path) -> CollectorCore:
    config = CollectorConfig(summary_dir=str(tmp_path))
    return CollectorCore(config, Store(open_db(str(tmp_path / "cw.db"))), clock=lambda: T0 + 10)


def _summary_file(tmp_path, job_id: str) -> dict:
    return json.loads((tmp_path / f"clusterwatch-{job_id}.json").read_text())


def test_a_closed_job_is_stored_written_and_forgotten_and_slurm_amends_both(tmp_path):
    core = _core(tmp_path)
    core.close_job(core.state.job_event("n1", JobEvent("end", "43", T0, exit_code=0)))
    assert "43" not in core.state.jobs and core.store.load_summary("43") is not None
    assert _summary_file(tmp_path, "43")["job"]["state"] != "CANCELLED"
    assert core.amend_closed_job("43", "CANCELLED", 15, T0 + 1)
    assert _summary_file(tmp_path, "43")["job"]["state"] == "CANCELLED"
    assert core.stored_job_view("43").job.state == "CANCELLED"
    assert not core.amend_closed_job("43", "CANCELLED", 15, T0 + 1)  # nothing new
    assert not core.amend_closed_job("44", "CANCELLED", 15, T0 + 1)  # never closed here


def test_a_summary_the_store_refused_is_stored_by_a_later_flush(tmp_path):
    core = _core(tmp_path)
    core.store.conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON job_summaries "
                            "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
    job = core.state.job_event("n1", JobEvent("end", "43", T0, exit_code=0))
    core.close_job(job)
    assert core.state.jobs["43"] is job and core.counts()["store_errors"] == 1
    core.close_job(job)  # closed again (an epilog resent): one more try, not a second summary
    assert core.counts()["store_errors"] == 2
    core.store.conn.execute("DROP TRIGGER refuse")
    core.flush()
    assert "43" not in core.state.jobs and core.store.load_summary("43") is not None
    assert (tmp_path / "clusterwatch-43.json").exists()
