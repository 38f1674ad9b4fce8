"""Every Slurm command the collector runs for a node names one node (issue 24): `scontrol listpids JOB NODE`,
here and over SSH on the node, refuses a keyword, a node set, a list or an option before anything runs or
connects (the drain's own checks: test_drain_step.py, and on the real Slurm tests/slurm/test_drain_node_names.py)."""
from __future__ import annotations

import asyncio

import pytest
from clusterwatch.collector.jobmap.base import SlurmUnavailable
from clusterwatch.collector.jobmap.scontrol import ScontrolMapper
from clusterwatch.collector.jobmap.ssh import SshListpids

HOSTILE = ["ALL", "all", "n[1-2]", "n1,n2", "-n1", "-oProxyCommand=touch x", "n1 n2", ""]


@pytest.mark.parametrize("node", HOSTILE)
def test_listpids_here_names_one_node(node: str, tmp_path) -> None:
    ran = tmp_path / "ran"
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {ran}\n")
    fake.chmod(0o755)
    with pytest.raises(SlurmUnavailable, match="not asking scontrol listpids"):
        asyncio.run(ScontrolMapper(scontrol=str(fake), retries=0).listpids(42, node))
    assert not ran.exists()
    assert asyncio.run(ScontrolMapper(scontrol=str(fake), retries=0).listpids(42, "n1")) == []
    assert ran.read_text() == "listpids 42 n1\n"


@pytest.mark.parametrize("node", HOSTILE)
def test_listpids_over_ssh_names_one_node_before_connecting(node: str, tmp_path) -> None:
    asked = []
    known = tmp_path / "known_hosts"
    known.write_text("")
    ssh = SshListpids(known, [], address=lambda n: asked.append(n) or ("127.0.0.1", 9), connect_timeout_s=0.5)
    with pytest.raises(SlurmUnavailable, match="for listpids"):
        asyncio.run(ssh.listpids(42, node))
    assert asked == []
