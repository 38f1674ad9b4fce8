"""The job registry: what Slurm says of the jobs the collector knows, refreshed every few seconds.

An asyncio task on the collector's event loop. Each pass asks the JobMapper for the running jobs and
for every other job the collector holds, fills each JobState from Slurm's record (name, user, account,
partition, state, times, limit, nodes, CPUs, memory, GPUs, ranks expected) and closes the jobs Slurm
says have ended, with Slurm's final state and exit code. A job its epilogs closed first (they know exit
codes, not CANCELLED or TIMEOUT) takes Slurm's final state once Slurm has one. For a job's node with no
agent reporting, it
asks ``scontrol listpids`` on that node (over SSH) and keeps those pids, shown as "mapped by listpids".

Slurm calls are subprocesses or SSH sessions with timeouts (see collector/jobmap), so the loop never
blocks. When slurmctld does not answer, every job says so in its note and the registry retries with
exponential backoff; nothing waits on it.

One shard of N (clusterwatch/shards.py) takes its turn: its passes fall in every Nth slot of the interval
on the wall clock, the slots of shard i those numbered i modulo N, so the deployment lists Slurm's jobs once
an interval in all, as one collector does, and not N times. Every listing prints every job, and Slurm
22.05's ``scontrol show job`` takes one job id, not a list: asking by id for a shard's own jobs would cost a
call a job. Each shard's jobs are then refreshed every N intervals (``listpids`` too, for its own jobs only).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from clusterwatch.backoff import Backoff
from clusterwatch.log_once import SaidOnce
from clusterwatch.slurm.scontrol import JobRecord

from ..state.cluster import ENDED_STATES, JobState
from ..state.core import CollectorCore, CoreListener
from .base import JobMapper, SlurmUnavailable

log = logging.getLogger("clusterwatch.collector.jobmap.registry")

#: After Slurm says a job ended, the agents get this long to deliver the epilog's end events (which
#: close the job with its last samples) before the registry closes it itself.
CLOSE_GRACE_S = 10.0
#: Closed job ids remembered, so Slurm still listing a job as COMPLETING does not bring it back.
_CLOSED_MEMORY = 10_000
#: How long after its epilogs closed a job the registry asks Slurm for the job's final state. Slurm keeps an
#: ended job MinJobAge (300 s by default); it usually has the final state a pass after the epilogs.
SETTLE_WINDOW_S = 600.0
#: At most this many of those jobs asked about a pass (one `scontrol show job` each); the rest wait their turn.
_SETTLE_PER_PASS = 32
_UNREACHABLE = "slurmctld unreachable since"


def unreachable_note(since: float) -> str:
    """The note every job carries while slurmctld does not answer."""
    return f"{_UNREACHABLE} {time.strftime('%H:%M', time.localtime(since))}: showing what the agents reported"


class JobRegistry(CoreListener):
    """Keeps the collector's jobs in step with Slurm.

    Args:
        core: the collector core (its state, store, lock and close_job).
        mapper: where jobs and pids come from (ScontrolMapper, SshJobMapper, FakeJobMapper).
        interval_s: seconds between passes while Slurm answers.
        max_backoff_s: the longest wait between passes while it does not.
        fill_in: ask ``listpids`` for nodes without a reporting agent (needs a mapper that runs it on
            the node, e.g. over SSH).
        listpids_concurrency: at most this many listpids calls at once.
        close_grace_s: see CLOSE_GRACE_S.
        clock: Unix time (tests pass their own).
        owns: whether a job id is this shard's; None for a collector that is not a shard.
        turn: (this shard's index, the number of collectors) for a shard: its passes take their turn (see
            the module's docstring); None passes every interval.
    """

    def __init__(
        self,
        core: CollectorCore,
        mapper: JobMapper,
        interval_s: float = 5.0,
        max_backoff_s: float = 60.0,
        fill_in: bool = False,
        listpids_concurrency: int = 8,
        close_grace_s: float = CLOSE_GRACE_S,
        clock: Callable[[], float] = time.time,
        owns: Callable[[str], bool] | None = None,
        turn: tuple[int, int] | None = None,
    ) -> None:
        self.core = core
        # One shard of several: a Slurm job this collector neither holds nor owns is its own collector's,
        # or every shard would list (and export) every job.
        self.owns = owns
        self.mapper = mapper
        if turn is not None and not 0 <= turn[0] < turn[1]:
            raise ValueError(f"turn {turn}: the index must be below the number of collectors")
        self.turn = turn if turn is not None and turn[1] > 1 else None
        self.interval_s = interval_s
        self.max_backoff_s = max_backoff_s
        self.fill_in = fill_in
        self.close_grace_s = close_grace_s
        self.clock = clock
        self.down_since: float | None = None
        self.failures = 0
        self.listpids_errors = 0
        self._semaphore = asyncio.Semaphore(listpids_concurrency)
        self._closed: OrderedDict[str, None] = OrderedDict()
        # Jobs closed before Slurm gave its final state (by their epilogs' end events) → when they were closed.
        self._settling: OrderedDict[str, float] = OrderedDict()
        self._ended_seen: dict[str, float] = {}
        self._saved: dict[str, tuple] = {}
        self._task: asyncio.Task | None = None
        self._listpids_warned = SaidOnce(log)
        core.add_listener(self)  # it acts on the core, so it is built after it
        # Slurm jobs that ended shortly before a restart still wait for Slurm's final word.
        held = set(core.job_ids())
        for job_id, ended in core.jobs_ended_since(self.clock() - SETTLE_WINDOW_S):
            if job_id.isdigit() and job_id not in held:
                self._settling[job_id] = ended
                self._closed[job_id] = None

    def on_job_closed(self, job: JobState, now: float) -> None:
        if job.job_id.isdigit():  # a Slurm job: its final state may still be to come (see _settle)
            self._settling[job.job_id] = self.clock()
        self._closed[job.job_id] = None
        self._closed.move_to_end(job.job_id)
        while len(self._closed) > _CLOSED_MEMORY:
            self._closed.popitem(last=False)
        self._ended_seen.pop(job.job_id, None)
        self._saved.pop(job.job_id, None)

    @property
    def records_skipped(self) -> int:
        """Job records Slurm printed that were left out because they could not be read safely.

        A record whose values forge lines of another (a newline in a job name or comment) never makes or
        changes another job; it is left out and counted here. 0 for a mapper that keeps no such count.
        """
        return self.mapper.records_skipped

    # -- the task -----------------------------------------------------------------------------

    def start(self) -> asyncio.Task:
        """Start the refresh loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self.run(), name="clusterwatch-job-registry")
        return self._task

    async def stop(self) -> None:
        """Stop the loop (an in-flight Slurm call is cancelled; its subprocess is killed by the mapper)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        close = getattr(self.mapper, "close", None)
        if close is not None:
            await close()

    @property
    def period_s(self) -> float:
        """Seconds between two passes of this registry while Slurm answers: N intervals for a shard of N."""
        return self.interval_s * (self.turn[1] if self.turn else 1)

    def next_delay(self) -> float:
        """Seconds to the next pass: the interval (a shard: to the start of its next turn), doubled per
        consecutive failure up to the cap (a shard: never below its period)."""
        if self.turn is None:  # one collector
            if not self.failures:
                return self.interval_s
            return Backoff(self.interval_s, self.max_backoff_s).after(self.failures)
        if self.failures:
            return Backoff(self.period_s, max(self.max_backoff_s, self.period_s)).after(self.failures)
        index, _ = self.turn
        now = self.clock()
        # Half an interval ahead: a sleep that wakes a little early, at the end of the slot before its
        # turn, must not count that turn as still to come and pass twice in it.
        ahead = now + self.interval_s / 2
        start = (ahead // self.period_s) * self.period_s + index * self.interval_s
        if start < ahead:
            start += self.period_s
        return start - now

    async def run(self) -> None:
        """Refresh until cancelled."""
        while True:
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one pass must not end the registry
                log.exception("job registry pass failed; it runs again")
            await asyncio.sleep(self.next_delay())

    # -- one pass -----------------------------------------------------------------------------

    def _known(self) -> list[str]:
        # Ended jobs too: one Slurm has marked ended waits out the grace period before it is closed.
        return [jid for jid in self.core.job_ids() if jid.isdigit()]

    async def refresh(self) -> bool:
        """One pass: ask Slurm, update the jobs, close the ended ones, fill in pids.

        Returns:
            True when Slurm answered.
        """
        now = self.clock()
        known = self._known()
        records: dict[str, JobRecord] = {}
        try:
            for record in await self.mapper.list_jobs():
                records[str(record.job_id)] = record
            for jid in [*known, *list(self._settling)[:_SETTLE_PER_PASS]]:
                if jid not in records:
                    record = await self.mapper.show_job(int(jid))
                    if record is not None:
                        records[jid] = record
        except SlurmUnavailable as exc:
            self._unreachable(now, str(exc))
            return False
        self._reachable()
        self._settle(records, now)
        to_close = []
        held = set(known)
        for jid, record in records.items():
            if jid in self._closed or (self.owns is not None and jid not in held and not self.owns(jid)):
                continue
            job = self._apply(record)
            if job.ended:
                first = self._ended_seen.setdefault(jid, now)
                if now - first >= self.close_grace_s or not self._any_agent_up(job, now):
                    to_close.append(job)
        for job in to_close:
            # Checked again right before closing: an epilog's end event may have closed it meanwhile.
            if self.core.holds(job):
                self.core.close_job(job)
                self._settling.pop(job.job_id, None)  # closed with Slurm's own final state
        if self.fill_in:
            await self._fill_in(now)
        return True

    def _settle(self, records: dict[str, JobRecord], now: float) -> None:
        """Jobs closed on their epilogs' word take Slurm's final state (and exit code) once it has one."""
        for jid in list(self._settling)[:_SETTLE_PER_PASS]:
            record = records.get(jid)
            if record is not None and record.state in ENDED_STATES:
                del self._settling[jid]
                self.core.amend_closed_job(jid, record.state, _exit_code(record), float(record.end_time or 0))
            elif record is None or now - self._settling[jid] > SETTLE_WINDOW_S:
                del self._settling[jid]  # Slurm no longer knows it, or never settled: the epilogs' word stands
            else:
                self._settling.move_to_end(jid)  # still COMPLETING: the others get their turn first

    def _unreachable(self, now: float, why: str) -> None:
        self.failures += 1
        if self.down_since is None:
            self.down_since = now
            log.warning("slurm: %s; jobs show what the agents report, retrying with backoff", why)
        note = unreachable_note(self.down_since)

        def mark(job: JobState) -> None:
            if not job.ended and not job.job_id.startswith("local-"):
                job.note = note

        self.core.edit_jobs(mark)

    def _reachable(self) -> None:
        if self.down_since is not None:
            log.info("slurm answers again")
        self.failures = 0
        self.down_since = None

        def unmark(job: JobState) -> None:
            if job.note.startswith(_UNREACHABLE):
                job.note = ""

        self.core.edit_jobs(unmark)

    def _apply(self, record: JobRecord) -> JobState:
        """Fill (or create) the JobState from Slurm's record; stored when it changed."""
        jid = str(record.job_id)
        inventories = {node: self.core.gpu_uuids_by_index(node) for node in record.gpus_by_node}

        def fill(job: JobState) -> tuple:
            job.source = "slurm"
            job.name = record.name or job.name
            job.user = record.user or job.user
            job.account = record.account or ""
            job.partition = record.partition or ""
            job.qos, job.cluster = record.qos or "", record.cluster or ""
            job.state = record.state
            job.submit_time = float(record.submit_time or 0)
            job.start_time = float(record.start_time or job.start_time or 0)
            job.time_limit_s = float(record.time_limit_s or 0)
            if record.nodes:
                job.nodes = list(dict.fromkeys([*record.nodes, *job.nodes]))
            job.cpus = record.cpus or 0
            job.memory_bytes = record.memory_bytes or 0
            counts = record.gpu_count_by_node or {n: len(i) for n, i in record.gpus_by_node.items()}
            job.gpus = sum(counts.values()) or job.gpus
            job.ranks_expected = record.num_tasks or 0
            if job.ended:
                # A running job's EndTime is only its expected end; render reads end_time as "ended".
                job.end_time = float(record.end_time or self.clock())
                job.exit_code = _exit_code(record)
            _gpus_by_node(job, record, inventories, self.core.state.set_job_gpus)
            return (job.name, job.user, job.state, job.start_time, tuple(job.nodes), job.gpus,
                    job.ranks_expected, tuple(sorted((n, tuple(u)) for n, u in job.gpus_by_node.items())))

        job, signature = self.core.edit_job(jid, fill, create=True)
        if self._saved.get(jid) != signature:
            self.core.save_job(job)  # with the next flush: a full or locked store never raises here
            self._saved[jid] = signature
        return job

    def _any_agent_up(self, job: JobState, now: float) -> bool:
        return any(self.core.agent_up(node, now) for node in job.nodes)

    # -- pids of nodes without an agent -----------------------------------------------------------

    async def _fill_in(self, now: float) -> None:
        wanted: list[tuple[JobState, str]] = []
        up = self.core.agents_up(now)

        def sort_nodes(job: JobState) -> None:
            if job.source != "slurm" or job.state != "RUNNING":
                return
            for node in job.nodes:
                if node in up:
                    job.listed_pids.pop(node, None)  # its agent reports the processes, with figures
                else:
                    wanted.append((job, node))

        self.core.edit_jobs(sort_nodes)
        if wanted:
            await asyncio.gather(*(self._listpids(job, node) for job, node in wanted))

    async def _listpids(self, job: JobState, node: str) -> None:
        async with self._semaphore:
            try:
                entries = await self.mapper.listpids(int(job.job_id), node)
            except SlurmUnavailable as exc:
                self.listpids_errors += 1
                # One line per node, then quiet: a node without sshd would fill the log every pass.
                self._listpids_warned.warning(node, "listpids for job %s on %s: %s", job.job_id, node, exc)
                return
        self._listpids_warned.forget(node)
        pids = {e.pid: e.global_id for e in entries if e.pid > 0}

        def record_pids(held: JobState) -> None:
            if held is job:  # not a job of the same id made since
                held.listed_pids[node] = pids

        self.core.edit_job(job.job_id, record_pids)


