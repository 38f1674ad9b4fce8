"""The node's physical GPUs as the health readers see them: UUID, NVML handle, PCI bus address.

Health is a property of the board, not of a MIG slice: events, ECC, throttling and the kernel
log's XID lines all name the whole GPU (the kernel log by bus address), so the health readers
walk NVML's device indexes themselves rather than the GPU source's inventory of instances.
The `pynvml` module is passed in, as for `agent/backends/nvml.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clusterwatch.agent.health.kmsg import pci_key

__all__ = ["PhysicalGpu", "physical_gpus", "nvml_code", "UNSUPPORTED", "GONE"]

# NVML return codes (nvml.h)
_NOT_SUPPORTED, _NO_PERMISSION, _INVALID_ARGUMENT, _FUNCTION_NOT_FOUND = 3, 4, 2, 13
_GPU_IS_LOST, _RESET_REQUIRED = 15, 16
UNSUPPORTED = frozenset({_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND})
GONE = frozenset({_GPU_IS_LOST, _RESET_REQUIRED})


def nvml_code(exc: BaseException) -> int | None:
    """The NVML return code an exception of pynvml carries (a missing symbol is FunctionNotFound)."""
    value = getattr(exc, "value", None)
    if isinstance(value, int):
        return value
    if isinstance(exc, (AttributeError, NotImplementedError)):
        return _FUNCTION_NOT_FOUND
    return None


@dataclass(frozen=True, slots=True)
class PhysicalGpu:
    uuid: str
    handle: Any
    pci: str | None      # pci_key form; None when NVML would not say


def physical_gpus(nvml: Any) -> list[PhysicalGpu]:
    """Every whole GPU NVML lists; one that does not answer for its UUID is left out (it is read again later)."""
    out = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
        except nvml.NVMLError:
            continue
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        pci = None
        try:
            bus_id = nvml.nvmlDeviceGetPciInfo(handle).busId
            pci = pci_key(bus_id.decode() if isinstance(bus_id, bytes) else bus_id)
        except (nvml.NVMLError, AttributeError):
            pass
        out.append(PhysicalGpu(uuid=uuid, handle=handle, pci=pci))
    return out
