"""The GPUs' true activity from NVML's GPU Performance Monitoring (GPM), read at a slow cadence of its own.

NVML's utilisation is the share of time any kernel ran, so a collective spinning on one SM reads 100 %.
GPM (Hopper and later) measures what the units did between two samples: SM activity and occupancy,
tensor-core activity, DRAM bandwidth, PCIe and NVLink throughput. `GpmReader.read()` takes a new sample of
every device that offers it and returns the metrics between it and the device's previous one; a MIG
instance is sampled through its parent (`nvmlGpmMigSampleGet` with its GPU instance id), under its own
UUID, as the GPU source lists it.

`GpmThread` runs the reader on a thread of its own every `every_s` (10 s by default): the poll only
takes what it left (`take`), one lock and a swap, so a GPM call never costs a poll, and a GPU that
wedges inside one delays its activity and nothing else. A GPU without GPM (before Hopper, or a driver
or bindings without the functions) is said once, in one line for the node, and keeps its other readings.
The `pynvml` module is passed in, as for `nvml.py`.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from clusterwatch.background import BackgroundThread
from clusterwatch.model import GpuActivity

__all__ = ["GpmReader", "GpmThread", "METRICS", "NO_GPM_LINE"]

# GpuActivity field → NVML_GPM_METRIC_* (nvml.h); the throughputs come in MiB/s
METRICS = {
    "sm_active": 2,  # SM_UTIL
    "sm_occupancy": 3,  # SM_OCCUPANCY
    "tensor_active": 5,  # ANY_TENSOR_UTIL
    "dram_active": 10,  # DRAM_BW_UTIL
    "pcie_tx_bytes_per_s": 20,
    "pcie_rx_bytes_per_s": 21,
    "nvlink_tx_bytes_per_s": 61,  # NVLINK_TOTAL_TX_PER_SEC
    "nvlink_rx_bytes_per_s": 60,
}
_MIB = 1 << 20
_PERCENT = frozenset({"sm_active", "sm_occupancy", "tensor_active", "dram_active"})

# NVML return codes (nvml.h)
_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND = 3, 4, 13
_GPU_IS_LOST, _RESET_REQUIRED = 15, 16
_NO_GPM = frozenset({_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND})
_GONE = frozenset({_GPU_IS_LOST, _RESET_REQUIRED})
_MIG_ENABLED = 1

NO_GPM_LINE = ("GPU Performance Monitoring (GPM) not offered by %s (%s): SM, tensor and DRAM activity are not read "
               "there; its utilisation, memory and power still are. GPM needs a Hopper or later GPU and a "
               "driver of R520 or later.")


@dataclass(slots=True)
class _Device:
    """One GPU or MIG instance GPM samples: its last sample (None before the first) and when it was taken."""

    uuid: str
    sample_into: Callable[[Any], Any]  # takes a sample into the buffer given
    last: Any = None
    spare: Any = None  # the buffer the next sample goes into
    last_at: float = 0.0


def _code(exc: BaseException) -> int | None:
    """The NVML error code of a failed call; a binding too old to have the function (AttributeError) or one
    that says it does not implement it reads as NVML's own FUNCTION_NOT_FOUND."""
    value = getattr(exc, "value", None)
    if isinstance(value, int):
        return value
    return _FUNCTION_NOT_FOUND if isinstance(exc, (AttributeError, NotImplementedError)) else None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class GpmReader:
    """Samples every device that offers GPM at each `read()`; one `nvmlInit` for its life.

    Args:
        nvml: the `pynvml` module (nvidia-ml-py), or a fake with the same functions and errors.
        log: where the one line about GPUs without GPM goes.
        clock: monotonic seconds, for each reading's window.
        relist_every: reads between listings of the GPUs (also after a GPU is lost).
    """

    def __init__(self, nvml: Any, *, log: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic, relist_every: int = 6) -> None:
        self._nv = nvml
        self._log = log or logging.getLogger(__name__)
        self._clock = clock
        self._relist_every = relist_every
        self._reads = 0
        self._relist = True
        self._devices: dict[str, _Device] = {}
        self._said: set[str] = set()  # GPUs said to lack GPM
        self._refused: set[str] = set()  # devices that said they have GPM, then refused a sample: not asked again
        self.errors = 0
        self.without: list[str] = []  # GPUs (UUIDs) without GPM at the last listing
        nvml.nvmlInit()
        self._get = self._metrics_get()

    def _metrics_get(self) -> Any:
        """pynvml's request struct, filled once with the metrics wanted and reused (it is some 20 kB)."""
        nv = self._nv
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(METRICS)
        for i, metric in enumerate(METRICS.values()):
            get.metrics[i].metricId = metric
        return get

    def close(self) -> None:
        """Free the samples and let go of NVML."""
        for dev in self._devices.values():
            self._free(dev)
        self._devices.clear()
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass  # nothing left to release

    def read(self) -> dict[str, GpuActivity]:
        """A sample of every device with GPM; the activity of those sampled before, by UUID."""
        if self._relist or self._reads % self._relist_every == 0:
            self._list()
        self._reads += 1
        out = {}
        for dev in list(self._devices.values()):
            try:
                got = self._sample(dev)
            except self._nv.NVMLError as exc:
                self._on_error(dev, exc)
                continue
            if got is not None:
                out[dev.uuid] = got
        return out

    def _sample(self, dev: _Device) -> GpuActivity | None:
        nv = self._nv
        if dev.spare is None:
            dev.spare = nv.nvmlGpmSampleAlloc()
        dev.sample_into(dev.spare)
        now = self._clock()
        prev, prev_at = dev.last, dev.last_at
        dev.last, dev.spare, dev.last_at = dev.spare, prev, now
        if prev is None:
            return None  # the first sample: the window starts here
        get = self._get
        get.sample1, get.sample2 = prev, dev.last
        nv.nvmlGpmMetricsGet(get)
        figures = {}
        for i, name in enumerate(METRICS):
            m = get.metrics[i]
            if m.nvmlReturn == 0:  # a metric the GPU does not offer (NVLink on a PCIe card) answers its own code
                figures[name] = float(m.value) if name in _PERCENT else float(m.value) * _MIB
        return GpuActivity(window_s=now - prev_at, **figures)

    def _on_error(self, dev: _Device, exc: Exception) -> None:
        code = _code(exc)
        self._free(dev)  # the next read starts a new window
        if code in _NO_GPM:
            del self._devices[dev.uuid]
            self._refused.add(dev.uuid)
            self._say_without([dev.uuid], str(exc))
            return
        self.errors += 1
        if code in _GONE:
            self._relist = True

    def _free(self, dev: _Device) -> None:
        for sample in (dev.last, dev.spare):
            if sample is not None:
                try:
                    self._nv.nvmlGpmSampleFree(sample)
                except self._nv.NVMLError:
                    pass
        dev.last = dev.spare = None

    # --- which devices ---------------------------------------------------------------------

    def _list(self) -> None:
        self._relist = False
        found: dict[str, Callable[[Any], Any]] = {}
        without: dict[str, str] = {}
        nv = self._nv
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError:
            self.errors += 1
            self._relist = True
            return
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                why = self._why_not(handle)
            except nv.NVMLError:
                self._relist = True  # listed again at the next read
                continue
            if why:
                without[uuid] = why
                continue
            try:
                found.update(self._targets(handle, uuid))
            except nv.NVMLError:
                self.errors += 1
                self._relist = True
        for uuid in self._refused & found.keys():
            del found[uuid]
        for uuid in [u for u in self._devices if u not in found]:
            self._free(self._devices.pop(uuid))
        for uuid, sample_into in found.items():
            dev = self._devices.get(uuid)
            if dev is None:
                self._devices[uuid] = _Device(uuid, sample_into)
            else:
                dev.sample_into = sample_into  # the handle may be new (a reset)
        self.without = sorted(without)
        new = [u for u in self.without if u not in self._said]
        if new:
            self._say_without(new, "; ".join(sorted({without[u] for u in new})))

    def _why_not(self, handle: Any) -> str:
        """Why a GPU does not offer GPM, "" when it does."""
        nv = self._nv
        try:
            support = nv.nvmlGpmQueryDeviceSupport(handle)
        except (nv.NVMLError, AttributeError) as exc:
            if _code(exc) in _NO_GPM:
                return str(exc) if not isinstance(exc, AttributeError) else "bindings without GPM"
            raise
        return "" if support.isSupportedDevice else "not a GPM device"

    def _targets(self, handle: Any, uuid: str) -> dict[str, Callable[[Any], Any]]:
        """The GPU itself, or in MIG mode each of its instances (sampled through the parent, by instance id)."""
        nv = self._nv
        try:
            mig = nv.nvmlDeviceGetMigMode(handle)[0] == _MIG_ENABLED
        except (nv.NVMLError, AttributeError):
            mig = False  # before Ampere, or bindings without MIG
        if not mig:
            return {uuid: lambda sample: nv.nvmlGpmSampleGet(handle, sample)}
        out: dict[str, Callable[[Any], Any]] = {}
        for slot in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                instance = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                mig_uuid = _text(nv.nvmlDeviceGetUUID(instance))
                gi = nv.nvmlDeviceGetGpuInstanceId(instance)
            except nv.NVMLError:
                continue  # an empty slot
            out[mig_uuid] = lambda sample, gi=gi: nv.nvmlGpmMigSampleGet(handle, gi, sample)
        return out

    def _say_without(self, uuids: list[str], why: str) -> None:
        self._said.update(uuids)
        self._log.warning(NO_GPM_LINE, ", ".join(uuids), why)


