"""Open the file a job's process writes its output to, as that process's owner, never as root.

The agent runs as root and the file is the user's: a user could point their job's output at /etc/shadow or at
another user's file (a symlink swapped in under the path, a descriptor they opened for writing only, a FIFO that
blocks, a FUSE file whose read never returns). So the file is never opened by path as root:

1. the agent stats /proc/PID/fd/N (the kernel's own link to the very file the process writes, not a path the
   user can swap) and keeps only a regular file owned by the process's owner;
2. a short-lived child, running as that owner (uid, gid and groups from /proc/PID/status, as git runs for
   provenance; it drops root itself before it opens anything), opens that same /proc link for reading,
   non-blocking, and hands the descriptor back over a socket pair: the kernel checks the owner's rights, not
   root's;
3. the agent checks what came back: the same file (device and inode) as in 1, a regular file, still owned by the
   owner, on a filesystem that is not FUSE (whose reads a user's own server could hold forever).

From then on the agent reads that descriptor (agent/job_output_tail.py); the child is gone.
"""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

from clusterwatch.agent.gitrun import RunAs
from clusterwatch.agent.provenance.process import parse_proc_ids

from clusterwatch.procfs import read_bytes

# What the child runs (python -I -S: no site, no user paths, nothing of the user's environment). It starts as the
# agent's user, since the owner may not be able to run the agent's interpreter (a venv under /root), and becomes
# the owner before it opens anything.
_CHILD = r"""
import os, socket, stat, sys
sock = socket.socket(fileno=int(sys.argv[1]))
if sys.argv[3] != "-":
    uid, gid = int(sys.argv[3]), int(sys.argv[4])
    os.setgroups([int(g) for g in sys.argv[5].split(",") if g])
    os.setgid(gid)
    os.setuid(uid)
try:
    fd = os.open(sys.argv[2], os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
except OSError as exc:
    sock.send(b"E" + (exc.strerror or "cannot open").encode()[:200])
    sys.exit(0)
st = os.fstat(fd)
if not stat.S_ISREG(st.st_mode):
    sock.send(b"Enot a regular file")
    sys.exit(0)
socket.send_fds(sock, [b"K"], [fd])
"""
OPEN_TIMEOUT_S = 5.0


class Refused(Exception):
    """The file is not read; the reason is one line for the log, naming no content."""


def output_file(proc: str, pid: int, fd: int) -> os.stat_result | None:
    """The regular file process `pid` has as descriptor `fd`, by the kernel's link; None for anything else (a
    pipe, a terminal, a socket, a FIFO, a closed descriptor, a gone process)."""
    try:
        st = os.stat(f"{proc}/{pid}/fd/{fd}")
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def owner_of(proc: str, pid: int) -> RunAs:
    """The process's real uid, gid and groups (Refused when /proc no longer has them)."""
    try:
        return parse_proc_ids(read_bytes(f"{proc}/{pid}/status").decode("utf-8", "replace"))
    except (OSError, ValueError):
        raise Refused("the process is gone") from None


def _credentials(run_as: RunAs) -> list[str]:
    """The child's arguments that make it the owner: uid, gid, groups; "-" when it runs as the owner already."""
    if os.geteuid() == 0:
        return [str(run_as.uid), str(run_as.gid), ",".join(str(g) for g in run_as.groups)]
    if run_as.uid != os.geteuid():
        raise Refused(f"the agent is not root and the file's owner is uid {run_as.uid}")
    return ["-"]


def open_in_child(path: str, run_as: RunAs, timeout_s: float = OPEN_TIMEOUT_S) -> int:
    """`path` opened for reading by a child running as `run_as`; its descriptor here. Refused when the child
    could not open it, or gave back something else than a descriptor."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        try:
            child = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CHILD, str(theirs.fileno()), path, *_credentials(run_as)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={}, cwd="/",
                pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError as exc:
            raise Refused(f"cannot start the opener as uid {run_as.uid}: {exc.strerror or exc}") from None
        theirs.close()
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise Refused("the opener did not finish in time") from None
        ours.settimeout(0)
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ours, 256, 1)
        except (BlockingIOError, OSError):
            raise Refused("the opener gave nothing back") from None
        if msg == b"K" and len(fds) == 1:
            return fds[0]
        for fd in fds:
            os.close(fd)
        reason = msg[1:].decode("utf-8", "replace") if msg.startswith(b"E") else "an unexpected answer"
        raise Refused(f"the owner cannot open it ({reason})")
    finally:
        ours.close()
        theirs.close()


def _fs_type(mountinfo: bytes, dev: int) -> str | None:
    """The filesystem type of device `dev` in a mountinfo text; None when no mount has it."""
    want = f"{os.major(dev)}:{os.minor(dev)}".encode()
    for line in mountinfo.splitlines():
        fields = line.split(b" ")
        if len(fields) > 3 and fields[2] == want and b"-" in fields:
            after = fields[fields.index(b"-") + 1:]
            return after[0].decode("utf-8", "replace") if after else None
    return None


def check_opened(fd: int, expected: os.stat_result, run_as: RunAs, proc: str, pid: int) -> None:
    """Refused unless `fd` is the expected file: same device and inode, regular, the owner's, not on FUSE (looked
    up in the agent's mounts, then the process's own: a user can mount FUSE in a namespace of their own)."""
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino):
        raise Refused("the file changed while it was opened")
    if not stat.S_ISREG(st.st_mode):
        raise Refused("not a regular file")
    if st.st_uid != run_as.uid:
        raise Refused(f"the file belongs to uid {st.st_uid}, not to the process's owner (uid {run_as.uid})")
    kind = None
    for where in ("/proc/self/mountinfo", f"{proc}/{pid}/mountinfo"):
        try:
            kind = _fs_type(read_bytes(where), st.st_dev)
        except OSError:
            continue
        if kind is not None:
            break
    if kind is None:
        raise Refused("its filesystem is not among the mounts")
    if kind.startswith("fuse"):
        raise Refused(f"it is on a FUSE filesystem ({kind}), whose reads its server may hold")


def open_output(proc: str, pid: int, fd_number: int, expected: os.stat_result) -> tuple[int, RunAs]:
    """Process `pid`'s descriptor `fd_number` (found as `expected` by output_file) opened for reading as the
    process's owner and checked; (descriptor, owner). Refused, with why, otherwise."""
    run_as = owner_of(proc, pid)
    if expected.st_uid != run_as.uid:
        raise Refused(f"the file belongs to uid {expected.st_uid}, not to the process's owner (uid {run_as.uid})")
    fd = open_in_child(f"{proc}/{pid}/fd/{fd_number}", run_as)
    try:
        check_opened(fd, expected, run_as, proc, pid)
    except BaseException:
        os.close(fd)
        raise
    return fd, run_as
