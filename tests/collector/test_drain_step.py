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
