"""Slurm labels of a process from its own /proc entries: cgroup first, then environment.

The cgroup path is set by slurmstepd and cannot be changed by the job, so it wins for
the job id; the environment adds the step and rank (SLURM_PROCID, or RANK where a
launcher such as torchrun runs under srun and numbers its own workers).

Several slurmd can run on one host (one per simulated node); each node's agent takes only the processes
whose SLURMD_NODENAME, when they carry one, names its own node. Prolog and epilog processes carry the
job's variables too (SLURM_SCRIPT_CONTEXT tells them apart) and are never counted as the job's.
"""
from __future__ import annotations

from clusterwatch.errors import ParseError
from clusterwatch.procfs import ExecInProgress, probe, read_environ
from clusterwatch.slurm.proc import EnvLabels, environ_labels, parse_cgroup, parse_environ

from .backends.new_pids import NewPids
from .labels import JobLabels

_NOT_TASK_STEPS = ("batch", "extern", "interactive")


def _read(path: str, limit: int = 1 << 20) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def _ranks(env: EnvLabels, step: str | None) -> tuple[int | None, int | None]:
    """(global rank, local rank): the launcher's RANK wins over Slurm's task id."""
    task_step = step is not None and step not in _NOT_TASK_STEPS
    rank = env.rank if env.rank is not None else (env.proc_id if task_step else None)
    local = env.local_rank if env.local_rank is not None else (env.local_id if task_step else None)
    return rank, local


class ProcLookup:
    """Reads a process's cgroup and environ for job and rank.

    Args:
        proc: the /proc mount point.
        node: this agent's node name; a process whose SLURMD_NODENAME names another node is not ours.
            None: no filter.
    """

    def __init__(self, proc: str = "/proc", node: str | None = None) -> None:
        self.proc = proc
        self.node = node
        self.errors = 0
        self._news = NewPids(proc)
        self._starts: dict[int, int] = {}  # pid → start ticks of every process on the node, as last read

    def _environ(self, pid: int) -> dict[str, str] | None:
        """Raises ExecInProgress while the process's variables are not in place yet."""
        data = read_environ(self.proc, pid)
        if data is None:
            return None
        return parse_environ(data)

    def env(self, pid: int) -> EnvLabels | None:
        """The job and rank variables of a process's environment, None when it cannot be read.

        Raises:
            ExecInProgress: the process is inside execve; ask again at a later poll.
        """
        environ = self._environ(pid)
        return environ_labels(environ) if environ is not None else None

    def foreign(self, environ: dict[str, str]) -> bool:
        """True for a process that is not this node's job work: a prolog/epilog, or another node's task."""
        if environ.get("SLURM_SCRIPT_CONTEXT"):
            return True
        other = environ.get("SLURMD_NODENAME")
        return bool(self.node and other and other != self.node)

    def cgroup_job(self, pid: int):
        text = _read(f"{self.proc}/{pid}/cgroup")
        if text is None:
            return None
        try:
            return parse_cgroup(text.decode("utf-8", "replace"))
        except ParseError:
            self.errors += 1
            return None

    def slurm_labels(self, pid: int) -> JobLabels | None:
        """The process's job, step and rank, or None when it is not part of a Slurm job.

        Raises:
            ExecInProgress: the process is inside execve; ask again at a later poll.
        """
        environ = self._environ(pid) or {}
        if self.foreign(environ):
            return None
        cg = self.cgroup_job(pid)
        env = environ_labels(environ) if environ else EnvLabels()
        if cg is not None and cg.job_id is not None:
            job_id, how = str(cg.job_id), "cgroup"
            step = cg.step or env.step_id
        elif env.job_id is not None:
            job_id, how, step = str(env.job_id), "environ", env.step_id
        else:
            return None
        rank, local = _ranks(env, step)
        return JobLabels(job_id, rank, local, step or "", how)

    def rank_labels(self, pid: int, job_id: str) -> JobLabels:
        """Labels for a process the agent was told to watch as `job_id` (ranks from its environment)."""
        env = self.env(pid) or EnvLabels()
        return JobLabels(job_id, env.rank, env.local_rank, "", "pid")

    def job_pids(self, job_ids: set[str], cache: dict[tuple[int, int], str | None]) -> set[int]:
        """Pids on this node whose cgroup or environment puts them in one of `job_ids`.

        Only processes not seen before are read (the cache maps (pid, start ticks) to
        their job or None). Which processes are new comes from /proc/loadavg's last pid
        (NewPids): a poll costs one read while nothing starts, the new pids' stat when
        some do, and a listing of /proc now and then (which also forgets the gone ones).
        """
        news = self._news
        starts = self._starts
        new = news.poll()
        if news.listed:
            listing = news.listing or {}
            for pid in [p for p in starts if p not in listing]:
                cache.pop((pid, starts.pop(pid)), None)
            if new is None:
                new = listing.keys()
        for pid in new:
            stat = _read(f"{self.proc}/{pid}/stat", 4096)
            got = probe(stat) if stat is not None else None
            if got is None:
                continue  # gone, or a thread
            start = got[1]
            old = starts.get(pid)
            if old == start:
                continue
            if old is not None:
                cache.pop((pid, old), None)  # the pid was reused
            key = (pid, start)
            if key not in cache:
                try:
                    labels = self.slurm_labels(pid)
                except ExecInProgress:
                    news.again(pid)  # its variables are not there yet: read them at the next call
                    continue
                cache[key] = labels.job_id if labels else None
            starts[pid] = start
        return {pid for pid, start in starts.items() if cache.get((pid, start)) in job_ids}
