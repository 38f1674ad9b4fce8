"""Which code a process runs: a git provenance record for a pid or a directory.

For a process, the record holds the git state of the repository that contains its
script (the first non-option argument of a Python command line) or, failing that,
its working directory; its command line (secret-looking option values redacted),
its executable, and the environment variables that matter to a run (secret-looking
names dropped). For a directory (`clusterwatch provenance DIR`), the git state only.

Git runs as the process's owner (its real uid and gid, and its supplementary groups,
from /proc/<pid>/status), or, for a directory probed by root, as the directory's owner;
never as root in somebody else's repository. The real uid is the one a user cannot
borrow: a setuid-root program a user starts runs with effective uid 0, and git run as
that would be root in the user's repository. `clusterwatch.agent.gitrun` lists what
is switched off. What is left, and why it is acceptable:

- Whatever still runs, runs as the repository's (the process's) owner, who could
  run it anyway: git is never a way up to root.
- Config is read before each git call to find the filter and diff drivers to empty.
  The owner can change the config between that read and the call (a race that
  gains nothing: see above).
- git's own built-ins run (the index is read, and so is every included config file),
  as the owner, under a timeout. A repository the owner can make git loop on, or a
  FIFO in the work tree, costs at most the time budget (5 s by default).
- Untracked counts ignore the owner's global excludes file, because the global
  config is not read (it could name drivers too, and ranks must agree).
- Drivers that are emptied change what git sees: files under a clean filter (git-lfs)
  whose stat data is stale in the index may count as modified. A false "dirty" is
  the safe error.
- Since git 2.35.2 git refuses a repository owned by another uid than the one it
  runs as ("dubious ownership"); a process working in somebody else's checkout gets
  `unknown` with that reason. safe.directory is never set.

Every failure (no repository, no git, a timeout, an unreadable /proc) yields a record
whose git fields say "unknown" with a reason, and a warning logged once per kind of
failure; nothing is raised to the caller.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pwd
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from clusterwatch.agent.gitrun import GitError, GitRunner, RunAs
from clusterwatch.agent.redact import redact_argv, select_env, strip_url_credentials

from clusterwatch.git_safety import driver_overrides
from clusterwatch.procfs import parse_environ, parse_stat, read_boot_time

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
RECORD_VERSION = 1
_CLK_TCK = os.sysconf("SC_CLK_TCK")

_DIFF_ARGS = [
    "diff", "HEAD", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames",
    "--ignore-submodules=dirty", "--submodule=short", "--src-prefix=a/", "--dst-prefix=b/",
    "--full-index", "--unified=3", "--inter-hunk-context=0", "--diff-algorithm=myers",
    "--indent-heuristic", "--no-relative",
    "-O/dev/null",  # ignore diff.orderFile: the hash must not depend on the repository's config
]
_STATUS_ARGS = ["status", "--porcelain=v2", "--branch", "-z", "--no-renames",
                "--ignore-submodules=dirty"]


@dataclass(frozen=True, slots=True)
class ProvenanceConfig:
    """How provenance is taken.

    Attributes:
        git: the git binary (a name looked up on the agent's PATH, or a path).
        budget_s: seconds for all git calls of one record together.
        extra_env: more environment names or globs to record ("WANDB_PROJECT", "HF_*").
        proc: the /proc mount point.
        max_submodules: submodules followed at most (all depths together).
        max_depth: submodule nesting followed at most.
    """

    git: str | None = None
    budget_s: float = 5.0
    extra_env: tuple[str, ...] = ()
    proc: str = "/proc"
    max_submodules: int = 64
    max_depth: int = 8


@dataclass(frozen=True, slots=True)
class Submodule:
    """One submodule, at any depth.

    Attributes:
        path: relative to the top repository's root.
        commit: the commit checked out, "unknown" when not initialised or unreadable.
        recorded: the commit the parent repository records for it.
        dirty: tracked files modified inside it (None when unknown).
        diff_sha256: sha256 of its uncommitted diff, "" when clean.
    """

    path: str
    commit: str
    recorded: str
    dirty: bool | None
    diff_sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; an unknown `dirty` is "unknown"."""
        return {"path": self.path, "commit": self.commit, "recorded": self.recorded,
                "dirty": UNKNOWN if self.dirty is None else self.dirty,
                "diff_sha256": self.diff_sha256}


@dataclass(frozen=True, slots=True)
class GitState:
    """The git state of one repository.

    Attributes:
        root: the repository's top directory.
        commit: HEAD's commit; "(initial)" before the first commit.
        branch: the branch name, "(detached)" on a detached HEAD.
        dirty: whether tracked files differ from HEAD (staged or not), a moved
            submodule or a submodule with modified files included.
        untracked: untracked files (not ignored), counted one by one.
        diff_sha256: sha256 of `git diff HEAD --binary` (tracked files only), "" when
            there is nothing to diff.
        remote_url: origin's URL (else the first remote's), credentials removed.
        submodules: every submodule, recursively, parents before children.
        ran_as_uid: the uid git ran as (None when git never ran).
        error: why the fields say "unknown"; "" when they do not.
    """

    root: str = UNKNOWN
    commit: str = UNKNOWN
    branch: str = UNKNOWN
    dirty: bool | None = None
    untracked: int | None = None
    diff_sha256: str = UNKNOWN
    remote_url: str = UNKNOWN
    submodules: tuple[Submodule, ...] = ()
    ran_as_uid: int | None = None
    error: str = ""

    @property
    def known(self) -> bool:
        """Whether git answered."""
        return not self.error

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; every field git could not give says "unknown"."""
        return {
            "root": self.root, "commit": self.commit, "branch": self.branch,
            "dirty": UNKNOWN if self.dirty is None else self.dirty,
            "untracked": UNKNOWN if self.untracked is None else self.untracked,
            "diff_sha256": self.diff_sha256, "remote_url": self.remote_url,
            "submodules": [s.to_dict() for s in self.submodules],
            "ran_as_uid": self.ran_as_uid, "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Provenance:
    """What code a process (or a directory) runs.

    Attributes:
        time: when the record was taken (Unix seconds).
        path: the directory git was asked about.
        source: where `path` came from: "script", "cwd" (of a process) or "dir".
        git: the repository's state.
        pid: the process (None for a directory).
        start_time: the process's start time (Unix seconds), 0.0 for a directory.
        uid: the process's (or directory's) owner.
        cmdline: the command line, secret-looking option values redacted.
        executable: the process's executable (/proc/<pid>/exe).
        env: the variables that matter to a run, as sorted (name, value) pairs.
        error: why process fields are missing; "" when none are.
    """

    time: float
    path: str
    source: str
    git: GitState
    pid: int | None = None
    start_time: float = 0.0
    uid: int | None = None
    cmdline: tuple[str, ...] = ()
    executable: str = ""
    env: tuple[tuple[str, str], ...] = ()
    error: str = ""

    @property
    def code_id(self) -> str:
        """A short fingerprint of the code: commit, diff and submodules; "unknown" if unknown.

        Two ranks with the same code_id run the same tracked code.
        """
        if not self.git.known or self.git.commit == UNKNOWN:
            return UNKNOWN
        h = hashlib.sha256(f"{self.git.commit}\0{self.git.diff_sha256}".encode())
        for s in self.git.submodules:
            h.update(f"\0{s.path}\0{s.commit}\0{s.diff_sha256}".encode())
        return h.hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the `--json` document and what the agent sends)."""
        return {
            "version": RECORD_VERSION, "time": self.time, "path": self.path, "source": self.source,
            "pid": self.pid, "start_time": self.start_time, "uid": self.uid,
            "code_id": self.code_id, "git": self.git.to_dict(), "cmdline": list(self.cmdline),
            "executable": self.executable, "env": dict(self.env), "error": self.error,
        }

    def to_json(self, indent: int | None = None) -> str:
        """The record as one JSON document."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


# -- parsing (pure) ---------------------------------------------------------------------------


class StatusParser:
    """Streams `git status --porcelain=v2 --branch -z` output into counts.

    Output is fed chunk by chunk, so a work tree with a million untracked files is
    counted without being held in memory.
    """

    def __init__(self) -> None:
        self.commit = UNKNOWN
        self.branch = UNKNOWN
        self.changed = 0
        self.untracked = 0
        self._rest = b""
        self._skip = 0

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of output."""
        records = (self._rest + chunk).split(b"\0")
        self._rest = records.pop()
        for rec in records:
            self._record(rec)

    def _record(self, rec: bytes) -> None:
        if self._skip:  # the original path of a rename ("2" entry) is its own record
            self._skip -= 1
            return
        if rec.startswith(b"# branch.oid "):
            self.commit = rec[13:].decode("ascii", "replace")
        elif rec.startswith(b"# branch.head "):
            self.branch = rec[14:].decode("utf-8", "replace")
        elif rec[:2] in (b"1 ", b"u "):
            self.changed += 1
        elif rec[:2] == b"2 ":
            self.changed += 1
            self._skip = 1
        elif rec[:2] == b"? ":
            self.untracked += 1

    def close(self) -> None:
        """Take a last record not followed by NUL, if any."""
        if self._rest:
            self._record(self._rest)
            self._rest = b""


