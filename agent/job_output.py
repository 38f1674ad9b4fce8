"""Progress of jobs that never call clusterwatch.train, read from their own output (`--read-job-output`).

On its own thread, at its own cadence (never inside a poll): the poll hands over its labelled processes
(`see`); each round the reader finds the regular files the jobs' processes write as stdout and stderr (Slurm's
StdOut/StdErr, one per task with %t), opens each new one as its owner (agent/job_output_open.py), reads what was
appended (agent/job_output_tail.py), parses it (agent/job_output_parse.py, then the site's regex), and queues a
TrainingReport when the progress has changed. The poll drains them into the batch beside clusterwatch.train's, so
the collector's step, training_stall and job_slowdown work the same; each carries the tag
progress_from=job-output.

A file goes to one process: the lowest rank among the processes that write it (a shared StdOut, DataLoader
workers), else, when only the batch script or srun writes it, the job's lowest rank on this node, else its
writer on a GPU, else its first writer. A process that reports through clusterwatch.train is not given its
output's progress: what it reports is the truth.
"""
from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from clusterwatch.background import BackgroundThread
from clusterwatch.log_once import SaidOnce
from clusterwatch.model import ProcessSample, TrainingReport

from .job_output_open import Refused, open_output, output_file
from .job_output_parse import Progress, ProgressTracker, parse_line
from .job_output_tail import OutputTail

log = logging.getLogger("clusterwatch.agent")

SOURCE_TAG = ("progress_from", "job-output")
MAX_FILES = 256  # files followed at once (each an open descriptor)
MAX_PROCESSES = 4096  # processes looked at per round
MAX_QUEUE = 10_000
INSTRUMENTED_FOR_S = 120.0  # a clusterwatch.train report this recent means the process is instrumented


@dataclass
class Followed:
    """A file read for a process."""

    fd: int
    tail: OutputTail
    tracker: ProgressTracker
    pid: int = 0
    start_time: float = 0.0


def _reporter(writers: list[ProcessSample], job: list[ProcessSample]) -> ProcessSample:
    """The process a file's progress goes to (the module's docstring says which)."""
    ranked = [w for w in writers if w.rank is not None]
    if not ranked:
        ranked = [p for p in job if p.rank is not None]
    if ranked:
        return min(ranked, key=lambda p: (p.rank, p.start_time))
    return min(writers, key=lambda p: (not p.gpus, p.start_time))


