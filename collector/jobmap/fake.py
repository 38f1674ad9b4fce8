"""An in-memory JobMapper for unit tests of the collector (shipped, like httpx's MockTransport)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from clusterwatch.collector.jobmap.base import ACTIVE_STATES, SlurmUnavailable

from clusterwatch.slurm.listpids import PidEntry
from clusterwatch.slurm.scontrol import JobRecord


class FakeJobMapper:
    """Answers from dictionaries; set ``unavailable`` to make every call fail as Slurm being down.

    Args:
        jobs: the jobs Slurm knows, any state.
        pids: (job id, node) → that job's processes on the node.

    Attributes:
        calls: every call made, as ``(method, args)``, so tests can check what was asked.
        unavailable: when set, every call raises SlurmUnavailable with this message.
        records_skipped: set by a test to stand for records Slurm printed that could not be read.
    """

    def __init__(
        self,
        jobs: Iterable[JobRecord] = (),
        pids: Mapping[tuple[int, str], Iterable[PidEntry]] | None = None,
    ) -> None:
        self.jobs: dict[int, JobRecord] = {job.job_id: job for job in jobs}
        self.pids: dict[tuple[int, str], list[PidEntry]] = {k: list(v) for k, v in (pids or {}).items()}
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.unavailable: str | None = None
        self.records_skipped = 0

    def _check(self, method: str, *args: object) -> None:
        self.calls.append((method, args))
        if self.unavailable is not None:
            raise SlurmUnavailable(self.unavailable)

    async def show_job(self, job_id: int) -> JobRecord | None:
        """Return the job with this id, or None."""
        self._check("show_job", job_id)
        return self.jobs.get(job_id)

    async def list_jobs(self) -> list[JobRecord]:
        """Return the jobs in an active state, by job id."""
        self._check("list_jobs")
        return [job for _, job in sorted(self.jobs.items()) if job.state in ACTIVE_STATES]

    async def listpids(self, job_id: int, node: str) -> list[PidEntry]:
        """Return the processes registered for (job_id, node), or an empty list."""
        self._check("listpids", job_id, node)
        return list(self.pids.get((job_id, node), []))