def parse_status(data: bytes) -> StatusParser:
    """Parse a whole `git status --porcelain=v2 --branch -z` output.

    Args:
        data: the output.

    Returns:
        The parser, with commit, branch, changed and untracked filled.
    """
    p = StatusParser()
    p.feed(data)
    p.close()
    return p


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


_PY_OPTS_WITH_ARG = {"-W", "-X", "-Q"}


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


def _parse_config_list(data: bytes) -> tuple[list[str], dict[str, str]]:
    """Names and the remote URLs from `git config --list -z` (name NL value NUL)."""
    names: list[str] = []
    remotes: dict[str, str] = {}
    for item in data.split(b"\0"):
        if not item:
            continue
        name, _nl, value = item.decode("utf-8", "replace").partition("\n")
        names.append(name)
        low = name.lower()
        if low.startswith("remote.") and low.endswith(".url"):
            remotes.setdefault(name[7:-4], value)
    return names, remotes


# -- logging ------------------------------------------------------------------------------------

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(kind: str, reason: str) -> None:
    with _warned_lock:
        first = kind not in _warned
        _warned.add(kind)
    if first:
        log.warning("provenance unknown: %s (further ones of this kind are logged at debug level)",
                    reason)
    else:
        log.debug("provenance unknown: %s", reason)


