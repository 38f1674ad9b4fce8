"""The node's health file for the prolog's gate (clusterwatch/slurm/health_gate.py): what the agent's health
records say is wrong with its GPUs now, kept in ``<spool>/health.json``.

It is built from the records the health monitor hands each batch, so it costs the poll no NVML call:
the last counters of each GPU (row remaps, uncorrectable ECC since the last reset), a lost GPU until it
answers again, XIDs and the driver's recovery actions until the agent restarts (a GPU reset or a reboot
restarts it, as the node's maintenance does), an NVLink down until it reads active again. The file is
replaced whole by a rename, so the prolog never reads half of it, and rewritten at least every REFRESH_S so
that a stuck agent's file goes stale.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from clusterwatch.v1 import agent_pb2

from clusterwatch.slurm.health_gate import FILE_NAME, Finding, HealthFile

log = logging.getLogger("clusterwatch.agent")

#: The file is rewritten at least this often, even unchanged.
REFRESH_S = 10.0
#: How long a written file holds: past it, the gate takes the agent for stuck and lets jobs run.
VALID_FOR_S = 60.0
#: NVML's "lost" events; the counter reader's own GPU_IS_LOST comes as gpu_lost.
_LOST_EVENTS = ("gpu_lost", "gpu_unavailable")


def counter_findings(row: agent_pb2.GpuHealth) -> list[Finding]:
    """What one GPU's health counters say is wrong now (a field NVML did not give is not a finding)."""
    out = []
    if row.HasField("remapped_rows_pending") and row.remapped_rows_pending:
        out.append(Finding("row_remap_pending", row.uuid, since=row.time))
    if row.HasField("remapped_rows_failure") and row.remapped_rows_failure:
        out.append(Finding("row_remap_failure", row.uuid, since=row.time))
    if row.HasField("ecc_uncorrected_volatile") and row.ecc_uncorrected_volatile > 0:
        out.append(Finding("ecc_uncorrected", row.uuid, code=row.ecc_uncorrected_volatile, since=row.time))
    if row.HasField("retired_pages_pending") and row.retired_pages_pending:
        out.append(Finding("retired_pages_pending", row.uuid, since=row.time))
    return out


class HealthFileWriter:
    """Keeps the node's findings from the batches' health records and writes them for the gate.

    Args:
        spool_dir: the agent's spool folder (root's, 0700).
        clock: wall clock.
    """

    def __init__(self, spool_dir: str, clock: Callable[[], float] = time.time) -> None:
        self.path = os.path.join(spool_dir, FILE_NAME)
        self._clock = clock
        self._lost: dict[str, float] = {}                   # UUID → when it was lost
        self._counters: dict[str, list[Finding]] = {}       # UUID → from its last counters
        self._events: dict[tuple[str, str, int], Finding] = {}   # (kind, UUID, code) → first seen
        self._counters_read_at: float | None = None
        self._written: tuple[Finding, ...] | None = None
        self._written_at = 0.0
        self.errors = 0

    def findings(self) -> tuple[Finding, ...]:
        lost = [Finding("gpu_lost", uuid, since=t) for uuid, t in self._lost.items()]
        held = [f for fs in self._counters.values() for f in fs] + list(self._events.values())
        return tuple(sorted(lost + held, key=lambda f: (f.gpu, f.kind, f.code or 0)))

    def see(self, batch: agent_pb2.Batch) -> None:
        """Take the batch's health records in, and write the file when it changed or is due; never raises."""
        for e in batch.health_events:
            if e.kind in _LOST_EVENTS and e.uuid:
                self._lost.setdefault(e.uuid, e.time)
            elif e.kind == "xid" and e.xid:
                # the kernel log and NVML both report an XID: one finding per GPU and number
                self._events.setdefault(("xid", e.uuid, e.xid), Finding("xid", e.uuid, code=e.xid, since=e.time))
            elif e.kind == "recovery_action" and e.uuid:
                # nvmlGpuRecoveryAction_t: 0 none (the GPU recovered), else reset, reboot, drain
                self._events = {k: f for k, f in self._events.items() if k[:2] != ("recovery_action", e.uuid)}
                if e.data:
                    self._events[("recovery_action", e.uuid, e.data)] = Finding("recovery_action", e.uuid,
                                                                               code=e.data, since=e.time)
            elif e.kind == "nvlink_down" and e.uuid:
                # the counters reader's: an NVLink that was active reads inactive (data: the link), until it is up
                self._events.setdefault(("nvlink_down", e.uuid, e.data),
                                        Finding("nvlink_down", e.uuid, code=e.data, since=e.time))
            elif e.kind == "nvlink_up" and e.uuid:
                self._events.pop(("nvlink_down", e.uuid, e.data), None)
        for row in batch.gpu_health:
            self._lost.pop(row.uuid, None)   # it answered again
            self._counters[row.uuid] = counter_findings(row)
            self._counters_read_at = max(self._counters_read_at or 0.0, row.time)
        now = self._clock()
        findings = self.findings()
        if findings != self._written or now - self._written_at >= REFRESH_S:
            self._write(findings, now)

    def _write(self, findings: tuple[Finding, ...], now: float) -> None:
        from .ensure import open_private

        doc = HealthFile(written_at=now, valid_for_s=VALID_FOR_S, agent_pid=os.getpid(), findings=findings,
                         counters_read_at=self._counters_read_at)
        tmp = f"{self.path}.tmp"
        try:
            with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
                f.write(doc.to_json())
            os.replace(tmp, self.path)
        except OSError as exc:
            self.errors += 1
            if self.errors == 1:   # once: the gate then lets jobs run, as it does without the file
                log.warning("cannot write the health file %s (%s); the prolog's gate will let jobs run",
                            self.path, exc.strerror or exc)
            return
        self._written, self._written_at = findings, now

    def remove(self) -> None:
        """Remove the file (the agent stops: no one keeps it current)."""
        try:
            os.unlink(self.path)
        except OSError:
            pass