class JobOutputReader:
    """Reads the progress of jobs' processes from their output files.

    Args:
        interval_s: how often the files are read.
        proc: the /proc mount point.
        site_match: the site's regex as a matcher (agent/job_output_regex.py): lines in, a Progress or None each
            out; None: the built-in patterns only.
        opener: (proc, pid, fd number, stat) → (descriptor, owner): job_output_open.open_output; tests pass theirs.
        clock: wall clock for the reports' times.
    """

    def __init__(self, interval_s: float = 2.0, proc: str = "/proc",
                 site_match: Callable[[list[str]], list[Progress | None]] | None = None,
                 opener: Callable = open_output, clock: Callable[[], float] = time.time) -> None:
        self.interval_s = interval_s
        self.proc = proc
        self.site_match = site_match
        self._open = opener
        self._clock = clock
        self._samples: list[ProcessSample] = []
        self._instrumented: dict[tuple[int, float], float] = {}
        self._files: dict[tuple[int, int], Followed] = {}
        self._refused: dict[tuple[int, int], str] = {}
        self._queue: collections.deque[TrainingReport] = collections.deque(maxlen=MAX_QUEUE)
        self._said = SaidOnce(log, limit=1024)
        self._thread = BackgroundThread(self._loop, name="clusterwatch-job-output", os_name="cw-job-output")
        self.refused = 0  # files not read (another owner, not regular, FUSE, the owner could not open it)
        self.errors = 0  # rounds or reads that failed

    # -- the poll's side ------------------------------------------------------------------

    def see(self, samples: list[ProcessSample], reports: Iterable[TrainingReport] = ()) -> None:
        """The poll's labelled processes, and the clusterwatch.train reports it drained (instrumented processes)."""
        self._samples = [s for s in samples if s.job_id][:MAX_PROCESSES]
        now = time.monotonic()
        for r in reports:
            self._instrumented[(r.pid, r.start_time)] = now

    @property
    def following(self) -> int:
        """How many files the reader follows now (the batch's `job_output_files`)."""
        return len(self._files)

    def drain(self) -> list[TrainingReport]:
        out = []
        while self._queue:
            out.append(self._queue.popleft())
        return out

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, close the files and the site regex's child."""
        if not self._thread.stop(5.0):
            return  # still inside a read: its descriptors stay open (the process is ending)
        for f in self._files.values():
            os.close(f.fd)
        self._files.clear()
        close_site = getattr(self.site_match, "close", None)
        if close_site is not None:
            close_site()

    # -- the reader's side ----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._thread.stopping.wait(self.interval_s):
            try:
                self.read_round()
            except Exception:  # never let the thread die: progress would stop silently
                self.errors += 1
                if self._said.first("round"):
                    log.exception("reading jobs' output failed (further failures are counted only)")

    def _writers(self) -> tuple[dict[tuple[int, int], tuple[os.stat_result, int, list[ProcessSample]]],
                                dict[str, list[ProcessSample]]]:
        """Each regular file the jobs' processes write as stdout or stderr: (stat, fd number, its writers)."""
        files: dict[tuple[int, int], tuple[os.stat_result, int, list[ProcessSample]]] = {}
        jobs: dict[str, list[ProcessSample]] = {}
        for s in self._samples:
            jobs.setdefault(s.job_id, []).append(s)
            for number in (1, 2):
                st = output_file(self.proc, s.pid, number)
                if st is None or st.st_uid != s.uid:
                    continue  # not a file, or not the owner's: never opened
                key = (st.st_dev, st.st_ino)
                if key not in files:
                    files[key] = (st, number, [])
                writers = files[key][2]
                if not writers or writers[-1] is not s:  # stdout and stderr may be the one file
                    writers.append(s)
        return files, jobs

    def read_round(self) -> None:
        """One round: find the files, open the new ones, read them all, queue the reports."""
        files, jobs = self._writers()
        for key in [k for k in self._files if k not in files]:  # no watched process writes it any more
            os.close(self._files.pop(key).fd)
        self._refused = {k: v for k, v in self._refused.items() if k in files}
        horizon = time.monotonic() - INSTRUMENTED_FOR_S
        self._instrumented = {k: t for k, t in self._instrumented.items() if t >= horizon}
        now = self._clock()
        for key, (st, number, writers) in files.items():
            target = _reporter(writers, jobs[writers[0].job_id])
            followed = self._files.get(key) or self._follow(key, st, number, writers)
            if followed is None:
                continue
            followed.pid, followed.start_time = target.pid, target.start_time
            try:
                progress = self._read(followed)
            except OSError:
                self.errors += 1
                continue
            if progress is None or (target.pid, target.start_time) in self._instrumented:
                continue
            self._queue.append(TrainingReport(
                time=now, pid=target.pid, start_time=target.start_time, step=progress.step, loss=progress.loss,
                lr=progress.lr, epoch=progress.epoch, tags=dict([SOURCE_TAG])))

    def _follow(self, key: tuple[int, int], st: os.stat_result, number: int,
                writers: list[ProcessSample]) -> Followed | None:
        if key in self._refused or len(self._files) >= MAX_FILES:
            return None
        writer = writers[0]
        try:
            fd, _owner = self._open(self.proc, writer.pid, number, st)
        except Refused as exc:
            self.refused += 1
            self._refused[key] = str(exc)
            if self._said.first(("refused", key)):
                log.warning("job %s: not reading the output of pid %d (fd %d): %s", writer.job_id, writer.pid,
                            number, exc)
            return None
        followed = Followed(fd, OutputTail(fd), ProgressTracker())
        self._files[key] = followed
        return followed

    def _read(self, f: Followed) -> Progress | None:
        lines, pending = f.tail.read()
        if pending:
            lines.append(pending)  # tqdm's latest update, not yet ended by the next one's "\r"
        parsed = [parse_line(line) for line in lines]
        if self.site_match is not None:
            rest = [i for i, p in enumerate(parsed) if p is None]
            if rest:
                for i, p in zip(rest, self.site_match([lines[i] for i in rest]), strict=True):
                    parsed[i] = p
        for p in parsed:
            if p is not None:
                f.tracker.feed(p)
        return f.tracker.take()


def open_job_output(config) -> JobOutputReader | None:
    """The reader the agent's config asks for (`read_job_output`), started; None when it is off. A bad site regex
    is a ConfigError."""
    if not config.read_job_output:
        return None
    site = None
    if config.job_output_regex:
        from .job_output_regex import SiteRegex

        site = SiteRegex(config.job_output_regex)
    reader = JobOutputReader(interval_s=max(1.0, config.interval_s), site_match=site)
    reader.start()
    log.info("reading the progress of jobs without clusterwatch.train from their output files, as their owners")
    return reader