# -- git ----------------------------------------------------------------------------------------


class _Probe:
    """The git calls for one record: one runner, one deadline, one identity."""

    def __init__(self, runner: GitRunner, config: ProvenanceConfig, hide_prefix: str) -> None:
        self.runner = runner
        self.config = config
        self.hide_prefix = hide_prefix  # "/proc/<pid>/root" when reading another mount namespace
        self.submodules: list[Submodule] = []

    def shown(self, path: str) -> str:
        if self.hide_prefix and path.startswith(self.hide_prefix):
            return path[len(self.hide_prefix):] or "/"
        return path

    def toplevel(self, path: str) -> str:
        return self.runner.run(["rev-parse", "--show-toplevel"], path).decode(
            "utf-8", "surrogateescape").strip()

    def repo(self, top: str, untracked: bool) -> tuple[StatusParser, str, dict[str, str]]:
        """Status, diff hash, remotes and overrides of the repository at `top`."""
        names, remotes = _parse_config_list(self.runner.run(["config", "--list", "-z"], top))
        overrides = driver_overrides(names)
        status = StatusParser()
        args = _STATUS_ARGS + ["--untracked-files=all" if untracked else "--untracked-files=no"]
        self.runner.run(args, top, overrides, sink=status.feed)
        status.close()
        diff = ""
        if status.changed:
            if status.commit == "(initial)":
                diff = UNKNOWN
            else:
                h = hashlib.sha256()
                self.runner.run(_DIFF_ARGS, top, overrides, sink=h.update)
                diff = h.hexdigest()
        return status, diff, remotes

    def walk_submodules(self, top: str, rel: str, depth: int) -> bool:
        """Append the submodules under `top` to self.submodules; True if any is dirty."""
        if depth > self.config.max_depth or not os.path.lexists(os.path.join(top, ".gitmodules")):
            return False
        out = self.runner.run(["config", "--file", ".gitmodules", "-z", "--get-regexp",
                               r"^submodule\..*\.path$"], top)
        paths = [item.partition(b"\n")[2].decode("utf-8", "surrogateescape")
                 for item in out.split(b"\0") if item]
        paths = [p for p in paths if p and not p.startswith("/") and ".." not in p.split("/")]
        if not paths:
            return False
        staged = self.runner.run(["ls-files", "--stage", "-z", "--", *(f":(literal){p}" for p in paths)],
                                 top)
        recorded: dict[str, str] = {}
        for item in staged.split(b"\0"):
            meta, _tab, path = item.partition(b"\t")
            parts = meta.split()
            if len(parts) >= 2 and parts[0] == b"160000":
                recorded[path.decode("utf-8", "surrogateescape")] = parts[1].decode()
        any_dirty = False
        for path in sorted(recorded):
            if len(self.submodules) >= self.config.max_submodules:
                break
            sub_dir = os.path.join(top, path)
            sub_rel = f"{rel}{path}"
            if not os.path.lexists(os.path.join(sub_dir, ".git")):
                self.submodules.append(Submodule(sub_rel, UNKNOWN, recorded[path], None))
                continue
            try:
                if os.path.realpath(self.toplevel(sub_dir)) != os.path.realpath(sub_dir):
                    self.submodules.append(Submodule(sub_rel, UNKNOWN, recorded[path], None))
                    continue
                status, diff, _remotes = self.repo(sub_dir, untracked=False)
            except GitError as exc:
                if exc.kind == "timeout":
                    raise
                self.submodules.append(Submodule(sub_rel, UNKNOWN, recorded[path], None))
                continue
            dirty = status.changed > 0
            index = len(self.submodules)
            self.submodules.append(Submodule(sub_rel, status.commit, recorded[path], dirty, diff))
            if self.walk_submodules(sub_dir, sub_rel + "/", depth + 1):
                dirty = True
                self.submodules[index] = replace(self.submodules[index], dirty=True)
            any_dirty = any_dirty or dirty
        return any_dirty


