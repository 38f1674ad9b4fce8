"""The NVML calls a poll makes on one device, in two ways: pynvml's wrappers, or its library directly.

`NvmlGpuSource` reads every device at every poll through the same small surface (`uuid`,
`utilization`, `memory`, `power`, `energy`, a process list, `process_samples`), each call returning plain
values or raising the module's `NVMLError` for a code, as pynvml's wrappers do:

- `BindingCalls` calls the module's `nvmlDevice*` functions: any module shaped like pynvml, the
  tests' Python fake included.
- `DirectCalls` calls the C functions of the library that the real pynvml loaded (`pynvml.nvmlLib`),
  with buffers allocated once per device and reused, read straight out of the ctypes arrays. pynvml's
  wrappers cost several times the driver call itself (bench/bench_agent.py, NVML rows): a size query
  and a fill for every list (here one call: the buffer kept from the last poll is large enough, as
  NVML allows), a fresh struct and a Python object per entry. The structs are pynvml's own
  (`c_nvmlMemory_t`, `c_nvmlProcessInfo_v3_t` / `_v2_t`, `c_nvmlProcessUtilizationSample_t`), so
  their layout is the bindings' version-correct one, as with the wrappers.

Only the hot path goes direct: init, inventory, MIG and error strings stay with pynvml. A call on a
wedged GPU blocks the same way either way (ctypes lets go of the GIL inside it); the caller runs
these on its read threads.
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["BindingCalls", "DirectLibrary", "calls_for"]

_SUCCESS = 0
_NOT_FOUND = 6
_INSUFFICIENT_SIZE = 7
_FUNCTION_NOT_FOUND = 13
_NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong: a process's memory not known
_UUID_SIZE = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
_FIRST_ENTRIES = 32  # entries of a list buffer at first; grown (count * 2 + 5, as pynvml) when NVML asks

# Process list getters: the bases, tried versioned first (see NvmlGpuSource._running).
Getter = Callable[[Any], list[tuple[int, "int | None"]]]


def calls_for(nv: Any) -> tuple[Callable[[Any], Any], Callable[[str], list[Getter]]]:
    """(device handle → its calls, getter base name → its process getters) for module `nv`.

    Direct where `nv` is the real pynvml with its library loaded (after nvmlInit) and its structs
    map onto plain fields; pynvml's wrappers otherwise (a fake, or bindings laid out otherwise).
    """
    direct = DirectLibrary.of(nv)
    if direct is not None:
        return direct.device, direct.getters
    return (lambda handle: BindingCalls(nv, handle)), (lambda base: binding_getters(nv, base))


class BindingCalls:
    """One device's calls through the module's own wrappers."""

    __slots__ = ("nv", "handle")

    def __init__(self, nv: Any, handle: Any) -> None:
        self.nv = nv
        self.handle = handle

    def uuid(self) -> str | bytes:
        return self.nv.nvmlDeviceGetUUID(self.handle)

    def utilization(self) -> int:
        return self.nv.nvmlDeviceGetUtilizationRates(self.handle).gpu

    def memory(self) -> tuple[int, int]:
        m = self.nv.nvmlDeviceGetMemoryInfo(self.handle)
        return m.used, m.total

    def power(self) -> int:
        return self.nv.nvmlDeviceGetPowerUsage(self.handle)

    def energy(self) -> int:
        """NVML's total-energy counter: millijoules since the driver loaded."""
        fn = getattr(self.nv, "nvmlDeviceGetTotalEnergyConsumption", None)
        if fn is None:  # bindings older than the function: as pynvml answers for one the library lacks
            raise self.nv.NVMLError(_FUNCTION_NOT_FOUND)
        return fn(self.handle)

    def process_samples(self, since_us: int) -> list[tuple[int, int, int]]:
        """(pid, timeStamp µs, smUtil %) of the samples newer than `since_us`; [] when there are none."""
        try:
            samples = self.nv.nvmlDeviceGetProcessUtilization(self.handle, since_us)
        except self.nv.NVMLError as exc:
            # value 0: the wrapper's size query found no samples at all; NotFound: none newer
            if getattr(exc, "value", None) in (_SUCCESS, _NOT_FOUND):
                return []
            raise
        return [(s.pid, s.timeStamp, s.smUtil) for s in samples]


def binding_getters(nv: Any, base: str) -> list[Getter]:
    # Versioned first: an unversioned wrapper follows the bindings' newest struct, which an older
    # driver may lack. A getter the library lacks raises and is dropped by the caller.
    names = (base + "_v3", base, base + "_v2")
    return [_binding_getter(getattr(nv, n)) for n in names if hasattr(nv, n)]


def _binding_getter(fn: Callable[[Any], list[Any]]) -> Getter:
    def listed(calls: BindingCalls) -> list[tuple[int, int | None]]:
        return [(int(p.pid), p.usedGpuMemory) for p in fn(calls.handle)]
    return listed


