"""Shards do not multiply the registry's Slurm calls (issue 19): three shards against a real slurmctld list its
jobs about as often in all as one collector does, each client call counted by a wrapper that runs the real
one."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.services.procs import free_port
from tests.services.slurm import SlurmCluster, slurm_cluster, slurm_hooks  # noqa: F401
from tests.slurm.test_slurm_e2e import _environ
from tests.support.helpers import Collector

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

REFRESH_S = 0.5
MEASURED_S = 6.0


def _wrappers(folder: Path, log: Path) -> Path:
    folder.mkdir()
    for name in ("scontrol", "squeue"):
        path = folder / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexec {shutil.which(name)} "$@"\n')
        path.chmod(0o755)
    return folder


def _listings(log: Path) -> int:
    """Calls that print every job: squeue --json, or scontrol show job -d without an id."""
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines
               if line.startswith("squeue --json") or line.rstrip().endswith("show job -d"))


def test_three_shards_list_slurm_jobs_as_often_as_one_collector(slurm_cluster: SlurmCluster,  # noqa: F811
                                                                tmp_path: Path) -> None:
    job = slurm_cluster.run(["sbatch", "--parsable", "-n1", "-o", "/dev/null", "--wrap", "sleep 120"])
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    logs = [tmp_path / f"calls{i}.log" for i in range(3)]
    shards = []
    try:
        for i, address in enumerate(addresses):
            folder = _wrappers(tmp_path / f"bin{i}", logs[i])
            with _environ(SLURM_CONF=str(slurm_cluster.conf), PATH=f"{folder}:{slurm_cluster.env['PATH']}"):
                shards.append(Collector(tmp_path, "--slurm", "--slurm-refresh", str(REFRESH_S),
                                        "--collectors", ",".join(addresses), "--shard", address,
                                        name=f"shard{i}", db=tmp_path / f"shard{i}.db", listen=address))
        before = [_listings(log) for log in logs]
        time.sleep(MEASURED_S)
        counts = [_listings(log) - b for log, b in zip(logs, before, strict=True)]
    finally:
        for c in shards:
            c.stop()
        slurm_cluster.run(["scancel", job.stdout.strip()], check=False)
    # One collector lists once a refresh: 12 times in 6 s. Each shard listed as often before (36 in all);
    # now they take turns: 12 in all, each its third, give or take a turn at each end of the window. A busy
    # machine only lists less, so the lower bound is loose: each shard still lists in its turns.
    one_collector = MEASURED_S / REFRESH_S
    assert sum(counts) <= one_collector + len(addresses), counts
    assert all(1 <= c <= one_collector / len(addresses) + 2 for c in counts), counts
