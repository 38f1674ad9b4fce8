"""The process trees an agent was told to watch (`--pid`, `clusterwatch run`), each root a (pid, start time).

A pid alone is no process: once a watched root exits, the kernel may give its pid to anyone's next process,
which the agent would then sample, label as the job's and let the job's actions reach. So each root's start
time is taken when the agent starts (or given with the pid) and compared at every poll; a root that is gone,
or whose pid now holds another process, is forgotten for good.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from clusterwatch.errors import ConfigError

__all__ = ["Root", "WatchedRoots", "parse_root", "same_start"]

# Start times are clock ticks since boot (10 ms), written as Unix seconds with two decimals at most.
START_TOLERANCE_S = 0.05


def same_start(a: float, b: float) -> bool:
    """Whether two start times name the same process start."""
    return abs(a - b) <= START_TOLERANCE_S


def parse_root(text: str) -> tuple[int, float | None]:
    """`PID` or `PID:STARTTIME` (Unix seconds, as the agent reports a process's start time).

    Raises:
        ConfigError: with what is wrong and what to give, one line.
    """
    pid_text, sep, start_text = text.strip().partition(":")
    try:
        pid = int(pid_text)
        start = float(start_text) if sep else None
    except ValueError:
        raise ConfigError(f"--pid {text!r}: expected PID or PID:STARTTIME (the process's start time in "
                         "Unix seconds, as `clusterwatch agent --once --json` shows it)") from None
    if pid < 1 or (start is not None and not start > 0):
        raise ConfigError(f"--pid {text!r}: the pid and the start time must be positive numbers")
    return pid, start


@dataclass(frozen=True, slots=True)
class Root:
    """One watched root."""

    pid: int
    start_time: float     # as the process source reads it (Unix seconds)
    job_id: str           # "" when the agent gives its tree no job id


class WatchedRoots:
    """The roots still held by the processes they were taken from.

    Args:
        roots: the roots.
        start_time_of: pid → its process's start time now (None when there is none), from the process source.
        log: where a root forgotten is said, once.
    """

    def __init__(self, roots: Iterable[Root], start_time_of: Callable[[int], float | None],
                 log: logging.Logger | None = None) -> None:
        self._roots = {r.pid: r for r in roots}
        self._start_time_of = start_time_of
        self._log = log or logging.getLogger("clusterwatch.agent")

    @classmethod
    def taken_now(cls, pids: Iterable[tuple[int, float | None]], job_id: str,
                  start_time_of: Callable[[int], float | None], log: logging.Logger | None = None) -> WatchedRoots:
        """The roots as they are now: a pid given without a start time takes its process's current one; a pid
        with no process, or whose process did not start at the time given, is not watched (one line each)."""
        log = log or logging.getLogger("clusterwatch.agent")
        roots = []
        for pid, given in pids:
            now = start_time_of(pid)
            if now is None:
                log.warning("--pid %d: no such process; not watched", pid)
            elif given is not None and not same_start(now, given):
                log.warning("--pid %d:%s: pid %d is another process now (started at %.2f); not watched",
                            pid, given, pid, now)
            else:
                roots.append(Root(pid, now, job_id))
        return cls(roots, start_time_of, log)

    def live(self) -> set[int]:
        """The pids of the roots whose process still runs; the others are forgotten."""
        out = set()
        for root in list(self._roots.values()):
            now = self._start_time_of(root.pid)
            if now is not None and same_start(now, root.start_time):
                out.add(root.pid)
                continue
            del self._roots[root.pid]
            self._log.info("watched process %d has ended%s; its pid is no longer watched", root.pid,
                           "" if now is None else " (the pid is another process's now)")
        return out

    def jobs(self) -> dict[int, tuple[float, str]]:
        """pid → (start time, job id) of the roots that carry a job id (JobLabeler's local_roots)."""
        return {r.pid: (r.start_time, r.job_id) for r in self._roots.values() if r.job_id}