class _Layout:
    """A pynvml struct read straight out of an array of it: the fields wanted, in their order, per entry.

    The unpacking format is built from the struct's own field offsets and sizes (ctypes knows them for
    the bindings' definition), skipping the fields not wanted: one tuple an entry, no object.
    """

    def __init__(self, struct_type: type[ctypes.Structure], wanted: tuple[str, ...]) -> None:
        self.type = struct_type
        self.size = ctypes.sizeof(struct_type)
        self.wanted = wanted
        fmt = _format(struct_type, wanted)
        self.unpack = struct.Struct(fmt).iter_unpack if fmt is not None else None

    def array(self, entries: int) -> tuple[Any, memoryview]:
        arr = (self.type * entries)()
        return arr, memoryview(arr).cast("B")

    def rows(self, arr: Any, view: memoryview, n: int) -> list[tuple]:
        if self.unpack is not None:
            return list(self.unpack(view[: n * self.size]))
        return [tuple(getattr(arr[i], w) for w in self.wanted) for i in range(n)]


_UNSIGNED = {ctypes.c_ubyte, ctypes.c_ushort, ctypes.c_uint, ctypes.c_ulong, ctypes.c_ulonglong}
_SIGNED = {ctypes.c_byte, ctypes.c_short, ctypes.c_int, ctypes.c_long, ctypes.c_longlong}
_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}


def _format(struct_type: type[ctypes.Structure], wanted: tuple[str, ...]) -> str | None:
    """A struct-module format (standard sizes, no alignment) that reads the `wanted` integer fields of
    one entry at their offsets and skips the rest; None where that cannot be done (then: attributes)."""
    types = {f[0]: f[1] for f in struct_type._fields_ if len(f) == 2}
    fmt, at = "=", 0
    for name in wanted:
        ftype = types.get(name)
        if ftype not in _UNSIGNED and ftype not in _SIGNED:
            return None
        offset, size = getattr(struct_type, name).offset, ctypes.sizeof(ftype)
        if offset < at or size not in _CODES:
            return None  # not in offset order
        code = _CODES[size]
        fmt += ("x" * (offset - at)) + (code.upper() if ftype in _UNSIGNED else code)
        at = offset + size
    fmt += "x" * (ctypes.sizeof(struct_type) - at)
    return fmt if struct.calcsize(fmt) == ctypes.sizeof(struct_type) else None


def _missing(*_args: Any) -> int:
    return _FUNCTION_NOT_FOUND  # what pynvml raises for a function the library lacks


class DirectLibrary:
    """The C functions of the library pynvml loaded, resolved once, and the structs it defines."""

    def __init__(self, nv: Any) -> None:
        self.error: type[Exception] = nv.NVMLError
        lib = nv.nvmlLib
        self._lib = lib
        # Own function objects (lib[name] is a new one each time): pynvml's are left as they are.
        self.uuid = self._fn("nvmlDeviceGetUUID")
        self.utilization = self._fn("nvmlDeviceGetUtilizationRates")
        self.memory = self._fn("nvmlDeviceGetMemoryInfo")
        self.power = self._fn("nvmlDeviceGetPowerUsage")
        self.energy = self._fn("nvmlDeviceGetTotalEnergyConsumption")
        self.process_util = self._fn("nvmlDeviceGetProcessUtilization")
        self.util_type = nv.c_nvmlUtilization_t
        self.memory_type = nv.c_nvmlMemory_t
        self.samples = _Layout(nv.c_nvmlProcessUtilizationSample_t, ("pid", "timeStamp", "smUtil"))
        self._process_layouts = {
            suffix: _Layout(getattr(nv, name), ("pid", "usedGpuMemory"))
            for suffix, name in (("_v3", "c_nvmlProcessInfo_v3_t"), ("_v2", "c_nvmlProcessInfo_v2_t"))
            if hasattr(nv, name)
        }

    @classmethod
    def of(cls, nv: Any) -> DirectLibrary | None:
        """The library of the real pynvml `nv`, None for anything else (a fake) or before nvmlInit."""
        needed = ("nvmlLib", "c_nvmlUtilization_t", "c_nvmlMemory_t", "c_nvmlProcessUtilizationSample_t",
                  "c_nvmlProcessInfo_v2_t", "NVMLError")
        if not all(getattr(nv, n, None) is not None for n in needed):
            return None
        if not isinstance(nv.nvmlLib, ctypes.CDLL):
            return None
        try:
            return cls(nv)
        except (AttributeError, TypeError, ValueError):
            return None  # bindings laid out otherwise: their wrappers are used

    def _fn(self, name: str) -> Callable[..., int]:
        try:
            fn = self._lib[name]
        except AttributeError:
            return _missing
        fn.restype = ctypes.c_int
        return fn

    def device(self, handle: Any) -> DirectCalls:
        return DirectCalls(self, handle)

    def getters(self, base: str) -> list[Getter]:
        """The process getters of `base` the library has: `_v3`, then `_v2` (pynvml's unversioned wrapper
        calls `_v3` too), each with the bindings' struct for it."""
        out: list[Getter] = []
        for suffix, layout in self._process_layouts.items():
            try:
                fn = self._lib[base + suffix]
            except AttributeError:
                continue  # a driver without this version: as pynvml's FunctionNotFound
            fn.restype = ctypes.c_int
            out.append(_direct_getter(fn, layout))
        return out


