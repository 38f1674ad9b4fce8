"""Run git in a user's repository without letting the repository run anything.

The agent runs as root and reads repositories that belong to users, who may have
written their configuration to run commands (a hostile repository, or simply one
with git-lfs or a diff tool configured). So every git call made here:

- runs as the owner it is given (`RunAs`: uid, gid and supplementary groups), never
  as root in somebody else's repository. Without root, only the caller's own uid
  is possible; anything else is refused rather than attempted;
- gets the environment and the command-scope settings of clusterwatch/git_safety.py (the rule it
  shares with clusterwatch.train): nothing inherited, no global or system config, and every setting
  or filter/diff driver that names a program switched off;
- has a deadline, reads its output as a stream with a size cap, and on timeout is
  killed with its whole process group (`start_new_session`).

What remains is documented in `agent/provenance/__init__.py`; none of it can run as anyone
but the repository's owner.
"""
from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from clusterwatch.agent.redact import strip_url_credentials

from clusterwatch.git_safety import safe_env

MIN_GIT_VERSION = (2, 31)  # GIT_CONFIG_COUNT and friends


@dataclass(frozen=True, slots=True)
class RunAs:
    """The credentials git runs with: a process's owner, or a directory's.

    Attributes:
        uid: user id.
        gid: primary group id.
        groups: supplementary groups (those of the process itself when known).
    """

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @classmethod
    def current(cls) -> RunAs:
        """The credentials of this process."""
        return cls(os.geteuid(), os.getegid(), tuple(os.getgroups()))


class GitError(Exception):
    """A git call that gave no usable answer.

    Attributes:
        kind: a short stable word, used to log each kind of failure once:
            "no-git", "old-git", "not-permitted", "timeout", "not-a-repo",
            "dubious-ownership", "too-large", "failed".
        reason: one line for a person; never contains credentials.
    """

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


_VERSIONS: dict[tuple[str, float], tuple[int, ...]] = {}


def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            # an error may quote a remote URL; its credentials must not reach a log
            return strip_url_credentials(line.strip())[:300]
    return ""


# The git calls running now, by process group (each call is a session of its own): the agent kills them
# when it stops. A git blocked on a FIFO in a user's tree would otherwise outlive it, as that user.
_running: set[int] = set()
_running_lock = threading.Lock()


def kill_running() -> int:
    """Kill every git call running now, and whatever each started; return how many there were."""
    with _running_lock:
        groups = list(_running)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(groups)


