"""train.provenance(): the commit of this process's code, from git run safely inside the process, or the
agent's record when the agent pushed one."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from clusterwatch import train_provenance as tp

GIT = shutil.which("git")
PRINT = "import json; from clusterwatch import train; print(json.dumps(train.provenance()))"


def git(repo: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def checkout(root: Path) -> tuple[Path, str]:
    repo = root / "repo"
    (repo / "sub").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("x = 1\n")
    (repo / "sub" / "script.py").write_text(PRINT + "\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    return repo, git(repo, "rev-parse", "HEAD")


def in_process(cwd: Path, *argv: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_DIR"] = "/nonexistent"  # inherited git variables must not steer the process's git
    out = subprocess.run([sys.executable, *(argv or ("-c", PRINT))], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_python_c_in_a_checkout_prints_its_commit(tmp_path):
    repo, commit = checkout(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    out = subprocess.run([sys.executable, "-c", "from clusterwatch import train; print(train.provenance())"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert commit in out
    record = in_process(repo)
    assert record["from"] == "process" and record["source"] == "cwd" and record["pid"] > 0
    assert record["git"] == {"root": str(repo), "commit": commit, "branch": "main", "dirty": False, "error": ""}


def test_the_script_s_repository_wins_over_the_working_directory(tmp_path):
    repo, commit = checkout(tmp_path)
    (repo / "train.py").write_text("x = 2\n")
    record = in_process(tmp_path, str(repo / "sub" / "script.py"))
    assert record["source"] == "script" and record["path"] == str(repo / "sub")
    assert (record["git"]["commit"], record["git"]["dirty"]) == (commit, True)


def hostile(repo: Path, markers: Path) -> None:
    """A repository whose config makes a plain `git status` run programs: each one leaves a marker."""
    markers.mkdir()
    hooks = repo / "evil-hooks"
    hooks.mkdir()

    def script(name: str, tail: str = "") -> str:
        path = hooks / name
        path.write_text(f"#!/bin/sh\ntouch {markers}/{name}\n{tail}")
        path.chmod(0o755)
        return str(path)

    for hook in ("post-index-change", "reference-transaction", "post-checkout"):
        script(hook)
        shutil.copy(hooks / hook, repo / ".git" / "hooks" / hook)
    cfg = [("core.fsmonitor", script("fsmonitor")), ("core.hooksPath", str(hooks)),
           ("core.pager", script("pager", "cat\n")), ("filter.evil.clean", script("clean", "cat\n")),
           ("filter.evil.process", script("process")), ("filter.evil.required", "true"),
           ("diff.external", script("external")), ("status.submoduleSummary", "true"),
           ("core.sshCommand", script("ssh"))]
    for key, value in cfg:
        git(repo, "config", key, value)
    (repo / ".gitattributes").write_text("* filter=evil\n")
    (repo / "train.py").write_text("x = 3\n")  # a changed file: status reads it through the filter


def test_a_hostile_repository_runs_nothing(tmp_path):
    repo, commit = checkout(tmp_path)
    markers = tmp_path / "markers"
    hostile(repo, markers)
    record = in_process(repo)
    assert (record["git"]["commit"], record["git"]["dirty"], record["git"]["error"]) == (commit, True, "")
    assert sorted(os.listdir(markers)) == []
    # the control: the same repository, asked by a plain git, does run them
    subprocess.run(["git", "status"], cwd=repo, capture_output=True, timeout=30,
                   env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert {"fsmonitor", "clean"} & set(os.listdir(markers))


def test_no_repository_and_no_git_say_why(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    record = in_process(plain)
    assert record["git"]["commit"] == "unknown"
    assert record["git"]["error"].startswith("not a git repository")
    assert tp.git_record(str(plain), git=str(tmp_path / "no-git"))["error"].startswith("cannot run ")


def test_another_user_s_repository_is_refused_not_trusted(tmp_path):
    d = Path(tempfile.mkdtemp(prefix="cw-prov-", dir="/tmp"))
    try:
        repo, _commit = checkout(d)
        subprocess.run(["chown", "-R", "65534:65534", str(repo)], check=True)
        record = tp.git_record(str(repo))
        assert record["commit"] == "unknown"
        assert record["error"] == "the repository belongs to another user (git refuses it: dubious ownership)"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_git_that_hangs_is_killed_with_what_it_started(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    slow = tmp_path / "git"
    slow.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pids}\nwait\n")
    slow.chmod(0o755)
    monkeypatch.setattr(tp, "BUDGET_S", 0.5)
    t0 = time.monotonic()
    record = tp.git_record(str(tmp_path), git=str(slow))
    assert record["error"] == "git took more than 0.5 s" and time.monotonic() - t0 < 10
    child = int(pids.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except FileNotFoundError:
            break
        if stat[stat.rindex(")") + 2] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the git's child outlived the timeout")


@pytest.mark.parametrize("data, status", [
    (b"# branch.oid 0123abcd\0# branch.head main\0", ("0123abcd", "main", False)),
    (b"# branch.oid (initial)\0# branch.head main\x001 A. N... 000000 100644 100644 0 1 new.py\0",
     ("(initial)", "main", True)),
    (b"# branch.oid 0123abcd\0# branch.head (detached)\x001 .M N... 100644 100644 100644 a b train.py\0",
     ("0123abcd", "(detached)", True)),
    (b"# branch.oid 0123abcd\0# branch.head dev\0u UU N... 100644 100644 100644 100644 a b c f.py\0",
     ("0123abcd", "dev", True)),
    (b"", ("unknown", "unknown", False)),
])
def test_parse_status(data, status):
    assert tp.parse_status(data) == status


AGENT_PUSH = r"""
import json, socket, sys, time
from clusterwatch import train
train.report(step=1)
deadline = time.monotonic() + 10
while train.provenance()["from"] != "agent" and time.monotonic() < deadline:
    train.report(step=2)
    time.sleep(0.05)
