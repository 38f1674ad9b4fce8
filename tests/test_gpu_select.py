"""Choosing the GPU source: a node without NVIDIA GPUs runs on, with one line that says why."""
from __future__ import annotations

import logging

import pytest
from clusterwatch.agent.backends.gpu import NoGpuSource
from clusterwatch.agent.backends.select import open_gpu_source
from clusterwatch.agent.backends.sim import SimGpuSource

from clusterwatch.errors import ConfigError

LOG = logging.getLogger("test.select")


@pytest.mark.parametrize("kind", ["auto", "nvml"])
def test_no_nvml_library_gives_no_gpu_data_and_one_line(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    # This machine has nvidia-ml-py but no NVIDIA driver.
    with caplog.at_level(logging.INFO, logger="test.select"):
        src = open_gpu_source(kind, None, LOG)
    assert isinstance(src, NoGpuSource)
    assert src.poll(0.0).readings == []
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("NVML library not found (libnvidia-ml.so.1)")
    assert "\n" not in record.getMessage()


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
