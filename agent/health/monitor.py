"""The agent's health: the kernel-log reader, the NVML event watcher and the counters, the fabric's ports, as one part.

Each runs on a thread of its own and leaves its records here; the poll loop takes them into the
next batch (`drain_into`), so health costs the poll one lock and a copy. Any part that cannot
start says so in one line and the others run: no kernel log (not root, `--kmsg none`), no NVML
(no driver, a simulated GPU source), an NVML without events, no InfiniBand (the ports are read from sysfs on
a thread of their own at the counters' cadence, never in the poll).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

from clusterwatch.agent.health.counters import CounterReader, GpuCounters
from clusterwatch.agent.health.devices import physical_gpus
from clusterwatch.agent.health.events import EventWatcher, GpuEvent
from clusterwatch.agent.health.fabric import ExpectedRates, FabricReader, PortReading
from clusterwatch.agent.health.kmsg import KmsgReader, XidEvent
from clusterwatch.agent.health.sxid import SxidEvent
from clusterwatch.v1 import agent_pb2

from clusterwatch.background import BackgroundThread

__all__ = ["HealthMonitor", "open_health", "kernel_boot_id", "xid_event_to_proto", "gpu_event_to_proto",
           "counters_to_proto", "sxid_event_to_proto", "port_to_proto"]

# records held between batches: a flood of XIDs (one a channel) must not grow the agent without bound
MAX_HELD = 10_000
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def kernel_boot_id(path: str = BOOT_ID_PATH) -> str:
    """This kernel boot's id (kmsg record numbers count within it); "" where there is none."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def xid_event_to_proto(e: XidEvent, boot_id: str, out: agent_pb2.HealthEvent) -> None:
    out.time, out.uuid, out.kind, out.xid, out.data = e.time, e.uuid or "", "xid", e.xid, e.xid
    out.pci, out.source, out.text, out.kernel_boot_id, out.kmsg_seq = (
        e.pci, agent_pb2.HealthEvent.KMSG, e.text[:512], boot_id, e.seq)
    if e.pid is not None:
        out.pid = e.pid
    if e.process:
        out.process = e.process


def sxid_event_to_proto(e: SxidEvent, boot_id: str, out: agent_pb2.HealthEvent) -> None:
    line = e.line
    out.time, out.kind, out.sxid, out.fatal = e.time, "sxid", line.sxid, line.fatal
    out.device, out.pci = line.device, line.pci
    out.source, out.text, out.kernel_boot_id, out.kmsg_seq = agent_pb2.HealthEvent.KMSG, line.text[:512], boot_id, e.seq


def port_to_proto(r: PortReading, out: agent_pb2.FabricPort) -> None:
    out.time, out.device, out.port, out.speed, out.link_layer = r.time, r.device, r.port, r.speed, r.link_layer
    for name in ("state", "phys_state", "rate_gbps", "width", "expected_gbps"):
        value = getattr(r, name)
        if value is not None:
            setattr(out, name, value)
    out.counters.update(r.counters)


def gpu_event_to_proto(e: GpuEvent, out: agent_pb2.HealthEvent) -> None:
    out.time, out.uuid, out.kind, out.data, out.source = e.time, e.uuid, e.kind, e.data, agent_pb2.HealthEvent.NVML
    if e.kind == "xid":
        out.xid = e.data


def counters_to_proto(c: GpuCounters, out: agent_pb2.GpuHealth) -> None:
    out.time, out.uuid = c.time, c.uuid
    for name in ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
                 "ecc_uncorrected_aggregate", "remapped_rows_corrected", "remapped_rows_uncorrected",
                 "remapped_rows_pending", "remapped_rows_failure", "retired_pages_sbe", "retired_pages_dbe",
                 "retired_pages_pending", "clock_event_reasons", "temperature_c", "pcie_replays"):
        value = getattr(c, name)
        if value is not None:
            setattr(out, name, value)
    out.violation_seconds.update(c.violation_seconds)
    out.nvlink_errors.update(c.nvlink_errors)


