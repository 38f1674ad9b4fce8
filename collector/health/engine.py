"""The health rules over the stream's health records: HealthEvent / GpuHealth in, AlertEvents out.

Pure like the rules engine (time comes from the records, who uses a GPU from the caller): it
drops what it has seen (a kernel-log record a restarted agent reads again, the same XID from NVML
and the kernel log), decides with `decisions`, and keeps, per GPU, what `status` shows: the
findings worst first and the latest counters, and, for `record` (collector/traces/record.py), a bounded
history of the events it took and the counter readings (`HISTORY_EVENTS`, `HISTORY_READINGS`).

XID 79 raises gpu_lost (not also gpu_xid: one fault, one alert). An XID or a lost GPU is an
event, not a condition: its alert fires and stays until the job it names ends (the collector
resolves a job's alerts then).

The node's fabric (its InfiniBand / RoCE ports, its NVSwitches' SXIDs) is kept by `fabric` (fabric.py): a
finding there is the node's, raised as an alert only while a job runs on the node (it names them all).
"""
from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterwatch.collector.health.decisions import (
    LOST_XIDS,
    GpuUser,
    HealthFinding,
    LinkCounts,
    LinkErrorRule,
    MemoryCounters,
    MemoryErrorThresholds,
    ThrottleRule,
    gpu_link_errors,
    gpu_lost,
    gpu_memory_errors,
    gpu_throttle,
    gpu_xid,
    nvlink_down,
    worst_first,
)
from clusterwatch.collector.health.fabric import FabricHealth
from clusterwatch.collector.health.violation_history import ViolationHistory
from clusterwatch.collector.health.xid_catalog import XidCatalog
from clusterwatch.collector.rules.model import FIRING, AlertEvent

__all__ = ["HealthEngine", "GpuHealthView", "HEALTH_RULES", "HISTORY_EVENTS", "HISTORY_READINGS"]

HEALTH_RULES = ("gpu_xid", "gpu_lost", "gpu_memory_errors", "gpu_throttle", "gpu_link_errors")
_KEEP_FINDINGS = 20        # per GPU, for status
_EVENT_KINDS_LOST = frozenset({"gpu_unavailable", "gpu_lost"})   # NVML's event; the agent's counters reader
_MEMORY = MemoryErrorThresholds()
# What `record` can write of a GPU (collector/traces/record.py), per GPU: the events taken (not the duplicates
# dropped), and the counter readings: 140 are 70 min at the agent's 30 s default, the hour of process
# history the collector keeps (720 points at 5 s) and the throttle rule's 10 min look-back before it.
# Kept serialized (a message taken from a batch would hold the whole batch), the rules' counters and the
# temperature, a reading like the one before sharing its bytes; the link error counters apart, at their changes
# only (a healthy GPU's stand still while its temperature moves), and the violation time job_slowdown's culprit
# reads as rows of floats (violation_history.py): bench/bench_health_history.py measures it.
HISTORY_EVENTS = 64
HISTORY_READINGS = 140
_NOT_KEPT = ("time", "uuid", "violation_seconds", "nvlink_errors", "pcie_replays")
_THROTTLE = ThrottleRule()
_LINKS = LinkErrorRule()


