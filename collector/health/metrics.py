"""The GPU health families of /metrics: XIDs by code, other NVML events, the recovery action NVML asks for,
memory errors, clock-event reasons, temperature, loss.

Per GPU (labels node, gpu (UUID), index), never per process: a health signal is the GPU's, and its job is
on the GPU's other series (clusterwatch_gpu_memory_used_bytes' job_id). Built from the HealthEngine's per-GPU
views at scrape time, under the core's lock, like every family (collector/exporter.py). A figure the GPU
does not report (NVML NOT_SUPPORTED: the agent sends no field) has no series, so `absent()` tells "not
supported" from 0. deploy/prometheus/alerts.yml alerts on them; docs/health.md lists them.
"""
from __future__ import annotations

from typing import Any

from clusterwatch.collector.exporter import Family

__all__ = ["HEALTH_FAMILIES", "CLOCK_EVENT_REASONS", "health_series"]

GPU = ("node", "gpu", "index")


def fam(name: str, type_: str, help_text: str, *labels: str) -> Family:
    return Family(name, type_, help_text, labels)


# nvmlClocksEventReason* bits (nvml.h), by the names Prometheus rules use
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

XIDS = fam("clusterwatch_gpu_xid_errors", "counter",
           "XID errors the driver reported on the GPU (NVML events and the kernel log, each once), by XID.",
           *GPU, "xid")
EVENTS = fam("clusterwatch_gpu_events", "counter",
             "NVML health events other than XIDs (ecc_single_bit, ecc_double_bit, dram_retirement, "
             "fatal_poison, recovery_action, ...), by kind.", *GPU, "kind")
RECOVERY = fam("clusterwatch_gpu_recovery_action", "gauge",
               "1 for the recovery action NVML last asked for on the GPU (none, gpu_reset, node_reboot, drain_p2p, "
               "drain_and_reset).", *GPU, "action")
LOST = fam("clusterwatch_gpu_lost", "gauge", "1 while the GPU is lost (XID 79 or NVML GPU_IS_LOST) and has not "
           "answered since.", *GPU)
ECC = fam("clusterwatch_gpu_ecc_errors", "counter",
          "ECC errors NVML counts: volatile since the driver load or GPU reset, aggregate over the GPU's life.",
          *GPU, "error", "scope")
REMAPPED = fam("clusterwatch_gpu_remapped_rows", "gauge", "Memory rows remapped, by the errors that caused it.",
               *GPU, "cause")
REMAP_PENDING = fam("clusterwatch_gpu_remapped_rows_pending", "gauge", "1 when a row remap waits for a GPU reset.",
                    *GPU)
REMAP_FAILED = fam("clusterwatch_gpu_remapped_rows_failure", "gauge", "1 when a row could not be remapped.", *GPU)
RETIRED = fam("clusterwatch_gpu_retired_pages", "gauge", "Memory pages retired (GPUs before Ampere), by cause.",
              *GPU, "cause")
REASONS = fam("clusterwatch_gpu_clock_event_reason_active", "gauge",
              "1 while the clock-event (throttle) reason holds the GPU's clocks down, 0 when not.", *GPU, "reason")
VIOLATION = fam("clusterwatch_gpu_clock_event_seconds", "counter",
                "Time the GPU's clocks were held down, by policy (NVML violation status).", *GPU, "policy")
TEMPERATURE = fam("clusterwatch_gpu_temperature_celsius", "gauge", "GPU core temperature.", *GPU)
PCIE_REPLAYS = fam("clusterwatch_gpu_pcie_replays", "counter", "PCIe replays of the GPU's link.", *GPU)
NVLINK = fam("clusterwatch_gpu_nvlink_errors", "counter", "NVLink error counters, summed over the links.",
             *GPU, "counter")

HEALTH_FAMILIES = (XIDS, EVENTS, RECOVERY, LOST, ECC, REMAPPED, REMAP_PENDING, REMAP_FAILED, RETIRED, REASONS,
                   VIOLATION, TEMPERATURE, PCIE_REPLAYS, NVLINK)

