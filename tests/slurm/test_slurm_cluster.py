"""Against the real two-node Slurm cluster: a GPU job across both nodes, parsed by our parsers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from bench.waiting import poll_until
from clusterwatch.slurm import hostlist
from clusterwatch.slurm.listpids import parse_listpids
from clusterwatch.slurm.scontrol import parse_show_job
from tests.services.slurm import (  # noqa: F401  (fixtures)
    WORKLOAD,
    SlurmCluster,
    slurm_cluster,
    slurm_hooks,
    two_node_gpu_job,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def two_node_job(slurm_cluster: SlurmCluster) -> Iterator[int]:  # noqa: F811
    """A running two-node, one-GPU-per-node python job; cancelled afterwards."""
    with two_node_gpu_job(slurm_cluster) as job_id:
        yield job_id


@pytest.mark.parametrize(
    "expr",
    [
        "n[1-2]",
        "gpu[001-004,010]",
        "rack[0-1]_blade[0-2]",
        "a,b[1-3],c",
        "node[09-11]",
        "x[7]",
        "lx[15,18,32-33]",
    ],
)
def test_expander_agrees_with_scontrol_show_hostnames(slurm_cluster: SlurmCluster, expr: str) -> None:  # noqa: F811
    out = slurm_cluster.run(["scontrol", "show", "hostnames", expr]).stdout.split()
    assert hostlist.expand(expr) == out


def test_show_job_parses_both_nodes_and_gpus(slurm_cluster: SlurmCluster, two_node_job: int) -> None:  # noqa: F811
    out = slurm_cluster.run(["scontrol", "show", "job", "-d", str(two_node_job)]).stdout
    [job] = parse_show_job(out)
    assert job.job_id == two_node_job
    assert job.name == "cw-two-node"
    assert job.state == "RUNNING"
    assert job.user == "root" and job.uid == 0
    assert job.nodes == ("n1", "n2")
    assert job.num_tasks == 2
    # One GPU per node; Slurm numbers GPUs per node from 0.
    assert {node: len(idx) for node, idx in job.gpus_by_node.items()} == {"n1": 1, "n2": 1}
    assert all(i in (0, 1) for idx in job.gpus_by_node.values() for i in idx)
    assert job.start_time is not None and abs(job.start_time - time.time()) < 600


def test_listpids_on_the_second_node(slurm_cluster: SlurmCluster, two_node_job: int) -> None:  # noqa: F811
    out = slurm_cluster.run(["scontrol", "listpids", str(two_node_job), "n2"]).stdout
    entries = parse_listpids(out)
    tasks = [e for e in entries if e.local_id is not None]
    assert [(e.job_id, e.step_id, e.local_id, e.global_id) for e in tasks] == [(two_node_job, "0", 0, 1)]

    # The PID is the python process running our workload (it may still be exec'ing for a moment).
    def cmdline() -> list[bytes]:
        with open(f"/proc/{tasks[0].pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")

    assert poll_until(lambda: WORKLOAD.encode() in cmdline(), 5.0), cmdline()
