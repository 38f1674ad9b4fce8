"""Collectors as shards of one Slurm cluster (real slurmctld and slurmd): each registry takes only its own
jobs, so a job is listed (and exported) by one collector, and `jobs` over the list shows it once."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clusterwatch.shards import pick
from tests.services.procs import free_port
from tests.services.slurm import SlurmCluster, slurm_cluster, slurm_hooks, two_node_gpu_job  # noqa: F401
from tests.slurm.test_slurm_e2e import _environ
from tests.support.helpers import Collector, cli, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]


def _job_ids(address: str) -> set[str]:
    out = cli("jobs", "--collector", address, "--json", timeout=30)
    assert out.returncode == 0, out.stderr
    return {j["job_id"] for j in json.loads(out.stdout)["jobs"]}


def test_each_shard_takes_only_its_own_slurm_jobs(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    everyone = ",".join(addresses)
    with _environ(SLURM_CONF=str(slurm_cluster.conf)):
        shards = [Collector(tmp_path, "--slurm", "--slurm-refresh", "0.5", "--collectors", everyone, "--shard", a,
                            name=f"shard{i}", db=tmp_path / f"shard{i}.db", listen=a)
                  for i, a in enumerate(addresses)]
    try:
        with two_node_gpu_job(slurm_cluster, name="cw-shards") as job_id:
            job = str(job_id)
            owner = pick(job, tuple(addresses))
            other = next(a for a in addresses if a != owner)
            wait_for(lambda: job in _job_ids(owner), timeout=30, what=f"job {job} on its shard {owner}")
            time.sleep(2)  # two more passes of the other shard's registry (its turn every 2 x 0.5 s)
            assert job not in _job_ids(other)
            merged = cli("jobs", "--collector", everyone, "--json", timeout=30)
            assert [j["job_id"] for j in json.loads(merged.stdout)["jobs"]].count(job) == 1
            status = cli("status", job, "--collector", everyone, "--json", timeout=30)
            assert status.returncode == 0 and json.loads(status.stdout)["job"]["state"] == "RUNNING", status.stderr
    finally:
        for c in shards:
            c.stop()


def test_a_shard_not_in_the_list_is_one_line(tmp_path: Path) -> None:
    for args, said in ((["--shard", "127.0.0.1:1"], "--shard needs --collectors"),
                       (["--collectors", "127.0.0.1:1,127.0.0.1:2", "--shard", "127.0.0.1:3"],
                        "is not in --collectors"),
                       (["--collectors", "127.0.0.1:1,127.0.0.1:1", "--shard", "127.0.0.1:1"], "twice")):
        out = cli("collector", "--db", str(tmp_path / "x.db"), *args, timeout=30)
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
