"""The GPU source over NVML, through the `pynvml` module of nvidia-ml-py.

The module is passed to `NvmlGpuSource`, so tests hand it a fake with the same
functions and error classes; only `open_nvml_source` imports the real one. The suite also
runs it through the real pynvml against a C stand-in for the driver library
(tests/fakes/nvml_stub), so the bindings' structs and fallbacks are tested too.

How NVML errors map (codes from nvml.h, read from `NVMLError.value`):

    NotSupported, NoPermission,     the field is None, and is not asked again for that device
    FunctionNotFound, mismatch
    GpuIsLost, ResetRequired        the device reads stale this poll: no reading, its processes as
                                    last listed with no figures (a gap, not a freed GPU); one
                                    error counted; the other GPUs are still read, and the
                                    inventory is read again
    anything else (Unknown, ...)    that one field is None and one error counted; the device's
                                    other readings stand (a failed process list keeps the
                                    processes last listed, their figures None)
    LibraryNotFound, DriverNotLoaded,   at construction: SourceUnavailable with one line
    ... (any error in nvmlInit)         that says what and what to do

The GPUs are read off the poll thread under a per-poll deadline (`nvml_rounds.Rounds`: the
healthy ones in turn on one thread, a GPU that overran on a thread of its own): a GPU that has
not answered by then reads stale for that poll and is counted, and the other GPUs and the host
sampling go on. The inventory is read again every minute and whenever a device
stops answering or its handle names another UUID (a reset, a MIG reconfiguration).

Nothing here logs per poll: failures are counted in `GpuPoll.errors`, and a GPU that
stops answering is logged once, when it first does.
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from clusterwatch.agent.backends.gpu import GpuPoll
from clusterwatch.agent.backends.nvml_calls import calls_for
from clusterwatch.agent.backends.nvml_gpm import GpmReader, GpmThread
from clusterwatch.agent.backends.nvml_rounds import Rounds
from clusterwatch.agent.backends.nvml_util import newest_by_pid, process_util, query_since
from clusterwatch.agent.backends.pid_visibility import NOT_IN_PROC, OTHER_NAMESPACE, PidListings, proc_pid_namespace

from clusterwatch.errors import SourceUnavailable
from clusterwatch.log_once import SaidOnce
from clusterwatch.model import GpuInfo, GpuReading, GpuUse

__all__ = ["NvmlGpuSource", "open_nvml_source", "host_pid_visible"]

# NVML return codes (nvml.h); stable across driver versions.
_NO_PERMISSION = 4
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18

_FIELD_UNSUPPORTED = frozenset({_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND})
_GPU_GONE = frozenset({_GPU_IS_LOST, _RESET_REQUIRED})
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_MIG_UNLISTED = "GPU at NVML index %d: MIG instances not listed (%s); reading the whole GPU"
_PROCESS_KINDS = ("compute", "graphics", "mps")
_GETTER_BASES = {
    "compute": "nvmlDeviceGetComputeRunningProcesses",
    "graphics": "nvmlDeviceGetGraphicsRunningProcesses",
    # processes served by the Multi-Process Service, listed under their own pids
    "mps": "nvmlDeviceGetMPSComputeRunningProcesses",
}

_DEMO_HINT = "or pass --gpu-source sim for a demo."
# Every SourceUnavailable line is WHAT + this + WHAT TO DO: `--gpu-source auto` runs on without GPU
# data; `--gpu-source nvml`, which cannot, words it as an error (backends/select.py).
WITHOUT_GPU_DATA = "; running without GPU data. "
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
_NO_GETTER_LINE = (
    "NVML: no version of %s works with this driver (%s); processes on the GPUs are not listed. "
    "Install an nvidia-ml-py that matches the driver (see docs/gpus.md)."
)
_FOREIGN_PID_LINE = (
    "NVML listed pid %d on GPU %s, which is not a process of this host; such pids are dropped and "
    "counted. The bindings' structs may not match the driver's: install a supported nvidia-ml-py "
    "(see docs/gpus.md)."
)
NAMESPACE_LINE = (
    "the agent runs in a PID namespace of its own (a container without the host's PIDs): NVML names "
    "host pids, which it cannot see, so GPU memory is shown per GPU but not per process. Run the agent "
    "with the host's PID namespace (docker: pid: host; Kubernetes: hostPID: true)."
)
NOT_IN_PROC_LINE = (
    "NVML keeps naming pids that are no process in this agent's /proc (a container without the host's "
    "PIDs?), so GPU memory is shown per GPU but not per process. Run the agent with the host's PID "
    "namespace (docker: pid: host; Kubernetes: hostPID: true)."
)


class _GpuGone(Exception):
    """Raised inside a read when a device answers GPU_IS_LOST or RESET_REQUIRED."""


@dataclass(slots=True)
class _Device:
    """One GPU or MIG instance as the source tracks it between polls."""

    info: GpuInfo
    handle: Any
    calls: Any  # nvml_calls.DirectCalls or BindingCalls of `handle`: what a poll reads it through
    is_mig: bool = False
    # fields NVML said it cannot give for this device: never asked again
    unsupported: set[str] = field(default_factory=set)
    # newest process-utilisation timeStamp taken (CPU µs): pynvml does not return it
    util_last_ts: int = 0
    # pid → (SM utilisation %, poll time it was sampled)
    util_seen: dict[int, tuple[float, float]] = field(default_factory=dict)
    # kind → the pids last listed, kept for a poll whose list fails
    last_listed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # the pids it listed last time that were processes here: not looked up in /proc again (NVML lists
    # only processes that hold a context, so a pid listed again is that process or a new one that holds
    # one; a pid that never was here, as broken bindings read, is still looked up every time)
    visible: frozenset[int] = frozenset()
    gone: bool = False


@dataclass(slots=True)
class _Gpu:
    """One NVML index (a physical GPU) and the devices it shows (itself or its MIG instances)."""

    index: int
    devices: list[_Device] = field(default_factory=list)
    enumerate_due: bool = True
    stuck: bool = False  # past its deadline at the last poll (logged once an episode)
    left_out_logged: bool = False


@dataclass(slots=True)
class _Result:
    """One GPU's part of the poll."""

    readings: list[GpuReading] = field(default_factory=list)
    uses: dict[int, list[GpuUse]] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)
    errors: int = 0
    present: int = 0  # NVML pids listed that are processes here
    absent: set[int] = field(default_factory=set)  # NVML pids listed that are not

    def add_stale(self, devices: list[_Device]) -> None:
        """Devices that did not answer: no reading, and their processes as last listed, figures unknown.

        A gap, not a freed GPU: the collector still sees the processes on it (so `idle_gpu` does not
        read "no process"), and no memory figure (so no leak rule reads a drop to zero).
        """
        for dev in devices:
            self.stale.append(dev.info.uuid)
            for pid in sorted({p for pids in dev.last_listed.values() for p in pids}):
                self.uses.setdefault(pid, []).append(GpuUse(gpu_uuid=dev.info.uuid))


