"""Process sampling from /proc: the watched processes and all their descendants.

A process is identified by (pid, start time): CPU deltas and caches never join a reused
pid to the process that had it before.

What a poll costs, and why (bench/bench_agent.py measures it; opening a /proc file costs several
times what reading an open one does):

- Each watched process is read through file descriptors the source keeps open while it
  watches it: `/proc/<pid>/stat` (one `pread` a poll gives state, parent, CPU, threads,
  start time and RSS) and `/proc/<pid>/fd` (an `fstat` gives the number of open
  descriptors on Linux >= 6.2; a listing otherwise), counted when the process is first
  seen and then every `fd_count_every_s` (see DEFAULT_FD_COUNT_EVERY_S). Both are opened relative to the
  same `/proc/<pid>` directory, and a descriptor of /proc stays tied to the process it
  was opened for: once that process is reaped, reads fail with ESRCH, so a reused pid
  can never be read as the old process.
- A stat text equal to the one read at the last poll is not parsed again: the same text is the
  same process (pid and start time are in it) with the same parent and figures, and no CPU tick
  used since. Most watched processes (data loader workers, launchers, shells) sleep between polls.
- The tree is kept, not walked again: each poll re-reads the members (their parent may
  change, and those reads are the samples' too) and reads the stat of the pids handed
  out since the last poll, which /proc/loadavg's last pid tells (NewPids); a new process
  whose parent is in the tree joins it, whichever thread forked it. /proc is listed
  (and only the pids new since the last listing read) on the first poll, when many
  pids were handed out, and every `full_every`-th poll anyway.
- A root not in the tree yet is walked exactly, once: every thread's `children` file
  (or, where the kernel has none, the parents of all processes).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from clusterwatch.agent.backends.new_pids import DEFAULT_FULL_EVERY, NewPids

from clusterwatch.model import GpuUse, ProcessSample, clean_wchan
from clusterwatch.procfs import (
    NUM_THREADS,
    PPID,
    RSS,
    STARTTIME,
    STAT_MAX,
    STATE,
    STIME,
    UTIME,
    parse_stat,
    probe,
    read_boot_time,
    split_stat,
    stat_comm,
)

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_RO = os.O_RDONLY | os.O_CLOEXEC
_RO_DIR = _RO | os.O_DIRECTORY
_GONE_STATES = (b"Z", b"X")  # exited, waiting to be reaped: its figures are zeros, not readings
# The states that hold a process where it is (clusterwatch.model.HELD_STATES), as the stat text spells them.
_HELD_STATES = {b"D": "D", b"T": "T", b"t": "t"}
# A process in D: where it waits (/proc/<pid>/wchan) is read when it enters D, then at most this often while
# its stat text changes (a stuck process's text stays, and so does its wchan); at most WCHAN_READS_A_POLL a
# poll (a hung file system puts every process that touches it in D at once): the others at the next polls.
WCHAN_EVERY_S = 10.0
WCHAN_READS_A_POLL = 8

# Count a process's open descriptors when it is first seen and then at most this often (seconds).
# The collector's rules look at a process at most every 5 s (collector/alerting/live.py min_interval_s)
# and judge fd leaks over minutes, so a count up to this old loses them nothing; between counts a
# sample carries the last count (None stays "unknown": a count that failed). Counting costs an
# fstat (a listing on Linux < 6.2) per process, a sixth of a poll's /proc work.
DEFAULT_FD_COUNT_EVERY_S = 5.0


@dataclass(slots=True)
class _Known:
    """What the source remembers of a sampled process between polls."""

    start: bytes  # the start time field of the stat text (equal text, equal number: no int() a poll)
    start_time: float
    cpu_ticks: int
    sampled_at: float
    uid: int
    user: str
    close: int  # where the name ends in the stat text
    head: bytes  # the stat text up to there: "pid (name"; while it stays, so does the name
    comm: str
    open_fds: int | None = None  # at the last count
    fds_at: float = float("-inf")  # when they were counted (a poll's time)
    text: bytes = b""  # the stat text of the last sample, and what was read from it:
    ppid: int = 0
    threads: int = 0
    rss_bytes: int = 0
    state: str = ""  # a held state's letter (see _HELD_STATES), "" otherwise
    wchan: str = ""  # in D: where it waits, as read at wchan_at
    wchan_at: float = float("-inf")


@dataclass(slots=True)
class _Held:
    """Descriptors kept open for a watched process: its stat file and its fd directory (-1: none)."""

    stat_fd: int
    fd_dir: int


def _held_budget() -> int:
    """How many processes may keep descriptors open: two each, a quarter of the soft limit in all, at most 4096."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 16
    except (ImportError, OSError, ValueError):
        soft = 1024
    return max(0, min(4096, soft // 8))


class ProcSource:
    """Samples processes from a /proc tree (the real one, or a fixture in tests).

    Args:
        node: node name written into every sample.
        proc: the /proc mount point.
        count_fds: count open file descriptors.
        fd_count_every_s: count a process's descriptors when first seen, then at most this often;
            samples in between carry the last count (see DEFAULT_FD_COUNT_EVERY_S).
        full_every: list /proc for new processes at least every this many polls (see NewPids).
        max_held: how many processes may keep descriptors open (default: from the descriptor limit);
            the others are opened and closed at every read.
    """

    def __init__(self, node: str, proc: str = "/proc", count_fds: bool = True,
                 full_every: int = DEFAULT_FULL_EVERY, max_held: int | None = None,
                 fd_count_every_s: float = DEFAULT_FD_COUNT_EVERY_S) -> None:
        self.node = node
        self.proc = proc
        self.count_fds = count_fds
        self.fd_count_every_s = fd_count_every_s
        self.boot_time = read_boot_time(proc)
        self.read_errors = 0
        self._known: dict[int, _Known] = {}  # pid → sampled at the last poll
        self._users: dict[int, str] = {}
        self._children_files = os.path.exists(f"{proc}/self/task/{os.getpid()}/children")
        self._fd_dir_size = count_fds and _fd_dir_counts(proc)
        self._news = NewPids(proc, full_every)
        self._members: set[int] = set()  # the tree at the last poll
        self._held: dict[int, _Held] = {}
        self._max_held = _held_budget() if max_held is None else max_held
        self._fresh: dict[int, bytes] = {}  # stat texts read by descendants() for sample() of the same poll
        self._split: dict[int, tuple[bytes, tuple[int, list[bytes]]]] = {}  # text → split_stat of it (see _reread)
        self._roots: set[int] = set()
        self._parents: dict[int, int] = {}  # pid → parent of every process read at the last tree change
        self._wchan_left = WCHAN_READS_A_POLL  # wchan reads left in this poll

    # -- descriptors ----------------------------------------------------------------------

    def _hold(self, pid: int) -> _Held | None:
        """Open and keep `pid`'s stat file (and fd directory), both relative to one /proc/<pid>.

        Returns None when no more descriptors may be kept or they cannot be opened (the caller reads by path);
        raises FileNotFoundError when the process is gone.
        """
        if len(self._held) >= self._max_held:
            return None
        try:
            base = os.open(f"{self.proc}/{pid}", _RO_DIR)
        except (FileNotFoundError, ProcessLookupError):
            raise FileNotFoundError(pid) from None
        except OSError:
            return None
        try:
            stat_fd = os.open("stat", _RO, dir_fd=base)
        except (FileNotFoundError, ProcessLookupError):
            os.close(base)
            raise FileNotFoundError(pid) from None
        except OSError:
            os.close(base)
            return None
        fd_dir = -1
        if self.count_fds:
            try:
                fd_dir = os.open("fd", _RO_DIR, dir_fd=base)
            except OSError:
                fd_dir = -1  # another user's process (the agent is not root): counted at each read
        os.close(base)
        held = _Held(stat_fd, fd_dir)
        self._held[pid] = held
        return held

    def _release(self, pid: int) -> None:
        held = self._held.pop(pid, None)
        if held is not None:
            os.close(held.stat_fd)
            if held.fd_dir >= 0:
                os.close(held.fd_dir)

    def _drop(self, pid: int) -> None:
        self._release(pid)
        return None

    def close(self) -> None:
        """Close every kept descriptor (the source stays usable and reopens what it needs)."""
        for pid in list(self._held):
            self._release(pid)
        self._members = set()
        self._roots, self._parents = set(), {}
        if not self._news.shared:  # a shared one is kept current by the other source, which polls it anyway
            self._news.reset()

    def _read(self, pid: int, hold: bool) -> bytes | None:
        """The stat text of `pid`, None when it is gone (or unreadable: counted)."""
        held = self._held.get(pid)
        if held is not None:
            try:
                data = os.pread(held.stat_fd, STAT_MAX, 0)
            except ProcessLookupError:
                data = b""  # reaped: the pid may already be another process's, read below anew
            except OSError:
                self.read_errors += 1
                data = b""
            if data:
                return data
            self._release(pid)
        if hold:
            try:
                held = self._hold(pid)
            except FileNotFoundError:
                return None
            if held is not None:
                try:
                    return os.pread(held.stat_fd, STAT_MAX, 0) or self._drop(pid)
                except OSError:
                    return self._drop(pid)
        try:
            with open(f"{self.proc}/{pid}/stat", "rb", buffering=0) as f:
                return f.read(STAT_MAX) or None
        except (FileNotFoundError, ProcessLookupError):
            return None
        except OSError:
            self.read_errors += 1
            return None

    # -- the tree -------------------------------------------------------------------------

    def descendants(self, roots: set[int]) -> set[int]:
        """The roots that exist and every process below them.

        The stat texts read here are kept for `sample()` of the same poll, which reads nothing twice (and
        parses a text only when it differs from its last sample's).
        """
        fresh: dict[int, bytes] = {}
        self._fresh = fresh
        self._split = {}
        if not roots:
            self.close()
            return set()
        new = self._news.poll() or ()  # None: the first listing; the new roots below are walked exactly
        members = self._members
        known_roots = roots <= members  # the usual poll: every root is in the tree already
        parents = self._reread(members if known_roots else members | roots, fresh)
        new_roots = [] if known_roots else [r for r in roots if r in parents and r not in members]
        if new_roots:
            new = set(new) | self._walk(new_roots, members)
        probed = self._probe_new(new, parents)
        if not probed and not new_roots and roots == self._roots and parents == self._parents:
            return set(members)  # nothing started, ended or moved: the same tree
        self._roots, self._parents = set(roots), parents
        tree = reachable(roots, parents)
        for pid in parents:
            if pid not in tree and pid not in probed:
                self._release(pid)
                del fresh[pid]
        self._hold_probed(probed, tree, parents, fresh)
        self._members = tree
        return set(tree)

    def _reread(self, pids: set[int], fresh: dict[int, bytes]) -> dict[int, int]:
        """Read the stat of each of `pids` into `fresh`; their parents (the gone and unreadable left out)."""
        parents: dict[int, int] = {}
        held_of = self._held.get
        last_of = self._known.get  # what the last poll sampled: its text, and the parent read from it
        pread = os.pread
        # A changed text is split once, here, as far as sample() reads it: the parent for the tree, the rest
        # for the sample of the same poll (split_stat is a third of a changed process's parsing).
        split = self._split
        for pid in pids:
            held = held_of(pid)
            if held is not None:
                try:
                    data = pread(held.stat_fd, STAT_MAX, 0)
                except OSError:
                    data = b""
                last = last_of(pid)
                if last is not None and data == last.text:  # unchanged (a sleeping process): same parent
                    fresh[pid] = data
                    parents[pid] = last.ppid
                    continue
                if not data:  # ESRCH: reaped, and the pid may already be another process's
                    data = self._read(pid, True)
                    if data is None:
                        continue
            else:
                data = self._read(pid, True)
                if data is None:
                    continue
            try:
                parts = split_stat(data)
                ppid = int(parts[1][PPID - 3])
            except (ValueError, IndexError):
                self.read_errors += 1
                self._release(pid)
                continue
            fresh[pid] = data
            split[pid] = (data, parts)
            parents[pid] = ppid
        return parents

    def _probe_new(self, new, parents: dict[int, int]) -> dict[int, int]:
        """Read the parent of each new pid into `parents` without keeping a descriptor; pid → its start ticks."""
        probed: dict[int, int] = {}
        for pid in new:
            if pid not in parents:
                data = self._read(pid, False)
                got = probe(data) if data is not None else None
                if got is not None:
                    parents[pid] = got[0]
                    probed[pid] = got[1]
        return probed

    def _hold_probed(self, probed: dict[int, int], tree: set[int], parents: dict[int, int],
                     fresh: dict[int, bytes]) -> None:
        """Keep a descriptor for each probed pid that joined the tree, if the pid is still the same process."""
        for pid, start in probed.items():
            if pid not in tree:
                continue
            data = self._read(pid, True)
            got = probe(data) if data is not None else None
            if got is None or got[1] != start:  # gone, or reused meanwhile: the next poll finds the new one
                self._release(pid)
                tree.discard(pid)
                parents.pop(pid, None)
            else:
                fresh[pid] = data

    def _walk(self, roots: list[int], stop: set[int]) -> set[int]:
        """The trees below `roots`, exactly (children of every thread); not below a pid in `stop`."""
        if not self._children_files:
            return self._walk_scan(roots)
        seen: set[int] = set()
        todo = list(roots)
        proc = self.proc
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            if pid in stop:
                continue  # already in the tree: what is below it is followed by parent links
            try:
                tids = os.listdir(f"{proc}/{pid}/task")
            except OSError:
                continue  # gone
            for tid in tids:
                try:
                    with open(f"{proc}/{pid}/task/{tid}/children", "rb", buffering=0) as f:
                        todo.extend(int(c) for c in f.read().split())
                except OSError:
                    continue
        return seen

    def _walk_scan(self, roots: list[int]) -> set[int]:
        children: dict[int, list[int]] = {}
        for name in os.listdir(self.proc):
            if not name.isdigit():
                continue
            try:
                with open(f"{self.proc}/{name}/stat", "rb", buffering=0) as f:
                    got = probe(f.read(STAT_MAX))
            except OSError:
                continue
            if got is not None:
                children.setdefault(got[0], []).append(int(name))
        seen: set[int] = set()
        todo = list(roots)
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
        except (OSError, ValueError):
            return None
        return self.boot_time + st.start_ticks / _CLK_TCK

    @property
    def new_pids(self) -> NewPids:
        """How this source finds the processes started since its last poll (another source may share it)."""
        return self._news

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
        fresh, self._fresh = self._fresh, {}
        split_of, self._split = self._split.get, {}
        members = self._members
        old = self._known
        known: dict[int, _Known] = {}
        held_of = self._held.get
        count_fds, fd_dir_size, fd_every = self.count_fds, self._fd_dir_size, self.fd_count_every_s
        fstat = os.fstat
        node = self.node
        self._wchan_left = WCHAN_READS_A_POLL
        out: list[ProcessSample] = []
        for pid in pids:
            data = fresh.get(pid)
            if data is None:
                data = self._read(pid, pid in members)
                if data is None:
                    continue
            k = old.get(pid)
            if k is not None and data == k.text:
                # The text of the last sample: the same process (pid and start time are in it) with the same
                # figures, and no CPU tick used since. Most watched processes sleep between most polls.
                cpu_percent = 0.0 if now > k.sampled_at else None
                k.sampled_at = now
            else:
                got = split_of(pid)
                k, cpu_percent = self._update(pid, data, k, now, got[1] if got is not None and got[0] is data else None)
                if k is None:
                    continue
            known[pid] = k
            open_fds = None
            if count_fds:
                if 0.0 <= now - k.fds_at < fd_every:  # (a clock stepped back counts anew)
                    open_fds = k.open_fds
                else:
                    held = held_of(pid)
                    if fd_dir_size and held is not None and held.fd_dir >= 0:
                        try:
                            open_fds = fstat(held.fd_dir).st_size or self._list_fds(pid)
                        except OSError:
                            self.read_errors += 1
                    else:
                        open_fds = self._count_fds(pid)
                    k.open_fds = open_fds
                    if open_fds is not None:  # a failed count is tried again at the next poll
                        k.fds_at = now
            # positional, in ProcessSample's field order (a third of the cost of keywords; tests check each field)
            out.append(ProcessSample(now, node, pid, k.start_time, k.ppid, k.uid, k.user, k.comm, "", None, None, "",
                                     "", cpu_percent, k.rss_bytes, k.threads, open_fds, tuple(gpu_use.get(pid, ())),
                                     k.state, k.wchan))
        self._known = known
        return out

    def _update(self, pid: int, data: bytes, k: _Known | None, now: float,
                parts: tuple[int, list[bytes]] | None = None) -> tuple[_Known | None, float | None]:
        """Parse a changed stat text into `pid`'s record (a new one at first sight or for a reused pid).

        Returns the record and the CPU percent since the last sample (None at first sight); (None, None) for
        a process that has exited (a zombie) or bad text.
        """
        try:
            close, rest = parts if parts is not None else split_stat(data)
            if rest[STATE - 3] in _GONE_STATES:
                return None, None
            ppid = int(rest[PPID - 3])
            cpu_ticks = int(rest[UTIME - 3]) + int(rest[STIME - 3])
            threads = int(rest[NUM_THREADS - 3])
            rss_pages = int(rest[RSS - 3])
            start = rest[STARTTIME - 3]
            state = _HELD_STATES.get(rest[STATE - 3], "")
        except (ValueError, IndexError):
            self.read_errors += 1
            return None, None
        if k is None or k.start != start:
            k = self._first_sight(pid, data, close, start, cpu_ticks, now)
            if k is None:
                return None, None
            cpu_percent = None  # no previous reading of this process yet
        else:
            dt = now - k.sampled_at
            cpu_percent = round(100.0 * (cpu_ticks - k.cpu_ticks) / _CLK_TCK / dt, 1) if dt > 0 else None
            k.cpu_ticks = cpu_ticks
            k.sampled_at = now
            if close != k.close or not data.startswith(k.head):  # renamed (prctl PR_SET_NAME, exec)
                k.close, k.head = close, data[:close]
                k.comm = stat_comm(data, close)
        k.text, k.ppid, k.threads, k.rss_bytes = data, ppid, threads, rss_pages * _PAGE_SIZE
        if state != k.state:
            k.state, k.wchan, k.wchan_at = state, "", float("-inf")
        if state == "D" and not 0.0 <= now - k.wchan_at < WCHAN_EVERY_S:
            self._read_wchan(pid, k, now)
        return k, cpu_percent

    def _read_wchan(self, pid: int, k: _Known, now: float) -> None:
        """Where a process in D waits: the kernel function /proc/<pid>/wchan names (root reads every one's)."""
        if self._wchan_left <= 0:
            k.text = b""  # its text is parsed again at the next poll, and its wchan read then
            return
        self._wchan_left -= 1
        try:
            with open(f"{self.proc}/{pid}/wchan", "rb", buffering=0) as f:
                k.wchan = clean_wchan(f.read(256))
        except OSError:
            k.wchan = ""  # gone, or another user's process to an agent that is not root
        k.wchan_at = now

    def _first_sight(self, pid: int, data: bytes, close: int, start: bytes, cpu_ticks: int,
                     now: float) -> _Known | None:
        try:
            start_ticks = int(start)
        except ValueError:
            self.read_errors += 1
            return None
        try:
            uid = os.stat(f"{self.proc}/{pid}").st_uid
        except OSError:
            return None
        return _Known(start, round(self.boot_time + start_ticks / _CLK_TCK, 2), cpu_ticks, now, uid,
                      self._user_name(uid), close, data[:close],
                      stat_comm(data, close))

    def _count_fds(self, pid: int) -> int | None:
        try:
            if self._fd_dir_size:
                n = os.stat(f"{self.proc}/{pid}/fd").st_size
                if n > 0:
                    return n
            return self._list_fds(pid)
        except OSError:
            self.read_errors += 1
            return None

    def _list_fds(self, pid: int) -> int:
        return len(os.listdir(f"{self.proc}/{pid}/fd"))

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


def reachable(roots: set[int], parents: dict[int, int]) -> set[int]:
    """Every process a root in `parents` reaches through parent links (roots not in `parents` are gone)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree: set[int] = set()
    todo = [r for r in roots if r in parents]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


def _fd_dir_counts(proc: str) -> bool:
    """Whether stat() of /proc/<pid>/fd gives the number of open descriptors (Linux >= 6.2)."""
    try:
        listed = len(os.listdir(f"{proc}/self/fd"))
        size = os.stat(f"{proc}/self/fd").st_size
    except OSError:
        return False
    # the listing holds one more descriptor (its own) than the stat() after it sees
    return size > 0 and abs(size - listed) <= 1