@dataclass(slots=True)
class GpuHealthView:
    """What the collector holds about one GPU's health."""

    findings: list[tuple[float, HealthFinding]] = field(default_factory=list)   # (time, finding), newest last
    counters: Any = None                  # the latest GpuHealth message
    reasons: list[tuple[float, int]] = field(default_factory=list)   # (time, clock event reasons) in the window
    memory_signature: str = ""            # what gpu_memory_errors last said (so it says it once)
    throttling: bool = False
    links: LinkCounts | None = None       # the link error counters at the last reading that gave any
    link_errors: bool = False
    lost: bool = False                    # gpu_lost said; again only once the GPU has answered since
    lost_at: float = 0.0                  # when it was lost: a reading from before says nothing of it
    # for `record`, oldest first: (time, serialized HealthEvent, the GPU users it was given: whom it named);
    # the counter readings' times and bodies (a GpuHealth without time and uuid, see _NOT_KEPT), two deques: a
    # tuple each costs 56 bytes
    events: deque[tuple[float, bytes, tuple[GpuUser, ...]]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_EVENTS))
    reading_times: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_READINGS))
    readings: deque[bytes] = field(default_factory=lambda: deque(maxlen=HISTORY_READINGS))
    # the link error counters (pcie_replays, nvlink_errors: a serialized GpuHealth of those alone) from each
    # time they changed: a reading's are the last change's at or before it; the violation time likewise
    link_times: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_READINGS))
    link_values: deque[bytes] = field(default_factory=lambda: deque(maxlen=HISTORY_READINGS))
    violations: ViolationHistory = field(default_factory=lambda: ViolationHistory(HISTORY_READINGS))
    # (time, users) of the readings that raised a finding naming users (throttling, memory errors, a link): a
    # replay names whom the collector named then, not whom the trace's process lines suggest
    named: deque[tuple[float, tuple[GpuUser, ...]]] = field(default_factory=lambda: deque(maxlen=HISTORY_READINGS))

    def keep_reading(self, msg: Any) -> None:
        """Keep a GpuHealth reading for `record`."""
        body = type(msg)()
        body.CopyFrom(msg)
        for name in _NOT_KEPT:
            body.ClearField(name)
        data = body.SerializeToString()
        if self.readings and self.readings[-1] == data:
            data = self.readings[-1]      # counters mostly stand still: one bytes object for a run of them
        self.reading_times.append(msg.time)
        self.readings.append(data)
        links = type(msg)()
        if msg.HasField("pcie_replays"):
            links.pcie_replays = msg.pcie_replays
        links.nvlink_errors.update(msg.nvlink_errors)
        self.violations.add(msg.time, msg.violation_seconds)
        at = links.SerializeToString(deterministic=True)
        if not self.link_values or self.link_values[-1] != at:
            self.link_times.append(msg.time)
            self.link_values.append(at)

    def history_readings(self) -> list[tuple[float, bytes]]:
        """(time, reading body) of the readings kept, oldest first, each with its link error counters (a
        protobuf message's bytes followed by another's parse as the two merged)."""
        from clusterwatch.v1.agent_pb2 import GpuHealth

        times, values = list(self.link_times), list(self.link_values)
        out = []
        for t, body in zip(self.reading_times, self.readings, strict=True):
            i = bisect.bisect_right(times, t)
            held = self.violations.at(t)
            out.append((t, (body + values[i - 1] if i else body)
                        + (GpuHealth(violation_seconds=held).SerializeToString() if held else b"")))
        return out


def _standing(v: GpuHealthView) -> list[HealthFinding]:
    """A GPU's findings that still hold, each the latest of its rule: its memory errors while its counters
    still say them, its loss until it answers again, its throttling while it lasts. An XID is a moment: none."""
    holds = {"gpu_memory_errors": bool(v.memory_signature), "gpu_lost": v.lost, "gpu_throttle": v.throttling,
             "gpu_link_errors": v.link_errors}
    out: list[HealthFinding] = []
    seen: set[str] = set()
    for _, f in reversed(v.findings):
        if holds.get(f.rule) and f.rule not in seen:
            seen.add(f.rule)
            if f.rule != "gpu_memory_errors" or f.description.split(" (in use by")[0] == v.memory_signature:
                out.append(f)
    return out


