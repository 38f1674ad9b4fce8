"""Git provenance against real repositories: clean, dirty, submodules, credentials, hostile config.

Every repository is made here with the real git. Hostile repositories carry config
that would run `touch <marker>`; each case first shows that plain git does run it
(so the test cannot pass by accident), then that provenance does not, as root and as
the repository's owner. Tests that need another uid use nobody (65534) and run as
root, which is how the agent runs.
"""
from __future__ import annotations

import logging
import os
import pty
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from clusterwatch.agent import provenance as prov
from clusterwatch.agent.gitrun import RunAs
from clusterwatch.agent.provenance import (
    GitStateCache,
    ProvenanceConfig,
    parse_proc_ids,
    parse_status,
    process_start_time,
    provenance_of_dir,
    provenance_of_pid,
    script_path,
)

from tests.support.git_repos import (
    GIT,
    NOBODY,
    SLEEPER,
    TOKEN,
    assert_no_git_left_on,
    chown_tree,
    git,
    git_env,
    git_wrapper,
    hanging_repo,
    make_repo,
    spawn_ready,
    stat_dirty,
    stop_ready,
)

# -- pure helpers ----------------------------------------------------------------------------


def test_parse_status_counts_changes_and_untracked_from_a_stream():
    out = (b"# branch.oid 0123456789abcdef0123456789abcdef01234567\0# branch.head main\0"
           b"1 .M N... 100644 100644 100644 aa aa a.py\0"
           b"2 R. N... 100644 100644 100644 aa aa R100 new.py\0old.py\0"
           b"? x.txt\0? d/y.txt\0! ignored\0")
    p = prov.StatusParser()
    for i in range(0, len(out), 7):  # arbitrary chunk boundaries
        p.feed(out[i:i + 7])
    p.close()
    assert (p.commit, p.branch, p.changed, p.untracked) == (
        "0123456789abcdef0123456789abcdef01234567", "main", 2, 2)
    assert parse_status(b"# branch.oid (initial)\0# branch.head (detached)\0").branch == "(detached)"


@pytest.mark.parametrize("argv, expected", [
    (["python", "train.py", "--lr", "1"], "/w/train.py"),
    (["/usr/bin/python3.11", "-u", "-W", "ignore", "src/t.py"], "/w/src/t.py"),
    (["python3", "/abs/t.py"], "/abs/t.py"),
    (["python", "-m", "torch.distributed.run", "t.py"], None),
    (["python", "-c", "print(1)"], None),
    (["python"], None),
    (["bash", "run.sh"], None),
])
def test_script_path(argv, expected):
    assert script_path(argv, "/w") == expected


def test_parse_proc_ids_takes_real_ids_and_groups():
    text = "Name:\tpython\nUid:\t1000\t1001\t1001\t1001\nGid:\t100\t101\t101\t101\nGroups:\t4 27 1001 \n"
    assert parse_proc_ids(text) == RunAs(1000, 100, (4, 27, 1001))
    # a setuid-root program started by uid 1000: never root
    text = "Uid:\t1000\t0\t0\t0\nGid:\t100\t100\t100\t100\nGroups:\t100\n"
    assert parse_proc_ids(text) == RunAs(1000, 100, (100,))


# -- real repositories -----------------------------------------------------------------------


def test_clean_repository(tmp_path):
    repo = make_repo(tmp_path / "r")
    rec = provenance_of_dir(str(repo / "README").rsplit("/", 1)[0])
    g = rec.git
    assert g.error == "" and g.known
    assert g.root == str(repo)
    assert g.commit == git(repo, "rev-parse", "HEAD")
    assert (g.branch, g.dirty, g.untracked, g.diff_sha256, g.remote_url) == ("main", False, 0, "", "")
    assert g.ran_as_uid == os.geteuid()
    assert len(rec.code_id) == 16


def test_subdirectory_finds_the_repository_root(tmp_path):
    repo = make_repo(tmp_path / "r", {"src/pkg/m.py": "x = 1\n"})
    assert provenance_of_dir(str(repo / "src" / "pkg")).git.root == str(repo)


