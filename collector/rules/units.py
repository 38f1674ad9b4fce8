"""The process rules, one module each: the one list a new process rule joins.

Each module names the rules it raises (`NAMES`), declares the fields of its state on a process
(`SLOTS`), sets them for a process first seen (`init`) and starts them afresh when the process's
thresholds change (`restart`), and says a standing alert's text and figures as of the latest
observation (`describe`). A rule the engine's fast path skips for most samples keeps that path's
guard true to its state (`guard`). The engine calls each rule's `observe` from its ingest path,
where the order of the rules is the order of their events.
"""
from __future__ import annotations

from . import fragmentation, gpu_stall, handle_leak, memory_leak, training_stall

PROCESS_RULES = (memory_leak, handle_leak, fragmentation, gpu_stall, training_stall)
