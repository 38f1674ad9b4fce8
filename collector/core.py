"""The collector's core: batches in, state updated, jobs opened and closed, summaries stored.

The gRPC servicers (collector/service.py) are thin: they turn messages into calls
here. Everything runs on the collector's event loop; the only other thread is the
Prometheus HTTP server, which reads the state under `lock`.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from clusterwatch.v1 import agent_pb2, query_pb2

from clusterwatch.model import ProcessKey
from clusterwatch.wire import (
    ProcessColumns,
    gpu_info_from_proto,
    job_event_from_proto,
    training_from_proto,
)

from .config import CollectorConfig
from .state import ClusterState, JobState
from .store import Store
from .summary import write_summary
from .views import job_view

log = logging.getLogger("clusterwatch.collector")

# An agent-only job (no prolog, no Slurm, no `run`) has ended once all its processes
# have been gone this long.
AGENT_JOB_GONE_S = 60.0
# The sweep over every process (ended agent-only jobs, forgotten processes) runs this often.
HOUSEKEEPING_S = 10.0


def _provenance_record(text: str) -> dict | None:
    """A provenance record from its JSON, None when it is not a JSON object of sane size."""
    if len(text) > 256 * 1024:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class SeqTracker:
    """Which batch numbers of one agent instance are stored, to drop resent duplicates.

    Keeps a low-water mark (every number up to it is stored) and the numbers above it.
    """

    __slots__ = ("low", "above")

    def __init__(self) -> None:
        self.low = 0
        self.above: set[int] = set()

    def add(self, seq: int) -> bool:
        """Record seq; False when it was already stored."""
        if seq <= self.low or seq in self.above:
            return False
        self.above.add(seq)
        while self.low + 1 in self.above:
            self.low += 1
            self.above.discard(self.low)
        return True


@dataclass(slots=True)
class IngestCounters:
    batches: int = 0
    samples: int = 0
    duplicates: int = 0
    rejected: int = 0
    unauthenticated: int = 0
    throttled: int = 0


class CollectorCore:
    """State, store and job lifecycle of one collector.

    Args:
        config: the collector's configuration.
        store: the SQLite store.
        clock: Unix time; tests pass their own.
    """

    def __init__(self, config: CollectorConfig, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.state = ClusterState(config.history_points, config.history_step_s)
        self.counters = IngestCounters()
        self.lock = threading.Lock()
        self._seqs: dict[str, SeqTracker] = {}
        # what changed since the last durable flush (see flush())
        self._dirty_seqs: set[str] = set()
        self._dirty_nodes: set[str] = set()
        # Jobs first seen through samples are written to the store once; after that on change only.
        self._saved: set[str] = set()
        self._closed: set[str] = set()  # jobs closed by this collector (older ones are looked up)
        self._swept = float("-inf")  # when tick() last swept every process
        self.on_samples: list[Callable] = []  # called with (node, touched series, now) after each batch
        self.on_job_closed: list[Callable[[JobState, float], None]] = []
        self.on_provenance: list[Callable[[JobState, float], None]] = []
        self.on_tick: list[Callable[[float], None]] = []
        # job id → its alerts as query AlertViews (set when alerting runs)
        self.alert_views: Callable[[str], list] | None = None
        # (job id or None, include resolved, limit) → [(job id, AlertView)]
        self.alert_list: Callable[[str | None, bool, int], list] | None = None
        self._restore()

    def _restore(self) -> None:
        """Bring back what was stored before a restart: running jobs, batch numbers, sample counts.

        Samples themselves are not stored; the agents keep sending, and each process's
        count of samples held goes on from where it was.
        """
        for boot_id, low, above in self.store.load_seqs():
            tracker = self._seqs[boot_id] = SeqTracker()
            tracker.low, tracker.above = low, set(above)
        self.state.restored_samples = {ProcessKey(*k): n for k, n in self.store.load_process_counts().items()}
        for job in self.store.load_jobs(include_ended=False):
            self.state.jobs[job.job_id] = job
            for node, pid, start_time, text in self.store.load_provenance(job.job_id):
                record = _provenance_record(text)
                if record is not None:
                    job.provenance[ProcessKey(node, pid, start_time)] = record

    # -- ingest -----------------------------------------------------------------------------

    def hello(self, msg: agent_pb2.Hello) -> str:
        now = self.clock()
        gpus = [gpu_info_from_proto(g) for g in msg.gpus]
        with self.lock:
            ns = self.state.hello(msg.node, msg.boot_id, msg.agent_version, msg.interval_s, msg.gpu_source,
                                  msg.node_memory_total_bytes, gpus, now, msg.send_interval_s)
        self.store.save_node(ns.node, ns.boot_id, ns.agent_version, ns.memory_total_bytes, ns.gpus, now)
        return msg.node

    def batch(self, node: str, boot_id: str, batch: agent_pb2.Batch) -> bool:
        """Store one batch; False when it is a duplicate (already stored, ack it again).

        Raises ValueError, with the reason, for a batch whose process table is inconsistent
        (nothing of it is stored, and it is counted as rejected).
        """
        try:
            cols = ProcessColumns(batch.processes)
        except ValueError:
            self.counters.rejected += 1
            raise
        tracker = self._seqs.get(boot_id)
        if tracker is None:
            tracker = self._seqs[boot_id] = SeqTracker()
        if not tracker.add(batch.seq):
            self.counters.duplicates += 1
            return False
        self._dirty_seqs.add(boot_id)
        now = self.clock()
        with self.lock:
            st = self.state
            # a job closed already stays closed: late samples lose its label, late events are dropped
            jobs = st.jobs
            late = {lab[4] for lab in cols.label_sets if lab[4] and lab[4] not in jobs}  # lab[4]: job id
            late |= {e.job_id for e in batch.job_events if e.job_id not in jobs}
            closed = frozenset(j for j in late if self._is_closed(j))
            # job events first: a prolog's start names the job before its samples arrive
            events = [job_event_from_proto(e) for e in batch.job_events if e.job_id not in closed]
            starts = [e for e in events if e.kind == "start"]
            changed = {st.job_event(node, e).job_id for e in starts}
            touched = st.add_processes(node, cols, now, closed)
            st.add_gpus(node, batch.gpus)
            for t in batch.training:
                st.add_training(node, training_from_proto(t))
            ns = st.nodes.get(node)
            if ns is not None and batch.HasField("counters"):
                ns.samples_sent = batch.counters.samples_sent
                ns.samples_dropped = batch.counters.samples_dropped
                ns.read_errors = batch.counters.read_errors
            changed |= {st.job_event(node, e).job_id for e in events if e.kind != "start"}
            records = []
            for prov in batch.provenance:
                record = _provenance_record(prov.json)
                if record is None:
                    self.counters.rejected += 1
                    continue
                job = st.add_provenance(node, prov.pid, prov.start_time, record)
                if job is not None:
                    records.append((job.job_id, prov.pid, prov.start_time, prov.json))
            # jobs first named by these samples are written to the store once
            changed |= {j for j in late if j in jobs and j not in self._saved}
        self._dirty_nodes.add(node)
        self.counters.batches += 1
        self.counters.samples += cols.rows
        for job_id, pid, start_time, text in records:
            self.store.save_provenance(job_id, node, pid, start_time, text)
        for job_id in {r[0] for r in records}:
            job = self.state.jobs.get(job_id)
            if job is not None:
                for cb in self.on_provenance:
                    cb(job, now)
        for cb in self.on_samples:
            cb(node, touched, now)
        for job_id in changed:
            job = self.state.jobs.get(job_id)
            if job is None:
                continue
            self.store.save_job(job)
            self._saved.add(job_id)
            if job.ended:
                self.close_job(job)
        return True

    def _is_closed(self, job_id: str) -> bool:
        """Whether a job not in memory was closed before (its summary is stored)."""
        if job_id in self._closed:
            return True
        if self.store.load_summary(job_id) is not None:
            self._closed.add(job_id)
            return True
        return False

    def flush(self) -> None:
        """Make what was ingested since the last flush durable (batch numbers, per-process counts).

        Called every few hundred milliseconds; acknowledgements go out only after it, so
        one SQLite transaction covers many batches.
        """
        if not self._dirty_seqs and not self._dirty_nodes:
            return
        with self.lock:
            st = self.state
            node_counts = []
            for node in self._dirty_nodes:
                node_counts.append((node, [(s.key.pid, s.key.start_time, s.samples)
                                           for s in st.pids.get(node, {}).values() if s.alive]))
            seqs = [(b, t.low, sorted(t.above)) for b in self._dirty_seqs if (t := self._seqs.get(b))]
            # when each node was last heard of, so agent_down after a restart starts from the truth
            seen = [(ns.last_seen, n) for n in self._dirty_nodes if (ns := st.nodes.get(n)) is not None]
            self._dirty_seqs.clear()
            self._dirty_nodes.clear()
        self.store.save_ingest(node_counts, seqs, seen)

    def disconnected(self, node: str) -> None:
        with self.lock:
            self.state.disconnected(node)

    # -- job lifecycle ----------------------------------------------------------------------

    def close_job(self, job: JobState) -> None:
        """A job ended: store its final view as its summary and drop it from memory and /metrics."""
        now = self.clock()
        if not job.end_time:
            job.end_time = now
        with self.lock:
            view = job_view(self.state, job, now, after_intervals=self.config.agent_down_after_intervals)
            for pv in view.processes:
                pv.alive = False
        for cb in self.on_job_closed:
            cb(job, now)
        if self.alert_views is not None:
            view.alerts.extend(self.alert_views(job.job_id))
        self.store.save_job(job)
        self.store.save_summary(job.job_id, view.SerializeToString())
        if self.config.summary_dir:
            try:
                write_summary(self.config.summary_dir, view)
            except OSError as exc:
                log.warning("cannot write the summary of job %s into %s: %s", job.job_id,
                            self.config.summary_dir, exc.strerror or exc)
        with self.lock:
            self.state.forget_job(job.job_id)
        self._closed.add(job.job_id)
        log.info("job %s ended (%s); summary stored", job.job_id, job.state)

    def amend_closed_job(self, job_id: str, state: str, exit_code: int | None, end_time: float) -> bool:
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
        if self.config.summary_dir:
            try:
                write_summary(self.config.summary_dir, view)
            except OSError as exc:
                log.warning("cannot write the summary of job %s into %s: %s", job_id, self.config.summary_dir,
                            exc.strerror or exc)
        log.info("job %s: Slurm's final state %s (its epilogs had it %s)", job_id, state, before[0])
        return True

    def tick(self) -> None:
        """Periodic housekeeping: end agent-only jobs whose processes are all gone, prune.

        Called every second (the alert rules' clock); the sweep over every process runs at most
        every HOUSEKEEPING_S, which is plenty for things that wait a minute or more.
        """
        now = self.clock()
        if now - self._swept >= HOUSEKEEPING_S:
            self._swept = now
            self._sweep(now)
        for cb in self.on_tick:
            cb(now)

    def _sweep(self, now: float) -> None:
        """End agent-only jobs whose processes have all been gone a while; forget old processes."""
        ended = []
        with self.lock:
            for job in self.state.jobs.values():
                if job.ended or job.source not in ("agent",):
                    continue
                procs = self.state.job_processes(job)
                if procs and not any(p.alive for p in procs):
                    last = max(p.latest.time for p in procs)
                    if now - last > AGENT_JOB_GONE_S:
                        job.state = "ENDED"
                        job.end_time = last
                        ended.append(job)
            self.state.prune(now)
        for job in ended:
            self.close_job(job)

    # -- queries ----------------------------------------------------------------------------

    def counter_values(self) -> dict[str, tuple[float, str]]:
        c = self.counters
        return {
            "clusterwatch_ingest_batches": (c.batches, "Batches stored."),
            "clusterwatch_ingest_samples": (c.samples, "Process samples stored."),
            "clusterwatch_ingest_duplicates": (c.duplicates, "Resent batches dropped as duplicates."),
            "clusterwatch_ingest_rejected": (c.rejected, "Messages rejected as malformed or oversized."),
            "clusterwatch_ingest_unauthenticated": (c.unauthenticated, "Streams refused for bad credentials."),
            "clusterwatch_ingest_throttled": (c.throttled, "Batches slowed down because one agent sent too much."),
        }
