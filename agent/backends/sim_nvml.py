"""The simulated GPUs' health, as a driver would give it: NVML's functions over a scenario's events.

The agent reads GPU health through the functions of the `pynvml` module, which agent/health/ takes as an
argument (events, counters, GPU_IS_LOST). The simulated GPU source hands it a `SimNvml` in pynvml's place,
so a scenario's XID, lost GPU and throttling travel the path a real GPU's do: the event watcher, the
counters reader, the stream, the collector's health rules, `clusterwatch health`. It has only what those
readers ask and a scenario can say; a counter it lacks reads as a function the driver does not have (None,
and never asked again), as on a GPU without that counter.

What each event kind does, from `at_s` seconds after the source started:

    xid        the event set delivers an XID event (once)
    lost       the event set delivers XID 79 (once), and from then on the GPU answers GPU_IS_LOST
    throttle   the clock-event reasons hold its bits, the time held down grows (NVML's thermal or power
               policy), and the temperature reads its temperature_c, for for_s seconds
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from clusterwatch.agent.backends.sim_scenario import SimEvent

__all__ = ["SimNvml", "NVMLError"]

# nvml.h's return codes and event type, as pynvml gives them
_INVALID_ARGUMENT, _NOT_SUPPORTED, _TIMEOUT, _GPU_IS_LOST = 2, 3, 10, 15
_EVENT_XID = 0x0008
_LOST_XID = 79  # "GPU has fallen off the bus"
# nvmlPerfPolicyType_t → the reason bits whose time it counts (nvmlDeviceGetViolationStatus)
_POLICY_BITS = {0: 0x4 | 0x80, 1: 0x20 | 0x40}   # power: power cap, power brake; thermal: the thermal slowdowns


class NVMLError(Exception):
    """pynvml's error: the NVML return code in `value`, which the health readers act on."""

    def __init__(self, value: int) -> None:
        super().__init__(f"simulated NVML error {value}")
        self.value = value


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


@dataclass(frozen=True, slots=True)
class _EventData:
    """pynvml's c_nvmlEventData_t, as far as the event watcher reads it."""

    device: _Handle
    eventType: int
    eventData: int


@dataclass(frozen=True, slots=True)
class _Violation:
    """pynvml's c_nvmlViolationTime_t."""

    referenceTime: int
    violationTime: int   # nanoseconds


@dataclass(slots=True)
class _EventSet:
    gpus: set[int] = field(default_factory=set)
    delivered: int = 0   # how many of the timeline's XIDs this set has given


class SimNvml:
    """NVML for the agent's health readers, playing `events` on the GPUs `uuids` (by index).

    Args:
        uuids: the simulated GPUs' UUIDs, by index.
        events: the scenario's events of this node.
        started: when the source started (Unix seconds): an event's `at_s` counts from it.
        temperature_c: a GPU's temperature while no throttle event says another.
        clock: wall clock.
    """

    NVMLError = NVMLError

    def __init__(self, uuids: Sequence[str], events: Sequence[SimEvent], *, started: float,
                 temperature_c: int = 40, clock: Callable[[], float] = time.time) -> None:
        self._uuids = list(uuids)
        self._handles = [_Handle(i) for i in range(len(uuids))]   # one object a GPU: the watcher keys on it
        self._started = started
        self._temperature = temperature_c
        self._clock = clock
        ordered = sorted(events, key=lambda e: e.at_s)
        # the XIDs the event sets deliver, in time order: (when, GPU index, XID)
        self._xids = [(started + e.at_s, e.gpu, e.xid if e.kind == "xid" else _LOST_XID)
                      for e in ordered if e.kind in ("xid", "lost")]
        self._lost = [(started + e.at_s, e.gpu) for e in ordered if e.kind == "lost"]
        self._throttles = [e for e in ordered if e.kind == "throttle"]

    def lost(self, now: float) -> set[int]:
        """The indexes of the GPUs lost by `now` (the GPU source leaves them out of its polls too)."""
        return {index for at, index in self._lost if at <= now}

    # --- the library ------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self._handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self._handles):
            raise NVMLError(_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._uuids[handle.index]

    # --- events -----------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        return _EventSet()

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        event_set.gpus.clear()

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        self._answering(handle)
        return _EVENT_XID

    def nvmlDeviceRegisterEvents(self, handle: _Handle, types: int, event_set: _EventSet) -> None:
        self._answering(handle)
        if types & _EVENT_XID:
            event_set.gpus.add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> _EventData:
        """The next XID due on a GPU of the set; waits for one at most `timeout_ms`, then NVML's TIMEOUT.

        The wait is timed on the monotonic clock, so a wall clock stepped back never holds up a stop.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            while event_set.delivered < len(self._xids) and self._xids[event_set.delivered][1] not in event_set.gpus:
                event_set.delivered += 1    # on a GPU not registered with this set
            now = self._clock()
            due = self._xids[event_set.delivered][0] if event_set.delivered < len(self._xids) else math.inf
            if due <= now:
                _, index, xid = self._xids[event_set.delivered]
                event_set.delivered += 1
                return _EventData(device=self._handles[index], eventType=_EVENT_XID, eventData=xid)
            left = deadline - time.monotonic()
            if left <= 0:
                raise NVMLError(_TIMEOUT)
            time.sleep(min(left, due - now))

    # --- counters ---------------------------------------------------------------------------------

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        now = self._answering(handle)
        bits = 0
        for e in self._active(handle.index, now):
            bits |= e.reason_bits
        return bits

    def nvmlDeviceGetViolationStatus(self, handle: _Handle, policy: int) -> _Violation:
        """The time the clocks were held down under `policy` since the source started (overlaps counted once)."""
        now = self._answering(handle)
        bits = _POLICY_BITS.get(policy)
        if bits is None:
            raise NVMLError(_NOT_SUPPORTED)
        spans = sorted((self._started + e.at_s, min(now, self._started + e.at_s + e.for_s))
                       for e in self._throttles if e.gpu == handle.index and e.reason_bits & bits)
        held, reached = 0.0, -math.inf
        for lo, hi in spans:
            lo = max(lo, reached)
            if hi > lo:
                held += hi - lo
                reached = hi
        return _Violation(referenceTime=int(now * 1e6), violationTime=int(held * 1e9))

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        now = self._answering(handle)
        said = [e.temperature_c for e in self._active(handle.index, now) if e.temperature_c is not None]
        return said[-1] if said else self._temperature

    # --- helpers ----------------------------------------------------------------------------------

    def _answering(self, handle: _Handle) -> float:
        """Now; NVML's GPU_IS_LOST for a GPU lost by now."""
        now = self._clock()
        if any(index == handle.index and at <= now for at, index in self._lost):
            raise NVMLError(_GPU_IS_LOST)
        return now

    def _active(self, index: int, now: float) -> list[SimEvent]:
        """The throttle events holding GPU `index` down at `now`, the latest started last."""
        return [e for e in self._throttles
                if e.gpu == index and self._started + e.at_s <= now < self._started + e.at_s + e.for_s]
