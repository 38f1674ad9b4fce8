"""The sizing benchmarks of issue 19 run in --quick mode, print their table, and leave no process behind:
bench/bench_history_memory.py (a collector's memory with its history full) and bench/bench_vm_resources.py
(a real VictoriaMetrics ingesting clusterwatch's series). No figure is asserted, only the tables' shape."""
from __future__ import annotations

from tests.project.test_bench_smoke import rows, run_quick


def test_history_memory_table():
    text = run_quick("bench_history_memory.py")
    assert "Collector memory with the history full: 5 nodes × 64 processes, 8 GPUs" in text
    (full,) = [x for x in rows(text) if x.startswith("110 ")]
    assert float(full.split()[2]) > 0  # MiB a node over the base: the 100 more points cost something
    assert any(x.startswith("10 ") and "(base)" in x for x in rows(text))


def test_victoriametrics_resources_table():
    text = run_quick("bench_vm_resources.py")
    assert "VictoriaMetrics: memory, CPU and disk for clusterwatch's series" in text
    assert [x.split()[0] for x in rows(text) if x[:1].isdigit()] == ["500", "1,000"]
    assert "B an active series" in text and "disk a series a day" in text