def test_dirty_repository_hashes_the_diff_of_tracked_files(tmp_path):
    repo = make_repo(tmp_path / "r", {"a.py": "a = 1\n", "w.bin": "\0\1\2"})
    (repo / "a.py").write_text("a = 2\n")
    first = provenance_of_dir(str(repo)).git
    assert first.dirty is True and first.untracked == 0
    assert len(first.diff_sha256) == 64
    # the same change gives the same hash; another change another one
    (repo / "a.py").write_text("a = 1\n")
    assert provenance_of_dir(str(repo)).git.dirty is False
    (repo / "a.py").write_text("a = 2\n")
    assert provenance_of_dir(str(repo)).git.diff_sha256 == first.diff_sha256
    (repo / "a.py").write_text("a = 3\n")
    assert provenance_of_dir(str(repo)).git.diff_sha256 != first.diff_sha256
    # binary changes count too (--binary): two binary contents, two hashes
    (repo / "a.py").write_text("a = 1\n")
    (repo / "w.bin").write_bytes(b"\0\1\3")
    h1 = provenance_of_dir(str(repo)).git.diff_sha256
    (repo / "w.bin").write_bytes(b"\0\1\4")
    h2 = provenance_of_dir(str(repo)).git.diff_sha256
    assert len(h1) == 64 and h1 != h2
    # a staged change is uncommitted too
    git(repo, "add", "w.bin")
    staged = provenance_of_dir(str(repo)).git
    assert staged.dirty is True and staged.diff_sha256 == h2


def test_untracked_files_only_are_counted_not_dirty(tmp_path):
    repo = make_repo(tmp_path / "r")
    (repo / "notes.txt").write_text("x")
    (repo / "out" / "deep").mkdir(parents=True)
    (repo / "out" / "deep" / "a.log").write_text("x")
    (repo / "out" / "b.log").write_text("x")
    (repo / ".gitignore").write_text("*.tmp\n")
    (repo / "skip.tmp").write_text("x")
    g = provenance_of_dir(str(repo)).git
    assert (g.dirty, g.untracked, g.diff_sha256) == (False, 4, "")  # .gitignore itself is untracked


def test_detached_head(tmp_path):
    repo = make_repo(tmp_path / "r")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "README").write_text("two\n")
    git(repo, "commit", "-qam", "two")
    git(repo, "checkout", "-q", "--detach", first)
    g = provenance_of_dir(str(repo)).git
    assert (g.commit, g.branch, g.dirty) == (first, "(detached)", False)


def test_repository_without_commits(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a").write_text("x")
    g = provenance_of_dir(str(repo)).git
    assert (g.commit, g.branch, g.untracked, g.dirty) == ("(initial)", "main", 1, False)


def test_nested_submodules(tmp_path):
    leaf = make_repo(tmp_path / "leaf", {"leaf.py": "L = 1\n"})
    mid = make_repo(tmp_path / "mid", {"mid.py": "M = 1\n"})
    git(mid, "submodule", "add", "-q", str(leaf), "vendor/leaf")
    git(mid, "commit", "-qm", "leaf")
    top = make_repo(tmp_path / "top", {"top.py": "T = 1\n"})
    git(top, "submodule", "add", "-q", str(mid), "lib/mid")
    git(top, "commit", "-qm", "mid")
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", "--recurse-submodules", str(top), str(work))

    g = provenance_of_dir(str(work)).git
    assert g.error == ""
    subs = {s.path: s for s in g.submodules}
    assert list(subs) == ["lib/mid", "lib/mid/vendor/leaf"]
    assert subs["lib/mid"].commit == git(work / "lib/mid", "rev-parse", "HEAD") == subs["lib/mid"].recorded
    leaf_head = git(work / "lib/mid/vendor/leaf", "rev-parse", "HEAD")
    assert subs["lib/mid/vendor/leaf"].commit == leaf_head == subs["lib/mid/vendor/leaf"].recorded
    assert g.dirty is False and not any(s.dirty for s in g.submodules)

    # a change deep down makes every level up dirty, and changes the code id
    clean_id = provenance_of_dir(str(work)).code_id
    (work / "lib/mid/vendor/leaf/leaf.py").write_text("L = 2\n")
    rec = provenance_of_dir(str(work))
    subs = {s.path: s for s in rec.git.submodules}
    assert subs["lib/mid/vendor/leaf"].dirty is True and len(subs["lib/mid/vendor/leaf"].diff_sha256) == 64
    assert subs["lib/mid"].dirty is True and rec.git.dirty is True
    assert rec.code_id != clean_id

    # a submodule checked out at another commit than recorded
    (work / "lib/mid/vendor/leaf/leaf.py").write_text("L = 1\n")
    (work / "lib/mid/mid.py").write_text("M = 2\n")
    git(work / "lib/mid", "commit", "-qam", "moved")
    moved = {s.path: s for s in provenance_of_dir(str(work)).git.submodules}["lib/mid"]
    assert moved.commit != moved.recorded and moved.commit == git(work / "lib/mid", "rev-parse", "HEAD")


def test_uninitialised_submodule(tmp_path):
    leaf = make_repo(tmp_path / "leaf")
    top = make_repo(tmp_path / "top")
    git(top, "submodule", "add", "-q", str(leaf), "ext/leaf")
    git(top, "commit", "-qm", "sub")
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(top), str(work))  # no --recurse-submodules
    g = provenance_of_dir(str(work)).git
    assert [(s.path, s.commit, s.dirty) for s in g.submodules] == [("ext/leaf", "unknown", None)]
    assert g.submodules[0].recorded == git(leaf, "rev-parse", "HEAD")


