"""A shard keeps of a batch only what the deployment's collectors list gives it.

Agents compute from the same list as the collectors where each job's samples go (agent/shard_streams.py): a
job's processes, events, training reports and provenance to the job's collector, a node's own data
(processes of no job, health records) to the node's. A batch that brings another shard's job is from an
agent given another list (or the list in another order), or from a client planting a copy of someone's job
beside the real one, which `status` through this collector and its /metrics would show as the job's. So a
shard drops, at ingest, the process rows of a job the list gives another collector, those of no job from a
node that is not its own, job events of another's job and health records of another's node; training
reports and provenance of the dropped rows then match no process here and are dropped with them. The rest
of the batch is applied and acknowledged as usual (refused whole, it would be resent for ever). Dropped
items are counted (clusterwatch_ingest_other_shard_dropped_total) and each node is named once in the log.

GPU readings stay: a job's collector gets those of the GPUs its jobs hold, and exports a node's own GPU
series only when the node is its own (collector/export/snapshot.py `owns_node`).
"""
from __future__ import annotations

import logging

from clusterwatch.v1 import agent_pb2

from clusterwatch.shards import Collectors
from clusterwatch.wire import ProcessColumns, processes_to_table

from ..config import CollectorConfig

log = logging.getLogger("clusterwatch.collector")

MAX_NAMED = 10_000  # nodes named in the log already: a bounded memory
MAX_CACHED = 4096  # job ids whose collector is known (ended jobs' entries are computed again if they come back)


class ShardGate:
    """What of an agent's batch is this shard's.

    Args:
        deployment: the deployment's collectors (the current list and the earlier one).
        me: this collector's entry in the list.
    """

    def __init__(self, deployment: Collectors, me: str) -> None:
        self.deployment = deployment
        self.me = me
        self.dropped = 0  # process samples, job events and health records dropped as another shard's
        self._job_owner: dict[str, str] = {}
        self._node_owner: dict[str, str] = {}
        self._named: set[str] = set()

    def job_collector(self, job_id: str) -> str:
        found = self._job_owner.get(job_id)
        if found is None:
            if len(self._job_owner) >= MAX_CACHED:
                self._job_owner.clear()
            found = self._job_owner[job_id] = self.deployment.for_job(job_id)
        return found

    def node_collector(self, node: str) -> str:
        found = self._node_owner.get(node)
        if found is None:
            if len(self._node_owner) >= MAX_CACHED:
                self._node_owner.clear()
            found = self._node_owner[node] = self.deployment.for_node(node)
        return found

    def own_share(self, node: str, batch: agent_pb2.Batch,
                  cols: ProcessColumns) -> tuple[agent_pb2.Batch, ProcessColumns]:
        """The batch (and its decoded process table) less what is another shard's; the same objects when all
        of it is this shard's, as a well-configured agent's batches are."""
        me = self.me
        node_is_mine = self.node_collector(node) == me
        # whose each label set's rows are: a job's collector's, or (no job) the node's
        foreign = [(self.job_collector(lab.job_id) if lab.job_id else (me if node_is_mine else "")) != me
                   for lab in cols.label_sets]
        foreign_events = [e for e in batch.job_events if self.job_collector(e.job_id) != me]
        health = 0 if node_is_mine else len(batch.health_events) + len(batch.gpu_health) + len(batch.fabric_ports)
        if not any(foreign) and not foreign_events and not health:
            return batch, cols
        out = agent_pb2.Batch()
        out.CopyFrom(batch)
        rows_dropped = 0
        if any(foreign):
            kept, first = [], 0
            for i in range(cols.rows):
                if foreign[cols.labels[i]]:
                    rows_dropped += 1
                else:
                    kept.append(cols.sample(i, node, first))
                first += cols.gpu_count[i]
            out.ClearField("processes")
            processes_to_table(kept, out.processes)
            cols = ProcessColumns(out.processes)
        if foreign_events:
            out.ClearField("job_events")
            out.job_events.extend(e for e in batch.job_events if self.job_collector(e.job_id) == me)
        if health:
            out.ClearField("health_events")
            out.ClearField("gpu_health")
            out.ClearField("fabric_ports")
        self.dropped += rows_dropped + len(foreign_events) + health
        self._name(node, batch, foreign, foreign_events)
        return out, cols

    def _name(self, node: str, batch: agent_pb2.Batch, foreign: list[bool], foreign_events: list) -> None:
        """One warning a node: what it sent, whose the list says it is, and what to check."""
        if node in self._named:
            return
        if len(self._named) >= MAX_NAMED:
            self._named.clear()
        self._named.add(node)
        labels = batch.processes.label_sets
        job = next((lab.job_id for lab, f in zip(labels, foreign, strict=True) if f and lab.job_id),
                   foreign_events[0].job_id if foreign_events else "")
        if job:
            what, whose = f"samples of job {job!r}", f"the job to {self.job_collector(job)}"
        else:
            what = "its own data (processes of no job, health records)"
            whose = f"the node to {self.node_collector(node)}"
        log.warning("shard %s dropped %s sent by the agent of node %r: the collectors list gives %s; give that "
                    "agent the same collectors list, in the same order, as this collector's --collectors (every "
                    "drop is counted in clusterwatch_ingest_other_shard_dropped_total)", self.me, what, node, whose)


def shard_gate(config: CollectorConfig) -> ShardGate | None:
    """The gate of a collector that is one shard of several (--shard); None for one that holds every job."""
    if not config.shard:
        return None
    return ShardGate(Collectors.parse(config.collectors, config.collectors_before or None), config.shard)
