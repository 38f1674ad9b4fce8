"""The job-mapping protocol: which jobs run, and which processes belong to a job on a node.

Implementations: :mod:`.scontrol` (runs the ``scontrol`` binary), :mod:`.ssh` (``scontrol listpids`` run
on the node over SSH) and :mod:`.fake` (in memory, for tests of the collector).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from clusterwatch.errors import SourceUnavailable
from clusterwatch.slurm.listpids import PidEntry
from clusterwatch.slurm.scontrol import JobRecord


class SlurmUnavailable(SourceUnavailable):
    """Slurm did not answer (slurmctld down, timeout) or a Slurm command failed in a way worth retrying.

    The message is one line that says which command, what happened and what to check, e.g.
    ``slurmctld did not answer within 5 s; is it running? (scontrol show job -d 12)``.
    """


@dataclass(frozen=True)
class Reachability:
    """Whether Slurm answered the last call, and since when, for ``clusterwatch status``.

    Attributes:
        reachable: True after a successful call, False after a failed one, None before any call.
        since: Unix seconds of the first call in the current state (None before any call).
        last_error: the one-line message of the last failure, None when reachable.
    """

    reachable: bool | None
    since: float | None
    last_error: str | None = None

    def describe(self) -> str:
        """A line for ``status``: ``slurm reachable since …`` / ``slurm unreachable since …: why``."""
        if self.reachable is None:
            return "slurm not queried yet"
        word = "reachable" if self.reachable else "unreachable"
        why = f": {self.last_error}" if self.last_error else ""
        return f"slurm {word} since {self.since:.0f}{why}"


@runtime_checkable
class JobMapper(Protocol):
    """Where the collector learns about jobs and their processes.

    Attributes:
        records_skipped: job records Slurm printed that were left out because they could not be read
            safely (clusterwatch.slurm.scontrol); 0 for a mapper that reads no Slurm output.
    """

    records_skipped: int

    async def show_job(self, job_id: int) -> JobRecord | None:
        """Return the job, or None when Slurm does not know it (never existed, or purged).

        Raises:
            SlurmUnavailable: Slurm did not answer.
        """
        ...

    async def list_jobs(self) -> list[JobRecord]:
        """Return the running jobs (RUNNING, COMPLETING, SUSPENDED).

        Raises:
            SlurmUnavailable: Slurm did not answer.
        """
        ...

    async def listpids(self, job_id: int, node: str) -> list[PidEntry]:
        """Return the job's processes on ``node``; empty when it has none there.

        Raises:
            SlurmUnavailable: the node or Slurm could not be asked.
        """
        ...


#: Job states in which processes can be running; what list_jobs returns.
ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})
