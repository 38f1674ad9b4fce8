"""The collector's core: batches in, state updated, jobs opened and closed, summaries stored.

The gRPC servicers (collector/ingest/service.py, collector/queries/service.py) are thin: they turn
messages into calls here. Everything runs on the collector's event loop; the only other thread is
the Prometheus HTTP server, which reads the state under `lock`. What else reacts to ingest (the
alert rules, the job registry) is a CoreListener, handed in at construction; what they and the
query service ask of the state are methods here, which take the lock themselves. What ingest leaves
for the store waits in collector/state/durability.py for flush(); an ended job's summary is stored by
collector/state/job_closing.py.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from clusterwatch.v1 import agent_pb2, query_pb2

from clusterwatch.errors import ClusterwatchError
from clusterwatch.log_once import SaidOnce
from clusterwatch.model import ProcessKey
from clusterwatch.wire import (
    ProcessColumns,
    gpu_info_from_proto,
    job_event_from_proto,
    training_from_proto,
)

from ..config import CollectorConfig
from ..ingest.bounds import bound_batch, check_hello
from ..ingest.checks import REFUSAL_REASONS, Refusal, check_batch
from ..ingest.shard_gate import shard_gate
from ..queries.node_notes import NodeNotes
from ..queries.views import job_info, job_view
from ..traces.record import job_trace_lines
from .cluster import ClusterState, JobState, ProcessSeries
from .durability import PendingWrites
from .job_closing import JobClosing
from .store import STALE_AFTER_S, ProvenanceRow, Store
from .tmpfs import take_tmpfs_scan

if TYPE_CHECKING:
    from ..health.engine import HealthEngine

log = logging.getLogger("clusterwatch.collector")
T = TypeVar("T")

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


class CoreListener:
    """What reacts to the core's events (the alert rules, the job registry); each method a no-op here.

    Called on the event loop after the state changed, outside the core's lock; one that raises is
    counted (clusterwatch_ingest_callback_errors_total) and said once, never let into ingest.
    """

    def on_samples(self, node: str, touched: list[ProcessSeries], now: float) -> None:
        """A batch of `node` was applied; `touched` are the process series it updated."""

    def on_provenance(self, job: JobState, now: float) -> None:
        """A batch brought provenance records (which code a process runs) for `job`."""

    def on_job_closed(self, job: JobState, now: float) -> None:
        """`job` ended; its summary is about to be stored."""

    def on_tick(self, now: float) -> None:
        """Once a second, after the core's housekeeping."""

    def on_health(self, node: str, batch: agent_pb2.Batch, now: float) -> None:
        """A batch of `node` carried GPU health records (batch.health_events, batch.gpu_health)."""


class AlertSource(Protocol):
    """The alerts of jobs, as query views: for a closed job's summary and the query service."""

    def alert_views(self, job_id: str) -> list: ...

    def alert_list(self, job_id: str | None, include_resolved: bool, limit: int) -> list[tuple[str, object]]: ...


def new_cluster_state(config: CollectorConfig, max_history_step_s: float | None = None) -> ClusterState:
    """The empty state a collector with `config` starts from (before the store's jobs are restored), a history
    point at least every `max_history_step_s` where given."""
    step = config.history_step_s if max_history_step_s is None else min(config.history_step_s, max_history_step_s)
    return ClusterState(config.history_points, step, owners_from_slurm=config.slurm)


class StoreBehind(ClusterwatchError):
    """Something ingested is not durable yet (the store refused it): acknowledgements must wait."""


class SeqTracker:
    """Which batch numbers of one agent instance are stored, to drop resent duplicates.

    Keeps a low-water mark (every number up to it is stored) and the numbers above it.
    """

    __slots__ = ("low", "above")

    def __init__(self) -> None:
        self.low = 0
        self.above: set[int] = set()

    def has(self, seq: int) -> bool:
        """Whether seq is recorded already."""
        return seq <= self.low or seq in self.above

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
    # refused batches by reason (ingest_checks.REFUSAL_REASONS); each also counts in `rejected`
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSAL_REASONS, 0))
    store_errors: int = 0  # flushes and job closes the store could not take (retried)
    callback_errors: int = 0  # rules, alerts or registry callbacks that raised during ingest

    def add(self, name: str, n: int = 1) -> None:
        """Count `n` more of `name`, one of the int fields above (another name raises AttributeError)."""
        setattr(self, name, getattr(self, name) + n)


