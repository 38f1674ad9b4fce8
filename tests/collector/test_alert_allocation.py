"""A host memory leak is judged against the job's memory allocation where Slurm gives one (issue 17, item 11:
host memory compared with the allocation, not the node's RAM): the time until the job is killed at its --mem,
not until the node's RAM is full. Alerting over a real ClusterState and alert table."""
from __future__ import annotations

import re
import sqlite3
from importlib import resources

from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.live import Alerting
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.state.cluster import ClusterState, JobState, NodeState, ProcessSeries, process_history

from clusterwatch.model import ProcessKey, ProcessSample

MIB, GIB = 1 << 20, 1 << 30
T0 = 1_800_000_000.0


def _leak(memory_bytes: int) -> str:
    rules = load_rules(resources.files("clusterwatch.collector.rules") / "demo_rules.toml")
    state = ClusterState()
    state.nodes["n1"] = NodeState("n1", memory_total_bytes=512 * GIB)
    state.jobs["7"] = JobState("7", nodes=["n1"], memory_bytes=memory_bytes)
    key = ProcessKey("n1", 11, T0 - 10)
    series = ProcessSeries(key, ProcessSample(T0, "n1", 11, T0 - 10, job_id="7", rank=0, rss_bytes=GIB),
                           process_history(720))
    state.processes[key] = series
    # a second rank of the job on the node, flat at 2 GiB: it takes its part of the allocation
    key2 = ProcessKey("n1", 12, T0 - 10)
    other = ProcessSeries(key2, ProcessSample(T0, "n1", 12, T0 - 10, job_id="7", rank=1, rss_bytes=2 * GIB),
                          process_history(720))
    state.processes[key2] = other
    store = AlertStore(sqlite3.connect(":memory:"))
    alerting = Alerting(rules, state, store, min_interval_s=1.0)
    for i in range(240):
        t = T0 + i
        series.latest.time = other.latest.time = t
        series.latest.rss_bytes = GIB + i * 5 * MIB  # 5 MiB/s
        alerting.on_samples("n1", [series, other], t)
    (alert,) = [a for a in store.active() if a.rule == "host_memory_leak"]
    return alert.description


def test_a_host_leak_counts_down_to_the_jobs_allocation_not_the_nodes_ram():
    text = _leak(memory_bytes=8 * GIB)
    assert "the job's memory allocation full in ~" in text and "node memory" not in text, text
    # 8 GiB less the other rank's 2 GiB less ~2.2 GiB of its own, at 5 MiB/s (~17.6 GiB/h): about 13 min
    m = re.search(r"full in ~(\d+) min", text)
    assert m and 8 <= int(m.group(1)) <= 18, text


def test_without_an_allocation_it_is_the_nodes_ram():
    text = _leak(memory_bytes=0)
    assert "node memory full in ~" in text, text
