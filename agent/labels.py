"""Which job, step and rank each process belongs to, cheapest source first.

Order: a `clusterwatch run` tree (the pids the agent was told to watch), then the
process's own cgroup and environment (Slurm), then its parent's labels (a
DataLoader worker belongs to its rank). Results are cached per (pid, start time):
a process never changes job, and a reused pid gets a fresh lookup.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clusterwatch.model import ProcessSample


@dataclass(frozen=True, slots=True)
class JobLabels:
    """A process's place in a job."""

    job_id: str
    rank: int | None = None
    local_rank: int | None = None
    step_id: str = ""
    mapped_by: str = ""


_UNSEEN = object()

# pid → labels found from the process's own /proc entries, or None
SlurmLookup = Callable[[int], "JobLabels | None"]
# (pid, job id) → labels of a process the agent was told to watch as that job
LocalLookup = Callable[[int, str], "JobLabels"]


class JobLabeler:
    """Labels samples in place.

    Args:
        local_roots: pid → job id for trees the agent watches on request (`run`, `--pid`).
        slurm_lookup: reads a process's cgroup/environ for Slurm labels; None off Slurm.
        local_lookup: labels of a watched root (its rank from RANK/LOCAL_RANK); None: job id only.
    """

    def __init__(self, local_roots: dict[int, str], slurm_lookup: SlurmLookup | None = None,
                 local_lookup: LocalLookup | None = None) -> None:
        self.local_roots = dict(local_roots)
        self.slurm_lookup = slurm_lookup
        self.local_lookup = local_lookup
        self._cache: dict[tuple[int, float], JobLabels | None] = {}

    def label(self, samples: list[ProcessSample]) -> None:
        """Fill job_id, rank, local_rank, step_id and mapped_by on each sample."""
        by_pid: dict[int, ProcessSample] | None = None
        fresh: dict[tuple[int, float], JobLabels | None] = {}
        cache = self._cache
        for s in samples:
            key = (s.pid, s.start_time)
            labels = cache.get(key, _UNSEEN)
            if labels is _UNSEEN:  # first sight of this process: look it up
                labels = self._own(s, fresh)
            else:
                fresh[key] = labels
            if labels is None:
                if by_pid is None:
                    by_pid = {s.pid: s for s in samples}
                labels = self._inherited(s, by_pid, fresh)
            if labels is not None:
                s.job_id = labels.job_id
                s.rank = labels.rank
                s.local_rank = labels.local_rank
                s.step_id = labels.step_id
                s.mapped_by = labels.mapped_by
        # keep only live processes in the cache
        self._cache = fresh

    def _own(self, s: ProcessSample, fresh: dict) -> JobLabels | None:
        key = (s.pid, s.start_time)
        if key in fresh:
            return fresh[key]
        if key in self._cache:
            labels = self._cache[key]
        elif s.pid in self.local_roots:
            job_id = self.local_roots[s.pid]
            labels = (self.local_lookup(s.pid, job_id) if self.local_lookup is not None
                      else JobLabels(job_id, mapped_by="pid"))
        elif self.slurm_lookup is not None:
            labels = self.slurm_lookup(s.pid)
        else:
            labels = None
        fresh[key] = labels
        return labels

    def _inherited(self, s: ProcessSample, by_pid: dict[int, ProcessSample], fresh: dict) -> JobLabels | None:
        seen = {s.pid}
        parent = by_pid.get(s.ppid)
        while parent is not None and parent.pid not in seen:
            seen.add(parent.pid)
            labels = self._own(parent, fresh)
            if labels is not None:
                return JobLabels(
                    labels.job_id, labels.rank, labels.local_rank, labels.step_id,
                    "tree" if labels.mapped_by == "pid" else labels.mapped_by,
                )
            parent = by_pid.get(parent.ppid)
        return None
