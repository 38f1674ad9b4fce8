"""A running process's record: its identity, command line and environment (redacted), and its code's git state."""
from __future__ import annotations

import os
import time

from clusterwatch.agent.gitrun import RunAs
from clusterwatch.agent.provenance.cache import GitStateCache
from clusterwatch.agent.provenance.failures import warn_once
from clusterwatch.agent.provenance.git_probe import git_state
from clusterwatch.agent.provenance.process import parse_proc_ids, root_prefix, script_path
from clusterwatch.agent.provenance.record import GitState, Provenance, ProvenanceConfig
from clusterwatch.agent.redact import redact_argv, select_env

from clusterwatch.procfs import parse_environ, process_start_time, read_bytes


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
        run_as = parse_proc_ids(read_bytes(f"{proc}/status").decode("utf-8", "replace"))
        start = process_start_time(pid, config.proc)
        cwd = os.readlink(f"{proc}/cwd")
    except (OSError, ValueError, IndexError) as exc:
        reason = f"cannot read {proc}: {getattr(exc, 'strerror', None) or exc}"
        warn_once("proc", reason)
        return Provenance(now, "", "cwd", GitState(error=reason), pid=pid, error=reason)
    try:
        argv = tuple(a.decode("utf-8", "surrogateescape")
                     for a in read_bytes(f"{proc}/cmdline").split(b"\0")[:-1])
    except OSError as exc:
        argv = ()
        errors.append(f"cmdline: {exc.strerror}")
    try:
        exe = os.readlink(f"{proc}/exe")
    except OSError as exc:
        exe = ""
        errors.append(f"exe: {exc.strerror}")
    try:
        env = select_env(parse_environ(read_bytes(f"{proc}/environ")), config.extra_env)
    except OSError as exc:
        env = {}
        errors.append(f"environ: {exc.strerror}")
    prefix = root_prefix(pid, config.proc)
    state, source, path = _git_for_process(cwd, argv, run_as, config, prefix, git_cache)
    return Provenance(now, path, source, state, pid=pid, start_time=start, uid=run_as.uid,
                      cmdline=redact_argv(argv), executable=exe, env=tuple(env.items()),
                      error="; ".join(errors))


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