# nvmlGpuRecoveryAction_t (nvml.h, R550 and later)
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset"}

_ECC_FIELDS = (("ecc_corrected_volatile", "corrected", "volatile"),
               ("ecc_uncorrected_volatile", "uncorrected", "volatile"),
               ("ecc_corrected_aggregate", "corrected", "aggregate"),
               ("ecc_uncorrected_aggregate", "uncorrected", "aggregate"))


def health_series(engine: Any, state: Any) -> list[tuple[Family, list]]:
    """Each health family with its rows (label names, label values, value), from `engine`'s GPU views.

    Args:
        engine: the collector's HealthEngine.
        state: the ClusterState, for each GPU's index (empty where the GPU is not in its inventory).
    """
    rows: dict[str, list] = {f.name: [] for f in HEALTH_FAMILIES}
    gpus = state.gpus

    def index(uuid: str) -> str:
        gs = gpus.get(uuid)
        return str(gs.info.index) if gs is not None else ""

    for (node, uuid, xid), n in sorted(engine.xid_counts.items()):
        rows[XIDS.name].append((XIDS.labels, (node, uuid, index(uuid), str(xid)), n))
    for (node, uuid, kind), n in sorted(engine.event_counts.items()):
        rows[EVENTS.name].append((EVENTS.labels, (node, uuid, index(uuid), kind), n))
    for (node, uuid), action in sorted(engine.recovery.items()):
        name = RECOVERY_ACTIONS.get(action, str(action))
        rows[RECOVERY.name].append((RECOVERY.labels, (node, uuid, index(uuid), name), 1))
    for (node, uuid), view in sorted(engine.gpus.items()):
        gpu = (node, uuid, index(uuid))
        if view.lost or view.counters is not None:
            rows[LOST.name].append((LOST.labels, gpu, 1 if view.lost else 0))
        msg = view.counters
        if msg is None:
            continue
        has = msg.HasField
        for name, error, scope in _ECC_FIELDS:
            if has(name):
                rows[ECC.name].append((ECC.labels, (*gpu, error, scope), getattr(msg, name)))
        for name, cause in (("remapped_rows_corrected", "correctable"), ("remapped_rows_uncorrected", "uncorrectable")):
            if has(name):
                rows[REMAPPED.name].append((REMAPPED.labels, (*gpu, cause), getattr(msg, name)))
        if has("remapped_rows_pending"):
            rows[REMAP_PENDING.name].append((REMAP_PENDING.labels, gpu, int(msg.remapped_rows_pending)))
        if has("remapped_rows_failure"):
            rows[REMAP_FAILED.name].append((REMAP_FAILED.labels, gpu, int(msg.remapped_rows_failure)))
        for name, cause in (("retired_pages_sbe", "single_bit_ecc"), ("retired_pages_dbe", "double_bit_ecc")):
            if has(name):
                rows[RETIRED.name].append((RETIRED.labels, (*gpu, cause), getattr(msg, name)))
        if has("clock_event_reasons"):
            bits = msg.clock_event_reasons
            for bit, reason in CLOCK_EVENT_REASONS.items():
                rows[REASONS.name].append((REASONS.labels, (*gpu, reason), 1 if bits & bit else 0))
        for policy, seconds in sorted(msg.violation_seconds.items()):
            rows[VIOLATION.name].append((VIOLATION.labels, (*gpu, policy), seconds))
        if has("temperature_c"):
            rows[TEMPERATURE.name].append((TEMPERATURE.labels, gpu, msg.temperature_c))
        if has("pcie_replays"):
            rows[PCIE_REPLAYS.name].append((PCIE_REPLAYS.labels, gpu, msg.pcie_replays))
        for counter, n in sorted(msg.nvlink_errors.items()):
            rows[NVLINK.name].append((NVLINK.labels, (*gpu, counter), n))
    return [(f, rows[f.name]) for f in HEALTH_FAMILIES]
