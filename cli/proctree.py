"""The processes `run` and `demo` are answerable for: finding them in /proc, stopping them, reaping them.

A command's children may leave its tree (a daemon that double-forks, `setsid`, a parent that died
first) and would then be re-parented to init, out of reach. `run` makes itself a child subreaper
(prctl PR_SET_CHILD_SUBREAPER), so such orphans are re-parented to it instead and can still be
found, stopped and reaped. Children started with `parent_death_signal` get SIGTERM if the process
that started them dies without stopping them (a SIGKILL, an OOM kill).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import time

from clusterwatch.procfs import stat_parent, stat_state

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KILL_WAIT_S = 5.0


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux, or no prctl
        return False


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it, not to init; False where unsupported."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def parent_death_signal(sig: int = signal.SIGTERM):
    """A preexec_fn for Popen: the child gets `sig` when the thread that started it ends."""
    def preexec() -> None:
        _prctl(PR_SET_PDEATHSIG, int(sig))
    return preexec


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    state, ppid = stat_state(text), stat_parent(text)
    return None if state is None or ppid is None else (state, ppid)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def _parents() -> dict[int, tuple[str, int]]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                table[int(name)] = st
    return table


def descendants(root: int, exclude: set[int] = frozenset()) -> set[int]:
    """Live (non-zombie) processes below `root`, leaving out the subtrees of the pids in `exclude`."""
    children: dict[int, list[int]] = {}
    for pid, (state, ppid) in _parents().items():
        if state != "Z":
            children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in exclude and c not in out:
                out.add(c)
                todo.append(c)
    return out


def signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_orphans(keep: set[int]) -> None:
    """Collect the exit status of zombie children of this process, except those in `keep` (Popen's own)."""
    me = os.getpid()
    for pid, (state, ppid) in _parents().items():
        if ppid == me and state == "Z" and pid not in keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def stop_all(pids_now, keep: set[int], grace_s: float) -> None:
    """SIGTERM what `pids_now()` returns, SIGKILL what is left after `grace_s`; reap as they go."""
    pids = pids_now()
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        reap_orphans(keep)
        pids = {p for p in pids if alive(p)} | pids_now()
    deadline = time.monotonic() + KILL_WAIT_S
    # SIGKILL cannot be ignored; re-read in case one forked meanwhile. Bounded: a process in
    # uninterruptible sleep, or one we may not signal, must not hold the caller forever.
    while pids and time.monotonic() < deadline:
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.05)
        reap_orphans(keep)
        pids = {p for p in pids if alive(p)} | pids_now()
