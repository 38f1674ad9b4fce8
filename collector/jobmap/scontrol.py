"""JobMapper that runs the ``scontrol`` binary, with a timeout on every call and retries with backoff.

Without our own timeout a client call with slurmctld down takes about 9 s to fail, and a registry that
polls would pile those up. Each call is killed after ``timeout_s``; calls that failed because Slurm did
not answer are retried with exponential backoff and jitter; the outcome is kept as a
:class:`~clusterwatch.collector.jobmap.base.Reachability` that ``status`` can show.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence

from clusterwatch.collector.bounded_exec import run_bounded
from clusterwatch.collector.jobmap.base import ACTIVE_STATES, Reachability, SlurmUnavailable

from clusterwatch.errors import ParseError
from clusterwatch.slurm.listpids import PidEntry, parse_listpids
from clusterwatch.slurm.scontrol import JobRecord, parse_show_job

# scontrol's messages for "no such job" and "nothing of that job here": answers, not failures.
_NO_JOB = ("Invalid job id specified", "Invalid job id")
_NO_PIDS = ("There are no steps for job", "does not exist on node", "no steps")


class ScontrolMapper:
    """Query Slurm through ``scontrol`` (``--json`` when the installed one has it, else text).

    Args:
        scontrol: the binary to run.
        env: environment for scontrol (SLURM_CONF...); None inherits this process's.
        timeout_s: seconds before one call is killed and counted as Slurm not answering.
        retries: extra attempts after a call that Slurm did not answer.
        backoff_s: first wait between attempts; doubled each time, with up to 50 % random jitter.
        max_backoff_s: cap on one wait.
        clock: returns Unix seconds (tests pass a fake).
        sleep: awaited between attempts (tests pass a fake).
        use_json: force the JSON (True) or text (False) format; None probes ``scontrol --help`` once.
    """

    def __init__(
        self,
        scontrol: str = "scontrol",
        env: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        max_backoff_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = asyncio.sleep,
        use_json: bool | None = None,
    ) -> None:
        self._scontrol = scontrol
        self._env = dict(env) if env is not None else None
        self._timeout_s = timeout_s
        self._retries = retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self._sleep = sleep
        self._use_json = use_json
        self._reach = Reachability(reachable=None, since=None)

    @property
    def reachability(self) -> Reachability:
        """Whether Slurm answered the last call, and since when."""
        return self._reach

    def _note(self, ok: bool, error: str | None = None) -> None:
        if self._reach.reachable is not ok:
            self._reach = Reachability(reachable=ok, since=self._clock(), last_error=error)
        elif not ok:
            self._reach = Reachability(reachable=False, since=self._reach.since, last_error=error)

    async def _exec(self, args: Sequence[str]) -> tuple[int, str, str]:
        """Run scontrol once; it is killed (our own child, by PID) if it outlives the timeout or the call."""
        try:
            code, out, err = await run_bounded([self._scontrol, *args], self._timeout_s, env=self._env)
        except FileNotFoundError:
            raise SlurmUnavailable(
                f"{self._scontrol} not found: install the Slurm client (Debian: slurm-client) "
                "or give its path"
            ) from None
        except asyncio.TimeoutError:
            raise SlurmUnavailable(
                f"slurmctld did not answer within {self._timeout_s:g} s; is it running? "
                f"(scontrol {' '.join(args)})"
            ) from None
        return code, out.decode(errors="replace"), err.decode(errors="replace")

    async def _call(self, args: Sequence[str], answers: Sequence[str] = ()) -> tuple[int, str, str]:
        """Run with retries. A non-zero exit whose stderr holds one of ``answers`` is returned as is."""
        delay = self._backoff_s
        for attempt in range(self._retries + 1):
            try:
                code, out, err = await self._exec(args)
                if code == 0 or any(a in err for a in answers):
                    self._note(True)
                    return code, out, err
                line = (err.strip().splitlines() or [f"exit status {code}"])[-1]
                raise SlurmUnavailable(f"scontrol {' '.join(args)} failed: {line}")
            except SlurmUnavailable as exc:
                self._note(False, str(exc))
                if attempt == self._retries:
                    raise
            # Jitter keeps many collectors (or many calls) from retrying in lockstep.
            await self._sleep(min(delay, self._max_backoff_s) * (1 + 0.5 * random.random()))
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    async def _json(self) -> bool:
        if self._use_json is None:
            # --json appeared in scontrol 23.02; older ones reject the option. --help is local: no slurmctld.
            try:
                _, out, err = await self._exec(["--help"])
                self._use_json = "--json" in out or "--json" in err
            except SlurmUnavailable:
                self._use_json = False
        return self._use_json

    async def _show(self, job_id: int | None) -> list[JobRecord]:
        args = ["show", "job", "-d"] + ([str(job_id)] if job_id is not None else [])
        if await self._json():
            args = ["--json", *args]
        code, out, err = await self._call(args, answers=_NO_JOB)
        if code != 0:
            return []
        try:
            return parse_show_job(out)
        except ParseError as exc:
            raise SlurmUnavailable(f"scontrol {' '.join(args)} printed what we cannot read: {exc}") from None

    async def show_job(self, job_id: int) -> JobRecord | None:
        """Return ``scontrol show job -d JOB`` as a record, None when Slurm does not know the job.

        Raises:
            SlurmUnavailable: slurmctld did not answer within the timeout after all retries.
        """
        for record in await self._show(job_id):
            if record.job_id == job_id:
                return record
        return None

    async def list_jobs(self) -> list[JobRecord]:
        """Return the jobs in an active state (RUNNING, COMPLETING, SUSPENDED).

        Raises:
            SlurmUnavailable: slurmctld did not answer within the timeout after all retries.
        """
        return [job for job in await self._show(None) if job.state in ACTIVE_STATES]

    async def listpids(self, job_id: int, node: str) -> list[PidEntry]:
        """Run ``scontrol listpids JOB NODE`` here: right only for a node whose slurmd runs on this host.

        Raises:
            SlurmUnavailable: scontrol failed or timed out.
        """
        code, out, err = await self._call(["listpids", str(job_id), node], answers=_NO_PIDS)
        if code != 0:
            return []
        try:
            return parse_listpids(out)
        except ParseError as exc:
            raise SlurmUnavailable(f"scontrol listpids {job_id} {node}: {exc}") from None


def default_env(slurm_conf: str | None = None) -> dict[str, str]:
    """This process's environment, with SLURM_CONF set when given (for ScontrolMapper(env=...))."""
    env = dict(os.environ)
    if slurm_conf is not None:
        env["SLURM_CONF"] = slurm_conf
    return env