def test_scp_style_remote_is_kept(tmp_path):
    repo = make_repo(tmp_path / "r")
    git(repo, "remote", "add", "origin", "git@github.com:team/r.git")
    assert provenance_of_dir(str(repo)).git.remote_url == "git@github.com:team/r.git"


def test_no_repository_says_unknown_and_warns_once(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="clusterwatch.agent.provenance")
    rec = provenance_of_dir(str(tmp_path))
    d = rec.to_dict()["git"]
    assert rec.git.error == "not inside a git repository"
    assert all(d[k] == "unknown" for k in ("root", "commit", "branch", "dirty", "untracked",
                                             "diff_sha256", "remote_url"))
    assert rec.code_id == "unknown"
    provenance_of_dir(str(tmp_path))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not inside a git repository" in warnings[0].getMessage()
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 1


@pytest.mark.serial  # times the kill against the 1 s budget (under 4 s)
def test_a_git_that_hangs_is_killed_within_the_budget(tmp_path, shared_dir):
    repo = hanging_repo(tmp_path / "r")
    wrapper, log = git_wrapper(shared_dir)
    started = time.monotonic()
    rec = provenance_of_dir(str(repo), ProvenanceConfig(git=str(wrapper), budget_s=1.0))
    elapsed = time.monotonic() - started
    assert "did not finish" in rec.git.error and rec.git.commit == "unknown"
    assert elapsed < 4.0
    assert_no_git_left_on(repo)  # nothing of the killed call is left


# -- hostile repositories ----------------------------------------------------------------------


