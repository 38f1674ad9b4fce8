"""The GPUs' health counters, read on a slower cadence than the poll (default every 30 s).

ECC (volatile and aggregate, corrected and uncorrected), remapped rows (and pending, failure),
retired pages (where the GPU retires pages instead of remapping rows: before Ampere), clock
event (throttle) reasons and the time spent in each, temperature, PCIe replays, NVLink errors, and
each NVLink's state: a link that was active and reads inactive is a change (`nvlink_changes`), as is
its coming back.
Every one is optional: a counter NVML cannot give (NOT_SUPPORTED, no permission, a function the
driver or the bindings lack) is None and is never asked of that GPU again, so a GPU without it
costs nothing after the first read; any other failure is None and counted. A lost GPU stops its
read for this round (counted, `lost`), and the GPUs are listed again at the next.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from clusterwatch.agent.health.devices import GONE, UNSUPPORTED, PhysicalGpu, nvml_code, physical_gpus

__all__ = ["GpuCounters", "CounterReader", "LinkChange", "VIOLATION_POLICIES", "NVLINK_COUNTERS"]

# nvmlPerfPolicyType_t → field suffix: time the clocks were held down for that reason
VIOLATION_POLICIES = {0: "power", 1: "thermal", 2: "sync_boost", 3: "board_limit", 4: "low_utilization",
                      5: "reliability"}
# nvmlNvLinkErrorCounter_t → field suffix, summed over the GPU's links
NVLINK_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}
_ERR_CORRECTED, _ERR_UNCORRECTED = 0, 1
_VOLATILE, _AGGREGATE = 0, 1
_TEMPERATURE_GPU = 0
_RETIRED_SBE, _RETIRED_DBE = 0, 1
_INVALID_ARGUMENT = 2


@dataclass(frozen=True, slots=True)
class GpuCounters:
    """One GPU's health counters at one read; None: not known (unsupported or failed)."""

    uuid: str
    time: float
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    clock_event_reasons: int | None = None           # nvmlClocksEventReason* bits
    violation_seconds: dict[str, float] = field(default_factory=dict)   # VIOLATION_POLICIES name → s
    temperature_c: int | None = None
    pcie_replays: int | None = None
    nvlink_errors: dict[str, int] = field(default_factory=dict)         # NVLINK_COUNTERS name → count


class _Gone(Exception):
    pass


@dataclass(slots=True)
class _Gpu:
    gpu: PhysicalGpu
    unsupported: set[str] = field(default_factory=set)
    nvlinks: int | None = None     # links found at the first read
    link_ids: list[int] | None = None   # the links whose state it gives (NOT_SUPPORTED ones are no links)
    active: dict[int, bool] = field(default_factory=dict)   # link → its state at the last read that gave it
    down: set[int] = field(default_factory=set)             # links seen active, inactive since


@dataclass(frozen=True, slots=True)
class LinkChange:
    """An NVLink of a GPU that went down (was active, reads inactive) or came back up after."""

    uuid: str
    link: int
    down: bool


