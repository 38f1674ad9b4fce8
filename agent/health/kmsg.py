"""The NVIDIA driver's XID lines in the kernel log: a pure parser, and a reader of /dev/kmsg records.

NVML delivers XID events only while a process holds an event set, so an XID raised while the
agent was not running is lost to it; the driver also prints every XID to the kernel log, with the
process it hit where it knows it. The driver's line has changed across generations (real lines in
tests/agent/test_health_kmsg.py):

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.   R470 and later
    NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM ...      the pid unknown
    NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked ...            pid, no name
    NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000          older: no pid
    NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff            older still: no "PCI:"
    NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 ...)          NVLink (GB200)

and before an XID 79 it names the GPU: `NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-...`, which maps
the bus address to the UUID when NVML can no longer answer for that GPU.

/dev/kmsg gives one record per read, `PRI,SEQ,USEC,FLAGS[,...];MESSAGE`, then dictionary lines
that start with a space (Documentation/ABI/testing/dev-kmsg); a reader opened afresh starts at the
oldest record the ring holds (this boot's, unless overwritten), and EPIPE says records were
overwritten before they were read. USEC is microseconds since boot on the monotonic clock.

Only the driver's own records count: PRI's facility must be the kernel's (0; what is written to
/dev/kmsg from user space gets the user facility, 1, or its own, never 0), and the message must be
the driver's line from its first character to its last. Kernel messages quote text users choose
(the process name, a cgroup's path in an OOM report, a file name; a newline in it comes as \x0a),
so the driver's words inside a message, or on a dictionary line, are no XID.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import select
import time
from dataclasses import dataclass
from typing import Callable

from clusterwatch.agent.health.sxid import SxidEvent, parse_sxid

from clusterwatch.background import BackgroundThread

__all__ = ["XidLine", "KmsgRecord", "XidEvent", "KmsgReader", "parse_xid", "parse_gpu_at", "parse_record",
           "pci_key", "unescape", "KERNEL_FACILITY"]

KERNEL_FACILITY = 0   # LOG_KERN: printk's own; devkmsg_write never gives a record this facility

_PCI = r"(?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
_XID = re.compile(r"NVRM: Xid \(" + _PCI + r"\): (?P<xid>\d+)(?:, (?P<rest>.*))?")
# the pid as a number, or a placeholder the driver prints when it has none ('<unknown>', 'N/A')
_PID = re.compile(r"pid=(?:'?(?P<pid>\d+)'?|'[^',]*'|<[^>,]*>|N/A)(?:, |$)")
_NAME = re.compile(r"name=(?P<name><unknown>|[^,]*)(?:, |$)")
_GPU_AT = re.compile(r"NVRM: GPU at " + _PCI + r": (?P<uuid>GPU-[0-9A-Fa-f-]+)")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def pci_key(address: str) -> str | None:
    """A PCI address as `dddd:bb:dd` (lower case), however written.

    The driver prints `0000:3b:00`, NVML's busId is `00000000:3B:00.0`: both are
    domain:bus:device[.function]; the function is dropped (a GPU is function 0).
    """
    parts = address.strip().removeprefix("PCI:").split(".")[0].split(":")
    if len(parts) != 3:
        return None
    try:
        domain, bus, dev = (int(p, 16) for p in parts)
    except ValueError:
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}"


@dataclass(frozen=True, slots=True)
class XidLine:
    """One XID as the driver printed it."""

    pci: str                 # the GPU's bus address, as pci_key writes it
    xid: int
    pid: int | None          # the process it hit, where the driver says
    process: str | None      # its command name (comm), where the driver says
    text: str                # what follows the XID number (and pid, name): the driver's own words


def unescape(message: str) -> str:
    r"""/dev/kmsg writes non-printable bytes as \xNN; undo it."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), message) if "\\x" in message else message


def parse_xid(message: str) -> XidLine | None:
    """The XID in one kernel-log message, or None when the message is no XID line.

    The whole message must be the driver's line (no dmesg or syslog prefix, no line break): the
    same words inside a message are text a user put there.
    """
    m = _XID.fullmatch(message.rstrip("\n"))
    if m is None:
        return None
    pci = pci_key(m.group("pci"))
    if pci is None:
        return None
    rest = m.group("rest") or ""
    pid: int | None = None
    process: str | None = None
    pm = _PID.match(rest)
    if pm:
        pid = int(pm.group("pid")) if pm.group("pid") else None
        rest = rest[pm.end():]
        nm = _NAME.match(rest)
        if nm:
            name = nm.group("name").strip()
            process = None if name in ("<unknown>", "") else name
            rest = rest[nm.end():]
    return XidLine(pci=pci, xid=int(m.group("xid")), pid=pid, process=process, text=rest.strip())


