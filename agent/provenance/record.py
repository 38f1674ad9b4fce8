"""The provenance record's shape: how it is taken, a repository's git state, the record itself."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

UNKNOWN = "unknown"
RECORD_VERSION = 1


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
