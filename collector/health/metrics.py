"""The GPU health families of /metrics: XIDs by code, other NVML events, the recovery action NVML asks for,
memory errors, clock-event reasons, temperature, loss; and the node's fabric (collector/health/fabric.py): its
InfiniBand / RoCE ports (labels node, port (DEVICE/N)) and its NVSwitches' SXIDs.

Per GPU (labels node, gpu (UUID), index), never per process: a health signal is the GPU's, and its job is
on the GPU's other series (clusterwatch_gpu_memory_used_bytes' job_id). At each scrape the HealthEngine's
per-GPU figures are copied under the core's lock (`health_snapshot`) and the rows or text built outside it
(`HealthFamilies`), as the exporter does its own families. A figure the GPU does not report (NVML
NOT_SUPPORTED: the agent sends no field) has no series, so `absent()` tells "not supported" from 0. The
collector's --gpu-health-metrics picks the basic set or the full one. deploy/prometheus/alerts.yml alerts on
them; docs/health.md lists them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from clusterwatch.collector.export import Family, TextWriter, family, format_value, label_string
from clusterwatch.collector.health.decisions import THROTTLE_REASONS

__all__ = ["HEALTH_FAMILIES", "CLOCK_EVENT_REASONS", "HealthFamilies", "HealthSnapshot", "health_snapshot"]

GPU = ("node", "gpu", "index")


# nvmlClocksEventReason* bits (nvml.h), by the names Prometheus rules use
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Those exported, one series each a GPU: what slows a GPU for its health, and the power cap a busy GPU
# sits at. Idle, application clocks, sync boost and display clocks say nothing of health and would be
# 32,000 more series at 8,000 GPUs.
EXPORTED_REASONS = {bit: CLOCK_EVENT_REASONS[bit] for bit in (0x4, 0x8, 0x20, 0x40, 0x80)}
# Violation policies exported (NVML's sync_boost and low_utilization time is not about health).
EXPORTED_POLICIES = ("power", "thermal", "board_limit", "reliability")

XIDS = family("clusterwatch_gpu_xid_errors", "counter",
              "XID errors the driver reported on the GPU (NVML events and the kernel log, each once), by XID.",
              *GPU, "xid")
EVENTS = family("clusterwatch_gpu_events", "counter",
                "NVML health events other than XIDs (ecc_single_bit, ecc_double_bit, dram_retirement, "
                "fatal_poison, recovery_action, ...), by kind.", *GPU, "kind")
RECOVERY = family("clusterwatch_gpu_recovery_action", "gauge",
                  "1 for the recovery action NVML last asked for on the GPU (none, gpu_reset, node_reboot, drain_p2p, "
                  "drain_and_reset).", *GPU, "action")
LOST = family("clusterwatch_gpu_lost", "gauge", "1 while the GPU is lost (XID 79 or NVML GPU_IS_LOST) and has not "
              "answered since.", *GPU)
ECC = family("clusterwatch_gpu_ecc_errors", "counter",
             "ECC errors NVML counts: volatile since the driver load or GPU reset, aggregate over the GPU's life.",
             *GPU, "error", "scope")
REMAPPED = family("clusterwatch_gpu_remapped_rows", "gauge", "Memory rows remapped, by the errors that caused it.",
                  *GPU, "cause")
REMAP_PENDING = family("clusterwatch_gpu_remapped_rows_pending", "gauge", "1 when a row remap waits for a GPU reset.",
                       *GPU)
REMAP_FAILED = family("clusterwatch_gpu_remapped_rows_failure", "gauge", "1 when a row could not be remapped.", *GPU)
RETIRED = family("clusterwatch_gpu_retired_pages", "gauge", "Memory pages retired (GPUs before Ampere), by cause.",
                 *GPU, "cause")
REASONS = family("clusterwatch_gpu_clock_event_reason_active", "gauge",
                 "1 while the clock-event (throttle) reason holds the GPU's clocks down, 0 when not (the reasons of "
                 "its health, and the power cap).", *GPU, "reason")
VIOLATION = family("clusterwatch_gpu_clock_event_seconds", "counter",
                   "Time the GPU's clocks were held down, by policy (NVML violation status).", *GPU, "policy")
TEMPERATURE = family("clusterwatch_gpu_temperature_celsius", "gauge", "GPU core temperature.", *GPU)
PCIE_REPLAYS = family("clusterwatch_gpu_pcie_replays", "counter", "PCIe replays of the GPU's link.", *GPU)
NVLINK = family("clusterwatch_gpu_nvlink_errors", "counter", "NVLink error counters, summed over the links.",
                *GPU, "counter")

PORT = ("node", "port")
PORT_ACTIVE = family("clusterwatch_fabric_port_active", "gauge",
                     "1 while the InfiniBand / RoCE port's logical state is ACTIVE, 0 when not.", *PORT, "link_layer")
PORT_RATE = family("clusterwatch_fabric_port_rate_bytes_per_second", "gauge",
                   "The rate the port's link runs at (sysfs rate: 200 Gb/sec is 25e9).", *PORT)
PORT_ERRORS = family("clusterwatch_fabric_port_errors", "counter",
                     "The port's error counters (sysfs counters/: link_downed, link_error_recovery, symbol_error, "
                     "port_rcv_errors, ...).", *PORT, "counter")
PORT_TROUBLE = family("clusterwatch_fabric_port_trouble", "gauge",
                      "1 while the port's trouble holds (fabric_port: down, flapping, degraded, errors), 0 when not.",
                      *PORT, "kind")
SXIDS = family("clusterwatch_nvswitch_sxid_errors", "counter",
               "SXID errors of the node's NVSwitches in the kernel log, by SXID and the line's word (fatal 1 or 0).",
               "node", "switch", "device", "sxid", "fatal")
FABRIC_FAMILIES = (PORT_ACTIVE, PORT_RATE, PORT_ERRORS, PORT_TROUBLE, SXIDS)
TROUBLE_KINDS = ("down", "flapping", "degraded", "errors")

HEALTH_FAMILIES = (XIDS, EVENTS, RECOVERY, LOST, ECC, REMAPPED, REMAP_PENDING, REMAP_FAILED, RETIRED, REASONS,
                   VIOLATION, TEMPERATURE, PCIE_REPLAYS, NVLINK, *FABRIC_FAMILIES)

# nvmlGpuRecoveryAction_t (nvml.h, R550 and later)
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset"}

_ECC_FIELDS = (("ecc_corrected_volatile", "corrected", "volatile"),
               ("ecc_uncorrected_volatile", "uncorrected", "volatile"),
               ("ecc_corrected_aggregate", "corrected", "aggregate"),
               ("ecc_uncorrected_aggregate", "uncorrected", "aggregate"))


# The snapshot's rows are NamedTuples, as the exporter's are: _rows() unpacks them in one step.
class GpuHealthRow(NamedTuple):
    """A GPU's health: whether it is lost, and its latest counters (a GpuHealth the engine holds is its own
    copy, replaced and never changed, so it can be read after the lock is let go)."""

    node: str
    uuid: str
    index: str
    lost: bool
    counters: Any  # the latest GpuHealth message, None before the first


class XidRow(NamedTuple):
    """XID errors of a GPU, by XID."""

    node: str
    uuid: str
    index: str
    xid: int
    events: int


class EventRow(NamedTuple):
    """NVML health events other than XIDs of a GPU, by kind."""

    node: str
    uuid: str
    index: str
    kind: str
    events: int


class PortRow(NamedTuple):
    """A fabric port as last read, and what of its trouble holds (PortState and its dict are replaced, never
    changed, so they can be read after the lock is let go)."""

    node: str
    port: str
    link_layer: str
    last: Any          # fabric.PortState
    trouble: frozenset[str]


class SxidRow(NamedTuple):
    node: str
    switch: str
    device: str
    sxid: int
    fatal: bool
    events: int


class RecoveryRow(NamedTuple):
    """The recovery action NVML last asked for on a GPU."""

    node: str
    uuid: str
    index: str
    action: str


@dataclass(slots=True)
class HealthSnapshot:
    """What a scrape exports of GPU health, copied under the core's lock (the rows are built outside it)."""

    gpus: list[GpuHealthRow]
    xids: list[XidRow]
    events: list[EventRow]
    recovery: list[RecoveryRow]
    ports: list[PortRow]
    sxids: list[SxidRow]


