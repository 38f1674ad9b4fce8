"""The health rules' decisions, as pure functions: gpu_xid, gpu_lost, gpu_memory_errors, gpu_throttle.

No clock, no I/O, no state: each takes what the collector knows about one GPU (its events, its
counters, who uses it) and returns a HealthFinding or None, so the rules engine can call them
from `evaluate(history, now)` and `clusterwatch replay` runs the same decisions.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from clusterwatch.collector.health.xid_catalog import XidCatalog

__all__ = ["GpuUser", "HealthFinding", "MemoryCounters", "MemoryErrorThresholds", "ThrottleRule",
           "gpu_xid", "gpu_lost", "gpu_memory_errors", "gpu_throttle", "nvlink_down", "throttle_share", "worst_first",
           "LOST_XIDS", "THROTTLE_REASONS"]

LOST_XIDS = frozenset({79})    # "GPU has fallen off the bus"
# nvmlClocksEventReason* bits that slow a GPU for reasons of its own health (not the power cap
# a busy GPU sits at, nor idle or application clocks)
THROTTLE_REASONS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                    0x80: "hardware power brake"}
_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True, slots=True)
class GpuUser:
    """A process of a job on the GPU, as the collector has it."""

    job_id: str
    rank: int | None = None
    pid: int | None = None
    process: str | None = None
    start_time: float = 0.0       # with node and pid, the process's identity


@dataclass(frozen=True, slots=True)
class HealthFinding:
    rule: str                 # gpu_xid, gpu_lost, gpu_memory_errors, gpu_throttle, gpu_link_errors
    severity: str             # info, warning, critical
    node: str
    uuid: str
    description: str          # one line for people
    advice: str
    action: str = "none"      # the catalog's action (none, restart_app, reset_gpu, reboot_node, drain)
    labels: dict[str, str] = field(default_factory=dict)


def _jobs(users: Sequence[GpuUser]) -> str:
    """'job 12 rank 0, job 12 rank 1' for the users, each (job, rank) once."""
    parts: list[str] = []
    for u in users:
        text = f"job {u.job_id}" + (f" rank {u.rank}" if u.rank is not None else "")
        if text not in parts:
            parts.append(text)
    return ", ".join(parts)


def _labels(base: dict[str, str], hit: list[GpuUser]) -> dict[str, str]:
    jobs = sorted({u.job_id for u in hit})
    ranks = sorted({u.rank for u in hit if u.rank is not None})
    if jobs:
        base["job_id"] = ",".join(jobs)
    if ranks:
        base["rank"] = ",".join(str(r) for r in ranks)
    return base


def gpu_xid(catalog: XidCatalog, *, node: str, uuid: str, xid: int, pid: int | None = None,
            process: str | None = None, users: Sequence[GpuUser] = ()) -> HealthFinding:
    """An XID on a GPU: the catalog's severity and advice, naming the process and the jobs it hit.

    An application's XID names the process the driver named (and its job and rank where the
    collector knows the pid); a hardware XID names every job on the GPU.
    """
    entry = catalog.lookup(xid)
    own = [u for u in users if pid is not None and u.pid == pid]
    named = f"process {process or (own[0].process if own and own[0].process else '?')} (pid {pid})" \
        if pid is not None else ""
    if entry.application and pid is not None:
        hit = own
        who = named + (" of " + _jobs(own) if own else "")
    else:
        hit = list(users)
        parts = [named] if named else []
        if hit:
            parts.append(("on the GPU: " if named else "") + _jobs(hit))
        who = "; ".join(parts)
    description = f"XID {xid} ({entry.name}) on GPU {uuid} of {node}" + (f": {who}" if who else "")
    labels = {"xid": str(xid), "action": entry.action}
    if pid is not None:
        labels["pid"] = str(pid)
    return HealthFinding(rule="gpu_xid", severity=entry.severity, node=node, uuid=uuid, description=description,
                         advice=entry.advice, action=entry.action, labels=_labels(labels, hit))


def gpu_lost(*, node: str, uuid: str, xid: int | None = None, nvml_lost: bool = False,
             users: Sequence[GpuUser] = ()) -> HealthFinding | None:
    """A GPU fell off the bus: XID 79, or NVML answering GPU_IS_LOST; None otherwise."""
    if not nvml_lost and xid not in LOST_XIDS:
        return None
    hit, who = list(users), _jobs(users)
    how = f"XID {xid}" if xid in LOST_XIDS else "NVML: GPU is lost"
    description = f"GPU {uuid} of {node} fell off the bus ({how})" + (f"; it held {who}" if who else "")
    return HealthFinding(rule="gpu_lost", severity="critical", node=node, uuid=uuid, description=description,
                         advice="Every process on the GPU is lost. Drain the node and reboot it; RMA if it recurs.",
                         action="drain", labels=_labels({"cause": "xid" if xid in LOST_XIDS else "nvml"}, hit))


@dataclass(frozen=True, slots=True)
class MemoryCounters:
    """The memory-health counters of one GPU at one read (None: not known)."""

    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryErrorThresholds:
    uncorrected_volatile: int = 1      # uncorrected ECC errors since the last driver load or reset
    retired_pages: int = 60            # single- plus double-bit retired pages (a site sets its own)
    remap_pending: bool = True         # a row waits for a GPU reset to be remapped
    remap_failure: bool = True         # a row could not be remapped


def gpu_memory_errors(counters: MemoryCounters, *, node: str, uuid: str,
                      thresholds: MemoryErrorThresholds = MemoryErrorThresholds(),
                      users: Sequence[GpuUser] = ()) -> HealthFinding | None:
    """Uncorrected ECC errors, remapped rows pending or failed, retired pages over the threshold."""
    reasons = []
    critical = False
    uncorrected = counters.ecc_uncorrected_volatile
    if uncorrected is not None and uncorrected >= thresholds.uncorrected_volatile:
        reasons.append(f"{uncorrected} uncorrected ECC errors since the last reset")
        critical = True
    if thresholds.remap_failure and counters.remapped_rows_failure:
        reasons.append("a memory row could not be remapped")
        critical = True
    if thresholds.remap_pending and counters.remapped_rows_pending:
        reasons.append("a remapped row waits for a GPU reset")
    retired = (counters.retired_pages_sbe or 0) + (counters.retired_pages_dbe or 0)
    if (counters.retired_pages_sbe is not None or counters.retired_pages_dbe is not None) \
            and retired >= thresholds.retired_pages:
        reasons.append(f"{retired} retired pages")
        critical = True
    if not reasons:
        return None
    hit, who = list(users), _jobs(users)
    description = f"GPU {uuid} of {node}: " + "; ".join(reasons) + (f" (in use by {who})" if who else "")
    advice = ("Drain the node and reset the GPU; RMA if it recurs." if critical
              else "Reset the GPU when its jobs end, so the row is remapped.")
    return HealthFinding(rule="gpu_memory_errors", severity="critical" if critical else "warning", node=node,
                         uuid=uuid, description=description, advice=advice,
                         action="drain" if critical else "reset_gpu", labels=_labels({}, hit))


@dataclass(frozen=True, slots=True)
class ThrottleRule:
    window_s: float = 300.0            # how long the GPU must have been watched
    min_share: float = 0.5             # the share of that time spent throttled
    reasons: int = sum(THROTTLE_REASONS)


def throttle_share(samples: Sequence[tuple[float, int]], start: float, end: float,
                   reasons: int = sum(THROTTLE_REASONS)) -> tuple[float, float, int]:
    """The share of [start, end] a GPU spent throttled, from its clock-event-reason readings.

    Each reading (time, mask) holds until the next (the last until `end`); time before the
    first reading is not covered. Returns (share of the covered time, covered seconds, the
    reason bits seen).
    """
    points = sorted((t, m) for t, m in samples if t <= end)
    covered = throttled = 0.0
    seen = 0
    for i, (t, mask) in enumerate(points):
        nxt = points[i + 1][0] if i + 1 < len(points) else end
        lo, hi = max(t, start), min(nxt, end)
        if hi <= lo:
            continue
        covered += hi - lo
        if mask & reasons:
            throttled += hi - lo
            seen |= mask & reasons
    return (throttled / covered if covered else 0.0), covered, seen


def gpu_throttle(rule: ThrottleRule, samples: Sequence[tuple[float, int]], now: float, *, node: str, uuid: str,
                 users: Sequence[GpuUser] = ()) -> HealthFinding | None:
    """A GPU of a running job held down by hardware slowdown, thermal or power-brake throttling.

    Fires when the GPU was watched for the whole window and spent at least `min_share` of it
    throttled; only for a GPU some job uses (an idle GPU's clocks cost no one anything).
    """
    if not users:
        return None
    share, covered, seen = throttle_share(samples, now - rule.window_s, now, rule.reasons)
    if covered < rule.window_s * 0.999 or share < rule.min_share:
        return None
    hit, who = list(users), _jobs(users)
    why = ", ".join(name for bit, name in THROTTLE_REASONS.items() if seen & bit)
    description = (f"GPU {uuid} of {node} throttled {share:.0%} of the last {rule.window_s / 60:g} min ({why}); "
                   f"it holds {who}: this rank is the straggler")
    return HealthFinding(rule="gpu_throttle", severity="warning", node=node, uuid=uuid, description=description,
                         advice="Check the GPU's cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE); "
                                "move the job off it if it persists.",
                         labels=_labels({"share": f"{share:.2f}"}, hit))


@dataclass(frozen=True, slots=True)
class LinkErrorRule:
    """gpu_link_errors' thresholds, from DCGM's hardware limits (dcgm_gpu_hardware_limits.h): PCIe replays past
    8 a minute, NVLink replay and recovery errors past 1 between two readings, NVLink CRC errors at 100 a second
    or more (fewer are noise the link corrects)."""

    pcie_replays_per_min: float = 8.0
    nvlink_errors: int = 1
    nvlink_crc_per_s: float = 100.0


@dataclass(frozen=True, slots=True)
class LinkCounts:
    """A GPU's link error counters at one reading: PCIe replays, and NVLink's (NVLINK_COUNTERS' names, summed
    over its links); None, {} where the GPU gives none."""

    time: float
    pcie_replays: int | None
    nvlink: dict[str, int]


def nvlink_down(*, node: str, uuid: str, link: int, users: Sequence[GpuUser] = ()) -> HealthFinding:
    """An NVLink of the GPU that was active reads inactive (the agent's counters reader): a gpu_link_errors
    finding, critical (the prolog's gate keeps jobs off the node while it lasts)."""
    hit = list(users)
    who = f"; it holds {_jobs(users)}" if users else ""
    description = f"GPU {uuid} of {node}: NVLink {link} is down{who}"
    return HealthFinding(rule="gpu_link_errors", severity="critical", node=node, uuid=uuid, description=description,
                         advice="Check the link (nvidia-smi nvlink -s; the NVSwitch's SXIDs) and reset the GPU or "
                                "reboot the node; drain it if the link stays down.",
                         action="drain", labels=_labels({"nvlink": str(link), "cause": "nvlink_down"}, hit))


def gpu_link_errors(rule: LinkErrorRule, before: LinkCounts, after: LinkCounts, *, node: str, uuid: str,
                    users: Sequence[GpuUser] = ()) -> HealthFinding | None:
    """A GPU whose PCIe or NVLink link keeps correcting errors between two readings: a degraded link. Each
    collective the GPU is in waits on it, so its rank is the job's straggler. A counter that went down (a
    reset) says nothing."""
    dt = after.time - before.time
    if not dt > 0:
        return None

    def rise(a: int | None, b: int | None) -> int:
        return b - a if a is not None and b is not None and b >= a else 0

    said = []
    replays = rise(before.pcie_replays, after.pcie_replays)
    if replays * 60.0 / dt > rule.pcie_replays_per_min:
        said.append(f"{replays} PCIe replays")
    errors = sum(rise(before.nvlink.get(k), after.nvlink.get(k)) for k in ("replay", "recovery"))
    if errors > rule.nvlink_errors:
        said.append(f"{errors} NVLink replay and recovery errors")
    crc = sum(rise(before.nvlink.get(k), after.nvlink.get(k)) for k in ("crc_flit", "crc_data"))
    if crc / dt >= rule.nvlink_crc_per_s:
        said.append(f"{crc} NVLink CRC errors")
    if not said:
        return None
    hit = list(users)
    who = f"; it holds {_jobs(users)}: that rank is the straggler of every collective" if users else ""
    description = f"GPU {uuid} of {node}: {', '.join(said)} in {dt:.0f} s, a degraded link{who}"
    return HealthFinding(rule="gpu_link_errors", severity="warning", node=node, uuid=uuid, description=description,
                         advice="Check the link (nvidia-smi nvlink -e; the PCIe slot and riser) and run the GPU's "
                                "diagnostics (dcgmi diag -r 3); move the job off the node if it recurs.",
                         labels=_labels({}, hit))


def worst_first(findings: Sequence[HealthFinding]) -> list[HealthFinding]:
    """Findings ordered for people: critical first, then by rule and GPU."""
    return sorted(findings, key=lambda f: (-_SEVERITY_RANK.get(f.severity, 0), f.rule, f.node, f.uuid))
