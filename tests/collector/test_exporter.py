"""The /metrics exposition: the text clusterwatch writes itself, against prometheus_client's own.

A small state built through ClusterState's ingest methods: two nodes, one job of two ranks (each
with a DataLoader worker) plus an unranked process, a second job that ends, GPUs with and without
owners. The text must parse, escape label values, drop an ended job's series, never name a label
`job`, and be what prometheus_client's generate_latest (and its OpenMetrics writer) make of the same
families, line for line, with one intended difference: integer values written as integers
(`3221225472`, where prometheus_client writes `3.221225472e+09`). Over HTTP: the Content-Type, gzip
when asked, OpenMetrics when asked.
"""
from __future__ import annotations

import gzip
import threading
import urllib.error
import urllib.request

import pytest
from clusterwatch.collector.export import (
    ClusterCollector,
    Exposition,
    format_value,
    same_exposition,
    serve_metrics,
)
from clusterwatch.collector.export.families import PROCESS_FAMILIES, RANK_FAMILIES
from clusterwatch.collector.export.snapshot import ProcessRow, RankRow
from clusterwatch.collector.state.cluster import ClusterState
from clusterwatch.v1 import agent_pb2
from hypothesis import given
from hypothesis import strategies as hst
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from clusterwatch.model import GpuInfo, GpuReading, GpuUse, JobEvent, ProcessSample, TrainingReport
from clusterwatch.wire import ProcessColumns, gpu_reading_to_proto, processes_to_table

NOW = 1_800_000_000.0
GiB = 1 << 30
NASTY_NAME = 'say "hi"\\ back\\slash\nnew line'
PROMETHEUS3_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                      "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;"
                      "escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


def _table(samples: list[ProcessSample]) -> ProcessColumns:
    t = agent_pb2.ProcessTable()
    processes_to_table(samples, t)
    return ProcessColumns(t)


def _gpu_msgs(readings: list[tuple[float, GpuReading]]) -> list[agent_pb2.GpuSample]:
    out = []
    for t, r in readings:
        m = agent_pb2.GpuSample()
        gpu_reading_to_proto(r, t, m)
        out.append(m)
    return out


def _state(t: float = NOW) -> ClusterState:
    st = ClusterState()
    for node, base in (("gpu001", 100), ("gpu002", 200)):
        gpus = [GpuInfo(f"GPU-{node}-{i}", i, "H100", 80 * GiB) for i in range(2)]
        # an authenticated agent's node: the user its samples name owns the job
        st.hello(node, f"boot-{node}", "1.0", 1.0, "sim", 512 * GiB, gpus, t).authenticated = True
        st.job_event(node, JobEvent("start", "7001", t - 60, 1000, "alice", (f"GPU-{node}-0",)))
        rank = 0 if node == "gpu001" else 1
        samples = [
            ProcessSample(t, node, base, t - 50, ppid=1, user="alice", command="python train.py", job_id="7001",
                          rank=rank, mapped_by="env", cpu_percent=150.0, rss_bytes=3 * GiB + base, threads=40,
                          open_fds=120, gpus=(GpuUse(f"GPU-{node}-0", 20 * GiB + base, 87.5),)),
            # a DataLoader worker: same rank, mapped through its parent, adds to the job's totals only
            ProcessSample(t, node, base + 1, t - 49, ppid=base, user="alice", command="python train.py",
                          job_id="7001", rank=rank, mapped_by="tree", cpu_percent=50.0, rss_bytes=GiB, threads=4,
                          open_fds=10),
        ]
        if node == "gpu002":
            # an unranked process of the job (rank label pid<PID>), and one of a job that will end
            samples.append(ProcessSample(t, node, 250, t - 40, ppid=1, user="alice", command="monitor.sh",
                                         job_id="7001", cpu_percent=1.0, rss_bytes=10 << 20, threads=1, open_fds=3))
            samples.append(ProcessSample(t, node, 260, t - 30, ppid=1, user="bob", command="python eval.py",
                                         job_id="7002", rank=0, mapped_by="env", cpu_percent=99.0,
                                         rss_bytes=2 * GiB, threads=8, open_fds=20,
                                         gpus=(GpuUse(f"GPU-{node}-1", 5 * GiB, 40.0),)))
        st.add_processes(node, _table(samples), t)
        st.add_gpus(node, _gpu_msgs([(t, GpuReading(f"GPU-{node}-0", 87.0, 20 * GiB, 80 * GiB, 310.5)),
                                     (t, GpuReading(f"GPU-{node}-1", 40.0 if node == "gpu002" else 0.0, 5 * GiB,
                                                    80 * GiB, 95.25))]))
    st.add_training("gpu001", TrainingReport(t - 10, 100, t - 50, step=1000, loss=2.5, lr=3e-4,
                                             tags={"exp": "baseline", "lr-sched": "cosine"}))
    st.add_training("gpu001", TrainingReport(t, 100, t - 50, step=1100, loss=2.25, lr=3e-4))
    job = st.jobs["7001"]
    job.name, job.partition, job.state = NASTY_NAME, "gpu", "RUNNING"
    job.provenance[next(iter(job.processes))] = {"code_id": "abc", "git": {"commit": "abc123", "branch": "main",
                                                                            "dirty": False, "remote_url": ""}}
    st.jobs["7002"].name = "eval"
    return st


