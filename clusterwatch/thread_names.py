"""Names for the threads that the system shows (`top -H`, `ps -L`, /proc/<pid>/task/*/comm).

Python 3.11 names threads for itself only: without this, every thread of a process reads as the
process's name, and an operator asking which one uses the CPU cannot tell the sender from the poll loop.
"""
from __future__ import annotations

import threading


def name_os_thread(name: str) -> None:
    """Set the calling thread's name as the kernel keeps it (15 bytes at most); never raises."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name[:15])
    except OSError:  # no /proc (not Linux), or a read-only one: the name is only a convenience
        pass
