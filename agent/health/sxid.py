"""The NVSwitch driver's SXID lines in the kernel log: a pure parser, as strict as the XID one (kmsg.py).

An NVSwitch error is printed by the switch's driver instance, a head line that carries the fatal or
non-fatal word, then lines of detail under the same SXID (real lines in tests/agent/test_health_fabric.py):

    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up
    nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)
    nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00
    nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000, ...}

Only the head line is an SXID event (one fault, one event); the detail lines are not. As for XIDs, the
record must be the kernel's own (facility 0, checked by the reader) and the message the driver's line
from its first character to its last: the same words inside another message are text a user chose.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SxidLine", "SxidEvent", "parse_sxid"]

_SXID = re.compile(r"(?P<device>nvidia-nvswitch\d{1,4}): SXid \(PCI:(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
                   r"[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (?P<sxid>\d{1,6}), (?P<word>Fatal|Non-fatal), (?P<text>.+)")


@dataclass(frozen=True, slots=True)
class SxidLine:
    """One NVSwitch error as the driver printed it."""

    device: str      # the driver's name for the switch (nvidia-nvswitch1)
    pci: str         # the switch's bus address as printed, lower case (0000:06:00.0)
    sxid: int
    fatal: bool      # the line's own word: Fatal, or Non-fatal
    text: str        # the driver's words after it


def parse_sxid(message: str) -> SxidLine | None:
    """The SXID in one kernel-log message, or None when it is no SXID head line (a detail line, another
    message, a line with a prefix or a line break)."""
    m = _SXID.fullmatch(message.rstrip("\n"))
    if m is None:
        return None
    return SxidLine(device=m.group("device"), pci=m.group("pci").lower(), sxid=int(m.group("sxid")),
                    fatal=m.group("word") == "Fatal", text=m.group("text").strip())


@dataclass(frozen=True, slots=True)
class SxidEvent:
    """An SXID read from the kernel log."""

    time: float      # Unix seconds (boot time + the record's microseconds)
    line: SxidLine
    seq: int         # the record's sequence number (this boot)