def _collector(st: ClusterState, per_process: bool = False, alerts: list[dict] | None = None) -> ClusterCollector:
    alerts = [{"rule": "gpu_idle", "severity": "warning", "state": "firing", "job_id": "7001", "node": "gpu001",
               "rank": ""}] if alerts is None else alerts
    return ClusterCollector(
        st, lambda: NOW + 1, per_process,
        counters=lambda: {"clusterwatch_ingest_samples": (42, "Process samples stored.")},
        alerts=lambda: alerts,
    )


def _scrape(c: ClusterCollector, openmetrics: bool = False) -> str:
    return Exposition(c, threading.Lock()).scrape(openmetrics).decode()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_families_and_values_parse():
    text = _scrape(_collector(_state()))
    fams = _families(text)
    for name in ("clusterwatch_job_info", "clusterwatch_job_code_info", "clusterwatch_job_processes",
                 "clusterwatch_job_gpu_memory_used_bytes", "clusterwatch_job_rss_bytes",
                 "clusterwatch_rank_gpu_memory_used_bytes", "clusterwatch_rank_rss_bytes",
                 "clusterwatch_rank_cpu_ratio", "clusterwatch_rank_gpu_utilization_ratio",
                 "clusterwatch_rank_threads", "clusterwatch_rank_open_fds",
                 "clusterwatch_rank_step", "clusterwatch_rank_steps_per_second", "clusterwatch_rank_loss",
                 "clusterwatch_rank_learning_rate", "clusterwatch_gpu_utilization_ratio",
                 "clusterwatch_gpu_memory_used_bytes", "clusterwatch_gpu_memory_total_bytes",
                 "clusterwatch_gpu_power_watts", "clusterwatch_node_up", "clusterwatch_node_memory_total_bytes",
                 "clusterwatch_node_last_seen_timestamp_seconds", "clusterwatch_agent_samples_dropped",
                 "clusterwatch_alert", "clusterwatch_ingest_samples"):
        assert name in fams, (name, sorted(fams))
    assert fams["clusterwatch_agent_samples_dropped"].type == "counter"
    assert fams["clusterwatch_ingest_samples"].samples[0].name == "clusterwatch_ingest_samples_total"
    assert fams["clusterwatch_ingest_samples"].samples[0].value == 42
    # one family block each: no name appears in two # TYPE lines
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))

    ranks = {(s.labels["node"], s.labels["rank"]): s.value for s in _samples(text, "clusterwatch_rank_rss_bytes")
             if s.labels["job_id"] == "7001"}
    # the workers (mapped by tree, parent of the same rank) get no rank series; the unranked process does
    assert ranks == {("gpu001", "0"): 3 * GiB + 100, ("gpu002", "1"): 3 * GiB + 200, ("gpu002", "pid250"): 10 << 20}
    procs = {s.labels["job_id"]: s.value for s in _samples(text, "clusterwatch_job_processes")}
    assert procs == {"7001": 5, "7002": 1}
    rss = {s.labels["job_id"]: s.value for s in _samples(text, "clusterwatch_job_rss_bytes")}
    assert rss["7001"] == 2 * 3 * GiB + 300 + 2 * GiB + (10 << 20)
    cpu = {s.labels["rank"]: s.value for s in _samples(text, "clusterwatch_rank_cpu_ratio")
           if s.labels["node"] == "gpu001"}
    assert cpu == {"0": 1.5}
    step = _samples(text, "clusterwatch_rank_step")
    assert [(s.labels["rank"], s.value) for s in step] == [("0", 1100)]
    assert _samples(text, "clusterwatch_rank_steps_per_second")[0].value == pytest.approx(10.0)
    assert _samples(text, "clusterwatch_rank_learning_rate")[0].value == pytest.approx(3e-4)

    info = {s.labels["job_id"]: s.labels for s in _samples(text, "clusterwatch_job_info")}
    assert info["7001"]["user"] == "alice" and info["7001"]["partition"] == "gpu"
    assert info["7001"]["tag_exp"] == "baseline" and info["7001"]["tag_lr_sched"] == "cosine"
    code = _samples(text, "clusterwatch_job_code_info")
    assert [(s.labels["job_id"], s.labels["commit"], s.labels["dirty"]) for s in code] == [("7001", "abc123", "false")]

    gpus = {s.labels["gpu"]: s.labels for s in _samples(text, "clusterwatch_gpu_utilization_ratio")}
    assert gpus["GPU-gpu001-0"]["job_id"] == "7001"  # allocated by the prolog
    assert gpus["GPU-gpu002-1"]["job_id"] == "7002"  # used by the job's process
    assert gpus["GPU-gpu001-1"]["job_id"] == ""  # nobody's
    assert gpus["GPU-gpu002-0"]["index"] == "0"
    power = {s.labels["gpu"]: s.value for s in _samples(text, "clusterwatch_gpu_power_watts")}
    assert power["GPU-gpu001-0"] == 310.5 and set(_samples(text, "clusterwatch_gpu_power_watts")[0].labels) == {
        "node", "gpu", "index"}
    assert {s.labels["node"]: s.value for s in _samples(text, "clusterwatch_node_up")} == {"gpu001": 1, "gpu002": 1}
    alert = _samples(text, "clusterwatch_alert")
    assert [(a.labels["rule"], a.labels["state"], a.value) for a in alert] == [("gpu_idle", "firing", 1)]
    # no per-process series without --per-process-metrics
    assert not any(line.startswith("clusterwatch_process_") for line in text.splitlines())


