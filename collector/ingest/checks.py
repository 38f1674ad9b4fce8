"""Checks of an agent's batch before any of it is applied: values the collector's state cannot hold sanely.

A batch that fails a check is refused whole (never half-applied) and counted by reason.
The checks are bounds no real reading comes near; they catch a broken or hostile agent
(a NaN start time, a pid of 0, 2^63 bytes), not an unusual node. Each is a few C-level
passes over the batch's columns (sum, min, max), so the ingest path stays cheap.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from clusterwatch.v1 import agent_pb2

from clusterwatch.wire import ProcessColumns

# Why a batch was refused, and the help text of its counter (clusterwatch_ingest_refused_<reason>_total).
REFUSAL_REASONS = {
    "inconsistent": "Batches refused: their process table's columns disagree.",
    "not_finite": "Batches refused: a time or start time that is NaN or infinite.",
    "bad_pid": "Batches refused: a pid of 0 or beyond the kernel's limit.",
    "bad_value": "Batches refused: a negative or absurd memory, count, CPU or utilisation figure.",
    "clock_ahead": "Batches refused: a time more than 5 minutes ahead of the collector's clock.",
    "too_long": "Batches refused: a job id, user, step, GPU UUID or key longer than any real one (ingest_bounds).",
}

# How far ahead of the collector's clock a time may be. A time ahead freezes what it stamps (a later,
# true reading looks older and is ignored; 1e300 froze a process for good); nodes synchronised by NTP
# differ by milliseconds, so minutes ahead is a broken clock. Times behind are let in: a batch resent
# after an outage carries them (the agent's buffer can span days on a quiet node), and liveness is
# judged by the collector's own receive time, so an old time stalls nothing.
MAX_AHEAD_S = 300.0

# Linux's PID_MAX_LIMIT on 64-bit (4,194,304): no pid is larger.
MAX_PID = 1 << 22
# 4 PiB: more memory than any node or GPU holds; 2^63 and the like are refused.
MAX_BYTES = 1 << 52
# threads or open files of one process (the kernel's own limits are far below)
MAX_COUNT = 1 << 24
# CPU percent of one core: a process cannot use more than every core of a 64k-core node
MAX_CPU_PERCENT = 100.0 * 65536
# a GPU's or a process's utilisation, percent
MAX_UTILIZATION = 100.0
# board power of one GPU, watts
MAX_POWER_W = 100_000.0
MAX_LINK_BYTES_PER_S = 1e13  # 10 TB/s: over five times NVLink 5's 1.8 TB/s
MAX_WINDOW_S = 86_400.0
_ACTIVITY_PERCENT = ("sm_active", "sm_occupancy", "tensor_active", "dram_active")
_ACTIVITY_RATES = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")


class Refusal(NamedTuple):
    """Why a batch is refused: a reason (a key of REFUSAL_REASONS) and a one-line detail."""

    reason: str
    detail: str


def _finite(values) -> bool:
    """Every value finite (a sum is NaN or infinite when any term is; a sum that overflows is absurd too)."""
    return math.isfinite(sum(values))


def _activity_sane(a: agent_pb2.GpuActivity) -> bool:
    """A GPM reading's percentages within 0-100, throughputs within 0-10 TB/s, window within a day (NaN fails all;
    an unset figure reads 0)."""
    return (0 <= a.window_s <= MAX_WINDOW_S and all(0 <= getattr(a, n) <= MAX_UTILIZATION for n in _ACTIVITY_PERCENT)
            and all(0 <= getattr(a, n) <= MAX_LINK_BYTES_PER_S for n in _ACTIVITY_RATES))


def _span(values, seed: float) -> tuple[float, float]:
    """(min, max) of the values that are not NaN, with `seed` among them (NaN never wins a comparison)."""
    both = (seed, *values)
    return min(both), max(both)


def _int_ok(values, low: int, high: int) -> bool:
    return not values or (min(values) >= low and max(values) <= high)


def check_batch(batch: agent_pb2.Batch, cols: ProcessColumns, now: float) -> Refusal | None:
    """The first reason to refuse a batch, or None when every value of it can be held.

    Args:
        batch: the batch as received.
        cols: its process table, decoded (and checked for consistency) already.
        now: the collector's clock when the batch arrived.

    Returns:
        A Refusal naming what is wrong, or None.
    """
    latest = now + MAX_AHEAD_S
    if cols.rows:
        # Polls of one shape (the agent's batches) list the same processes, each poll's rows at its one time:
        # each poll's first time and the first poll's processes stand for every row (ProcessColumns.poll_width)
        width = cols.poll_width()
        times = cols.time[::width] if width else cols.time
        starts, pids = (cols.start_time[:width], cols.pid[:width]) if width else (cols.start_time, cols.pid)
        if not _finite(times) or not _finite(starts):
            return Refusal("not_finite", "a process sample's time or start time is NaN or infinite")
        if min(times) <= 0 or min(starts) < 0:
            return Refusal("bad_value", "a process sample's time or start time is negative")
        if max(times) > latest or max(starts) > latest:
            return Refusal("clock_ahead", f"a process sample is stamped {max(times) - now:.0f} s ahead of "
                                          "the collector's clock")
        if not _int_ok(pids, 1, MAX_PID):
            return Refusal("bad_pid", f"a process sample's pid is 0 or above {MAX_PID}")
        if not _int_ok(cols.rss_bytes, -1, MAX_BYTES) or not _int_ok(cols.gpu_memory_bytes, -1, MAX_BYTES):
            return Refusal("bad_value", "a process sample's memory is negative or above 4 PiB")
        if not _int_ok(cols.threads, -1, MAX_COUNT) or not _int_ok(cols.open_fds, -1, MAX_COUNT):
            return Refusal("bad_value", "a process sample's thread or file count is negative or absurd")
        lo, hi = _span(cols.cpu_percent, 0.0)
        if lo < 0 or hi > MAX_CPU_PERCENT:
            return Refusal("bad_value", "a process sample's CPU percent is negative or absurd")
        if cols.gpu_sm_utilization:
            lo, hi = _span(cols.gpu_sm_utilization, 0.0)
            if lo < 0 or hi > MAX_UTILIZATION:
                return Refusal("bad_value", "a process's GPU utilisation is outside 0-100 %")
    for g in batch.gpus:
        t = g.time  # each read of a message's field builds a Python object
        if not math.isfinite(t) or t <= 0:
            return Refusal("not_finite", f"GPU {g.uuid[:64]}: a reading's time is NaN, infinite or negative")
        if t > latest:
            return Refusal("clock_ahead", f"GPU {g.uuid[:64]}: a reading is stamped {t - now:.0f} s ahead "
                                          "of the collector's clock")
        if (g.memory_used_bytes > MAX_BYTES or g.memory_total_bytes > MAX_BYTES
                or not 0 <= g.utilization <= MAX_UTILIZATION or not 0 <= g.power_watts <= MAX_POWER_W):
            return Refusal("bad_value", f"GPU {g.uuid[:64]}: a memory, utilisation or power figure is absurd")
        if g.HasField("activity") and not _activity_sane(g.activity):
            return Refusal("bad_value", f"GPU {g.uuid[:64]}: an activity (GPM) figure is absurd")
    for t in batch.training:
        if not (math.isfinite(t.time) and math.isfinite(t.start_time)):
            return Refusal("not_finite", "a training report's time or start time is NaN or infinite")
        if not 1 <= t.pid <= MAX_PID:
            return Refusal("bad_pid", f"a training report's pid is 0 or above {MAX_PID}")
        if t.time > latest:
            return Refusal("clock_ahead", f"a training report is stamped {t.time - now:.0f} s ahead of the "
                                          "collector's clock")
    for p in batch.provenance:
        if not math.isfinite(p.start_time):
            return Refusal("not_finite", "a provenance record's start time is NaN or infinite")
        if not 1 <= p.pid <= MAX_PID:
            return Refusal("bad_pid", f"a provenance record's pid is 0 or above {MAX_PID}")
    for e in batch.job_events:
        if not math.isfinite(e.time) or e.time < 0:
            return Refusal("not_finite", f"job {e.job_id[:64]}: an event's time is NaN, infinite or negative")
        if e.time > latest:
            return Refusal("clock_ahead", f"job {e.job_id[:64]}: an event is stamped {e.time - now:.0f} s ahead "
                                          "of the collector's clock")
    return None
