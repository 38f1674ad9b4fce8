"""The `memory_snapshot` request, answered by clusterwatch.train itself when PyTorch uses CUDA here.

`torch.cuda.memory._dump_snapshot` writes the caching allocator's segments and blocks (and, when the
process called `torch.cuda.memory._record_memory_history()` early, the stack of every allocation)
to a pickle that PyTorch's memory viewer opens (https://pytorch.org/memory_viz). A snapshot holds
the user's data (tensor sizes, code paths), so it is written only where no other user can read it:
a folder of this user's, mode 0700, checked to be so (not a link, owned by this uid, no group or
other bits) on the folder held open, and the file is created new in it (O_EXCL, O_NOFOLLOW), mode
0600, and written through it. The folder is `$CLUSTERWATCH_SNAPSHOT_DIR` (refused, in one line,
when unsafe), else `clusterwatch-<uid>` under the system's temp folder. Anyone can make that name
first in a shared /tmp: when it is not this user's own, the snapshots go to a folder made with
mkdtemp (`clusterwatch-<uid>-XXXXXXXX`, kept for the process's life). It runs like any handler:
in the training loop, at the next report(). A handler the user registered for `memory_snapshot`
takes its place. Standard library only (torch is only used when it is already imported).
"""
from __future__ import annotations

import os
import stat
import sys
import tempfile
import time
from typing import Any

SNAPSHOT_DIR_ENV = "CLUSTERWATCH_SNAPSHOT_DIR"
VIEWER = "https://pytorch.org/memory_viz"


class NoSnapshot(Exception):
    """Why no snapshot can be taken here (no torch with CUDA, an unsafe folder); said to the asker."""


def _cuda() -> Any:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None or not cuda.is_initialized():
        raise NoSnapshot("this process has no PyTorch using CUDA (torch is not imported or CUDA not initialised)")
    memory = getattr(cuda, "memory", None)
    if memory is None or not hasattr(memory, "_dump_snapshot"):
        raise NoSnapshot("this torch has no torch.cuda.memory._dump_snapshot (PyTorch 2.1 or later has it)")
    return cuda


# the folder made with mkdtemp when the default name was taken by someone else (this process's, once made)
_made: str | None = None


def _check(st: os.stat_result, folder: str) -> None:
    """NoSnapshot unless `st` (of `folder`, not followed) is a folder of this user's alone."""
    if not stat.S_ISDIR(st.st_mode):
        raise NoSnapshot(f"{folder} is not a folder (a link?); remove it or set {SNAPSHOT_DIR_ENV}")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise NoSnapshot(f"{folder} must be this user's and mode 0700 (it is uid {st.st_uid}, mode "
                         f"{stat.S_IMODE(st.st_mode):04o}); fix it or set {SNAPSHOT_DIR_ENV}")


def _own_folder(folder: str) -> str:
    """`folder`, created 0700 if missing, checked to be this user's alone (NoSnapshot otherwise)."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise NoSnapshot(f"cannot create {folder}: {exc.strerror}") from None
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise NoSnapshot(f"cannot use {folder}: {exc.strerror}") from None
    _check(st, folder)
    return folder


def private_folder(path: str | None = None) -> str:
    """The snapshot folder, created 0700 if missing, and checked to be this user's alone.

    A folder named (`path`, `$CLUSTERWATCH_SNAPSHOT_DIR`) is that one or none. The default name, which
    another user may have made first, gives way to a folder made with mkdtemp when it is not this user's.

    Raises:
        NoSnapshot: the folder named is a link, another user's, or open to group or others; or no
            folder of this user's can be made.
    """
    global _made
    named = path or os.environ.get(SNAPSHOT_DIR_ENV)
    if named:
        return _own_folder(named)
    try:
        return _own_folder(os.path.join(tempfile.gettempdir(), f"clusterwatch-{os.geteuid()}"))
    except NoSnapshot:
        pass  # someone else's, a link, or open: never written into, and never waited for
    if _made is not None:
        try:
            _check(os.lstat(_made), _made)
            return _made
        except (OSError, NoSnapshot):
            pass  # removed (a temp cleaner), or taken since: a new one
    try:
        _made = tempfile.mkdtemp(prefix=f"clusterwatch-{os.geteuid()}-")
    except OSError as exc:
        raise NoSnapshot(f"cannot make a private folder in {tempfile.gettempdir()}: {exc.strerror}; "
                         f"set {SNAPSHOT_DIR_ENV}") from None
    return _made


def take_snapshot(folder: str | None = None) -> str:
    """Dump the allocator's snapshot into a new 0600 file; returns its path.

    Raises:
        NoSnapshot: no torch with CUDA here, or no private folder.
    """
    cuda = _cuda()
    where = private_folder(folder)
    name = f"memory-snapshot-{os.getpid()}-{time.strftime('%Y%m%dT%H%M%S')}-{time.monotonic_ns() % 1000000:06d}.pickle"
    # the folder checked is the folder held open: a path changed since the check cannot send the file elsewhere
    try:
        dfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise NoSnapshot(f"cannot use {where}: {exc.strerror}") from None
    try:
        _check(os.fstat(dfd), where)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        os.close(fd)  # created private first: torch then writes into it by name, through the open folder
        through = f"/proc/self/fd/{dfd}"
        target = os.path.join(through if os.path.isdir(through) else where, name)
        try:
            cuda.memory._dump_snapshot(target)
        except BaseException:
            os.unlink(name, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)
    return os.path.join(where, name)