def test_label_values_escaped_and_no_job_label():
    text = _scrape(_collector(_state()))
    raw = next(line for line in text.splitlines() if line.startswith('clusterwatch_job_info{job_id="7001"'))
    assert r'name="say \"hi\"\\ back\\slash\nnew line"' in raw, raw
    for openmetrics, parse in ((False, text_string_to_metric_families), (True, parse_openmetrics)):
        body = _scrape(_collector(_state()), openmetrics)
        names = {s.labels["name"] for f in parse(body) for s in f.samples if s.name == "clusterwatch_job_info"}
        assert names == {NASTY_NAME, "eval"}
        labels = [s.labels for f in parse(body) for s in f.samples]
        assert labels and all("job" not in lab for lab in labels)


def test_an_ended_job_leaves_every_series_and_the_label_cache():
    st = _state()
    c = _collector(st, per_process=True, alerts=[])
    before = _scrape(c)
    assert 'job_id="7002"' in before
    st.job_event("gpu002", JobEvent("end", "7002", NOW, exit_code=0))
    assert st.jobs["7002"].ended
    after = _scrape(c)
    assert 'job_id="7002"' not in after
    assert all(s.labels.get("job_id") != "7002" for f in text_string_to_metric_families(after) for s in f.samples)
    # its GPU stays, with no owner
    gpu = [s for s in _samples(after, "clusterwatch_gpu_memory_used_bytes") if s.labels["gpu"] == "GPU-gpu002-1"]
    assert [s.labels["job_id"] for s in gpu] == [""]
    cached = [key for kind in c._cache.values() for key in kind]
    assert cached and not any("7002" in repr(key) for key in cached)