def _hostile(repo: Path, marker_dir: Path) -> dict[str, Path]:
    """Every way this test knows for a repository's config to run a command; returns the markers."""
    m = {k: marker_dir / f"pwned-{k}-{uuid.uuid4().hex[:8]}" for k in (
        "fsmonitor", "hook", "pager", "pager_status", "clean", "smudge", "process", "external",
        "textconv", "diffcmd", "ssh")}
    (repo / ".gitattributes").write_text("*.py filter=evil diff=evil\n*.txt filter=evil2\n")
    (repo / "a.py").write_text("a = 1\n")
    (repo / "b.txt").write_text("b\n")
    (repo / "c.md").write_text("c\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "attrs")
    cfg = {
        "core.fsmonitor": f"touch {m['fsmonitor']}; echo",
        "core.pager": f"touch {m['pager']}; cat",
        "pager.status": f"touch {m['pager_status']}; cat",
        "filter.evil.clean": f"touch {m['clean']}; cat",
        "filter.evil.smudge": f"touch {m['smudge']}; cat",
        "filter.evil.required": "true",
        "filter.evil2.process": f"touch {m['process']}",
        "diff.external": f"touch {m['external']}; true",
        "diff.evil.textconv": f"touch {m['textconv']}; cat",
        "diff.evil.command": f"touch {m['diffcmd']}; true",
        "core.sshCommand": f"touch {m['ssh']}; false",
        "status.submoduleSummary": "true",
        "core.hooksPath": str(repo / ".git" / "hooks"),
    }
    for key, value in cfg.items():
        git(repo, "config", key, value)
    git(repo, "remote", "add", "origin", "ssh://git@203.0.113.1/r.git")
    hooks = repo / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for name in ("post-index-change", "pre-commit", "post-checkout", "reference-transaction",
                 "fsmonitor-watchman", "pre-auto-gc"):
        (hooks / name).write_text(f"#!/bin/sh\ntouch {m['hook']}\n")
        (hooks / name).chmod(0o755)
    # dirty, stat-dirty and untracked, so that status and diff read contents
    (repo / "a.py").write_text("a = 2\n")
    (repo / "c.md").write_text("c = 2\n")
    stat_dirty(repo / "b.txt")
    (repo / "new.py").write_text("n = 1\n")
    return m


def _control(repo: Path, m: dict[str, Path], user: int | None) -> None:
    """Plain git, as `user`, runs each hostile command: the threat is real.

    One call per threat, each with the threats that would pre-empt it switched off
    (a diff driver's command, for instance, replaces both diff.external and textconv).
    """
    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    nofs = ["-c", "core.fsmonitor=false", "-c", "filter.evil2.process="]  # both would end git early

    def plain(*args: str, tty: bool = False) -> None:
        master, slave = pty.openpty()
        out = slave if tty else subprocess.DEVNULL
        subprocess.run([GIT, *args], cwd=repo, env=git_env(), stdin=subprocess.DEVNULL, stdout=out,
                       stderr=out, timeout=30, check=False, **kw)
        os.close(master)
        os.close(slave)

    plain("status")                                   # fsmonitor, clean, process
    stat_dirty(repo / "b.txt")
    plain(*nofs, "update-index", "--refresh")         # post-index-change hook
    plain(*nofs, "diff", "HEAD")                      # diff.<driver>.command for *.py, external for *.md
    plain(*nofs, "diff", "--no-ext-diff", "HEAD")     # textconv
    plain(*nofs, "ls-remote", "origin")               # core.sshCommand
    plain(*nofs, "-p", "log", "-1", tty=True)         # core.pager
    plain(*nofs, "status", tty=True)                  # pager.status
    ran = {k for k, p in m.items() if p.exists()}
    # smudge may not run in these calls (it is for checkout); it is emptied all the same
    missing = set(m) - {"smudge"} - ran
    assert not missing, f"the control did not run: {missing}"
    for p in m.values():
        p.unlink(missing_ok=True)


def test_hostile_repository_runs_nothing_as_root(tmp_path, marker_dir):
    repo = make_repo(tmp_path / "evil")
    markers = _hostile(repo, marker_dir)
    _control(repo, markers, None)
    stat_dirty(repo / "b.txt")
    rec = provenance_of_dir(str(repo))
    ran = sorted(k for k, p in markers.items() if p.exists())
    assert ran == [], f"hostile config ran: {ran}"
    assert rec.git.error == "" and rec.git.dirty is True and rec.git.untracked == 1
    assert rec.git.remote_url == "ssh://203.0.113.1/r.git"
    assert list(marker_dir.iterdir()) == []


def test_hostile_repository_runs_nothing_as_its_owner(shared_dir, marker_dir):
    repo = make_repo(shared_dir / "evil")
    markers = _hostile(repo, marker_dir)
    chown_tree(repo, NOBODY)
    _control(repo, markers, NOBODY)
    stat_dirty(repo / "b.txt")
    wrapper, log = git_wrapper(shared_dir)
    rec = provenance_of_dir(str(repo), ProvenanceConfig(git=str(wrapper)))
    assert list(marker_dir.iterdir()) == []
    assert rec.git.error == "" and rec.git.ran_as_uid == NOBODY and rec.git.dirty is True
    uids = {line.split()[0] for line in log.read_text().splitlines()}
    assert uids == {str(NOBODY)}


def test_hostile_submodule_config_runs_nothing(tmp_path, marker_dir):
    leaf = make_repo(tmp_path / "leaf", {"x.py": "x = 1\n"})
    top = make_repo(tmp_path / "top")
    git(top, "submodule", "add", "-q", str(leaf), "sub")
    git(top, "commit", "-qm", "sub")
    sub = top / "sub"
    (sub / ".gitattributes").write_text("*.py filter=subevil\n")
    marker = marker_dir / "pwned-subfilter"
    git(sub, "config", "filter.subevil.clean", f"touch {marker}; cat")
    git(sub, "config", "core.fsmonitor", f"touch {marker}; echo")
    stat_dirty(sub / "x.py")
    git(sub, "status", check=False)
    assert marker.exists()  # the control
    marker.unlink()
    stat_dirty(sub / "x.py")
    g = provenance_of_dir(str(top)).git
    assert not marker.exists()
    assert g.error == "" and [s.path for s in g.submodules] == ["sub"]


def test_refuses_another_uid_without_root(shared_dir, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rec = prov.git_state(str(shared_dir), RunAs(NOBODY, NOBODY))
    assert "not root" in rec.error and rec.ran_as_uid is None


# -- processes ----------------------------------------------------------------------------------


def test_process_record_from_its_script(tmp_path):
    repo = make_repo(tmp_path / "proj", {"train.py": SLEEPER})
    elsewhere = tmp_path / "run-dir"
    elsewhere.mkdir()
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "RANK": "3",
           "WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": "2", "HF_TOKEN": TOKEN, "WANDB_API_KEY": TOKEN,
           "WANDB_PROJECT": "sweep", "UNRELATED": "x"}
    proc = spawn_ready([sys.executable, str(repo / "train.py"), "--lr", "0.1", f"--token={TOKEN}"], elsewhere, env)
    try:
        rec = provenance_of_pid(proc.pid, ProvenanceConfig(extra_env=("WANDB_*",)))
        assert rec.pid == proc.pid and rec.uid == os.geteuid()
        assert rec.start_time == process_start_time(proc.pid)
        assert (rec.source, rec.path) == ("script", str(repo))
        assert rec.git.commit == git(repo, "rev-parse", "HEAD") and rec.git.dirty is False
        assert rec.executable == os.path.realpath(sys.executable)
        assert rec.cmdline == (sys.executable, str(repo / "train.py"), "--lr", "0.1", "--token=<redacted>")
        assert dict(rec.env) == {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "RANK": "3", "WORLD_SIZE": "8",
                                 "CUDA_VISIBLE_DEVICES": "2", "WANDB_PROJECT": "sweep"}
        assert TOKEN not in rec.to_json() and rec.error == ""
    finally:
        stop_ready(proc)


def test_process_record_falls_back_to_the_working_directory(tmp_path):
    repo = make_repo(tmp_path / "proj")
    proc = spawn_ready([sys.executable, "-c", SLEEPER], repo, {"PATH": "/usr/bin:/bin"})
    try:
        rec = provenance_of_pid(proc.pid)
        assert (rec.source, rec.path, rec.git.root) == ("cwd", str(repo), str(repo))
        assert rec.git.commit == git(repo, "rev-parse", "HEAD")
    finally:
        stop_ready(proc)


def test_ranks_in_one_checkout_share_one_git_state_for_a_few_seconds(tmp_path):
    repo = make_repo(tmp_path / "proj", {"train.py": SLEEPER})
    wrapper, log = git_wrapper(tmp_path)
    config = ProvenanceConfig(git=str(wrapper))
    clock = [100.0]
    cache = GitStateCache(ttl_s=10.0, clock=lambda: clock[0])
    ranks = [spawn_ready([sys.executable, "train.py"], repo, {"PATH": "/usr/bin:/bin"}) for _ in range(3)]
    try:
        records = [provenance_of_pid(p.pid, config, git_cache=cache) for p in ranks[:2]]
        calls_for_one = len(log.read_text().splitlines())
        assert calls_for_one > 0 and cache.hits == 1  # the second rank ran no git
        assert records[0].git == records[1].git and records[0].git.commit == git(repo, "rev-parse", "HEAD")
        assert [r.pid for r in records] == [p.pid for p in ranks[:2]]  # the per-process parts stay each one's
        # Past the window the tree is read again: a change since shows.
        (repo / "train.py").write_text(SLEEPER + "# edited\n")
        clock[0] += 10.0
        late = provenance_of_pid(ranks[2].pid, config, git_cache=cache)
        assert len(log.read_text().splitlines()) == 2 * calls_for_one
        assert late.git.dirty and not records[0].git.dirty
    finally:
        for p in ranks:
            stop_ready(p)


def test_git_state_cache_keys_by_directory_and_identity_and_stays_bounded():
    clock = [0.0]
    cache = GitStateCache(ttl_s=5.0, max_entries=2, clock=lambda: clock[0])
    taken = []

    def take(label):
        def run():
            taken.append(label)
            return prov.GitState(error=label)
        return run

    alice, bob = RunAs(1000, 1000), RunAs(1001, 1001)
    assert cache.get("/r", alice, take("a")).error == "a"
    assert cache.get("/r", alice, take("again")).error == "a"  # within the window
    assert cache.get("/r", bob, take("b")).error == "b"  # another user reads with other rights
    assert cache.get("/s", alice, take("s")).error == "s"  # a third entry pushes out the oldest
    assert cache.get("/r", alice, take("a2")).error == "a2"
    clock[0] = 5.0
    assert cache.get("/s", alice, take("s2")).error == "s2"  # the window has passed
    assert taken == ["a", "b", "s", "a2", "s2"]


def test_process_of_another_user_is_read_as_that_user(shared_dir, marker_dir):
    repo = make_repo(shared_dir / "proj", {"train.py": SLEEPER})
    markers = _hostile(repo, marker_dir)
    chown_tree(repo, NOBODY)
    wrapper, log = git_wrapper(shared_dir)
    proc = spawn_ready(["/usr/bin/python3", "train.py"], repo, {"PATH": "/usr/bin:/bin"}, user=NOBODY)
    try:
        rec = provenance_of_pid(proc.pid, ProvenanceConfig(git=str(wrapper)))
        assert rec.uid == NOBODY and rec.git.ran_as_uid == NOBODY and rec.source == "script"
        assert rec.git.commit == git(repo, "rev-parse", "HEAD", user=NOBODY)
        assert {line.split()[0] for line in log.read_text().splitlines()} == {str(NOBODY)}
        assert not any(p.exists() for p in markers.values())
    finally:
        stop_ready(proc)


def test_process_in_somebody_elses_repository_is_refused_by_git(tmp_path, shared_dir):
    repo = make_repo(shared_dir / "roots-repo")  # owned by root
    wrapper, log = git_wrapper(shared_dir)
    proc = spawn_ready(["/usr/bin/python3", "-c", SLEEPER], repo, {"PATH": "/usr/bin:/bin"}, user=NOBODY)
    try:
        rec = provenance_of_pid(proc.pid, ProvenanceConfig(git=str(wrapper)))
        assert "dubious ownership" in rec.git.error and rec.git.commit == "unknown"
        assert {line.split()[0] for line in log.read_text().splitlines()} == {str(NOBODY)}
    finally:
        stop_ready(proc)


def test_vanished_process_says_unknown(caplog):
    proc = subprocess.Popen(["true"])
    proc.wait()
    rec = provenance_of_pid(proc.pid)
    assert rec.git.commit == "unknown" and "cannot read" in rec.error
    assert rec.to_dict()["git"]["dirty"] == "unknown"
    assert "cannot read" in caplog.text




def _setuid_root_as(uid: int):
    """What exec of a setuid-root program gives a user's process: real uid the user's, effective and saved 0."""
    def become() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, 0, 0)
    return become


