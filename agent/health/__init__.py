"""GPU health on the node: XID lines of the kernel log, NVML events, the slower health counters."""
