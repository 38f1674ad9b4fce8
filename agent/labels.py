"""Which job, step and rank each process belongs to, cheapest source first.

Order: a `clusterwatch run` tree (the processes the agent was told to watch, each by
its pid and start time: a reused pid is not the root), then the
process's own cgroup and environment (Slurm), then its parent's labels (a
DataLoader worker belongs to its rank). Results are cached per (pid, start time):
a process never changes job, and a reused pid gets a fresh lookup.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clusterwatch.model import ProcessSample
from clusterwatch.procfs import ExecInProgress

from .roots import same_start


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
        local_roots: pid → (start time, job id) of the roots of trees the agent watches on request (`run`,
            `--pid`; roots.WatchedRoots.jobs()): another process given the same pid is not one.
        slurm_lookup: reads a process's cgroup/environ for Slurm labels; None off Slurm.
        local_lookup: labels of a watched root (its rank from RANK/LOCAL_RANK); None: job id only.
    """

    def __init__(self, local_roots: dict[int, tuple[float, str]], slurm_lookup: SlurmLookup | None = None,
                 local_lookup: LocalLookup | None = None) -> None:
        self.local_roots = dict(local_roots)
        self.slurm_lookup = slurm_lookup
        self.local_lookup = local_lookup
        self._cache: dict[tuple[int, float], JobLabels | None] = {}  # the processes of the last poll, and new ones
        self._looked_up: list[ProcessSample] = []  # the samples looked up in this call of label()

    def label(self, samples: list[ProcessSample]) -> list[ProcessSample]:
        """Fill job_id, rank, local_rank, step_id and mapped_by on each sample.

        Returns:
            The samples whose labels may not be the last poll's, in no particular order: processes seen
            for the first time (looked up now) and those labelled through a parent (which depends on the
            tree of this poll). What is done once per labelled process (provenance) looks only at these.
        """
        by_pid: dict[int, ProcessSample] | None = None
        cache = self._cache
        self._looked_up = looked_up = []
        inherited: list[ProcessSample] = []
        for s in samples:
            labels = cache.get((s.pid, s.start_time), _UNSEEN)
            seen = labels is not _UNSEEN
            if not seen:  # first sight of this process: look it up
                labels = self._own(s)
            if labels is None:
                if by_pid is None:
                    by_pid = {s.pid: s for s in samples}
                labels = self._inherited(s, by_pid)
                if labels is not None and seen:
                    inherited.append(s)
            if labels is not None:
                s.job_id = labels.job_id
                s.rank = labels.rank
                s.local_rank = labels.local_rank
                s.step_id = labels.step_id
                s.mapped_by = labels.mapped_by
        # Every process sampled now is in the cache: more entries are processes that are gone.
        if len(cache) > len(samples):
            self._cache = {key: cache[key] for key in [(s.pid, s.start_time) for s in samples]}
        return looked_up + inherited if inherited else looked_up

    def _own(self, s: ProcessSample) -> JobLabels | None:
        key = (s.pid, s.start_time)
        labels = self._cache.get(key, _UNSEEN)
        if labels is not _UNSEEN:
            return labels
        root_job = self._root_job(s)
        try:
            if root_job is not None:
                job_id = root_job
                labels = (self.local_lookup(s.pid, job_id) if self.local_lookup is not None
                          else JobLabels(job_id, mapped_by="pid"))
            elif self.slurm_lookup is not None:
                labels = self.slurm_lookup(s.pid)
            else:
                labels = None
        except ExecInProgress:
            # Inside execve, its variables not there yet: not cached, looked up again at the next poll. A
            # watched root is its job's now; its rank comes then.
            return JobLabels(root_job, mapped_by="pid") if root_job is not None else None
        self._cache[key] = labels
        self._looked_up.append(s)
        return labels

    def _root_job(self, s: ProcessSample) -> str | None:
        """The job id of a watched root, when `s` is that very process."""
        root = self.local_roots.get(s.pid)
        return root[1] if root is not None and same_start(s.start_time, root[0]) else None

    def _inherited(self, s: ProcessSample, by_pid: dict[int, ProcessSample]) -> JobLabels | None:
        seen = {s.pid}
        parent = by_pid.get(s.ppid)
        while parent is not None and parent.pid not in seen:
            seen.add(parent.pid)
            labels = self._own(parent)
            if labels is not None:
                return JobLabels(
                    labels.job_id, labels.rank, labels.local_rank, labels.step_id,
                    "tree" if labels.mapped_by == "pid" else labels.mapped_by,
                )
            parent = by_pid.get(parent.ppid)
        return None