class GitRunner:
    """Runs git calls for one provenance probe, under one deadline and one identity.

    Args:
        run_as: whose credentials git runs with; None for this process's own.
        git: path or name of the git binary, looked up on this process's PATH
            (never the watched process's); None for "git".
        budget_s: seconds for all the calls made through this runner together.
        clock: monotonic clock (tests).
    """

    def __init__(self, run_as: RunAs | None = None, git: str | None = None, budget_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_as = run_as or RunAs.current()
        self._git_name = git or "git"
        self._git: str | None = None
        self._clock = clock
        self.deadline = clock() + budget_s
        self.calls = 0

    # -- identity -------------------------------------------------------------------------

    def _credentials(self) -> dict:
        """Popen keyword arguments that drop to run_as, or raise when that is impossible."""
        me = os.geteuid()
        if me == 0:
            if self.run_as.uid == 0 and self.run_as.gid == 0 and not self.run_as.groups:
                return {"user": 0, "group": 0, "extra_groups": []}
            # extra_groups is always given: otherwise the child would keep root's groups
            return {"user": self.run_as.uid, "group": self.run_as.gid,
                    "extra_groups": list(self.run_as.groups)}
        if self.run_as.uid != me:
            raise GitError("not-permitted",
                           f"git would have to run as uid {self.run_as.uid}, and this process "
                           f"(uid {me}) is not root; refusing to read that repository as uid {me}")
        return {}

    def git_path(self) -> str:
        """The git binary's absolute path; checks its version once per binary."""
        if self._git is None:
            found = shutil.which(self._git_name)
            if not found:
                raise GitError("no-git", f"no git binary '{self._git_name}' on PATH; install git "
                                         "or configure its path")
            self._git = os.path.abspath(found)
            self._check_version(self._git)
        return self._git

    def _check_version(self, git: str) -> None:
        try:
            key = (git, os.stat(git).st_mtime)
        except OSError as exc:
            raise GitError("no-git", f"cannot use git at {git}: {exc.strerror}") from None
        version = _VERSIONS.get(key)
        if version is None:
            out = self._run_path(git, ["version"], None, ())
            match = re.search(rb"(\d+)\.(\d+)", out)
            version = tuple(int(x) for x in match.groups()) if match else (0, 0)
            _VERSIONS[key] = version
        if version < MIN_GIT_VERSION:
            raise GitError("old-git", f"git {'.'.join(map(str, version))} is older than 2.31, which "
                                      "provenance needs to switch off a repository's filters safely")

    # -- calls ----------------------------------------------------------------------------

    def run(self, args: list[str], cwd: str, config: Iterable[tuple[str, str]] = (),
            sink: Callable[[bytes], None] | None = None, max_bytes: int = 4 << 20) -> bytes:
        """Run `git -C cwd ARGS` and return its standard output.

        Args:
            args: git arguments after the global options.
            cwd: directory git starts in (`-C`, resolved by git as run_as, not by root).
            config: extra command-scope settings (driver overrides).
            sink: when given, receives the output chunk by chunk and nothing is kept
                (for output that is only hashed or counted).
            max_bytes: output kept without a sink beyond which the call fails.

        Returns:
            The output (empty when a sink was given).

        Raises:
            GitError: git is missing, could not run as run_as, failed, or timed out.
        """
        return self._run_path(self.git_path(), ["-C", cwd, *args], sink, config, max_bytes)

    def _run_path(self, git: str, args: list[str], sink: Callable[[bytes], None] | None,
                  config: Iterable[tuple[str, str]], max_bytes: int = 4 << 20) -> bytes:
        remaining = self.deadline - self._clock()
        if remaining <= 0:
            raise GitError("timeout", "provenance ran out of time before git finished")
        creds = self._credentials()
        self.calls += 1
        try:
            proc = subprocess.Popen(
                [git, "--no-pager", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=safe_env(git, config), cwd="/", close_fds=True,
                start_new_session=True, **creds)
        except FileNotFoundError:
            raise GitError("no-git", f"git binary {git} vanished; install git") from None
        except PermissionError as exc:
            raise GitError("not-permitted", f"cannot start git as uid {self.run_as.uid}: "
                                            f"{exc.strerror}") from None
        except OSError as exc:
            raise GitError("failed", f"cannot start git: {exc.strerror or exc}") from None
        with _running_lock:
            _running.add(proc.pid)
        try:
            return self._finish(proc, args, sink, max_bytes)
        finally:
            with _running_lock:
                _running.discard(proc.pid)

    def _finish(self, proc: subprocess.Popen, args: list[str], sink: Callable[[bytes], None] | None,
                max_bytes: int) -> bytes:
        """Read a started git call's output to its end, within the deadline and the size limit."""
        kept: list[bytes] = []
        size = 0
        err = b""
        timed_out = too_large = False
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, "out")  # type: ignore[arg-type]
            sel.register(proc.stderr, selectors.EVENT_READ, "err")  # type: ignore[arg-type]
            open_pipes = 2
            while open_pipes:
                left = self.deadline - self._clock()
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_pipes -= 1
                    elif key.data == "err":
                        err = (err + chunk)[:4096]
                    elif sink is not None:
                        sink(chunk)
                    else:
                        size += len(chunk)
                        if size > max_bytes:
                            too_large = True
                            break
                        kept.append(chunk)
                if too_large:
                    break
        if timed_out or too_large:
            self._kill(proc)
        else:
            try:
                proc.wait(max(0.0, self.deadline - self._clock()))
            except subprocess.TimeoutExpired:
                timed_out = True
                self._kill(proc)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
        if timed_out:
            raise GitError("timeout", f"git {args[2] if args[:1] == ['-C'] else args[0]} did not "
                                      "finish within the provenance time budget")
        if too_large:
            raise GitError("too-large", "git printed more than provenance reads")
        if proc.returncode != 0:
            raise self._failure(proc.returncode, err)
        return b"".join(kept)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        # The group holds git and anything git started; the session was made for this call.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    @staticmethod
    def _failure(code: int, err: bytes) -> GitError:
        line = _first_line(err)
        low = line.lower()
        if "not a git repository" in low:
            return GitError("not-a-repo", "not inside a git repository")
        if "dubious ownership" in low:
            return GitError("dubious-ownership",
                            "git refused a repository that belongs to another user than the "
                            "process's owner (dubious ownership)")
        return GitError("failed", f"git exited with {code}: {line}" if line else f"git exited with {code}")
