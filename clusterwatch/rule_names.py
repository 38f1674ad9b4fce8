"""Every rule's name, in one enum: the collector's rules raise them, the report and the commands compare them.

It lives here, not in collector/rules/, because clusterwatch/ never imports the collector (the layering
tests/project/test_packaging.py checks) and the report and cli/ need the names too;
collector/rules/model.py re-exports it for the rules.
"""
from __future__ import annotations

from enum import StrEnum

__all__ = ["Rule", "RULE_NAMES"]


class Rule(StrEnum):
    """Every rule's name. A str enum: each member is its name as a plain string, so the names on the
    wire, in the store, in the rules file and in Prometheus are these strings, and a member compares
    (and hashes) equal to its string."""

    GPU_MEMORY_LEAK = "gpu_memory_leak"
    HOST_MEMORY_LEAK = "host_memory_leak"
    GPU_STALL = "gpu_stall"
    TRAINING_STALL = "training_stall"
    IDLE_GPU = "idle_gpu"
    AGENT_DOWN = "agent_down"
    HANDLE_LEAK = "handle_leak"
    # from the allocator's figures (clusterwatch.train), where a process reports them
    GPU_MEMORY_FRAGMENTATION = "gpu_memory_fragmentation"
    CODE_MISMATCH = "code_mismatch"  # raised by the collector from provenance, not by this engine
    JOB_SLOWDOWN = "job_slowdown"  # a job's throughput fell against its own baseline (rules/job_slowdown.py)
    # raised by the collector from the agents' GPU health records (collector/health), not by this engine
    GPU_XID = "gpu_xid"
    GPU_LOST = "gpu_lost"
    GPU_MEMORY_ERRORS = "gpu_memory_errors"
    GPU_THROTTLE = "gpu_throttle"
    GPU_LINK_ERRORS = "gpu_link_errors"
    # raised by the collector over the findings and drains it kept (collector/health/offenders.py)
    GPU_REPEAT_OFFENDER = "gpu_repeat_offender"
    NODE_REPEAT_OFFENDER = "node_repeat_offender"


#: The fixed rule names as plain strings; alert routing and the labelled traces use them.
RULE_NAMES: tuple[str, ...] = tuple(r.value for r in Rule)