def git_state(path: str, run_as: RunAs | None = None, config: ProvenanceConfig = ProvenanceConfig(),
              hide_prefix: str = "") -> GitState:
    """The git state of the repository that contains `path`; never raises.

    Args:
        path: a directory inside the repository.
        run_as: whose credentials git runs with; None for this process's own.
        config: binary, time budget and limits.
        hide_prefix: a path prefix to remove from paths shown in the record.

    Returns:
        The state; on any failure a state whose fields say "unknown" and whose
        `error` says why (also logged once per kind of failure).
    """
    runner = GitRunner(run_as, config.git, config.budget_s)
    probe = _Probe(runner, config, hide_prefix)
    try:
        top = probe.toplevel(path)
        status, diff, remotes = probe.repo(top, untracked=True)
        sub_dirty = probe.walk_submodules(top, "", 1)
    except GitError as exc:
        _warn_once(exc.kind, f"{probe.shown(path)}: {exc.reason}")
        return GitState(error=exc.reason, ran_as_uid=runner.run_as.uid if runner.calls else None)
    url = remotes.get("origin", next(iter(remotes.values()), ""))
    head = status.branch
    return GitState(
        root=probe.shown(top),
        commit=status.commit,
        branch=head,
        dirty=status.changed > 0 or sub_dirty,
        untracked=status.untracked,
        diff_sha256=diff,
        remote_url=strip_url_credentials(url),
        submodules=tuple(probe.submodules),
        ran_as_uid=runner.run_as.uid,
    )


