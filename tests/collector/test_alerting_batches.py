"""A node whose agent sends its batches further apart than the rules look at a process is told of, once: live,
the rules see one sample of each process a batch, where replay sees every one (collector/alerting/live.py)."""
from __future__ import annotations

import logging

from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.live import Alerting
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.state.core import new_cluster_state
from clusterwatch.collector.state.store import open_db

T0 = 1_800_000_000.0


def _alerting(tmp_path, look_s: float) -> Alerting:
    config = CollectorConfig(db_path=str(tmp_path / "cw.db"))
    state = new_cluster_state(config)
    for node, every_s in (("slow-sender", 5.0), ("fast-sender", 0.5)):
        state.hello(node, f"boot-{node}", "1.0", 0.5, "sim", 1 << 34, [], T0).send_interval_s = every_s
    return Alerting(load_rules(None), state, AlertStore(open_db(config.db_path)), min_interval_s=look_s)


def test_batches_further_apart_than_the_rules_look_are_said_once_per_node(tmp_path, caplog):
    alerting = _alerting(tmp_path, look_s=0.7)  # a rules file whose shortest leak bucket is 2 s
    with caplog.at_level(logging.WARNING, logger="clusterwatch.collector"):
        for i in range(3):
            alerting.on_samples("slow-sender", [], T0 + 5 * i)
            alerting.on_samples("fast-sender", [], T0 + 5 * i)
    said = [r.getMessage() for r in caplog.records if "sends a batch every" in r.getMessage()]
    assert said == ["node slow-sender: its agent sends a batch every 5 s, but the rules want a look at each "
                    "process every 0.7 s (the shortest leak bucket over 3, or --rules-interval): live they see "
                    "one sample a batch; give its agent --send-interval 0.7 or less, or lengthen the rules file's "
                    "buckets"], said


def test_the_default_rules_at_the_default_send_interval_say_nothing(tmp_path, caplog):
    alerting = _alerting(tmp_path, look_s=5.0)
    with caplog.at_level(logging.WARNING, logger="clusterwatch.collector"):
        alerting.on_samples("slow-sender", [], T0)
    assert not [r for r in caplog.records if "sends a batch every" in r.getMessage()]
