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
