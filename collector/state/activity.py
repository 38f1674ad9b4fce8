"""A GPU's true activity (NVML GPM) as the collector holds it: its latest reading, while that still stands.

The agent reads GPM at a cadence of its own (every 10 s by default) and sends each reading once, on the
GPU's next sample, so the latest is kept beside the GPU's readings (GpuSeries.activity). It stands while
the GPU's samples keep coming with fresh ones: once three windows pass without one (GPM switched off, the
GPU lost its GPM), the GPU shows no activity rather than an old one. A GPU without GPM never has one.
"""
from __future__ import annotations

from typing import Any

from clusterwatch.model import GpuActivity

__all__ = ["current_activity", "STALE_AFTER_WINDOWS"]

STALE_AFTER_WINDOWS = 3


def current_activity(gpu: Any) -> GpuActivity | None:
    """The GPU's (a GpuSeries') latest activity, None when it has none or it is older than three windows."""
    a = gpu.activity
    if a is None or gpu.last_time - gpu.activity_time > STALE_AFTER_WINDOWS * max(a.window_s, 1.0):
        return None
    return a