@pytest.mark.parametrize("per_process", [False, True])
def test_text_says_what_prometheus_client_writes_for_the_same_families(per_process):
    st = _state()
    c = _collector(st, per_process)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    for round_ in range(3):
        snap = c.snapshot()
        ours, theirs = c.render(snap), generate_latest(registry)
        assert same_exposition(ours, theirs)
        assert same_exposition(c.render(snap, openmetrics=True), openmetrics_latest(registry))
        # the one difference: integers as integers; everything else byte for byte
        differ = [(x, y) for x, y in zip(ours.split(b"\n"), theirs.split(b"\n"), strict=True) if x != y]
        assert differ and all(x.rpartition(b" ")[2].lstrip(b"-").isdigit() for x, _ in differ), differ[:3]
        assert any(y.endswith(b"e+09") for _, y in differ) and any(y.endswith(b".0") for _, y in differ)
        # change values and labels between scrapes: the cached label strings must follow
        st.jobs["7001"].name = f"renamed {round_}"
        st.jobs["7001"].tags["round"] = str(round_)
        st.gpus["GPU-gpu001-1"].info = GpuInfo("GPU-gpu001-1", 5 + round_, "H100", 40 * GiB)
        st.add_gpus("gpu001", _gpu_msgs([(NOW + round_ + 1, GpuReading("GPU-gpu001-0", 1.0 * round_, round_ * GiB,
                                                                        None, None))]))
    last = c.render(c.snapshot()).decode()
    assert 'name="renamed 2"' in last and 'tag_round="2"' in last and 'index="7"' in last
    assert 'name="renamed 1"' not in last and 'index="6"' not in last
    assert ('clusterwatch_gpu_memory_used_bytes{gpu="GPU-gpu001-0",index="0",job_id="7001",node="gpu001"} '
            '2147483648\n') in last
    assert per_process == ("clusterwatch_process_rss_bytes{" in last)


def test_name_filter_keeps_only_the_asked_families():
    c = _collector(_state())
    text = c.render(c.snapshot(), names={"clusterwatch_node_up", "clusterwatch_job_info",
                                         "clusterwatch_process_rss_bytes"}).decode()
    assert {f.name for f in text_string_to_metric_families(text)} == {"clusterwatch_node_up", "clusterwatch_job_info"}


def test_rank_and_process_rows_hold_their_families_values_in_order():
    # the writer reads a row's values by position, one per family: each field is its family's name
    assert [f"clusterwatch_rank_{name}" for name in RankRow._fields[1:]] == [f.name for f in RANK_FAMILIES]
    assert [f"clusterwatch_process_{name}" for name in ProcessRow._fields[1:]] == [f.name for f in PROCESS_FAMILIES]
    snap = _collector(_state(), per_process=True).snapshot()
    rank = next(r for r in snap.ranks if r.labels[2] == "0")
    assert rank.labels[0] == "7001" and rank.learning_rate == pytest.approx(3e-4)
    assert snap.processes and all(p.labels[2].isdigit() for p in snap.processes)


@given(hst.one_of(hst.integers(min_value=-(1 << 70), max_value=1 << 70), hst.floats(allow_nan=True),
                  hst.sampled_from([0, 1, 999_999, 1_000_000, 1_000_001, 10**15, 2**53 - 1, 2**53, 2**53 + 1,
                                    1e6, 999_999.5, 1e16, -1e16, 0.0, -0.0, 1e-7, True, False])))
def test_format_value_is_prometheus_clients(value):
    ours, theirs = format_value(value), floatToGoString(value)
    if value.__class__ is int:
        assert ours == str(value)
        assert float(ours) == float(theirs)  # what a parser reads: the same float
    else:
        assert ours == theirs


def _get(url: str, **headers: str):
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, dict(r.headers), r.read()


