"""Host memory held in tmpfs files (/dev/shm and the node's other tmpfs mounts), by the files' owners.

A tmpfs file's pages are host memory (charged to the job's memory cgroup), but a process's RSS counts them
only while it maps them and has touched them: a file written with write(), or mapped by a DataLoader worker
that has unmapped it since, is in no process's RSS (bench/README.md, "tmpfs"). The agent counts them here, per
uid, on a thread of its own at a slow cadence (never in the poll), and the collector adds a user's bytes to
the host memory of the user's running jobs on the node.

The walk is bounded and takes nothing on trust from what it walks: it never follows a link (a symlink to
/etc/shadow is a link, nothing more), never leaves a mount (st_dev), opens each folder relative to its parent
with O_NOFOLLOW (a folder swapped for a link mid-walk is refused), counts only regular files, by their
allocated blocks (a sparse file costs what it holds), once per inode (hard links), names kept as bytes (any
name is one), at most `max_files` entries and `max_depth` folders deep in all; past those it says the count
is cut (`truncated`).
"""
from __future__ import annotations

import logging
import os
import stat as st
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

from clusterwatch.background import BackgroundThread

__all__ = ["TmpfsScan", "TmpfsScanner", "UidUsage", "scan_tmpfs", "tmpfs_mounts", "tmpfs_scan_to_proto"]

log = logging.getLogger(__name__)

#: The mounts never counted: kernel interfaces, not memory a job fills.
_SKIP_PREFIXES = ("/sys", "/proc")
DEFAULT_EVERY_S = 30.0
DEFAULT_MAX_FILES = 100_000
DEFAULT_MAX_DEPTH = 8
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NOATIME", 0)


