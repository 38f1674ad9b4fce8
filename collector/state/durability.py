"""What ingest leaves for the store, written by the next flush in one transaction.

A batch is acknowledged only once its number is durable. The core applies batches to the state and
queues what they leave here, under its lock; the collector's flush loop writes it all every few
hundred milliseconds, many batches a transaction. When the store refuses (a full disk, a locked or
read-only database), everything stays pending, newer changes kept, and the next flush tries again.
"""
from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .cluster import ClusterState, JobState, NodeState
from .store import NodeRow, ProvenanceRow, Store, job_row

if TYPE_CHECKING:
    from .core import SeqTracker


class PendingWrites:
    """Node rows, batch numbers, per-process counts, job rows and provenance not yet durable.

    Every method but write() is called under the core's lock; write() takes it itself.

    Args:
        store: where they go.
        state: the collector's state, read when they are written.
        seqs: boot id → its SeqTracker (the core's): the numbers of the boot ids marked are written.
        lock: the core's lock.
        count: the core's counter (a write the store refuses counts in store_errors).
    """

    def __init__(self, store: Store, state: ClusterState, seqs: dict[str, SeqTracker], lock: threading.Lock,
                 count: Callable[[str], None]) -> None:
        self.store = store
        self.state = state
        self.seqs = seqs
        self.lock = lock
        self.count = count
        # what changed since the last durable write: boot ids whose numbers moved, nodes whose counts did
        self.boot_ids: set[str] = set()
        self.nodes: set[str] = set()
        # rows waiting for the next write's transaction: nodes (from hellos), jobs, provenance records
        self.node_rows: dict[str, NodeRow] = {}
        self.jobs: dict[str, JobState] = {}
        self.provenance: list[ProvenanceRow] = []
        # Jobs first seen through samples are written to the store once; after that on change only.
        self.saved: set[str] = set()

    def __bool__(self) -> bool:
        """Whether anything waits to be written."""
        return bool(self.boot_ids or self.nodes or self.jobs or self.node_rows or self.provenance)

    def hello(self, ns: NodeState, now: float) -> None:
        """A node's row as its agent's Hello left it (a full or locked store never refuses an agent's stream)."""
        self.node_rows[ns.node] = NodeRow(ns.node, ns.boot_id, ns.agent_version, ns.memory_total_bytes, list(ns.gpus),
                                          now)

    def seq(self, boot_id: str) -> None:
        """A batch number of `boot_id` was recorded without a batch applied (a refused batch)."""
        self.boot_ids.add(boot_id)

    def batch(self, node: str, boot_id: str, records: list, changed: set[str]) -> None:
        """What an applied batch leaves: its number, its node's counts, its provenance `records`, and the rows
        of the jobs `changed`."""
        self.boot_ids.add(boot_id)
        self.nodes.add(node)
        self.provenance.extend(records)
        for job_id in changed:
            job = self.state.jobs.get(job_id)
            if job is not None:
                self.jobs[job_id] = job
                self.saved.add(job_id)

    def job(self, job: JobState) -> None:
        """A job's row, written with the next flush."""
        self.jobs[job.job_id] = job

    def job_stored(self, job_id: str) -> None:
        """A job's final row was written with its summary: nothing of it is pending."""
        self.jobs.pop(job_id, None)

    def write(self) -> None:
        """Write everything pending in one transaction; when the store refuses, keep it all (newer changes
        too) for the next write, count it, and raise the store's error."""
        with self.lock:
            st = self.state
            nodes_marked, boot_ids = self.nodes, self.boot_ids
            jobs, node_rows, provenance = self.jobs, self.node_rows, self.provenance
            self.nodes, self.boot_ids = set(), set()
            self.jobs, self.node_rows, self.provenance = {}, {}, []
            node_counts = []
            for node in nodes_marked:
                # with each process's whole-life totals (CPU time, first sample), so a restart counts on
                node_counts.append((node, [(s.key.pid, s.key.start_time, s.samples, round(s.cpu_seconds, 3),
                                            s.first_time)
                                           for s in st.pids.get(node, {}).values() if s.alive]))
            seqs = [(b, t.low, sorted(t.above)) for b in boot_ids if (t := self.seqs.get(b))]
            # when each node was last heard of, so agent_down after a restart starts from the truth
            seen = [(ns.last_seen, n) for n in nodes_marked if (ns := st.nodes.get(n)) is not None]
            # running jobs with GPU totals on the nodes heard from: their totals go on growing (issue 17 item 11)
            for job in st.jobs.values():
                if (job.gpu_totals and not job.ended and job.job_id not in jobs
                        and not nodes_marked.isdisjoint(job.nodes)):
                    jobs[job.job_id] = job
            job_rows = [job_row(job) for job in jobs.values()]
        try:
            self.store.save_ingest(node_counts, seqs, seen, nodes=list(node_rows.values()), jobs=job_rows,
                                   provenance=provenance)
        except sqlite3.Error:
            self.count("store_errors")
            with self.lock:  # all of it again next time, newer changes kept
                self.nodes |= nodes_marked
                self.boot_ids |= boot_ids
                self.jobs = {**jobs, **self.jobs}
                self.node_rows = {**node_rows, **self.node_rows}
                self.provenance[:0] = provenance
            raise
