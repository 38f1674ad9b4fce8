"""Process sampling through psutil, for systems without a Linux /proc (macOS): CPU and host memory figures.

The same surface as procs.ProcSource (descendants, sample, start_time, is_known, read_errors, close), so
the agent runs unchanged on top of it; the agent picks it when /proc is absent (runtime.open_procs).
It costs a few times what the /proc reader does a process (psutil opens and parses each file on
every call), which is why Linux keeps the /proc reader; on Linux, tests run this one by name and
check its figures against the /proc reader's.

A process is (pid, start time), as in the /proc reader: a pid reused by another process is a new process
(psutil.Process.is_running compares the start time).
"""
from __future__ import annotations

from dataclasses import dataclass

import psutil

from clusterwatch.model import GpuUse, ProcessSample, clean_wchan

# psutil's names of the states that hold a process where it is (clusterwatch.model.HELD_STATES).
_HELD_STATUSES = {psutil.STATUS_DISK_SLEEP: "D", psutil.STATUS_STOPPED: "T", psutil.STATUS_TRACING_STOP: "t"}

# The command as the /proc reader reports it (Linux's comm is at most 15 bytes): the same
# series names whichever source a node runs.
COMMAND_CHARS = 15


@dataclass(slots=True)
class _Seen:
    """A sampled process between polls: its psutil handle and its last CPU reading."""

    process: psutil.Process
    start_time: float
    cpu_s: float
    sampled_at: float
    wchan: str | None = None  # in D: where it waits, read when it entered D (None: not in D)


class PsutilProcSource:
    """Samples processes through psutil.

    Args:
        node: node name written into every sample.
        count_fds: count open file descriptors.
    """

    name = "psutil"

    def __init__(self, node: str, count_fds: bool = True) -> None:
        self.node = node
        self.count_fds = count_fds
        self.read_errors = 0
        self._handles: dict[int, psutil.Process] = {}
        self._seen: dict[int, _Seen] = {}

    def _handle(self, pid: int) -> psutil.Process | None:
        """psutil's handle of `pid`, kept while it is the same process; None when it is gone."""
        p = self._handles.get(pid)
        if p is not None and p.is_running():
            return p
        self._handles.pop(pid, None)
        try:
            p = psutil.Process(pid)
        except psutil.NoSuchProcess:
            return None
        self._handles[pid] = p
        return p

    def descendants(self, roots: set[int]) -> set[int]:
        """The roots that exist and every process below them."""
        out: set[int] = set()
        for root in roots:
            p = self._handle(root)
            if p is None:
                continue
            try:
                below = p.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                self.read_errors += 1
                below = []
            out.add(root)
            out.update(c.pid for c in below)
        for pid in [p for p in self._handles if p not in out]:
            del self._handles[pid]
        return out

    def start_time(self, pid: int) -> float | None:
        """The start time (Unix seconds) of a pid, None when it is gone."""
        try:
            return round(psutil.Process(pid).create_time(), 2)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def is_known(self, pid: int) -> bool:
        """Whether the last poll sampled this pid (it is watched)."""
        return pid in self._seen

    def sample(self, pids: set[int], now: float, gpu_use: dict[int, list[GpuUse]]) -> list[ProcessSample]:
        """One sample per live pid; gone, zombie and unreadable ones are skipped (unreadable: counted)."""
        seen: dict[int, _Seen] = {}
        out: list[ProcessSample] = []
        for pid in pids:
            p = self._handle(pid)
            if p is None:
                continue
            try:
                sample = self._sample_one(pid, p, now, seen, gpu_use)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            except psutil.AccessDenied:
                self.read_errors += 1
                continue
            if sample is not None:
                out.append(sample)
        self._seen = seen
        return out

    def _sample_one(self, pid: int, p: psutil.Process, now: float, seen: dict[int, _Seen],
                    gpu_use: dict[int, list[GpuUse]]) -> ProcessSample | None:
        with p.oneshot():
            status = p.status()
            if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return None
            start = round(p.create_time(), 2)
            times = p.cpu_times()
            cpu_s = times.user + times.system
            last = self._seen.get(pid)
            cpu_percent = None  # no previous reading of this process yet
            if last is not None and last.start_time == start and now > last.sampled_at:
                cpu_percent = round(100.0 * (cpu_s - last.cpu_s) / (now - last.sampled_at), 1)
            wchan = None
            if status == psutil.STATUS_DISK_SLEEP:  # read when it enters D, as the /proc reader does at most
                same = last is not None and last.start_time == start and last.wchan is not None
                wchan = last.wchan if same else self._wchan(pid)  # type: ignore[union-attr]
            seen[pid] = _Seen(p, start, cpu_s, now, wchan)
            uid = p.uids().real
            open_fds = self._open_fds(p) if self.count_fds else None
            return ProcessSample(
                time=now, node=self.node, pid=pid, start_time=start, ppid=p.ppid(), uid=uid,
                user=self._user(p, uid), command=p.name()[:COMMAND_CHARS], cpu_percent=cpu_percent,
                rss_bytes=p.memory_info().rss, threads=p.num_threads(), open_fds=open_fds,
                gpus=tuple(gpu_use.get(pid, ())), state=_HELD_STATUSES.get(status, ""), wchan=wchan or "")

    @staticmethod
    def _wchan(pid: int) -> str:
        """Where a process in D waits (psutil does not say): /proc/<pid>/wchan, cleaned."""
        try:
            with open(f"/proc/{pid}/wchan", "rb", buffering=0) as f:
                return clean_wchan(f.read(256))
        except OSError:
            return ""

    def _open_fds(self, p: psutil.Process) -> int | None:
        try:
            return p.num_fds()
        except psutil.AccessDenied:  # another user's process: unknown, not zero
            self.read_errors += 1
            return None

    @staticmethod
    def _user(p: psutil.Process, uid: int) -> str:
        try:
            return p.username()
        except (KeyError, psutil.Error):
            return str(uid)

    def close(self) -> None:
        """Forget every handle (the source stays usable)."""
        self._handles.clear()