class CounterReader:
    """Reads every GPU's counters; `read(now)` returns one GpuCounters per GPU that answered.

    Args:
        nvml: the pynvml module (or a fake with the same functions and errors); initialised here.
    """

    def __init__(self, nvml: Any, *, clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._clock = clock
        self.errors = 0
        self.lost: set[str] = set()     # UUIDs that answered GPU_IS_LOST at the last read
        self.nvlink_changes: list[LinkChange] = []   # the NVLinks that went down or came back at the last read
        nvml.nvmlInit()
        self._gpus = [_Gpu(g) for g in physical_gpus(nvml)]
        self._relist = False

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def read(self, now: float | None = None) -> list[GpuCounters]:
        now = self._clock() if now is None else now
        if self._relist:
            known = {g.gpu.uuid: g for g in self._gpus}
            self._gpus = [known.get(g.uuid) or _Gpu(g) for g in physical_gpus(self._nvml)]
            self._relist = False
        out = []
        lost = set()
        changes: list[LinkChange] = []
        for gpu in self._gpus:
            try:
                out.append(self._read_one(gpu, now))
                changes += self._link_states(gpu)
            except _Gone:
                lost.add(gpu.gpu.uuid)
                self.errors += 1
                self._relist = True
        self.lost = lost
        self.nvlink_changes = changes
        return out

    def _ask(self, gpu: _Gpu, name: str, fn: str, *args: Any) -> Any:
        """One NVML call for field `name`: its value, or None (unsupported ones remembered)."""
        if name in gpu.unsupported:
            return None
        nvml = self._nvml
        try:
            return getattr(nvml, fn)(gpu.gpu.handle, *args)
        except (nvml.NVMLError, AttributeError) as exc:
            code = nvml_code(exc)
            if code in GONE:
                raise _Gone from None
            if code in UNSUPPORTED:
                gpu.unsupported.add(name)
            else:
                self.errors += 1
            return None

    def _read_one(self, gpu: _Gpu, now: float) -> GpuCounters:
        ask = self._ask
        ecc = {(e, c): ask(gpu, f"ecc_{e}_{c}", "nvmlDeviceGetTotalEccErrors", e, c)
               for e in (_ERR_CORRECTED, _ERR_UNCORRECTED) for c in (_VOLATILE, _AGGREGATE)}
        remapped = ask(gpu, "remapped", "nvmlDeviceGetRemappedRows")
        sbe = ask(gpu, "retired", "nvmlDeviceGetRetiredPages", _RETIRED_SBE)
        dbe = ask(gpu, "retired", "nvmlDeviceGetRetiredPages", _RETIRED_DBE) if sbe is not None else None
        pending = ask(gpu, "retired_pending", "nvmlDeviceGetRetiredPagesPendingStatus")
        reasons = ask(gpu, "reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None and "reasons" in gpu.unsupported:   # bindings or drivers before the rename
            reasons = ask(gpu, "reasons_old", "nvmlDeviceGetCurrentClocksThrottleReasons")
        violation = {}
        for policy, label in VIOLATION_POLICIES.items():
            got = ask(gpu, f"violation_{label}", "nvmlDeviceGetViolationStatus", policy)
            if got is not None:
                violation[label] = int(got.violationTime) / 1e9
        return GpuCounters(
            uuid=gpu.gpu.uuid, time=now,
            ecc_corrected_volatile=_int(ecc[_ERR_CORRECTED, _VOLATILE]),
            ecc_uncorrected_volatile=_int(ecc[_ERR_UNCORRECTED, _VOLATILE]),
            ecc_corrected_aggregate=_int(ecc[_ERR_CORRECTED, _AGGREGATE]),
            ecc_uncorrected_aggregate=_int(ecc[_ERR_UNCORRECTED, _AGGREGATE]),
            remapped_rows_corrected=_int(remapped[0]) if remapped else None,
            remapped_rows_uncorrected=_int(remapped[1]) if remapped else None,
            remapped_rows_pending=bool(remapped[2]) if remapped else None,
            remapped_rows_failure=bool(remapped[3]) if remapped else None,
            retired_pages_sbe=len(sbe) if sbe is not None else None,
            retired_pages_dbe=len(dbe) if dbe is not None else None,
            retired_pages_pending=bool(pending) if pending is not None else None,
            clock_event_reasons=_int(reasons),
            violation_seconds=violation,
            temperature_c=_int(ask(gpu, "temperature", "nvmlDeviceGetTemperature", _TEMPERATURE_GPU)),
            pcie_replays=_int(ask(gpu, "pcie_replay", "nvmlDeviceGetPcieReplayCounter")),
            nvlink_errors=self._nvlink(gpu),
        )

    def _nvlink(self, gpu: _Gpu) -> dict[str, int]:
        """NVLink error counters summed over the GPU's links; {} for a GPU without NVLink."""
        if "nvlink" in gpu.unsupported:
            return {}
        nvml = self._nvml
        limit = gpu.nvlinks if gpu.nvlinks is not None else int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        sums = dict.fromkeys(NVLINK_COUNTERS.values(), 0)
        links = 0
        for link in range(limit):
            try:
                for counter, label in NVLINK_COUNTERS.items():
                    sums[label] += int(nvml.nvmlDeviceGetNvLinkErrorCounter(gpu.gpu.handle, link, counter))
            except (nvml.NVMLError, AttributeError) as exc:
                code = nvml_code(exc)
                if code in GONE:
                    raise _Gone from None
                if code in UNSUPPORTED or code == _INVALID_ARGUMENT:
                    break       # past the GPU's last link
                self.errors += 1
                return {}
            links += 1
        if gpu.nvlinks is None:
            gpu.nvlinks = links
            if links == 0:
                gpu.unsupported.add("nvlink")
                return {}
        return sums


    def _link_states(self, gpu: _Gpu) -> list[LinkChange]:
        """Read the GPU's NVLink states; the links that went down or came back since the last read.

        A GPU without NVLink answers NOT_SUPPORTED on link 0: one call, then never asked again. Past
        link 0, a link that answers NOT_SUPPORTED is no link (not asked again), INVALID_ARGUMENT ends the
        GPU's links; a link whose read fails keeps its last state.
        """
        if "nvlink_state" in gpu.unsupported:
            return []
        nvml = self._nvml
        first = gpu.link_ids is None
        limit = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        ids = list(range(limit)) if first else gpu.link_ids
        found: list[int] = []
        changes = []
        for link in ids:
            try:
                active = bool(nvml.nvmlDeviceGetNvLinkState(gpu.gpu.handle, link))
            except (nvml.NVMLError, AttributeError) as exc:
                code = nvml_code(exc)
                if code in GONE:
                    raise _Gone from None
                if first and (code in UNSUPPORTED or code == _INVALID_ARGUMENT):
                    if link == 0 or code == _INVALID_ARGUMENT:
                        break       # no NVLink (link 0), or past the GPU's last link
                    continue        # not a link of this GPU
                self.errors += 1
                found.append(link)
                continue
            found.append(link)
            was = gpu.active.get(link)
            gpu.active[link] = active
            if not active and was:
                gpu.down.add(link)
                changes.append(LinkChange(gpu.gpu.uuid, link, down=True))
            elif active and link in gpu.down:
                gpu.down.discard(link)
                changes.append(LinkChange(gpu.gpu.uuid, link, down=False))
        if first:
            gpu.link_ids = found
            if not found:
                gpu.unsupported.add("nvlink_state")
        return changes


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