def _unescape(field_: str) -> str:
    """A mount point as /proc/self/mounts writes it (space, tab, newline, backslash as octal escapes)."""
    return (field_.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def tmpfs_mounts(mounts_text: str) -> list[str]:
    """The writable tmpfs mount points in the text of /proc/self/mounts, in order, each once, /sys and /proc left
    out."""
    out: list[str] = []
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[2] != "tmpfs" or "ro" in parts[3].split(","):
            continue  # not a tmpfs, or one no file can grow on
        point = _unescape(parts[1])
        if any(point == p or point.startswith(p + "/") for p in _SKIP_PREFIXES) or point in out:
            continue
        out.append(point)
    return out


@dataclass(slots=True)
class UidUsage:
    """What one uid's files hold on the tmpfs mounts walked."""

    bytes: int = 0
    files: int = 0


@dataclass(slots=True)
class TmpfsScan:
    """One walk of the tmpfs mounts.

    Attributes:
        time: when it ended (Unix seconds).
        by_uid: uid → its files' bytes and count (regular files only).
        entries: entries looked at (files, folders, links, FIFOs...).
        truncated: the walk stopped at `max_files` or left folders deeper than `max_depth` unread.
        errors: folders or files that could not be read (gone meanwhile, no permission).
        took_s: how long the walk took.
    """

    time: float
    by_uid: dict[int, UidUsage] = field(default_factory=dict)
    entries: int = 0
    truncated: bool = False
    errors: int = 0
    took_s: float = 0.0


def scan_tmpfs(mounts: list[str], max_files: int = DEFAULT_MAX_FILES, max_depth: int = DEFAULT_MAX_DEPTH,
               clock: Callable[[], float] = time.time) -> TmpfsScan:
    """Walk `mounts` (see the module's text for the bounds); one mount's device seen twice is walked once."""
    t0 = time.monotonic()
    scan = TmpfsScan(0.0)
    seen_inodes: set[tuple[int, int]] = set()
    seen_devs: set[int] = set()
    left = [max_files]
    for point in mounts:
        try:
            fd = os.open(os.fsencode(point), _DIR_FLAGS)
        except OSError:
            scan.errors += 1
            continue
        try:
            dev = os.fstat(fd).st_dev
            if dev in seen_devs:
                continue
            seen_devs.add(dev)
            _walk(fd, dev, 0, max_depth, left, scan, seen_inodes)
        finally:
            os.close(fd)
        if left[0] <= 0:
            scan.truncated = True
            break
    scan.time = clock()
    scan.took_s = time.monotonic() - t0
    return scan


def _walk(dir_fd: int, dev: int, depth: int, max_depth: int, left: list[int], scan: TmpfsScan,
          seen: set[tuple[int, int]]) -> None:
    """Count the entries of the open folder `dir_fd`, and the folders below it up to `max_depth`."""
    subdirs: list[bytes] = []
    try:
        it = os.scandir(dir_fd)
    except OSError:
        scan.errors += 1
        return
    with it:
        for entry in it:
            if left[0] <= 0:
                scan.truncated = True
                return
            left[0] -= 1
            scan.entries += 1
            try:
                s = entry.stat(follow_symlinks=False)  # fstatat(dir_fd, name, AT_SYMLINK_NOFOLLOW)
            except OSError:
                scan.errors += 1
                continue
            mode = s.st_mode
            if st.S_ISREG(mode):
                if s.st_dev != dev:
                    continue
                if s.st_nlink > 1:
                    key = (s.st_dev, s.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                u = scan.by_uid.get(s.st_uid)
                if u is None:
                    u = scan.by_uid[s.st_uid] = UidUsage()
                u.bytes += s.st_blocks * 512
                u.files += 1
            elif st.S_ISDIR(mode) and s.st_dev == dev:  # another mount below this one is not this one's
                subdirs.append(os.fsencode(entry.name))
            # links, FIFOs, sockets, devices: counted as entries, never opened nor followed
    if depth + 1 > max_depth:
        if subdirs:
            scan.truncated = True
        return
    for name in subdirs:
        if left[0] <= 0:
            scan.truncated = True
            return
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)  # swapped for a link meanwhile: ELOOP, not followed
        except OSError:
            scan.errors += 1
            continue
        try:
            if os.fstat(fd).st_dev == dev:
                _walk(fd, dev, depth + 1, max_depth, left, scan, seen)
        finally:
            os.close(fd)


@lru_cache(maxsize=4096)
def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def tmpfs_scan_to_proto(scan: TmpfsScan, out: Any) -> None:
    """Fill an agent_pb2.TmpfsScan: the uids that hold bytes, with their names on this node."""
    out.time = scan.time
    out.truncated = scan.truncated
    out.entries = min(scan.entries, 0xFFFFFFFF)
    for uid, u in sorted(scan.by_uid.items()):
        if u.bytes:
            out.uses.add(uid=uid, user=_user_name(uid), bytes=u.bytes, files=min(u.files, 0xFFFFFFFF))


class TmpfsScanner:
    """Walks the node's tmpfs mounts every `every_s` seconds on a thread of its own; the poll takes the
    latest walk (once) with `take()`.

    Args:
        every_s: the cadence of the walks.
        mounts: the mount points to walk; None: the tmpfs mounts of /proc/self/mounts, read at each walk.
        max_files, max_depth: the walk's bounds (see scan_tmpfs).
        clock: Unix seconds.
    """

    def __init__(self, every_s: float = DEFAULT_EVERY_S, mounts: list[str] | None = None,
                 max_files: int = DEFAULT_MAX_FILES, max_depth: int = DEFAULT_MAX_DEPTH,
                 clock: Callable[[], float] = time.time, mounts_file: str = "/proc/self/mounts") -> None:
        self.every_s = every_s
        self._mounts = mounts
        self._mounts_file = mounts_file
        self.max_files = max_files
        self.max_depth = max_depth
        self._clock = clock
        self._latest: TmpfsScan | None = None
        self._lock = threading.Lock()
        self.errors = 0
        self._thread = BackgroundThread(self._run, name="clusterwatch-tmpfs", os_name="cw-tmpfs")

    def mounts(self) -> list[str]:
        """The mount points a walk covers now."""
        if self._mounts is not None:
            return list(self._mounts)
        try:
            with open(self._mounts_file, encoding="utf-8", errors="surrogateescape") as f:
                return tmpfs_mounts(f.read())
        except OSError:
            return []

    def scan_now(self) -> TmpfsScan:
        """One walk, kept as the latest."""
        scan = scan_tmpfs(self.mounts(), self.max_files, self.max_depth, self._clock)
        self.errors += scan.errors
        with self._lock:
            self._latest = scan
        return scan

    def take(self) -> TmpfsScan | None:
        """The walk ended since the last take, or None."""
        with self._lock:
            scan, self._latest = self._latest, None
        return scan

    def start(self) -> TmpfsScanner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop(1.5)

    def _run(self) -> None:
        stopping = self._thread.stopping
        while not stopping.is_set():
            try:
                self.scan_now()
            except Exception:  # one bad walk must not end the thread
                self.errors += 1
                log.exception("tmpfs: walk failed")
            stopping.wait(self.every_s)