class CollectorCore:
    """State, store and job lifecycle of one collector.

    Args:
        config: the collector's configuration.
        store: the SQLite store.
        clock: Unix time; tests pass their own.
        listeners: told of samples, provenance, closed jobs and ticks, in this order.
        alerts: a job's alerts, put into its summary when it closes; None: summaries carry none.
        state: the state to work on (the alert rules read the same one); None: a new one.
        health: the GPU health rules' engine, whose health history a job's trace carries; None: traces
            carry none.
    """

    def __init__(self, config: CollectorConfig, store: Store, clock: Callable[[], float] = time.time,
                 listeners: Sequence[CoreListener] = (), alerts: AlertSource | None = None,
                 state: ClusterState | None = None, health: HealthEngine | None = None) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.state = state if state is not None else new_cluster_state(config)
        self.counters = IngestCounters()
        self.node_notes = NodeNotes()  # what agents' Hellos say that job views must show
        self.shard_gate = shard_gate(config)  # one shard of several: what of a batch is its own
        self.lock = threading.Lock()
        self._seqs: dict[str, SeqTracker] = {}
        # what ingest leaves for the store, written by flush() (collector/state/durability.py)
        self._writes = PendingWrites(store, self.state, self._seqs, self.lock, self.count)
        # ended jobs' summaries stored, then the jobs forgotten (collector/state/job_closing.py)
        self._jobs_closing = JobClosing(config, store, self.state, self.lock, clock, self.node_notes, self._writes,
                                        lambda job, now: self._notify("on_job_closed", job, now), alerts, self.count)
        self._refusals_said = SaidOnce(log)
        self._callbacks_said = SaidOnce(log)
        self._swept = float("-inf")  # when tick() last swept every process
        self._started = clock()
        self._listeners: list[CoreListener] = list(listeners)
        self._health = health
        self._restore()

    def count(self, name: str, n: int = 1) -> None:
        """Count `n` more of `name` (an IngestCounters field: rejected, unauthenticated, throttled, ...); what
        the servicers count goes through here, and collector/export/counter_metrics.py names it for /metrics."""
        self.counters.add(name, n)

    def add_listener(self, listener: CoreListener) -> None:
        """One more listener, for a part built on the core it listens to (the job registry)."""
        self._listeners.append(listener)

    @property
    def listeners(self) -> tuple[CoreListener, ...]:
        return tuple(self._listeners)

    def _restore(self) -> None:
        """Bring back what was stored before a restart: running jobs, batch numbers, sample counts.

        Samples themselves are not stored; the agents keep sending, and each process's
        count of samples held goes on from where it was.
        """
        for boot_id, low, above in self.store.load_seqs():
            tracker = self._seqs[boot_id] = SeqTracker()
            tracker.low, tracker.above = low, set(above)
        self.state.restored_samples = {ProcessKey(*k): n for k, n in self.store.load_process_counts().items()}
        self.state.restored_totals = {ProcessKey(*k): v for k, v in self.store.load_process_totals().items()}
        for job in self.store.load_jobs(include_ended=False):
            self.state.add_job(job)
            for row in self.store.load_provenance(job.job_id):
                record = _provenance_record(row.record)
                if record is not None:
                    job.provenance[ProcessKey(row.node, row.pid, row.start_time)] = record

    # -- ingest -----------------------------------------------------------------------------

    def hello(self, msg: agent_pb2.Hello, authenticated: bool = False) -> str:
        """An agent's Hello; `authenticated`: its stream proved who sent it (only then do its samples name
        owners, and actions reach its processes)."""
        check_hello(msg)  # ingest_bounds: HelloRefused for a string past its bound, before anything is held
        now = self.clock()
        gpus = [gpu_info_from_proto(g) for g in msg.gpus]
        with self.lock:
            ns = self.state.hello(msg.node, msg.boot_id, msg.agent_version, msg.interval_s, msg.gpu_source,
                                  msg.node_memory_total_bytes, gpus, now, msg.send_interval_s)
            ns.authenticated = authenticated
            self._writes.hello(ns, now)  # written with the next flush: a full or locked store never refuses a stream
        return msg.node

    def batch(self, node: str, boot_id: str, batch: agent_pb2.Batch) -> bool:
        """Apply one batch to the state, whole or not at all; True when applied, False when not (a duplicate,
        already applied, or a refused batch): either way the caller acknowledges it after the next flush.

        Nothing here writes the store: the batch's number, counts, job rows and provenance are
        written by the next flush(), in one transaction, and acknowledgements wait for it. A batch
        whose values cannot be held (ingest_checks) is refused: counted by reason, its number
        recorded so that the agent drops it rather than resend it forever (it would be refused
        again, and every batch behind it would wait).

        A batch whose process table's columns disagree is refused the same way.
        """
        too_long = bound_batch(batch)  # ingest_bounds: descriptions cut before they are decoded; a long name refuses
        tracker = self._seqs.get(boot_id)
        if tracker is None:
            tracker = self._seqs[boot_id] = SeqTracker()
        if tracker.has(batch.seq):
            self.counters.duplicates += 1
            return False
        try:
            cols = ProcessColumns(batch.processes)
        except ValueError as exc:
            cols, refusal = None, Refusal("inconsistent", str(exc))
        now = self.clock()
        if cols is not None:
            refusal = too_long or check_batch(batch, cols, now)
        if refusal is not None:
            self._refuse(node, batch.seq, refusal)
            tracker.add(batch.seq)
            self._writes.seq(boot_id)
            return False
        if self.shard_gate is not None:  # another shard's jobs (or node) are dropped, counted: shard_gate.py
            batch, cols = self.shard_gate.own_share(node, batch, cols)
        late, closed, events, trainings, provenance = self._read_ahead(batch, cols)
        with self.lock:
            touched, changed, records = self._apply(node, batch, cols, now, closed, events, trainings, provenance)
            # jobs first named by these samples are written to the store once
            changed |= {j for j in late if j in self.state.jobs and j not in self._writes.saved}
            # Applied whole: only now is its number recorded (a resend before this is applied afresh).
            tracker.add(batch.seq)
            self._writes.batch(node, boot_id, records, changed)
        self.counters.batches += 1
        self.counters.samples += cols.rows
        # the samples are in the state: an XID's pid names a process
        if batch.health_events or batch.gpu_health or batch.fabric_ports:
            self._notify("on_health", node, batch, now)
        self._after_batch(node, now, touched, changed, records)
        return True

    def _read_ahead(self, batch: agent_pb2.Batch, cols: ProcessColumns):
        """What a batch needs before anything of it is applied, since a read can fail too and a batch is
        applied whole or not at all: (job ids it names that are not held, those of them closed already,
        its job events, training reports, and (message, record) of its valid provenance)."""
        jobs = self.state.jobs
        # A job closed already stays closed: late samples lose its label, late events are dropped.
        late = {lab.job_id for lab in cols.label_sets if lab.job_id and lab.job_id not in jobs}
        late |= {e.job_id for e in batch.job_events if e.job_id not in jobs}
        closed = frozenset(j for j in late if self._jobs_closing.is_closed(j))
        events = [job_event_from_proto(e) for e in batch.job_events if e.job_id not in closed]
        trainings = [training_from_proto(t) for t in batch.training]
        provenance = []
        for prov in batch.provenance:
            record = _provenance_record(prov.json)
            if record is None:
                self.counters.rejected += 1
            else:
                provenance.append((prov, record))
        return late, closed, events, trainings, provenance

    def _apply(self, node, batch, cols, now, closed, events, trainings, provenance):
        """Apply a batch to the state, under the lock: (series touched, ids of jobs changed, provenance rows
        to store)."""
        st = self.state
        # job events first: a prolog's start names the job before its samples arrive
        changed = {st.job_event(node, e).job_id for e in events if e.kind == "start"}
        touched = st.add_processes(node, cols, now, closed)
        st.add_gpus(node, batch.gpus)
        if batch.gpu_health:
            st.add_gpu_health(node, batch.gpu_health)
        for t in trainings:
            st.add_training(node, t)
        ns = st.nodes.get(node)
        if ns is not None and batch.tmpfs_scans:
            take_tmpfs_scan(ns, batch.tmpfs_scans[-1])
        if ns is not None and batch.HasField("counters"):
            ns.samples_sent = batch.counters.samples_sent
            ns.samples_dropped = batch.counters.samples_dropped
            ns.read_errors = batch.counters.read_errors
            c = batch.counters
            ns.job_output = ((c.job_output_files, c.job_output_refused, c.job_output_errors)
                             if c.HasField("job_output_files") else None)
        changed |= {st.job_event(node, e).job_id for e in events if e.kind != "start"}
        records = []
        for prov, record in provenance:
            job = st.add_provenance(node, prov.pid, prov.start_time, record)
            if job is not None:
                records.append(ProvenanceRow(job.job_id, node, prov.pid, prov.start_time, prov.json))
        return touched, changed, records

    def _after_batch(self, node: str, now: float, touched: list, changed: set[str], records: list) -> None:
        """Outside the lock: tell the listeners, and close the jobs the batch ended."""
        for job_id in {r.job_id for r in records}:
            job = self.state.jobs.get(job_id)
            if job is not None:
                self._notify("on_provenance", job, now)
        self._notify("on_samples", node, touched, now)
        for job_id in changed:
            job = self.state.jobs.get(job_id)
            if job is not None and job.ended:
                self.close_job(job)

    def save_job(self, job: JobState) -> None:
        """Write a job's row with the next flush, in its transaction (kept pending while the store refuses
        it), rather than at once: a full or locked store then never raises into the caller."""
        with self.lock:
            self._writes.job(job)

    def _count_refusal(self, reason: str) -> None:
        self.counters.rejected += 1
        self.counters.refused[reason] = self.counters.refused.get(reason, 0) + 1

    def _refuse(self, node: str, seq: int, refusal: Refusal) -> None:
        """Count a refused batch; say so once per node and reason (the counter shows how often)."""
        self._count_refusal(refusal.reason)
        # Bounded: past 10,000 nodes and reasons, new ones are only counted.
        if len(self._refusals_said) < 10_000 and self._refusals_said.first((node, refusal.reason)):
            log.warning("node %s: batch %d refused, nothing of it stored: %s; the agent sends wrong data (check "
                        "its clock and version); counted in clusterwatch_ingest_refused_%s_total, said once",
                        node[:128], seq, refusal.detail, refusal.reason)

    def _notify(self, event: str, *args) -> None:
        """Tell every listener (rules, alerts, registry) of `event`; one that raises is counted and said once,
        never let into ingest: the batch is applied and its number recorded already."""
        for listener in self._listeners:
            cb = getattr(listener, event)
            try:
                cb(*args)
            except Exception:
                self.counters.callback_errors += 1
                name = getattr(cb, "__qualname__", repr(cb))
                if self._callbacks_said.first(name):
                    log.exception("%s failed (counted in clusterwatch_ingest_callback_errors_total; said once)",
                                  name)

    def flush(self) -> None:
        """Make what was ingested since the last flush durable: batch numbers, per-process counts, node and
        job rows, provenance, in one transaction; then retry job closes the store refused.

        Called every few hundred milliseconds; acknowledgements go out only after it succeeds,
        so one SQLite transaction covers many batches. When the store refuses the write (a full
        disk, a read-only or locked database), everything stays pending for the next flush and
        the error is raised: the caller holds the acknowledgements back. So it is while a closed
        job's summary waits to be stored (StoreBehind).
        """
        if self._writes:
            self._writes.write()
        self._jobs_closing.retry()
        if self._jobs_closing.waiting:
            # an epilog's end is acknowledged only once its job's summary is stored
            raise StoreBehind(f"the summaries of {self._jobs_closing.waiting} ended job(s) are not stored yet; "
                              "acknowledgements wait")

    def disconnected(self, node: str) -> None:
        with self.lock:
            self.state.disconnected(node)

    # -- job lifecycle ----------------------------------------------------------------------

    def close_job(self, job: JobState) -> None:
        """A job ended: store its final view as its summary and drop it from memory and /metrics.

        When the store refuses the summary (a full disk, a locked database), the job stays in
        memory, ended, and every flush tries again; it leaves memory only once stored.
        """
        self._jobs_closing.close(job)

    def amend_closed_job(self, job_id: str, state: str, exit_code: int | None, end_time: float) -> bool:
        """Slurm's final word on a job closed before Slurm had one (by its epilogs, which know exit codes but
        not CANCELLED, TIMEOUT or OUT_OF_MEMORY): its stored summary and record take Slurm's state, exit code
        and end time. Returns whether anything changed."""
        return self._jobs_closing.amend(job_id, state, exit_code, end_time)

    def tick(self) -> None:
        """Periodic housekeeping: end agent-only jobs whose processes are all gone, prune.

        Called every second (the alert rules' clock); the sweep over every process runs at most
        every HOUSEKEEPING_S, which is plenty for things that wait a minute or more.
        """
        now = self.clock()
        if now - self._swept >= HOUSEKEEPING_S:
            self._swept = now
            self._sweep(now)
        self._notify("on_tick", now)

    def _sweep(self, now: float) -> None:
        """End agent-only jobs whose processes have all been gone a while; forget old processes."""
        ended = []
        with self.lock:
            for job in self.state.jobs.values():
                if job.ended or job.source not in ("agent",):
                    continue
                procs = self.state.job_processes(job)
                if procs and not any(p.alive for p in procs):
                    # by the collector's clock: a node's clock stepping back must not end its jobs
                    last = max(p.seen for p in procs)
                    if now - last > AGENT_JOB_GONE_S:
                        job.state = "ENDED"
                        job.end_time = last
                        ended.append(job)
            self.state.prune(now)
        for job in ended:
            self.close_job(job)
        self._forget_stale(now)

    def _forget_stale(self, now: float) -> None:
        """Forget agent instances and nodes silent for STALE_AFTER_S while this collector ran (rows restored
        at start-up count from the start: a collector down a week must not forget agents about to resend)."""
        if now - self._started < STALE_AFTER_S:
            return
        try:
            gone = self.store.forget_stale(STALE_AFTER_S)
        except sqlite3.Error:
            self.count("store_errors")  # tried again at the next sweep
            return
        with self.lock:
            for boot_id in gone:
                if boot_id not in self._writes.boot_ids:  # heard of again since: its next flush writes it back
                    self._seqs.pop(boot_id, None)

    # -- queries ----------------------------------------------------------------------------

    def job_ids(self) -> list[str]:
        """The ids of the jobs held (ended ones too, until they are closed)."""
        with self.lock:
            return list(self.state.jobs)

    def holds(self, job: JobState) -> bool:
        """Whether `job` itself (not another of its id, made since) is held."""
        with self.lock:
            return self.state.jobs.get(job.job_id) is job

    def edit_jobs(self, edit: Callable[[JobState], None]) -> None:
        """Run `edit` on every job held, under the lock (a scrape never sees a job half changed)."""
        with self.lock:
            for job in self.state.jobs.values():
                edit(job)

    def edit_job(self, job_id: str, edit: Callable[[JobState], T],
                 create: bool = False) -> tuple[JobState | None, T | None]:
        """(the job, what `edit` returned) after running it on the job under the lock; (None, None) when the
        job is not held and `create` is false (with it, an empty job of that id is made first)."""
        with self.lock:
            job = self.state.jobs.get(job_id)
            if job is None:
                if not create:
                    return None, None
                job = self.state.jobs[job_id] = JobState(job_id)
            return job, edit(job)

    def jobs_ended_since(self, since: float) -> list[tuple[str, float]]:
        """(job id, end time) of the stored jobs that ended since `since`."""
        return self.store.ended_since(since)

    def agent_up(self, node: str, now: float) -> bool:
        """Whether the node's agent is connected and has sent within its down-after allowance."""
        with self.lock:
            return self._agent_up(node, now)

    def agents_up(self, now: float) -> set[str]:
        """The nodes whose agent is up (see agent_up)."""
        with self.lock:
            return {node for node in self.state.nodes if self._agent_up(node, now)}

    def _agent_up(self, node: str, now: float) -> bool:
        ns = self.state.nodes.get(node)
        return ns is not None and ns.connected and self.state.node_up(ns, now, self.config.agent_down_after_intervals)

    def gpu_uuids_by_index(self, node: str) -> dict[int, str] | None:
        """GPU index → UUID in the node's agent inventory; None for a node no agent has reported."""
        with self.lock:
            ns = self.state.nodes.get(node)
            if ns is None:
                return None
            out = {}
            for uuid in ns.gpus:
                series = self.state.gpus.get(uuid)
                if series is not None:
                    out[series.info.index] = uuid
            return out

    def running_nodes(self) -> set[str]:
        """The nodes of the jobs held that have not ended."""
        with self.lock:
            return {n for j in self.state.jobs.values() if not j.ended for n in j.nodes}

    def live_job_view(self, job_id: str, trend_points: int) -> query_pb2.JobView | None:
        """The view of a job this collector holds (its processes, GPUs, trends), or None."""
        with self.lock:
            job = self.state.jobs.get(job_id)
            if job is None:
                return None
            view = job_view(self.state, job, self.clock(), trend_points, self.config.agent_down_after_intervals)
            self.node_notes.fill(view)
            return view

    def stored_job_view(self, job_id: str) -> query_pb2.JobView | None:
        """The summary stored when a job closed, as of now, or None."""
        stored = self.store.load_summary(job_id)
        if stored is None:
            return None
        view = query_pb2.JobView()
        view.ParseFromString(stored)
        view.now = self.clock()
        return view

    def job_infos(self, include_ended: bool, may_see: Callable[[str], bool]) -> list[query_pb2.JobInfo]:
        """The jobs whose owner `may_see` accepts: those held, and with `include_ended` the stored ones too."""
        with self.lock:
            live = {j.job_id: j for j in self.state.jobs.values()}
            infos = [job_info(j, self.state) for j in live.values()
                     if (include_ended or not j.ended) and may_see(j.user)]
        if include_ended:
            infos += [job_info(j) for j in self.store.load_jobs(include_ended=True)
                      if j.job_id not in live and may_see(j.user)]
        return infos

    def job_owners(self) -> dict[str, str]:
        """job id → user, of the jobs held and stored."""
        with self.lock:
            owners = {j.job_id: j.user for j in self.state.jobs.values()}
        for job in self.store.load_jobs(include_ended=True):
            owners.setdefault(job.job_id, job.user)
        return owners

    def job_trace(self, job_id: str) -> tuple[list[str], str] | None:
        """(the trace lines of a job held, its owner), or None when it is not held."""
        with self.lock:
            job = self.state.jobs.get(job_id)
            if job is None:
                return None
            return job_trace_lines(self.state, job, self._health), job.user

    def counts(self) -> dict[str, int]:
        """What this core counted since it started, by name.

        collector/export/counter_metrics.py names them for /metrics.
        """
        c = self.counters
        return {
            "batches": c.batches, "samples": c.samples, "duplicates": c.duplicates, "rejected": c.rejected,
            "unauthenticated": c.unauthenticated, "throttled": c.throttled,
            **{f"refused_{reason}": c.refused.get(reason, 0) for reason in REFUSAL_REASONS},
            "training_unmatched": self.state.training_unmatched, "tags_dropped": self.state.tags_dropped,
            "tag_changes_dropped": self.state.tag_changes_dropped,
            "other_shard_dropped": self.shard_gate.dropped if self.shard_gate is not None else 0,
            "store_errors": c.store_errors, "callback_errors": c.callback_errors,
        }
