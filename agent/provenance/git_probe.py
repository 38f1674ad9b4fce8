"""A repository's git state, git run as the owner it is given, within one time budget."""
from __future__ import annotations

import hashlib
import os
from dataclasses import replace

from clusterwatch.agent.gitrun import GitError, GitRunner, RunAs
from clusterwatch.agent.provenance.failures import warn_once
from clusterwatch.agent.provenance.git_output import StatusParser, parse_config_list
from clusterwatch.agent.provenance.record import UNKNOWN, GitState, ProvenanceConfig, Submodule
from clusterwatch.agent.redact import strip_url_credentials

from clusterwatch.git_safety import driver_overrides

_DIFF_ARGS = [
    "diff", "HEAD", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames",
    "--ignore-submodules=dirty", "--submodule=short", "--src-prefix=a/", "--dst-prefix=b/",
    "--full-index", "--unified=3", "--inter-hunk-context=0", "--diff-algorithm=myers",
    "--indent-heuristic", "--no-relative",
    "-O/dev/null",  # ignore diff.orderFile: the hash must not depend on the repository's config
]
_STATUS_ARGS = ["status", "--porcelain=v2", "--branch", "-z", "--no-renames",
                "--ignore-submodules=dirty"]


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
        names, remotes = parse_config_list(self.runner.run(["config", "--list", "-z"], top))
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
        warn_once(exc.kind, f"{probe.shown(path)}: {exc.reason}")
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
