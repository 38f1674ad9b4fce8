"""The `memory_snapshot` request, answered by clusterwatch.train itself when PyTorch uses CUDA here.

`torch.cuda.memory._dump_snapshot` writes the caching allocator's segments and blocks (and, when the
process called `torch.cuda.memory._record_memory_history()` early, the stack of every allocation)
to a pickle that PyTorch's memory viewer opens (https://pytorch.org/memory_viz). A snapshot holds
the user's data (tensor sizes, code paths), so it is written only where no other user can read it:
a folder of this user's, mode 0700, checked to be so (not a link, owned by this uid, no group or
other bits) before anything goes in; the file is created new (O_EXCL, O_NOFOLLOW), mode 0600.
The folder is `$CLUSTERWATCH_SNAPSHOT_DIR`, else `clusterwatch-<uid>` under the system's temp
folder. It runs like any handler: in the training loop, at the next report(). A handler the user
registered for `memory_snapshot` takes its place. Standard library only (torch is only used when
it is already imported).
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


def private_folder(path: str | None = None) -> str:
    """The snapshot folder, created 0700 if missing, and checked to be this user's alone.

    Raises:
        NoSnapshot: the path is a link, another user's, or open to group or others.
    """
    folder = path or os.environ.get(SNAPSHOT_DIR_ENV) or os.path.join(tempfile.gettempdir(),
                                                                       f"clusterwatch-{os.geteuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise NoSnapshot(f"cannot create {folder}: {exc.strerror}") from None
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise NoSnapshot(f"{folder} is not a folder (a link?); remove it or set {SNAPSHOT_DIR_ENV}")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise NoSnapshot(f"{folder} must be this user's and mode 0700 (it is uid {st.st_uid}, mode "
                         f"{stat.S_IMODE(st.st_mode):04o}); fix it or set {SNAPSHOT_DIR_ENV}")
    return folder


def take_snapshot(folder: str | None = None) -> str:
    """Dump the allocator's snapshot into a new 0600 file; returns its path.

    Raises:
        NoSnapshot: no torch with CUDA here, or no private folder.
    """
    cuda = _cuda()
    where = private_folder(folder)
    path = os.path.join(where, f"memory-snapshot-{os.getpid()}-{time.strftime('%Y%m%dT%H%M%S')}-"
                               f"{time.monotonic_ns() % 1000000:06d}.pickle")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.close(fd)  # created private first: torch then writes into it by name
    try:
        cuda.memory._dump_snapshot(path)
    except BaseException:
        os.unlink(path)
        raise
    return path