def _direct_getter(fn: Callable[..., int], layout: _Layout) -> Getter:
    def listed(calls: DirectCalls) -> list[tuple[int, int | None]]:
        return [(pid, None if used == _NOT_AVAILABLE else used) for pid, used in calls.fill(fn, layout)]
    return listed


class DirectCalls:
    """One device's calls into the library, with its buffers (one device is read by one thread at a time)."""

    __slots__ = ("lib", "handle", "_uuid", "_uuid_len", "_util", "_util_ref", "_util_gpu", "_mem", "_mem_ref",
                 "_mem_used", "_mem_total", "_power", "_power_ref", "_energy", "_energy_ref", "_count", "_count_ref",
                 "_arrays")

    def __init__(self, lib: DirectLibrary, handle: Any) -> None:
        self.lib = lib
        self.handle = handle
        self._uuid = ctypes.create_string_buffer(_UUID_SIZE)
        self._uuid_len = ctypes.c_uint(_UUID_SIZE)
        self._util = lib.util_type()
        self._util_ref = ctypes.byref(self._util)
        # Views of the fields read (pynvml's structs answer attribute reads through Python code)
        self._util_gpu = _view(self._util, "gpu")
        self._mem = lib.memory_type()
        self._mem_ref = ctypes.byref(self._mem)
        self._mem_used, self._mem_total = _view(self._mem, "used"), _view(self._mem, "total")
        self._power = ctypes.c_uint()
        self._power_ref = ctypes.byref(self._power)
        self._energy = ctypes.c_ulonglong()
        self._energy_ref = ctypes.byref(self._energy)
        self._count = ctypes.c_uint()
        self._count_ref = ctypes.byref(self._count)
        self._arrays: dict[int, tuple[Any, memoryview]] = {}  # id(layout) → its buffer

    def uuid(self) -> bytes:
        ret = self.lib.uuid(self.handle, self._uuid, self._uuid_len)
        if ret:
            raise self.lib.error(ret)
        return self._uuid.value

    def utilization(self) -> int:
        ret = self.lib.utilization(self.handle, self._util_ref)
        if ret:
            raise self.lib.error(ret)
        return self._util_gpu.value

    def memory(self) -> tuple[int, int]:
        ret = self.lib.memory(self.handle, self._mem_ref)
        if ret:
            raise self.lib.error(ret)
        return self._mem_used.value, self._mem_total.value

    def power(self) -> int:
        ret = self.lib.power(self.handle, self._power_ref)
        if ret:
            raise self.lib.error(ret)
        return self._power.value

    def energy(self) -> int:
        """NVML's total-energy counter: millijoules since the driver loaded."""
        ret = self.lib.energy(self.handle, self._energy_ref)
        if ret:
            raise self.lib.error(ret)
        return self._energy.value

    def process_samples(self, since_us: int) -> list[tuple[int, int, int]]:
        """(pid, timeStamp µs, smUtil %) of the samples newer than `since_us`; [] when there are none."""
        layout = self.lib.samples
        fn, since = self.lib.process_util, ctypes.c_ulonglong(since_us)
        arr, view = self._buffer(layout)
        for _ in range(3):  # the buffer grows when NVML asks for more (a sample each process)
            self._count.value = len(arr)
            ret = fn(self.handle, arr, self._count_ref, since)
            if ret == _SUCCESS:
                return layout.rows(arr, view, min(self._count.value, len(arr)))
            if ret == _NOT_FOUND:
                return []  # nothing newer than `since`
            if ret != _INSUFFICIENT_SIZE:
                raise self.lib.error(ret)
            arr, view = self._grow(layout)
        raise self.lib.error(_INSUFFICIENT_SIZE)

    def fill(self, fn: Callable[..., int], layout: _Layout) -> list[tuple]:
        """The entries of one process list: one call while the buffer is large enough (no size query)."""
        arr, view = self._buffer(layout)
        for _ in range(3):  # a list may grow between NVML's answer and the next call
            self._count.value = len(arr)
            ret = fn(self.handle, self._count_ref, arr)
            if ret == _SUCCESS:
                return layout.rows(arr, view, min(self._count.value, len(arr)))
            if ret != _INSUFFICIENT_SIZE:
                raise self.lib.error(ret)
            arr, view = self._grow(layout)
        raise self.lib.error(_INSUFFICIENT_SIZE)

    def _buffer(self, layout: _Layout) -> tuple[Any, memoryview]:
        got = self._arrays.get(id(layout))
        if got is None:
            got = self._arrays[id(layout)] = layout.array(_FIRST_ENTRIES)
        return got

    def _grow(self, layout: _Layout) -> tuple[Any, memoryview]:
        got = self._arrays[id(layout)] = layout.array(self._count.value * 2 + 5)  # as pynvml oversizes
        return got


def _view(obj: ctypes.Structure, name: str) -> Any:
    """A ctypes scalar over one field of `obj`'s memory: `.value` reads it as the last call left it."""
    ftype = {f[0]: f[1] for f in type(obj)._fields_}[name]
    return ftype.from_buffer(obj, getattr(type(obj), name).offset)
