"""Choose the agent's GPU source from `--gpu-source` (auto, nvml, sim, none).

With `auto`, a node without a usable NVIDIA GPU still runs an agent: it logs one line that says
why there is no GPU data and what to do, and carries on with `NoGpuSource`. An explicit `nvml`
that cannot be honoured is a ConfigError (one line, exit 2): whoever asked for NVML by name wants
to know at once, not from a dashboard without GPUs.
"""
from __future__ import annotations

import logging

from clusterwatch.agent.backends.gpu import GpuSource, NoGpuSource

from clusterwatch.errors import ConfigError, SourceUnavailable

__all__ = ["open_gpu_source", "KINDS"]

KINDS = ("auto", "nvml", "sim", "none")


def open_gpu_source(
    kind: str, scenario: str | None, log: logging.Logger, *, node: str | None = None,
    interval_s: float = 5.0, sim_run: str | None = None, activity_interval_s: float = 10.0,
) -> GpuSource:
    """Build the GPU source the agent asked for.

    Args:
        kind: "auto" (NVML where it works, else no GPU data), "nvml", "sim" or "none".
        scenario: the scenario file for "sim" (None: the embedded default); ignored
            by the other kinds.
        log: where the one line goes when NVML cannot be used.
        node: the node name simulated GPU UUIDs derive from (default: the host name).
        interval_s: the agent's poll interval (an NVML GPU's deadline is at most half of it).
        sim_run: for "sim", the run token whose processes it plays (None: those without one).
        activity_interval_s: for NVML, the GPM cadence (0: not read).

    Returns:
        The source; `NoGpuSource` when `auto` finds no usable NVML.

    Raises:
        ConfigError: an unknown kind, a scenario file that cannot be read or parsed, or `nvml`
            when NVML cannot be used (no bindings, library, driver or GPU).
    """
    if kind == "none":
        return NoGpuSource()
    if kind == "sim":
        from clusterwatch.agent.backends.sim import open_sim_source

        return open_sim_source(scenario, node=node, run=sim_run)
    if kind in ("auto", "nvml"):
        from clusterwatch.agent.backends.nvml import WITHOUT_GPU_DATA, open_nvml_source

        try:
            return open_nvml_source(log=log, interval_s=interval_s, activity_interval_s=activity_interval_s)
        except SourceUnavailable as exc:
            if kind == "nvml":
                what, _, todo = str(exc).partition(WITHOUT_GPU_DATA)
                raise ConfigError(f"--gpu-source nvml cannot be used: {what}. {todo} "
                                  "(--gpu-source auto runs without GPU data instead)".replace("  ", " ")) from None
            # Once, at start: the agent runs on without GPU data rather than crash.
            log.warning("%s", exc)
            return NoGpuSource()
    raise ConfigError(f"unknown GPU source {kind!r}: use one of {', '.join(KINDS)}")
