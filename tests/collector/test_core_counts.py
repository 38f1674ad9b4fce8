"""The core's counts: the servicers count through CollectorCore.count, under the names /metrics exports."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.export.counter_metrics import COUNTERS, counter_families
from clusterwatch.collector.state.core import CollectorCore, IngestCounters
from clusterwatch.collector.state.store import Store, open_db

COLLECTOR = Path(__file__).resolve().parents[2] / "collector"


def _core() -> CollectorCore:
    return CollectorCore(CollectorConfig(), Store(open_db(":memory:")), clock=lambda: 1000.0)


def test_count_adds_to_the_named_counter_and_its_metric():
    core = _core()
    core.count("rejected")
    core.count("unauthenticated", 2)
    core.count("throttled")
    counts = core.counts()
    assert (counts["rejected"], counts["unauthenticated"], counts["throttled"]) == (1, 2, 1)
    families = counter_families(counts)
    assert families["clusterwatch_ingest_rejected"][0] == 1
    assert families["clusterwatch_ingest_unauthenticated"][0] == 2
    assert families["clusterwatch_ingest_throttled"][0] == 1


def test_count_refuses_a_name_it_does_not_hold():
    core = _core()
    with pytest.raises(AttributeError):
        core.count("rejectd")
    with pytest.raises(TypeError):  # the refusals by reason are counted by the core itself, by reason
        core.count("refused")


def test_every_name_counted_in_the_collector_is_a_counter_with_a_metric():
    """A name misspelt at a rare call site would raise there, in the middle of refusing a stream."""
    ints = {f.name for f in dataclasses.fields(IngestCounters) if f.type in (int, "int")}
    named = set()
    for path in COLLECTOR.rglob("*.py"):
        named |= set(re.findall(r"\bcount\(\"([a-z_]+)\"", path.read_text()))
    assert named, "no call of count(\"...\") found: the servicers count elsewhere now"
    assert named <= ints, named - ints
    assert named <= set(COUNTERS), named - set(COUNTERS)


def test_no_servicer_writes_the_core_counters_itself():
    for path in COLLECTOR.rglob("*.py"):
        if path.name == "core.py":
            continue
        assert not re.search(r"counters\.[a-z_]+ \+=", path.read_text()), path