def _library_headers(registry, **headers: str) -> dict[str, str]:
    """The headers prometheus_client's own WSGI app answers a GET with."""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""}
    environ.update({"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()})
    got = {}
    make_wsgi_app(registry)(environ, lambda status, hs: got.update(hs))
    return got


def test_http_content_type_gzip_and_openmetrics_as_the_library_answers():
    c = _collector(_state())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    httpd = serve_metrics(Exposition(c, threading.Lock()), "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{httpd.server_port}/metrics"
        status, headers, plain = _get(url)
        assert status == 200 and headers["Content-Type"] == _library_headers(registry)["Content-Type"]
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "Content-Encoding" not in headers
        assert "clusterwatch_node_up" in _families(plain.decode())

        status, headers, body = _get(url, **{"Accept-Encoding": "gzip"})
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(body) == plain

        for accept in (PROMETHEUS3_ACCEPT, "application/openmetrics-text; version=1.0.0",
                       "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5", "*/*"):
            asked = {"Accept": accept, "Accept-Encoding": "gzip"}
            status, headers, body = _get(url, **asked)
            theirs = _library_headers(registry, **asked)
            assert (headers["Content-Type"], headers["Content-Encoding"]) == (
                theirs["Content-Type"], theirs["Content-Encoding"]), accept
            text = gzip.decompress(body).decode()
            assert text.endswith("# EOF\n") == headers["Content-Type"].startswith("application/openmetrics-text")
        om = gzip.decompress(_get(url, Accept=PROMETHEUS3_ACCEPT, **{"Accept-Encoding": "gzip"})[2]).decode()
        assert {s.name for f in parse_openmetrics(om) for s in f.samples} == {
            s.name for f in text_string_to_metric_families(plain.decode()) for s in f.samples}
        assert {f.type for f in parse_openmetrics(om)} == {"info", "gauge", "counter"}

        status, headers, body = _get(url + "?name[]=clusterwatch_node_up")
        assert {f.name for f in text_string_to_metric_families(body.decode())} == {"clusterwatch_node_up"}

        head = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(head, timeout=10) as r:
            assert r.status == 200 and r.read() == b"" and int(r.headers["Content-Length"]) == len(plain)
        options = urllib.request.Request(url, method="OPTIONS")
        with urllib.request.urlopen(options, timeout=10) as r:
            assert r.headers["Allow"] == "OPTIONS,GET"
        assert _get(url.replace("/metrics", "/favicon.ico"))[2] == b""
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=10)
        assert err.value.code == 405
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_same_exposition_tells_a_different_value_or_label():
    a = b'# HELP m x\n# TYPE m gauge\nm{a="1"} 3221225472\n'
    assert same_exposition(a, b'# HELP m x\n# TYPE m gauge\nm{a="1"} 3.221225472e+09\n')
    assert not same_exposition(a, b'# HELP m x\n# TYPE m gauge\nm{a="1"} 3.221225473e+09\n')
    assert not same_exposition(a, b'# HELP m x\n# TYPE m gauge\nm{a="2"} 3.221225472e+09\n')
    assert not same_exposition(a, b'# HELP m y\n# TYPE m gauge\nm{a="1"} 3.221225472e+09\n')
    assert not same_exposition(a, a + b'm{a="3"} 1.0\n')


def test_the_agents_read_errors_and_job_output_counts_are_per_node_and_absent_where_not_read():
    st = _state()
    st.nodes["gpu001"].read_errors = 3
    st.nodes["gpu001"].job_output = (2, 1, 4)  # gpu002's agent does not read jobs' output: None
    text = _scrape(_collector(st))
    fams = _families(text)
    assert fams["clusterwatch_agent_job_output_files"].type == "gauge"
    for name in ("clusterwatch_agent_read_errors", "clusterwatch_agent_job_output_refused",
                 "clusterwatch_agent_job_output_errors"):
        assert fams[name].type == "counter", name

    def by_node(name: str) -> dict[str, float]:
        return {s.labels["node"]: s.value for s in _samples(text, name)}

    assert by_node("clusterwatch_agent_read_errors_total") == {"gpu001": 3.0, "gpu002": 0.0}
    assert by_node("clusterwatch_agent_job_output_files") == {"gpu001": 2.0}
    assert by_node("clusterwatch_agent_job_output_refused_total") == {"gpu001": 1.0}
    assert by_node("clusterwatch_agent_job_output_errors_total") == {"gpu001": 4.0}
