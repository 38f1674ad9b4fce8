"""NVML events (XID, ECC, recovery action) on a thread of its own.

One event set for the node's GPUs, each registered for the subset of the wanted types it
supports (nvmlDeviceGetSupportedEventTypes; a GPU that supports none is left out, a GPU that
refuses is counted). The thread waits in nvmlEventSetWait_v2 with a timeout, so stopping the
agent waits at most that long, never on the driver. The `pynvml` module is passed in, as for
`agent/backends/nvml.py`; nvmlInit is reference-counted, so the watcher holds its own.
"""
from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from clusterwatch.agent.health.devices import GONE, UNSUPPORTED, nvml_code, physical_gpus

from clusterwatch.background import BackgroundThread

__all__ = ["GpuEvent", "EventWatcher", "EVENT_KINDS", "WANTED_EVENTS"]

# nvmlEventType* bits (nvml.h) → the kind on the stream. P-state and clock changes are left out:
# they come by the second on a busy GPU and say nothing about health.
EVENT_KINDS: dict[int, str] = {
    0x0001: "ecc_single_bit",
    0x0002: "ecc_double_bit",
    0x0008: "xid",
    0x0400: "dram_retirement",
    0x0800: "dram_retirement_failure",
    0x1000: "nonfatal_poison",
    0x2000: "fatal_poison",
    0x4000: "gpu_unavailable",
    0x8000: "recovery_action",
}
WANTED_EVENTS = sum(EVENT_KINDS)
_TIMEOUT = 10   # NVML_ERROR_TIMEOUT


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """One NVML event: which GPU, what kind, the event's data (the XID number for an XID)."""

    uuid: str
    kind: str
    data: int
    time: float      # Unix seconds, when the watcher got it


class EventWatcher:
    """Registers the node's GPUs for health events and hands each to `on_event` from its thread.

    Args:
        nvml: the pynvml module (or a fake with the same functions and errors).
        on_event: called on the watcher's thread with each GpuEvent.
        wait_ms: one wait's timeout; a stop is seen within it.
        clock: wall clock for the events' time.
    """

    def __init__(self, nvml: Any, on_event: Callable[[GpuEvent], None], *, wait_ms: int = 500,
                 clock: Callable[[], float] = time.time, log: logging.Logger | None = None) -> None:
        self._nvml = nvml
        self._on_event = on_event
        self._wait_ms = wait_ms
        self._clock = clock
        self._log = log or logging.getLogger(__name__)
        self._thread = BackgroundThread(self._run, name="clusterwatch-nvml-events", os_name="cw-nvml-events")
        self._stop = self._thread.stopping
        self.errors = 0
        self.events = 0
        self.registered: dict[str, int] = {}   # UUID → the event types registered for it
        nvml.nvmlInit()
        try:
            self._set = nvml.nvmlEventSetCreate()
            self._uuid_by_key: dict[Any, str] = {}
            for gpu in physical_gpus(nvml):
                self._register(gpu.uuid, gpu.handle)
        except BaseException:
            nvml.nvmlShutdown()
            raise

    def _register(self, uuid: str, handle: Any) -> None:
        nvml = self._nvml
        try:
            types = nvml.nvmlDeviceGetSupportedEventTypes(handle) & WANTED_EVENTS
            if types:
                nvml.nvmlDeviceRegisterEvents(handle, types, self._set)
        except nvml.NVMLError as exc:
            if nvml_code(exc) not in UNSUPPORTED:
                self.errors += 1
            return
        if types:
            self.registered[uuid] = types
            self._uuid_by_key[_key(handle)] = uuid

    def start(self) -> EventWatcher:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the thread (within one wait) and lets go of the event set."""
        if not self._thread.stop(timeout):
            return   # still inside the driver: freeing the set under it would crash
        try:
            self._nvml.nvmlEventSetFree(self._set)
        except self._nvml.NVMLError:
            pass
        self._nvml.nvmlShutdown()

    def _uuid_of(self, device: Any) -> str | None:
        uuid = self._uuid_by_key.get(_key(device))
        if uuid is not None:
            return uuid
        try:
            got = self._nvml.nvmlDeviceGetUUID(device)
        except self._nvml.NVMLError:
            return None
        return got.decode() if isinstance(got, bytes) else got

    def _run(self) -> None:
        nvml = self._nvml
        # bindings before the _v2 wait (whose data carries the MIG instance ids) have the first one only
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        while not self._stop.is_set():
            try:
                data = wait(self._set, self._wait_ms)
            except nvml.NVMLError as exc:
                code = nvml_code(exc)
                if code == _TIMEOUT:
                    continue
                self.errors += 1
                # a lost GPU fails the wait too; the counters and the GPU source tell the rest
                self._stop.wait(self._wait_ms / 1000 if code in GONE else 1.0)
                continue
            kind = EVENT_KINDS.get(int(data.eventType))
            uuid = self._uuid_of(data.device)
            if kind is None or uuid is None:
                self.errors += uuid is None
                continue
            self.events += 1
            try:
                self._on_event(GpuEvent(uuid=uuid, kind=kind, data=int(data.eventData), time=self._clock()))
            except Exception:   # a failing consumer must not end the watcher
                self.errors += 1


def _key(handle: Any) -> Any:
    """A handle's identity: the pointer's address for ctypes handles, the object for others."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
