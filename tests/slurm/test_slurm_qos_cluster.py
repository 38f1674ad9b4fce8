"""Slurm's QOS and cluster name reach the job (issue 17, item 11: status's header shows them): parsed from
scontrol's text (QOS=) and JSON (qos, cluster), and kept by the store across a restart."""
from __future__ import annotations

import json

from clusterwatch.collector.state.cluster import JobState
from clusterwatch.collector.state.store import Store, open_db

from clusterwatch.slurm.scontrol import parse_show_job, parse_show_job_json
from tests.support.helpers import TESTS

FIXTURES = TESTS / "fixtures" / "scontrol"


def test_qos_from_the_text_and_null_as_none():
    (rec,) = parse_show_job((FIXTURES / "19.05-gres-idx.txt").read_text())
    assert rec.qos == "normal" and rec.cluster is None
    (rec,) = parse_show_job((FIXTURES / "22.05-batch-running.txt").read_text())
    assert rec.qos is None


def test_qos_and_cluster_from_the_json():
    doc = json.loads((FIXTURES / "24.05-v0.0.41.json").read_text())
    doc["jobs"][0].update(qos="high", cluster="della")
    rec = parse_show_job_json(json.dumps(doc))[0]
    assert (rec.qos, rec.cluster) == ("high", "della")


def test_the_store_keeps_them():
    store = Store(open_db(":memory:"))
    store.save_job(JobState("42", qos="high", cluster="della"))
    (job,) = store.load_jobs()
    assert (job.qos, job.cluster) == ("high", "della")