def build_registry(core: CollectorCore, config) -> JobRegistry:
    """The registry a ``--slurm`` collector runs, from its config.

    Jobs come from ``scontrol`` on the collector host (SLURM_CONF from the environment). With an SSH
    known_hosts file and key configured, pids of nodes without an agent come from ``scontrol listpids``
    run on the node over SSH; without them there is no fill-in (listpids only sees its own host).

    Args:
        core: the collector core.
        config: the CollectorConfig.

    Returns:
        The registry, not started.
    """
    from pathlib import Path

    from .scontrol import ScontrolMapper

    # The registry backs off itself; retries inside one pass would only stretch a pass while Slurm is down.
    jobs = ScontrolMapper(timeout_s=config.slurm_timeout_s, retries=0)
    mapper: JobMapper = jobs
    fill_in = bool(config.ssh_known_hosts and config.ssh_key)
    if fill_in:
        from .ssh import SshJobMapper, SshListpids

        table = dict(config.ssh_address)

        def address(node: str) -> tuple[str, int]:
            target = table.get(node, node)
            host, sep, port = target.rpartition(":")
            if sep and port.isdigit():
                return host.strip("[]"), int(port)
            return target, config.ssh_port

        mapper = SshJobMapper(jobs, SshListpids(Path(config.ssh_known_hosts), [Path(config.ssh_key)],
                                                username=config.ssh_user, address=address))
    return JobRegistry(core, mapper, interval_s=config.slurm_refresh_s, fill_in=fill_in,
                       owns=_owns(config), turn=_turn(config))