def parse_gpu_at(message: str) -> tuple[str, str] | None:
    """(bus address, UUID) from the driver's `NVRM: GPU at PCI:…: GPU-…` line, else None (the message
    must be that line alone)."""
    m = _GPU_AT.fullmatch(message.rstrip("\n"))
    if m is None:
        return None
    pci = pci_key(m.group("pci"))
    return (pci, m.group("uuid")) if pci else None


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One /dev/kmsg record."""

    priority: int        # syslog facility * 8 + level
    seq: int
    usec: int            # microseconds since boot (monotonic)
    message: str         # unescaped

    @property
    def facility(self) -> int:
        """The syslog facility (0: the kernel's own printk)."""
        return self.priority >> 3


def parse_record(line: str) -> KmsgRecord | None:
    """One `PRI,SEQ,USEC,FLAGS[,...];MESSAGE` line; None for a dictionary line or a malformed one."""
    if not line or line[0] == " ":
        return None
    head, sep, message = line.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 3:
        return None
    try:
        priority, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    return KmsgRecord(priority=priority, seq=seq, usec=usec, message=unescape(message.rstrip("\n")))


@dataclass(frozen=True, slots=True)
class XidEvent:
    """An XID read from the kernel log, with the GPU's UUID where it could be told."""

    time: float              # Unix seconds (boot time + the record's microseconds)
    uuid: str | None         # None: no GPU of this node answers to that bus address
    pci: str
    xid: int
    pid: int | None
    process: str | None
    text: str
    seq: int                 # the record's sequence number (this boot)


def _boot_wall_time() -> float:
    # kmsg stamps records on the monotonic clock since boot
    return time.time() - time.monotonic()


class KmsgReader:
    """Reads XID lines from /dev/kmsg (or a file or FIFO of such records) on a thread of its own.

    From the oldest record the log holds (this boot's), then each as it comes. Stopping never
    waits longer than `wait_s`. Records that do not parse are counted (`bad_records`), never
    logged one by one; records the kernel overwrote before they were read are counted too
    (`overwritten`), and so are records from outside the kernel (`not_kernel`), never read for XIDs.

    Args:
        path: /dev/kmsg, or a file or FIFO holding records in its format (tests).
        on_event: called on the reader's thread with every XidEvent.
        on_sxid: called on the reader's thread with every SxidEvent (an NVSwitch's error, sxid.py); None: not
            looked for.
        resolve_pci: bus address (pci_key form) → the UUID of the GPU there, from NVML; the
            driver's own `GPU at` lines are used when it does not know.
        boot_time: the wall-clock time of boot in Unix seconds (default: now minus the
            monotonic clock).
        wait_s: how long one wait for new records lasts (a stop is seen within it).
    """

    def __init__(self, path: str, on_event: Callable[[XidEvent], None], *,
                 resolve_pci: Callable[[str], str | None] | None = None, boot_time: float | None = None,
                 wait_s: float = 0.5, log: logging.Logger | None = None,
                 on_sxid: Callable[[SxidEvent], None] | None = None) -> None:
        self.path = path
        self._on_event = on_event
        self._on_sxid = on_sxid
        self._resolve = resolve_pci or (lambda _pci: None)
        self._boot = _boot_wall_time() if boot_time is None else boot_time
        self._wait_s = wait_s
        self._log = log or logging.getLogger(__name__)
        self._thread = BackgroundThread(self._run, name="clusterwatch-kmsg", os_name="cw-kmsg")
        self._learned: dict[str, str] = {}   # bus address → UUID, from the driver's `GPU at` lines
        self._fd = self._open()               # fails here, at start, with one line
        self.records = 0
        self.bad_records = 0
        self.overwritten = 0
        self.not_kernel = 0
        self.events = 0
        self.sxids = 0

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot read the kernel log {self.path} ({exc.strerror}): XIDs raised "
                          "while the agent was not running are not seen. Run the agent as root, or pass "
                          "--kmsg none to switch this off") from None

    def start(self) -> KmsgReader:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._thread.stop(timeout)
        try:
            os.close(self._fd)
        except OSError:
            pass

    def feed(self, line: str) -> XidEvent | None:
        """Handle one record line (what the thread does with each); returns the XidEvent it made."""
        record = parse_record(line)
        if record is None:
            if line and line[0] != " ":
                self.bad_records += 1
            return None
        self.records += 1
        if record.facility != KERNEL_FACILITY:
            self.not_kernel += 1
            return None
        gpu_at = parse_gpu_at(record.message)
        if gpu_at is not None:
            self._learned[gpu_at[0]] = gpu_at[1]
            return None
        xid = parse_xid(record.message)
        if xid is None:
            if self._on_sxid is not None:
                sxid = parse_sxid(record.message)
                if sxid is not None:
                    self.sxids += 1
                    self._on_sxid(SxidEvent(time=self._boot + record.usec / 1e6, line=sxid, seq=record.seq))
            return None
        uuid = self._resolve(xid.pci) or self._learned.get(xid.pci)
        event = XidEvent(time=self._boot + record.usec / 1e6, uuid=uuid, pci=xid.pci, xid=xid.xid,
                         pid=xid.pid, process=xid.process, text=xid.text, seq=record.seq)
        self.events += 1
        self._on_event(event)
        return event

    def _run(self) -> None:
        pending = b""
        stopping = self._thread.stopping
        while not stopping.is_set():
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                chunk = None          # no record now (kmsg, or a FIFO whose writer is open)
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overwritten += 1   # the ring moved past us; the next read goes on
                    continue
                self._log.warning("kernel log %s: read failed (%s); XIDs from it stop", self.path, exc)
                return
            if chunk:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    try:
                        self.feed(raw.decode("utf-8", "replace"))
                    except Exception:   # a failing consumer must not end the reader
                        self.bad_records += 1
                continue
            if chunk is None:
                select.select([self._fd], [], [], self._wait_s)
            else:
                stopping.wait(self._wait_s)   # end of a file or of a FIFO's writer: wait for more
