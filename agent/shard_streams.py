"""An agent's streams to a sharded deployment: one Sender per collector it has data for, each batch split.

A deployment lists its collectors in one order everywhere (clusterwatch/shards.py). The agent computes,
from the same list (and `collectors_before` for a list that changed), what every collector and the CLI
compute, so no collector redirects anyone:

- a process of a job, its training reports and its provenance go to the job's collector (`for_job`:
  a job numbered below `collectors_before`'s first job keeps the list it started on);
- the job's prolog and epilog events go there too, and so do the readings of the GPUs the job holds
  (allocated by its prolog, or used by its processes), so that its rules (`idle_gpu`) and its status see
  them: that collector does not export them (collector/export/snapshot.py `owns_node`);
- the node's own data (every GPU reading, processes of no job, health records and the node's
  heartbeat) goes to the node's collector (`for_node`, always the current list): it gets every batch.

Each stream keeps today's guarantees by itself: its own numbering, acknowledgement, resend and backoff
(stream.Sender; the collectors are different, so the agent's one boot id numbers each from 1). The
streams share one buffer bound (stream.BufferBudget). A job's collector that got processes in the
previous batch gets one more batch even when it has nothing now, so that it sees them gone.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields

from clusterwatch.v1 import agent_pb2

from clusterwatch.model import ProcessSample
from clusterwatch.shards import Collectors
from clusterwatch.wire import processes_to_table

from .stream import BufferBudget, Sender, SenderCounters

Part = tuple[agent_pb2.Batch, list[ProcessSample]]


class BatchSplitter:
    """Splits a batch (its process table not yet built) and its samples into one part per collector."""

    def __init__(self, collectors: Collectors, node: str) -> None:
        self.collectors = collectors
        self.node_collector = collectors.for_node(node)
        self.single = len(collectors.all) == 1
        self._job_of_pid: dict[int, str] = {}  # the job of each pid in the last batch that had it
        self._job_gpus: dict[str, set[str]] = {}  # GPUs the prolog allocated to a running job here
        self._had_processes: set[str] = set()  # collectors the previous batch gave processes to
        self._owner: dict[str, str] = {}  # job id → its collector (computed once a job)

    def job_collector(self, job_id: str) -> str:
        found = self._owner.get(job_id)
        if found is None:
            found = self._owner[job_id] = self.collectors.for_job(job_id)
        return found

    def split(self, batch: agent_pb2.Batch, samples: list[ProcessSample]) -> dict[str, Part]:
        if self.single:  # one collector: the batch as it is, nothing copied
            return {self.node_collector: (batch, samples)}
        node_c = self.node_collector
        parts: dict[str, Part] = {}

        def part(collector: str) -> Part:
            got = parts.get(collector)
            if got is None:
                got = parts[collector] = (agent_pb2.Batch(sent_at=batch.sent_at), [])
            return got

        part(node_c)  # the node's own stream gets every batch: its heartbeat
        job_of_pid = {s.pid: s.job_id for s in samples}  # the latest poll last: its label wins
        gpu_jobs: dict[str, set[str]] = {}  # GPU UUID → jobs holding it
        for s in samples:
            target = self.job_collector(s.job_id) if s.job_id else node_c
            part(target)[1].append(s)
            if s.job_id:
                for g in s.gpus:
                    gpu_jobs.setdefault(g.gpu_uuid, set()).add(s.job_id)
        for e in batch.job_events:
            part(self.job_collector(e.job_id))[0].job_events.append(e)
            if e.kind == agent_pb2.JobEvent.START:
                self._job_gpus[e.job_id] = set(e.gpu_uuids)
        for job_id, uuids in self._job_gpus.items():
            for u in uuids:
                gpu_jobs.setdefault(u, set()).add(job_id)
        for r in batch.gpus:
            part(node_c)[0].gpus.append(r)
            for c in {self.job_collector(j) for j in gpu_jobs.get(r.uuid, ())} - {node_c}:
                part(c)[0].gpus.append(r)
        known = {**self._job_of_pid, **job_of_pid}
        for t in batch.training:
            job = known.get(t.pid, "")
            part(self.job_collector(job) if job else node_c)[0].training.append(t)
        for p in batch.provenance:
            job = known.get(p.pid, "")
            part(self.job_collector(job) if job else node_c)[0].provenance.append(p)
        node_batch = parts[node_c][0]
        node_batch.health_events.extend(batch.health_events)
        node_batch.gpu_health.extend(batch.gpu_health)
        node_batch.fabric_ports.extend(batch.fabric_ports)
        if batch.HasField("counters"):  # the node's own (the job-output reader's); each stream stamps its own on top
            node_batch.counters.CopyFrom(batch.counters)
        if batch.tmpfs_scans:  # per user, not per job: each collector with the node's jobs attributes them
            for c in parts:
                parts[c][0].tmpfs_scans.extend(batch.tmpfs_scans)
        for e in batch.job_events:
            if e.kind == agent_pb2.JobEvent.END:
                self._job_gpus.pop(e.job_id, None)
        with_processes = {c for c, (_, s) in parts.items() if s}
        for c in self._had_processes - with_processes:
            part(c)  # an empty table: its processes are gone
        self._had_processes = with_processes
        self._job_of_pid = job_of_pid
        if len(self._owner) > 4096:  # ended jobs' entries; the next batch computes the live ones again
            self._owner.clear()
        return parts


class ShardedSender:
    """One Sender per collector the agent has data for, started on its first batch; the node's at start.

    Args:
        collectors: the deployment's collectors.
        node: this node's name.
        make_sender: builds the Sender of one collector address, sharing `budget`.
        budget: the buffer bound the streams share.
    """

    def __init__(self, collectors: Collectors, node: str, make_sender: Callable[[str, BufferBudget], Sender],
                 budget: BufferBudget) -> None:
        self.collectors = collectors
        self.splitter = BatchSplitter(collectors, node)
        self._make = make_sender
        self.budget = budget
        self.senders: dict[str, Sender] = {}  # in the order they started
        self._started = False

    @property
    def node_collector(self) -> str:
        return self.splitter.node_collector

    def start(self) -> None:
        self._started = True
        self._sender(self.node_collector)

    def _sender(self, address: str) -> Sender:
        sender = self.senders.get(address)
        if sender is None:
            sender = self.senders[address] = self._make(address, self.budget)
            if self._started:
                sender.start()
        return sender

    def submit(self, batch: agent_pb2.Batch, samples: list[ProcessSample] | int, read_errors: int = 0) -> None:
        """Split a batch (its table not built: `samples` the list) and hand each part to its collector's
        stream; a batch whose table is built already (`samples` a count) goes to the node's collector."""
        if isinstance(samples, int):
            self._sender(self.node_collector).submit(batch, samples, read_errors)
            return
        parts = self.splitter.split(batch, samples)
        for address, (part, rows) in parts.items():
            processes_to_table(rows, part.processes)
            sender = self._sender(address)
            dropped = self.counters.samples_dropped if len(self.senders) > 1 else None
            sender.submit(part, len(rows), read_errors, samples_dropped=dropped)

    def send_hello(self) -> None:
        for sender in list(self.senders.values()):
            sender.send_hello()

    def flush(self, timeout: float) -> bool:
        """Wait until every stream's batches are acknowledged or timeout (one deadline for all)."""
        deadline = time.monotonic() + timeout
        ok = True
        for sender in list(self.senders.values()):
            ok = sender.flush(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def stop(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        for sender in list(self.senders.values()):
            sender.stop(max(0.1, deadline - time.monotonic()))

    @property
    def counters(self) -> SenderCounters:
        """The streams' counters added up."""
        total = SenderCounters()
        for sender in list(self.senders.values()):
            for f in fields(SenderCounters):
                setattr(total, f.name, getattr(total, f.name) + getattr(sender.counters, f.name))
        return total


__all__ = ["BatchSplitter", "ShardedSender"]