def test_a_setuid_process_is_read_as_its_real_uid(shared_dir, marker_dir):
    """A user's setuid-root process (real uid nobody, effective root) in the user's checkout: git runs as the
    user, never as root."""
    repo = make_repo(shared_dir / "proj", {"train.py": SLEEPER})
    markers = _hostile(repo, marker_dir)
    chown_tree(repo, NOBODY)
    wrapper, log = git_wrapper(shared_dir)
    proc = subprocess.Popen(["/usr/bin/python3", "train.py"], cwd=repo, env={"PATH": "/usr/bin:/bin"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=_setuid_root_as(NOBODY))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        uids = Path(f"/proc/{proc.pid}/status").read_text().split("Uid:")[1].split()[:4]
        assert uids == [str(NOBODY), "0", "0", "0"]   # the process is what the test says it is
        rec = provenance_of_pid(proc.pid, ProvenanceConfig(git=str(wrapper)))
        assert {line.split()[0] for line in log.read_text().splitlines()} == {str(NOBODY)}
        assert rec.uid == NOBODY and rec.git.ran_as_uid == NOBODY
        assert rec.git.commit == git(repo, "rev-parse", "HEAD", user=NOBODY)
        assert not any(p.exists() for p in markers.values())
    finally:
        stop_ready(proc)
