"""The jobs in memory, by id, with each node's GPU allocations indexed: the one owner of "which job has GPUs here".

ClusterState.node_gpu_holders runs at every batch and reads a node's few allocated jobs from the index, not every
job (102 µs a batch at 1,000 jobs). The index cannot drift from the jobs, whoever puts one in: an agent naming it,
Slurm's record, the store after a restart, a test. A job put in is indexed by its `gpus_by_node`; one taken out is
dropped; a held job's allocation changes through `allocate`. Ended jobs stay indexed until forgotten: readers skip
them.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import JobState


class JobTable(dict):
    """job id → JobState (a dict: reads are the dict's own), its writes keeping `allocated_on` in step.

    Only `table[id] = job`, `del table[id]`, `pop` and `allocate` write; the dict's other writers (update,
    setdefault, clear, popitem) would pass the index by and raise TypeError.
    """

    __slots__ = ("allocated_on",)

    def __init__(self) -> None:
        super().__init__()
        # node → the ids of the jobs held with GPUs allocated on it
        self.allocated_on: dict[str, set[str]] = {}

    def __setitem__(self, job_id: str, job: JobState) -> None:
        old = self.get(job_id)
        if old is not None and old is not job:
            self._unindex(job_id, old)
        super().__setitem__(job_id, job)
        for node in job.gpus_by_node:
            self.allocated_on.setdefault(node, set()).add(job_id)

    def __delitem__(self, job_id: str) -> None:
        job = self[job_id]
        super().__delitem__(job_id)
        self._unindex(job_id, job)

    def pop(self, job_id: str, *default: Any) -> Any:
        """The job taken out (and unindexed); `default` where none has that id (KeyError without one)."""
        if job_id not in self:
            if default:
                return default[0]
            raise KeyError(job_id)
        job = super().pop(job_id)
        self._unindex(job_id, job)
        return job

    def allocate(self, job: JobState, node: str, uuids: Iterable[str]) -> None:
        """The GPUs allocated to `job` on `node`, by UUID; the job is indexed there if it is held."""
        job.gpus_by_node[node] = list(uuids)
        if self.get(job.job_id) is job:
            self.allocated_on.setdefault(node, set()).add(job.job_id)

    def _unindex(self, job_id: str, job: JobState) -> None:
        for node in job.gpus_by_node:
            held = self.allocated_on.get(node)
            if held is not None:
                held.discard(job_id)
                if not held:
                    del self.allocated_on[node]

    def _bypass(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("JobTable: put jobs in one at a time (table[job_id] = job), so that their GPU "
                        "allocations are indexed")

    update = setdefault = clear = popitem = __ior__ = _bypass
