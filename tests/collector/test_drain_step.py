"""The drain step's pieces: a reason Slurm can show, a node name that can be nothing but a node."""
from __future__ import annotations

import asyncio

import pytest
from clusterwatch.collector.alerting.actions import drain_reason
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

    from clusterwatch.collector.alerting.actions import Dispatcher
    from clusterwatch.collector.alerting.alerts import AlertStore
    from clusterwatch.collector.rules.config import ActionsConfig, ActionStep
    from clusterwatch.collector.rules.model import FIRING, AlertEvent

    dispatcher = Dispatcher(AlertStore(sqlite3.connect(":memory:")), ActionsConfig(steps=(ActionStep("log"),)))
    caplog.set_level(logging.WARNING, "clusterwatch.alerts")
    dispatcher.process([AlertEvent(t=1.0, rule="gpu_xid", state=FIRING, severity="warning", node="n1",
                                   job_id="1", pid=7, start_time=1.0, description="XID 13: proc\nalert firing root")],
                       1.0)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("\n" not in line for line in lines), lines


@pytest.mark.parametrize("node", ["ALL", "all", "All"])
def test_the_keyword_for_every_node_is_refused_before_scontrol_runs(node: str, tmp_path) -> None:
    # `scontrol update NodeName=ALL State=DRAIN` drains every node of the cluster (seen on Slurm 22.05)
    ran = tmp_path / "ran"
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\n")
    fake.chmod(0o755)
    with pytest.raises(ValueError, match="keyword for every node"):
        asyncio.run(ScontrolMapper(scontrol=str(fake), retries=0).drain_node(node, "clusterwatch: x"))
    assert not ran.exists()


def test_a_name_slurm_shows_as_several_nodes_or_none_is_not_drained(tmp_path) -> None:
    """A nodeset (slurm.conf's NodeSet=) is a plain name that stands for many nodes; a name Slurm does not
    know is no node: either way `scontrol -o show node NAME` does not show that one node, and no update runs."""
    calls = tmp_path / "calls"
    fake = tmp_path / "scontrol"
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
case "$*" in
  "-o show node gpus") printf 'NodeName=n1 Arch=x86_64 State=IDLE\\nNodeName=n2 Arch=x86_64 State=IDLE\\n' ;;
  "-o show node n1") printf 'NodeName=n1 Arch=x86_64 State=IDLE Reason=x\\n' ;;
  "-o show node nope") echo "Node nope not found"; exit 1 ;;
esac
""")
    fake.chmod(0o755)
    mapper = ScontrolMapper(scontrol=str(fake), retries=0)
    for node, why in (("gpus", "shows 2 nodes"), ("nope", "Slurm knows no node")):
        with pytest.raises(ValueError, match=why):
            asyncio.run(mapper.drain_node(node, "clusterwatch: x"))
    assert "update" not in calls.read_text()
    asyncio.run(mapper.drain_node("n1", "clusterwatch: x"))
    assert calls.read_text().splitlines()[-1] == "update NodeName=n1 State=DRAIN Reason=clusterwatch: x"


@pytest.mark.parametrize("node, trusted", [("ALL", True), ("n[1-2]", True), ("n1", False)])
def test_a_refused_drain_is_counted(node: str, trusted: bool, caplog) -> None:
    """A drain the Dispatcher refuses (not one node name; an agent that proved nothing) is logged once and
    counted (clusterwatch_actions_drains_refused_total): drain_node never runs."""
    import logging
    import sqlite3

    from clusterwatch.collector.alerting.actions import Dispatcher
    from clusterwatch.collector.alerting.alerts import AlertStore
    from clusterwatch.collector.rules.config import ActionsConfig, ActionStep
    from clusterwatch.collector.rules.model import FIRING, AlertEvent

    drained = []
    dispatcher = Dispatcher(AlertStore(sqlite3.connect(":memory:")), ActionsConfig(steps=(ActionStep("drain"),)),
                            drain_node=lambda n, reason: drained.append(n), node_trusted=lambda n: trusted)
    caplog.set_level(logging.WARNING, "clusterwatch.alerts")
    dispatcher.process([AlertEvent(t=1.0, rule="gpu_lost", state=FIRING, severity="critical", node=node,
                                   job_id="1", pid=-1, start_time=0.0, description="GPU lost")], 1.0)
    dispatcher.drain(5.0)
    assert drained == [] and dispatcher.drains_refused == 1
    assert sum("drain step for gpu_lost refused" in r.getMessage() for r in caplog.records) == 1
