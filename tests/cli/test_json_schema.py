"""The --json documents of real commands against docs/json/clusterwatch.schema.json.

One real `clusterwatch run` (simulated GPU, training reports, a git checkout with a modified file, a
training stall that fires) gives every document something to show: `status --json` while it runs, and
`alerts --json`, `jobs --json`, and the report `run --json` prints when stopped.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest

from tests.cli.test_cli_streams import running_job  # noqa: F401 (a fixture)
from tests.common.test_json_view import SCHEMA, errors
from tests.support.git_repos import make_repo
from tests.support.helpers import CLI, clean_environ, cli, wait_for

pytestmark = pytest.mark.e2e

TRAIN = """\
import sys, time
from clusterwatch import train
train.tags(experiment="json-schema")
for step in range(1, 8):  # over several of the collector's rule passes (one each 5 s a process)
    train.report(step=step, loss=1.0 / step, lr=0.001)
    time.sleep(1.5)
time.sleep(300)  # stalled: training_stall fires
"""
RULES = "[training_stall]\nfor_s = 3\npending_after_s = 1\n"


def _json(*args: str) -> dict:
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict[str, dict]:
    """status, alerts and jobs --json of a real running job with a firing alert, then run --json's report."""
    tmp = tmp_path_factory.mktemp("json")
    repo = make_repo(tmp / "proj", {"train.py": TRAIN, "README": "readme\n"})
    (repo / "README").write_text("modified\n")  # a checkout with a modified file: dirty is true
    (tmp / "rules.toml").write_text(RULES)
    out, err = tmp / "run.out", tmp / "run.err"
    env = dict(clean_environ(), CLUSTERWATCH_SIM_GPU="0")  # the command asks the simulated GPU 0 for itself
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([*CLI, "run", "--json", "--interval", "0.5", "--gpu-source", "sim",
                                 "--status-every", "0", "--rules", str(tmp / "rules.toml"), "--",
                                 sys.executable, str(repo / "train.py")], stdout=o, stderr=e, env=env)
    try:
        found = wait_for(lambda: re.search(r"watching (local-\d+) .*collector on (\S+)", err.read_text()),
                         timeout=60, what="run's collector")
        job, address = found.groups()

        def firing_with_everything():
            r = cli("status", job, "--collector", address, "--json")
            if r.returncode:
                return None
            doc = json.loads(r.stdout)
            ready = (doc["gpus"] and doc["provenance"] and doc["processes"][0]["step"] == 7
                     and any(a["state"] == "firing" for a in doc["alerts"]))
            return doc if ready else None

        docs = {"status": wait_for(firing_with_everything, timeout=90, what="a stalled job with its GPU")}
        docs["alerts"] = _json("alerts", "--collector", address, "--json")
        docs["jobs"] = _json("jobs", "--collector", address, "--json")
        docs["status_again"] = _json("status", job, "--collector", address, "--json")
    finally:
        proc.send_signal(signal.SIGTERM)  # run passes it on, stops everything and prints its report
        proc.wait(60)
    assert proc.returncode == 128 + signal.SIGTERM, err.read_text()
    docs["run"] = json.loads(out.read_text())
    return docs


def test_status_json_of_a_running_job_is_as_documented(documents):
    doc = documents["status"]
    assert doc["schema"] == "clusterwatch.status/1"
    assert errors(doc, "status_document") == []
    [p] = doc["processes"]
    assert type(p["step"]) is int and type(p["samples_held"]) is int and type(p["rss_bytes"]) is int
    assert p["loss"] == pytest.approx(1 / 7) and p["lr"] == 0.001 and p["rank"] is None
    assert all(type(v) is int for v in p["rss_trend"] + p["gpu_memory_trend"])
    assert doc["job"]["gpus"] == len(doc["gpus"]) == 1  # as the report's header counts them
    assert doc["job"]["end_time"] is None and doc["job"]["account"] is None
    [record] = doc["provenance"]
    assert record["pid"] == p["pid"] and record["git"]["dirty"] is True and record["git"]["error"] is None
    assert doc["tags"] == {"experiment": "json-schema"}
    [alert] = [a for a in doc["alerts"] if a["rule"] == "training_stall"]
    assert alert["job_id"] == doc["job"]["job_id"] and alert["resolved_at"] is None
    assert type(alert["pid"]) is int and alert["fired_at"] >= alert["since"]


def test_status_json_of_a_job_without_gpus_or_git_is_as_documented(running_job):  # noqa: F811
    job, address = running_job
    doc = _json("status", job, "--collector", address, "--json")
    assert errors(doc, "status_document") == []
    assert doc["job"]["gpus"] is None and doc["gpus"] == []  # `run --gpu-source none`: not known
    [p] = doc["processes"]
    assert (p["gpu_memory_bytes"], p["gpu_utilization"], p["step"], p["loss"]) == (None,) * 4  # not measured
    # no GPU memory ever read: its peak is no reading either, null beside the null figure (never 0)
    assert p["gpu_memory_peak_bytes"] is None and type(p["samples_held"]) is int


def test_the_whole_file_tells_the_documents_apart(documents):
    from jsonschema import Draft202012Validator

    checker = Draft202012Validator(SCHEMA)
    for name in ("status", "alerts", "jobs", "run"):
        assert [e.message for e in checker.iter_errors(documents[name])] == [], name
    assert list(checker.iter_errors({"schema": "clusterwatch.status/1", "job": None})) != []


def test_alerts_json_holds_the_alert_object_status_holds(documents):
    doc = documents["alerts"]
    assert doc["schema"] == "clusterwatch.alerts/1"
    assert errors(doc, "alerts_document") == []
    [listed] = [a for a in doc["alerts"] if a["rule"] == "training_stall"]
    [shown] = [a for a in documents["status_again"]["alerts"] if a["rule"] == "training_stall"]
    assert listed == shown  # one object, whichever command prints it (its figures as of that moment)
    assert listed["job_id"] == documents["status"]["job"]["job_id"] and listed["state"] == "firing"


def test_jobs_json_holds_the_job_object_status_holds(documents):
    doc = documents["jobs"]
    assert doc["schema"] == "clusterwatch.jobs/1"
    assert errors(doc, "jobs_document") == []
    status_job = documents["status"]["job"]
    [job] = [j for j in doc["jobs"] if j["job_id"] == status_job["job_id"]]
    # the same object, GPU count included: the list counts the GPUs its processes use, as status does
    assert job == status_job and job["gpus"] == 1
    assert doc["firing_alerts"] == {job["job_id"]: 1} and type(doc["firing_alerts"][job["job_id"]]) is int


def test_run_json_report_is_the_status_document_of_the_ended_job(documents):
    doc = documents["run"]
    assert doc["schema"] == "clusterwatch.status/1"
    assert errors(doc, "status_document") == []
    assert doc["job"]["job_id"] == documents["status"]["job"]["job_id"]
    assert doc["job"]["end_time"] is not None and doc["job"]["exit_code"] == 128 + signal.SIGTERM
    assert [n["agent_up"] for n in doc["nodes"]] == [None]  # an ended job's agent is neither up nor down
    [alert] = [a for a in doc["alerts"] if a["rule"] == "training_stall"]
    assert alert["job_id"] == doc["job"]["job_id"] and alert["fired_at"] is not None
