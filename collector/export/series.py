"""Each family of a snapshot with its rows, and those as prometheus_client families.

`series()` is the one place that says which series exist. The text writer (text.py) writes the hot families
(ranks, processes, GPUs) with loops of its own, faster; tests/collector/test_exporter.py checks that both
give the same text.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from ..state.job_cost import ACTIVITY_LEVELS
from .families import (
    ACTIVITY_FAMILIES,
    ALERT_FAMILY,
    GPU_FAMILIES,
    GPU_LABELS,
    JOB_CODE,
    JOB_COST_FAMILIES,
    JOB_FAMILIES,
    JOB_INFO,
    NODE_FAMILIES,
    PROCESS_FAMILIES,
    PROCESS_LABELS,
    RANK_FAMILIES,
    RANK_LABELS,
    Family,
)
from .snapshot import GpuRow, JobRow, ProcessRow, RankRow, Snapshot

if TYPE_CHECKING:
    from .text import TextWriter

# A row of a family: (label names, label values, value)
Row = tuple[tuple[str, ...], tuple, float]
FamilyRows = list[tuple[Family, list[Row]]]


class ExtraFamilies(Protocol):
    """More families exported after the state's (collector/health/metrics.py HealthFamilies)."""

    def snapshot(self) -> Any:
        """Their own snapshot, taken with the state's, under the core's lock."""

    def series(self, snap: Any) -> FamilyRows:
        """Their rows, as series() gives the state's."""

    def write(self, snap: Any, out: TextWriter) -> None:
        """Their text, into the render's writer."""


def series(snap: Snapshot, extra: ExtraFamilies | None = None) -> FamilyRows:
    """Each family of a snapshot with its rows, in exposition order; `extra`'s (collector.py) last."""
    out = job_series(snap.jobs)
    out.extend(_value_columns(RANK_FAMILIES, RANK_LABELS, snap.ranks))
    if snap.processes is not None:
        out.extend(_value_columns(PROCESS_FAMILIES, PROCESS_LABELS, snap.processes))
    out.extend(_gpu_series(snap.gpus))
    out.extend(activity_series(snap.gpus))
    out.extend(other_series(snap))
    if snap.extra is not None and extra is not None:
        out.extend(extra.series(snap.extra))
    return out


def job_series(jobs: list[JobRow]) -> FamilyRows:
    """JOB_INFO (with the run tags' labels), JOB_CODE and JOB_FAMILIES."""
    info_rows, code_rows = [], []
    job_rows: list[list] = [[], [], []]
    for job in jobs:
        names = JOB_INFO.labels + tuple(k for k, _ in job.tags)
        info_rows.append((names, (job.job_id, job.user, job.name, job.partition, job.state,
                                  *(v for _, v in job.tags)), 1.0))
        if job.code is not None:
            code_rows.append((JOB_CODE.labels, (job.job_id, *job.code), 1.0))
        for rows, value in zip(job_rows, (job.processes, job.gpu_memory_bytes, job.rss_bytes), strict=True):
            rows.append((("job_id",), (job.job_id,), value))
    return [(JOB_INFO, info_rows), (JOB_CODE, code_rows), *zip(JOB_FAMILIES, job_rows, strict=True),
            *job_cost_series(jobs)]


def job_cost_series(jobs: list[JobRow]) -> FamilyRows:
    """JOB_COST_FAMILIES' rows: each job's energy, throttle time by reason, and seconds at each activity level
    by basis (a level never reached is 0 once the basis has any time, so increase() reads every level)."""
    energy, throttle, activity = [], [], []
    by_reason, by_level = ("job_id", "reason"), ("job_id", "basis", "level")
    for job in jobs:
        c = job.cost
        if c is None:
            continue
        if c.energy_joules is not None:
            energy.append((("job_id",), (job.job_id,), c.energy_joules))
        for reason, s in c.throttle_seconds:
            throttle.append((by_reason, (job.job_id, reason), s))
        for basis, seconds in (("sm_active", c.sm_active_seconds), ("utilization", c.utilization_seconds)):
            if any(seconds):
                for level, s in zip(ACTIVITY_LEVELS, seconds, strict=True):
                    activity.append((by_level, (job.job_id, basis, level), s))
    return list(zip(JOB_COST_FAMILIES, (energy, throttle, activity), strict=True))