def health_snapshot(engine: Any, state: Any) -> HealthSnapshot:
    """Copy the health families' figures out of `engine` (and each GPU's index out of `state`); under the lock."""
    gpus = state.gpus

    def index(uuid: str) -> str:
        gs = gpus.get(uuid)
        return str(gs.info.index) if gs is not None else ""

    return HealthSnapshot(
        gpus=[GpuHealthRow(node, uuid, index(uuid), v.lost, v.counters)
              for (node, uuid), v in sorted(engine.gpus.items()) if v.lost or v.counters is not None],
        xids=[XidRow(node, uuid, index(uuid), xid, n) for (node, uuid, xid), n in sorted(engine.xid_counts.items())],
        events=[EventRow(node, uuid, index(uuid), kind, n)
                for (node, uuid, kind), n in sorted(engine.event_counts.items())],
        recovery=[RecoveryRow(node, uuid, index(uuid), RECOVERY_ACTIONS.get(a, str(a)))
                  for (node, uuid), a in sorted(engine.recovery.items())],
        ports=[PortRow(node, port, v.link_layer, v.last, frozenset(v.trouble))
               for (node, port), v in sorted(engine.fabric.ports.items()) if v.last is not None],
        sxids=[SxidRow(node, switch, device, sxid, fatal, n)
               for (node, device, switch, sxid, fatal), n in sorted(engine.fabric.sxid_counts.items())])


