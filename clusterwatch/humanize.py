"""Figures as people read them, one way everywhere: sizes and rates in IEC units, durations in one format.

The collector writes these into alert text and the CLI into its tables and notes; both use this module so
that an alert's "grows 50 MiB/h for 6 min" and the table beside it speak the same units (issue 17, items 6
and 15: alerts said "MB/h" of MiB and three duration formats were in use).
"""
from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4


def size(n: float | None) -> str:
    """Bytes in IEC units: "512 B", "3 KiB", "734 MiB", "1.4 GiB", "2.0 TiB"; "-" for unknown."""
    if n is None:
        return "-"
    a = abs(n)
    if a >= TIB:
        return f"{n / TIB:.1f} TiB"
    if a >= GIB:
        return f"{n / GIB:.1f} GiB"
    if a >= MIB:
        return f"{n / MIB:.0f} MiB"
    if a >= KIB:
        return f"{n / KIB:.0f} KiB"
    return f"{n:.0f} B"


def rate_per_h(bytes_per_h: float) -> str:
    """A growth rate in IEC units an hour: "50 MiB/h", "1.2 GiB/h"."""
    return f"{size(bytes_per_h)}/h"


def duration(seconds: float | None) -> str:
    """A span of time: "45 s", "6 min", "1 h 24 min", "26 h 5 min", "2 d 3 h"; "-" for unknown (days from
    two on: "1 d" would hide most of a day).

    Rounded down to the unit shown, so that a span that keeps growing never reads shorter later.
    """
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 2 * 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"
