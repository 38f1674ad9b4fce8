"""The drain step's pieces: a reason Slurm can show, a node name that can be nothing but a node."""
from __future__ import annotations

import asyncio

import pytest
from clusterwatch.collector.actions import drain_reason
from clusterwatch.collector.jobmap.scontrol import ScontrolMapper


def test_the_reason_is_one_bounded_line() -> None:
    assert drain_reason({"rule": "gpu_lost", "description": "GPU 3 fell off\nthe bus\x1b[2J"}) == \
        "clusterwatch: GPU 3 fell off the bus [2J"
    long = drain_reason({"rule": "gpu_xid", "description": "x" * 1000})
    assert len(long) == 200 and long.endswith("…")
    assert drain_reason({"rule": "gpu_lost", "description": ""}) == "clusterwatch: gpu_lost"


@pytest.mark.parametrize("node", ["n[1-4]", "n1 State=RESUME", "n1,n2", "", "-n1", "n1\nn2"])
def test_a_node_name_that_is_not_one_node_is_refused_before_scontrol_runs(node: str, tmp_path) -> None:
    ran = tmp_path / "ran"
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\n")
    fake.chmod(0o755)
    with pytest.raises(ValueError, match="not a plain Slurm node name"):
        asyncio.run(ScontrolMapper(scontrol=str(fake), retries=0).drain_node(node, "clusterwatch: x"))
    assert not ran.exists()


def test_the_log_action_writes_one_line_whatever_the_description(caplog) -> None:
    import logging
    import sqlite3

    from clusterwatch.collector.actions import Dispatcher
    from clusterwatch.collector.alerts import AlertStore
    from clusterwatch.collector.rules.config import ActionsConfig, ActionStep
    from clusterwatch.collector.rules.model import FIRING, AlertEvent

    dispatcher = Dispatcher(AlertStore(sqlite3.connect(":memory:")), ActionsConfig(steps=(ActionStep("log"),)))
    caplog.set_level(logging.WARNING, "clusterwatch.alerts")
    dispatcher.process([AlertEvent(t=1.0, rule="gpu_xid", state=FIRING, severity="warning", node="n1",
                                   job_id="1", pid=7, start_time=1.0, description="XID 13: proc\nalert firing root")],
                       1.0)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("\n" not in line for line in lines), lines