_FAMILY = {f.name: i for i, f in enumerate(HEALTH_FAMILIES)}
_I_XIDS, _I_EVENTS, _I_RECOVERY, _I_LOST = (_FAMILY[f.name] for f in (XIDS, EVENTS, RECOVERY, LOST))
_I_ECC, _I_REMAPPED, _I_PENDING, _I_FAILED, _I_RETIRED, _I_REASONS, _I_VIOLATION, _I_TEMP, _I_PCIE, _I_NVLINK = (
    _FAMILY[f.name] for f in (ECC, REMAPPED, REMAP_PENDING, REMAP_FAILED, RETIRED, REASONS, VIOLATION, TEMPERATURE,
                              PCIE_REPLAYS, NVLINK))
_I_ACTIVE, _I_RATE, _I_PORT_ERRORS, _I_TROUBLE, _I_SXIDS = (_FAMILY[f.name] for f in FABRIC_FAMILIES)
_UNCORRECTED_FIELDS = tuple(f for f in _ECC_FIELDS if f[1] == "uncorrected")
THROTTLE_REASON_NAMES = {bit: CLOCK_EVENT_REASONS[bit] for bit in THROTTLE_REASONS}
_REMAP_FIELDS = (("remapped_rows_corrected", "correctable"), ("remapped_rows_uncorrected", "uncorrectable"))
_RETIRED_FIELDS = (("retired_pages_sbe", "single_bit_ecc"), ("retired_pages_dbe", "double_bit_ecc"))


def _counter_rows(msg: Any, full: bool):
    """(family index, extra label values, value) of one GPU's counters, in family order within the GPU."""
    has = msg.HasField
    for name, error, scope in (_ECC_FIELDS if full else _UNCORRECTED_FIELDS):
        if has(name):
            yield _I_ECC, (error, scope), getattr(msg, name)
    if full:
        for name, cause in _REMAP_FIELDS:
            if has(name):
                yield _I_REMAPPED, (cause,), getattr(msg, name)
    if has("remapped_rows_pending"):
        yield _I_PENDING, (), int(msg.remapped_rows_pending)
    if has("remapped_rows_failure"):
        yield _I_FAILED, (), int(msg.remapped_rows_failure)
    for name, cause in _RETIRED_FIELDS:
        if has(name):
            yield _I_RETIRED, (cause,), getattr(msg, name)
    if has("clock_event_reasons"):
        bits = msg.clock_event_reasons
        for bit, reason in (EXPORTED_REASONS if full else THROTTLE_REASON_NAMES).items():
            yield _I_REASONS, (reason,), 1 if bits & bit else 0
    if has("temperature_c"):
        yield _I_TEMP, (), msg.temperature_c
    if not full:
        return
    violation = msg.violation_seconds
    for policy in EXPORTED_POLICIES:
        if policy in violation:
            yield _I_VIOLATION, (policy,), violation[policy]
    if has("pcie_replays"):
        yield _I_PCIE, (), msg.pcie_replays
    for counter, n in sorted(msg.nvlink_errors.items()):
        yield _I_NVLINK, (counter,), n


