"""JobMapper that runs the ``scontrol`` binary, with a timeout on every call and retries with backoff.

Without our own timeout a client call with slurmctld down takes about 9 s to fail, and a registry that
polls would pile those up. Each call is killed after ``timeout_s``; calls that failed because Slurm did
not answer are retried with exponential backoff and jitter; the outcome is kept as a
:class:`~clusterwatch.collector.jobmap.base.Reachability` that ``status`` can show.

JSON escapes every value, so it is preferred: ``scontrol --json`` (Slurm 23.02+), else for listings
``squeue --json`` (21.08 to 22.05, whose scontrol has no --json; it lists every job whatever its
filters). In text (older Slurm, and one job's record before 23.02) scontrol prints values raw, and a job
name, comment or path can hold lines that look like another job's record. Job owners are then asked first
from ``squeue -h -a -t all -o "%A %U %u"`` (numbers and login names, one job a line: nothing a user writes
reaches it), and the text is read against that list (see clusterwatch.slurm.scontrol, "What Slurm
guarantees"): a record that does not read, or does not match, is asked for alone, and when that does not
read either it is left out and counted (``records_skipped``), never the whole listing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence

from clusterwatch.collector.jobmap.base import ACTIVE_STATES, Reachability, SlurmUnavailable
from clusterwatch.collector.serving.bounded_exec import run_bounded

from clusterwatch.backoff import Backoff
from clusterwatch.errors import ParseError
from clusterwatch.slurm.listpids import PidEntry, parse_listpids
from clusterwatch.slurm.node_drain import NodeDrain, parse_node_drain
from clusterwatch.slurm.node_names import shown_node_names, why_not_a_node_name
from clusterwatch.slurm.scontrol import (
    JobRecord,
    Owner,
    parse_show_job_json,
    read_one_job_text,
    read_show_job_text,
)

log = logging.getLogger("clusterwatch.collector.jobmap.scontrol")

# scontrol's messages for "no such job" and "nothing of that job here": answers, not failures.
_NO_JOB = ("Invalid job id specified", "Invalid job id")
_NO_PIDS = ("There are no steps for job", "does not exist on node", "no steps")
#: squeue's format for the owners list: job id, uid, user name, space-separated; no value a user sets.
_OWNERS_FORMAT = "%A %U %u"
_OWNER_LINE = re.compile(r"^(\d+) (\d+) (\S+)$")
#: At most this many records a listing are asked for one by one (those the listing could not settle): one
#: hostile name of 1024 characters can forge about 40 record starts, each naming another job to be asked.
RECHECK_PER_LISTING = 128


class _NoAnswer(SlurmUnavailable):
    """Slurm did not answer in time (slurmctld down or hung), rather than a command that failed."""


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
        use_json: force ``scontrol --json`` (True) or the text format (False); None probes
            ``scontrol --help`` once, then ``squeue --help`` for listings.
        squeue: the squeue binary for the owners list of the text format; None: the one beside
            ``scontrol`` when that is a path, else ``squeue``.
        recheck_limit: at most this many records of one listing asked for alone; the rest are skipped
            (and counted) for that pass.

    Attributes:
        records_skipped: job records Slurm printed that were left out because they could not be read
            safely (a value forging lines, a malformed record, an owner squeue does not confirm).
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
        squeue: str | None = None,
        recheck_limit: int = RECHECK_PER_LISTING,
    ) -> None:
        self._scontrol = scontrol
        if squeue is None:
            folder = os.path.dirname(scontrol)
            squeue = os.path.join(folder, "squeue") if folder else "squeue"
        self._squeue = squeue
        self.records_skipped = 0
        self._skip_logged = False
        self._recheck_limit = recheck_limit
        self._env = dict(env) if env is not None else None
        self._timeout_s = timeout_s
        self._retries = retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self._sleep = sleep
        self._use_json = use_json
        self._squeue_json: bool | None = None if use_json is None else False
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

    async def _exec(self, args: Sequence[str], binary: str | None = None) -> tuple[int, str, str]:
        """Run scontrol once; it is killed (our own child, by PID) if it outlives the timeout or the call."""
        binary = binary or self._scontrol
        try:
            code, out, err = await run_bounded([binary, *args], self._timeout_s, env=self._env)
        except FileNotFoundError:
            raise SlurmUnavailable(
                f"{binary} not found: install the Slurm client (Debian: slurm-client) "
                "or give its path"
            ) from None
        except asyncio.TimeoutError:
            raise _NoAnswer(
                f"slurmctld did not answer within {self._timeout_s:g} s; is it running? "
                f"({os.path.basename(binary)} {' '.join(args)})"
            ) from None
        return code, out.decode(errors="replace"), err.decode(errors="replace")

    async def _call(
        self, args: Sequence[str], answers: Sequence[str] = (), binary: str | None = None
    ) -> tuple[int, str, str]:
        """Run with retries. A non-zero exit whose stderr holds one of ``answers`` is returned as is."""
        backoff = Backoff(self._backoff_s, self._max_backoff_s, jitter=(1.0, 1.5))
        for attempt in range(self._retries + 1):
            try:
                code, out, err = await self._exec(args, binary)
                if code == 0 or any(a in err for a in answers):
                    self._note(True)
                    return code, out, err
                line = (err.strip().splitlines() or [f"exit status {code}"])[-1]
                name = os.path.basename(binary or self._scontrol)
                raise SlurmUnavailable(f"{name} {' '.join(args)} failed: {line}")
            except SlurmUnavailable as exc:
                self._note(False, str(exc))
                if attempt == self._retries:
                    raise
            # Jitter keeps many collectors (or many calls) from retrying in lockstep.
            await self._sleep(backoff.next_wait())
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

    async def _show_json(self, job_id: int | None) -> list[JobRecord]:
        # JSON escapes every value: nothing a user writes can make or change another record.
        args = ["--json", "show", "job", "-d"] + ([str(job_id)] if job_id is not None else [])
        code, out, _ = await self._call(args, answers=_NO_JOB)
        if code != 0:
            return []
        try:
            return parse_show_job_json(out)
        except ParseError as exc:
            raise SlurmUnavailable(f"scontrol {' '.join(args)} printed what we cannot read: {exc}") from None

    async def _owners(self, job_id: int | None) -> dict[int, Owner]:
        """Job id → (uid, user) from squeue, whose format holds no value a user sets."""
        args = ["-h", "-a", "-t", "all", "-o", _OWNERS_FORMAT]
        if job_id is not None:
            args += ["-j", str(job_id)]
        code, out, _ = await self._call(args, answers=_NO_JOB, binary=self._squeue)
        owners: dict[int, Owner] = {}
        if code != 0:
            return owners
        for line in out.split("\n"):
            match = _OWNER_LINE.match(line.strip())
            if match:
                owners[int(match.group(1))] = (int(match.group(2)), match.group(3))
        return owners

    def _skip(self, count: int, errors: Sequence[str]) -> None:
        """Count records left out; say so once in the log, not on every pass."""
        if not count:
            return
        self.records_skipped += count
        if not self._skip_logged:
            self._skip_logged = True
            why = errors[0] if errors else "not readable safely"
            log.warning("slurm: left out %d job record(s) that could not be read safely (%s); "
                        "counted from now on, not logged", count, why)

    async def _one_text(self, job_id: int, owner: Owner | None) -> JobRecord | None:
        """One job's record, asked alone: it begins at the output's first byte and ends at its last."""
        code, out, _ = await self._call(["show", "job", "-d", str(job_id)], answers=_NO_JOB)
        if code != 0:
            return None
        try:
            listing = read_show_job_text(out, owners=None if owner is None else {job_id: owner})
        except ParseError as exc:
            self._skip(1, [str(exc)])
            return None
        for record in listing.records:
            if record.job_id == job_id:
                return record
        try:
            record = read_one_job_text(out, job_id, owner=owner)
        except ParseError as exc:
            self._skip(1, [str(exc)])
            return None
        if record is None:
            self._skip(1, [f"scontrol show job -d {job_id} printed another job's record first"])
        return record

    async def _list_text(self) -> list[JobRecord]:
        # squeue before scontrol: a job that appears in between is in scontrol's text only, and a record
        # start with its id is then not trusted (it could be a forgery naming the next job id).
        owners = await self._owners(None)
        code, out, _ = await self._call(["show", "job", "-d"], answers=_NO_JOB)
        if code != 0:
            return []
        try:
            listing = read_show_job_text(out, owners=owners)
        except ParseError as exc:
            raise SlurmUnavailable(f"scontrol show job -d printed what we cannot read: {exc}") from None
        self._skip(listing.skipped, listing.errors)
        records = list(listing.records)
        for job_id in listing.recheck[: self._recheck_limit]:
            record = await self._one_text(job_id, owners.get(job_id))
            if record is not None:
                records.append(record)
        self._skip(max(0, len(listing.recheck) - self._recheck_limit), ["too many records to ask alone"])
        return records

    async def _squeue_has_json(self) -> bool:
        if self._squeue_json is None:
            try:
                _, out, err = await self._exec(["--help"], self._squeue)
                self._squeue_json = "--json" in out or "--json" in err
            except SlurmUnavailable:
                self._squeue_json = False
        return self._squeue_json

    @property
    def source(self) -> str | None:
        """Where listings come from: ``scontrol --json``, ``squeue --json``, ``text``; None before a call."""
        if self._use_json is None:
            return None
        if self._use_json:
            return "scontrol --json"
        if self._squeue_json is None:
            return None
        return "squeue --json" if self._squeue_json else "text"

    async def _list(self) -> list[JobRecord]:
        if await self._json():
            return await self._show_json(None)
        if await self._squeue_has_json():
            try:
                _, out, _ = await self._call(["--json"], binary=self._squeue)
                return parse_show_job_json(out)
            except _NoAnswer:
                raise
            except (SlurmUnavailable, ParseError) as exc:
                # If Slurm answers in text, it is this squeue's --json that fails (no JSON plugin): text
                # from now on. If the text fails too, Slurm is down: the preference stays.
                records = await self._list_text()
                self._squeue_json = False
                log.warning("slurm: squeue --json did not work (%s); reading scontrol's text instead", exc)
                return records
        return await self._list_text()

    async def _show(self, job_id: int | None) -> list[JobRecord]:
        if job_id is None:
            return await self._list()
        if await self._json():
            return await self._show_json(job_id)
        # Not squeue --json: it would list every job (22.05 ignores -j with --json) for each one asked.
        owners = await self._owners(job_id)
        if job_id not in owners:
            return []  # squeue does not know it: purged, or never existed
        record = await self._one_text(job_id, owners[job_id])
        return [record] if record is not None else []

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
            SlurmUnavailable: scontrol failed or timed out, or `node` is not one node's name.
        """
        why = why_not_a_node_name(node)
        if why:
            raise SlurmUnavailable(f"not asking scontrol listpids for {node[:200]!r}: {why}")
        code, out, err = await self._call(["listpids", str(job_id), node], answers=_NO_PIDS)
        if code != 0:
            return []
        try:
            return parse_listpids(out)
        except ParseError as exc:
            raise SlurmUnavailable(f"scontrol listpids {job_id} {node}: {exc}") from None


    async def drain_node(self, node: str, reason: str) -> None:
        """``scontrol update NodeName=NODE State=DRAIN Reason=REASON``: Slurm schedules no new job there.

        `node` comes from an agent's Hello, so it is taken only as one node Slurm knows
        (clusterwatch.slurm.node_names): never a hostlist, a list, ``ALL``, a nodeset or more fields.

        Raises:
            ValueError: `node` is not one node Slurm knows; the message says why, on one line.
            SlurmUnavailable: scontrol failed or timed out.
        """
        await self._one_node(node, "draining")
        await self._call(["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])

    async def _one_node(self, node: str, doing: str) -> None:
        """Raise ValueError ("not DOING NODE: why") unless `node` is plain and Slurm shows exactly that one node;
        asked once, no retries: what Slurm cannot confirm is not done."""
        why = why_not_a_node_name(node)
        if why:
            raise ValueError(f"not {doing} {node[:200]!r}: {why}")
        code, out, err = await self._exec(["-o", "show", "node", node])
        shown = shown_node_names(out) if code == 0 else []
        if shown != [node]:
            said = " ".join((err or out).split())[:120] or f"exit status {code}"
            raise ValueError(f"not {doing} {node!r}: " + (
                f"Slurm shows {len(shown)} nodes for it (a nodeset?), not one node" if len(shown) > 1 else
                f"Slurm shows node {shown[0][:64]!r} for it, not a node of that name" if shown else
                f"Slurm knows no node of that name (scontrol show node: {said})"))

    async def node_drain(self, node: str) -> NodeDrain:
        """``scontrol -o show node NODE``: its state and drain reason (who set it, when), for a resume.

        Raises:
            ValueError: `node` is not one node Slurm knows; the message says why, on one line.
            SlurmUnavailable: scontrol failed or timed out.
        """
        why = why_not_a_node_name(node)
        if why:
            raise ValueError(f"not asking Slurm about {node[:200]!r}: {why}")
        code, out, err = await self._call(["-o", "show", "node", node])
        shown = parse_node_drain(out)
        if shown is None or shown.node != node:
            raise ValueError(f"Slurm does not show one node {node!r} for that name")
        return shown

    async def resume_node(self, node: str) -> None:
        """``scontrol update NodeName=NODE State=RESUME``: the node takes jobs again.

        Only a name that is one node (the same checks as drain_node); asked once, no retries.

        Raises:
            ValueError: `node` is not one node Slurm knows.
            SlurmUnavailable: scontrol failed or timed out.
        """
        await self._one_node(node, "resuming")
        code, out, err = await self._exec(["update", f"NodeName={node}", "State=RESUME"])
        if code != 0:
            line = (err.strip().splitlines() or [f"exit status {code}"])[-1]
            raise SlurmUnavailable(f"scontrol update NodeName={node} State=RESUME failed: {line}")


def default_env(slurm_conf: str | None = None) -> dict[str, str]:
    """This process's environment, with SLURM_CONF set when given (for ScontrolMapper(env=...))."""
    env = dict(os.environ)
    if slurm_conf is not None:
        env["SLURM_CONF"] = slurm_conf
    return env