def _owns(config) -> Callable[[str], bool] | None:
    """Whether a job id is this shard's (clusterwatch/shards.py), None when the collector is not a shard."""
    if not config.shard:
        return None
    from clusterwatch.shards import Collectors

    deployment = Collectors.parse(config.collectors, config.collectors_before or None)
    return lambda job_id: deployment.for_job(job_id) == config.shard


def _turn(config) -> tuple[int, int] | None:
    """(this shard's place in the deployment's list, the list's length), None when it is not a shard."""
    if not config.shard:
        return None
    from clusterwatch.shards import Collectors

    members = Collectors.parse(config.collectors, config.collectors_before or None).all
    return members.index(config.shard), len(members)


def _gpus_by_node(job: JobState, record: JobRecord, inventories: dict[str, dict[int, str] | None],
                  set_job_gpus: Callable[[JobState, str, list[str]], None]) -> None:
    """Allocated GPUs by UUID: Slurm's per-node indexes looked up in that node's agent inventory
    (`inventories`: node → GPU index → UUID, None for a node without an agent), written through
    `set_job_gpus` (ClusterState's, which indexes them by node).

    A node whose prolog already named the UUIDs keeps them; a node without an agent (no inventory)
    stays out, since a GPU is only ever named by its UUID.
    """
    for node, indexes in record.gpus_by_node.items():
        by_index = inventories.get(node)
        if node in job.gpus_by_node or by_index is None:
            continue
        uuids = [by_index[i] for i in indexes if i in by_index]
        if uuids and len(uuids) == len(indexes):
            set_job_gpus(job, node, uuids)


def _exit_code(record: JobRecord) -> int | None:
    """Slurm's ExitCode as one number: the code, or 128 + the signal that killed the job."""
    if record.exit_signal:
        return 128 + record.exit_signal
    return record.exit_code
