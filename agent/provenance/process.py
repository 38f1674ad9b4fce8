"""What /proc says of a process: its owner's credentials, script and mount namespace."""
from __future__ import annotations

import os
from collections.abc import Iterable

from clusterwatch.agent.gitrun import RunAs

_PY_OPTS_WITH_ARG = {"-W", "-X", "-Q"}


def parse_proc_ids(text: str) -> RunAs:
    """The real uid, real gid and supplementary groups from /proc/<pid>/status.

    Args:
        text: the file's text.

    Returns:
        The credentials git should run with for this process.

    Raises:
        ValueError: the Uid or Gid line is missing.
    """
    uid = gid = None
    groups: tuple[int, ...] = ()
    for line in text.splitlines():
        if line.startswith("Uid:"):
            # real, effective, saved, fs: the real one is who started it (a setuid program's effective
            # uid is the file owner's, root's for a setuid-root one)
            uid = int(line.split()[1])
        elif line.startswith("Gid:"):
            gid = int(line.split()[1])
        elif line.startswith("Groups:"):
            groups = tuple(int(g) for g in line.split()[1:])
    if uid is None or gid is None:
        raise ValueError("no Uid/Gid line in /proc/<pid>/status")
    return RunAs(uid, gid, groups)


def script_path(argv: Iterable[str], cwd: str) -> str | None:
    """The script a Python command line runs, as an absolute path.

    Args:
        argv: the command line.
        cwd: the process's working directory, for a relative script.

    Returns:
        The path, or None for `-m module`, `-c code`, an interactive interpreter,
        or a command that is not Python.
    """
    args = list(argv)
    if not args or not os.path.basename(args[0]).startswith("python"):
        return None
    i = 1
    while i < len(args):
        a = args[i]
        if a in ("-m", "-c", "-") or (a.startswith("-m") or a.startswith("-c")) and len(a) > 2:
            return None
        if a == "--":
            i += 1
            break
        if a in _PY_OPTS_WITH_ARG:
            i += 2
            continue
        if not a.startswith("-"):
            break
        i += 1
    if i >= len(args):
        return None
    return os.path.normpath(os.path.join(cwd, args[i]))


def root_prefix(pid: int, proc: str) -> str:
    """"/proc/<pid>/root" when the process sees another mount namespace (a container), else ""."""
    try:
        if os.readlink(f"{proc}/{pid}/ns/mnt") != os.readlink(f"{proc}/self/ns/mnt"):
            return f"{proc}/{pid}/root"
    except OSError:
        pass
    return ""
