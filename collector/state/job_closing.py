"""Closing a job: its final view stored as its summary, then the job dropped from memory and /metrics.

When the store refuses the summary (a full disk, a locked database), the job stays in memory, ended,
and every flush tries again; it leaves memory only once stored, and until then the core holds back
acknowledgements (an epilog's end is acknowledged only once its job's summary is stored).
"""
from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from clusterwatch.v1 import query_pb2

from clusterwatch.log_once import SaidOnce

from ..config import CollectorConfig
from ..queries.node_notes import NodeNotes
from ..queries.views import job_view
from .cluster import ClusterState, JobState
from .durability import PendingWrites
from .store import Store, job_row
from .summary import write_summary

if TYPE_CHECKING:
    from .core import AlertSource

log = logging.getLogger("clusterwatch.collector")


class JobClosing:
    """The jobs a collector closes, and Slurm's later word on those it closed.

    Args:
        config: the collector's configuration (summary_dir, agent_down_after_intervals).
        store: where summaries and final job rows go.
        state: the collector's state, read and changed under `lock`.
        lock: the core's lock.
        clock: Unix time.
        node_notes: what agents' Hellos say that a job's view must show.
        writes: the pending writes, which drop a job's row once its final one is stored.
        job_closed: tells the core's listeners that a job ended (CoreListener.on_job_closed).
        alerts: a job's alerts, put into its summary; None: summaries carry none.
        count: the core's counter (a summary the store refuses counts in store_errors).
    """

    def __init__(self, config: CollectorConfig, store: Store, state: ClusterState, lock: threading.Lock,
                 clock: Callable[[], float], node_notes: NodeNotes, writes: PendingWrites,
                 job_closed: Callable[[JobState, float], None], alerts: AlertSource | None,
                 count: Callable[[str], None]) -> None:
        self.config = config
        self.store = store
        self.state = state
        self.lock = lock
        self.clock = clock
        self.node_notes = node_notes
        self.writes = writes
        self.job_closed = job_closed
        self.alerts = alerts
        self.count = count
        # job id → (job, final view): closed, not yet stored (the store refused); retried by retry()
        self._closing: dict[str, tuple[JobState, query_pb2.JobView]] = {}
        self._said = SaidOnce(log)
        self._closed: set[str] = set()  # jobs closed by this collector (older ones are looked up)

    @property
    def waiting(self) -> int:
        """How many closed jobs' summaries wait to be stored."""
        return len(self._closing)

    def close(self, job: JobState) -> None:
        """A job ended: store its final view as its summary and drop it from memory and /metrics."""
        if job.job_id in self._closing:
            self._persist(job.job_id)
            return
        now = self.clock()
        if not job.end_time:
            job.end_time = now
        with self.lock:
            view = job_view(self.state, job, now, after_intervals=self.config.agent_down_after_intervals)
            self.node_notes.fill(view)
            for pv in view.processes:
                pv.alive = False
        self.job_closed(job, now)
        if self.alerts is not None:
            try:
                view.alerts.extend(self.alerts.alert_views(job.job_id))
            except sqlite3.Error:
                self.count("store_errors")  # the summary goes without its alerts rather than not at all
        self._closing[job.job_id] = (job, view)
        self._persist(job.job_id)

    def retry(self) -> None:
        """Try again to store the summaries the store refused."""
        for job_id in list(self._closing):
            self._persist(job_id)

    def is_closed(self, job_id: str) -> bool:
        """Whether a job not in memory was closed before (its summary is stored)."""
        if job_id in self._closed:
            return True
        if self.store.load_summary(job_id) is not None:
            self._closed.add(job_id)
            return True
        return False

    def _persist(self, job_id: str) -> bool:
        """Store a closed job's row and summary (one transaction); then forget it. False when the store
        refused (the job waits in memory for the next try)."""
        job, view = self._closing[job_id]
        try:
            self.store.save_closed_job(job_row(job), job_id, view.SerializeToString())
        except sqlite3.Error as exc:
            self.count("store_errors")
            self._said.warning(job_id, "cannot store the summary of job %s (%s); it stays in memory and is retried "
                               "with every flush", job_id, exc)
            return False
        del self._closing[job_id]
        self._said.forget(job_id)
        with self.lock:
            self.writes.job_stored(job_id)  # the row just written is the final one
        self._write_summary_file(job_id, view)
        with self.lock:
            self.state.forget_job(job_id)
        self._closed.add(job_id)
        log.info("job %s ended (%s); summary stored", job_id, job.state)
        return True

    def amend(self, job_id: str, state: str, exit_code: int | None, end_time: float) -> bool:
        """Slurm's final word on a job closed before Slurm had one (by its epilogs, which know exit codes but
        not CANCELLED, TIMEOUT or OUT_OF_MEMORY): its stored summary and record take Slurm's state, exit code
        and end time. Returns whether anything changed."""
        data = self.store.load_summary(job_id)
        if data is None:
            return False
        view = query_pb2.JobView()
        view.ParseFromString(data)
        info = view.job
        before = (info.state, info.exit_code if info.HasField("exit_code") else None, info.end_time)
        info.state = state
        if exit_code is not None:
            info.exit_code = exit_code
        if end_time:
            info.end_time = end_time
        if (info.state, info.exit_code if info.HasField("exit_code") else None, info.end_time) == before:
            return False
        self.store.save_summary(job_id, view.SerializeToString())
        self.store.amend_job_end(job_id, state, exit_code, info.end_time)
        self._write_summary_file(job_id, view)
        log.info("job %s: Slurm's final state %s (its epilogs had it %s)", job_id, state, before[0])
        return True

    def _write_summary_file(self, job_id: str, view: query_pb2.JobView) -> None:
        """The summary as a file in --summary-dir, when there is one; a failure is said, never raised."""
        if not self.config.summary_dir:
            return
        try:
            write_summary(self.config.summary_dir, view)
        except OSError as exc:
            log.warning("cannot write the summary of job %s into %s: %s", job_id, self.config.summary_dir,
                        exc.strerror or exc)
