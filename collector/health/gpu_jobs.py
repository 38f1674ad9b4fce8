"""Which jobs held which GPU: every job, not only those a finding hurt, kept 90 days in the collector's store.

The finding history (offenders.py) names only the jobs a GPU's findings hurt, so it cannot say "this GPU
throttled in every job": a clean job between two throttled ones is not in it. This table is: one row for each
GPU a job held (allocated to it, or used by its processes; a MIG instance's whole GPU too, as findings name the
whole GPU), written as the job closes, so the escalation `in_every_job = N` reads a GPU's last N finished jobs
and asks of each whether it had the finding.

Table `gpu_jobs` (created if missing)::

    id         INTEGER PRIMARY KEY   in the order rows were written (the row bound drops the lowest)
    node, gpu  TEXT    where the job held it (node, GPU UUID)
    serial     TEXT    the GPU's board serial where its agent gave one; NULL otherwise
    job_id     TEXT    the job
    started    REAL    the job's start (Unix seconds; 0 unknown)
    ended      REAL    the job's end

A GPU is kept by its serial where known (moved to another node, its jobs follow it), else by node and UUID,
as in the finding history.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..state.core import CoreListener
from .mig import with_parents

if TYPE_CHECKING:
    from ..rules.model import AlertEvent
    from ..state.cluster import ClusterState, JobState
    from .offenders import FindingHistory

__all__ = ["GpuJobs", "GpuJobRecorder", "KEEP_S", "MAX_ROWS"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS gpu_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    gpu TEXT NOT NULL,
    serial TEXT,
    job_id TEXT NOT NULL,
    started REAL NOT NULL,
    ended REAL NOT NULL,
    UNIQUE (node, gpu, job_id)
);
CREATE INDEX IF NOT EXISTS gpu_jobs_serial ON gpu_jobs(serial, ended);
"""

KEEP_S = 90 * 86400.0
#: Rows kept at most, whatever the 90 days hold: 8,000 GPUs' last 30 jobs each, some 45 MB with serials.
MAX_ROWS = 250_000
#: The oldest rows looked at for age on each job's end: more than one job's rows, so the table keeps up.
_PRUNE = 1000


class GpuJobs:
    """The jobs each GPU held, as they closed.

    Args:
        conn: the collector's store, with finding_history (offenders.py makes it), which last_jobs reads too; the
            caller owns its thread.
        serial_of: a GPU's board serial, by (node, UUID), as its agent said it ("" unknown).
        max_rows: rows kept at most (the oldest written go first).
    """

    def __init__(self, conn: sqlite3.Connection, serial_of: Callable[[str, str], str] | None = None,
                 max_rows: int = MAX_ROWS) -> None:
        self.conn = conn
        self.serial_of = serial_of
        self.max_rows = max_rows
        conn.executescript(_SCHEMA)

    def record(self, job_id: str, gpus: Iterable[tuple[str, str]], started: float, ended: float,
               now: float) -> None:
        """Keep that job `job_id` held `gpus` ((node, UUID) pairs) from `started` to `ended`. A job closed again
        (by a restarted collector) keeps one row a GPU, with its latest end."""
        rows = [(node, gpu, self._serial_now(node, gpu), job_id, started, ended) for node, gpu in sorted(set(gpus))]
        if not rows:
            return
        self.conn.executemany(
            "INSERT INTO gpu_jobs (node, gpu, serial, job_id, started, ended) VALUES (?,?,?,?,?,?) "
            "ON CONFLICT (node, gpu, job_id) DO UPDATE SET ended=excluded.ended, "
            "serial=COALESCE(excluded.serial, serial)", rows)
        for node, gpu, serial, *_ in rows:
            if serial:  # its jobs from before the serial was known are the board's too
                self.conn.execute("UPDATE gpu_jobs SET serial=? WHERE node=? AND gpu=? AND serial IS NULL",
                                  (serial, node, gpu))
        last = self.conn.execute("SELECT MAX(id) FROM gpu_jobs").fetchone()[0]
        self.conn.execute("DELETE FROM gpu_jobs WHERE id <= ?", (last - self.max_rows,))
        # past 90 days: among the oldest rows written (rows come in the order jobs end), not by an index on
        # `ended`, which would cost a tenth of the table's size
        self.conn.execute(f"DELETE FROM gpu_jobs WHERE id IN (SELECT id FROM gpu_jobs ORDER BY id LIMIT {_PRUNE}) "
                          "AND ended < ?", (now - KEEP_S,))
        self.conn.commit()

    def _serial_now(self, node: str, gpu: str) -> str | None:
        return (self.serial_of(node, gpu) or None) if self.serial_of is not None else None

    def serial(self, node: str, gpu: str) -> str | None:
        """The serial the GPU's jobs are kept by (its latest job's), None unknown."""
        row = self.conn.execute("SELECT serial FROM gpu_jobs WHERE node=? AND gpu=? AND serial IS NOT NULL "
                                "ORDER BY ended DESC, id DESC LIMIT 1", (node, gpu)).fetchone()
        return row[0] if row else None

    def last_jobs(self, node: str, gpu: str, n: int, rule: str, xid: int = 0) -> list[tuple[str, bool]]:
        """The GPU's last `n` finished jobs, newest first, each with whether the finding history holds a `rule`
        finding (XID `xid` where given) on the GPU in that job. By the GPU's serial where known, on whichever
        node it was; each job's findings are looked up where that job held it."""
        serial = self.serial(node, gpu)
        where, args = ("j.serial=?", [serial]) if serial else ("j.node=? AND j.gpu=?", [node, gpu])
        hit = "h.job_id=j.job_id AND h.node=j.node AND h.gpu=j.gpu AND h.rule=?"
        hit_args: list[Any] = [rule]
        if xid:
            hit += " AND h.xid=?"
            hit_args.append(xid)
        return [(job_id, bool(had)) for job_id, had in self.conn.execute(
            f"SELECT j.job_id, EXISTS (SELECT 1 FROM finding_history h WHERE {hit}) FROM gpu_jobs j "
            f"WHERE {where} ORDER BY j.ended DESC, j.id DESC LIMIT ?", [*hit_args, *args, n])]


class GpuJobRecorder(CoreListener):
    """Writes each closing job's GPUs into the history and hands on the escalations that raises.

    Args:
        state: the collector's state (the job's GPUs, read before the job leaves memory).
        offenders: the finding history, which keeps the GpuJobs and runs the escalations over them.
        handle: where raised alerts go (Alerting.handle: the alert table and actions), with the time.
    """

    def __init__(self, state: ClusterState, offenders: FindingHistory,
                 handle: Callable[[list[AlertEvent], float], None]) -> None:
        self.state = state
        self.offenders = offenders
        self.handle = handle

    def on_job_closed(self, job: JobState, now: float) -> None:
        gpus = with_parents(self.state, [(g.node, g.uuid) for g in self.state.job_gpus(job)])
        raised = self.offenders.job_ended(job.job_id, gpus, job.start_time, job.end_time or now, now)
        if raised:
            self.handle(raised, now)
