"""/metrics stays valid whatever users put in it: tags, job names, node names, users, commands.

One tag key (`café`: str.isalnum() is true for "é") wrote a label name Prometheus cannot parse, and
Prometheus then takes nothing from the whole scrape. The exposition is checked by both parsers that
matter: prometheus_client's and promtool's (the Go parser Prometheus itself uses).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import threading

import pytest
from clusterwatch.collector.export import MAX_TAG_LABELS, ClusterCollector, Exposition, tag_labels
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.v1 import agent_pb2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from clusterwatch.model import GpuInfo, GpuUse, JobEvent, ProcessSample, TrainingReport
from clusterwatch.wire import ProcessColumns, processes_to_table

NOW = 1_800_000_000.0
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

# any Unicode text (no lone surrogates: every string here reached the collector through protobuf or
# was decoded from Slurm's output with errors="replace")
ANY = st.text(max_size=40)
TAG_KEYS = st.sampled_from(["café", "lr-sched", "lr_sched", "__name__", "job_id", "2x", "", "a b", "ü" * 80]) | ANY
TAGS = st.dictionaries(TAG_KEYS, ANY | st.sampled_from(['"', "\\", "\n", "x\\\"\n"]), max_size=40)
NAMES = ANY | st.sampled_from(['say "hi"\\ back\\slash\nnew line', "\r\t\x00", "# HELP", "} 1"])


def _table(samples: list[ProcessSample]) -> ProcessColumns:
    t = agent_pb2.ProcessTable()
    processes_to_table(samples, t)
    return ProcessColumns(t)


def _state(jobs: list[tuple[str, str, str, dict]], nodes: list[str], command: str) -> ClusterState:
    """Each job (id, user, name, tags) with one ranked process on each node, through the state's ingest."""
    st_ = ClusterState()
    for n, node in enumerate(nodes):
        st_.hello(node, f"boot-{n}", "1.0", 1.0, "sim", 1 << 30, [GpuInfo(f"GPU-{n}", 0, "H100", 1 << 34)], NOW)
        samples = []
        for j, (job_id, user, _, _) in enumerate(jobs):
            st_.job_event(node, JobEvent("start", job_id, NOW - 60, 1000 + j, user, (f"GPU-{n}",)))
            samples.append(ProcessSample(NOW, node, 100 + j, NOW - 50, ppid=1, user=user, command=command,
                                         job_id=job_id, rank=n, mapped_by="env", cpu_percent=50.0,
                                         rss_bytes=1 << 20, threads=2, open_fds=5,
                                         gpus=(GpuUse(f"GPU-{n}", 1 << 20, 10.0),)))
        st_.add_processes(node, _table(samples), NOW)
    for j, (job_id, _, name, tags) in enumerate(jobs):
        st_.add_training(nodes[0], TrainingReport(NOW, 100 + j, NOW - 50, step=5, loss=1.0, lr=0.1,
                                                  tags=dict(list(tags.items())[:4])))
        job = st_.jobs[job_id]
        job.name, job.partition, job.state = name, name[:5], "RUNNING"
        job.tags.update(tags)  # whatever the state holds, however many
    return st_


def _promtool(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)


def test_promtool_is_there_and_refuses_a_bad_label_name():
    # the property below relies on promtool telling a bad exposition: show that it does
    assert shutil.which(PROMTOOL), "promtool is missing: run scripts/setup.sh (Debian's prometheus package)"
    bad = '# HELP m x\n# TYPE m gauge\nm{tag_café="x"} 1\n'
    assert _promtool(bad).returncode != 0
    assert _promtool(bad.replace("é", "_")).returncode == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(ANY.filter(bool), NAMES, NAMES, TAGS), min_size=1, max_size=3,
                unique_by=lambda job: job[0]),
       st.lists(NAMES.filter(bool), min_size=1, max_size=2, unique=True), NAMES, st.booleans())
@example([("7001", "alice", "x", {"café": "1"})], ["gpu001"], "python", False)
@example([("7001", "alice", "x", {"lr-sched": "a", "lr_sched": "b"})], ["gpu001"], "python", False)
def test_any_user_strings_give_an_exposition_both_parsers_take(jobs, nodes, command, per_process):
    state = _state(jobs, nodes, command)
    collector = ClusterCollector(state, lambda: NOW + 1, per_process,
                                 alerts=lambda: [{"rule": "r", "severity": "warning", "state": "firing",
                                                  "job_id": jobs[0][0], "node": nodes[0], "rank": "0"}])
    expo = Exposition(collector, threading.Lock())
    text = expo.scrape().decode()
    families = list(text_string_to_metric_families(text))
    assert {f.name for f in families} >= {"clusterwatch_job_info", "clusterwatch_rank_rss_bytes"}
    for f in families:
        for s in f.samples:
            assert all(LABEL_NAME.match(k) and not k.startswith("__") for k in s.labels), s.labels
    info = [s for f in families for s in f.samples if s.name == "clusterwatch_job_info"]
    assert len(info) == len(jobs)
    assert all(sum(k.startswith("tag_") for k in s.labels) <= MAX_TAG_LABELS for s in info)
    checked = _promtool(text)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode(errors="replace")[:2000]
    om = expo.scrape(openmetrics=True).decode()
    assert len(list(parse_openmetrics(om))) == len(families)


def test_tag_labels_are_a_small_fixed_set_per_job():
    tags = {f"k{i}": str(i) for i in range(50)}
    first = tag_labels(tags)
    assert list(first) == [f"tag_k{i}" for i in range(MAX_TAG_LABELS)]
    tags.update({f"new{i}": "x" for i in range(20)}, k0="changed")  # later keys never push earlier ones out
    assert list(tag_labels(tags)) == list(first) and tag_labels(tags)["tag_k0"] == "changed"
    assert tag_labels({"café": "1", "caf_": "2", "job_id": "3"}, ("job_id",)) == {"tag_caf_": "1",
                                                                                   "tag_job_id": "3"}


@pytest.mark.parametrize("key", ["café", "x²", "٣", "naïve-run"])
def test_a_non_ascii_tag_key_maps_to_a_valid_name(key):
    (name,) = tag_labels({key: "v"})
    assert LABEL_NAME.match(name) and name.isascii()
