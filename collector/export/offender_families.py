"""The repeat offenders on /metrics (collector/health/offenders.py): per node, its findings kept by rule, its
drains and its flag; per GPU, only those with findings kept or flagged (a fleet of 8,000 healthy GPUs adds
no series; a bad one adds at most two a GPU, with no rule label)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .families import family

if TYPE_CHECKING:
    from ..health.offenders import OffenderFigures
    from .series import FamilyRows
    from .text import TextWriter

NODE_FINDINGS = family("clusterwatch_node_health_findings", "gauge",
                       "Health findings kept for the node (90 days: its GPUs', ports' and NVSwitches'), by rule.",
                       "node", "rule")
NODE_DRAINS = family("clusterwatch_node_drains", "gauge",
                     "Drains of the node (queued or done) the audit trail holds.", "node")
NODE_FLAG = family("clusterwatch_node_repeat_offender", "gauge",
                   "1 while a node_repeat_offender escalation raised on the node stands (kept 90 days).", "node")
GPU_FINDINGS = family("clusterwatch_gpu_health_findings", "gauge",
                      "Health findings kept for the GPU (90 days); GPUs without any have no series.", "node", "gpu")
GPU_FLAG = family("clusterwatch_gpu_repeat_offender", "gauge",
                  "1 while a gpu_repeat_offender escalation raised on the GPU stands (kept 90 days).", "node", "gpu")

OFFENDER_FAMILIES = (NODE_FINDINGS, NODE_DRAINS, NODE_FLAG, GPU_FINDINGS, GPU_FLAG)


class OffenderFamilies:
    """The families from `figures()`, the figures the history keeps up to date as it records (no SQLite on
    the scrape's thread)."""

    def __init__(self, figures: Callable[[], OffenderFigures]) -> None:
        self.figures = figures

    def snapshot(self) -> OffenderFigures:
        return self.figures()

    def series(self, snap: OffenderFigures) -> FamilyRows:
        return [
            (NODE_FINDINGS, [(NODE_FINDINGS.labels, k, float(n)) for k, n in sorted(snap.node_findings.items())]),
            (NODE_DRAINS, [(NODE_DRAINS.labels, (k,), float(n)) for k, n in sorted(snap.node_drains.items())]),
            (NODE_FLAG, [(NODE_FLAG.labels, (k,), 1.0) for k in sorted(snap.flagged_nodes)]),
            (GPU_FINDINGS, [(GPU_FINDINGS.labels, k, float(n)) for k, n in sorted(snap.gpu_findings.items())]),
            (GPU_FLAG, [(GPU_FLAG.labels, k, 1.0) for k in sorted(snap.flagged_gpus)]),
        ]

    def write(self, snap: OffenderFigures, out: TextWriter) -> None:
        for fam, rows in self.series(snap):
            out.generic(fam, rows, "offenders")
