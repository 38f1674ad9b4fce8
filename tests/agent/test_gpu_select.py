"""Choosing the GPU source: a node without NVIDIA GPUs runs on, with one line that says why."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from clusterwatch.agent.backends.select import open_gpu_source
from clusterwatch.agent.backends.sim import SimGpuSource

from clusterwatch.errors import ConfigError
from tests.fakes import nvml_stub
from tests.fakes.no_nvml import run_without_nvml

LOG = logging.getLogger("test.select")


# In a child whose NVML library cannot be loaded (tests/fakes/no_nvml.py), whether or not this host has one.
OPEN = """
import logging, sys
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s|%(levelname)s|%(message)s")
from clusterwatch.agent.backends.select import open_gpu_source
src = open_gpu_source(sys.argv[1], None, logging.getLogger("test.select"))
print(type(src).__name__, src.poll(0.0).readings)
"""


def _warning_of(out) -> str:
    assert out.returncode == 0, out.stderr
    assert out.stdout == "NoGpuSource []\n"
    [line] = [ln for ln in out.stderr.splitlines() if ln.startswith("test.select|")]
    level, message = line.split("|")[1:]
    assert level == "WARNING"
    return message


def test_no_nvml_library_gives_no_gpu_data_and_one_line(tmp_path: Path) -> None:
    # `auto` only: an explicit `nvml` that cannot be honoured is an error (tests/agent/test_gpu_source_nvml.py)
    out = run_without_nvml(OPEN.replace("sys.argv[1]", "'auto'"), tmp_path)
    assert _warning_of(out).startswith("NVML library not found (libnvidia-ml.so.1)")


def test_the_unloadable_library_is_found_before_a_loadable_one(tmp_path: Path) -> None:
    # As on a host with the driver: a libnvidia-ml.so.1 that loads (the C stand-in) further on the search
    # path; found, it would say "NVML found no usable GPU" instead.
    stand_in = nvml_stub.build(tmp_path / "stand-in")
    out = run_without_nvml(OPEN.replace("sys.argv[1]", "'auto'"), tmp_path, also_on_path=stand_in)
    assert _warning_of(out).startswith("NVML library not found (libnvidia-ml.so.1)")


def test_sim_and_none() -> None:
    sim = open_gpu_source("sim", None, LOG, node="n1")
    assert isinstance(sim, SimGpuSource) and sim.name == "sim" and len(sim.inventory()) == 8
    assert len(sim.poll(0.0).readings) == 8
    none = open_gpu_source("none", None, LOG)
    assert none.name == "none" and none.inventory() == []


def test_unknown_kind_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="^unknown GPU source 'dcgm': use one of auto, nvml, sim, none$"):
        open_gpu_source("dcgm", None, LOG)


def test_slurm_gpu_numbers_name_mig_instances_one_by_one() -> None:
    from clusterwatch.agent.spool import resolve_gpus

    from clusterwatch.model import GpuInfo

    # GPU 0 in MIG mode with two instances (both carry NVML index 0), GPU 1 whole.
    inventory = [GpuInfo("MIG-aaaa", 0, "3g.40gb", 1), GpuInfo("MIG-bbbb", 0, "3g.40gb", 1),
                 GpuInfo("GPU-cccc", 1, "H100", 1)]
    # SLURM_JOB_GPUS: Slurm's device numbers count the instances in NVML order.
    assert resolve_gpus("0", inventory) == ("MIG-aaaa",)
    assert resolve_gpus("1", inventory) == ("MIG-bbbb",)
    assert resolve_gpus("2", inventory) == ("GPU-cccc",)
    # CUDA_VISIBLE_DEVICES under MIG: the instances' UUIDs.
    assert resolve_gpus("MIG-bbbb,MIG-aaaa", inventory) == ("MIG-bbbb", "MIG-aaaa")


def test_the_prolog_names_mig_instances_by_their_uuids() -> None:
    from clusterwatch.cli.hooks_cmd import _event

    mig = {"SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "MIG-bbbb"}
    assert _event("start", mig).gpu_indexes == "MIG-bbbb"
    plain = {"SLURM_JOB_ID": "78", "SLURM_JOB_GPUS": "0,2", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert _event("start", plain).gpu_indexes == "0,2"  # the prolog's indexes can differ from the job's
    assert _event("start", {"SLURM_JOB_ID": "79", "CUDA_VISIBLE_DEVICES": "1"}).gpu_indexes == "1"