def _value_columns(families: tuple[Family, ...], labels: tuple[str, ...],
                   rows_in: Iterable[RankRow | ProcessRow]) -> FamilyRows:
    """Rows that hold their labels then one value per family: a series per value that is not None."""
    rows_by_family: list[list] = [[] for _ in families]
    for key, *values in rows_in:
        for rows, value in zip(rows_by_family, values, strict=True):
            if value is not None:
                rows.append((labels, key, value))
    return list(zip(families, rows_by_family, strict=True))


def _gpu_series(gpus: list[GpuRow]) -> FamilyRows:
    gpu_rows: list[list] = [[] for _ in GPU_FAMILIES]
    for g in gpus:
        if g.utilization_ratio is not None:
            gpu_rows[0].append((GPU_LABELS, (g.node, g.uuid, g.index, g.job_id), g.utilization_ratio))
        if g.memory_used_bytes is not None:
            gpu_rows[1].append((GPU_LABELS, (g.node, g.uuid, g.index, g.job_id), g.memory_used_bytes))
        if g.memory_total_bytes:
            gpu_rows[2].append((GPU_FAMILIES[2].labels, (g.node, g.uuid, g.index), g.memory_total_bytes))
        if g.power_watts is not None:
            gpu_rows[3].append((GPU_FAMILIES[3].labels, (g.node, g.uuid, g.index), g.power_watts))
    return list(zip(GPU_FAMILIES, gpu_rows, strict=True))


def activity_series(gpus: list[GpuRow]) -> FamilyRows:
    """ACTIVITY_FAMILIES' rows: each GPU with a current GPM reading, its percentages as ratios, its throughputs
    by direction; a figure the GPU does not offer has no row."""
    rows: list[list] = [[] for _ in ACTIVITY_FAMILIES]
    by_direction = (*GPU_LABELS, "direction")
    for g in gpus:
        a = g.activity
        if a is None:
            continue
        key = (g.node, g.uuid, g.index, g.job_id)
        for out, value in zip(rows, (a.sm_active, a.sm_occupancy, a.tensor_active, a.dram_active), strict=False):
            if value is not None:
                out.append((GPU_LABELS, key, value / 100.0))
        for out, tx, rx in ((rows[4], a.pcie_tx_bytes_per_s, a.pcie_rx_bytes_per_s),
                            (rows[5], a.nvlink_tx_bytes_per_s, a.nvlink_rx_bytes_per_s)):
            if tx is not None:
                out.append((by_direction, (*key, "tx"), tx))
            if rx is not None:
                out.append((by_direction, (*key, "rx"), rx))
    return list(zip(ACTIVITY_FAMILIES, rows, strict=True))


def other_series(snap: Snapshot) -> FamilyRows:
    """The families after the GPUs': nodes, alerts (when exported), then the ingest counters."""
    out: FamilyRows = []
    node_rows: list[list] = [[] for _ in NODE_FAMILIES]
    for n in snap.nodes:
        files, refused, errors = n.job_output or (None, None, None)
        for i, value in enumerate((n.up, n.memory_total_bytes or None, n.last_seen, n.samples_dropped, n.read_errors,
                                   files, refused, errors)):
            if value is not None:
                node_rows[i].append((("node",), (n.node,), value))
    out.extend(zip(NODE_FAMILIES, node_rows, strict=True))
    if snap.alerts is not None:
        out.append((ALERT_FAMILY, [(ALERT_FAMILY.labels, a, 1) for a in snap.alerts]))
    for c in snap.counters or ():
        out.append((Family(c.name, "counter", c.help, ()), [((), (), c.value)]))
    return out


def client_families(groups: FamilyRows) -> Iterator:
    """Families with their rows as prometheus_client objects (for a CollectorRegistry)."""
    for fam, rows in groups:
        if fam.type == "info":
            f = InfoMetricFamily(fam.name, fam.help, labels=fam.labels)
            for names, values, _ in rows:
                labels = dict(zip(names, values, strict=True))
                f.add_metric([labels.pop(n) for n in fam.labels], labels)
        elif fam.type == "counter":
            f = CounterMetricFamily(fam.name, fam.help, labels=fam.labels)
            for _, values, value in rows:
                f.add_metric(list(values), value)
        else:
            f = GaugeMetricFamily(fam.name, fam.help, labels=fam.labels)
            for _, values, value in rows:
                f.add_metric(list(values), value)
        yield f
