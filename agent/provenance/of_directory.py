"""A directory's record (`clusterwatch provenance DIR`): its git state, git run as its owner when root asks."""
from __future__ import annotations

import os
import pwd
import stat
import time

from clusterwatch.agent.gitrun import RunAs
from clusterwatch.agent.provenance.failures import warn_once
from clusterwatch.agent.provenance.git_probe import git_state
from clusterwatch.agent.provenance.record import GitState, Provenance, ProvenanceConfig


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
        warn_once("dir", reason)
        return Provenance(now, path, "dir", GitState(error=reason), error=reason)
    return Provenance(now, path, "dir", git_state(path, run_as, config), uid=run_as.uid)
