"""Who may listen at the training socket's path: one agent at a time, and never over a live socket.

The agent that listens at PATH holds an exclusive flock on PATH.lock (beside it, in the agent's own
0755 folder; mode 0600, as any process that can open a file can flock it) for as long as it
listens, and writes its pid there; the kernel lets go of the lock however the agent ends, and a
stopping agent removes the file. A second agent (another spool folder, the same --train-socket)
cannot take the lock and refuses the path before it touches it, in one line naming the first one's
pid: it runs on without training reports (it still samples the node).

Once an agent holds the lock, what it finds at PATH is judged so:
- nothing: it binds;
- a socket of its own uid that nobody reads (connect() refused: an agent killed without closing):
  stale, removed and bound again;
- a socket of its own uid that somebody reads (connect() succeeds): a program that holds no lock (an
  agent of an older version, another root program) listens there; it is left alone and refused;
- a socket of another uid: no agent's (only the agent's uid can create entries in its folder, so one
  was planted, or left from when the folder was another's); never trusted, whether read or not: it
  is replaced, with one line, so that its owner does not receive every rank's reports;
- anything else (a file, a folder, a link): left alone, and the agent refuses.
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import stat

from clusterwatch.errors import ClusterwatchError, ConfigError

LOCK_SUFFIX = ".lock"
_WHAT_TO_DO = "give this agent another path with --train-socket (CLUSTERWATCH_TRAIN_SOCKET)"


class SocketTaken(ClusterwatchError):
    """Another agent, or another program, listens at the training socket's path."""


def lock_path(path: str) -> str:
    return path + LOCK_SUFFIX


def claim(path: str) -> int:
    """Take PATH.lock: its descriptor, to keep open while listening at `path`.

    Raises:
        SocketTaken: another live agent holds it.
        ConfigError: the lock file cannot be made or is not a plain file of this uid.
    """
    where = lock_path(path)
    for _ in range(8):
        try:
            # 0600: flock needs no write permission, so a user who could open it could hold it, and the next
            # agent would refuse to start
            fd = os.open(where, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot make the training socket's lock file {where}: {exc.strerror or exc}; "
                              f"fix its folder or {_WHAT_TO_DO}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise ConfigError(f"{where} is not a plain file of uid {os.geteuid()}; remove it or {_WHAT_TO_DO}")
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _pid_in(fd)
                raise SocketTaken(f"another agent (pid {pid or 'unknown'}) listens on the training socket {path}; "
                                  "this one leaves it alone and gets no training reports: stop that agent first, "
                                  f"or {_WHAT_TO_DO}") from None
            # its holder may have removed the file (closing) between our open and our lock: then the lock
            # is on a file nobody else will open, and the one at the path now is another
            if not _same_file(where, st):
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        except BaseException:
            try:
                os.close(fd)
            except OSError:
                pass
            raise
    raise ConfigError(f"cannot lock {where}: it keeps being replaced; {_WHAT_TO_DO}")


def holds(path: str, fd: int) -> bool:
    """Whether PATH.lock is still the file `fd` locks (a cleanup may have removed it, or the folder)."""
    try:
        return _same_file(lock_path(path), os.fstat(fd))
    except OSError:
        return False


def release(path: str, fd: int) -> None:
    """Remove PATH.lock when it is still ours, then let go of it."""
    if holds(path, fd):
        try:
            os.unlink(lock_path(path))
        except OSError:
            pass
    os.close(fd)


def make_way(path: str, log: logging.Logger) -> None:
    """Clear `path` for binding (the caller holds PATH.lock), as the module docstring says.

    Raises:
        SocketTaken: a live socket of this uid is there.
        ConfigError: something other than a socket is there, or it cannot be removed.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"cannot use {path} for the training socket: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{path} is not a socket; remove it, or {_WHAT_TO_DO}")
    if st.st_uid != os.geteuid():
        log.warning("training socket %s belongs to uid %d, not to this agent's uid %d: no agent's, so it is "
                    "replaced (check who could create files in %s)", path, st.st_uid, os.geteuid(),
                    os.path.dirname(path) or ".")
    elif is_live(path):
        raise SocketTaken(f"a program that holds no {os.path.basename(lock_path(path))} (an older agent?) "
                          f"listens on the training socket {path}; this agent leaves it alone and gets no training "
                          f"reports: stop that program first, or {_WHAT_TO_DO}")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot remove the stale training socket {path}: {exc.strerror or exc}") from None


def is_live(path: str) -> bool:
    """Whether a socket at `path` is bound by a live process (a datagram connect() is refused otherwise)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as probe:
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True  # cannot tell: left alone
    return True


def identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of what is at `path` now; None when nothing is."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _same_file(where: str, st: os.stat_result) -> bool:
    try:
        now = os.lstat(where)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _pid_in(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
