"""The health rules in the running collector: a core listener that feeds the HealthEngine.

The core tells it of every batch that carries health records (`on_health`); it finds who uses
each GPU from the collector's state (the node's live processes on that GPU, and the process the
driver named, wherever it runs on the node), runs the engine, and hands the alert events to the
same table and actions as the other rules (`handle`). `job_health` gives status the findings on
a job's GPUs during the job, and on its nodes' fabric (their InfiniBand / RoCE ports and NVSwitches: every job
on a node is told of them, fabric.py).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from clusterwatch.collector.health.decisions import THROTTLE_REASONS, GpuUser
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.kmsg_marks import KmsgMarks
from clusterwatch.collector.health.mig import gpu_index, slices_of, with_parents
from clusterwatch.collector.rules.model import AlertEvent
from clusterwatch.v1 import query_pb2

__all__ = ["HealthListener", "gpu_users", "node_users", "job_nodes"]

log = logging.getLogger("clusterwatch.collector")


def gpu_users(state: Any, node: str, uuid: str, pid: int | None = None,
              hit_at: float | None = None) -> list[GpuUser]:
    """The live processes of `node` on GPU `uuid` (and the process `pid`, wherever it is), as GpuUsers.

    Only processes that belong to a job count: a GPU's user is a rank of a job. With `hit_at` (an
    event's time), only those that had started by then: the kernel log read at start holds this
    boot's XIDs, and one from yesterday did not hit today's job. A whole GPU in MIG mode is used by the
    processes on its instances (its health is theirs).
    """
    out = []
    slices = slices_of(state, node, uuid) if uuid else frozenset()
    for series in (state.pids.get(node) or {}).values():
        s = series.latest
        if not series.alive or not s.job_id or (hit_at is not None and s.start_time > hit_at + 1.0):
            continue
        if s.pid == pid or any(g.gpu_uuid == uuid or g.gpu_uuid in slices for g in s.gpus):
            out.append(GpuUser(job_id=s.job_id, rank=s.rank, pid=s.pid, process=s.command or None,
                               start_time=s.start_time))
    out.sort(key=lambda u: (u.job_id, u.rank if u.rank is not None else 1 << 30, u.pid or 0))
    return out


def node_users(state: Any, node: str, hit_at: float | None = None) -> list[GpuUser]:
    """Every live process of a job on `node` (a fabric finding is every rank's there), those started by `hit_at`
    when given (as gpu_users)."""
    out = []
    for series in (state.pids.get(node) or {}).values():
        s = series.latest
        if series.alive and s.job_id and (hit_at is None or s.start_time <= hit_at + 1.0):
            out.append(GpuUser(job_id=s.job_id, rank=s.rank, pid=s.pid, process=s.command or None,
                               start_time=s.start_time))
    out.sort(key=lambda u: (u.job_id, u.rank if u.rank is not None else 1 << 30, u.pid or 0))
    return out


def job_nodes(state: Any, job: Any) -> list[str]:
    """The nodes a job runs on: Slurm's list, and those of its GPUs and processes (a job outside Slurm)."""
    # (a job view without nodes or processes, as a test or replay builds one, has its GPUs' nodes)
    nodes = {g.node for g in state.job_gpus(job)} | set(getattr(job, "nodes", ()))
    nodes |= {key[0] for key in getattr(job, "processes", ())}
    return sorted(nodes)


class HealthListener:
    """A CoreListener for the health records (the core calls `on_health`; the other events are ignored).

    Args:
        engine: the health engine.
        state: the collector's ClusterState.
        handle: takes the alert events (Alerting's handler: the alert table and the actions).
        marks: where the kernel-log records taken are kept (the store): none of those it holds is taken
            again; None: kept in memory only.
    """

    def __init__(self, engine: HealthEngine, state: Any, handle: Callable[[list[AlertEvent], float], None],
                 marks: KmsgMarks | None = None) -> None:
        self.engine = engine
        self.state = state
        self.handle = handle
        self.marks = marks
        if marks is not None:
            engine.kmsg_seq.update(marks.load())

    def on_health(self, node: str, batch: Any, now: float) -> None:
        events: list[AlertEvent] = []
        st = self.state
        for e in batch.health_events:
            pid = e.pid if e.HasField("pid") else None
            users = node_users(st, node, hit_at=e.time) if e.kind == "sxid" else \
                gpu_users(st, node, e.uuid, pid, hit_at=e.time)
            events += self.engine.observe_event(node, e, users)
        for c in batch.gpu_health:
            events += self.engine.observe_counters(node, c, gpu_users(st, node, c.uuid))
        if batch.fabric_ports:
            users = node_users(st, node)
            for fp in batch.fabric_ports:
                events += self.engine.observe_port(node, fp, users)
        if self.marks is not None:
            # saved before the alerts are handled: their actions (a drain) must never run twice for one record
            taken = {(node, e.kernel_boot_id) for e in batch.health_events if e.source == 2 and e.kernel_boot_id}
            if taken:
                self.marks.save({key: self.engine.kmsg_seq[key] for key in taken if key in self.engine.kmsg_seq})
        if events:
            self.handle(events, now)

    def on_samples(self, node: str, touched: list, now: float) -> None:
        pass

    def on_provenance(self, job: Any, now: float) -> None:
        pass

    def on_job_closed(self, job: Any, now: float) -> None:
        pass

    def on_tick(self, now: float) -> None:
        pass

    def health_rows(self, node: str = "") -> list:
        """`clusterwatch health`'s rows: each GPU with findings, an XID, a loss or trouble in its counters (a
        query GpuHealthRow), worst first; only `node`'s when given. The caller holds the core's lock."""
        from .metrics import CLOCK_EVENT_REASONS, RECOVERY_ACTIONS

        engine = self.engine
        keys = set(engine.gpus) | {(n, u) for n, u, _ in engine.xid_counts} | set(engine.recovery)
        rows = []
        for key in sorted(k for k in keys if not node or k[0] == node):
            n, uuid = key
            view = engine.gpus.get(key)
            row = query_pb2.GpuHealthRow(node=n, gpu=uuid, lost=bool(view and view.lost))
            index = gpu_index(self.state, n, uuid)
            if index is not None:
                row.index = index
            findings = engine.findings([key])
            for t, f in findings:
                row.findings.append(_health_view(t, f))
                for job_id in f.labels.get("job_id", "").split(","):
                    if job_id and job_id not in row.jobs:
                        row.jobs.append(job_id)
            if findings:
                row.severity = findings[0][1].severity
            counts = sorted(((x, c) for (gn, gu, x), c in engine.xid_counts.items() if (gn, gu) == key),
                            key=lambda xc: (-xc[1], xc[0]))
            row.xids.extend(query_pb2.XidCount(xid=x, count=c) for x, c in counts)
            if key in engine.recovery and engine.recovery[key]:
                row.recovery_action = RECOVERY_ACTIONS.get(engine.recovery[key], str(engine.recovery[key]))
            msg = view.counters if view is not None else None
            if msg is not None:
                if msg.HasField("temperature_c"):
                    row.temperature_c = msg.temperature_c
                if msg.HasField("ecc_uncorrected_volatile"):
                    row.ecc_uncorrected_volatile = msg.ecc_uncorrected_volatile
                if msg.HasField("clock_event_reasons"):
                    row.throttle_reasons.extend(name for bit, name in CLOCK_EVENT_REASONS.items()
                                                if msg.clock_event_reasons & bit and bit in THROTTLE_REASONS)
            trouble = (row.findings or row.lost or row.xids or row.recovery_action or row.throttle_reasons
                       or row.ecc_uncorrected_volatile)
            if trouble:
                rows.append(row)
        order = {"critical": 0, "warning": 1, "info": 2, "": 3}
        rows.sort(key=lambda r: (order.get(r.severity, 3), not r.lost, r.node,
                                 r.index if r.HasField("index") else 1 << 30, r.gpu))
        return rows

    def node_rows(self, node: str = "") -> list:
        """`clusterwatch health`'s node rows: each node whose fabric has findings (a query NodeHealthRow), worst
        first, with its ports as last read; only `node`'s when given. The caller holds the core's lock."""
        from .fabric import STATE_NAMES

        fabric = self.engine.fabric
        rows = []
        for n in sorted(k for k in fabric.findings if not node or k == node):
            row = query_pb2.NodeHealthRow(node=n)
            for t, f in fabric.node_findings([n]):
                row.findings.append(_health_view(t, f))
                for job_id in f.labels.get("job_id", "").split(","):
                    if job_id and job_id not in row.jobs:
                        row.jobs.append(job_id)
            if row.findings:
                row.severity = row.findings[0].severity
            for (pn, port), v in sorted(fabric.ports.items()):
                if pn != n or v.last is None:
                    continue
                view = row.ports.add(port=port, state=STATE_NAMES.get(v.last.state or 0, ""), link_layer=v.link_layer)
                if v.last.rate_gbps is not None:
                    view.rate_gbps = v.last.rate_gbps
                if v.highest_gbps is not None:
                    view.highest_rate_gbps = v.highest_gbps
                view.counters.update(v.last.counters)
            rows.append(row)
        order = {"critical": 0, "warning": 1, "info": 2, "": 3}
        rows.sort(key=lambda r: (order.get(r.severity, 3), r.node))
        return rows

    def job_health(self, job: Any) -> list:
        """The job's health findings as query HealthViews: on its GPUs (the whole GPU of a MIG instance too),
        since it started, and those from before that still hold (a GPU's uncorrected ECC errors, its loss, its
        throttling), worst first."""
        # those allocated to it, and those its processes used (a job outside Slurm's GPU allocation has only these)
        gpus = [(g.node, g.uuid) for g in self.state.job_gpus(job)]
        out = []
        for t, f in self.engine.findings(sorted(with_parents(self.state, gpus)), since=job.start_time or 0.0,
                                          standing=True):
            out.append(_health_view(t, f))
        # the fabric of its nodes, since it started, and what still holds from before
        for t, f in self.engine.fabric.node_findings(job_nodes(self.state, job), since=job.start_time or 0.0,
                                                     standing=True):
            out.append(_health_view(t, f))
        return out


def _health_view(t: float, f: Any):
    """A finding as a query HealthView."""
    view = query_pb2.HealthView(time=t, rule=f.rule, severity=f.severity, node=f.node, gpu=f.uuid,
                                description=f.description, advice=f.advice, action=f.action)
    rank = f.labels.get("rank", "")
    if rank and "," not in rank:
        view.rank = int(rank)
    if f.labels.get("pid"):
        view.pid = int(f.labels["pid"])
    return view
