"""The GPU source protocol: what the agent needs from NVML or from the simulator.

Implementations: `nvml.NvmlGpuSource` (real GPUs, through the `pynvml` module from
nvidia-ml-py, passed to its constructor) and `sim.SimGpuSource` (a scenario of GPUs
and per-process curves, for machines without a GPU). Every reading that a GPU does
not support is None; a source never raises from `poll` for a single failed read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from clusterwatch.model import GpuActivity, GpuInfo, GpuReading, GpuUse


@dataclass(slots=True)
class GpuPoll:
    """What one poll of all GPUs returns."""

    readings: list[GpuReading] = field(default_factory=list)
    # pid → the GPUs that process uses (host pids, as NVML reports them)
    processes: dict[int, list[GpuUse]] = field(default_factory=dict)
    # reads that failed in this poll (counted, not logged every time)
    errors: int = 0
    # GPUs (UUIDs) that did not answer this poll (lost, past their deadline): a gap in the
    # data, not a GPU with nothing on it; they have no reading and no processes here
    stale: list[str] = field(default_factory=list)
    # UUID → what the GPU's units did over the last GPM window (nvml_gpm.py), for the devices read since
    # the last poll: a slower cadence than the poll, so most polls carry none
    activity: dict[str, GpuActivity] = field(default_factory=dict)


class GpuSource(Protocol):
    """A source of GPU inventory and per-GPU / per-process readings."""

    name: str  # "nvml", "sim" or "none"

    def inventory(self) -> list[GpuInfo]:
        """The node's GPUs, keyed by UUID (index for display only)."""
        ...

    def poll(self, now: float) -> GpuPoll:
        """Read every GPU and the processes on it. `now` is Unix seconds."""
        ...

    def close(self) -> None:
        """Release the library (nvmlShutdown) or the scenario."""
        ...


class NoGpuSource:
    """The source used when there is no GPU or no NVML library: no GPU data, no errors."""

    name = "none"

    def inventory(self) -> list[GpuInfo]:
        return []

    def poll(self, now: float) -> GpuPoll:
        return GpuPoll()

    def close(self) -> None:
        pass