def host_pid_visible(pid: int) -> bool:
    """Whether `pid` is a live process in this agent's /proc (pid_max is at most 2^22 on Linux)."""
    return 0 < pid <= 4_194_304 and os.path.isdir(f"/proc/{pid}")


class NvmlGpuSource:
    """GPU inventory and readings from NVML, one `nvmlInit` for the source's life.

    Args:
        nvml: the `pynvml` module (nvidia-ml-py), or a fake with the same functions
            and error classes.
        util_hold_s: how long a process keeps its last SM utilisation when NVML has no
            newer sample for it; after that it reads 0 (idle) where the query answered.
        interval_s: the poll interval; a first utilisation query looks back this far.
        deadline_s: how long a poll waits for each GPU (also each GPU's first listing).
        inventory_every_s: how often the GPUs are listed again.
        pid_visible: whether an NVML pid is a live process here (tests pass their own).
        nested_pid_namespace: whether the agent's /proc lists a PID namespace other than the
            host's (None: find out from /proc, see pid_visibility).
        log: where the one-time warnings go (a GPU that stops answering).
        clock: monotonic seconds, for the inventory cadence.
        activity_every_s: how often the GPUs' true activity (GPM, nvml_gpm.py) is read, on a thread of its
            own; 0: not read.

    Raises:
        SourceUnavailable: NVML cannot start (no library, no driver, no permission) or
            finds no GPU; the message is one line that says what to do.
    """

    name = "nvml"

    def __init__(
        self,
        nvml: Any,
        *,
        util_hold_s: float = 10.0,
        interval_s: float = 5.0,
        deadline_s: float = 2.0,
        inventory_every_s: float = 60.0,
        pid_visible: Callable[[int], bool] = host_pid_visible,
        nested_pid_namespace: bool | None = None,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
        activity_every_s: float = 10.0,
    ) -> None:
        self._nv = nvml
        self._hold_s = util_hold_s
        self._window_s = interval_s
        self._deadline_s = deadline_s
        self._inventory_every_s = inventory_every_s
        self._pid_visible = pid_visible
        self._log = log or logging.getLogger(__name__)
        self._clock = clock
        self._closed = False
        self._said = SaidOnce(self._log)  # one-time warnings already given
        self._nvml_error: type[Exception] = nvml.NVMLError
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        # Not an NVMLError subclass: raised by unversioned wrappers when the library lacks
        # the function they call; caught separately so we can fall back to an older version.
        self._mismatch: tuple[type[Exception], ...] = (mismatch,) if mismatch else ()
        if nested_pid_namespace is None:
            nested_pid_namespace = proc_pid_namespace() is False
        # In another namespace a listed pid that is here is another process: none is taken.
        self.pids_hidden = nested_pid_namespace
        self._listings = PidListings()
        try:
            nvml.nvmlInit()
        except self._nvml_error as exc:
            raise SourceUnavailable(_init_line(exc)) from None
        self._calls, getters = calls_for(nvml)
        self._proc_getters = {kind: getters(base) for kind, base in _GETTER_BASES.items()}
        self._gpus: list[_Gpu] = []
        self._startup_errors = 0
        try:
            self._add_indexes()
        except self._nvml_error as exc:
            self._shutdown()
            raise SourceUnavailable(
                f"NVML could not list the GPUs ({exc}); running without GPU data. "
                "Check that nvidia-smi works on this node."
            ) from None
        if self.pids_hidden:
            self._log.warning("%s", NAMESPACE_LINE)
        self._rounds = Rounds(deadline_s)
        self._activity: GpmThread | None = None
        self._activity_errors = 0  # the GPM reads that had failed at the last poll
        self._startup_errors = self._enumerate_all()
        self._next_inventory = self._clock() + inventory_every_s
        if not self.inventory() and not self._rounds.busy:
            self.close()
            raise SourceUnavailable(
                "NVML found no usable GPU on this node; running without GPU data. "
                "Check nvidia-smi, " + _DEMO_HINT
            )
        # bindings without GPM (older than the pin, or a fake that does not offer it) read the rest as before
        if activity_every_s > 0 and hasattr(nvml, "nvmlGpmMetricsGet"):
            self._activity = GpmThread(lambda: GpmReader(nvml, log=self._log), activity_every_s, self._log).start()

    # --- the GpuSource protocol -------------------------------------------------------

    def inventory(self) -> list[GpuInfo]:
        """The GPUs (or MIG instances) as last listed, keyed by UUID, in NVML order.

        Returns:
            One GpuInfo per device; a MIG instance carries its parent's index.
        """
        return [d.info for g in self._gpus for d in g.devices]

    @property
    def pid_visibility(self) -> str:
        """Why NVML's pids are not processes of this agent ("" when they are): see pid_visibility."""
        return OTHER_NAMESPACE if self.pids_hidden else self._listings.verdict

    def poll(self, now: float) -> GpuPoll:
        """Read every device and the processes on it, each GPU within the deadline.

        Args:
            now: Unix seconds; ages the per-process utilisation kept between polls.

        Returns:
            The readings of the devices that answered, the processes by pid, the UUIDs
            of the devices that did not (stale), and the number of reads that failed.
        """
        out = GpuPoll(errors=self._startup_errors)
        if self._activity is not None:
            out.activity = self._activity.take()  # read on its own thread: one lock here
            failed = self._activity.errors
            out.errors += failed - self._activity_errors
            self._activity_errors = failed
        self._startup_errors = 0  # GPUs that failed at the first listing are counted once
        if self._clock() >= self._next_inventory:
            self._next_inventory = self._clock() + self._inventory_every_s
            out.errors += self._add_indexes_quietly()
            for g in self._gpus:
                g.enumerate_due = True
        wanted = [g.index for g in self._gpus if g.devices or g.enumerate_due]  # the left out wait for the cadence
        round_ = self._rounds.run(self._read_index, wanted, now)
        for index in round_.newly_late:
            self._log.warning("GPU at NVML index %d did not answer within %.1f s; its readings are "
                              "stale until it does", index, self._deadline_s)
        for index in round_.late:
            g = self._gpus[index]
            g.stuck = True
            out.errors += 1
            # Read here while its thread may be inside a call: `last_listed` is only ever replaced whole.
            gap = _Result()
            gap.add_stale(list(g.devices))
            out.stale.extend(gap.stale)
            for pid, uses in gap.uses.items():
                out.processes.setdefault(pid, []).extend(uses)
        present, absent = 0, set()
        for index, (ok, value) in sorted(round_.done.items()):
            g = self._gpus[index]
            if g.stuck:
                g.stuck = False
                self._log.warning("GPU at NVML index %d answers again", index)
            if not ok:  # a bug in reading one GPU: counted, said once, the others stand
                out.errors += 1
                self._once(f"bug{type(value).__name__}", "reading GPU at NVML index %d failed: %r", index, value)
                continue
            result: _Result = value
            out.readings.extend(result.readings)
            out.stale.extend(result.stale)
            out.errors += result.errors
            present, absent = present + result.present, absent | result.absent
            for pid, uses in result.uses.items():
                out.processes.setdefault(pid, []).extend(uses)
        if not self.pids_hidden and self._listings.observe(present, absent):
            self._log.warning("%s", NOT_IN_PROC_LINE if self._listings.verdict == NOT_IN_PROC
                              else "NVML's pids are processes of this agent's /proc again")
        return out

    def close(self) -> None:
        """Release NVML (one nvmlShutdown for the nvmlInit), unless a GPU is inside a call."""
        if self._closed:
            return
        if self._activity is not None:
            self._activity.stop()  # it lets go of its own nvmlInit
        self._rounds.stop()
        if self._rounds.busy:
            # nvmlShutdown would wait for the wedged call; the process ends without it.
            self._closed = True
            return
        self._shutdown()

    # --- inventory ---------------------------------------------------------------------

    def _add_indexes(self) -> None:
        """Track every NVML index not seen yet (the count may grow after a GPU comes back)."""
        for index in range(len(self._gpus), self._nv.nvmlDeviceGetCount()):
            self._gpus.append(_Gpu(index))

    def _add_indexes_quietly(self) -> int:
        try:
            self._add_indexes()
        except self._nvml_error:
            return 1
        return 0

    def _enumerate_all(self) -> int:
        """List every GPU at start, within the deadline; the number that could not be listed."""
        round_ = self._rounds.run(lambda index: self._list_gpu(self._gpus[index]), [g.index for g in self._gpus])
        for index in round_.late:
            self._gpus[index].stuck = True
            self._log.warning("GPU at NVML index %d did not answer within %.1f s; "
                              "left out until it does", index, self._deadline_s)
        failed = sum(1 for ok, listed in round_.done.values() if not ok or not listed)
        return len(round_.late) + failed

    def _list_gpu(self, g: _Gpu) -> bool:
        """List one index's devices (on a read thread); False when it cannot be listed (left out)."""
        try:
            devices = self._devices_at(g.index)
        except self._nvml_error as exc:
            if not g.devices and not g.left_out_logged:
                # A GPU lost before we ever saw its UUID cannot be keyed: leave it out.
                g.left_out_logged = True
                self._log.warning("GPU at NVML index %d left out: %s", g.index, exc)
            g.enumerate_due = False
            return False
        old = {d.info.uuid: d for d in g.devices}
        for dev in devices:
            kept = old.get(dev.info.uuid)
            if kept is not None:  # same device: keep what was learned of it, with the new handle
                dev.unsupported, dev.util_last_ts, dev.util_seen = kept.unsupported, kept.util_last_ts, kept.util_seen
                dev.last_listed, dev.visible = kept.last_listed, kept.visible
        g.devices = devices
        g.enumerate_due = False
        g.left_out_logged = False
        return True

    def _devices_at(self, index: int) -> list[_Device]:
        nv = self._nv
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        name = _text(nv.nvmlDeviceGetName(handle))
        serial = self._serial(handle)
        if self._mig_enabled(handle):
            instances = self._mig_instances(handle, index, name, _text(nv.nvmlDeviceGetUUID(handle)), serial)
            if instances:
                # The instances are what jobs get and what processes run on; the
                # parent has no utilisation or process figures of its own in MIG mode.
                return instances
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        return [_Device(GpuInfo(uuid, index, name, self._total_memory(handle), serial=serial), handle,
                        self._calls(handle))]

    def _serial(self, handle: Any) -> str:
        """The board's serial (read once, with the inventory); "" where NVML gives none (consumer GPUs)."""
        get_serial = getattr(self._nv, "nvmlDeviceGetSerial", None)
        if get_serial is None:
            return ""
        try:
            return _text(get_serial(handle)).strip()
        except self._nvml_error as exc:
            if getattr(exc, "value", None) in _GPU_GONE:
                raise
            return ""

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
        except self._nvml_error as exc:
            if getattr(exc, "value", None) in _GPU_GONE:
                raise
            return False  # NotSupported before Ampere
        return bool(current == _MIG_ENABLED)

    def _mig_instances(self, parent: Any, index: int, parent_name: str, parent_uuid: str,
                       serial: str = "") -> list[_Device]:
        """The MIG instances of a GPU; [] when they cannot be listed (the parent is used then).

        Each names its parent's UUID: the GPU's health is read on the whole GPU, and the collector applies it
        to the jobs on its instances; and the board's serial, the parent's."""
        nv = self._nv
        out: list[_Device] = []
        try:
            slots = nv.nvmlDeviceGetMaxMigDeviceCount(parent)
        except self._nvml_error as exc:
            self._once(f"mig{index}", _MIG_UNLISTED, index, exc)
            return []
        for slot in range(slots):
            try:
                handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except self._nvml_error as exc:
                if exc.value == _NOT_FOUND:
                    continue  # empty slot
                if exc.value in _GPU_GONE:
                    raise
                self._once(f"mig{index}", _MIG_UNLISTED, index, exc)
                return []
            try:
                name = _text(nv.nvmlDeviceGetName(handle))
            except self._nvml_error:
                name = f"{parent_name} MIG {slot}"
            total = self._total_memory(handle)
            # NVML documents device and process utilisation as not supported on MIG; the energy counter is the
            # whole GPU's, which no one instance's job spent alone (not asked: the collector says so).
            dev = _Device(GpuInfo(uuid, index, name, total, parent_uuid, serial), handle, self._calls(handle),
                          is_mig=True)
            dev.unsupported.update({"utilization", "process_util", "energy"})
            out.append(dev)
        return out

    # --- one GPU, on a read thread -------------------------------------------------------

    def _read_index(self, index: int, now: float) -> _Result:
        return self._read_gpu(self._gpus[index], now)

    def _read_gpu(self, g: _Gpu, now: float) -> _Result:
        result = _Result()
        if g.enumerate_due and not self._list_gpu(g):
            result.errors += 1
            if g.devices:  # known devices that cannot be listed now: a gap, not gone; tried every poll
                result.add_stale(g.devices)
                g.enumerate_due = True
            return result  # one never listed waits for the inventory cadence
        for attempt in (1, 2):
            if attempt == 2 and not self._list_gpu(g):
                result.add_stale(g.devices)
                result.errors += 1
                return result
            result = _Result()
            relisted = False
            for dev in g.devices:
                try:
                    if self._handle_moved(dev):
                        relisted = True  # a reset or MIG reconfiguration: list again, once
                        break
                    uses = self._read_device(dev, now, result)
                except _GpuGone as gone:
                    self._on_gone(g, dev, gone.args[0] if gone.args else "", result)
                    continue
                if dev.gone:
                    dev.gone = False
                    self._log.warning("GPU %s (index %d) answers again", dev.info.uuid, dev.info.index)
                by_pid = result.uses
                for pid, use in uses:
                    got = by_pid.get(pid)
                    if got is None:
                        by_pid[pid] = [use]
                    else:
                        got.append(use)
            if not relisted:
                return result
        return result

    def _handle_moved(self, dev: _Device) -> bool:
        """Whether the handle now names another device; raises _GpuGone for a lost one."""
        try:
            uuid = _text(dev.calls.uuid())
        except self._nvml_error as exc:
            if getattr(exc, "value", None) in _GPU_GONE:
                raise _GpuGone(str(exc)) from None
            return False  # identity not readable this time: the readings say the rest
        return uuid != dev.info.uuid

    def _on_gone(self, g: _Gpu, dev: _Device, why: str, result: _Result) -> None:
        result.add_stale([dev])
        result.errors += 1
        dev.util_seen.clear()
        g.enumerate_due = True  # it may come back under a new handle
        if not dev.gone:
            dev.gone = True
            self._log.warning(
                "GPU %s (index %d) does not answer (%s); its readings are absent until it does",
                dev.info.uuid, dev.info.index, why,
            )

    def _read_device(self, dev: _Device, now: float, out: _Result) -> list[tuple[int, GpuUse]]:
        """Read one device: its reading goes into `out` (after every call that can find it gone), and
        its processes are returned as (pid, GpuUse)."""
        c = dev.calls
        util = self._field(dev, "utilization", c.utilization, out)
        mem = self._field(dev, "memory", c.memory, out)
        power_mw = self._field(dev, "power", c.power, out)
        energy_mj = self._field(dev, "energy", c.energy, out)
        # positional, in GpuReading's field order: uuid, utilization, memory used, total, power, energy
        reading = GpuReading(
            dev.info.uuid,
            float(util) if util is not None else None,
            int(mem[0]) if mem is not None else None,
            int(mem[1]) if mem is not None else None,
            power_mw / 1000.0 if power_mw is not None else None,
            int(energy_mj) if energy_mj is not None else None,
        )
        memory_by_pid: dict[int, int | None] = {}
        seen, visible = dev.visible, set()
        listed_ok = True
        listed: dict[str, tuple[int, ...]] = {}
        present = 0
        for kind in _PROCESS_KINDS:
            procs = self._running(dev, kind, out)
            if procs is None:  # the list failed: its processes as last listed, figures unknown
                listed_ok = False
                listed[kind] = dev.last_listed.get(kind, ())
                for pid in listed[kind]:
                    memory_by_pid.setdefault(pid, None)
                continue
            pids = []
            for pid, used in procs:
                if pid in seen:  # (never set while pids_hidden)
                    present += 1
                elif not self._visible(pid, dev, out):
                    continue
                visible.add(pid)
                pids.append(pid)
                prev = memory_by_pid.get(pid)
                # A process listed in several lists carries the same "all memory of the
                # application" figure in each: take it once, not the sum.
                if pid not in memory_by_pid or (used is not None and (prev is None or used > prev)):
                    memory_by_pid[pid] = None if used is None else int(used)
            listed[kind] = tuple(pids)
        out.present += present
        dev.last_listed = listed  # replaced whole: a poll past the deadline reads it from another thread
        dev.visible = frozenset(visible)
        sm = self._process_util(dev, now, memory_by_pid.keys(), out)
        if not listed_ok:
            sm = dict.fromkeys(sm)  # figures of a list that failed are not known
        uuid = dev.info.uuid
        out.readings.append(reading)
        return [(pid, GpuUse(uuid, used, sm.get(pid))) for pid, used in memory_by_pid.items()]

    def _visible(self, pid: int, dev: _Device, out: _Result) -> bool:
        if self.pids_hidden:
            return False  # host pids, not ours: said once at start
        if self._pid_visible(pid):
            out.present += 1
            return True
        out.absent.add(pid)
        if self._listings.verdict != NOT_IN_PROC:  # once it is said that none are here, not an error each
            out.errors += 1
            self._once("foreign-pid", _FOREIGN_PID_LINE, pid, dev.info.uuid)
        return False

    def _field(self, dev: _Device, name: str, fn: Callable[[], Any], out: _Result) -> Any:
        """One NVML query for one field: its value, or None with the error mapped."""
        if name in dev.unsupported:
            return None
        try:
            return fn()
        except self._mismatch:
            dev.unsupported.add(name)
            return None
        except self._nvml_error as exc:
            self._on_error(dev, name, exc, out)
            return None

    def _on_error(self, dev: _Device, name: str, exc: Exception, out: _Result) -> None:
        code = getattr(exc, "value", None)
        if code in _FIELD_UNSUPPORTED:
            dev.unsupported.add(name)
        elif code in _GPU_GONE:
            raise _GpuGone(str(exc))
        else:
            out.errors += 1  # this field only: the device's other readings stand

    def _running(self, dev: _Device, kind: str, out: _Result) -> list[Any] | None:
        """The processes of one list; None when the list failed this poll."""
        if kind in dev.unsupported:
            return []
        getters = self._proc_getters[kind]
        while getters:
            try:
                return getters[0](dev.calls)
            except self._mismatch:
                getters.pop(0)
            except self._nvml_error as exc:
                if getattr(exc, "value", None) == _FUNCTION_NOT_FOUND:
                    getters.pop(0)  # this version is not in the driver's library
                    continue
                if getattr(exc, "value", None) in _FIELD_UNSUPPORTED:
                    dev.unsupported.add(kind)
                    return []
                self._on_error(dev, kind, exc, out)
                return None
        if kind != "mps":  # MPS lists are absent from old bindings and drivers: not an error
            out.errors += 1
            self._once(f"getter-{kind}", _NO_GETTER_LINE, _GETTER_BASES[kind], "function not found")
        return []

    def _process_util(self, dev: _Device, now: float, pids: Any, out: _Result) -> dict[int, float | None]:
        live = set(pids)
        if not live:
            dev.util_seen.clear()
            return {}
        if "process_util" in dev.unsupported:
            return {}
        since = query_since(dev.util_last_ts, now, self._window_s, slack_s=self._window_s)
        answered = True
        try:
            # none newer than `since` is [] (the GPU answered: its listed processes are idle)
            samples = dev.calls.process_samples(since)
        except self._nvml_error as exc:
            self._on_error(dev, "process_util", exc, out)
            if "process_util" in dev.unsupported:
                return {}
            answered = False
            samples = []
        fresh, dev.util_last_ts = newest_by_pid(samples, live, since, now, slack_s=self._window_s,
                                                oldest_s=self._hold_s)
        return process_util(live, fresh, dev.util_seen, now, self._hold_s, answered)

    def _once(self, key: str, fmt: str, *args: Any) -> None:
        self._said.warning(key, fmt, *args)

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


def open_nvml_source(*, log: logging.Logger | None = None, interval_s: float = 5.0,
                     activity_interval_s: float = 10.0) -> NvmlGpuSource:
    """Import pynvml (from nvidia-ml-py) and start an NVML source on it.

    Args:
        log: where the source's one-time warnings go.
        interval_s: the agent's poll interval: a GPU's deadline is at most half of it.
        activity_interval_s: how often GPM is read (0: not read).

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
    return NvmlGpuSource(pynvml, log=log, interval_s=interval_s, deadline_s=min(2.0, interval_s / 2),
                         activity_every_s=activity_interval_s)
