"""The GPU source over NVML, through the `pynvml` module of nvidia-ml-py.

The module is passed to `NvmlGpuSource`, so tests hand it a fake with the same
functions and error classes; only `open_nvml_source` imports the real one.

How NVML errors map (codes from nvml.h, read from `NVMLError.value`):

    NotSupported, NoPermission,     the field is None, and is not asked again for that GPU
    FunctionNotFound, mismatch
    GpuIsLost, Unknown,             the whole GPU reads None this poll; one error counted;
    ResetRequired                   the other GPUs are still read
    anything else                   the field is None; one error counted
    LibraryNotFound, DriverNotLoaded,   at construction: SourceUnavailable with one line
    ... (any error in nvmlInit)         that says what and what to do

Nothing here logs per poll: failures are counted in `GpuPoll.errors`, and a GPU that
stops answering is logged once, when it first does.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from clusterwatch.agent.backends.gpu import GpuPoll

from clusterwatch.errors import SourceUnavailable
from clusterwatch.model import GpuInfo, GpuReading, GpuUse

__all__ = ["NvmlGpuSource", "open_nvml_source"]

# NVML return codes (nvml.h); stable across driver versions.
_NO_PROCESSES = 0  # pynvml raises a bare NVMLError(NVML_SUCCESS) when a size query finds nothing
_NO_PERMISSION = 4
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18
_UNKNOWN = 999

_FIELD_UNSUPPORTED = frozenset({_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND})
_GPU_FAILED = frozenset({_GPU_IS_LOST, _UNKNOWN, _RESET_REQUIRED})
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_MIG_UNLISTED = "GPU at NVML index %d: MIG instances not listed (%s); reading the whole GPU"

_DEMO_HINT = "or pass --gpu-source sim for a demo."
_INIT_LINES = {
    _LIBRARY_NOT_FOUND: "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this node; "
    "running without GPU data. Install the NVIDIA driver, " + _DEMO_HINT,
    _DRIVER_NOT_LOADED: "NVIDIA driver not loaded (NVML: Driver Not Loaded); running without GPU data. "
    "Load the nvidia kernel module (nvidia-smi must work), " + _DEMO_HINT,
    _NO_PERMISSION: "NVML refused access (Insufficient Permissions); running without GPU data. "
    "Run the agent as root or give it access to /dev/nvidia*.",
    _LIB_RM_VERSION_MISMATCH: "NVML library and NVIDIA kernel driver versions differ; running without GPU "
    "data. Reboot, or reload the nvidia kernel module after the driver upgrade.",
}


class _GpuFailed(Exception):
    """Raised inside a poll when one GPU stops answering (lost, unknown error)."""


@dataclass(slots=True)
class _Device:
    """One GPU or MIG instance as the source tracks it between polls."""

    info: GpuInfo
    handle: Any
    is_mig: bool = False
    # fields NVML said it cannot give for this device: never asked again
    unsupported: set[str] = field(default_factory=set)
    # largest process-utilisation timeStamp seen (CPU µs): pynvml does not return it
    util_last_ts: int = 0
    # pid → (SM utilisation %, poll time it was sampled)
    util_seen: dict[int, tuple[float, float]] = field(default_factory=dict)
    failed: bool = False


class NvmlGpuSource:
    """GPU inventory and readings from NVML, one `nvmlInit` for the source's life.

    Args:
        nvml: the `pynvml` module (nvidia-ml-py), or a fake with the same functions
            and error classes.
        util_hold_s: how long a process keeps its last SM utilisation when NVML has no
            newer sample for it; after that it reads None.
        log: where the one-time warnings go (a GPU that stops answering).

    Raises:
        SourceUnavailable: NVML cannot start (no library, no driver, no permission) or
            finds no GPU; the message is one line that says what to do.
    """

    name = "nvml"

    def __init__(self, nvml: Any, *, util_hold_s: float = 10.0, log: logging.Logger | None = None) -> None:
        self._nv = nvml
        self._hold_s = util_hold_s
        self._log = log or logging.getLogger(__name__)
        self._closed = False
        self._nvml_error: type[Exception] = nvml.NVMLError
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        # Not an NVMLError subclass: raised by unversioned wrappers when the library lacks
        # the function they call; caught separately so we can fall back to an older version.
        self._mismatch: tuple[type[Exception], ...] = (mismatch,) if mismatch else ()
        try:
            nvml.nvmlInit()
        except self._nvml_error as exc:
            raise SourceUnavailable(_init_line(exc)) from None
        try:
            self._devices, self._startup_errors = self._enumerate()
        except self._nvml_error as exc:
            self._shutdown()
            raise SourceUnavailable(
                f"NVML could not list the GPUs ({exc}); running without GPU data. "
                "Check that nvidia-smi works on this node."
            ) from None
        if not self._devices:
            self._shutdown()
            raise SourceUnavailable(
                "NVML found no usable GPU on this node; running without GPU data. "
                "Check nvidia-smi, " + _DEMO_HINT
            )
        self._proc_getters = {
            "compute": self._getters("nvmlDeviceGetComputeRunningProcesses"),
            "graphics": self._getters("nvmlDeviceGetGraphicsRunningProcesses"),
        }

    # --- the GpuSource protocol -------------------------------------------------------

    def inventory(self) -> list[GpuInfo]:
        """The GPUs (or MIG instances) found at construction, keyed by UUID.

        Returns:
            One GpuInfo per device; a MIG instance carries its parent's index.
        """
        return [d.info for d in self._devices]

    def poll(self, now: float) -> GpuPoll:
        """Read every device and the processes on it.

        Args:
            now: Unix seconds; used to age the per-process utilisation kept between polls.

        Returns:
            The readings (all None for a GPU that failed), the processes by pid, and the
            number of reads that failed.
        """
        out = GpuPoll(errors=self._startup_errors)
        self._startup_errors = 0  # GPUs that failed at enumeration are counted once
        for dev in self._devices:
            try:
                reading, uses = self._read_device(dev, now, out)
            except _GpuFailed:
                out.errors += 1
                out.readings.append(GpuReading(uuid=dev.info.uuid))
                dev.util_seen.clear()
                continue
            if dev.failed:
                dev.failed = False
                self._log.warning("GPU %s (index %d) answers again", dev.info.uuid, dev.info.index)
            out.readings.append(reading)
            for pid, use in uses.items():
                out.processes.setdefault(pid, []).append(use)
        return out

    def close(self) -> None:
        """Release NVML (one nvmlShutdown for the nvmlInit of the constructor)."""
        if not self._closed:
            self._shutdown()

    # --- enumeration -----------------------------------------------------------------

    def _enumerate(self) -> tuple[list[_Device], int]:
        nv = self._nv
        devices: list[_Device] = []
        skipped = 0
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                name = _text(nv.nvmlDeviceGetName(handle))
                if self._mig_enabled(handle):
                    instances = self._mig_instances(handle, index, name)
                    if instances:
                        # The instances are what jobs get and what processes run on; the
                        # parent has no utilisation or process figures of its own in MIG mode.
                        devices.extend(instances)
                        continue
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                total = self._total_memory(handle)
            except self._nvml_error as exc:
                # A GPU lost before we ever saw its UUID cannot be keyed: leave it out, and
                # count it in the first poll's errors.
                skipped += 1
                self._log.warning("GPU at NVML index %d left out: %s", index, exc)
                continue
            devices.append(_Device(GpuInfo(uuid, index, name, total), handle))
        return devices, skipped

    def _total_memory(self, handle: Any) -> int:
        try:
            return int(self._nv.nvmlDeviceGetMemoryInfo(handle).total)
        except self._nvml_error as exc:
            # A MIG-mode parent answers only to privileged callers: still list the GPU.
            if getattr(exc, "value", None) in _FIELD_UNSUPPORTED:
                return 0
            raise

    def _mig_enabled(self, handle: Any) -> bool:
        get_mode = getattr(self._nv, "nvmlDeviceGetMigMode", None)
        if get_mode is None:
            return False
        try:
            current, _pending = get_mode(handle)
        except self._nvml_error:
            return False  # NotSupported before Ampere
        return bool(current == _MIG_ENABLED)

    def _mig_instances(self, parent: Any, index: int, parent_name: str) -> list[_Device]:
        """The MIG instances of a GPU; [] when they cannot be listed (the parent is used then)."""
        nv = self._nv
        out: list[_Device] = []
        try:
            slots = nv.nvmlDeviceGetMaxMigDeviceCount(parent)
        except self._nvml_error as exc:
            self._log.warning(_MIG_UNLISTED, index, exc)
            return []
        for slot in range(slots):
            try:
                handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except self._nvml_error as exc:
                if exc.value == _NOT_FOUND:
                    continue  # empty slot
                self._log.warning(_MIG_UNLISTED, index, exc)
                return []
            try:
                name = _text(nv.nvmlDeviceGetName(handle))
            except self._nvml_error:
                name = f"{parent_name} MIG {slot}"
            total = self._total_memory(handle)
            # NVML documents device and process utilisation as not supported on MIG.
            dev = _Device(GpuInfo(uuid, index, name, total), handle, is_mig=True)
            dev.unsupported.update({"utilization", "process_util"})
            out.append(dev)
        return out

    def _getters(self, base: str) -> list[Callable[[Any], list[Any]]]:
        # Versioned first: an unversioned wrapper follows the bindings' newest struct,
        # which an older driver may lack. Each one the library lacks is dropped for good.
        names = (base + "_v3", base, base + "_v2")
        return [getattr(self._nv, n) for n in names if hasattr(self._nv, n)]

    # --- one device ------------------------------------------------------------------

    def _read_device(self, dev: _Device, now: float, out: GpuPoll) -> tuple[GpuReading, dict[int, GpuUse]]:
        nv, h = self._nv, dev.handle
        util = self._field(dev, "utilization", nv.nvmlDeviceGetUtilizationRates, h, out)
        mem = self._field(dev, "memory", nv.nvmlDeviceGetMemoryInfo, h, out)
        power_mw = self._field(dev, "power", nv.nvmlDeviceGetPowerUsage, h, out)
        reading = GpuReading(
            uuid=dev.info.uuid,
            utilization=float(util.gpu) if util is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            power_watts=power_mw / 1000.0 if power_mw is not None else None,
        )
        memory_by_pid: dict[int, int | None] = {}
        for kind in ("compute", "graphics"):
            for proc in self._running(dev, kind, out):
                used = proc.usedGpuMemory
                prev = memory_by_pid.get(proc.pid)
                # A process using both compute and graphics is listed twice with the same
                # "all memory of the application" figure: take it once, not the sum.
                if proc.pid not in memory_by_pid or (used is not None and (prev is None or used > prev)):
                    memory_by_pid[proc.pid] = None if used is None else int(used)
        sm = self._process_util(dev, now, memory_by_pid.keys(), out)
        uses = {
            pid: GpuUse(gpu_uuid=dev.info.uuid, used_memory_bytes=used, sm_utilization=sm.get(pid))
            for pid, used in memory_by_pid.items()
        }
        return reading, uses

    def _field(self, dev: _Device, name: str, fn: Callable[..., Any], handle: Any, out: GpuPoll) -> Any:
        """One NVML query for one field: its value, or None with the error mapped."""
        if name in dev.unsupported:
            return None
        try:
            return fn(handle)
        except self._mismatch:
            dev.unsupported.add(name)
            return None
        except self._nvml_error as exc:
            self._on_error(dev, name, exc, out)
            return None

    def _on_error(self, dev: _Device, name: str, exc: Exception, out: GpuPoll) -> None:
        code = getattr(exc, "value", None)
        if code in _FIELD_UNSUPPORTED:
            dev.unsupported.add(name)
        elif code in _GPU_FAILED:
            if not dev.failed:
                dev.failed = True
                self._log.warning(
                    "GPU %s (index %d) does not answer (%s); its readings are empty until it does",
                    dev.info.uuid, dev.info.index, exc,
                )
            raise _GpuFailed from None
        else:
            out.errors += 1

    def _running(self, dev: _Device, kind: str, out: GpuPoll) -> list[Any]:
        if kind in dev.unsupported:
            return []
        getters = self._proc_getters[kind]
        while getters:
            try:
                return list(getters[0](dev.handle))
            except self._mismatch:
                getters.pop(0)
            except self._nvml_error as exc:
                if getattr(exc, "value", None) == _FUNCTION_NOT_FOUND:
                    getters.pop(0)  # this version is not in the driver's library
                    continue
                self._on_error(dev, kind, exc, out)
                return []
        return []  # no version of the function exists in this library

    def _process_util(self, dev: _Device, now: float, pids: Any, out: GpuPoll) -> dict[int, float | None]:
        live = set(pids)
        for gone in [p for p in dev.util_seen if p not in live]:
            del dev.util_seen[gone]
        if not live or "process_util" in dev.unsupported:
            return {}
        try:
            samples = self._nv.nvmlDeviceGetProcessUtilization(dev.handle, dev.util_last_ts)
        except self._nvml_error as exc:
            # value 0: the wrapper's size query found no samples at all; NotFound: nothing
            # newer than util_last_ts. Either way, keep what was seen recently.
            if getattr(exc, "value", None) not in (_NO_PROCESSES, _NOT_FOUND):
                self._on_error(dev, "process_util", exc, out)
            samples = []
        newest: dict[int, tuple[int, float]] = {}
        for s in samples:
            ts = int(s.timeStamp)
            dev.util_last_ts = max(dev.util_last_ts, ts)
            # The driver's buffer holds several samples per pid, and pids that are gone.
            if s.pid in live and (s.pid not in newest or ts >= newest[s.pid][0]):
                newest[s.pid] = (ts, min(100.0, max(0.0, float(s.smUtil))))
        for pid, (_ts, value) in newest.items():
            dev.util_seen[pid] = (value, now)
        result: dict[int, float | None] = {}
        for pid in live:
            seen = dev.util_seen.get(pid)
            result[pid] = seen[0] if seen is not None and now - seen[1] <= self._hold_s else None
        return result

    def _shutdown(self) -> None:
        self._closed = True
        try:
            self._nv.nvmlShutdown()
        except self._nvml_error:
            pass  # nothing left to release


def _init_line(exc: Exception) -> str:
    line = _INIT_LINES.get(getattr(exc, "value", None))
    if line is not None:
        return line
    return (
        f"NVML could not start ({exc}); running without GPU data. "
        "Check that nvidia-smi works on this node, " + _DEMO_HINT
    )


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def open_nvml_source(*, log: logging.Logger | None = None) -> NvmlGpuSource:
    """Import pynvml (from nvidia-ml-py) and start an NVML source on it.

    Args:
        log: where the source's one-time warnings go.

    Returns:
        A started NvmlGpuSource.

    Raises:
        SourceUnavailable: the bindings are not installed, or NVML cannot start.
    """
    try:
        with warnings.catch_warnings():
            # The deprecated `pynvml` distribution, if also installed, warns on this import.
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml
    except ImportError:
        raise SourceUnavailable(
            "NVML bindings not installed (module pynvml, from nvidia-ml-py); running without GPU data. "
            "Install nvidia-ml-py, " + _DEMO_HINT
        ) from None
    return NvmlGpuSource(pynvml, log=log)