def _rows(snap: HealthSnapshot, full: bool):
    """(family index, GPU labels, extra label values, value) of every series, in no family order."""
    for node, uuid, idx, xid, n in snap.xids:
        yield _I_XIDS, (node, uuid, idx), (str(xid),), n
    for node, uuid, idx, kind, n in snap.events:
        yield _I_EVENTS, (node, uuid, idx), (kind,), n
    for node, uuid, idx, action in snap.recovery:
        yield _I_RECOVERY, (node, uuid, idx), (action,), 1
    for node, uuid, idx, lost, msg in snap.gpus:
        gpu = (node, uuid, idx)
        yield _I_LOST, gpu, (), 1 if lost else 0
        if msg is not None:
            for i, extra, value in _counter_rows(msg, full):
                yield i, gpu, extra, value
    for node, port, layer, last, trouble in snap.ports:
        where = (node, port)
        if last.state is not None:
            yield _I_ACTIVE, where, (layer,), 1 if last.state == 4 else 0
        if last.rate_gbps is not None:
            yield _I_RATE, where, (), last.rate_gbps * 1e9 / 8
        for counter, n in sorted(last.counters.items()):
            yield _I_PORT_ERRORS, where, (counter,), n
        for kind in TROUBLE_KINDS:
            yield _I_TROUBLE, where, (kind,), 1 if kind in trouble else 0
    for node, switch, device, sxid, fatal, n in snap.sxids:
        yield _I_SXIDS, (node, switch, device), (str(sxid), "1" if fatal else "0"), n


class HealthFamilies:
    """The exporter's `extra` for GPU health: a snapshot under the lock, then the rows (for registries) or the
    text (the scrape path, with each series' label string kept from one scrape to the next, as the exporter
    keeps its own).

    Args:
        take: the snapshot, called under the core's lock (`health_snapshot` bound to the engine and state).
        full: every figure (about 24 series a GPU); else the basic set (about 10): loss, XIDs and events,
            uncorrected ECC, remaps pending or failed, retired pages, the throttle reasons of health,
            temperature. bench/bench_metrics.py measures both.
    """

    def __init__(self, take: Callable[[], HealthSnapshot], full: bool = False) -> None:
        self._take = take
        self.full = full

    def snapshot(self) -> HealthSnapshot:
        return self._take()

    def series(self, snap: HealthSnapshot) -> list[tuple[Family, list]]:
        """Each family with its rows (label names, label values, value), as the exporter's series() has them."""
        rows: list[list] = [[] for _ in HEALTH_FAMILIES]
        for i, gpu, extra, value in _rows(snap, self.full):
            rows[i].append((HEALTH_FAMILIES[i].labels, (*gpu, *extra), value))
        return list(zip(HEALTH_FAMILIES, rows, strict=True))

    def write(self, snap: HealthSnapshot, out: TextWriter) -> None:
        """The families' text into the exporter's writer (its `caches` and `emit`): the lines series() gives."""
        cache, used = out.caches("health")
        lines: list[list[str]] = [[] for _ in HEALTH_FAMILIES]
        names = [f.sample_name for f in HEALTH_FAMILIES]
        labels = [f.labels for f in HEALTH_FAMILIES]
        for i, gpu, extra, value in _rows(snap, self.full):
            key = (i, gpu, extra)
            lbl = cache.get(key)
            if lbl is None:
                lbl = label_string(labels[i], (*gpu, *extra))
            used[key] = lbl
            lines[i].append(f"{names[i]}{lbl}{format_value(value)}\n")
        for fam, fam_lines in zip(HEALTH_FAMILIES, lines, strict=True):
            out.emit(fam, fam_lines)
