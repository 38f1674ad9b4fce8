"""Process sampling from /proc: the watched processes and all their descendants.

Reads `/proc/<pid>/stat` and `statm` directly: for 64 known pids that costs about a
seventh of psutil's per-process calls (reference/PERF-BASELINES.md). A process is
identified by (pid, start time): CPU deltas and caches never join a reused pid to
the process that had it before.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from clusterwatch.model import GpuUse, ProcessSample

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def read_boot_time(proc: str = "/proc") -> float:
    """Boot time in Unix seconds, from the `btime` line of /proc/stat."""
    with open(f"{proc}/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError(f"{proc}/stat has no btime line")


@dataclass(frozen=True, slots=True)
class StatFields:
    """The fields of /proc/<pid>/stat the agent uses."""

    comm: str
    state: str
    ppid: int
    cpu_ticks: int  # utime + stime, in clock ticks
    threads: int
    start_ticks: int  # start time after boot, in clock ticks
    rss_pages: int


def parse_stat(text: bytes) -> StatFields:
    """Parse /proc/<pid>/stat. The command name may hold spaces and parentheses: split at the last ')'."""
    close = text.rindex(b")")
    comm = text[text.index(b"(") + 1 : close].decode("utf-8", "replace")
    rest = text[close + 2 :].split()
    # rest[0] is field 3 (state); field n is rest[n - 3]
    return StatFields(
        comm=comm,
        state=rest[0].decode("ascii", "replace"),
        ppid=int(rest[1]),
        cpu_ticks=int(rest[11]) + int(rest[12]),
        threads=int(rest[17]),
        start_ticks=int(rest[19]),
        rss_pages=int(rest[21]),
    )


@dataclass(slots=True)
class _Known:
    """What the source remembers of a process between polls."""

    start_time: float
    cpu_ticks: int
    sampled_at: float
    uid: int
    user: str


class ProcSource:
    """Samples processes from a /proc tree (the real one, or a fixture in tests).

    Args:
        node: node name written into every sample.
        proc: the /proc mount point.
        count_fds: count open file descriptors (a directory listing per process).
    """

    def __init__(self, node: str, proc: str = "/proc", count_fds: bool = True) -> None:
        self.node = node
        self.proc = proc
        self.count_fds = count_fds
        self.boot_time = read_boot_time(proc)
        self.read_errors = 0
        self._known: dict[int, _Known] = {}
        self._users: dict[int, str] = {}
        self._children_files = os.path.exists(f"{proc}/self/task/{os.getpid()}/children")

    # -- the tree -------------------------------------------------------------------------

    def descendants(self, roots: set[int]) -> set[int]:
        """The roots that exist and every process below them."""
        if not roots:
            return set()
        if self._children_files:
            return self._walk_children(roots)
        return self._walk_scan(roots)

    def _walk_children(self, roots: set[int]) -> set[int]:
        seen: set[int] = set()
        todo = [p for p in roots if os.path.exists(f"{self.proc}/{p}")]
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                tids = os.listdir(f"{self.proc}/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"{self.proc}/{pid}/task/{tid}/children", "rb") as f:
                        todo.extend(int(c) for c in f.read().split())
                except OSError:
                    continue
        return seen

    def _walk_scan(self, roots: set[int]) -> set[int]:
        children: dict[int, list[int]] = {}
        for name in os.listdir(self.proc):
            if not name.isdigit():
                continue
            try:
                with open(f"{self.proc}/{name}/stat", "rb") as f:
                    ppid = parse_stat(f.read()).ppid
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
        seen: set[int] = set()
        todo = [p for p in roots if os.path.exists(f"{self.proc}/{p}")]
        while todo:
            pid = todo.pop()
            if pid not in seen:
                seen.add(pid)
                todo.extend(children.get(pid, ()))
        return seen

    # -- sampling -------------------------------------------------------------------------

    def start_time(self, pid: int) -> float | None:
        """The start time (Unix seconds) of a pid, None when it is gone."""
        try:
            with open(f"{self.proc}/{pid}/stat", "rb") as f:
                st = parse_stat(f.read())
        except (OSError, ValueError, IndexError):
            return None
        return self.boot_time + st.start_ticks / _CLK_TCK

    def is_known(self, pid: int) -> bool:
        """Whether the last poll sampled this pid (it is watched)."""
        return pid in self._known

    def sample(self, pids: set[int], now: float, gpu_use: dict[int, list[GpuUse]]) -> list[ProcessSample]:
        """One sample per live pid; vanished pids are skipped (they died between listing and reading).

        Args:
            pids: the processes to sample.
            now: the poll's time (Unix seconds).
            gpu_use: per pid, the GPUs it uses, from the GPU source.
        """
        out: list[ProcessSample] = []
        alive: set[int] = set()
        for pid in pids:
            sample = self._sample_one(pid, now, gpu_use.get(pid, ()))
            if sample is not None:
                out.append(sample)
                alive.add(pid)
        for pid in [p for p in self._known if p not in alive]:
            del self._known[pid]
        return out

    def _sample_one(self, pid: int, now: float, gpus) -> ProcessSample | None:
        base = f"{self.proc}/{pid}"
        try:
            with open(f"{base}/stat", "rb") as f:
                st = parse_stat(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, IndexError):
            self.read_errors += 1
            return None
        if st.state in ("Z", "X"):
            return None  # exited, waiting to be reaped: its figures are zeros, not readings
        start_time = round(self.boot_time + st.start_ticks / _CLK_TCK, 2)
        known = self._known.get(pid)
        if known is None or known.start_time != start_time:
            try:
                uid = os.stat(base).st_uid
            except OSError:
                return None
            known = _Known(start_time, st.cpu_ticks, now, uid, self._user_name(uid))
            self._known[pid] = known
            cpu_percent = None  # no previous reading of this process yet
        else:
            dt = now - known.sampled_at
            cpu_percent = (
                round(100.0 * (st.cpu_ticks - known.cpu_ticks) / _CLK_TCK / dt, 1) if dt > 0 else None
            )
            known.cpu_ticks = st.cpu_ticks
            known.sampled_at = now
        open_fds = None
        if self.count_fds:
            try:
                open_fds = len(os.listdir(f"{base}/fd"))
            except OSError:
                self.read_errors += 1
        return ProcessSample(
            time=now,
            node=self.node,
            pid=pid,
            start_time=start_time,
            ppid=st.ppid,
            uid=known.uid,
            user=known.user,
            command=st.comm,
            cpu_percent=cpu_percent,
            rss_bytes=st.rss_pages * _PAGE_SIZE,
            threads=st.threads,
            open_fds=open_fds,
            gpus=tuple(gpus),
        )

    def _user_name(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            import pwd

            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name