class HealthEngine:
    """Health records of every node in, alert events out.

    Args:
        catalog: the XID catalog.
        memory: gpu_memory_errors thresholds.
        throttle: the gpu_throttle rule.
        links: the gpu_link_errors thresholds.
        same_xid_s: the same XID on the same GPU within this many seconds, from NVML and the
            kernel log, is one event (the kernel log's, which names the process, is kept).
    """

    def __init__(self, catalog: XidCatalog, *, memory: MemoryErrorThresholds = _MEMORY,
                 throttle: ThrottleRule = _THROTTLE, links: LinkErrorRule = _LINKS,
                 same_xid_s: float = 30.0) -> None:
        self.catalog = catalog
        self.memory = memory
        self.throttle = throttle
        self.links = links
        self.same_xid_s = same_xid_s
        self.gpus: dict[tuple[str, str], GpuHealthView] = {}
        self.kmsg_seq: dict[tuple[str, str], int] = {}         # (node, kernel boot id) → last record number
        self._last_xid: dict[tuple[str, str, int], tuple[float, bool]] = {}   # → (time, named a pid)
        self.duplicates = 0
        self.xid_counts: dict[tuple[str, str, int], int] = {}    # (node, UUID, XID) → events, duplicates not counted
        self.event_counts: dict[tuple[str, str, str], int] = {}  # (node, UUID, kind) → NVML events other than XIDs
        self.recovery: dict[tuple[str, str], int] = {}  # (node, UUID) → the last recovery action NVML asked for
        self.fabric = FabricHealth()

    def view(self, node: str, uuid: str) -> GpuHealthView:
        key = (node, uuid)
        v = self.gpus.get(key)
        if v is None:
            v = self.gpus[key] = GpuHealthView()
        return v

    def findings(self, gpus: Sequence[tuple[str, str]], since: float = 0.0,
                 standing: bool = False) -> list[tuple[float, HealthFinding]]:
        """The findings on these (node, UUID) GPUs since `since`, worst first. With `standing`, also those from
        before `since` that still hold (`_standing`): a job that starts on a GPU known bad is told so."""
        got = []
        for key in gpus:
            v = self.gpus.get(key)
            if v is None:
                continue
            held = _standing(v) if standing else ()
            got += [(t, f) for t, f in v.findings if t >= since or any(f is h for h in held)]
        order = {id(f): i for i, f in enumerate(worst_first([f for _, f in got]))}
        return sorted(got, key=lambda tf: order[id(tf[1])])

    # -- events ------------------------------------------------------------------------------------

    def _seen(self, node: str, msg: Any) -> bool:
        if msg.source == 2 and msg.kernel_boot_id:      # KMSG: record numbers rise within a boot
            key = (node, msg.kernel_boot_id)
            if msg.kmsg_seq <= self.kmsg_seq.get(key, -1):
                return True
            self.kmsg_seq[key] = msg.kmsg_seq
        if msg.kind == "xid" and msg.HasField("xid"):
            key3 = (node, msg.uuid, msg.xid)
            named = msg.HasField("pid")
            last = self._last_xid.get(key3)
            self._last_xid[key3] = (msg.time, named or bool(last and last[1]))
            if last is not None and abs(msg.time - last[0]) < self.same_xid_s and (last[1] or not named):
                return True
        return False

    def observe_event(self, node: str, msg: Any, users: Sequence[GpuUser]) -> list[AlertEvent]:
        """One HealthEvent of `node`; `users` are the processes on its GPU (any job, any rank)."""
        if self._seen(node, msg):
            self.duplicates += 1
            return []
        if msg.kind == "sxid":
            return self._node_alert(msg.time, self.fabric.observe_sxid(node, msg, users), users)
        uuid = msg.uuid or (f"PCI:{msg.pci}" if msg.pci else "unknown GPU")
        pid = msg.pid if msg.HasField("pid") else None
        self._count(node, uuid, msg)
        v = self.view(node, uuid)
        named = tuple(users)
        if v.events and v.events[-1][2] == named:
            named = v.events[-1][2]   # the users of the event before (the same processes hit): one tuple for a run
        v.events.append((msg.time, msg.SerializeToString(), named))
        finding: HealthFinding | None = None
        if msg.kind == "xid" and msg.HasField("xid"):
            if msg.xid in LOST_XIDS:
                finding = gpu_lost(node=node, uuid=uuid, xid=msg.xid, users=users)
            else:
                finding = gpu_xid(self.catalog, node=node, uuid=uuid, xid=msg.xid, pid=pid,
                                  process=msg.process or None, users=users)
        elif msg.kind in _EVENT_KINDS_LOST:
            finding = gpu_lost(node=node, uuid=uuid, nvml_lost=True, users=users)
        elif msg.kind == "ecc_double_bit":
            # the event says one happened; the counters, read later, say how many
            one = MemoryCounters(ecc_uncorrected_volatile=max(1, self.memory.uncorrected_volatile))
            finding = gpu_memory_errors(one, node=node, uuid=uuid, thresholds=self.memory, users=users)
        elif msg.kind == "nvlink_down":
            # the agent's counters reader: an NVLink that was active reads inactive (data: the link)
            finding = nvlink_down(node=node, uuid=uuid, link=int(msg.data), users=users)
        if finding is None:
            return []
        if finding.rule == "gpu_xid" and self.catalog.lookup(msg.xid).application and "job_id" not in finding.labels:
            # an application's own fault, of no job's process here (one that has ended, or from
            # before the agent started): kept for the GPU's record, not raised
            self._keep(node, uuid, msg.time, finding)
            return []
        if finding.rule == "gpu_lost":
            v = self.view(node, uuid)
            if v.lost:        # the driver's XID 79, NVML's event and the failed reads: one loss
                self.duplicates += 1
                return []
            v.lost, v.lost_at = True, msg.time
        return [self._fire(node, uuid, msg.time, finding, users, pid)]

    def _count(self, node: str, uuid: str, msg: Any) -> None:
        """What /metrics says of the event (collector/health/metrics.py): XIDs by code, other kinds by name."""
        if msg.kind == "xid" and msg.HasField("xid"):
            key = (node, uuid, msg.xid)
            self.xid_counts[key] = self.xid_counts.get(key, 0) + 1
        elif msg.kind:
            kind = (node, uuid, msg.kind)
            self.event_counts[kind] = self.event_counts.get(kind, 0) + 1
            if msg.kind == "recovery_action":
                self.recovery[(node, uuid)] = int(msg.data)

    def lost(self, node: str, uuid: str, t: float, users: Sequence[GpuUser]) -> list[AlertEvent]:
        """The GPU source found the GPU lost (NVML GPU_IS_LOST)."""
        v = self.view(node, uuid)
        if v.lost:
            return []
        v.lost, v.lost_at = True, t
        finding = gpu_lost(node=node, uuid=uuid, nvml_lost=True, users=users)
        return [self._fire(node, uuid, t, finding, users, None)] if finding else []

    # -- counters ----------------------------------------------------------------------------------

    def observe_counters(self, node: str, msg: Any, users: Sequence[GpuUser]) -> list[AlertEvent]:
        """One GpuHealth of `node`: memory errors over thresholds, throttling of a GPU a job uses, a degraded
        PCIe or NVLink link (its error counters rising since the last reading that gave them)."""
        v = self.view(node, msg.uuid)
        # a copy: a message taken from a batch holds the whole batch's memory for as long as it is held
        v.counters = type(msg)()
        v.counters.CopyFrom(msg)
        v.keep_reading(msg)
        if msg.time > v.lost_at:
            # it answers again (a reset, a reboot); a reading taken before the loss (one batch holds both, and
            # its events are taken first) does not say so
            v.lost = False
        out = []

        def opt(name: str) -> Any:
            return getattr(msg, name) if msg.HasField(name) else None

        counters = MemoryCounters(
            ecc_uncorrected_volatile=opt("ecc_uncorrected_volatile"),
            ecc_uncorrected_aggregate=opt("ecc_uncorrected_aggregate"),
            remapped_rows_pending=opt("remapped_rows_pending"), remapped_rows_failure=opt("remapped_rows_failure"),
            retired_pages_sbe=opt("retired_pages_sbe"), retired_pages_dbe=opt("retired_pages_dbe"))
        memory = gpu_memory_errors(counters, node=node, uuid=msg.uuid, thresholds=self.memory, users=users)
        signature = memory.description.split(" (in use by")[0] if memory else ""
        if memory is not None and signature != v.memory_signature:
            out.append(self._fire(node, msg.uuid, msg.time, memory, users, None))
        v.memory_signature = signature
        reasons = opt("clock_event_reasons")
        if reasons is not None:
            v.reasons.append((msg.time, int(reasons)))
            cut = msg.time - 2 * self.throttle.window_s
            v.reasons = [(t, m) for t, m in v.reasons if t >= cut]
            throttled = gpu_throttle(self.throttle, v.reasons, msg.time, node=node, uuid=msg.uuid, users=users)
            if throttled is not None and not v.throttling:
                out.append(self._fire(node, msg.uuid, msg.time, throttled, users, None))
            v.throttling = throttled is not None
        if msg.HasField("pcie_replays") or msg.nvlink_errors:
            links = LinkCounts(msg.time, opt("pcie_replays"), dict(msg.nvlink_errors))
            if v.links is not None:
                degraded = gpu_link_errors(self.links, v.links, links, node=node, uuid=msg.uuid, users=users)
                if degraded is not None and not v.link_errors:
                    out.append(self._fire(node, msg.uuid, msg.time, degraded, users, None))
                v.link_errors = degraded is not None
            v.links = links
        if out and users:
            v.named.append((msg.time, tuple(users)))
        return out

    def observe_port(self, node: str, msg: Any, users: Sequence[GpuUser]) -> list[AlertEvent]:
        """One FabricPort of `node`; `users` are every job's processes on the node."""
        finding = self.fabric.observe_port(node, msg, users)
        return self._node_alert(msg.time, finding, users) if finding is not None else []

    # -- output ------------------------------------------------------------------------------------

    def _node_alert(self, t: float, f: HealthFinding, users: Sequence[GpuUser]) -> list[AlertEvent]:
        """A fabric finding as an alert, on the node's first job; none while no job runs there (the finding is
        kept, for `health` and /metrics, and for the next job on the node)."""
        if not users:
            return []
        figures: dict[str, Any] = {"advice": f.advice, "action": f.action}
        figures.update({k: v for k, v in f.labels.items() if k != "job_id"})
        return [AlertEvent(t=t, rule=f.rule, state=FIRING, severity=f.severity, node=f.node, job_id=users[0].job_id,
                           pid=-1, start_time=0.0, gpu="", rank=None, description=f.description, figures=figures)]

    def _keep(self, node: str, uuid: str, t: float, f: HealthFinding) -> None:
        v = self.view(node, uuid)
        v.findings = (v.findings + [(t, f)])[-_KEEP_FINDINGS:]

    def _fire(self, node: str, uuid: str, t: float, f: HealthFinding, users: Sequence[GpuUser],
              pid: int | None) -> AlertEvent:
        self._keep(node, uuid, t, f)
        own = next((u for u in users if pid is not None and u.pid == pid), None)
        hit = own or (users[0] if users and f.labels.get("job_id") else None)
        figures: dict[str, Any] = {"advice": f.advice, "action": f.action}
        figures.update({k: v for k, v in f.labels.items() if k not in ("job_id", "rank")})
        return AlertEvent(t=t, rule=f.rule, state=FIRING, severity=f.severity, node=node,
                          job_id=hit.job_id if hit else "", pid=own.pid if own else -1,
                          start_time=own.start_time if own else 0.0, gpu=uuid,
                          rank=hit.rank if hit else None, description=f.description, figures=figures)