class GpmThread:
    """A GpmReader read every `every_s` on a thread of its own; `take()` gives what it read since the last take.

    Args:
        open_reader: builds the reader (on the thread: its nvmlInit and listing never hold up the caller).
        every_s: the cadence; also the window of each reading.
        log: where a reader that cannot start says so.
    """

    def __init__(self, open_reader: Callable[[], GpmReader], every_s: float = 10.0,
                 log: logging.Logger | None = None) -> None:
        self._open = open_reader
        self.every_s = every_s
        self._log = log or logging.getLogger(__name__)
        self._lock = threading.Lock()
        self._latest: dict[str, GpuActivity] = {}
        self._reader: GpmReader | None = None
        self._thread = BackgroundThread(self._run, name="clusterwatch-gpu-activity", os_name="cw-gpu-gpm")

    @property
    def errors(self) -> int:
        """GPM reads that failed (a GPU without GPM is not an error)."""
        return self._reader.errors if self._reader is not None else 0

    def start(self) -> GpmThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.5) -> bool:
        """Stop within `timeout`; whether the thread has ended (it frees its samples and NVML itself)."""
        return self._thread.stop(timeout)

    def take(self) -> dict[str, GpuActivity]:
        """The latest activity of each device read since the last take (each reading is given once)."""
        with self._lock:
            got, self._latest = self._latest, {}
        return got

    def _run(self) -> None:
        stopping = self._thread.stopping
        try:
            reader = self._open()
        except Exception as exc:  # NVMLError or bindings without GPM: the GPU source still reads the rest
            self._log.warning("GPU activity (GPM) not read: %s", exc)
            return
        self._reader = reader
        try:
            while not stopping.is_set():
                try:
                    got = reader.read()
                except Exception:  # one bad read must not end the thread
                    reader.errors += 1
                    self._log.exception("GPU activity (GPM): read failed")
                    got = {}
                if got:
                    with self._lock:
                        self._latest.update(got)
                stopping.wait(self.every_s)
        finally:
            reader.close()
