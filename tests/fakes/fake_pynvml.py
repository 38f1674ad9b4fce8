"""A small fake shaped like the `pynvml` module of nvidia-ml-py.

It has the functions the NVML source calls, with the same names and return shapes,
and the same error classes: `NVMLError` maps a code to its generated subclass the way
pynvml does (`NVMLError(3)` is an `NVMLError_NotSupported`), and
`NVMLLibraryMismatchError` is, as in pynvml, not an `NVMLError`. GPUs, processes and
failures are plain data set by the test; every call is recorded in `calls`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

_ERROR_NAMES = {
    1: "Uninitialized",
    3: "NotSupported",
    4: "NoPermission",
    6: "NotFound",
    7: "InsufficientSize",
    9: "DriverNotLoaded",
    10: "Timeout",
    12: "LibraryNotFound",
    13: "FunctionNotFound",
    15: "GpuIsLost",
    16: "ResetRequired",
    18: "LibRmVersionMismatch",
    999: "Unknown",
}


class NVMLLibraryMismatchError(Exception):
    """As in pynvml: an unversioned wrapper found the library lacks its function."""


class NVMLError(Exception):
    """Base NVML error; `NVMLError(code)` builds the subclass for the code, as pynvml does."""

    _by_value: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:  # noqa: D102
        if cls is NVMLError:
            cls = NVMLError._by_value.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        name = _ERROR_NAMES.get(self.value)
        return name if name else f"NVML Error with code {self.value}"


def _error_class(code: int, name: str) -> type[NVMLError]:
    def new(cls: type, *args: Any) -> NVMLError:
        return NVMLError.__new__(cls, code)

    cls = type("NVMLError_" + name, (NVMLError,), {"__new__": new})
    NVMLError._by_value[code] = cls
    return cls


NVMLError_Uninitialized = _error_class(1, "Uninitialized")
NVMLError_NotSupported = _error_class(3, "NotSupported")
NVMLError_NoPermission = _error_class(4, "NoPermission")
NVMLError_NotFound = _error_class(6, "NotFound")
NVMLError_DriverNotLoaded = _error_class(9, "DriverNotLoaded")
NVMLError_Timeout = _error_class(10, "Timeout")
NVMLError_LibraryNotFound = _error_class(12, "LibraryNotFound")
NVMLError_FunctionNotFound = _error_class(13, "FunctionNotFound")
NVMLError_GpuIsLost = _error_class(15, "GpuIsLost")
NVMLError_ResetRequired = _error_class(16, "ResetRequired")
NVMLError_Unknown = _error_class(999, "Unknown")


@dataclass
class FakeProcess:
    """A process on a fake GPU; `kind` is "compute", "graphics" or "both"."""

    pid: int
    used_memory: int | None
    kind: str = "compute"


@dataclass
class FakeGpu:
    """One fake GPU (or MIG instance).

    `fail` maps a pynvml function name to the error it raises on this GPU;
    `lost=True` makes every call on it raise NVMLError_GpuIsLost.
    `util_samples` is the driver's process-utilisation buffer: (pid, timeStamp µs, smUtil).
    `mig` lists MIG instances (MIG mode on when not None); None entries are empty slots.
    """

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * 1024**3
    memory_used: int = 10 * 1024**3
    utilization: int = 75
    power_mw: int = 312_500
    processes: list[FakeProcess] = field(default_factory=list)
    util_samples: list[tuple[int, int, int]] = field(default_factory=list)
    fail: dict[str, Exception] = field(default_factory=dict)
    lost: bool = False
    mig: list[FakeGpu | None] | None = None


class _Handle:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu


class FakeNvml:
    """Stands in for the pynvml module: hand an instance to NvmlGpuSource.

    Args:
        gpus: the node's GPUs in NVML index order.
        init_error: the NVMLError code nvmlInit raises (12 = no library, 9 = no driver).
        binding_has_v3: the bindings define the `_v3` process-list functions.
        library_has_v3: the driver library has them; when False, `_v3` raises
            FunctionNotFound and the unversioned wrapper NVMLLibraryMismatchError.
    """

    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_ResetRequired = NVMLError_ResetRequired
    NVMLError_Unknown = NVMLError_Unknown
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = NVML_DEVICE_MIG_DISABLE

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: int | None = None,
        binding_has_v3: bool = True,
        library_has_v3: bool = True,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.library_has_v3 = library_has_v3
        self.calls: list[tuple[str, str]] = []  # (function, uuid or "")
        self.initialized = 0
        self._mig_cache: dict[str, _Handle] = {}  # one handle per MIG instance, as NVML keeps them
        for kind in ("Compute", "Graphics"):
            setattr(self, f"nvmlDeviceGet{kind}RunningProcesses_v2", self._procs_fn(kind, "_v2"))
            if binding_has_v3:
                setattr(self, f"nvmlDeviceGet{kind}RunningProcesses_v3", self._procs_fn(kind, "_v3"))
            setattr(self, f"nvmlDeviceGet{kind}RunningProcesses", self._procs_fn(kind, ""))

    # --- bookkeeping -----------------------------------------------------------------

    def count(self, function: str, uuid: str = "") -> int:
        """How many times `function` was called (on the GPU `uuid`, if given)."""
        return sum(1 for f, u in self.calls if f == function and (not uuid or u == uuid))

    def _enter(self, function: str, handle: _Handle | None = None) -> FakeGpu | None:
        gpu = handle.gpu if handle is not None else None
        self.calls.append((function, gpu.uuid if gpu else ""))
        if self.initialized <= 0 and function != "nvmlInit":
            raise NVMLError(1)
        if gpu is not None:
            if gpu.lost:
                raise NVMLError(15)
            if function in gpu.fail:
                raise gpu.fail[function]
        return gpu

    # --- library ---------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        handle = _Handle(self.gpus[index])
        self._enter("nvmlDeviceGetHandleByIndex", handle)
        return handle

    # --- identity --------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._enter("nvmlDeviceGetName", handle).name

    # --- readings --------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        if gpu.mig is not None or handle in self._mig_handles():
            raise NVMLError(3)  # not supported on MIG-enabled GPUs or MIG instances
        return SimpleNamespace(gpu=gpu.utilization, memory=gpu.utilization // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> SimpleNamespace:
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(
            total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used
        )

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetPowerUsage", handle).power_mw

    def _procs_fn(self, kind: str, suffix: str) -> Any:
        function = f"nvmlDeviceGet{kind}RunningProcesses{suffix}"

        def running(handle: _Handle) -> list[SimpleNamespace]:
            gpu = self._enter(function, handle)
            if not self.library_has_v3 and suffix == "_v3":
                raise NVMLError(13)
            if not self.library_has_v3 and suffix == "":
                raise NVMLLibraryMismatchError(
                    "Unversioned function called and the pyNVML version does not match the NVML lib version."
                )
            wanted = {"compute", "both"} if kind == "Compute" else {"graphics", "both"}
            return [
                SimpleNamespace(
                    pid=p.pid, usedGpuMemory=p.used_memory,
                    gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF,
                )
                for p in gpu.processes
                if p.kind in wanted
            ]

        return running

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, timeStamp: int) -> list[SimpleNamespace]:
        gpu = self._enter("nvmlDeviceGetProcessUtilization", handle)
        self.calls.append(("lastSeenTimeStamp", str(timeStamp)))
        if gpu.mig is not None or handle in self._mig_handles():
            raise NVMLError(3)
        if not gpu.util_samples:
            # pynvml's size query returns NVML_SUCCESS, which it raises as a bare NVMLError(0)
            raise NVMLError(0)
        newer = [s for s in gpu.util_samples if s[1] > timeStamp]
        if not newer:
            raise NVMLError(6)
        return [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for pid, ts, sm in newer
        ]

    # --- MIG -------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        gpu = self._enter("nvmlDeviceGetMigMode", device)
        if gpu.mig is None:
            raise NVMLError(3)  # as on a pre-Ampere GPU
        return [NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetMaxMigDeviceCount", device)
        return len(gpu.mig or [])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle, index: int) -> _Handle:
        gpu = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", device)
        instance = (gpu.mig or [])[index]
        if instance is None:
            raise NVMLError(6)  # empty slot
        return self._mig_handle(instance)

    def _mig_handle(self, instance: FakeGpu) -> _Handle:
        return self._mig_cache.setdefault(instance.uuid, _Handle(instance))

    def _mig_handles(self) -> list[_Handle]:
        return list(self._mig_cache.values())