print(json.dumps(train.provenance()), flush=True)
"""


def test_the_agent_s_record_is_returned_when_the_agent_pushed_one(tmp_path):
    d = Path(tempfile.mkdtemp(prefix="cw-prov-", dir="/tmp"))
    path = str(d / "train.sock")
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(path)
    agent.settimeout(10)
    spoof = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # not the agent's socket: ignored
    record = {"version": 1, "code_id": "0011223344556677", "git": {"commit": "f" * 40}}
    try:
        proc = subprocess.Popen([sys.executable, "-c", AGENT_PUSH], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "CLUSTERWATCH_TRAIN_SOCKET": path})
        _data, address = agent.recvfrom(65536)
        spoof.sendto(json.dumps({"v": 1, "provenance": {"git": {"commit": "0" * 40}}},
                                separators=(",", ":")).encode(), address)
        time.sleep(0.2)
        agent.sendto(json.dumps({"v": 1, "provenance": record}, separators=(",", ":")).encode(), address)
        out, _ = proc.communicate(timeout=30)
        assert json.loads(out) == {**record, "from": "agent"}
    finally:
        agent.close()
        spoof.close()
        shutil.rmtree(d, ignore_errors=True)


def test_a_forked_child_s_record_names_the_child(tmp_path):
    repo, commit = checkout(tmp_path)
    code = ("import json, os\nfrom clusterwatch import train\nparent = train.provenance()\npid = os.fork()\n"
            "if pid == 0:\n    print(json.dumps(train.provenance()), flush=True)\n    os._exit(0)\n"
            "os.waitpid(pid, 0)\nprint(json.dumps(parent), flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60,
                         check=True).stdout.splitlines()
    child, parent = json.loads(out[0]), json.loads(out[1])
    assert child["pid"] != parent["pid"] and child["git"]["commit"] == parent["git"]["commit"] == commit
