"""End to end: a real collector and a real agent on loopback, a real workload whose RSS grows."""
from __future__ import annotations

import json
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.services.procs import refused_port
from tests.support.helpers import CLI, Collector, Proc, cli, metric_value, wait_for

pytestmark = pytest.mark.e2e

# Grows 40 MiB/s to 48 MiB (past the 40 MiB the test waits for), then 1 MiB/s: a sample some seconds old on a
# loaded machine is still within the test's 16 MiB of the RSS measured beside it.
WORKLOAD = """
import time, sys
hoard = []
sys.stdout.write("ready\\n"); sys.stdout.flush()
for i in range(600):
    fast = i < 12
    block = bytearray((4 if fast else 1) * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])
    hoard.append(block)
    time.sleep(0.1 if fast else 1.0)
"""


@pytest.fixture
def stack(tmp_path):
    collector = Collector(tmp_path, "--history-step", "0")  # every sample in the trend
    workload = Proc([sys.executable, "-c", WORKLOAD], tmp_path / "workload.log")
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "e2e-node", "--interval", "0.5",
                  "--gpu-source", "none", "--pid", str(workload.pid), "--job-id", "e2e-1",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock")],
                 tmp_path / "agent.log")
    yield collector, workload, agent
    for p in (agent, workload, collector):
        p.stop()


def labels_named(name: str, exposition: str) -> list[str]:
    """The series of an exposition text that carry a label called `name`, in whatever position."""
    return [f"{s.name}{s.labels}" for family in text_string_to_metric_families(exposition)
            for s in family.samples if name in s.labels]


def test_labels_named_finds_a_label_in_any_position():
    text = 'a_total{job_id="1"} 1\nb{job="x"} 1\nc{node="n",job="y"} 2\nd{node="n"} 3\n'
    assert labels_named("job", text) == ["b{'job': 'x'}", "c{'node': 'n', 'job': 'y'}"]


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        import os

        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_samples_reach_metrics_and_status(stack):
    collector, workload, agent = stack
    labels = dict(job_id="e2e-1", node="e2e-node", rank=f"pid{workload.pid}")
    # wait until the workload has grown past 40 MiB and the collector has a sample of it
    wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_rank_rss_bytes", **labels) or 0) > 40 << 20,
             what="the workload's RSS on /metrics")
    before = _rss(workload.pid)
    exported = metric_value(collector.metrics(), "clusterwatch_rank_rss_bytes", **labels)
    after = _rss(workload.pid)
    # the exported value is a recent sample: within 16 MiB (16 s of growth by now) below the RSS measured
    # before, and not above the RSS now
    assert before - (16 << 20) <= exported <= after + (1 << 20)
    text = collector.metrics()
    assert 'clusterwatch_job_info{job_id="e2e-1"' in text
    assert metric_value(text, "clusterwatch_node_up", node="e2e-node") == 1.0
    assert labels_named("job", text) == []  # never a label named job (Prometheus's own)

    human = cli("status", "e2e-1", "--collector", collector.address)
    assert human.returncode == 0, human.stderr
    assert "job e2e-1" in human.stdout
    assert "e2e-node" in human.stdout and str(workload.pid) in human.stdout
    assert "RUNNING" in human.stdout

    doc = cli("status", "e2e-1", "--collector", collector.address, "--json")
    assert doc.returncode == 0, doc.stderr
    view = json.loads(doc.stdout)
    assert view["job"]["job_id"] == "e2e-1"
    procs = {p["pid"]: p for p in view["processes"]}
    assert workload.pid in procs
    p = procs[workload.pid]
    assert p["node"] == "e2e-node" and p["alive"] is True
    assert int(p["rss_bytes"]) > 40 << 20
    assert int(p["samples_held"]) >= 2
    assert len(p["rss_trend"]) >= 2 and p["rss_trend"][-1] > p["rss_trend"][0]


def test_agent_prints_counters_on_sigterm(stack):
    collector, workload, agent = stack
    wait_for(lambda: metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0,
             what="samples ingested")
    assert agent.stop() == 0
    line = [ln for ln in agent.text().splitlines() if ln.startswith("samples_sent=")]
    assert line, agent.text()
    fields = dict(kv.split("=") for kv in line[-1].split())
    assert int(fields["samples_sent"]) >= 1
    assert fields["samples_sent"] == fields["samples_acked"]
    assert fields["samples_dropped"] == "0"


def test_status_of_unknown_job_and_unreachable_collector(stack):
    collector, _, _ = stack
    r = cli("status", "nope-42", "--collector", collector.address)
    assert r.returncode == 1
    assert "nope-42" in r.stderr and "unknown" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    with refused_port() as port:
        r = cli("status", "1", "--collector", f"127.0.0.1:{port}")
    assert r.returncode == 1
    assert "does not answer" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_jobs_lists_the_running_job(stack):
    collector, _, _ = stack
    wait_for(lambda: "e2e-1" in cli("jobs", "--collector", collector.address).stdout, what="job listed")
