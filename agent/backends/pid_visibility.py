"""Whether the pids NVML names are processes of the agent's /proc.

The NVIDIA driver names host pids whatever PID namespace the caller is in. An agent in a container
without the host's PID namespace (compose without `pid: host`, a pod without `hostPID: true`) reads a
/proc of its own, where those pids are not (or are other processes). Two ways to tell, both without
privileges:

- The namespace of the /proc read: `/proc/1/ns/pid` names the PID namespace whose pids that /proc
  lists (its pid 1 is that namespace's init). The host's is the kernel's initial namespace, whose
  inode is fixed (PROC_PID_INIT_INO, include/linux/proc_ns.h, since Linux 3.8). `NSpid` in
  /proc/self/status cannot tell: it lists pids from the /proc's own namespace down, so a container
  with its own /proc reads one level there, as the host does.
- What NVML lists: pids that stay absent from /proc over two polls while no listed pid is present
  (a process that exits between NVML's list and /proc's answer is gone from the next list).

The first is known at start (the Hello says it); the second covers a /proc whose namespace cannot be
read (a pid 1 the agent may not inspect, no ns links).
"""
from __future__ import annotations

import os

__all__ = [
    "HOST_PID_NAMESPACE", "OTHER_NAMESPACE", "NOT_IN_PROC", "VISIBLE",
    "PidListings", "proc_pid_namespace",
]

# readlink of a PID namespace link in the kernel's initial namespace (0xEFFFFFFC)
HOST_PID_NAMESPACE = "pid:[4026531836]"

# why NVML's pids are not this agent's processes ("" when they are)
VISIBLE = ""
OTHER_NAMESPACE = "other_namespace"  # the /proc read lists another PID namespace than the host's
NOT_IN_PROC = "not_in_proc"  # NVML keeps naming pids this /proc does not have


def proc_pid_namespace(proc: str = "/proc") -> bool | None:
    """Whether `proc` lists the host's PID namespace: True, False (another one), None (cannot tell).

    Args:
        proc: the /proc the agent reads.
    """
    try:
        return os.readlink(f"{proc}/1/ns/pid") == HOST_PID_NAMESPACE
    except OSError:
        pass  # pid 1 may be another user's (no ptrace read access): look at our own namespace
    try:
        own = os.readlink(f"{proc}/self/ns/pid")
    except OSError:
        return None
    if own == HOST_PID_NAMESPACE:
        return True  # a /proc that shows us is our namespace's or an ancestor's: the host's
    if _nspid_levels(f"{proc}/self/status") == 1:
        return False  # this /proc is our own namespace's, which is not the host's
    return None  # an ancestor's /proc, which may or may not be the host's


def _nspid_levels(status_path: str) -> int:
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return len(line.split()) - 1
    except OSError:
        pass
    return 0


class PidListings:
    """Tells from NVML's lists, poll by poll, whether its pids are processes of this /proc.

    The verdict turns NOT_IN_PROC on a poll where no listed pid is a process here and some pid
    absent from /proc was also listed (and absent) the poll before; it turns back on a poll where a
    listed pid is a process here. A poll with no pid listed changes nothing.
    """

    def __init__(self) -> None:
        self.verdict = VISIBLE
        self._absent_before: set[int] = set()

    def observe(self, present: int, absent: set[int]) -> bool:
        """One poll's listing: how many listed pids are processes here, and the pids that are not.

        Returns:
            Whether the verdict changed.
        """
        before = self.verdict
        if present:
            self.verdict = VISIBLE
        elif absent & self._absent_before:
            self.verdict = NOT_IN_PROC
        self._absent_before = absent
        return self.verdict != before