class HealthMonitor:
    """Starts what the node allows of the three health sources and holds their records for the batch.

    Args:
        nvml: the pynvml module, or None (no NVML events or counters).
        kmsg_path: the kernel log to read (/dev/kmsg), or None.
        ib_sysfs: the InfiniBand ports' sysfs folder (/sys/class/infiniband; a tree shaped like it in tests),
            or None; read where it exists.
        ib_expect: the rates the site expects of its ports (--ib-expect-rate), sent with each reading.
        counters_every_s: the counters' cadence.
        clock: wall clock.
        kmsg_boot_time: the kernel log's boot time in Unix seconds (tests; default from the clocks).
    """

    def __init__(self, nvml: Any = None, kmsg_path: str | None = None, *, counters_every_s: float = 30.0,
                 clock: Callable[[], float] = time.time, log: logging.Logger | None = None,
                 kmsg_boot_time: float | None = None, boot_id: str | None = None,
                 ib_sysfs: str | None = None, ib_expect: ExpectedRates | None = None) -> None:
        self._log = log or logging.getLogger("clusterwatch.agent")
        self._clock = clock
        self._lock = threading.Lock()
        self._events: list[Callable[[agent_pb2.HealthEvent], None]] = []
        self._counters: list[GpuCounters] = []
        self._ports: list[PortReading] = []
        self._nvml_thread = BackgroundThread(self._run_nvml, name="clusterwatch-gpu-health", os_name="cw-gpu-health")
        self._stop = self._nvml_thread.stopping
        self._fabric_thread = BackgroundThread(self._run_fabric, name="clusterwatch-fabric", os_name="cw-fabric")
        self._fabric = (FabricReader(ib_sysfs, clock=clock, expect=ib_expect)
                        if ib_sysfs and os.path.isdir(ib_sysfs) else None)
        self.dropped = 0
        self.boot_id = kernel_boot_id() if boot_id is None else boot_id
        self.counters_every_s = counters_every_s
        self._watcher: EventWatcher | None = None
        self._reader: CounterReader | None = None
        self._kmsg: KmsgReader | None = None
        self._nvml = nvml
        self._pci: dict[str, str] = {}   # bus address → UUID, filled in place (the kmsg reader holds .get)
        if kmsg_path:
            try:
                self._kmsg = KmsgReader(kmsg_path, self._on_xid, resolve_pci=self._pci.get,
                                        boot_time=kmsg_boot_time, log=self._log, on_sxid=self._on_sxid)
            except OSError as exc:
                self._log.warning("%s", exc.strerror or exc)

    @property
    def parts(self) -> list[str]:
        """What was asked and can run: "kmsg" (the log could be opened), "nvml" (events and counters), "fabric"
        (the ports' sysfs folder is there)."""
        return [name for name, part in (("kmsg", self._kmsg), ("nvml", self._nvml), ("fabric", self._fabric))
                if part is not None]

    def start(self) -> HealthMonitor:
        """Start the parts; NVML's are opened on their own thread, so a wedged GPU never holds up the agent."""
        if self._nvml is not None:
            self._nvml_thread.start()
        elif self._kmsg is not None:
            self._kmsg.start()
        if self._fabric is not None:
            self._fabric_thread.start()
        return self

    def stop(self) -> None:
        """Stop every part within about a second; never waits on a driver call (the NVML thread ends its
        parts itself when it gets back from one)."""
        self._stop.set()   # before the kernel log's reader stops: the NVML thread must not start it after
        if self._kmsg is not None:
            self._kmsg.stop()
        self._nvml_thread.stop(1.5)
        self._fabric_thread.stop(1.5)

    def _open_nvml(self, nvml: Any) -> None:
        try:
            nvml.nvmlInit()
            try:
                self._pci.update({g.pci: g.uuid for g in physical_gpus(nvml) if g.pci})
            finally:
                nvml.nvmlShutdown()
            self._reader = CounterReader(nvml, clock=self._clock)
        except Exception as exc:   # NVMLError and its kin: the GPU source says what is wrong with NVML
            self._log.warning("GPU health counters unavailable (%s); XIDs still come from the kernel log", exc)
            return
        try:
            self._watcher = EventWatcher(nvml, self._on_gpu_event, clock=self._clock, log=self._log).start()
        except Exception as exc:
            self._log.warning("NVML events unavailable (%s); XIDs come from the kernel log only", exc)

    def _run_nvml(self) -> None:
        self._open_nvml(self._nvml)
        # the kernel log after the bus addresses are known, so its XIDs carry their GPU's UUID
        if self._kmsg is not None and not self._stop.is_set():
            self._kmsg.start()
        if self._reader is not None:
            self._read_counters()
        if self._watcher is not None:
            self._watcher.stop()
        if self._reader is not None:
            self._reader.close()

    def _hold(self, fill: Callable[[agent_pb2.HealthEvent], None]) -> None:
        with self._lock:
            if len(self._events) >= MAX_HELD:
                self.dropped += 1
                return
            self._events.append(fill)

    def _on_xid(self, e: XidEvent) -> None:
        boot = self.boot_id
        self._hold(lambda out: xid_event_to_proto(e, boot, out))

    def _on_sxid(self, e: SxidEvent) -> None:
        boot = self.boot_id
        self._hold(lambda out: sxid_event_to_proto(e, boot, out))

    def _run_fabric(self) -> None:
        stopping = self._fabric_thread.stopping
        while not stopping.is_set() and not self._stop.is_set():
            try:
                got = self._fabric.read()
            except Exception:   # one bad read must not end the thread
                self._log.exception("fabric ports: read failed")
                got = []
            with self._lock:
                self._ports = (self._ports + got)[-MAX_HELD:]
            stopping.wait(self.counters_every_s)

    def _on_gpu_event(self, e: GpuEvent) -> None:
        self._hold(lambda out: gpu_event_to_proto(e, out))

    def _read_counters(self) -> None:
        said_lost: set[str] = set()
        while not self._stop.is_set():
            try:
                got = self._reader.read()
            except Exception:   # one bad read must not end the thread
                self._log.exception("GPU health counters: read failed")
                got = []
            # a GPU that answered GPU_IS_LOST: said once, until it answers again
            now = self._clock()
            for uuid in sorted(self._reader.lost - said_lost):
                self._on_gpu_event(GpuEvent(uuid=uuid, kind="gpu_lost", data=0, time=now))
            said_lost = (said_lost | self._reader.lost) - {c.uuid for c in got}
            # an NVLink that went down (data: the link's index), or came back up after
            for change in self._reader.nvlink_changes:
                self._on_gpu_event(GpuEvent(uuid=change.uuid, kind="nvlink_down" if change.down else "nvlink_up",
                                            data=change.link, time=now))
            with self._lock:
                self._counters = (self._counters + got)[-MAX_HELD:]
            self._stop.wait(self.counters_every_s)

    @property
    def errors(self) -> int:
        """Failed reads of the health sources, for the agent's read_errors."""
        return sum(getattr(part, attr) for part, attr in ((self._kmsg, "bad_records"), (self._watcher, "errors"),
                                                           (self._reader, "errors"), (self._fabric, "errors"))
                   if part is not None)

    def drain_into(self, batch: agent_pb2.Batch) -> None:
        """Move the records held since the last call into `batch`."""
        with self._lock:
            events, self._events = self._events, []
            counters, self._counters = self._counters, []
            ports, self._ports = self._ports, []
        for fill in events:
            fill(batch.health_events.add())
        for c in counters:
            counters_to_proto(c, batch.gpu_health.add())
        for r in ports:
            port_to_proto(r, batch.fabric_ports.add())


def open_health(gpu_source_name: str, kmsg_path: str | None, *, counters_every_s: float = 30.0,
                log: logging.Logger | None = None, sim_nvml: Any = None,
                ib_sysfs: str | None = None, ib_expect: ExpectedRates | None = None) -> HealthMonitor | None:
    """The monitor for an agent whose GPU source is `gpu_source_name`; None when there is nothing to watch.

    NVML's events and counters are read where the GPU source is NVML, or from `sim_nvml`, the simulated
    source's stand-in for pynvml that plays its scenario's events (agent/backends/sim_nvml.py); the
    kernel log is read wherever it was asked for, and the fabric's ports wherever their sysfs folder is.
    """
    nvml = sim_nvml
    if gpu_source_name == "nvml":
        import pynvml  # the NVML source has loaded it already; this is the same module

        nvml = pynvml
    if nvml is None and not kmsg_path and not ib_sysfs:
        return None
    monitor = HealthMonitor(nvml, kmsg_path, counters_every_s=counters_every_s, log=log, ib_sysfs=ib_sysfs,
                            ib_expect=ib_expect)
    return monitor if monitor.parts else None
