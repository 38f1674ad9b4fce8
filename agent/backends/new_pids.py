"""Which pids may be new since the last poll: /proc/loadavg's last pid, or a listing of /proc.

Used by the process source, the simulated GPU source (which shares the process source's, in
rounds: see NewPids.new_round) and the Slurm lookup.
"""
from __future__ import annotations

import os

_RO = os.O_RDONLY | os.O_CLOEXEC

# List /proc at least every this many polls, whatever /proc/loadavg says (see NewPids).
DEFAULT_FULL_EVERY = 30
# More new pids than this since the last poll: list /proc rather than read each one's stat.
DEFAULT_MAX_PROBE = 256


class NewPids:
    """Which pids may be processes that started since the last call, at a cost that follows what started.

    The last field of /proc/loadavg is the last pid the kernel handed out in this pid
    namespace, and pids are handed out in turn: the processes (and threads) started since
    the last call have the pids between the number then and the number now. While it
    stays, nothing started (one `pread` of a kept descriptor); when it moved by a little,
    those pids are the candidates; the caller reads their stat and skips threads (see
    `clusterwatch.procfs.probe`). /proc is listed instead (the pids whose /proc inode changed since the last
    listing are the candidates) on the first call, when the number moved by more than
    `max_probe` or wrapped, where /proc/loadavg cannot be read, and every `full_every`-th
    call anyway: a pid set explicitly (clone3 set_tid, checkpoint/restore) does not move
    the number.

    Attributes:
        listing: pid → /proc inode at the last listing (None before the first).
        listed: whether the last call listed /proc.
    """

    def __init__(self, proc: str = "/proc", full_every: int = DEFAULT_FULL_EVERY,
                 max_probe: int = DEFAULT_MAX_PROBE) -> None:
        self.proc = proc
        self.full_every = max(1, full_every)
        self.max_probe = max_probe
        self.listing: dict[int, int] | None = None
        self.listed = False
        self.listings = 0
        self.errors = 0
        self.shared = False  # in rounds (see new_round): two sources of one agent ask it in each poll
        self._answered = False
        self._answer: set[int] | None = None
        self._again: set[int] = set()  # pids to hand out again at the next call (see again)
        self._calls = 0
        self._last: int | None = None
        try:
            self._fd = os.open(f"{proc}/loadavg", _RO)
        except OSError:
            self._fd = -1

    def _last_pid(self) -> int | None:
        if self._fd < 0:
            return None
        try:
            return int(os.pread(self._fd, 128, 0).rsplit(None, 1)[-1])
        except (OSError, ValueError, IndexError):
            return None

    def new_round(self) -> None:
        """Start a round: the first poll() after this reads anew, the others until the next round answer the same.

        For sources that share this object (the process source and the simulated GPU source of one agent):
        each would otherwise read /proc/loadavg, and list /proc now and then, for itself.
        """
        self.shared = True
        self._answered = False

    def poll(self) -> set[int] | None:
        """The candidate pids; None after the first listing (no baseline yet: every listed pid is new).

        Shared (see new_round), the same answer to every call of a round: the caller must not change it.
        """
        if self.shared:
            if not self._answered:
                self._answer, self._answered = self._poll(), True
            return self._answer
        return self._poll()

    def again(self, pid: int) -> None:
        """Hand `pid` out once more at the next call (a round's next, when shared): it could not be read yet."""
        self._again.add(pid)

    def _poll(self) -> set[int] | None:
        new = self._candidates()
        if self._again:
            if new is not None:
                new |= self._again
            self._again = set()
        return new

    def _candidates(self) -> set[int] | None:
        last = self._last_pid()  # before listing: what starts after this read is found next time
        prev, self._last = self._last, last
        self._calls += 1
        self.listed = False
        if last is not None and prev is not None and self.listing is not None and self._calls < self.full_every:
            if last == prev:
                return set()
            if prev < last <= prev + self.max_probe:
                return set(range(prev + 1, last + 1))
        return self._list()

    def force(self) -> None:
        """List /proc at the next call."""
        self._calls = self.full_every

    def reset(self) -> None:
        """Forget the baseline: the next call lists /proc and returns None."""
        self.listing = None

    def _list(self) -> set[int] | None:
        self._calls = 0
        try:
            entries = os.scandir(self.proc)
        except OSError:
            self.errors += 1
            self._last = None  # list again at the next call
            return set()
        old = self.listing
        inodes: dict[int, int] = {}
        new: set[int] = set()
        with entries:
            for entry in entries:
                name = entry.name
                if name.isdigit():
                    pid = int(name)
                    inode = inodes[pid] = entry.inode()  # from getdents: no extra system call
                    if old is not None and old.get(pid) != inode:
                        new.add(pid)
        self.listing = inodes
        self.listed = True
        self.listings += 1
        return new if old is not None else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