# -- processes and directories -----------------------------------------------------------------


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def process_start_time(pid: int, proc: str = "/proc", boot_time: float | None = None) -> float:
    """A process's start time in Unix seconds, rounded to 0.01 s as the process source does.

    Args:
        pid: the process.
        proc: the /proc mount point.
        boot_time: the boot time, when the caller already read it.

    Returns:
        The start time; with the node and pid, the process's identity.

    Raises:
        OSError: the process is gone or /proc is unreadable.
        ValueError: the stat line is malformed.
    """
    boot = read_boot_time(proc) if boot_time is None else boot_time
    try:
        ticks = parse_stat(_read(f"{proc}/{pid}/stat")).start_ticks
    except IndexError as exc:
        raise ValueError(f"malformed {proc}/{pid}/stat") from exc
    return round(boot + ticks / _CLK_TCK, 2)


class GitStateCache:
    """git states taken in the last few seconds, by directory and identity.

    The ranks of a job on one node start together, in the same checkout, as the same user: each would run
    the same git calls seconds apart (in a large repository `git status` alone takes a second or more), and
    each would read the same tree. A state taken within `ttl_s` serves them all; a failure (a timeout
    included) is kept as well, so a repository git cannot read costs its budget once, not once a rank.

    Args:
        ttl_s: how long a state serves later processes.
        max_entries: states kept at most (the oldest go first).
        clock: seconds (tests pass their own).
    """

    def __init__(self, ttl_s: float = 10.0, max_entries: int = 64,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self.hits = 0
        self._states: dict[tuple[str, RunAs], tuple[float, GitState]] = {}

    def get(self, path: str, run_as: RunAs, take: Callable[[], GitState]) -> GitState:
        """The state of `path` for `run_as`: kept from less than ttl_s ago, else taken now by `take()`."""
        key = (path, run_as)
        now = self.clock()
        kept = self._states.get(key)
        if kept is not None and 0.0 <= now - kept[0] < self.ttl_s:
            self.hits += 1
            return kept[1]
        state = take()
        self._states.pop(key, None)
        self._states[key] = (now, state)
        while len(self._states) > self.max_entries:
            del self._states[next(iter(self._states))]
        return state


def provenance_of_pid(pid: int, config: ProvenanceConfig = ProvenanceConfig(),
                      now: float | None = None, git_cache: GitStateCache | None = None) -> Provenance:
    """The provenance record of a running process; never raises.

    Args:
        pid: the process.
        config: how to take it.
        now: the record's time (defaults to the wall clock).
        git_cache: git states to share with the other processes of the same checkout (None: take anew).

    Returns:
        The record; fields that could not be read are empty, with `error` (process
        fields) or `git.error` (git fields) saying why.
    """
    now = time.time() if now is None else now
    proc = f"{config.proc}/{pid}"
    errors: list[str] = []
    try:
        run_as = parse_proc_ids(_read(f"{proc}/status").decode("utf-8", "replace"))
        start = process_start_time(pid, config.proc)
        cwd = os.readlink(f"{proc}/cwd")
    except (OSError, ValueError, IndexError) as exc:
        reason = f"cannot read {proc}: {getattr(exc, 'strerror', None) or exc}"
        _warn_once("proc", reason)
        return Provenance(now, "", "cwd", GitState(error=reason), pid=pid, error=reason)
    try:
        argv = tuple(a.decode("utf-8", "surrogateescape")
                     for a in _read(f"{proc}/cmdline").split(b"\0")[:-1])
    except OSError as exc:
        argv = ()
        errors.append(f"cmdline: {exc.strerror}")
    try:
        exe = os.readlink(f"{proc}/exe")
    except OSError as exc:
        exe = ""
        errors.append(f"exe: {exc.strerror}")
    try:
        env = select_env(parse_environ(_read(f"{proc}/environ")), config.extra_env)
    except OSError as exc:
        env = {}
        errors.append(f"environ: {exc.strerror}")
    prefix = _root_prefix(pid, config.proc)
    state, source, path = _git_for_process(cwd, argv, run_as, config, prefix, git_cache)
    return Provenance(now, path, source, state, pid=pid, start_time=start, uid=run_as.uid,
                      cmdline=redact_argv(argv), executable=exe, env=tuple(env.items()),
                      error="; ".join(errors))


def _root_prefix(pid: int, proc: str) -> str:
    """"/proc/<pid>/root" when the process sees another mount namespace (a container)."""
    try:
        if os.readlink(f"{proc}/{pid}/ns/mnt") != os.readlink(f"{proc}/self/ns/mnt"):
            return f"{proc}/{pid}/root"
    except OSError:
        pass
    return ""


def _git_for_process(cwd: str, argv: tuple[str, ...], run_as: RunAs, config: ProvenanceConfig,
                     prefix: str, cache: GitStateCache | None = None) -> tuple[GitState, str, str]:
    def state_of(path: str) -> GitState:
        if cache is None:
            return git_state(path, run_as, config, prefix)
        return cache.get(path, run_as, lambda: git_state(path, run_as, config, prefix))

    if cwd.endswith(" (deleted)"):
        return GitState(error="the working directory was deleted"), "cwd", cwd
    script = script_path(argv, cwd)
    if script:
        where = os.path.dirname(script)
        state = state_of(prefix + where)
        # a script outside any repository (a launcher in site-packages) says nothing:
        # the working directory is the next best guess
        if state.known or "not inside a git repository" not in state.error:
            return state, "script", where
    return state_of(prefix + cwd), "cwd", cwd


def owner_of(path: str) -> RunAs:
    """The credentials of a directory's owner (primary group and groups from passwd).

    Args:
        path: the directory.

    Returns:
        The owner's uid, primary gid and supplementary groups; a uid with no passwd
        entry gets the directory's group and no others.

    Raises:
        OSError: the directory cannot be stat'ed.
    """
    st = os.stat(path)
    try:
        pw = pwd.getpwuid(st.st_uid)
    except KeyError:
        return RunAs(st.st_uid, st.st_gid, ())
    return RunAs(st.st_uid, pw.pw_gid, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)))


def provenance_of_dir(path: str, config: ProvenanceConfig = ProvenanceConfig(),
                      now: float | None = None) -> Provenance:
    """The provenance record of a directory (`clusterwatch provenance DIR`); never raises.

    Run by a user, git runs as that user. Run by root, git runs as the directory's
    owner, so a hostile repository never runs anything as root.

    Args:
        path: a directory inside a repository.
        config: how to take it.
        now: the record's time (defaults to the wall clock).

    Returns:
        The record.
    """
    now = time.time() if now is None else now
    path = os.path.abspath(path)
    try:
        if not stat.S_ISDIR(os.stat(path).st_mode):
            raise NotADirectoryError(20, "not a directory")
        run_as = owner_of(path) if os.geteuid() == 0 else RunAs.current()
    except OSError as exc:
        reason = f"cannot use {path}: {exc.strerror}"
        _warn_once("dir", reason)
        return Provenance(now, path, "dir", GitState(error=reason), error=reason)
    return Provenance(now, path, "dir", git_state(path, run_as, config), uid=run_as.uid)
